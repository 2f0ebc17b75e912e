"""The optimizers transformers builds from their own packages (grokadamw, torch-optimi's StableAdamW, torchao's
low-bit AdamW, schedulefree), through cadence's ``optim`` table: each trains a tiny model like the same
optimizer driven by hand in a plain loop (same seed, batches, parameter groups), like transformers.Trainer,
resumes bit-identical from a mid-run checkpoint, and its ``optimizer.pt`` loads with ``weights_only=True``.

Every package here is installed in the test environment (the ``test`` extra); a test skips only where one
cannot be imported. torchao's optimizers compile their step with ``torch.compile`` (tens of seconds on a CPU
the first time in a process), so those cases are ``slow``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from tiny import FeatureDataset, make_args
from torch import nn

from cadence import Trainer
from cadence import optimization as co

LR, WD, B1, B2, EPS, STEPS, BATCH = 1e-2, 0.01, 0.8, 0.99, 1e-7, 6, 4


class Net(nn.Module):
    """64 -> 64 -> 4 with biases: 4096 weights in the first layer (torchao quantises states from that size)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(64, 64)
        self.down = nn.Linear(64, 4)

    def forward(self, x, labels=None):
        y = self.down(torch.tanh(self.up(x)))
        return (nn.functional.mse_loss(y, labels), y)


def _data():
    return FeatureDataset(STEPS * BATCH, 64, label_shape=(4,), seed=1)


def _groups(model: Net) -> list[dict]:
    """The Trainer's two weight-decay groups, written out by hand."""
    return [{"params": [model.up.weight, model.down.weight], "weight_decay": WD},
            {"params": [model.up.bias, model.down.bias], "weight_decay": 0.0}]


def _grok(groups):
    from grokadamw import GrokAdamW
    return GrokAdamW(groups, lr=LR, alpha_init=0.98, lamb=2.0, gamma=0.1, grokking_signal_decay_rate=0.1,
                     gradient_clipping=1.0)


def _stable(groups):
    from optimi import StableAdamW
    return StableAdamW(groups, lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD, kahan_sum=False)


def _torchao(bits):
    def build(groups):
        from torchao.optim import AdamW4bit, AdamW8bit
        return (AdamW4bit if bits == 4 else AdamW8bit)(groups, lr=LR, betas=(B1, B2), eps=EPS, block_size=256)
    return build


def _sf(name):
    def build(groups):
        import schedulefree
        common = {"lr": LR, "weight_decay": WD, "weight_lr_power": 2.0, "r": 0.0}
        if name == "sgd":
            return schedulefree.SGDScheduleFree(groups, warmup_steps=2, **common)
        if name == "radam":
            return schedulefree.RAdamScheduleFree(groups, betas=(B1, B2), eps=EPS, **common)
        return schedulefree.AdamWScheduleFree(groups, betas=(B1, B2), eps=EPS, warmup_steps=2, **common)
    return build


# optim -> (optim_args, the same optimizer built by hand, the package's import name)
CASES = {
    "grokadamw": (None, _grok, "grokadamw"),
    "stable_adamw": ("kahan_sum=False", _stable, "optimi"),
    "schedule_free_adamw": (None, _sf("adamw"), "schedulefree"),
    "schedule_free_radam": (None, _sf("radam"), "schedulefree"),
    "schedule_free_sgd": ("weight_lr_power=2,r=0", _sf("sgd"), "schedulefree"),
    "adamw_torch_4bit": (None, _torchao(4), "torchao.optim"),
    "adamw_torch_8bit": (None, _torchao(8), "torchao.optim"),
}
SLOW = {"adamw_torch_4bit", "adamw_torch_8bit"}  # torch.compile of the step on a CPU
PARAMS = [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else []) for name in CASES]


@pytest.fixture(autouse=True)
def _compiled_throughout():
    """torchao compiles its step for each parameter's shapes and state types; past dynamo's recompile limit (8) a
    step falls back to eager, whose float rounding differs, so a run could mix the two depending on what ran
    before it in the process. A fresh cache and room for every variant keep each run compiled throughout."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=64):
        yield


def _require(optim):
    try:
        importlib.import_module(CASES[optim][2])
    except ImportError:
        pytest.skip(f"{CASES[optim][2]} cannot be imported here")


def _args(out_dir, optim, lib=None, **overrides):
    options = dict(optim=optim, optim_args=CASES[optim][0], max_steps=STEPS, per_device_train_batch_size=BATCH,
                   learning_rate=LR, weight_decay=WD, adam_beta1=B1, adam_beta2=B2, adam_epsilon=EPS,
                   lr_scheduler_type="constant", warmup_steps=2, max_grad_norm=0.0, use_cpu=True,
                   train_sampling_strategy="sequential", seed=0)
    return make_args(out_dir, lib, **{**options, **overrides})


def _by_hand(optim) -> Net:
    """The plain loop: the package's optimizer over the same groups and batches, in order."""
    model, data = Net(), _data()
    opt = CASES[optim][1](_groups(model))
    if hasattr(opt, "train"):
        opt.train()
    for step in range(STEPS):
        rows = slice(BATCH * step, BATCH * step + BATCH)
        model(data.x[rows], data.y[rows])[0].backward()
        opt.step()
        opt.zero_grad()
    if hasattr(opt, "eval"):  # schedule-free: what is evaluated and saved is the averaged point
        opt.eval()
    return model


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _close(a, b, atol):
    return all(torch.allclose(a[k], b[k], rtol=0, atol=atol) for k in a)


@pytest.mark.parametrize("optim", PARAMS)
def test_trains_like_the_package_by_hand(out_dir, optim):
    """Same ops in one process: equal to float32 rounding of the batch's sums (1e-6); and it did train."""
    _require(optim)
    model = Net()
    trainer = Trainer(model, _args(out_dir, optim), train_dataset=_data())
    trainer.train()
    package_class = type(trainer.optimizer).__mro__[1 if optim == "grokadamw" else 0]  # GrokAdamW: resumable subclass
    assert package_class.__module__.split(".")[0] == CASES[optim][2].split(".")[0]
    reference = _weights(_by_hand(optim))
    assert _close(_weights(model), reference, 1e-6)
    assert not _close(_weights(model), _weights(Net()), 1e-3)


@pytest.mark.parametrize("optim", PARAMS)
def test_equals_transformers_trainer(out_dir, optim):
    """transformers.Trainer on the same seed and data: the same class and groups, the same weights (1e-6: the
    same package's ops on the same batches; transformers ends schedule-free runs in train mode, so its
    optimizer's eval() is called before comparing)."""
    out_dir = Path(out_dir)
    _require(optim)
    transformers = pytest.importorskip("transformers")
    ours, theirs = Net(), Net()
    trainer = Trainer(ours, _args(out_dir / "c", optim), train_dataset=_data())
    trainer.train()
    hf = transformers.Trainer(theirs, _args(out_dir / "t", optim, transformers), train_dataset=_data())
    hf.train()
    hf_optimizer = hf.optimizer.optimizer  # inside accelerate's wrapper
    assert isinstance(trainer.optimizer, type(hf_optimizer))  # GrokAdamW: a subclass whose state dict resumes
    theirs_defaults = {k: v for k, v in hf_optimizer.defaults.items() if k != "differentiable"}  # accelerate's
    if optim == "stable_adamw":  # transformers' bool("False") is True: the README's listed difference
        assert (theirs_defaults.pop("kahan_sum"), trainer.optimizer.defaults["kahan_sum"]) == (True, False)
        theirs_defaults["kahan_sum"] = False
    assert trainer.optimizer.defaults == theirs_defaults
    co.set_optimizer_mode(hf.optimizer, training=False)
    assert _close(_weights(ours), _weights(theirs), 1e-6)


@pytest.mark.parametrize("optim", PARAMS)
def test_resumes_bit_identical_and_loads_weights_only(out_dir, optim):
    """Killed after step 3 and resumed from checkpoint-3: the same bits as the run that never stopped. The
    optimizer state loads with weights_only=True, with no pickle global added by cadence (torchao registers its
    two state classes, OptimState4bit/8bit, itself on import: tensor subclasses rebuilt from tensors and ints)."""
    out_dir = Path(out_dir)
    _require(optim)
    unbroken = Net()
    Trainer(unbroken, _args(out_dir / "a", optim, save_strategy="steps", save_steps=3),
            train_dataset=_data()).train()
    resumed = Net()
    Trainer(resumed, _args(out_dir / "b", optim, save_strategy="steps", save_steps=3),
            train_dataset=_data()).train(resume_from_checkpoint=str(out_dir / "a" / "checkpoint-3"))
    a, b = _weights(unbroken), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = torch.load(out_dir / "a" / "checkpoint-3" / "optimizer.pt", weights_only=True)
    per_param = state["state"] if optim != "grokadamw" else [s for g in state["param_groups"] for s in g["state"]]
    assert len(per_param) == 4 and len(state["param_groups"]) == 2


def test_schedule_free_evaluates_and_saves_the_eval_weights(out_dir):
    """evaluate(), the checkpoint's weights and save_model() hold the optimizer's own eval() point x, not the
    training point y; training continues on y (so the run equals the hand loop that never switched)."""
    out_dir = Path(out_dir)
    _require("schedule_free_adamw")
    import schedulefree
    from safetensors.torch import load_file

    data = _data()
    model = Net()
    trainer = Trainer(model, _args(out_dir, "schedule_free_adamw", save_strategy="steps", save_steps=3,
                                   eval_strategy="steps", eval_steps=3, per_device_eval_batch_size=24),
                      train_dataset=data, eval_dataset=data)
    trainer.train()
    # the hand loop, stopped at step 3: its eval() weights are what checkpoint-3 holds and what step 3 evaluated
    hand = Net()
    opt = schedulefree.AdamWScheduleFree(_groups(hand), lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD,
                                         warmup_steps=2)
    opt.train()
    for step in range(3):
        rows = slice(BATCH * step, BATCH * step + BATCH)
        hand(data.x[rows], data.y[rows])[0].backward()
        opt.step()
        opt.zero_grad()
    train_point = _weights(hand)
    opt.eval()
    eval_point = _weights(hand)
    assert not _close(train_point, eval_point, 1e-4)  # the two points really differ
    saved = load_file(out_dir / "checkpoint-3" / "model.safetensors")
    assert _close(saved, eval_point, 1e-6) and not _close(saved, train_point, 1e-4)
    with torch.no_grad():
        eval_loss = hand(data.x, data.y)[0].item()
    logged = next(h["eval_loss"] for h in trainer.state.log_history if h.get("step") == 3 and "eval_loss" in h)
    assert logged == pytest.approx(eval_loss, rel=1e-6)
    # the end: the model holds the eval point (equal to the hand loop's), and so does save_model()
    assert _close(_weights(model), _weights(_by_hand("schedule_free_adamw")), 1e-6)
    trainer.save_model(str(out_dir / "final"))
    assert _close(load_file(out_dir / "final" / "model.safetensors"), _weights(model), 0.0)


def test_schedule_free_refuses_a_warmup_ratio(out_dir):
    _require("schedule_free_adamw")
    trainer = Trainer(Net(), _args(out_dir, "schedule_free_adamw", warmup_steps=0.1), train_dataset=_data())
    with pytest.raises(ValueError, match=r"warmup_steps=0.1 is a ratio.*schedule_free_adamw.*number of steps"):
        trainer.train()


@pytest.mark.parametrize("optim,optim_args", [
    ("grokadamw", "lamb=3,gamma=0.2,alpha_init=0.9"),
    ("stable_adamw", "decouple_lr=True,max_lr=0.01"),
    ("schedule_free_sgd", "weight_lr_power=1.5,r=0.5"),
    ("adamw_torch_8bit", "block_size=128,bf16_stochastic_round=True"),
])
def test_optim_args_reach_the_optimizer_as_transformers_passes_them(optim, optim_args):
    """The kwargs equal transformers' get_optimizer_cls_and_kwargs for the same args, typed (transformers leaves
    torchao's block_size a string; its bool() of "True" is True, so the flags agree here)."""
    _require(optim)
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments("unused", optim=optim, optim_args=optim_args, learning_rate=LR,
                                          weight_decay=WD, adam_beta1=B1, warmup_steps=3, report_to="none")
    ours_cls, ours = co.get_optimizer_cls_and_kwargs(args, Net())
    theirs_cls, theirs = transformers.Trainer.get_optimizer_cls_and_kwargs(args, Net())
    assert ours_cls is theirs_cls or ours_cls.__mro__[1] is theirs_cls  # GrokAdamW: its subclass that resumes
    if "block_size" in theirs:
        theirs = {**theirs, "block_size": int(theirs["block_size"])}
    assert ours == theirs
