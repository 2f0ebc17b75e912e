"""use_liger_kernel (issue 29): refused before step 1 where it cannot work; applied as transformers applies it.

Liger's kernels are Triton kernels: they run only on a GPU (``scripts/gpu_check.py``'s ``liger`` check trains with
them there and compares losses and peak memory). Here a stand-in ``liger_kernel`` package on ``sys.path`` records
the call cadence makes, so the wiring (which model, which keyword arguments, when) is tested on a CPU.
"""

import importlib.util
import sys
import textwrap

import pytest
import torch
from tiny import LMDataset, RegressionDataset, RegressionModel, args_with, lm_collate, tiny_gpt2

from cadence import Trainer, TrainingArguments
from cadence import liger

make_args = args_with(use_cpu=True, use_liger_kernel=True, max_steps=2, per_device_train_batch_size=4,
                      logging_steps=1)


@pytest.fixture
def fake_liger(tmp_path, monkeypatch):
    """A ``liger_kernel`` package whose ``_apply_liger_kernel_to_instance`` records its calls (``CALLS``), with one
    patch function of liger 0.8.5's llama signature, and a CPU counted as a device the kernels run on."""
    root = tmp_path / "site" / "liger_kernel" / "transformers"
    root.mkdir(parents=True)
    (root.parent / "__init__.py").write_text("")
    (root / "monkey_patch.py").write_text(textwrap.dedent("""
        def apply_liger_kernel_to_llama(rope=True, cross_entropy=False, fused_linear_cross_entropy=True,
                                        rms_norm=True, swiglu=True, model=None):
            pass
        MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": apply_liger_kernel_to_llama}
    """))
    (root / "__init__.py").write_text(textwrap.dedent("""
        CALLS = []
        def _apply_liger_kernel_to_instance(model, **kwargs):
            CALLS.append((model, kwargs))
    """))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [m for m in sys.modules if m.startswith("liger_kernel")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(liger, "_DEVICE_TYPES", ("cpu",))
    import liger_kernel.transformers

    return liger_kernel.transformers.CALLS


def test_arguments_accept_use_liger_kernel():
    args = TrainingArguments(use_liger_kernel=True, liger_kernel_config={"rms_norm": False})
    assert args.use_liger_kernel is True and args.liger_kernel_config == {"rms_norm": False}


@pytest.mark.parametrize("config, message", [
    ("rms_norm", "liger_kernel_config='rms_norm' is invalid: it must be None or a dict"),
    ({"rms_norm": "no"}, "liger_kernel_config={'rms_norm': 'no'} is invalid: it must be None or a dict"),
])
def test_liger_kernel_config_must_be_a_dict_of_bools(config, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        TrainingArguments(use_liger_kernel=True, liger_kernel_config=config)


def test_refused_on_cpu_before_step_one(out_dir):
    with pytest.raises(ValueError, match=r"use_liger_kernel=True needs a GPU: .*'cpu' device.*set use_liger_kernel=False"):
        Trainer(tiny_gpt2(), make_args(out_dir), train_dataset=LMDataset(8), data_collator=lm_collate)


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed here")
def test_missing_package_is_one_pip_line(out_dir, monkeypatch):
    monkeypatch.setattr(liger, "_DEVICE_TYPES", ("cpu",))  # past the device check, as on a GPU
    with pytest.raises(ImportError) as error:
        Trainer(tiny_gpt2(), make_args(out_dir), train_dataset=LMDataset(8), data_collator=lm_collate)
    assert str(error.value) == "use_liger_kernel=True needs the liger-kernel package: pip install liger-kernel"


def test_unknown_config_key_is_refused(out_dir, fake_liger):
    with pytest.raises(ValueError, match=r"liger_kernel_config has key\(s\) \['fused_linear_crossentropy'\] that no "
                                         r"Liger patch function takes; known: \['cross_entropy', "
                                         r"'fused_linear_cross_entropy', 'rms_norm', 'rope', 'swiglu'\]"):
        Trainer(tiny_gpt2(), make_args(out_dir, liger_kernel_config={"fused_linear_crossentropy": True}),
                train_dataset=LMDataset(8), data_collator=lm_collate)
    assert fake_liger == []


def test_applied_once_at_train_with_the_config(out_dir, fake_liger):
    model = tiny_gpt2()
    trainer = Trainer(model, make_args(out_dir, liger_kernel_config={"rms_norm": False, "swiglu": True}),
                      train_dataset=LMDataset(8), data_collator=lm_collate)
    assert fake_liger == []  # as transformers: applied by train(), not by __init__
    trainer.train()
    assert len(fake_liger) == 1
    patched, kwargs = fake_liger[0]
    assert patched is model and kwargs == {"rms_norm": False, "swiglu": True}
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [1, 2]


def test_no_config_passes_no_keywords(out_dir, fake_liger):
    model = tiny_gpt2()
    Trainer(model, make_args(out_dir), train_dataset=LMDataset(8), data_collator=lm_collate).train()
    assert fake_liger == [(model, {})]


def test_model_init_model_is_patched(out_dir, fake_liger):
    trainer = Trainer(model_init=lambda: tiny_gpt2(), args=make_args(out_dir), train_dataset=LMDataset(8),
                      data_collator=lm_collate)
    trainer.train()
    assert [m for m, _ in fake_liger] == [trainer.model]


def test_plain_module_is_warned_and_left_alone(out_dir, fake_liger, caplog):
    trainer = Trainer(RegressionModel(), make_args(out_dir), train_dataset=RegressionDataset(8))
    with caplog.at_level("WARNING", logger="cadence.liger"):
        trainer.train()
    assert fake_liger == []
    assert "RegressionModel is not a transformers PreTrainedModel, so no Liger kernels are applied" in caplog.text
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))
