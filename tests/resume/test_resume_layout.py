"""Resuming with another batch size, accumulation or number of processes (as transformers allows).

The saving run's position is recomputed from the samples it had trained in its epoch, so the
resumed run reads next exactly the samples the unbroken run reads next (the epoch's order depends on
the seed and the epoch only); a warning says the run is no longer bit-identical. The independent
reference is the unbroken run's own sequence of rows: the resumed run must continue it.
Only another dataset is refused.
"""

import logging
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from tiny import TokenDataset, TokenTagger, pad_collate, stop_at

from cadence import Trainer, TrainingArguments

WARNING = "no longer bit-identical"


class RecordingCollator:
    """pad_collate that records the dataset index of every row it batches (rows are unique)."""

    def __init__(self, dataset):
        self.index = {tuple(dataset[i]["input_ids"].tolist()): i for i in range(len(dataset))}
        assert len(self.index) == len(dataset)
        self.rows = []

    def __call__(self, features):
        self.rows.extend(self.index[tuple(f["input_ids"].tolist())] for f in features)
        return pad_collate(features)


def run(out, dataset=None, stop=None, resume=None, **kw):
    dataset = dataset if dataset is not None else TokenDataset(24)
    base = dict(output_dir=out, disable_tqdm=True, report_to="none", per_device_train_batch_size=4,
                gradient_accumulation_steps=1, num_train_epochs=2, learning_rate=0.05, save_strategy="steps",
                save_steps=stop or 500, seed=7)
    collator = RecordingCollator(dataset)
    trainer = Trainer(TokenTagger(), TrainingArguments(**{**base, **kw}), train_dataset=dataset, data_collator=collator,
                      callbacks=[stop_at(stop)] if stop else [])
    out = trainer.train(resume_from_checkpoint=resume)
    return trainer, out, collator.rows


# 24 samples, batch 4: 6 steps an epoch, 12 in all. The unbroken run's rows are the reference order.
@pytest.mark.parametrize("stop,kw,again", [
    (2, {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}, 0),  # half batch, same global batch
    (2, {"per_device_train_batch_size": 2}, 0),                                    # half batch, half global batch
    (6, {"per_device_train_batch_size": 2}, 0),                                    # saved at the epoch's last step
    # double batch in the second epoch; global_step 8 counts steps of 4 samples, and the epochs' 6 steps of 8 would
    # already be over (as in transformers, step counts are this run's): max_steps says how many to train
    (8, {"per_device_train_batch_size": 8, "max_steps": 12}, 0),
    (2, {"per_device_train_batch_size": 3}, 2),                                    # 8 seen = 2 batches of 3 + 2 again
])
def test_resume_with_another_batch_continues_from_the_next_sample(tmp_path, caplog, stop, kw, again):
    _, _, reference = run(str(tmp_path / "full"))
    out = str(tmp_path / "run")
    _, _, first = run(out, stop=stop)
    # a stopped run has collated one batch ahead (transformers' look-ahead): read, never trained
    assert first[: stop * 4] == reference[: stop * 4] and len(first) - stop * 4 in (0, 4)
    caplog.set_level(logging.WARNING, logger="cadence")
    trainer, result, resumed = run(out, resume=True, **kw)
    seen = stop * 4  # samples trained before the checkpoint
    epoch = (seen - 1) // 24  # the checkpoint's epoch (saved at its last step: not yet closed)
    in_epoch = seen - 24 * epoch
    # the rest of the epoch, then the next one: the unbroken run's order
    assert resumed[: len(reference) - seen + again] == reference[seen - again:]
    assert resumed[: kw["per_device_train_batch_size"]] == reference[seen - again: seen - again + kw["per_device_train_batch_size"]]
    assert WARNING in caplog.text and f"the {in_epoch} samples of epoch {epoch} already trained" in caplog.text
    assert (f"the last {again} samples are trained again" in caplog.text) == bool(again)
    assert trainer.state.train_batch_size == kw["per_device_train_batch_size"]
    # the resumed state is saved in this run's layout: resuming it with the same batch is exact and silent
    assert result.global_step == trainer.state.global_step


def test_same_batch_resume_is_bit_identical_and_silent(tmp_path, caplog):
    full, full_out, reference = run(str(tmp_path / "full"))
    out = str(tmp_path / "run")
    run(out, stop=3)
    caplog.set_level(logging.WARNING, logger="cadence")
    trainer, result, resumed = run(out, resume=True)
    assert resumed == reference[12:]
    assert WARNING not in caplog.text
    for (name, a), (_, b) in zip(full.model.state_dict().items(), trainer.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert result.training_loss == full_out.training_loss


def test_resume_twice_after_a_batch_change_stays_on_the_order(tmp_path):
    """The checkpoint written after the change holds this run's layout: a later resume continues right."""
    _, _, reference = run(str(tmp_path / "full"))
    out = str(tmp_path / "run")
    run(out, stop=2)  # 8 samples, batch 4
    _, _, middle = run(out, stop=6, resume=True, per_device_train_batch_size=2, save_steps=6)  # 4 steps of 2 -> 16
    assert middle[:8] == reference[8:16] and len(middle) - 8 in (0, 2)  # (+ the batch collated ahead)
    _, _, last = run(out, resume=True, per_device_train_batch_size=2)
    assert last == reference[16:]


@pytest.mark.parametrize("batch", [4, 2])
def test_another_dataset_resumes_by_steps_naming_it(tmp_path, caplog, batch):
    """transformers' rule: epoch = global_step // this data's steps per epoch, then global_step % it steps of this
    run's batches skipped; the sampler's order is this data's, so the rows are those of an unbroken run on it."""
    _, _, reference = run(str(tmp_path / "full"), dataset=TokenDataset(26), per_device_train_batch_size=batch)
    out = str(tmp_path / "run")
    run(out, stop=2)  # 24 rows, batch 4: 8 rows trained
    shutil.copytree(out, str(tmp_path / "again"))
    _, result, rows = run(str(tmp_path / "again"), resume=True, dataset=TokenDataset(26), ignore_data_skip=True,
                          per_device_train_batch_size=batch)
    # the epoch restarts from its first batch; global_step goes on from 2 to this run's max_steps (as transformers)
    assert result.global_step == 2 * -(-26 // batch) and len(rows) > len(reference) // 2 and rows == reference[:len(rows)]
    with caplog.at_level(logging.WARNING):
        _, result, rows = run(out, resume=True, dataset=TokenDataset(26), per_device_train_batch_size=batch)
    assert rows == reference[2 * batch:]  # 2 steps of this run's batch skipped
    assert result.global_step == 2 * -(-26 // batch)
    assert any("another train_dataset (24 samples" in r.getMessage() and "this run's (26 samples" in r.getMessage()
               and "data position is approximate" in r.getMessage() for r in caplog.records)


def test_another_datasets_fingerprint_resumes_by_steps_warned(tmp_path, caplog):
    datasets = pytest.importorskip("datasets")

    def table(seed):
        rows = TokenDataset(24, seed=seed)
        return datasets.Dataset.from_dict({"input_ids": [r[0].tolist() for r in rows.rows],
                                           "labels": [r[1].tolist() for r in rows.rows]}).with_format("torch")

    out = str(tmp_path / "run")
    run(out, dataset=table(0), stop=2)
    with caplog.at_level(logging.WARNING):  # resumed by steps, as in transformers, and warned
        _, result, _ = run(out, resume=True, dataset=table(5))
    assert result.global_step == 12
    assert re.search(r"another train_dataset \(24 samples, fingerprint [0-9a-f]+\)", caplog.text)
    _, result, _ = run(out, resume=True, dataset=table(0))  # the same table, built again: the same fingerprint
    assert result.global_step == 12


def test_checkpoint_without_layout_keys_is_read_from_its_arguments(tmp_path, caplog):
    """A checkpoint from before loop_state.json kept the layout (or from transformers: trainer_state.json's
    train_batch_size) still resumes at the right sample."""
    import json

    _, _, reference = run(str(tmp_path / "full"))
    out = str(tmp_path / "run")
    run(out, stop=2)
    folder = os.path.join(out, "checkpoint-2")
    path = os.path.join(folder, "loop_state.json")
    loop = json.load(open(path))
    for key in ("train_batch_size", "gradient_accumulation_steps", "world_size", "num_samples", "fingerprint"):
        del loop[key]
    json.dump(loop, open(path, "w"))
    from cadence.checkpoint.manifest import write_manifest

    write_manifest(Path(folder))  # the edited file checksummed again (a cadence checkpoint without one is damaged)
    caplog.set_level(logging.WARNING, logger="cadence")
    _, _, resumed = run(out, resume=True, per_device_train_batch_size=2)
    assert resumed == reference[8:] and WARNING in caplog.text
    os.remove(path)  # as transformers writes it: the position comes from global_step and the saved batch
    os.remove(os.path.join(folder, "checkpoint_manifest.json"))  # transformers writes no checksums
    for name in ("training_args.bin", "training_args.json"):
        os.remove(os.path.join(folder, name))
    _, _, resumed = run(out, resume=True, per_device_train_batch_size=2)
    assert resumed == reference[8:]


def test_stream_resume_with_another_batch_continues_after_the_trained_samples(tmp_path, caplog):
    from tiny import RegressionDataset, RegressionModel, Stream

    from cadence.data import default_data_collator

    def stream_run(out, batch, resume=None, stop=None):
        seen = []

        def collate(features):
            seen.extend(float(f["input_x"]) for f in features)
            return default_data_collator(features)

        args = TrainingArguments(output_dir=out, disable_tqdm=True, report_to="none", max_steps=8, save_steps=3,
                                 per_device_train_batch_size=batch)
        trainer = Trainer(RegressionModel(), args, train_dataset=Stream(RegressionDataset(64)), data_collator=collate,
                          callbacks=[stop_at(stop)] if stop else [])
        trainer.train(resume_from_checkpoint=resume)
        return seen

    out = str(tmp_path / "run")
    first = stream_run(out, 4, stop=3)
    caplog.set_level(logging.WARNING, logger="cadence")
    resumed = stream_run(out, 2, resume=True)
    rows = [float(r["input_x"]) for r in Stream(RegressionDataset(64))]
    assert first[:12] == rows[:12] and len(first) - 12 in (0, 4)  # (+ the batch collated ahead)
    assert resumed[12:22] == rows[12:22] and len(resumed) - 22 in (0, 2)  # (+ the batch collated ahead)  # 12 samples read again and dropped (6 batches of 2), then 5 steps of 2
    assert WARNING in caplog.text
