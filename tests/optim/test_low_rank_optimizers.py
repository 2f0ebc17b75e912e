"""GaLore and APOLLO (galore-torch, apollo-torch) with ``optim_target_modules``: the parameters in the low-rank
group are transformers' choice; a run equals the package driven by hand and transformers.Trainer; it resumes
bit-identical, and its ``optimizer.pt`` (projectors included) loads with ``weights_only=True``.

Both packages are in the ``test`` extra; a test skips only where its package cannot be imported.
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

LR, STEPS, BATCH = 1e-2, 6, 4


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


# optim -> (optim_args, the package and class, the low-rank group's options as transformers passes them)
CASES = {
    "galore_adamw": ("rank=4,update_proj_gap=2,scale=0.5", "galore_torch", "GaLoreAdamW",
                     {"rank": 4, "update_proj_gap": 2, "scale": 0.5, "proj_type": "std"}),
    "galore_adafactor": ("rank=4,update_proj_gap=2", "galore_torch", "GaLoreAdafactor",
                         {"rank": 4, "update_proj_gap": 2, "scale": 0.25, "proj_type": "std"}),
    "apollo_adamw": ("rank=4,update_proj_gap=2,scale=1", "apollo_torch", "APOLLOAdamW",
                     {"rank": 4, "proj": "random", "scale_type": "channel", "update_proj_gap": 2, "scale": 1.0,
                      "proj_type": "std", "betas": (0.9, 0.999), "eps": 1e-8}),
}


def _package(optim):
    try:
        return importlib.import_module(CASES[optim][1])
    except ImportError:
        pytest.skip(f"{CASES[optim][1]} cannot be imported here")


def _args(out_dir, optim, lib=None, **overrides):
    options = dict(optim=optim, optim_args=CASES[optim.removesuffix("_layerwise")][0], optim_target_modules=["up", "down"], max_steps=STEPS,
                   per_device_train_batch_size=BATCH, learning_rate=LR, lr_scheduler_type="constant",
                   max_grad_norm=0.0, use_cpu=True, train_sampling_strategy="sequential", seed=0)
    return make_args(out_dir, lib, **{**options, **overrides})


def _by_hand(optim) -> Net:
    model, data = Net(), _data()
    cls = getattr(_package(optim), CASES[optim][2])
    extra = {"scale_parameter": False, "relative_step": False} if optim == "galore_adafactor" else {}
    target = [model.up.weight, model.down.weight]
    rest = [p for p in model.parameters() if all(p is not t for t in target)]
    opt = cls([{"params": rest}, {"params": target, **CASES[optim][3]}], lr=LR, **extra)
    for step in range(STEPS):
        rows = slice(BATCH * step, BATCH * step + BATCH)
        model(data.x[rows], data.y[rows])[0].backward()
        opt.step()
        opt.zero_grad()
    return model


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _close(a, b, atol):
    return all(torch.allclose(a[k], b[k], rtol=0, atol=atol) for k in a)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("targets", [
    ["attn", "mlp"],
    ["q_proj", "v_proj"],
    r".*\.mlp\..*",  # one regex string
    [r".*layers\.1\..*proj"],  # a regex in a list
    "all-linear",
    ["mlp", "embed_tokens"],  # an embedding matched by name: left out (warned), as transformers does
])
def test_low_rank_group_is_transformers_choice(tmp_path, targets):
    """On a tiny Llama, the names in the low-rank group (and in the plain one) equal transformers'."""
    _package("galore_adamw")
    transformers = pytest.importorskip("transformers")
    model = _tiny_llama()
    names = {id(p): n for n, p in model.named_parameters()}
    args = transformers.TrainingArguments(str(tmp_path), optim="galore_adamw", optim_target_modules=targets,
                                          report_to="none")
    _, ours = co.get_optimizer_cls_and_kwargs(args, model)
    _, theirs = transformers.Trainer.get_optimizer_cls_and_kwargs(args, model)
    mine = [[names[id(p)] for p in g["params"]] for g in ours["params"]]
    assert mine == [[names[id(p)] for p in g["params"]] for g in theirs["params"]]
    assert mine[1] and all(n.endswith("proj.weight") or n == "lm_head.weight" for n in mine[1])
    assert [{k: v for k, v in g.items() if k != "params"} for g in ours["params"]] == [
        {k: v for k, v in g.items() if k != "params"} for g in theirs["params"]]


def test_no_target_and_no_match_are_refused(out_dir):
    _package("galore_adamw")
    trainer = Trainer(Net(), _args(out_dir, "galore_adamw", optim_target_modules=None), train_dataset=_data())
    with pytest.raises(ValueError, match=r"optim='galore_adamw' needs optim_target_modules"):
        trainer.train()
    trainer = Trainer(Net(), _args(out_dir, "galore_adamw", optim_target_modules=["attn"]), train_dataset=_data())
    with pytest.raises(ValueError, match=r"optim_target_modules=\['attn'\] matches no nn.Linear"):
        trainer.train()


@pytest.mark.parametrize("optim", list(CASES))
def test_trains_like_the_package_by_hand_and_transformers(out_dir, optim):
    """The same package's ops on the same batches and groups: 1e-6 (float32 rounding of the batch sums)."""
    _package(optim)
    transformers = pytest.importorskip("transformers")
    out_dir = Path(out_dir)
    model = Net()
    trainer = Trainer(model, _args(out_dir / "c", optim), train_dataset=_data())
    trainer.train()
    assert isinstance(trainer.optimizer, getattr(_package(optim), CASES[optim][2]))  # a subclass: projectors as dicts
    assert _close(_weights(model), _weights(_by_hand(optim)), 1e-6)
    assert not _close(_weights(model), _weights(Net()), 1e-3)
    theirs = Net()
    transformers.Trainer(theirs, _args(out_dir / "t", optim, transformers), train_dataset=_data()).train()
    assert _close(_weights(model), _weights(theirs), 1e-6)


@pytest.mark.parametrize("optim", list(CASES))
def test_resumes_bit_identical_and_loads_weights_only(out_dir, optim):
    """Stopped after step 3 of 6 (update_proj_gap=2: projections recomputed on both sides of the break)."""
    _package(optim)
    out_dir = Path(out_dir)
    unbroken = Net()
    Trainer(unbroken, _args(out_dir / "a", optim, save_strategy="steps", save_steps=3), train_dataset=_data()).train()
    resumed = Net()
    Trainer(resumed, _args(out_dir / "b", optim, save_strategy="steps", save_steps=3),
            train_dataset=_data()).train(resume_from_checkpoint=str(out_dir / "a" / "checkpoint-3"))
    a, b = _weights(unbroken), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = torch.load(out_dir / "a" / "checkpoint-3" / "optimizer.pt", weights_only=True)
    projectors = [s["projector"] for s in state["state"].values() if "projector" in s]
    assert len(projectors) == 2 and all(torch.is_tensor(p["ortho_matrix"]) for p in projectors)


# ---------------------------------------------------------------------------------------------
# layer-wise: one optimizer per parameter, stepped from a gradient hook inside backward
# ---------------------------------------------------------------------------------------------

LAYERWISE = ["galore_adamw_layerwise", "apollo_adamw_layerwise"]


def _base(optim):
    return optim.removesuffix("_layerwise")


def _layerwise_args(out_dir, optim, lib=None, **overrides):
    return _args(out_dir, optim, lib, **overrides)


@pytest.mark.parametrize("optim", LAYERWISE)
def test_layerwise_trains_like_per_parameter_optimizers_by_hand_and_transformers(out_dir, optim):
    """Each parameter its own package optimizer (its group's options), stepped once its gradient is complete: the
    hand loop steps them all after backward, which is the same arithmetic (1e-6). transformers.Trainer agrees."""
    package = _package(_base(optim))
    transformers = pytest.importorskip("transformers")
    out_dir = Path(out_dir)
    model = Net()
    trainer = Trainer(model, _layerwise_args(out_dir / "c", optim), train_dataset=_data())
    trainer.train()
    assert isinstance(trainer.optimizer, co.LayerwiseOptimizer) and len(trainer.optimizer.optimizers) == 6
    hand, data = Net(), _data()
    cls = getattr(package, CASES[_base(optim)][2])
    target = {id(hand.up.weight), id(hand.down.weight)}
    opts = [cls([{"params": [p], **(CASES[_base(optim)][3] if id(p) in target else {})}], lr=LR)
            for p in hand.parameters()]
    for step in range(STEPS):
        rows = slice(BATCH * step, BATCH * step + BATCH)
        hand(data.x[rows], data.y[rows])[0].backward()
        for opt in opts:
            opt.step()
            opt.zero_grad()
    assert _close(_weights(model), _weights(hand), 1e-6)
    assert not _close(_weights(model), _weights(Net()), 1e-3)
    theirs = Net()
    transformers.Trainer(theirs, _layerwise_args(out_dir / "t", optim, transformers), train_dataset=_data()).train()
    assert _close(_weights(model), _weights(theirs), 1e-6)


def test_layerwise_lr_schedule_reaches_every_parameter_optimizer(out_dir):
    """A linear decay over 6 steps: one scheduler over the per-parameter optimizers' shared groups sets the lr each
    hook uses (logged: 1e-2 * (6-k)/6, ending at 0 in every optimizer). transformers 5.24 wraps its layer-wise
    dummy optimizer in accelerate's before building the scheduler, so its per-parameter optimizers keep the
    initial lr throughout (pinned here: the README lists the difference)."""
    _package("galore_adamw")
    transformers = pytest.importorskip("transformers")
    out_dir = Path(out_dir)
    ours = Net()
    trainer = Trainer(ours, _layerwise_args(out_dir / "c", "galore_adamw_layerwise", lr_scheduler_type="linear",
                                            logging_steps=1), train_dataset=_data())
    trainer.train()
    assert {g["lr"] for o in trainer.optimizer.optimizers.values() for g in o.param_groups} == {0.0}
    logged = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    assert logged == pytest.approx([LR * (STEPS - k) / STEPS for k in range(STEPS)])
    assert not _close(_weights(ours), _weights(_by_hand("galore_adamw")), 1e-4)  # the decay changed the run
    hf = transformers.Trainer(Net(), _layerwise_args(out_dir / "t", "galore_adamw_layerwise", transformers,
                                                     lr_scheduler_type="linear"), train_dataset=_data())
    hf.train()
    assert {g["lr"] for o in hf.optimizer.optimizer.optimizer_dict.values() for g in o.param_groups} == {LR}


@pytest.mark.parametrize("optim", LAYERWISE)
def test_layerwise_resumes_bit_identical_and_loads_weights_only(out_dir, optim):
    _package(_base(optim))
    out_dir = Path(out_dir)
    unbroken = Net()
    Trainer(unbroken, _layerwise_args(out_dir / "a", optim, save_strategy="steps", save_steps=3),
            train_dataset=_data()).train()
    resumed = Net()
    Trainer(resumed, _layerwise_args(out_dir / "b", optim, save_strategy="steps", save_steps=3),
            train_dataset=_data()).train(resume_from_checkpoint=str(out_dir / "a" / "checkpoint-3"))
    a, b = _weights(unbroken), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = torch.load(out_dir / "a" / "checkpoint-3" / "optimizer.pt", weights_only=True)
    assert len(state["layerwise"]) == 6 and all(s["state"] for s in state["layerwise"])


def test_layerwise_refusals_match_transformers(out_dir):
    """Gradient accumulation: refused by both. max_grad_norm and fp16 (which transformers lets through, clipping
    or unscaling gradients the hooks already used): refused here, naming the fix."""
    _package("galore_adamw")
    transformers = pytest.importorskip("transformers")
    out_dir = Path(out_dir)
    ga = dict(gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="does not support gradient accumulation"):
        transformers.Trainer(Net(), _layerwise_args(out_dir / "t", "galore_adamw_layerwise", transformers, **ga),
                             train_dataset=_data()).train()
    for overrides, words in ((ga, "gradient_accumulation_steps=2 cannot add"), ({"max_grad_norm": 1.0},
                             "max_grad_norm=1.0 cannot clip")):
        trainer = Trainer(Net(), _layerwise_args(out_dir / "c", "galore_adamw_layerwise", **overrides),
                          train_dataset=_data())
        with pytest.raises(ValueError, match=rf"optim='galore_adamw_layerwise' .*{words}.*'galore_adamw'"):
            trainer.train()
