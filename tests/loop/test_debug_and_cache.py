"""debug="underflow_overflow" names the first module producing inf/NaN; torch_empty_cache_steps."""

import pytest
import torch
from tiny import FeatureDataset, args_with
from torch import nn

from cadence import Trainer, TrainerCallback, TrainingArguments
from cadence import backend as backend_module


class Square(nn.Module):
    def forward(self, x):
        return x * x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin1, self.sq, self.lin2 = nn.Linear(4, 8), Square(), nn.Linear(8, 1)

    def forward(self, x, labels=None):
        y = self.lin2(self.sq(self.lin1(x))).squeeze(-1)
        return {"loss": nn.functional.mse_loss(y, labels), "logits": y}


class BlowUp(TrainerCallback):
    """Scales lin1's weights by `factor` before optimizer step number `at` (1-based)."""

    def __init__(self, model, at, factor):
        self.model, self.at, self.factor = model, at, factor

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.at:
            with torch.no_grad():
                self.model.lin1.weight.mul_(self.factor)


make_args = args_with(use_cpu=True, max_steps=6, per_device_train_batch_size=4, logging_steps=1,
                      debug="underflow_overflow", optim="sgd", learning_rate=1e-3)


def test_names_the_module_that_overflows_float32(out_dir):
    model = Net()
    trainer = Trainer(model, make_args(out_dir), train_dataset=FeatureDataset(32, 4), callbacks=[BlowUp(model, at=3, factor=1e22)])
    with pytest.raises(ValueError, match=r"module 'sq' \(Square\) produced inf/NaN at step 2: its inputs were finite "
                                         r"\(largest \|value\| \d.*e\+2\d\), its own weights finite"):
        trainer.train()
    assert all(not m._forward_hooks for m in model.modules())  # removed even though training failed


def test_names_the_linear_that_overflows_float16(out_dir):
    model = Net()
    trainer = Trainer(model, make_args(out_dir, fp16=True), train_dataset=FeatureDataset(32, 4),
                      callbacks=[BlowUp(model, at=1, factor=3e5)])  # lin1 output ~3e5: finite in float32, beyond float16 (65504)
    with pytest.raises(ValueError, match=r"module 'lin1' \(Linear\) produced inf/NaN at step 0"):
        trainer.train()
    with torch.no_grad():
        assert torch.isfinite(model.lin1(FeatureDataset(32, 4).x)).all()  # float32 is fine: only the half-precision forward overflows


def test_no_overflow_trains_as_without_debug(out_dir):
    runs = {}
    for debug in ("", "underflow_overflow"):
        model = Net()
        trainer = Trainer(model, make_args(f"{out_dir}/{debug}", debug=debug), train_dataset=FeatureDataset(32, 4))
        trainer.train()
        runs[debug] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert all(not m._forward_hooks for m in model.modules())
    assert runs[""] == runs["underflow_overflow"]


def test_debug_values_are_checked():
    assert TrainingArguments(debug="underflow_overflow").debug == ["underflow_overflow"]
    with pytest.raises(ValueError, match="'tpu_metrics_debug' is not built"):
        TrainingArguments(debug="tpu_metrics_debug")
    with pytest.raises(ValueError, match=r"debug=\['overflow'\] is invalid.*remove 'overflow'"):
        TrainingArguments(debug="overflow")


def test_empty_cache_every_n_steps(out_dir, monkeypatch):
    calls = []
    monkeypatch.setitem(backend_module._EMPTY_CACHE, "cpu", lambda: calls.append(1))
    trainer = Trainer(Net(), make_args(out_dir, debug="", torch_empty_cache_steps=2, max_steps=7), train_dataset=FeatureDataset(32, 4))
    trainer.train()
    assert len(calls) == 3  # after steps 2, 4 and 6


def test_empty_cache_is_a_no_op_on_cpu(out_dir):
    assert "cpu" not in backend_module._EMPTY_CACHE
    trainer = Trainer(Net(), make_args(out_dir, debug="", torch_empty_cache_steps=1, max_steps=2), train_dataset=FeatureDataset(32, 4))
    assert trainer.train().global_step == 2
