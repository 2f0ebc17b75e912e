"""LOMO and AdaLomo (lomo-optim): the update is fused into backward (``fused_backward(loss, lr)``), so the backend's
backward verb drives it and its step verb does nothing. A run equals the package driven by hand (the scheduler's lr
handed to every ``fused_backward``) and transformers.Trainer; ``max_grad_norm`` clips through LOMO's own norm pass;
gradient accumulation updates once per micro-batch, as in transformers; a run resumes bit-identical (AdaLomo's second
moments and step count saved, loading with ``weights_only=True``); what cannot work is refused before step 1.

lomo-optim is in the ``optimizers`` extra; a test skips only where it cannot be imported. AdaLomo (0.1.1) creates its
state with ``.cuda()`` whatever the model's device: the hand and transformers runs here patch ``Tensor.cuda`` to stay
on the CPU, as a CPU user of the package must; cadence keeps the state on each parameter's device itself.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import torch
from tiny import FeatureDataset, make_args
from torch import nn

from cadence import Trainer
from cadence import optimization as co

LR, STEPS, BATCH = 1e-2, 6, 4
OPTIMS = ["lomo", "adalomo"]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.down = nn.Linear(32, 4)

    def forward(self, x, labels=None):
        y = self.down(torch.tanh(self.norm(self.up(x))))
        return (nn.functional.mse_loss(y, labels), y)


def _data():
    return FeatureDataset(STEPS * BATCH, 16, label_shape=(4,), seed=1)


@pytest.fixture
def lomo_optim(monkeypatch):
    package = pytest.importorskip("lomo_optim")
    if not torch.cuda.is_available():  # the package's AdaLomo.__init__ calls .cuda() on its state tensors
        monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    return package


def _args(out_dir, optim, lib=None, **overrides):
    options = dict(optim=optim, max_steps=STEPS, per_device_train_batch_size=BATCH, learning_rate=LR,
                   lr_scheduler_type="linear", max_grad_norm=0.0, use_cpu=True, train_sampling_strategy="sequential",
                   seed=0, logging_steps=1)
    return make_args(out_dir, lib, **{**options, **overrides})


def _by_hand(package, optim, micro_batches=1, clip=None) -> tuple[Net, list[float]]:
    """The package as its README drives it: (grad_norm, then) fused_backward with the linear schedule's lr."""
    model, data = Net(), _data()
    cls = package.Lomo if optim == "lomo" else package.AdaLomo
    opt = cls(model, lr=LR, **({"clip_grad_norm": clip} if clip else {}))
    norms, rows = [], BATCH // micro_batches
    for step in range(STEPS):
        lr = LR * (STEPS - step) / STEPS
        for m in range(micro_batches):
            at = slice(BATCH * step + rows * m, BATCH * step + rows * (m + 1))
            loss = model(data.x[at], data.y[at])[0] / micro_batches
            if clip:
                opt.grad_norm(loss)
                norms.append(float(torch.norm(opt.grad_norms, 2.0)))
            opt.fused_backward(loss, lr)
    return model, norms


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _close(a, b, atol):
    return all(torch.allclose(a[k], b[k], rtol=0, atol=atol) for k in a)


@pytest.mark.parametrize("optim", OPTIMS)
def test_trains_like_the_package_by_hand_and_transformers(out_dir, optim, lomo_optim):
    """The same fused updates on the same batches with the linear schedule's lr at each step: 1e-6 against the hand
    loop and against transformers.Trainer (float32 rounding only; the weights move by ~1e-2)."""
    transformers = pytest.importorskip("transformers")
    out_dir = Path(out_dir)
    model = Net()
    trainer = Trainer(model, _args(out_dir / "c", optim), train_dataset=_data())
    trainer.train()
    assert isinstance(trainer.optimizer, lomo_optim.Lomo if optim == "lomo" else lomo_optim.AdaLomo)
    logged = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    assert logged == pytest.approx([LR * (STEPS - k) / STEPS for k in range(STEPS)])
    hand, _ = _by_hand(lomo_optim, optim)
    assert _close(_weights(model), _weights(hand), 1e-6)
    assert not _close(_weights(model), _weights(Net()), 1e-3)
    theirs = Net()
    transformers.Trainer(theirs, _args(out_dir / "t", optim, transformers), train_dataset=_data()).train()
    assert _close(_weights(model), _weights(theirs), 1e-6)


@pytest.mark.parametrize("optim", OPTIMS)
def test_max_grad_norm_clips_through_lomos_own_norm_pass(out_dir, optim, lomo_optim):
    """max_grad_norm=0.05 (the gradients' norms here are ~0.3-1): the package's clip_grad_norm, its grad_norm pass
    before each fused_backward; the logged grad_norm is that pass's global norm. transformers passes no
    clip_grad_norm and its clip finds no gradients left (it logs grad_norm 0.0 and does not clip)."""
    model = Net()
    trainer = Trainer(model, _args(Path(out_dir) / "c", optim, max_grad_norm=0.05), train_dataset=_data())
    trainer.train()
    hand, norms = _by_hand(lomo_optim, optim, clip=0.05)
    assert _close(_weights(model), _weights(hand), 1e-6)
    logged = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    assert logged == pytest.approx(norms, rel=1e-5) and min(norms) > 0.05  # every step was clipped
    unclipped, _ = _by_hand(lomo_optim, optim)
    assert not _close(_weights(model), _weights(unclipped), 1e-4)


@pytest.mark.parametrize("optim", OPTIMS)
def test_gradient_accumulation_updates_each_micro_batch_as_transformers(out_dir, optim, lomo_optim):
    """gradient_accumulation_steps=2: transformers calls fused_backward per micro-batch with the loss divided by 2
    (nothing accumulates: the weights move twice per optimizer step). cadence does the same (warned)."""
    transformers = pytest.importorskip("transformers")
    out_dir = Path(out_dir)
    ga = dict(per_device_train_batch_size=BATCH // 2, gradient_accumulation_steps=2)
    model = Net()
    Trainer(model, _args(out_dir / "c", optim, **ga), train_dataset=_data()).train()
    hand, _ = _by_hand(lomo_optim, optim, micro_batches=2)
    assert _close(_weights(model), _weights(hand), 1e-6)
    assert not _close(_weights(hand), _weights(_by_hand(lomo_optim, optim)[0]), 1e-5)  # not the big-batch run
    theirs = Net()
    transformers.Trainer(theirs, _args(out_dir / "t", optim, transformers, **ga), train_dataset=_data()).train()
    assert _close(_weights(model), _weights(theirs), 1e-6)


@pytest.mark.parametrize("optim", OPTIMS)
def test_resumes_bit_identical_and_loads_weights_only(out_dir, optim, lomo_optim):
    """Stopped after step 3 of 6: AdaLomo's second moments (row/column factors for matrices, one vector for biases and
    the norm) and its step count, which sets the moments' decay, come back; Lomo has no state beyond its lr."""
    out_dir = Path(out_dir)
    unbroken = Net()
    Trainer(unbroken, _args(out_dir / "a", optim, save_strategy="steps", save_steps=3), train_dataset=_data()).train()
    resumed = Net()
    Trainer(resumed, _args(out_dir / "b", optim, save_strategy="steps", save_steps=3),
            train_dataset=_data()).train(resume_from_checkpoint=str(out_dir / "a" / "checkpoint-3"))
    a, b = _weights(unbroken), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = torch.load(out_dir / "a" / "checkpoint-3" / "optimizer.pt", weights_only=True)
    if optim == "adalomo":
        saved = state["adalomo"]
        assert saved["step_num"] == 3
        assert sorted(saved["exp_avg_sq_row"]) == ["down.weight", "up.weight"]
        assert saved["exp_avg_sq_row"]["up.weight"].shape == (32,) and saved["exp_avg_sq_col"]["up.weight"].shape == (16,)
        assert sorted(saved["exp_avg_sq"]) == ["down.bias", "norm.bias", "norm.weight", "up.bias"]
        assert all(bool((t > 0).all()) for t in saved["exp_avg_sq"].values())


def test_adalomo_state_lives_on_the_parameters_device(lomo_optim, monkeypatch):
    """Built by cadence, AdaLomo's state is on each parameter's device (the package's .cuda() is not reached)."""
    monkeypatch.undo()  # the real Tensor.cuda: cadence must not need the patch
    model = Net()
    opt = co.create_optimizer(model, _ns("adalomo"))
    assert {t.device for t in (*opt.exp_avg_sq.values(), *opt.exp_avg_sq_row.values())} == {torch.device("cpu")}


def _ns(optim, **overrides):
    return NS(**{**dict(optim=optim, optim_args=None, learning_rate=LR, weight_decay=0.0, max_grad_norm=0.0,
                        world_size=1, deepspeed=None, fp16=False, gradient_accumulation_steps=1), **overrides})


@pytest.mark.parametrize("optim", OPTIMS)
def test_refusals(optim, lomo_optim):
    """No model (transformers refuses it too); several processes, DeepSpeed and fp16, which transformers lets through
    into runs that cannot work (no gradient all-reduce outside ZeRO-3; DeepSpeed's and the fp16 scaler's backward
    never call fused_backward), and auto_find_batch_size (a step that ran out of memory halfway through its fused
    update cannot be redone): refused, naming the field and the fix."""
    with pytest.raises(ValueError, match=rf"optim={optim!r} needs the model"):
        co.get_optimizer_cls_and_kwargs(_ns(optim))
    for overrides, words in (({"world_size": 2}, "world_size=2"), ({"deepspeed": "ds.json"}, "deepspeed"),
                             ({"fp16": True}, "fp16=True"), ({"auto_find_batch_size": True}, "auto_find_batch_size=True")):
        with pytest.raises(ValueError, match=rf"optim={optim!r} .*{words}.*"):
            co.get_optimizer_cls_and_kwargs(_ns(optim, **overrides), Net())


def test_adalomo_refuses_parameters_it_cannot_factor(lomo_optim):
    """The package's AdaLomo keeps row/column moments from shape[0] and shape[1]: a scalar parameter is an IndexError
    inside it (transformers passes it through), a 3-D one a shape mismatch at the first step. Refused here, named."""
    model = nn.Module()
    model.scale, model.conv = nn.Parameter(torch.ones(())), nn.Conv1d(2, 3, 5)
    with pytest.raises(ValueError, match=r"1-D and 2-D parameters only.* 2 parameter\(s\).*scale \(\).*conv.weight "
                                         r"\(3, 2, 5\).*optim='lomo'"):
        co.get_optimizer_cls_and_kwargs(_ns("adalomo"), model)
    co.get_optimizer_cls_and_kwargs(_ns("lomo"), model)  # Lomo's update is elementwise: any shape


def test_weight_decay_is_not_applied_as_in_transformers(out_dir, lomo_optim, caplog):
    """transformers builds Lomo(model, lr=...) only: weight_decay=0.1 changes nothing, and cadence says so."""
    model = Net()
    with caplog.at_level("WARNING"):
        Trainer(model, _args(Path(out_dir) / "c", "lomo", weight_decay=0.1), train_dataset=_data()).train()
    assert _close(_weights(model), _weights(_by_hand(lomo_optim, "lomo")[0]), 1e-6)
    assert "weight_decay=0.1 is not applied" in caplog.text
