"""Optimizers that need a package torch does not ship: a clear error naming the package when it is
missing (at Trainer creation, before any step), and a short training run when it is installed."""

import importlib.util
import sys

import pytest
import torch
from tiny import FeatureDataset, RegressionDataset, RegressionModel, args_with

from cadence import Trainer, TrainingArguments
from cadence import optimization as co

OPTIONAL = sorted(co._OPTIONAL_PACKAGES)


make_args = args_with(max_steps=3, learning_rate=1e-2, use_cpu=True, logging_steps=1)


@pytest.mark.parametrize("optim", OPTIONAL)
def test_missing_package_is_named_at_trainer_creation(out_dir, monkeypatch, optim):
    module, pip = co._OPTIONAL_PACKAGES[optim]
    monkeypatch.setitem(sys.modules, module, None)  # absent, even where installed
    with pytest.raises(ValueError, match=rf"optim='{optim}'") as error:
        Trainer(RegressionModel(), make_args(out_dir, optim=optim), train_dataset=RegressionDataset(8))
    assert f"`{module}`" in str(error.value) and pip in str(error.value)


def _installed(optim):
    return importlib.util.find_spec(co._OPTIONAL_PACKAGES[optim][0]) is not None


# GaLore/APOLLO need nn.Linear targets: test_low_rank_optimizers.py trains them; AdaLomo refuses the scalar
# parameters of RegressionModel: test_lomo_optimizers.py trains it
@pytest.mark.parametrize("optim", [o for o in OPTIONAL if o not in co._NOT_BUILT and o not in co._LOW_RANK
                                   and o != "adalomo"])
def test_installed_package_trains(out_dir, optim):
    if not _installed(optim):
        pytest.skip(f"{co._OPTIONAL_PACKAGES[optim][0]} is not installed here")
    model = RegressionModel()
    # 8 steps: schedule-free RAdam makes no update while its variance estimate is too young (its first 4)
    trainer = Trainer(model, make_args(out_dir, optim=optim, max_steps=8), train_dataset=RegressionDataset(16))
    trainer.train()
    # the package's class (GrokAdamW: cadence's subclass of it, whose state dict resumes)
    assert any(c.__module__.startswith(co._OPTIONAL_PACKAGES[optim][0]) for c in type(trainer.optimizer).__mro__)
    assert model.a.item() != 0.0 and all(torch.isfinite(p).all() for p in model.parameters())


class Wide(torch.nn.Module):
    """y = W x with a 64x64 W (4096 values: bitsandbytes keeps 8-bit states from that size), MSE loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(64, 64, bias=False)

    def forward(self, x, labels=None):
        y = self.lin(x)
        return (torch.nn.functional.mse_loss(y, labels), y)


def test_adamw_bnb_8bit_trains_like_a_plain_loop(out_dir):
    """A Trainer with optim="adamw_bnb_8bit" equals a plain loop over bitsandbytes' AdamW8bit (same
    batches in order, no shuffling), and its states really are 8-bit."""
    bnb = pytest.importorskip("bitsandbytes")
    # bitsandbytes keeps per-parameter overrides in a process-wide registry keyed by id(): start clean, or
    # an earlier test's parameter at the same address makes this one 32-bit
    bnb.optim.GlobalOptimManager.get_instance().initialize()
    args = TrainingArguments(output_dir=out_dir, optim="adamw_bnb_8bit", max_steps=3, per_device_train_batch_size=4,
                             learning_rate=1e-2, weight_decay=0.0, lr_scheduler_type="constant", max_grad_norm=0.0,
                             disable_tqdm=True, save_strategy="no", report_to="none", use_cpu=True,
                             train_sampling_strategy="sequential")
    model, data = Wide(), FeatureDataset(16, 64, label_shape=(64,), seed=1)
    trainer = Trainer(model, args, train_dataset=data)
    trainer.train()
    assert type(trainer.optimizer).__name__ == "AdamW" and trainer.optimizer.state[model.lin.weight]["state1"].dtype == torch.uint8
    reference = Wide()
    opt = bnb.optim.AdamW(reference.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, optim_bits=8)
    for step in range(3):
        rows = slice(4 * step, 4 * step + 4)
        reference(data.x[rows], data.y[rows])[0].backward()
        opt.step()
        opt.zero_grad()
    # the same library, ops and inputs in one process: equal up to the order of float32 sums in the
    # loss's backward (the Trainer's batch comes through a collator); quantisation makes no tolerance wider
    assert torch.allclose(model.lin.weight, reference.lin.weight, rtol=0, atol=1e-6)
    assert not torch.allclose(model.lin.weight, Wide().lin.weight, atol=1e-3)  # it trained
