"""Low-rank and layer-wise: GaLore and APOLLO, and one optimizer per parameter."""


from __future__ import annotations

import importlib.util
import logging
from functools import cache as functools_cache
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.optim import Optimizer

from ..trainer_utils import check_target_module_exists

from .options import _adam_options, _finite_float, _finite_int, _optim_options
from .requirements import _require_package

logger = logging.getLogger(__name__)


# The projector classes a low-rank optimizer's state may hold: (module, class) -> how a checkpoint names it.
_PROJECTORS = {
    ("galore_torch.galore_projector", "GaLoreProjector"): "galore",
    ("apollo_torch.svd_projector", "GaLoreProjector"): "apollo_svd",
    ("apollo_torch.random_projector", "GradientProjector"): "apollo_random",
}


def _projector_class(kind: str) -> type:
    module, name = next(key for key, value in _PROJECTORS.items() if value == kind)
    return getattr(importlib.import_module(module), name)


def _strided(tensor: torch.Tensor, stride: list[int] | None) -> torch.Tensor:
    """``tensor``'s values laid out with ``stride`` (a saved tensor comes back row-major)."""
    if stride is None or list(tensor.stride()) == list(stride) or tensor.dim() != len(stride) or not tensor.numel():
        return tensor
    size = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, stride))
    out = tensor.new_empty(size).as_strided(tensor.shape, stride)
    return out.copy_(tensor)


@functools_cache
def _with_plain_projectors(cls: type[Optimizer]) -> type[Optimizer]:
    """``cls`` (a GaLore or APOLLO optimizer) whose state dict holds each projector as a dict of its fields.

    The packages keep a projector object per parameter (``state["projector"]``: rank, scale, the projection
    matrix, ...); pickled as it is, ``torch.load(weights_only=True)`` refuses it. Saved as ``{"projector_kind":
    ..., **fields}`` it is tensors, numbers and strings, and is rebuilt on load from one of the three known
    classes only (:data:`_PROJECTORS`), so no pickle global is added.
    """

    class PlainProjectors(cls):
        def state_dict(self) -> dict[str, Any]:
            saved = super().state_dict()
            for key, state in saved["state"].items():
                projector = state.get("projector")
                if projector is not None and not isinstance(projector, dict):
                    kind = _PROJECTORS[(type(projector).__module__, type(projector).__name__)]
                    fields = vars(projector)
                    # the layout too: LAPACK's SVD gives column-major matrices, and a matmul with a row-major copy
                    # rounds otherwise on some CPUs, so a resume would not be bit-identical (seen: 1.5e-8)
                    strides = {k: list(v.stride()) for k, v in fields.items() if torch.is_tensor(v)}
                    # a new dict: the per-parameter dicts are the live state's
                    saved["state"][key] = {**state, "projector": {"projector_kind": kind, **fields,
                                                                  "projector_strides": strides}}
            return saved

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            # taken out first: torch's load casts a state's values and would turn their strings into generators
            states, projectors = dict(state_dict["state"]), {}
            for key, state in states.items():
                if isinstance(state.get("projector"), dict):
                    projectors[key] = state["projector"]
                    states[key] = {k: v for k, v in state.items() if k != "projector"}
            super().load_state_dict({**state_dict, "state": states})
            params = [p for group in self.param_groups for p in group["params"]]  # a state's key: its index here
            for key, fields in projectors.items():
                strides = fields.get("projector_strides", {})
                fields = {k: _strided(v.to(params[key].device), strides.get(k)) if torch.is_tensor(v) else v
                          for k, v in fields.items() if k != "projector_strides"}
                projector = object.__new__(_projector_class(fields.pop("projector_kind")))
                vars(projector).update(fields)
                self.state[params[key]]["projector"] = projector

    PlainProjectors.__name__ = PlainProjectors.__qualname__ = cls.__name__
    return PlainProjectors


def _low_rank_groups(args: Any, model: nn.Module | None, name: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    """transformers' two groups for GaLore/APOLLO: every parameter not targeted, then the targeted weights with the
    low-rank ``options``. Targeted: the ``nn.Linear`` modules that ``optim_target_modules`` names (a regex
    string, a list of names, substrings or regexes, or "all-linear")."""
    targets = getattr(args, "optim_target_modules", None)
    if targets is None:
        raise ValueError(f"optim={name!r} needs optim_target_modules: the modules whose weights it projects, e.g. "
                         "optim_target_modules=['attn', 'mlp'] or 'all-linear'")
    if not isinstance(targets, (list, str)):
        raise TypeError(f"optim_target_modules={targets!r} is invalid: it must be a list of strings, a regex string "
                        "or 'all-linear'")
    if model is None:
        raise ValueError(f"optim={name!r} needs the model to find optim_target_modules in")
    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    names = set()
    for module_name, module in model.named_modules():
        found, is_regex = check_target_module_exists(targets, module_name, return_is_regex=True)
        if not isinstance(module, nn.Linear):
            if found and not is_regex:
                logger.warning("%s matched optim_target_modules but is no nn.Linear: %s leaves it out", module_name,
                               name)
            continue
        if found or all_linear:
            names.add(module_name + ".weight")
    if not names:
        raise ValueError(f"optim_target_modules={targets!r} matches no nn.Linear module of the model, so optim={name!r} "
                         "has nothing to project: name modules of model.named_modules(), or pass 'all-linear'")
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if n not in names]},
            {"params": [p for n, p in named if n in names], **options}]


class LayerwiseOptimizer(Optimizer):
    """One optimizer per parameter, each stepped by a gradient hook as soon as its parameter's gradient is
    complete in backward (then that gradient is freed): the ``*_layerwise`` optimizers, which never hold every
    gradient at once. ``step()`` and ``zero_grad()`` do nothing; ``param_groups`` are the per-parameter
    optimizers' own groups (the same dicts), so one lr scheduler over this object sets every optimizer's lr,
    which the next backward uses, as transformers' per-parameter schedulers do. ``state_dict()`` holds every
    per-parameter optimizer's state in parameter order (transformers' layer-wise checkpoints hold none).

    Args:
        params: parameter groups; each parameter gets its own ``optimizer_cls`` over ``{**group, "params": [p]}``.
        optimizer_cls: the optimizer class, built with ``**kwargs``.

    Example:
        >>> lin = torch.nn.Linear(2, 1)
        >>> opt = LayerwiseOptimizer([{"params": list(lin.parameters())}], torch.optim.SGD, lr=0.1)
        >>> before = lin.weight.detach().clone()
        >>> lin(torch.ones(1, 2)).sum().backward()  # the hooks step each parameter here
        >>> bool((lin.weight != before).all()), lin.weight.grad is None
        (True, True)
    """

    def __init__(self, params: Iterable[dict[str, Any]], optimizer_cls: type[Optimizer], **kwargs: Any):
        self.optimizers: dict[nn.Parameter, Optimizer] = {}
        for group in params:
            for param in group["params"]:
                self.optimizers[param] = optimizer_cls([{**group, "params": [param]}], **kwargs)
        super().__init__([torch.zeros(1)], {"lr": kwargs.get("lr", 1e-3)})  # torch's bookkeeping; replaced below
        self.param_groups = [g for optimizer in self.optimizers.values() for g in optimizer.param_groups]
        self._hooks = [param.register_post_accumulate_grad_hook(self._step_one)
                       for param in self.optimizers if param.requires_grad]

    def _step_one(self, param: nn.Parameter) -> None:
        optimizer = self.optimizers[param]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def step(self, closure: Callable[[], float] | None = None) -> None:  # the hooks stepped every parameter
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:  # the hooks freed every gradient
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"layerwise": [optimizer.state_dict() for optimizer in self.optimizers.values()]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("layerwise")
        if saved is None or len(saved) != len(self.optimizers):
            raise ValueError(
                f"this optimizer.pt is not a layer-wise optimizer's state for {len(self.optimizers)} parameters "
                f"(it holds {'no per-parameter states' if saved is None else f'{len(saved)} of them'}): resume a "
                "*_layerwise run from its own checkpoints, with the same model"
            )
        for optimizer, state in zip(self.optimizers.values(), saved):
            optimizer.load_state_dict(state)
        self.param_groups = [g for optimizer in self.optimizers.values() for g in optimizer.param_groups]

    def remove_hooks(self) -> None:
        """Detach the gradient hooks (the parameters train with another optimizer afterwards)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def _check_layerwise(name: str, args: Any) -> None:
    """transformers' refusals for a layer-wise optimizer, plus what cannot work with gradients consumed in backward."""
    fix = f"or use {name.removesuffix('_layerwise')!r}, which steps once per optimizer step"
    if getattr(args, "world_size", 1) > 1:
        raise ValueError(f"optim={name!r} does not support several processes (DDP), as in transformers: run one "
                         f"process, {fix}")
    if getattr(args, "gradient_accumulation_steps", 1) != 1:
        raise ValueError(f"optim={name!r} steps each parameter inside backward, so gradient_accumulation_steps="
                         f"{args.gradient_accumulation_steps} cannot add gradients up (transformers refuses it too): "
                         f"set gradient_accumulation_steps=1, {fix}")
    if getattr(args, "max_grad_norm", 0) and args.max_grad_norm > 0:
        raise ValueError(f"optim={name!r} steps each parameter inside backward, before the gradients' norm is known, "
                         f"so max_grad_norm={args.max_grad_norm} cannot clip them (transformers silently does not): "
                         f"set max_grad_norm=0, {fix}")
    if getattr(args, "fp16", False):
        raise ValueError(f"optim={name!r} steps inside backward, before fp16 loss scaling unscales the gradients: use "
                         f"bf16=True or float32, {fix}")


# low-rank optim name -> (package, class, its options from optim_args with transformers' defaults)
_LOW_RANK: dict[str, tuple[str, str, dict[str, tuple[Callable[[Any], Any], Any]]]] = {
    **{name: ("galore_torch", cls, {"rank": (_finite_int, 128), "update_proj_gap": (_finite_int, 200),
                                    "scale": (_finite_float, 0.25), "proj_type": (str, "std")})
       for base, cls in (("galore_adamw", "GaLoreAdamW"), ("galore_adamw_8bit", "GaLoreAdamW8bit"),
                         ("galore_adafactor", "GaLoreAdafactor")) for name in (base, base + "_layerwise")},
    **dict.fromkeys(("apollo_adamw", "apollo_adamw_layerwise"), ("apollo_torch", "APOLLOAdamW", {
        "rank": (_finite_int, 128), "proj": (str, "random"), "scale_type": (str, "channel"),
        "update_proj_gap": (_finite_int, 200), "scale": (_finite_float, 1.0), "proj_type": (str, "std")})),
}


def _low_rank(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """GaLore / APOLLO: the targeted weights projected to a low rank, every other parameter a plain group (no
    weight decay in either, as transformers groups them)."""
    _require_package(name)
    package, class_name, spec = _LOW_RANK[name]
    cls = _with_plain_projectors(getattr(importlib.import_module(package), class_name))
    given = _optim_options(args, name, {key: convert for key, (convert, _) in spec.items()})
    options = {key: given.get(key, default) for key, (_, default) in spec.items()}
    if name.startswith("apollo"):  # transformers puts the adam_* fields into APOLLO's low-rank group
        options.update(_adam_options(args))
    if name.endswith("_layerwise"):
        _check_layerwise(name, args)
    kwargs: dict[str, Any] = {"lr": args.learning_rate, "params": _low_rank_groups(args, model, name, options)}
    if name.startswith("galore_adafactor"):  # the Trainer's lr and schedule (transformers: not for the layer-wise
        kwargs.update(scale_parameter=False, relative_step=False)  # one, whose lr with relative_step is refused)
    if name.endswith("_layerwise"):
        return LayerwiseOptimizer, {**kwargs, "optimizer_cls": cls}
    return cls, kwargs
