"""Iterable datasets resume: from their own state_dict() when they have one (nothing read twice),
by reading and dropping the trained batches otherwise; either way the run ends as if it never stopped."""

import logging

import pytest
import torch
from tiny import RegressionDataset, RegressionModel, stop_at
from torch.utils.data import IterableDataset

from cadence import Trainer, TrainingArguments

ROWS = RegressionDataset(64)


class Stream(IterableDataset):
    """The regression rows as a stream; counts the rows it produces."""

    def __init__(self):
        self.produced = 0

    def __iter__(self):
        for i in range(len(ROWS)):
            self.produced += 1
            yield ROWS[i]


class StatefulStream(Stream):
    """The same stream, able to save and restore its position."""

    def __init__(self):
        super().__init__()
        self.position = 0

    def __iter__(self):
        start, self.position = self.position, 0  # a restored position applies to the next iteration only
        for i in range(start, len(ROWS)):
            self.produced += 1
            self.position = i + 1
            yield ROWS[i]
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def run(out_dir, stream, stop=None, resume=None):
    args = TrainingArguments(output_dir=out_dir, max_steps=12, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             learning_rate=0.05, logging_steps=1, save_steps=5, disable_tqdm=True, seed=3)
    trainer = Trainer(RegressionModel(), args, train_dataset=stream, callbacks=[stop_at(stop)] if stop else None)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.mark.parametrize("stream_cls", [Stream, StatefulStream])
def test_stream_resume_equals_unbroken_run(stream_cls, tmp_path, caplog):
    full = run(str(tmp_path / "full"), stream_cls())
    run(str(tmp_path / "cut"), stream_cls(), stop=5)  # 5 steps x 2 batches x 4 rows = 40 of the 64 rows read
    resumed_stream = stream_cls()
    with caplog.at_level(logging.WARNING, logger="cadence"):
        resumed = run(str(tmp_path / "cut"), resumed_stream, resume=True)
    assert resumed.state.global_step == 12
    for name in ("a", "b"):
        assert torch.equal(getattr(resumed.model, name), getattr(full.model, name)), name
    losses = lambda t: [h["loss"] for h in t.state.log_history if "loss" in h]  # noqa: E731
    assert losses(resumed) == losses(full)
    # 7 more steps of 8 rows, and the batch of 4 collated ahead (as transformers' dataloader does); the stream ends
    # after 64 rows and starts again (epoch 2)
    if stream_cls is StatefulStream:
        assert resumed_stream.produced == 7 * 8 + 4 and "reading and dropping" not in caplog.text
    else:
        assert resumed_stream.produced == 40 + 7 * 8 + 4 and "reading and dropping the 10 batches" in caplog.text


def test_hugging_face_iterable_dataset_resumes_from_its_state(tmp_path, caplog):
    datasets = pytest.importorskip("datasets")

    def stream():
        rows = {"input_x": ROWS.x.tolist(), "labels": ROWS.y.tolist()}
        return datasets.Dataset.from_dict(rows).to_iterable_dataset()

    full = run(str(tmp_path / "full"), stream())
    run(str(tmp_path / "cut"), stream(), stop=5)
    assert (tmp_path / "cut" / "checkpoint-5" / "stream_state.pt").exists()
    with caplog.at_level(logging.WARNING, logger="cadence"):
        resumed = run(str(tmp_path / "cut"), stream(), resume=True)
    assert "reading and dropping" not in caplog.text
    for name in ("a", "b"):
        assert torch.equal(getattr(resumed.model, name), getattr(full.model, name)), name
