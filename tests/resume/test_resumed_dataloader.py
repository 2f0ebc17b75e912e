"""``get_resumed_dataloader(dataloader, num_batches)`` (transformers 5.25): a subclass that overrides it alone
decides how a resumed epoch leaves out its trained batches; cadence's default keeps skipping in its sampler.

Each run: 64 rows, 4 rows a batch, gradient_accumulation_steps=2 (16 batches, 8 optimizer steps an epoch), 3 epochs,
a checkpoint every 5 steps; the cut run stops after step 10, i.e. 2 optimizer steps (4 batches) into epoch 1."""

import pytest
import torch
import transformers
from tiny import RegressionDataset, RegressionModel, make_args, stop_at
from torch.utils.data import IterableDataset

import cadence
from repo_paths import REPO

ROWS = RegressionDataset(64)
ARGS = dict(num_train_epochs=3, per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=0.05,
            logging_steps=1, save_strategy="steps", save_steps=5, seed=3, use_cpu=True)


class Rows(torch.utils.data.Dataset):
    """The regression rows; records which rows are read."""

    def __init__(self):
        self.read = []

    def __len__(self):
        return len(ROWS)

    def __getitem__(self, i):
        self.read.append(i)  # (the tests look at the last reads: a look at row 0 before training is not theirs)
        return ROWS[i]


class SeekableStream(IterableDataset):
    """The rows as a stream with no ``state_dict``: it can only be told where its next iteration starts."""

    def __init__(self):
        self.start, self.read = 0, []

    def seek(self, row):
        self.start = row

    def __iter__(self):
        start, self.start = self.start, 0  # a seek applies to the next iteration only
        for i in range(start, len(ROWS)):
            self.read.append(i)
            yield ROWS[i]


class StatefulSeekableStream(SeekableStream):
    """The same stream with a state_dict too: an override must win over cadence's own restore of it."""

    def state_dict(self):
        return {"start": 0}

    def load_state_dict(self, state):
        raise AssertionError("with get_resumed_dataloader overridden, cadence must not restore the stream's state")


def trainer_class(lib, how):
    """A ``lib`` Trainer whose get_resumed_dataloader records its calls and skips ``how``: "super" (the
    default, accelerate's skip_first_batches), "seek" (tells the stream where to start), "none" (nothing)."""

    class Recording(lib.Trainer):
        calls = []

        def get_resumed_dataloader(self, dataloader, num_batches):
            self.calls.append((isinstance(dataloader, torch.utils.data.DataLoader), num_batches))
            if how == "super":
                return super().get_resumed_dataloader(dataloader, num_batches)
            if how == "seek":
                dataloader.dataset.seek(num_batches * self.args.per_device_train_batch_size)
            return dataloader

    return Recording


def run(lib, out_dir, dataset, cls=None, stop=None, resume=None, **overrides):
    cls = cls or lib.Trainer
    args = make_args(out_dir, lib, **{**ARGS, **overrides})
    trainer = cls(model=RegressionModel(), args=args, train_dataset=dataset,
                  callbacks=[stop_at(stop)] if stop and lib is cadence else
                  [_tf_stop(stop)] if stop else None)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _tf_stop(step):
    class StopAt(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                control.should_training_stop = True

    return StopAt()


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def weights(trainer):
    return torch.stack([trainer.model.a.detach(), trainer.model.b.detach()])


@pytest.mark.parametrize("lib", [cadence, transformers], ids=["cadence", "transformers"])
def test_an_override_is_called_once_with_the_unskipped_dataloader_and_the_trained_batches(lib, tmp_path):
    """Where transformers calls it (a resume 2 steps into epoch 1: 4 batches trained in it), with what it passes;
    and the default (accelerate's skip_first_batches, reached through super()) resumes the run exactly."""
    full = run(lib, tmp_path / "full", Rows())
    run(lib, tmp_path / "cut", Rows(), stop=10)
    cls = trainer_class(lib, "super")
    resumed = run(lib, tmp_path / "cut", Rows(), cls=cls, resume=True)
    assert cls.calls == [(True, 4)]
    assert losses(resumed)[-1] == losses(full)[-1]
    if lib is cadence:  # resumed == unbroken, bit for bit, is cadence's promise
        assert torch.equal(weights(resumed), weights(full))
        assert losses(resumed) == losses(full)


def test_cadence_skips_nothing_itself_when_the_override_skips_nothing(tmp_path):
    """An override that returns the dataloader as it is: the resumed epoch starts again at its first batch (a
    skip of cadence's own on top of the override's would start it at the fifth)."""
    full_rows = Rows()
    run(cadence, tmp_path / "full", full_rows)
    epoch1 = full_rows.read[-128:-64]  # the rows of epoch 1, in its order (3 epochs of 64 reads end the list)
    run(cadence, tmp_path / "cut", Rows(), stop=10)
    rows = Rows()
    cls = trainer_class(cadence, "none")
    run(cadence, tmp_path / "cut", rows, cls=cls, resume=True)
    assert cls.calls == [(True, 4)]
    # the whole epoch 1, its 4 trained batches read again; then the 6 steps (48 rows) of epoch 2 left to max_steps=24
    # and the batch of 4 collated ahead at step 24 (as transformers' dataloader does)
    assert rows.read[-116:-52] == epoch1


@pytest.mark.parametrize("stream_cls", [SeekableStream, StatefulSeekableStream])
def test_a_streaming_dataloader_that_skips_its_own_way_resumes_exactly(stream_cls, tmp_path, caplog):
    """A stream without state, or whose state cadence would otherwise restore, resumed by the override's seek:
    the run ends bit-identical to one that never stopped, and the trained rows are never read again."""
    stream_args = dict(max_steps=12, num_train_epochs=1)  # a stream has no length: max_steps
    full = run(cadence, tmp_path / "full", stream_cls(), **stream_args)
    run(cadence, tmp_path / "cut", stream_cls(), stop=5, **stream_args)
    stream = stream_cls()
    cls = trainer_class(cadence, "seek")
    resumed = run(cadence, tmp_path / "cut", stream, cls=cls, resume=True, **stream_args)
    assert cls.calls == [(True, 10)]  # a stream's resume is in its one "epoch": 5 steps x 2 batches
    assert torch.equal(weights(resumed), weights(full))
    assert losses(resumed) == losses(full)
    assert stream.read[:24] == list(range(40, 64))  # rows 0-39 were trained before the stop: none read again
    assert "reading and dropping" not in caplog.text


def test_without_an_override_cadence_skips_in_its_sampler(tmp_path):
    """cadence's own resume: the sampler starts past the 4 trained batches, so their 16 rows are never loaded."""
    full_rows = Rows()
    full = run(cadence, tmp_path / "full", full_rows)
    run(cadence, tmp_path / "cut", Rows(), stop=10)
    rows = Rows()
    resumed = run(cadence, tmp_path / "cut", rows, resume=True)
    assert rows.read[-112:-64] == full_rows.read[-128 + 16 : -64]  # (then epoch 2's 64)
    assert torch.equal(weights(resumed), weights(full))


def test_the_docs_name_the_pinned_versions():
    """The tested versions the getting-started page names are constraints.txt's (and the Makefile's torch): the pin and
    the text move together."""
    import pathlib
    import re

    root = pathlib.Path(REPO)
    pins = dict(re.findall(r"^([\w.-]+)==(\S+)$", (root / "constraints.txt").read_text(), re.M))
    pins["torch"] = re.search(r"TORCH\s+\?=\s+torch==(\S+)", (root / "Makefile").read_text()).group(1)
    paragraphs = (root / "docs" / "getting-started.md").read_text().split("\n\n")
    text = " ".join(next(p for p in paragraphs if "constraints.txt" in p).split())  # a paragraph wraps its lines
    named = dict(re.findall(r"(transformers|accelerate|torch) (\d[\w.]*)", text))
    assert set(named) == {"transformers", "accelerate", "torch"}, text
    assert all(pins[name] == version for name, version in named.items()), (named, text)
