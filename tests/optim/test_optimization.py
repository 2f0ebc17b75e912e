"""cadence.optimization against transformers as the reference: schedules, param groups, optimizers, Adafactor."""

from __future__ import annotations

import copy
import enum
import io
import logging
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cadence import optimization as co

torch.set_num_threads(1)

WARMUP, TOTAL, STEPS = 5, 30, 34  # STEPS runs past the end of training on purpose


@pytest.fixture(scope="module")
def hf_opt():
    return pytest.importorskip("transformers.optimization")


def _sgd(lr: float = 1e-3) -> torch.optim.Optimizer:
    # Two groups with different lrs: a schedule scales each group's own initial lr.
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(3))
    return torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": lr / 2}], lr=lr)


def _lrs(scheduler, steps: int, metrics=None) -> list[list[float]]:
    seen = []
    for i in range(steps):
        scheduler.optimizer.step()
        scheduler.step(metrics[i]) if metrics is not None else scheduler.step()
        seen.append([float(g["lr"]) for g in scheduler.optimizer.param_groups])
    return seen


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------

SCHEDULE_CASES = [
    ("linear", None),
    ("cosine", None),
    ("cosine", {"num_cycles": 1.5}),
    ("cosine_with_restarts", None),
    ("cosine_with_restarts", {"num_cycles": 3}),
    ("polynomial", None),
    ("polynomial", {"power": 2.0, "lr_end": 1e-4}),
    ("constant", None),
    ("constant_with_warmup", None),
    ("inverse_sqrt", None),
    ("inverse_sqrt", {"timescale": 7}),
    ("cosine_with_min_lr", {"min_lr": 1e-4}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.1, "num_cycles": 0.7}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", {"min_lr": 2e-4, "warmup_lr_rate": 0.2}),
    ("warmup_stable_decay", {"num_decay_steps": 10}),
    ("warmup_stable_decay", {"num_decay_steps": 8, "num_stable_steps": 12, "warmup_type": "cosine",
                             "decay_type": "1-sqrt", "min_lr_ratio": 0.1}),  # fmt: skip
    ("warmup_stable_decay", {"num_decay_steps": 10, "warmup_type": "1-sqrt", "decay_type": "linear"}),
]


@pytest.mark.filterwarnings("ignore:Both num_training_steps")  # a wsd case sets both on purpose
@pytest.mark.parametrize("warmup", [0, WARMUP])
@pytest.mark.parametrize("name,kwargs", SCHEDULE_CASES)
def test_schedule_lrs_equal_transformers(hf_opt, name, kwargs, warmup):
    ours = co.get_scheduler(name, _sgd(), warmup, TOTAL, copy.deepcopy(kwargs))
    theirs = hf_opt.get_scheduler(name, _sgd(), warmup, TOTAL, copy.deepcopy(kwargs))
    assert type(ours) is type(theirs)
    # python-float formulas, the same in both (bit-identical here); rel 1e-12 lets either library reorder an
    # expression in a later version without hiding a wrong schedule (those are off by whole percent)
    assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12)
    ours_lrs, theirs_lrs = _lrs(ours, STEPS), _lrs(theirs, STEPS)
    assert len(ours_lrs) == len(theirs_lrs)
    for a, b in zip(ours_lrs, theirs_lrs):  # every step, both groups
        assert a == pytest.approx(b, rel=1e-12, abs=1e-300)
    moving = name != "constant" and not (name == "constant_with_warmup" and warmup == 0)
    assert (len({lr[0] for lr in ours_lrs}) > 1) == moving  # the schedule really changes the lr


def test_schedule_tables_cover_transformers():
    SchedulerType = pytest.importorskip("transformers.trainer_utils").SchedulerType
    assert set(co.SCHEDULERS) == {s.value for s in SchedulerType}
    assert set(co.TYPE_TO_SCHEDULER_FUNCTION) == set(co.SCHEDULERS)


def test_schedule_direct_functions_equal_transformers(hf_opt):
    cases = [
        ("get_constant_schedule", ()),
        ("get_constant_schedule_with_warmup", (4,)),
        ("get_linear_schedule_with_warmup", (4, 20)),
        ("get_cosine_schedule_with_warmup", (4, 20, 0.25)),
        ("get_cosine_with_hard_restarts_schedule_with_warmup", (4, 20, 2)),
        ("get_polynomial_decay_schedule_with_warmup", (4, 20, 1e-5, 3.0)),
        ("get_inverse_sqrt_schedule", (4, 9)),
        ("get_wsd_schedule", (4, 6, 20)),
    ]
    for fn, pos in cases:
        ours, theirs = getattr(co, fn)(_sgd(), *pos), getattr(hf_opt, fn)(_sgd(), *pos)
        assert _lrs(ours, 24) == _lrs(theirs, 24), fn


def test_reduce_on_plateau_equals_transformers(hf_opt):
    kwargs = {"factor": 0.5, "patience": 1, "threshold": 0.01}
    metrics = [1.0, 0.9, 0.95, 0.97, 0.8, 0.85, 0.86, 0.9, 0.91]
    ours = co.get_scheduler("reduce_lr_on_plateau", _sgd(), scheduler_specific_kwargs=dict(kwargs))
    theirs = hf_opt.get_scheduler("reduce_lr_on_plateau", _sgd(), scheduler_specific_kwargs=dict(kwargs))
    assert isinstance(ours, torch.optim.lr_scheduler.ReduceLROnPlateau)
    ours_lrs = _lrs(ours, len(metrics), metrics)
    assert ours_lrs == _lrs(theirs, len(metrics), metrics)
    assert ours_lrs[-1][0] < ours_lrs[0][0]


GREEDY_METRICS = [5.0, 4.0, 3.0, 2.0, 1.9, 1.9, 1.9, 1.9, 1.95, 1.0, 0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"patience": 1, "factor": 0.5, "min_lr": 1e-4, "max_lr": 3e-3},
        {"patience": 1, "factor": 0.5, "min_lr": 2e-4, "cooldown": 1, "warmup": 1, "threshold_mode": "rel",
         "threshold": 0.01, "smooth": True, "window_size": 3, "reset_start": 2},  # fmt: skip
        {"mode": "max", "patience": 0, "factor": 0.8, "min_lr": [1e-4, 1e-4], "max_lr": [1.0, 1e-3]},
    ],
)
def test_greedy_equals_transformers(hf_opt, kwargs):
    if not hasattr(hf_opt, "GreedyLR"):
        pytest.skip("this transformers has no GreedyLR")
    ours = co.get_scheduler("greedy", _sgd(), scheduler_specific_kwargs=copy.deepcopy(kwargs))
    theirs = hf_opt.get_scheduler("greedy", _sgd(), scheduler_specific_kwargs=copy.deepcopy(kwargs))
    ours_lrs = _lrs(ours, len(GREEDY_METRICS), GREEDY_METRICS)
    for a, b in zip(ours_lrs, _lrs(theirs, len(GREEDY_METRICS), GREEDY_METRICS), strict=True):
        assert a == pytest.approx(b, rel=1e-12)  # python floats; see test_schedule_lrs_equal_transformers
    assert len({lr[0] for lr in ours_lrs}) > 2  # the lr really moved
    assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12)
    assert ours.state_dict() == theirs.state_dict()


def test_greedy_state_dict_round_trip_weights_only(hf_opt):
    kwargs = {"patience": 1, "factor": 0.5, "min_lr": 1e-4, "smooth": True, "window_size": 3}
    whole = co.GreedyLR(_sgd(), **kwargs)
    first = co.GreedyLR(_sgd(), **kwargs)
    _lrs(first, 8, GREEDY_METRICS)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = co.GreedyLR(_sgd(), **kwargs)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    expected = _lrs(whole, len(GREEDY_METRICS), GREEDY_METRICS)
    assert expected[:8] + _lrs(resumed, 12, GREEDY_METRICS[8:]) == expected
    if hasattr(hf_opt, "GreedyLR"):  # a transformers checkpoint loads too
        hf = hf_opt.GreedyLR(_sgd(), **kwargs)
        _lrs(hf, 8, GREEDY_METRICS)
        crossed = co.GreedyLR(_sgd(), **kwargs)
        crossed.load_state_dict(hf.state_dict())
        assert _lrs(crossed, 12, GREEDY_METRICS[8:]) == expected[8:]


class _StrEnum(str, enum.Enum):
    COSINE = "cosine"


def test_get_scheduler_takes_str_enums(hf_opt):
    SchedulerType = pytest.importorskip("transformers.trainer_utils").SchedulerType
    plain = _lrs(co.get_scheduler("cosine", _sgd(), 2, 10), 10)
    assert _lrs(co.get_scheduler(_StrEnum.COSINE, _sgd(), 2, 10), 10) == plain
    assert _lrs(co.get_scheduler(SchedulerType.COSINE, _sgd(), 2, 10), 10) == plain


def test_get_scheduler_missing_step_counts():
    with pytest.raises(ValueError, match="'linear'.*num_warmup_steps"):
        co.get_scheduler("linear", _sgd(), num_training_steps=10)
    with pytest.raises(ValueError, match="'cosine'.*num_training_steps"):
        co.get_scheduler("cosine", _sgd(), num_warmup_steps=2)
    with pytest.raises(ValueError, match="'constant_with_warmup'.*num_warmup_steps"):
        co.get_scheduler("constant_with_warmup", _sgd())
    # These need no total: inverse_sqrt never ends; wsd can be given its stable phase instead.
    co.get_scheduler("inverse_sqrt", _sgd(), num_warmup_steps=2)
    wsd = co.get_scheduler("warmup_stable_decay", _sgd(), 2, None, {"num_decay_steps": 3, "num_stable_steps": 4})
    assert [round(lr[0] / 1e-3, 12) for lr in _lrs(wsd, 10)][:6] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="Unknown lr scheduler 'cosinus'"):
        co.get_scheduler("cosinus", _sgd(), 2, 10)


def test_get_scheduler_rejects_unknown_options(caplog):
    with pytest.raises(ValueError, match=r"\['num_cycle'\].*'cosine'.*num_cycles"):
        co.get_scheduler("cosine", _sgd(), 2, 10, {"num_cycle": 2})
    with pytest.raises(ValueError, match=r"\['patient'\].*patience"):
        co.get_scheduler("reduce_lr_on_plateau", _sgd(), scheduler_specific_kwargs={"patient": 2})
    with pytest.raises(ValueError, match="num_training_steps"):  # passed explicitly, not as an option
        co.get_scheduler("warmup_stable_decay", _sgd(), 2, 10, {"num_decay_steps": 3, "num_training_steps": 9})
    # transformers ignores options of the constant schedules; cadence keeps running but says so.
    with caplog.at_level(logging.WARNING, logger="cadence.optimization"):
        sched = co.get_scheduler("constant", _sgd(), scheduler_specific_kwargs={"num_cycles": 2})
    assert "ignoring ['num_cycles']" in caplog.text
    assert sched.get_last_lr() == [1e-3, 5e-4]


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("linear", None),
        ("cosine", {"num_cycles": 1.5}),
        ("polynomial", {"power": 2.0, "lr_end": 1e-4}),
        ("constant", None),
        ("inverse_sqrt", None),
        ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
        ("warmup_stable_decay", {"num_decay_steps": 10, "min_lr_ratio": 0.05}),
    ],
)
def test_schedule_state_dict_round_trip_weights_only(hf_opt, tmp_path, name, kwargs):
    whole = _lrs(co.get_scheduler(name, _sgd(), WARMUP, TOTAL, copy.deepcopy(kwargs)), STEPS)
    for make_first in (co.get_scheduler, hf_opt.get_scheduler):  # ours, and a transformers scheduler.pt
        first = make_first(name, _sgd(), WARMUP, TOTAL, copy.deepcopy(kwargs))
        _lrs(first, 7)
        torch.save(first.state_dict(), tmp_path / "scheduler.pt")
        state = torch.load(tmp_path / "scheduler.pt", weights_only=True)
        resumed = co.get_scheduler(name, _sgd(), WARMUP, TOTAL, copy.deepcopy(kwargs))
        resumed.load_state_dict(state)
        assert resumed.last_epoch == 7
        assert _lrs(resumed, STEPS - 7) == whole[7:]
    # and ours loads in transformers
    theirs = hf_opt.get_scheduler(name, _sgd(), WARMUP, TOTAL, copy.deepcopy(kwargs))
    theirs.load_state_dict(state)
    assert _lrs(theirs, STEPS - 7) == whole[7:]


def test_polynomial_and_min_lr_validation():
    with pytest.raises(ValueError, match="lr_end"):
        co.get_polynomial_decay_schedule_with_warmup(_sgd(1e-7), 2, 10)
    with pytest.raises(ValueError, match="only one of min_lr or min_lr_rate"):
        co.get_cosine_with_min_lr_schedule_with_warmup(_sgd(), 2, 10, min_lr=1e-5, min_lr_rate=0.1)
    with pytest.raises(ValueError, match="min_lr or min_lr_rate"):
        co.get_cosine_with_min_lr_schedule_with_warmup(_sgd(), 2, 10)
    with pytest.raises(ValueError, match="warmup_type 'square'"):
        co.get_wsd_schedule(_sgd(), 2, 3, 10, warmup_type="square")
    # warmup == total: transformers divides by zero at the last step; cadence stays at lr_end + range.
    sched = co.get_polynomial_decay_schedule_with_warmup(_sgd(1.0), 3, 3, lr_end=0.0)
    assert [lr[0] for lr in _lrs(sched, 4)] == [1 / 3, 2 / 3, 1.0, 0.0]


# ---------------------------------------------------------------------------------------------
# Weight-decay parameter names and groups
# ---------------------------------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.norm = nn.RMSNorm(4)  # excluded by name ("norm" component)
        self.post_attention_layernorm = nn.LayerNorm(4)
        self.q_norm = nn.GroupNorm(2, 4)  # excluded by name ("_norm")
        self.bn = nn.BatchNorm1d(4)  # decayed: transformers excludes norms by type only for LayerNorm
        self.ln = nn.LayerNorm(4)  # excluded by type
        self.rms = nn.RMSNorm(4)  # decayed: neither LayerNorm nor a norm-like name
        self.normalizer = nn.Linear(4, 4, bias=False)  # "normalizer" is not a norm component


class _Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.final_norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.ones(1))
        self.layer_norm_scale = nn.Parameter(torch.ones(1))  # not a "_norm" component either


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def _hf_decay_names(model):
    Trainer = pytest.importorskip("transformers").Trainer
    return Trainer.get_decay_parameter_names(None, model)  # uses no trainer state


def test_decay_names_plain_module_equal_transformers():
    model = _Plain()
    names = co.get_decay_parameter_names(model)
    assert names == _hf_decay_names(model)
    block = ["proj.weight", "bn.weight", "rms.weight", "normalizer.weight"]
    expected = ["embed.weight", *[f"blocks.{i}.{n}" for i in range(2) for n in block], "head.weight", "scale"]
    assert names == expected + ["layer_norm_scale"]


def test_decay_names_gpt2_equal_transformers():
    model = _tiny_gpt2()
    names = co.get_decay_parameter_names(model)
    assert names == _hf_decay_names(model)
    assert "transformer.h.0.attn.c_attn.weight" in names and "transformer.wte.weight" in names
    assert not any("ln_" in n or n.endswith("bias") for n in names)


def test_parameter_groups_order_and_frozen():
    model = _Plain()
    model.head.weight.requires_grad_(False)
    decay, no_decay = co.get_parameter_groups(model, 0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    by_id = {id(p): n for n, p in model.named_parameters()}
    assert [by_id[id(p)] for p in decay["params"]] == [
        n for n, p in model.named_parameters() if n in co.get_decay_parameter_names(model) and n != "head.weight"
    ]
    assert "blocks.0.ln.weight" in [by_id[id(p)] for p in no_decay["params"]]
    assert len(decay["params"]) + len(no_decay["params"]) == sum(1 for p in model.parameters()) - 1
    # Both groups stay even when one is empty (optimizer state dicts line up with transformers').
    assert [len(g["params"]) for g in co.get_parameter_groups(nn.Linear(2, 2, bias=False), 0.1)] == [1, 0]


# ---------------------------------------------------------------------------------------------
# Optimizers vs transformers.Trainer.create_optimizer
# ---------------------------------------------------------------------------------------------

OPTIMIZER_CASES = [
    ("adamw_torch", None),
    ("adamw_torch", "amsgrad=True"),  # transformers ignores optim_args here; so must we
    ("adamw_torch_fused", None),
    ("sgd", None),
    ("sgd", "momentum=0.9, nesterov=True,dampening=0"),
    ("adagrad", "lr_decay=0.01,eps=1e-8,weight_decay=0.2"),
    ("rmsprop", "alpha=0.95,centered=true,momentum=0.1"),
    ("adafactor", None),
    ("adafactor", "beta1=0.9"),
]


@pytest.mark.parametrize("optim,optim_args", OPTIMIZER_CASES)
def test_create_optimizer_equals_transformers_trainer(tmp_path, optim, optim_args):
    transformers = pytest.importorskip("transformers")
    model = _Plain()
    model.embed.weight.requires_grad_(False)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, optim=optim, optim_args=optim_args,
        learning_rate=3e-3, weight_decay=0.05, adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-7,
    )  # fmt: skip
    ours = co.create_optimizer(model, args)
    theirs = transformers.Trainer(model=model, args=args).create_optimizer()
    assert type(ours).__name__ == type(theirs).__name__
    assert ours.defaults == theirs.defaults
    assert len(ours.param_groups) == len(theirs.param_groups) == 2
    for mine, ref in zip(ours.param_groups, theirs.param_groups):
        assert [id(p) for p in mine["params"]] == [id(p) for p in ref["params"]]
        assert {k: v for k, v in mine.items() if k != "params"} == {k: v for k, v in ref.items() if k != "params"}
    # the settings really arrived (not just equal because both are empty)
    assert ours.param_groups[0]["weight_decay"] == 0.05 and ours.defaults["lr"] == 3e-3


def _args(**overrides):
    base = dict(optim="adamw_torch", optim_args=None, learning_rate=1e-3, weight_decay=0.1,
                adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)  # fmt: skip
    return SimpleNamespace(**{**base, **overrides})


def test_optimizer_args_object_and_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="cadence.optimization"):
        cls, kwargs = co.get_optimizer_cls_and_kwargs(_args(optim="sgd", optim_args="momentum=1,nesterov=yes,foo=2"))
    assert cls is torch.optim.SGD
    assert kwargs == {"lr": 1e-3, "momentum": 1.0, "nesterov": True} and isinstance(kwargs["momentum"], float)
    assert "ignores optim_args ['foo']" in caplog.text
    cls, kwargs = co.OPTIMIZERS["adamw_torch_fused"](_args())
    assert (cls, kwargs) == (torch.optim.AdamW, {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "fused": True})


def test_optimizer_table_covers_transformers():
    OptimizerNames = pytest.importorskip("transformers.training_args").OptimizerNames
    assert set(co.OPTIMIZERS) == {o.value for o in OptimizerNames}


def test_create_optimizer_with_user_cls_and_kwargs():
    model = _Plain()
    kwargs = {"lr": 0.5, "momentum": 0.3}
    opt = co.create_optimizer(model, _args(), (torch.optim.SGD, kwargs))
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0] and opt.defaults["momentum"] == 0.3
    own = [{"params": list(model.head.parameters())}]
    kwargs_with_params = {"lr": 0.5, "params": own}
    opt = co.create_optimizer(model, _args(), (torch.optim.SGD, kwargs_with_params))
    assert len(opt.param_groups) == 1 and len(opt.param_groups[0]["params"]) == 2
    assert "params" in kwargs_with_params  # the caller's dict is left alone


def test_unknown_and_unbuilt_optimizers():
    with pytest.raises(ValueError, match="Unknown optimizer 'adamw_torc'"):
        co.check_optimizer("adamw_torc")
    with pytest.raises(ValueError, match="'adamw_torch_xla' is not built yet in cadence"):
        co.check_optimizer("adamw_torch_xla")
    with pytest.raises(ValueError, match="not built yet"):
        co.create_optimizer(nn.Linear(2, 2), _args(optim="adamw_anyprecision"))
    co.check_optimizer("adafactor")  # built-ins pass


def test_missing_optional_package_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # simulate absence even where installed
    monkeypatch.setitem(sys.modules, "galore_torch", None)
    for name in ("adamw_bnb_8bit", "paged_lion_32bit", "rmsprop_bnb"):
        with pytest.raises(ValueError, match=rf"'{name}' needs the `bitsandbytes` package.*pip install -U bitsandb"):
            co.check_optimizer(name)
    with pytest.raises(ValueError, match="pip install -U bitsandbytes"):
        co.create_optimizer(nn.Linear(2, 2), _args(optim="paged_adamw_8bit"))
    with pytest.raises(ValueError, match="'galore_adamw' needs the `galore_torch` package.*pip install galore-torch"):
        co.check_optimizer("galore_adamw")


@pytest.mark.parametrize(
    "optim,optim_args",
    [
        ("adamw_bnb_8bit", None),
        ("paged_adamw_32bit", None),
        ("lion_8bit", None),
        ("paged_lion_32bit", None),
        ("ademamix_8bit", "beta3=0.999,alpha=8,t_alpha=100"),
        ("paged_ademamix_32bit", None),
        ("rmsprop_bnb_8bit", "alpha=0.9,eps=1e-6"),
    ],
)
def test_bitsandbytes_kwargs_equal_transformers(optim, optim_args):
    """The real bitsandbytes (its optimizers run on CPUs): the class and kwargs transformers picks, and
    8-bit states everywhere but the embeddings, which stay 32-bit as transformers arranges."""
    bnb = pytest.importorskip("bitsandbytes")
    bnb.optim.GlobalOptimManager.get_instance().initialize()  # its override registry is process-wide, keyed by id()
    OptimizerNames = pytest.importorskip("transformers.training_args").OptimizerNames
    args = _args(optim=OptimizerNames(optim), optim_args=optim_args, adam_beta1=0.8)
    ours_cls, ours_kwargs = co.get_optimizer_cls_and_kwargs(args)
    theirs_cls, theirs_kwargs = pytest.importorskip("transformers").Trainer.get_optimizer_cls_and_kwargs(args)
    assert ours_cls is theirs_cls and ours_cls.__module__.startswith("bitsandbytes.optim")
    if "rmsprop" in optim:  # transformers forwards these as raw strings; we convert them
        theirs_kwargs = {k: float(v) if isinstance(v, str) else v for k, v in theirs_kwargs.items()}
    assert ours_kwargs == theirs_kwargs
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 64), nn.Linear(64, 64))  # 4096 values each: 8-bit states from that size
    opt = co.create_optimizer(model, args)
    assert isinstance(opt, ours_cls)
    model(torch.arange(8)).square().mean().backward()
    opt.step()
    state_dtype = {name: opt.state[p]["state1"].dtype for name, p in model.named_parameters() if p.dim() == 2}
    eight = torch.uint8 if "8bit" in optim else torch.float32
    assert state_dtype == {"0.weight": torch.float32, "1.weight": eight}


# ---------------------------------------------------------------------------------------------
# parse_optim_args
# ---------------------------------------------------------------------------------------------


def test_parse_optim_args_values():
    assert co.parse_optim_args(None) == {} and co.parse_optim_args("") == {}
    parsed = co.parse_optim_args("momentum=0.9, nesterov=True,centered=false,rank=8,eps=1e-3,proj_type=std,empty=,")
    assert parsed == {
        "momentum": 0.9, "nesterov": True, "centered": False, "rank": 8, "eps": 1e-3, "proj_type": "std", "empty": "",
    }  # fmt: skip
    assert [type(parsed[k]) for k in ("momentum", "nesterov", "rank", "eps")] == [float, bool, int, float]


@pytest.mark.parametrize("bad", ["momentum", "a=1,b", "a=1=2", "=3"])
def test_parse_optim_args_errors_name_the_entry(bad):
    entry = bad.split(",")[-1]
    with pytest.raises(ValueError, match=f"optim_args={bad!r} is invalid: the entry '{entry}' is not key=value"):
        co.parse_optim_args(bad)


# ---------------------------------------------------------------------------------------------
# Adafactor
# ---------------------------------------------------------------------------------------------


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 4)
        self.b = nn.Linear(4, 3)
        self.conv = nn.Parameter(torch.randn(2, 3, 4))  # > 2 dims: factored over the last two


def _tiny64() -> _Tiny:
    torch.manual_seed(0)
    return _Tiny().double()


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, start: int = 0) -> None:
    for step in range(start, start + steps):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(6, 5, generator=gen, dtype=torch.float64)
        loss = model.b(torch.tanh(model.a(x))).pow(2).mean() + (model.conv * x[0, :4]).sin().sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


ADAFACTOR_CONFIGS = [
    {},  # relative step, parameter scaling: the paper's setting
    {"warmup_init": True},
    {"beta1": 0.9},
    {"weight_decay": 0.1},
    {"lr": 1e-2, "relative_step": False, "scale_parameter": False},  # what optim="adafactor" builds
    {"lr": 1e-2, "relative_step": False, "beta1": 0.5, "clip_threshold": 0.5, "decay_rate": -0.5},
]


@pytest.mark.parametrize("config", ADAFACTOR_CONFIGS)
def test_adafactor_trajectory_equals_transformers(hf_opt, config):
    ours_model, theirs_model = _tiny64(), _tiny64()
    ours = co.Adafactor(ours_model.parameters(), **config)
    theirs = hf_opt.Adafactor(theirs_model.parameters(), **config)
    start = [p.detach().clone() for p in ours_model.parameters()]
    for _ in range(5):  # compare after every step, not only at the end
        _train(ours_model, ours, 1, start=ours.state[ours_model.a.weight].get("step", 0))
        _train(theirs_model, theirs, 1, start=theirs.state[theirs_model.a.weight].get("step", 0))
        for mine, ref in zip(ours_model.parameters(), theirs_model.parameters()):
            torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-15)
    assert all(not torch.equal(p, s) for p, s in zip(ours_model.parameters(), start))
    for p_ours, p_theirs in zip(ours_model.parameters(), theirs_model.parameters()):
        s_ours, s_theirs = ours.state[p_ours], theirs.state[p_theirs]
        assert sorted(s_ours) == sorted(s_theirs) and s_ours["step"] == s_theirs["step"] == 5
        for key in s_ours:
            torch.testing.assert_close(torch.as_tensor(s_ours[key]), torch.as_tensor(s_theirs[key]), rtol=1e-12, atol=0)


def test_adafactor_state_dict_round_trip_weights_only(hf_opt, tmp_path):
    config = {"beta1": 0.9, "weight_decay": 0.01}
    whole_model = _tiny64()
    _train(whole_model, co.Adafactor(whole_model.parameters(), **config), 6)

    for make in (co.Adafactor, hf_opt.Adafactor):  # ours, and a transformers optimizer.pt
        model = _tiny64()
        first = make(model.parameters(), **config)
        _train(model, first, 3)
        torch.save(first.state_dict(), tmp_path / "optimizer.pt")
        resumed = co.Adafactor(model.parameters(), **config)
        resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
        _train(model, resumed, 3, start=3)
        for mine, ref in zip(model.parameters(), whole_model.parameters()):
            torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-15)


def test_adafactor_low_precision_and_errors(hf_opt):
    torch.manual_seed(0)
    ours_layer = nn.Linear(8, 8).bfloat16()
    theirs_layer = copy.deepcopy(ours_layer)
    ours, theirs = co.Adafactor(ours_layer.parameters()), hf_opt.Adafactor(theirs_layer.parameters())
    for layer, opt in ((ours_layer, ours), (theirs_layer, theirs)):
        for step in range(3):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step)).bfloat16()
            opt.zero_grad()
            layer(x).float().pow(2).sum().backward()
            opt.step()
    assert ours_layer.weight.dtype == torch.bfloat16
    assert ours.state[ours_layer.weight]["exp_avg_sq_row"].dtype == torch.float32  # moments in float32
    torch.testing.assert_close(ours_layer.weight, theirs_layer.weight, rtol=0, atol=0)
    with pytest.raises(ValueError, match="relative_step"):
        co.Adafactor(ours_layer.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="warmup_init"):
        co.Adafactor(ours_layer.parameters(), lr=1e-3, relative_step=False, warmup_init=True)


def test_adafactor_schedule_reports_transformers_lrs(hf_opt):
    reported = []
    for make_opt, make_sched in ((co.Adafactor, co.AdafactorSchedule), (hf_opt.Adafactor, hf_opt.AdafactorSchedule)):
        model = _tiny64()
        opt = make_opt(model.parameters(), warmup_init=True)
        sched = make_sched(opt, initial_lr=1e-4)
        lrs = [[float(lr) for lr in sched.get_last_lr()]]
        for step in range(4):
            _train(model, opt, 1, start=step)
            sched.step()
            lrs.append([float(lr) for lr in sched.get_last_lr()])
        reported.append(lrs)
        buf = io.BytesIO()
        torch.save(sched.state_dict(), buf)
        buf.seek(0)
        assert torch.load(buf, weights_only=True)["last_epoch"] == 4
    flat = [[lr for lrs in run for lr in lrs] for run in reported]
    assert flat[0] == pytest.approx(flat[1], rel=1e-12)
    assert reported[0][0] == [1e-4] and reported[0][2][0] > reported[0][1][0]  # warmup_init grows the step
