"""The ``optim`` table: each name to its optimizer class and options, and ``create_optimizer``."""


from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Callable

import torch
from torch import nn
from torch.optim import Optimizer


from .adafactor import Adafactor
from .lomo import _lomo
from .low_rank import _LOW_RANK, _low_rank
from .options import _adam_options, _as_bool, _as_name, _finite_float, _optim_options
from .packages import _SCHEDULE_FREE, _bitsandbytes, _grokadamw, _schedule_free, _stable_adamw, _torchao_adamw
from .parameter_groups import get_parameter_groups
from .requirements import _BITSANDBYTES, _OPTIONAL_PACKAGES, _package_available, _require_package


def _adamw_torch(args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    _optim_options(args, "adamw_torch", {})
    return torch.optim.AdamW, {"lr": args.learning_rate, **_adam_options(args)}


def _adamw_torch_fused(args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    _optim_options(args, "adamw_torch_fused", {})
    return torch.optim.AdamW, {"lr": args.learning_rate, **_adam_options(args), "fused": True}


def _adafactor(args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    _optim_options(args, "adafactor", {})
    # An external lr and schedule, like every other optimizer of the Trainer.
    return Adafactor, {"lr": args.learning_rate, "scale_parameter": False, "relative_step": False}


def _torch_optimizer(
    name: str,
    cls: type[Optimizer],
    converters: dict[str, Callable[[Any], Any]],
    args: Any,
    model: nn.Module | None = None,
) -> tuple[type[Optimizer], dict[str, Any]]:
    """A torch optimizer with the lr plus the optim_args transformers passes to it."""
    return cls, {"lr": args.learning_rate, **_optim_options(args, name, converters)}


# The optim_args transformers forwards to each plain torch optimizer, and their types.
_TORCH_OPTIMIZERS: dict[str, tuple[type[Optimizer], dict[str, Callable[[Any], Any]]]] = {
    "sgd": (
        torch.optim.SGD,
        {"momentum": _finite_float, "dampening": _finite_float, "weight_decay": _finite_float, "nesterov": _as_bool},
    ),
    "adagrad": (torch.optim.Adagrad, {"lr_decay": _finite_float, "weight_decay": _finite_float, "eps": _finite_float}),
    "rmsprop": (
        torch.optim.RMSprop,
        {"momentum": _finite_float, "alpha": _finite_float, "eps": _finite_float, "weight_decay": _finite_float,
         "centered": _as_bool},
    ),
}


# transformers has these; cadence does not build them yet (users can pass optimizers=(...)).
_NOT_BUILT = tuple(name for name in _OPTIONAL_PACKAGES if name not in _BITSANDBYTES and name not in (
    "grokadamw", "stable_adamw", "adamw_torch_4bit", "adamw_torch_8bit", "lomo", "adalomo", *_SCHEDULE_FREE, *_LOW_RANK))


def _not_built_message(name: str) -> str:
    module, pip = _OPTIONAL_PACKAGES[name]
    missing = "" if _package_available(module) else f" (it would also need `{module}`: {pip})"
    return f"optim={name!r} is not built yet in cadence{missing}; pass Trainer(optimizers=(...)) instead"


def _not_built(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    raise ValueError(_not_built_message(name))


# Keyed by the string values of transformers' OptimizerNames (TrainingArguments.optim).
# Each entry: (args, model=None) -> (optimizer_cls, kwargs); create_optimizer adds the params.
OPTIMIZERS: dict[str, Callable[..., tuple[Any, dict[str, Any]]]] = {
    "adamw_torch": _adamw_torch,
    "adamw_torch_fused": _adamw_torch_fused,
    "adafactor": _adafactor,
    **{name: partial(_torch_optimizer, name, cls, conv) for name, (cls, conv) in _TORCH_OPTIMIZERS.items()},
    **{name: partial(_bitsandbytes, name) for name in _BITSANDBYTES},
    "grokadamw": _grokadamw,
    "stable_adamw": _stable_adamw,
    "adamw_torch_4bit": partial(_torchao_adamw, "adamw_torch_4bit"),
    "adamw_torch_8bit": partial(_torchao_adamw, "adamw_torch_8bit"),
    **{name: partial(_schedule_free, name) for name in _SCHEDULE_FREE},
    **{name: partial(_low_rank, name) for name in _LOW_RANK},
    "lomo": partial(_lomo, "lomo"),
    "adalomo": partial(_lomo, "adalomo"),
    **{name: partial(_not_built, name) for name in _NOT_BUILT},
}


def check_optimizer(name: str) -> None:
    """Raise ValueError now if ``optim=name`` cannot be built, so no run fails at its first step.

    Args:
        name: an ``optim`` value (str or str-Enum).

    Raises:
        ValueError: unknown name; its package is missing (the message has the pip command); or an
            optimizer transformers has and cadence does not build yet.
    """
    name = _as_name(name)
    if name not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    if name in _NOT_BUILT:
        raise ValueError(_not_built_message(name))
    if name in _OPTIONAL_PACKAGES:
        _require_package(name)


def is_optimizer_factory(optimizer_cls_or_factory: Any) -> bool:
    """Whether an optimizer handler returned a factory (any callable that builds the optimizer from the
    model, e.g. for Muon-style optimizers) rather than a ``torch.optim.Optimizer`` subclass.

    Example:
        >>> is_optimizer_factory(torch.optim.AdamW), is_optimizer_factory(lambda model: None)
        (False, True)
    """
    return not (isinstance(optimizer_cls_or_factory, type) and issubclass(optimizer_cls_or_factory, torch.optim.Optimizer))


def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[Any, dict[str, Any]]:
    """The optimizer class and its keyword arguments (without params) that ``args.optim`` names.

    Args:
        args: has ``optim``, ``optim_args``, ``learning_rate``, ``adam_beta1``, ``adam_beta2``,
            ``adam_epsilon`` (a ``TrainingArguments``).
        model: the model, for optimizers that need it.

    Returns:
        ``(optimizer_cls, kwargs)``.
    """
    name = _as_name(args.optim)
    check_optimizer(name)
    return OPTIMIZERS[name](args, model)


def _keep_embeddings_32bit(model: nn.Module) -> None:
    """8-bit bitsandbytes optimizers are unstable on embeddings: keep those in 32-bit (as transformers)."""
    import bitsandbytes

    manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            manager.register_module_override(module, "weight", {"optim_bits": 32})


def create_optimizer(
    model: nn.Module, args: Any, optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None
) -> Optimizer:
    """Build the Trainer's optimizer: the two weight-decay groups, then the class ``args.optim`` names.

    Args:
        model: the model to optimize.
        args: a ``TrainingArguments`` (``weight_decay`` and the fields ``get_optimizer_cls_and_kwargs`` reads).
        optimizer_cls_and_kwargs: the user's ``(cls, kwargs)`` instead of ``args.optim``. A "params"
            entry in kwargs replaces the groups, a "model" entry is passed instead of them (LOMO's
            ``cls(model, **kwargs)``); a ``cls`` that is not an Optimizer class is a
            factory, called as ``cls()(model, **kwargs)`` (transformers' convention).

    Returns:
        The optimizer.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> args = NS(optim="sgd", optim_args="momentum=0.9", learning_rate=0.1, weight_decay=0.01,
        ...           adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
        >>> opt = create_optimizer(torch.nn.Linear(2, 2), args)
        >>> [(len(g["params"]), g["weight_decay"], g["momentum"]) for g in opt.param_groups]
        [(1, 0.01, 0.9), (1, 0.0, 0.9)]
    """
    if optimizer_cls_and_kwargs is None:
        optimizer_cls, kwargs = get_optimizer_cls_and_kwargs(args, model)
    else:
        optimizer_cls, kwargs = optimizer_cls_and_kwargs
    kwargs = dict(kwargs)  # never mutate the caller's dict
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, Optimizer)):
        return optimizer_cls()(model, **kwargs)
    if "model" in kwargs:  # LOMO-style: built from the model itself (transformers' convention), no groups
        return optimizer_cls(kwargs.pop("model"), **kwargs)
    params = kwargs.pop("params", None) or get_parameter_groups(model, args.weight_decay)
    optimizer = optimizer_cls(params, **kwargs)
    if optimizer_cls.__module__.startswith("bitsandbytes") and kwargs.get("optim_bits") == 8:
        _keep_embeddings_32bit(model)
    return optimizer


def set_optimizer_mode(optimizer: Any, training: bool) -> None:
    """Switch an optimizer that has ``train()``/``eval()`` (schedule-free ones) into that mode; others are untouched.

    A schedule-free optimizer trains on one point (y) and averages another (x): ``eval()`` puts x into the
    parameters, ``train()`` puts y back. The Trainer calls it where transformers does (``training_step``:
    train; ``evaluation_loop``: eval), and also around checkpoints and ``save_model`` and at the end of
    ``train()``, so whatever is evaluated or saved holds the averaged weights.

    Args:
        optimizer: the optimizer (or None).
        training: True for ``train()``, False for ``eval()``.

    Example:
        >>> set_optimizer_mode(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), training=False)
    """
    switch = getattr(optimizer, "train" if training else "eval", None)
    if callable(switch):
        switch()


@contextlib.contextmanager
def eval_weights(optimizer: Any, restore: bool = True):
    """The parameters hold the optimizer's evaluation weights inside the block (see :func:`set_optimizer_mode`).

    Args:
        optimizer: the optimizer (or None).
        restore: switch back to training mode afterwards (inside ``train()``).
    """
    set_optimizer_mode(optimizer, training=False)
    try:
        yield
    finally:
        if restore:
            set_optimizer_mode(optimizer, training=True)
