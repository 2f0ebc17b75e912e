"""The loop state: the batch layout's arithmetic, and loop_state.json's format (old checkpoints keep loading)."""

import json
import os

import pytest
from tiny import RegressionDataset, RegressionModel

from cadence import Trainer, TrainingArguments
from cadence.loop_state import BatchLayout


@pytest.mark.parametrize("batch, ga, world, batches, global_batch, steps", [
    (8, 1, 1, 10, 8, 10),
    (8, 4, 2, 10, 64, 3),  # 10 batches in windows of 4: 4 + 4 + a shorter last step of 2
    (2, 3, 1, 9, 6, 3),
    (2, 5, 1, 3, 10, 1),  # fewer batches than one window still make one step
])
def test_batch_layout_by_hand(batch, ga, world, batches, global_batch, steps):
    layout = BatchLayout(batch, ga, world)
    assert layout.global_batch == global_batch
    assert layout.steps_per_epoch(batches) == steps


def test_loop_state_file_keeps_its_keys_and_position(out_dir):
    """16 samples, batch 2, accumulation 2: 8 batches = 4 steps per epoch; checkpoint-6 is 2 steps (4 batches)
    into epoch 1, logged at step 4 (logging_steps=2, train_loss's steps counted from 0)."""
    args = TrainingArguments(output_dir=out_dir, disable_tqdm=True, report_to="none", per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, max_steps=6, logging_steps=4, save_steps=6, seed=3)
    Trainer(RegressionModel(), args, train_dataset=RegressionDataset(16)).train()
    with open(os.path.join(out_dir, "checkpoint-6", "loop_state.json")) as f:
        saved = json.load(f)
    assert sorted(saved) == sorted([  # the keys checkpoints have been written with: renaming one breaks resume
        "loss_sum", "nonfinite", "total", "nonfinite_total", "last_logged_step", "first_step", "epoch",
        "batches_in_epoch", "batches_per_epoch", "train_batch_size", "gradient_accumulation_steps", "world_size",
        "num_samples", "fingerprint", "sample"])  # "sample" (a hash of rows of a datasets.Dataset) added later
    assert {k: saved[k] for k in ("epoch", "batches_in_epoch", "batches_per_epoch", "last_logged_step", "first_step",
                                  "train_batch_size", "gradient_accumulation_steps", "world_size", "num_samples",
                                  "fingerprint", "sample", "nonfinite")} == {
        "epoch": 1, "batches_in_epoch": 4, "batches_per_epoch": 8, "last_logged_step": 4, "first_step": 0,
        "train_batch_size": 2, "gradient_accumulation_steps": 2, "world_size": 1, "num_samples": 16,
        "fingerprint": None, "sample": None, "nonfinite": 0}
    assert saved["loss_sum"] > 0 and saved["total"] > 0  # steps 5-6 not yet logged; steps 1-4 logged
