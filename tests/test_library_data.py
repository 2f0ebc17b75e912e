"""Data paths libraries depend on, against transformers.Trainer on the same seed: datasets and collators that draw
from Python's ``random`` (embedding libraries sample negatives in ``__getitem__``, GLiNER in its collator) see the
draws in transformers' order."""

import random

import pytest
import torch
from tiny import RegressionDataset, RegressionModel

transformers = pytest.importorskip("transformers")

import cadence  # noqa: E402


class RandomRows(RegressionDataset):
    """Rows whose input is jittered with Python's ``random`` at every read, plus a column the model does not take
    (so the unused-column removal runs)."""

    def __getitem__(self, i):
        row = super().__getitem__(i)
        return {**row, "input_x": row["input_x"] + random.gauss(0.0, 0.5), "source": "jittered"}


def random_collate(features):
    """A collator that draws from ``random`` per batch (a negative-sampling collator's shape)."""
    scale = 1.0 + random.random()
    return {"input_x": torch.stack([f["input_x"] for f in features]) * scale,
            "labels": torch.stack([f["labels"] for f in features])}


def run(lib, out_dir, **kw):
    kw = {**dict(max_steps=8, per_device_train_batch_size=4, learning_rate=0.1, logging_steps=1, save_strategy="no",
                 report_to="none", disable_tqdm=True, seed=7, use_cpu=True, optim="sgd"), **kw}
    collator = kw.pop("data_collator", None)
    eval_dataset = kw.pop("eval_dataset", None)
    trainer = lib.Trainer(RegressionModel(), lib.TrainingArguments(output_dir=out_dir, **kw),
                          train_dataset=kw.pop("train_dataset", None) or RandomRows(24), eval_dataset=eval_dataset,
                          data_collator=collator)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    evals = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    return losses, evals


def test_a_dataset_drawing_from_random_is_not_read_before_the_first_batch(tmp_path):
    """cadence indexed ``train_dataset[0]`` to decide which columns to drop, so every later read drew other jitter
    (transformers drops the columns in the collator and reads nothing early)."""
    ours, _ = run(cadence, str(tmp_path / "cd"))
    theirs, _ = run(transformers, str(tmp_path / "hf"))
    assert len(ours) == len(theirs) == 8
    # same float32 operations in the same order: equal up to rounding of the logged values
    assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-7)
