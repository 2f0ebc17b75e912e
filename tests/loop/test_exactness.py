"""Exact losses whatever shape the batch takes: any Mapping batch accumulates exactly, one item count
serves training and evaluation (``shift_labels`` too), non-finite steps are left out of the logged
means (not counted as 0), and a second ``train()`` gets a fresh schedule."""

import logging
import math
from collections import UserDict

import pytest
import torch
from tiny import (LMDataset, RegressionDataset, RegressionModel, TokenDataset, TokenTagger, make_args, pad_collate,
                  tiny_gpt2)

from cadence import Trainer

transformers = pytest.importorskip("transformers")


# ---------------------------------------------------------------- 1. Mapping batches


def batch_encoding_collate(features):
    return transformers.BatchEncoding(pad_collate(features))  # what DataCollatorWithPadding / tokenizer.pad return


def user_dict_collate(features):
    return UserDict(pad_collate(features))


def gpt2_double():
    return tiny_gpt2(seed=2).double()


MODELS = {  # (model, dataset, tolerance on the logged losses)
    # TokenTagger returns its batch's mean in float64: GA 4x2 and 1x8 differ only in float64 rounding
    "tagger": (lambda: TokenTagger(dtype=torch.float64), lambda: TokenDataset(40), 1e-12),
    # transformers' causal-LM loss casts logits to float32 before its cross-entropy, so the logged losses
    # round at float32 (7e-8 relative measured); equal weighting would be off by ~5e-2
    "gpt2": (gpt2_double, lambda: LMDataset(40), 1e-6),
}
WEIGHT_ATOL = 1e-12  # the weights and their gradients stay float64 in both models (2e-16 apart measured)


def train_weights(model_name, collate, out_dir, batch, ga):
    build_model, build_data, _ = MODELS[model_name]
    model = build_model()
    args = make_args(out_dir, per_device_train_batch_size=batch, gradient_accumulation_steps=ga, num_train_epochs=2,
                     learning_rate=0.1, optim="sgd", lr_scheduler_type="constant", logging_steps=1, seed=7)
    trainer = Trainer(model, args, train_dataset=build_data(), data_collator=collate)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


@pytest.mark.parametrize("collate", [batch_encoding_collate, user_dict_collate], ids=["BatchEncoding", "UserDict"])
@pytest.mark.parametrize("model_name", ["tagger", "gpt2"])
def test_mapping_batches_accumulate_exactly(model_name, collate, tmp_path):
    """GA 4 x batch 2 equals GA 1 x batch 8 when the collator returns a Mapping that is not a dict."""
    tolerance = MODELS[model_name][2]
    big, big_losses = train_weights(model_name, collate, str(tmp_path / "big"), batch=8, ga=1)
    acc, acc_losses = train_weights(model_name, collate, str(tmp_path / "acc"), batch=2, ga=4)
    plain, _ = train_weights(model_name, pad_collate, str(tmp_path / "plain"), batch=2, ga=4)
    assert len(big_losses) == len(acc_losses) == 10
    assert acc_losses == pytest.approx(big_losses, rel=tolerance, abs=0)
    for name, value in big.items():
        assert torch.allclose(acc[name], value, rtol=0, atol=WEIGHT_ATOL), name
        assert torch.equal(acc[name], plain[name]), name  # the container's type changes nothing at all


def test_mapping_model_outputs_are_read():
    """Label smoothing reads logits from any Mapping output, not only dict/ModelOutput."""
    from cadence.trainer_pt_utils import LabelSmoother

    logits = torch.randn(2, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[1, 2, -100, 3, 4], [0, -100, -100, 6, 5]])
    smoother = LabelSmoother(epsilon=0.1)
    assert smoother(UserDict(logits=logits), labels).item() == smoother({"logits": logits}, labels).item()


# ---------------------------------------------------------------- 2. one item count (shift_labels)


class ShiftLabelsDataset(LMDataset):
    """Rows carrying ``shift_labels`` (labels already shifted, as context-parallel pipelines give them):
    every position has a target, the last one too, and ~35% are masked, unlike ``labels[..., 1:]``."""

    def __getitem__(self, i):
        ids, _ = self.rows[i]
        g = torch.Generator().manual_seed(i)
        target = torch.randint(0, 64, (len(ids),), generator=g)
        target[torch.rand(len(ids), generator=g) < 0.35] = -100
        return {"input_ids": ids, "labels": ids.clone(), "shift_labels": target}


def shift_collate(features):
    batch = pad_collate([{"input_ids": f["input_ids"], "labels": f["labels"]} for f in features])
    batch["shift_labels"] = pad_collate([{"input_ids": f["input_ids"], "labels": f["shift_labels"]} for f in features])["labels"]
    return batch


def hand_eval_loss(model, ds):
    """Sum of every target's cross-entropy over the set, divided once by the number of targets."""
    total, items = 0.0, 0
    with torch.no_grad():
        for i in range(len(ds)):
            row = ds[i]
            logits = model(input_ids=row["input_ids"][None]).logits[0]
            keep = row["shift_labels"] != -100
            total += torch.nn.functional.cross_entropy(logits[keep], row["shift_labels"][keep], reduction="sum").item()
            items += int(keep.sum())
    return total / items


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_eval_loss_counts_shift_labels(batch, tmp_path):
    model = gpt2_double()
    ds = ShiftLabelsDataset(11)
    # shift_labels reaches the model through its **kwargs: kept only without column removal (as in transformers)
    args = make_args(str(tmp_path), per_device_eval_batch_size=batch, remove_unused_columns=False)
    trainer = Trainer(model, args, data_collator=shift_collate)
    metrics = trainer.evaluate(ds)
    # transformers' causal-LM loss runs its cross-entropy in float32 (see MODELS): float32's rounding, not more
    assert metrics["eval_loss"] == pytest.approx(hand_eval_loss(model, ds), rel=1e-6)


def test_one_item_count_rule():
    from cadence.data import batch_items

    labels = torch.tensor([[5, 6, -100, 7], [-100, 1, 2, -100]])
    shifted = torch.tensor([[6, -100, 7, 8], [1, 2, -100, -100]])
    assert batch_items({"labels": labels}, shifted=False).item() == 5
    assert batch_items(UserDict(labels=labels), shifted=True).item() == 4  # position 0 never enters a causal-LM loss
    assert batch_items({"labels": labels, "shift_labels": shifted}, shifted=True).item() == 5  # already shifted: all count
    assert batch_items({"input_ids": labels}, shifted=False) is None
    assert batch_items((labels, labels), shifted=False) is None


# ---------------------------------------------------------------- 3. non-finite losses


class NaNOnCalls(torch.nn.Module):
    """RegressionModel whose loss is NaN on the given forward calls (a constant added: gradients stay finite,
    so training itself goes on exactly as without the NaN)."""

    def __init__(self, calls=()):
        super().__init__()
        self.inner = RegressionModel()
        self.bad, self.calls = set(calls), 0

    def forward(self, input_x, labels=None):
        self.calls += 1
        loss, y = self.inner(input_x, labels)
        return (loss + float("nan") if self.calls in self.bad else loss, y)


def nan_run(out_dir, bad_calls, ga=1, **kw):
    args = make_args(out_dir, per_device_train_batch_size=4, gradient_accumulation_steps=ga, learning_rate=0.05,
                     optim="sgd", lr_scheduler_type="constant", seed=3, **kw)
    trainer = Trainer(NaNOnCalls(bad_calls), args, train_dataset=RegressionDataset(48))
    out = trainer.train()
    return out, [h for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("ga", [1, 2])
def test_nonfinite_step_is_left_out_of_the_logged_mean(ga, tmp_path):
    """A NaN at step 3 of a 3-step interval logs (a + b) / 2, not (a + b + 0) / 3."""
    _, clean = nan_run(str(tmp_path / "a"), (), ga=ga, max_steps=6, logging_steps=1)
    a, b, c, d, e, f = [h["loss"] for h in clean]
    # NaN in step 3's last micro-batch and step 5's first: with GA 2 each whole step is left out, once
    out, logs = nan_run(str(tmp_path / "b"), (3 * ga, 4 * ga + 1), ga=ga, max_steps=6, logging_steps=3)
    assert [h["step"] for h in logs] == [3, 6]
    assert logs[0]["loss"] == pytest.approx((a + b) / 2, rel=1e-12) and logs[0]["nonfinite_losses"] == 1
    assert logs[1]["loss"] == pytest.approx((d + f) / 2, rel=1e-12) and logs[1]["nonfinite_losses"] == 1
    assert out.training_loss == pytest.approx((a + b + d + f) / 4, rel=1e-12)
    assert out.metrics["train_nonfinite_losses"] == 2
    assert math.isfinite(c) and math.isfinite(e)


def test_nonfinite_count_survives_a_resume(tmp_path):
    """The interval's count and the run's count of left-out steps go through loop_state.json."""
    out_dir = str(tmp_path / "run")
    _, clean = nan_run(str(tmp_path / "clean"), (), max_steps=6, logging_steps=1)
    losses = [h["loss"] for h in clean]
    from tiny import stop_at

    args = make_args(out_dir, per_device_train_batch_size=4, learning_rate=0.05, optim="sgd", lr_scheduler_type="constant",
                     seed=3, max_steps=6, logging_steps=3, save_strategy="steps", save_steps=2)
    Trainer(NaNOnCalls((1,)), args, train_dataset=RegressionDataset(48), callbacks=[stop_at(2)]).train()
    model = NaNOnCalls((3,))  # the resumed run starts at step 3: its third call is step 5
    trainer = Trainer(model, args, train_dataset=RegressionDataset(48))
    out = trainer.train(resume_from_checkpoint=True)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[0]["loss"] == pytest.approx((losses[1] + losses[2]) / 2, rel=1e-12) and logs[0]["nonfinite_losses"] == 1
    assert logs[1]["loss"] == pytest.approx((losses[3] + losses[5]) / 2, rel=1e-12) and logs[1]["nonfinite_losses"] == 1
    assert out.training_loss == pytest.approx((losses[1] + losses[2] + losses[3] + losses[5]) / 4, rel=1e-12)


def test_the_runs_nonfinite_count_in_a_checkpoint_is_restored(tmp_path):
    """A checkpoint whose run-wide count is not zero (a NaN step already logged): the resumed run's
    train_nonfinite_losses and train_loss count it (the test above saves only an interval's count)."""
    import json
    import os

    from tiny import stop_at

    _, clean = nan_run(str(tmp_path / "clean"), (), max_steps=6, logging_steps=1)
    losses = [h["loss"] for h in clean]
    out_dir = str(tmp_path / "run")
    args = make_args(out_dir, per_device_train_batch_size=4, learning_rate=0.05, optim="sgd", lr_scheduler_type="constant",
                     seed=3, max_steps=6, logging_steps=1, save_strategy="steps", save_steps=2)
    Trainer(NaNOnCalls((1,)), args, train_dataset=RegressionDataset(48), callbacks=[stop_at(2)]).train()
    with open(os.path.join(out_dir, "checkpoint-2", "loop_state.json")) as f:
        assert json.load(f)["nonfinite_total"] == 1  # step 1's NaN, logged before the save
    out = Trainer(NaNOnCalls((2,)), args, train_dataset=RegressionDataset(48)).train(resume_from_checkpoint=True)
    # NaN at steps 1 and 4 (the resumed run's second call): the run's finite steps are 2, 3, 5 and 6
    assert out.metrics["train_nonfinite_losses"] == 2
    assert out.training_loss == pytest.approx((losses[1] + losses[2] + losses[4] + losses[5]) / 4, rel=1e-12)


def test_all_nan_run_reports_nan_and_why(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="cadence"):
        out, logs = nan_run(str(tmp_path), range(1, 100), max_steps=4, logging_steps=2)
    assert math.isnan(out.training_loss) and math.isnan(out.metrics["train_loss"])
    assert out.metrics["train_nonfinite_losses"] == 4
    assert all(math.isnan(h["loss"]) and h["nonfinite_losses"] == 2 for h in logs) and len(logs) == 2
    assert "train_loss is NaN: the loss of every one of the 4 steps was non-finite" in caplog.text


def test_without_the_filter_nan_is_logged_as_is(tmp_path):
    """logging_nan_inf_filter=False (transformers' switch): the NaN enters the mean."""
    out, logs = nan_run(str(tmp_path), (2,), max_steps=2, logging_steps=2, logging_nan_inf_filter=False)
    assert math.isnan(logs[0]["loss"]) and "nonfinite_losses" not in logs[0] and math.isnan(out.training_loss)


# ---------------------------------------------------------------- 4. a second train()


def two_trainings(lib, out_dir):
    model = RegressionModel()
    args = lib.TrainingArguments(output_dir=out_dir, max_steps=4, logging_steps=1, learning_rate=0.05, warmup_steps=1,
                                 lr_scheduler_type="linear", save_strategy="no", report_to="none", disable_tqdm=True,
                                 use_cpu=True, seed=1)
    trainer = lib.Trainer(model, args, train_dataset=RegressionDataset(32))
    runs = []
    for _ in range(2):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        trainer.train()
        rates = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
        runs.append((before, {k: v.clone() for k, v in model.state_dict().items()}, rates))
    return runs


def test_second_train_gets_a_fresh_schedule(tmp_path):
    runs = two_trainings(__import__("cadence"), str(tmp_path / "c"))
    (_, first_end, first_rates), (second_start, second_end, second_rates) = runs
    assert first_rates == pytest.approx([0.0, 0.05, 0.05 * 2 / 3, 0.05 / 3], rel=1e-12, abs=0)  # warmup 1, then linear
    assert second_rates == first_rates  # not the finished schedule's 0
    assert all(torch.equal(first_end[k], second_start[k]) for k in first_end)
    assert all(not torch.equal(second_start[k], second_end[k]) for k in second_end)  # the weights moved
    # transformers does the same: its second call's rates equal its first's
    hf = two_trainings(transformers, str(tmp_path / "hf"))
    assert hf[1][2] == hf[0][2] and max(hf[1][2]) > 0


def test_a_given_scheduler_is_kept(tmp_path):
    """A scheduler passed in optimizers=(...) is the user's: a second train() continues it, as transformers."""
    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    trainer = Trainer(model, make_args(str(tmp_path), max_steps=2, logging_steps=1), train_dataset=RegressionDataset(16),
                      optimizers=(optimizer, scheduler))
    trainer.train()
    trainer.train()
    rates = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    assert trainer.lr_scheduler is scheduler and rates == [0.025, 0.0125]
