"""``debug="underflow_overflow"``: stop at the first module whose forward produces inf or NaN, and name it.

A forward hook on every module checks its outputs. Children finish before their parents, so the first
hook that sees a non-finite value belongs to the innermost module whose own computation produced it
(a parent is named when the value came from code in its own ``forward`` between children). The error
gives the module's qualified name and class, the optimizer step, whether its inputs and weights were
still finite, and their largest magnitudes (a value near float16's 65504 or bfloat16's 3.4e38 says
overflow). Each check reads a flag on the host: a debugging mode, slow by design. The hooks live only
inside ``train()``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

logger = logging.getLogger(__name__)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _largest(tensors: list[torch.Tensor]) -> float:
    finite = [t.detach().abs().nan_to_num(0.0, 0.0, 0.0).max().item() for t in tensors if t.numel()]
    return max(finite, default=0.0)


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t.detach()).all()) for t in tensors)


class UnderflowOverflowDetector:
    """Forward hooks that raise ``ValueError`` at the first module output holding inf/NaN.

    Args:
        model: the model to watch (every submodule, with its name from ``named_modules()``).
        step: returns the current optimizer step, for the message.

    Example:
        >>> detector = UnderflowOverflowDetector(model, lambda: state.global_step)
        >>> ...  # train; the first inf raises ValueError naming the module
        >>> detector.remove()
    """

    def __init__(self, model: nn.Module, step=lambda: None):
        self.step = step
        self.handles = [m.register_forward_hook(self._hook(name or "(the model)")) for name, m in model.named_modules()]

    def _hook(self, name: str):
        def check(module: nn.Module, inputs: Any, output: Any) -> None:
            outputs = _tensors(output)
            if _all_finite(outputs):
                return
            ins, weights = _tensors(inputs), [p for p in module.parameters(recurse=False) if p.is_floating_point()]
            raise ValueError(
                f"debug=underflow_overflow: module {name!r} ({type(module).__name__}) produced inf/NaN at step "
                f"{self.step()}: its inputs were {'finite' if _all_finite(ins) else 'already non-finite'} "
                f"(largest |value| {_largest(ins):.4g}), its own weights "
                f"{'finite' if _all_finite(weights) else 'NOT finite'} (largest |value| {_largest(weights):.4g}), "
                f"largest finite |output| {_largest(outputs):.4g}. Lower the learning rate, use bf16 instead of "
                "fp16, or rescale this module"
            )

        return check

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
