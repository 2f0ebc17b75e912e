"""Parameter groups: which parameters get weight decay, and which group of an optimizer holds a parameter."""


from __future__ import annotations

import re
from typing import Any, Iterable

from torch import nn


# =============================================================================================
# Parameter groups
# =============================================================================================

# transformers' rule: no weight decay inside nn.LayerNorm modules, nor for parameters whose
# lower-cased dotted name matches one of these (biases and norm weights by naming convention,
# which covers RMSNorm and most custom norms).
_NO_DECAY_NAME_PATTERNS = tuple(
    re.compile(pattern) for pattern in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
)


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that weight decay applies to (transformers' rule and order).

    Excluded: every parameter inside an ``nn.LayerNorm`` and every parameter whose lower-cased
    name contains "bias", "layernorm", "rmsnorm", or a ``norm`` / ``*_norm`` path component. Other
    normalisation layers are excluded only through their names, as in transformers.

    Args:
        model: the model.

    Returns:
        Dotted names, children before a module's own parameters.

    Example:
        >>> get_decay_parameter_names(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)))
        ['0.weight']
    """
    return get_parameter_names(model, [nn.LayerNorm], _NO_DECAY_NAME_PATTERNS)


def get_parameter_names(model: nn.Module, forbidden_layer_types: Iterable[type],
                        forbidden_layer_names: Iterable[str | re.Pattern] | None = None) -> list[str]:
    """Names of the parameters outside modules of ``forbidden_layer_types`` whose lower-cased dotted name
    matches none of ``forbidden_layer_names`` (regular expressions, searched); transformers' helper.

    Args:
        model: the model.
        forbidden_layer_types: module classes whose parameters (at any depth) are left out.
        forbidden_layer_names: patterns; a parameter whose name matches one is left out.

    Returns:
        Dotted names, children before a module's own parameters (transformers' order).

    Example:
        >>> get_parameter_names(torch.nn.Sequential(torch.nn.Linear(2, 2)), [], ["bias"])
        ['0.weight']
    """
    forbidden_types = tuple(forbidden_layer_types)
    patterns = [re.compile(p) if isinstance(p, str) else p for p in forbidden_layer_names or ()]
    names: list[str] = []

    def visit(module: nn.Module, prefix: str, forbidden: bool) -> None:
        for child_name, child in module.named_children():
            visit(child, f"{prefix}{child_name}.", forbidden or isinstance(child, forbidden_types))
        for name in module._parameters:  # own parameters, after the children
            full = prefix + name
            if not forbidden and not any(p.search(full.lower()) for p in patterns):
                names.append(full)

    visit(model, "", False)
    return names


def get_parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The two param groups the Trainer optimizes: with weight decay, then without.

    Both groups are always present (even when empty) and in this order, as in transformers, so
    optimizer state dicts line up with its checkpoints. Frozen parameters are left out.

    Args:
        model: the model.
        weight_decay: the decay of the first group.

    Returns:
        ``[{"params": [...], "weight_decay": weight_decay}, {"params": [...], "weight_decay": 0.0}]``.
    """
    decay = set(get_decay_parameter_names(model))
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for name, p in trainable if name in decay], "weight_decay": weight_decay},
        {"params": [p for name, p in trainable if name not in decay], "weight_decay": 0.0},
    ]


def optimizer_group(optimizer: Any, model: nn.Module, param: str | nn.Parameter | None = None
                    ) -> dict[str, Any] | list[list[nn.Parameter]]:
    """The group of ``optimizer`` holding ``param`` (a parameter of ``model``, or its name); without one, every
    group's parameter list (transformers' ``Trainer.get_optimizer_group``).

    Raises:
        ValueError: ``model`` has no parameter of that name.
    """
    if isinstance(param, str):
        named = dict(model.named_parameters())
        if param not in named:
            raise ValueError(f"get_optimizer_group({param!r}): the model has no parameter of that name; "
                             f"its parameters are {sorted(named)[:8]}{' ...' if len(named) > 8 else ''}")
        param = named[param]
    if param is not None:
        for group in optimizer.param_groups:
            if any(p is param for p in group["params"]):  # identity: == on tensors compares values
                return group
    return [group["params"] for group in optimizer.param_groups]
