"""Trainer behaviour on tiny models: training, losses, errors, logging, checkpoints."""

import json
import math
import os

import pytest
import torch
from tiny import LMDataset, RegressionDataset, RegressionModel, Stream, TokenDataset, TokenTagger, make_args, pad_collate

from cadence import Trainer, TrainerCallback


def test_regression_learns(out_dir):
    model = RegressionModel()
    trainer = Trainer(model, make_args(out_dir, num_train_epochs=20, learning_rate=0.1, logging_steps=8),
                      train_dataset=RegressionDataset(64))
    out = trainer.train()
    assert out.global_step == 20 * 8
    assert model.a.item() == pytest.approx(2.0, abs=0.1) and model.b.item() == pytest.approx(3.0, abs=0.1)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < 0.05 < losses[0]
    for key in ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss", "epoch"):
        assert key in out.metrics
    assert out.metrics["epoch"] == pytest.approx(20.0)
    # train_loss is the mean of the per-step losses
    assert out.training_loss == pytest.approx(sum(losses) / len(losses), rel=1e-6)


def test_max_steps_overrides_epochs(out_dir):
    trainer = Trainer(RegressionModel(), make_args(out_dir, max_steps=5, num_train_epochs=100),
                      train_dataset=RegressionDataset(64))
    assert trainer.train().global_step == 5
    assert trainer.state.epoch == pytest.approx(5 / 8)


class NoLossModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(1, 1)

    def forward(self, input_x, labels=None):
        return {"prediction": self.w(input_x[:, None])}


def test_model_without_loss_is_a_clear_error(out_dir):
    trainer = Trainer(NoLossModel(), make_args(out_dir, max_steps=2), train_dataset=RegressionDataset(8))
    with pytest.raises(ValueError, match="did not return a loss.*prediction.*compute_loss_func"):
        trainer.train()


def test_compute_loss_func_gets_item_count(out_dir):
    seen, own = [], []

    def loss_func(outputs, labels, num_items_in_batch=None):
        seen.append(num_items_in_batch)
        own.append(int((labels != -100).sum()))
        logits = outputs["logits"]
        total = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        return total / num_items_in_batch

    args = make_args(out_dir, max_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=2)
    ds = TokenDataset(8)
    trainer = Trainer(TokenTagger(), args, train_dataset=ds, data_collator=pad_collate, compute_loss_func=loss_func)
    trainer.train()
    # each micro-batch gets its step's count: the labels != -100 of both of the step's batches
    assert [int(n) for n in seen] == [own[0] + own[1]] * 2 + [own[2] + own[3]] * 2
    # one epoch of 8 rows: the two steps together count every label of the set
    assert sum(own) == sum(int((ds[i]["labels"] != -100).sum()) for i in range(8))


def test_label_smoothing_matches_reference(out_dir):
    from cadence.loss import LabelSmoother

    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    labels = torch.randint(0, 7, (3, 5))
    labels[0, :2] = -100
    ours = LabelSmoother(0.1)({"logits": logits}, labels)
    keep = labels != -100
    reference = torch.nn.functional.cross_entropy(logits[keep], labels[keep], label_smoothing=0.1)
    assert ours.item() == pytest.approx(reference.item(), rel=1e-9)


class Boom(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise KeyError("boom")


def test_callback_error_names_callback_and_event(out_dir):
    trainer = Trainer(RegressionModel(), make_args(out_dir, max_steps=4), train_dataset=RegressionDataset(16),
                      callbacks=[Boom()])
    with pytest.raises(KeyError) as info:  # the callback's own exception, as transformers lets it through
        trainer.train()
    assert info.value.__notes__ == ["raised by callback Boom in on_step_end"]
    assert trainer.state.global_step == 2


class NaNAt(torch.nn.Module):
    """Regression model whose loss is NaN on the given steps' batches."""

    def __init__(self):
        super().__init__()
        self.inner = RegressionModel()
        self.calls = 0

    def forward(self, input_x, labels=None):
        self.calls += 1
        loss, y = self.inner(input_x, labels)
        if self.calls in (2, 3):
            loss = loss + torch.tensor(float("nan"))  # a constant: the gradients stay finite
        return (loss, y)


def test_nonfinite_losses_are_counted_not_hidden(out_dir):
    trainer = Trainer(NaNAt(), make_args(out_dir, max_steps=4, logging_steps=4),
                      train_dataset=RegressionDataset(32))
    trainer.train()
    log = [h for h in trainer.state.log_history if "loss" in h][0]
    assert log["nonfinite_losses"] == 2
    # the NaN is a constant added to the loss: the same run without it logs every step's loss
    clean = Trainer(RegressionModel(), make_args(out_dir + "_clean", max_steps=4, logging_steps=1),
                    train_dataset=RegressionDataset(32))
    clean.train()
    losses = [h["loss"] for h in clean.state.log_history if "loss" in h]
    assert log["loss"] == pytest.approx((losses[0] + losses[3]) / 2, rel=1e-12)  # the finite steps' mean


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_eval_loss_is_item_mean_independent_of_batch_size(out_dir, batch):
    torch.manual_seed(0)
    model = TokenTagger(dtype=torch.float64)
    ds = TokenDataset(19)
    trainer = Trainer(model, make_args(out_dir, per_device_eval_batch_size=batch), eval_dataset=ds, data_collator=pad_collate)
    metrics = trainer.evaluate()
    full = pad_collate([ds[i] for i in range(len(ds))])
    expected = model(**full)["loss"].item()  # one mean over every label of the set
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-12)
    assert {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"} <= set(metrics)


def test_predict_pads_and_concatenates(out_dir):
    model = TokenTagger()
    ds = TokenDataset(10)
    trainer = Trainer(model, make_args(out_dir, per_device_eval_batch_size=4), data_collator=pad_collate)
    out = trainer.predict(ds)
    assert out.predictions.shape[0] == 10 and out.label_ids.shape[0] == 10
    for i in range(10):
        n = len(ds[i]["labels"])
        assert (out.label_ids[i, :n] == ds[i]["labels"].numpy()).all()
        assert (out.label_ids[i, n:] == -100).all()
    assert "test_loss" in out.metrics


def test_checkpoints_are_written_and_rotated(out_dir):
    args = make_args(out_dir, max_steps=6, save_strategy="steps", save_steps=2, save_total_limit=2)
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(16))
    trainer.train()
    names = sorted(os.listdir(out_dir))
    assert names == ["checkpoint-4", "checkpoint-6"]
    files = set(os.listdir(os.path.join(out_dir, "checkpoint-6")))
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
            "training_args.bin", "training_args.json"} <= files
    state = json.load(open(os.path.join(out_dir, "checkpoint-6", "trainer_state.json")))
    assert state["global_step"] == 6
    from safetensors.torch import load_file

    weights = load_file(os.path.join(out_dir, "checkpoint-6", "model.safetensors"))
    assert weights["a"].item() == pytest.approx(trainer.model.a.item())


def test_eval_strategy_without_eval_dataset_is_refused(out_dir):
    with pytest.raises(ValueError, match="eval_strategy.*eval_dataset"):
        Trainer(RegressionModel(), make_args(out_dir, eval_strategy="steps", eval_steps=2), train_dataset=RegressionDataset(8))


def test_iterable_dataset_needs_max_steps(out_dir):
    with pytest.raises(ValueError, match="max_steps"):
        Trainer(RegressionModel(), make_args(out_dir), train_dataset=Stream(RegressionDataset(1000)))
    trainer = Trainer(RegressionModel(), make_args(out_dir, max_steps=7), train_dataset=Stream(RegressionDataset(1000)))
    assert trainer.train().global_step == 7


def test_empty_dataset_is_refused(out_dir):
    with pytest.raises(ValueError, match="empty"):
        Trainer(RegressionModel(), make_args(out_dir), train_dataset=RegressionDataset(0))


def test_unused_columns_are_removed(out_dir):
    class WithExtra(RegressionDataset):
        def __getitem__(self, i):
            return {**super().__getitem__(i), "idx": i}

    trainer = Trainer(RegressionModel(), make_args(out_dir, max_steps=2), train_dataset=WithExtra(8))
    assert trainer.train().global_step == 2


def test_causal_lm_items_skip_position_zero():
    from cadence.data import count_items

    labels = torch.tensor([[5, 6, -100, 7], [-100, 1, 2, -100]])
    assert count_items(labels, shifted=False).item() == 5
    assert count_items(labels, shifted=True).item() == 4  # label 0 of each row never enters a causal LM loss


def test_nonfinite_count_survives_intermediate_folds(out_dir, monkeypatch):
    """Losses are folded into the running sums in chunks; the logged loss and count do not depend on it."""
    from cadence.loop_state import LoopState

    def logged(fold_every):
        monkeypatch.setattr(LoopState, "FOLD_EVERY", fold_every)
        t = Trainer(NaNAt(), make_args(out_dir, max_steps=4, logging_steps=4), train_dataset=RegressionDataset(32))
        t.train()
        return [h for h in t.state.log_history if "loss" in h][0]

    once, chunked = logged(1024), logged(1)
    assert chunked["nonfinite_losses"] == once["nonfinite_losses"] == 2
    assert chunked["loss"] == pytest.approx(once["loss"], rel=1e-12)
