"""Data paths libraries depend on, against transformers.Trainer on the same seed: datasets and collators that draw
from Python's ``random`` (embedding libraries sample negatives in ``__getitem__``, GLiNER in its collator) see the
draws in transformers' order."""

import os
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
    collator, eval_dataset = kw.pop("data_collator", None), kw.pop("eval_dataset", None)
    train_dataset = kw.pop("train_dataset", None) or RandomRows(24)
    trainer = lib.Trainer(RegressionModel(), lib.TrainingArguments(output_dir=out_dir, **kw),
                          train_dataset=train_dataset, eval_dataset=eval_dataset, data_collator=collator)
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


# --- a subclass's own sampler on 2 processes (TRL's RepeatSampler: GRPO, RLOO) ------------------------------------
import re  # noqa: E402
import shutil  # noqa: E402

import dist_exit  # noqa: E402


def sampler_run(out, cadence_base, resume=False):
    proc = dist_exit.launch("sampler_worker.py", out, *(["--cadence"] if cadence_base else []),
                            *(["--resume"] if resume else []), nproc=2)
    if cadence_base:  # asserted before the run's end: ranks dealt unequal batches stall at a collective (ddp_timeout)
        batches = [line.split()[-1] for line in proc.said if line.startswith("BATCHES rank")]
        assert len(batches) == 2 and batches[0] == batches[1], proc.said  # the uneven last batch completed
    (dist_exit.assert_finished if cadence_base else dist_exit.assert_ranks_finished)(proc, 2)
    return [torch.load(os.path.join(out, f"rank{r}{'_resumed' if resume else ''}.pt")) for r in range(2)]


@pytest.mark.slow
def test_a_subclasss_sampler_is_sharded_per_rank_as_accelerate_does(tmp_path):
    """cadence handed a subclass's sampler to the DataLoader unsharded: on 2 processes every rank read every index
    and the run ended at epoch 1.0 of 2 (transformers: each rank its batches, epoch 2.0). Now each rank reads the
    batches accelerate deals it, and a resume inside an epoch ends bit-identical to the unbroken run."""
    ours = sampler_run(str(tmp_path / "cd"), True)
    theirs = sampler_run(str(tmp_path / "hf"), False)
    for rank in range(2):
        assert ours[rank]["seen"] == theirs[rank]["seen"], rank  # the same indices, in the same order, per rank
        assert ours[rank]["step"] == theirs[rank]["step"] == 10  # 26 indices -> 9 batches of 3 -> 5 per rank, x2
        assert ours[rank]["epoch"] == pytest.approx(theirs[rank]["epoch"]) == 2.0
        for name, w in theirs[rank]["weights"].items():  # float64: only summation order may differ
            assert torch.allclose(ours[rank]["weights"][name], w, atol=1e-10, rtol=0), name
    assert ours[0]["seen"] != ours[1]["seen"]
    # checkpoints and save_model() on 2 processes: the main process writes the model files and the shared ones; the
    # other only makes sure the staging folder its rng_state_1.pth goes into exists
    assert {"save_model:final", "save_model_weights:tmp-checkpoint-3", "tmp-checkpoint-3/trainer_state.json"} <= set(
        ours[0]["writes"]), ours[0]["writes"]
    assert [w for w in ours[1]["writes"] if not re.fullmatch(r"tmp-checkpoint-\d+", w)] == [], ours[1]["writes"]
    # resume inside epoch 1 (step 3 of 5): the subclass's sampler cannot skip, its trained batches are read again
    resumed_dir = tmp_path / "r"
    shutil.copytree(tmp_path / "cd" / "checkpoint-3", resumed_dir / "checkpoint-3")
    resumed = sampler_run(str(resumed_dir), True, resume=True)
    for rank in range(2):
        assert resumed[rank]["step"] == 10
        for name, w in ours[rank]["weights"].items():
            assert torch.equal(resumed[rank]["weights"][name], w), name


# --- the training dataloader collates one batch ahead, as accelerate's DataLoaderShard ---------------------------
def test_a_collator_drawing_from_random_sees_transformers_order_around_evaluations(tmp_path):
    """transformers collates batch k+1 before step k trains (accelerate's look-ahead), so with a mid-epoch
    evaluation (whose batches the same collator draws for) the draws interleave differently from a loader that
    collates on demand: cadence's losses left transformers' at the first step after the first evaluation."""
    kw = dict(data_collator=random_collate, train_dataset=RegressionDataset(24), eval_dataset=RegressionDataset(8, seed=1),
              eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4, max_steps=10)  # crosses an epoch end
    ours, our_evals = run(cadence, str(tmp_path / "cd"), **kw)
    theirs, their_evals = run(transformers, str(tmp_path / "hf"), **kw)
    assert len(ours) == len(theirs) == 10 and len(our_evals) == len(their_evals) == 5
    # same float32 operations in the same order: equal up to rounding of the logged values
    assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-7)
    assert our_evals == pytest.approx(their_evals, rel=1e-6, abs=1e-7)


def test_a_resume_redraws_the_batch_collated_ahead_from_the_saved_rng_states(tmp_path):
    """The checkpoint of step 3 was written with batch 4 already collated: the resumed run draws batch 4 from the
    RNG states it was drawn from (kept in rng_state.pth), and ends bit-identical to the unbroken run."""
    def fit(out, resume=None):
        args = cadence.TrainingArguments(output_dir=str(out), max_steps=8, per_device_train_batch_size=4,
                                         learning_rate=0.1, logging_steps=1, save_strategy="steps", save_steps=3,
                                         eval_strategy="steps", eval_steps=2, report_to="none", disable_tqdm=True,
                                         seed=7, use_cpu=True, optim="sgd")
        trainer = cadence.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(24),
                                  eval_dataset=RegressionDataset(8, seed=1), data_collator=random_collate)
        trainer.train(resume_from_checkpoint=resume)
        return [h.get("loss", h.get("eval_loss")) for h in trainer.state.log_history if h["step"] > 3], \
            {k: v.clone() for k, v in trainer.model.state_dict().items()}

    unbroken_logs, unbroken = fit(tmp_path / "u")
    shutil.copytree(tmp_path / "u" / "checkpoint-3", tmp_path / "r" / "checkpoint-3")  # inside epoch 1 (6 batches)
    resumed_logs, resumed = fit(tmp_path / "r", resume=True)
    assert resumed_logs == unbroken_logs
    assert all(torch.equal(unbroken[n], resumed[n]) for n in unbroken)
