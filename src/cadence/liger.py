"""Liger kernels (``use_liger_kernel``): liger-kernel's Triton kernels patched into the model, as transformers does.

transformers 5.24 calls ``liger_kernel.transformers._apply_liger_kernel_to_instance(model=..., **liger_kernel_config)``
on the (PEFT-unwrapped) ``PreTrainedModel`` at the start of ``train()``; liger picks the patch function of the
model's ``config.model_type`` (RMSNorm, RoPE, SwiGLU, fused linear cross-entropy, ...) and drops the config keys
that function does not take. cadence does the same, and checks first, before step 1, what would otherwise fail
inside the first forward: Triton kernels need a GPU, and a config key no patch function takes is a typo.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)

# Devices liger-kernel's Triton kernels run on (NVIDIA and AMD GPUs are torch's "cuda", Intel GPUs "xpu").
_DEVICE_TYPES = ("cuda", "xpu")


def check(device_type: str, config: dict[str, Any] | None) -> None:
    """Refuse ``use_liger_kernel=True`` where it cannot work, naming the reason and the fix.

    Args:
        device_type: the training device's type (``backend.device.type``).
        config: ``liger_kernel_config`` (None applies liger's defaults).

    Raises:
        ValueError: on a device Triton does not run on; for a ``liger_kernel_config`` key no patch function takes.
        ImportError: without the liger-kernel package (one line: the pip command).

    Example:
        >>> check("cpu", None)
        Traceback (most recent call last):
        ValueError: use_liger_kernel=True needs a GPU: ...
    """
    if device_type not in _DEVICE_TYPES:
        raise ValueError(
            f"use_liger_kernel=True needs a GPU: Liger's kernels are Triton kernels, which do not run on the "
            f"{device_type!r} device this run trains on; set use_liger_kernel=False, or train on a CUDA (or XPU) GPU"
        )
    if importlib.util.find_spec("liger_kernel") is None:
        raise ImportError("use_liger_kernel=True needs the liger-kernel package: pip install liger-kernel")
    unknown = sorted(set(config or {}) - known_options())
    if unknown:
        raise ValueError(
            f"liger_kernel_config has key(s) {unknown} that no Liger patch function takes; known: "
            f"{sorted(known_options())}; fix the spelling or remove them"
        )


def known_options() -> set[str]:
    """Every keyword a liger-kernel model patch function takes (besides ``model``): the keys liger_kernel_config may
    hold. Each model type takes a subset; liger drops the others for that model, as it does in transformers."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return {name for fn in MODEL_TYPE_TO_APPLY_LIGER_FN.values() for name in inspect.signature(fn).parameters} - {"model"}


def apply(model: nn.Module, config: dict[str, Any] | None) -> bool:
    """Patch ``model`` in place with Liger kernels, as transformers' ``apply_liger_kernel`` does.

    Args:
        model: the unwrapped model (a PEFT model is patched through its base model).
        config: ``liger_kernel_config``, passed to liger as keyword arguments.

    Returns:
        True when liger was called; False (with a warning) for a model that is not a ``PreTrainedModel``.

    Example:
        >>> apply(model, {"fused_linear_cross_entropy": True})
        True
    """
    from transformers import PreTrainedModel

    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: patch the wrapped model
    if not isinstance(base, PreTrainedModel):
        logger.warning("use_liger_kernel=True: %s is not a transformers PreTrainedModel, so no Liger kernels are applied",
                       type(base).__name__)
        return False
    _apply_liger_kernel_to_instance(model=base, **(config or {}))
    return True
