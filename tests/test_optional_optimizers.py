"""Optimizers that need a package torch does not ship: a clear error naming the package when it is
missing (at Trainer creation, before any step), and a short training run when it is installed."""

import importlib.util
import sys

import pytest
import torch
from tiny import RegressionDataset, RegressionModel

from cadence import Trainer, TrainingArguments
from cadence import optimization as co

OPTIONAL = sorted(co._OPTIONAL_PACKAGES)


def make_args(out_dir, optim):
    return TrainingArguments(output_dir=out_dir, optim=optim, max_steps=3, learning_rate=1e-2, disable_tqdm=True,
                             save_strategy="no", report_to="none", use_cpu=True, logging_steps=1)


@pytest.mark.parametrize("optim", OPTIONAL)
def test_missing_package_is_named_at_trainer_creation(out_dir, monkeypatch, optim):
    module, pip = co._OPTIONAL_PACKAGES[optim]
    monkeypatch.setitem(sys.modules, module, None)  # absent, even where installed
    with pytest.raises(ValueError, match=rf"optim='{optim}'") as error:
        Trainer(RegressionModel(), make_args(out_dir, optim), train_dataset=RegressionDataset(8))
    assert f"`{module}`" in str(error.value) and pip in str(error.value)


def _installed(optim):
    return importlib.util.find_spec(co._OPTIONAL_PACKAGES[optim][0]) is not None


@pytest.mark.parametrize("optim", [o for o in OPTIONAL if o not in co._NOT_BUILT])
def test_installed_package_trains(out_dir, optim):
    if not _installed(optim):
        pytest.skip(f"{co._OPTIONAL_PACKAGES[optim][0]} is not installed here")
    model = RegressionModel()
    trainer = Trainer(model, make_args(out_dir, optim), train_dataset=RegressionDataset(16))
    trainer.train()
    assert type(trainer.optimizer).__module__.startswith(co._OPTIONAL_PACKAGES[optim][0])
    assert model.a.item() != 0.0 and all(torch.isfinite(p).all() for p in model.parameters())
