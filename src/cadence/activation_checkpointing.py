"""Activation (gradient) checkpointing: keep fewer activations in the forward, recompute them in backward.

``activation_checkpointing=True`` (older name ``gradient_checkpointing``) turns it on when ``train()``
starts, in the first of these ways the model offers:

1. ``model.activation_checkpointing_enable(activation_checkpointing_kwargs=..., every_n_layers=...,
   offload=...)`` (transformers 5 models);
2. ``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)`` (transformers 4 models and
   other libraries);
3. a plain ``nn.Module`` marks its blocks with a ``checkpoint_modules`` attribute: a list of submodule
   classes, class names or qualified names (as in ``named_modules()``), e.g.::

       class Net(nn.Module):
           checkpoint_modules = ["Block"]      # or [Block], or ["blocks.0", "blocks.2"]

   Each matching submodule's forward then runs inside ``torch.utils.checkpoint.checkpoint``
   (``use_reentrant=False`` unless the kwargs say otherwise). Nothing is renamed: state-dict keys
   and saved checkpoints are those of the model without checkpointing.

``activation_checkpointing_kwargs`` goes to ``torch.utils.checkpoint.checkpoint`` (``use_reentrant``,
``preserve_rng_state``, ...), except ``every_n_layers`` (checkpoint every n-th matching block) and
``offload`` (transformers' CPU offload; only the model's own method can do it).
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)

_DEFAULTS = {"every_n_layers": 1, "offload": False}  # the options cadence reads itself, at their defaults
_MARK = "_cadence_checkpointed"  # set on a submodule whose forward is wrapped, so enabling twice is harmless


def enable(model: nn.Module, kwargs: dict[str, Any] | None = None) -> str:
    """Turn on activation checkpointing in ``model``; returns how (for the log).

    Args:
        model: the unwrapped model.
        kwargs: ``activation_checkpointing_kwargs``.

    Raises:
        ValueError: when the model offers no way (the message says how to mark blocks).

    Example:
        >>> enable(gpt2_model, {"use_reentrant": False})
        'activation_checkpointing_enable'
    """
    kwargs = dict(kwargs or {})
    every_n_layers = kwargs.pop("every_n_layers", 1)
    offload = kwargs.pop("offload", False)
    for method, kwarg_name in (("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
                               ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs")):
        fn = getattr(model, method, None)
        if callable(fn):
            call = {kwarg_name: kwargs or None}
            params = inspect.signature(fn).parameters
            takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
            for key, value in {"every_n_layers": every_n_layers, "offload": offload}.items():
                if key in params or (takes_any and value != _DEFAULTS[key]):
                    call[key] = value
                elif value != _DEFAULTS[key]:  # an older method without the option: refuse, never drop it
                    raise ValueError(f"activation_checkpointing_kwargs[{key!r}]={value!r} is invalid: "
                                     f"{type(model).__name__}.{method} does not take {key}; remove it")
            fn(**call)
            _inputs_require_grad(model)
            return method
    if offload:
        raise ValueError("activation_checkpointing_kwargs['offload']=True is invalid for a model marked with "
                         "checkpoint_modules: only a model's own activation_checkpointing_enable can offload; remove it")
    blocks = _marked_blocks(model)
    kwargs.setdefault("use_reentrant", False)  # the reentrant variant needs inputs that require grad
    for index, block in enumerate(blocks):
        if index % every_n_layers == 0 and not getattr(block, _MARK, False):
            block.forward = functools.partial(checkpoint, block.forward, **kwargs)  # instance attribute: keys unchanged
            setattr(block, _MARK, True)
    return "checkpoint_modules"


def _inputs_require_grad(model: nn.Module) -> None:
    """With frozen input embeddings (a PEFT/LoRA base), make their output require grad, as transformers
    does: a reentrant checkpoint whose inputs do not require grad gives its blocks' adapters no gradient.

    Newer ``transformers`` models do it in their own method; this covers the older ones and any model
    with ``enable_input_require_grads`` (a ``PeftModel`` reaches its base model's).
    """
    get_embeddings = getattr(model, "get_input_embeddings", None)
    enable = getattr(model, "enable_input_require_grads", None)
    if not (callable(get_embeddings) and callable(enable)) or getattr(model, "_require_grads_hook", None) is not None:
        return
    try:
        embeddings = get_embeddings()
    except NotImplementedError:  # a model without input embeddings: nothing to arrange
        return
    if embeddings is not None and not any(p.requires_grad for p in embeddings.parameters()):
        enable()


def check(model: nn.Module) -> None:
    """Raise the error ``enable`` would raise, without changing the model (for an early error)."""
    if not any(callable(getattr(model, m, None)) for m in ("activation_checkpointing_enable", "gradient_checkpointing_enable")):
        _marked_blocks(model)


def _marked_blocks(model: nn.Module) -> list[nn.Module]:
    marks = getattr(model, "checkpoint_modules", None)
    if not marks:
        raise ValueError(
            f"activation_checkpointing=True is invalid for {type(model).__name__}: it has no "
            "activation_checkpointing_enable()/gradient_checkpointing_enable() method and no checkpoint_modules "
            "attribute; mark the blocks to recompute, e.g. `checkpoint_modules = ['Block']` (classes, class names "
            "or submodule names) on the model class, or remove activation_checkpointing"
        )
    found = [m for name, m in model.named_modules() if name and _matches(name, m, marks)]
    if not found:
        raise ValueError(
            f"checkpoint_modules={list(marks)!r} of {type(model).__name__} matches no submodule: give classes, "
            "class names or names from model.named_modules()"
        )
    return found


def _matches(name: str, module: nn.Module, marks) -> bool:
    return any(
        (isinstance(mark, type) and isinstance(module, mark)) or mark in (name, type(module).__name__)
        for mark in marks
    )
