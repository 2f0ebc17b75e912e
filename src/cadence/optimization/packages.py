"""Optimizers from packages: bitsandbytes, grokadamw, stable-adamw, torchao, schedule-free."""


from __future__ import annotations

from functools import cache as functools_cache
from typing import Any

from torch import nn
from torch.optim import Optimizer


from .options import _adam_options, _as_bool, _finite_float, _finite_int, _optim_options, parse_optim_args
from .requirements import _require_package


def _bitsandbytes(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """bitsandbytes' AdamW / Lion / RMSprop / AdEMAMix, 8- or 32-bit, paged or not (name decides)."""
    _require_package(name)
    import bitsandbytes.optim as bnb

    bits = {"optim_bits": 8 if "8bit" in name else 32}
    if "rmsprop" in name:
        # transformers forwards every optim_arg here (as strings; typed by parse_optim_args here).
        return bnb.RMSprop, {"lr": args.learning_rate, **parse_optim_args(args.optim_args), **bits}
    bits["is_paged"] = "paged" in name
    if "lion" in name:
        _optim_options(args, name, {})
        return bnb.Lion, {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2), **bits}
    if "ademamix" in name:
        keys = ("beta1", "beta2", "beta3", "alpha", "eps", "t_alpha", "t_beta3")
        opts = _optim_options(args, name, {k: (_finite_int if k.startswith("t_") else _finite_float) for k in keys})
        betas = (opts.get("beta1", args.adam_beta1), opts.get("beta2", args.adam_beta2), opts.get("beta3", 0.9999))
        ademamix = {
            "betas": betas,
            "alpha": opts.get("alpha", 5.0),
            "eps": opts.get("eps", args.adam_epsilon),
            **{k: opts[k] for k in ("t_alpha", "t_beta3") if k in opts},
        }
        return bnb.AdEMAMix, {"lr": args.learning_rate, **ademamix, **bits}
    _optim_options(args, name, {})
    return bnb.AdamW, {"lr": args.learning_rate, **_adam_options(args), **bits}


@functools_cache
def _resumable_grokadamw() -> type[Optimizer]:
    """grokadamw's GrokAdamW, with a state dict that resumes.

    GrokAdamW keeps each parameter's moments in its param group (``group["state"]``), keyed by the parameter
    object; saved that way, the keys load as new tensors that match no parameter, so a resumed run silently
    starts from fresh moments (what transformers' checkpoints of it do). Here the group's states are saved as a
    list in the group's parameter order (tensors and ints: loads with ``weights_only``), and loaded back onto
    the parameters; a checkpoint in the package's own layout (transformers') is mapped by position too.
    """
    from grokadamw import GrokAdamW

    class ResumableGrokAdamW(GrokAdamW):
        def state_dict(self) -> dict[str, Any]:
            saved = super().state_dict()
            for group, packed in zip(self.param_groups, saved["param_groups"]):
                states = group.get("state", {})
                packed["state"] = [states.get(p) for p in group["params"]]
            return saved

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            saved = [group.get("state") for group in state_dict["param_groups"]]
            super().load_state_dict(state_dict)
            for index, (group, states) in enumerate(zip(self.param_groups, saved)):
                states = list(states.values()) if isinstance(states, dict) else states or []
                if states and len(states) != len(group["params"]):
                    raise ValueError(
                        f"the GrokAdamW checkpoint's param group {index} holds {len(states)} parameter states for "
                        f"{len(group['params'])} parameters: it was saved for another model or parameter grouping"
                    )
                group["state"] = {p: state for p, state in zip(group["params"], states) if state is not None}

    ResumableGrokAdamW.__name__ = ResumableGrokAdamW.__qualname__ = "GrokAdamW"
    return ResumableGrokAdamW


def _grokadamw(args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """GrokAdamW: the lr and transformers' five options (its own betas/eps defaults: transformers passes no adam_*)."""
    _require_package("grokadamw")
    GrokAdamW = _resumable_grokadamw()

    defaults = {"alpha_init": 0.98, "lamb": 2.0, "gamma": 0.1, "grokking_signal_decay_rate": 0.1,
                "gradient_clipping": 1.0}
    options = _optim_options(args, "grokadamw", dict.fromkeys(defaults, _finite_float))
    return GrokAdamW, {"lr": args.learning_rate, **defaults, **options}


def _stable_adamw(args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """torch-optimi's StableAdamW with the adam_* fields and ``decouple_lr``/``max_lr``/``kahan_sum``.

    transformers converts the two flags with ``bool(text)``, so ``kahan_sum=False`` turns Kahan summation
    on there; here "False" means False (the README lists the difference)."""
    _require_package("stable_adamw")
    from optimi import StableAdamW

    options = _optim_options(args, "stable_adamw", {"decouple_lr": _as_bool, "max_lr": _finite_float,
                                                    "kahan_sum": _as_bool})
    return StableAdamW, {"lr": args.learning_rate, **_adam_options(args), "weight_decay": args.weight_decay,
                         "decouple_lr": options.get("decouple_lr", False), "max_lr": options.get("max_lr"),
                         "kahan_sum": options.get("kahan_sum")}


def _torchao_adamw(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """torchao's AdamW with 4- or 8-bit states (blocks of ``block_size`` values, 256 as in transformers)."""
    _require_package(name)
    try:
        from torchao.optim import AdamW4bit, AdamW8bit
    except ImportError:  # torchao < 0.11 kept them under prototype/
        raise ValueError(f"optim={name!r} needs torchao >= 0.11 (torchao.optim): pip install -U torchao") from None

    options = _optim_options(args, name, {"block_size": _finite_int, "bf16_stochastic_round": _as_bool})
    cls = AdamW4bit if name == "adamw_torch_4bit" else AdamW8bit
    return cls, {"lr": args.learning_rate, "block_size": options.get("block_size", 256),
                 "bf16_stochastic_round": options.get("bf16_stochastic_round", False), **_adam_options(args)}


# schedule-free optim name -> (schedulefree's class, takes the adam_* fields, takes warmup_steps): transformers' choice
_SCHEDULE_FREE = {
    "schedule_free_adamw": ("AdamWScheduleFree", True, True),
    "schedule_free_radam": ("RAdamScheduleFree", True, False),  # RAdam warms itself up
    "schedule_free_sgd": ("SGDScheduleFree", False, True),
}


def _schedule_free(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """A schedule-free optimizer (its own warmup and iterate averaging; the Trainer switches its
    ``train()``/``eval()`` modes: see :func:`set_optimizer_mode`)."""
    _require_package(name)
    import schedulefree

    class_name, adam, warmup = _SCHEDULE_FREE[name]
    cls = getattr(schedulefree, class_name, None)
    if cls is None:
        raise ValueError(f"optim={name!r} needs schedulefree >= 1.4 ({class_name}): pip install -U schedulefree")
    options = _optim_options(args, name, {"weight_lr_power": _finite_float, "r": _finite_float})
    kwargs = {"lr": args.learning_rate, **(_adam_options(args) if adam else {}), "weight_decay": args.weight_decay}
    if warmup:
        steps = getattr(args, "warmup_steps", 0) or 0
        if 0 < steps < 1:  # transformers passes the ratio on as a step count (0.1 "steps": lr x10 at step 0)
            raise ValueError(
                f"warmup_steps={steps!r} is a ratio, but optim={name!r} warms up inside the optimizer, which is "
                "built before the run's length is known: pass warmup_steps as a number of steps (e.g. 100)"
            )
        kwargs["warmup_steps"] = int(steps)
    kwargs["weight_lr_power"] = options.get("weight_lr_power", 2.0)
    kwargs["r"] = options.get("r", 0.0)
    return cls, kwargs
