"""Precision: the forward under autocast with float32 outputs, dtype checks per device, TF32."""


from __future__ import annotations

import functools
from typing import Any, Callable

import torch


def _forward_in_autocast(forward: Callable, device_type: str, dtype: torch.dtype) -> Callable:
    @functools.wraps(forward)
    def forward_in_autocast(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            outputs = forward(*args, **kwargs)
        return _map_tensors(_half_to_float32, outputs)

    return forward_in_autocast


def _half_to_float32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def _map_tensors(fn: Callable, value: Any) -> Any:
    if isinstance(value, dict):
        return type(value)({k: _map_tensors(fn, v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(fn, v) for v in value)
    return fn(value) if torch.is_tensor(value) else value


_HALF_DTYPES: dict[str | None, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}


def _amp_dtype(args: Any, device: torch.device) -> torch.dtype | None:
    name = "fp16" if args.fp16 else "bf16" if args.bf16 else None
    dtype = _HALF_DTYPES[name]
    if dtype is not None:
        _check_dtype_on_device(dtype, device, name)
    return dtype


def _check_dtype_on_device(dtype: torch.dtype, device: torch.device, field: str) -> None:
    """A clear error, before anything runs, when this device and torch cannot compute in ``dtype``."""
    if not torch.amp.autocast_mode.is_autocast_available(device.type):
        raise ValueError(f"{field}=True is invalid on device {device}: torch has no autocast for it; remove {field}")
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"{field}=True is invalid on {torch.cuda.get_device_name(device)}: it cannot compute in bfloat16 "
            "(that needs an Ampere or newer GPU); use fp16=True instead"
        )
    if device.type == "cpu" and dtype == torch.float16:
        try:
            torch.amp.GradScaler("cpu")
        except Exception as error:  # noqa: BLE001 - older torch: no CPU loss scaling
            raise ValueError(
                f"{field}=True is invalid on the CPU with torch {torch.__version__}: it has no CPU grad scaler "
                f"({error}); use bf16=True, or a newer torch"
            ) from None


def _apply_tf32(tf32: bool | None, device: torch.device) -> None:
    if tf32 is None:
        return
    usable = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8
    if tf32 and not usable:
        raise ValueError(
            f"tf32=True is invalid on device {device}: TF32 needs a CUDA GPU of compute capability >= 8 "
            "(Ampere or newer); remove tf32"
        )
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(tf32)
    # tf32=False on a CPU: nothing to turn off
