"""Precision: the forward under autocast with float32 outputs, the fp16 grad scaler, dtype checks per device, TF32
(``Precision``: the object beside the engine's strategy)."""


from __future__ import annotations

import contextlib
import functools
import types
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


_AUTOCAST_FORWARD = "_cadence_autocast_forward"  # set on a module whose forward autocast_forward wrapped


class Precision:
    """Mixed precision beside the engine, as accelerate does it: ``bf16``/``fp16`` run the forward under autocast
    with float32 outputs (weights stay float32), ``fp16`` adds a ``torch.amp.GradScaler`` (bf16 has float32's range
    and needs none), ``fp16_full_eval``/``bf16_full_eval`` cast the model for evaluation.

    Args:
        args: the ``TrainingArguments`` (``fp16_full_eval``, ``bf16_full_eval``).
        device: the device the model computes on.
        amp_dtype: the autocast dtype (``_amp_dtype``), None for float32 or where the engine casts itself (DeepSpeed).
        forward: whether autocast wraps the model's forward (else the loss: FSDP casts its parameters itself).

    Example:
        >>> precision = Precision(args, torch.device("cpu"), torch.bfloat16)
        >>> with precision.loss_context():
        ...     loss = compute_loss(model, batch)
    """

    def __init__(self, args: Any, device: torch.device, amp_dtype: torch.dtype | None, forward: bool = True):
        self.device, self.amp_dtype = device, amp_dtype
        self.forward_autocasts = amp_dtype is not None and forward
        self.eval_dtype = _HALF_DTYPES.get("fp16" if args.fp16_full_eval else "bf16" if args.bf16_full_eval else None)
        if self.eval_dtype is not None:
            _check_dtype_on_device(self.eval_dtype, device, "fp16_full_eval" if args.fp16_full_eval else "bf16_full_eval")
        # fp16's narrow range needs loss scaling; bf16 has float32's range and needs none
        self.scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None

    def autocast(self):
        """``torch.autocast`` in the mixed-precision dtype, else nothing."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def loss_context(self):
        """The context ``compute_loss`` runs in: nothing when the forward autocasts itself (its outputs are float32,
        as accelerate gives them to transformers), else ``autocast``."""
        return contextlib.nullcontext() if self.forward_autocasts or self.amp_dtype is None else self.autocast()

    def autocast_forward(self, model: torch.nn.Module) -> None:
        """Wrap ``model.forward`` (in place, once) as accelerate's ``prepare_model`` does under mixed precision: the
        forward runs under autocast and its float16/bfloat16 outputs come back as float32. The wrapper is bound to
        the module (``MethodType``), so a ``copy.deepcopy`` of the model (a reference model) calls its own forward.
        A wrapper left by an earlier run in another precision is taken off first (a float32 run after a bf16 one on
        the same model computes in float32)."""
        wanted = (self.device.type, self.amp_dtype) if self.forward_autocasts else None
        done = getattr(model, _AUTOCAST_FORWARD, None)
        if done == wanted:
            return
        if done is not None:
            model.forward = model._original_forward
            del model._original_forward
            setattr(model, _AUTOCAST_FORWARD, None)
        if wanted is None:
            return
        forward = model.forward
        func = getattr(forward, "__func__", None)
        wrapped = _forward_in_autocast(func if func is not None else forward, *wanted)
        model._original_forward = forward  # accelerate's name
        model.forward = types.MethodType(wrapped, model) if func is not None else wrapped
        setattr(model, _AUTOCAST_FORWARD, wanted)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: multiplied by the loss scale under fp16."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def unscale(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Divide ``optimizer``'s gradients by the loss scale (once per step, before clipping measures them)."""
        if self.scaler is not None and optimizer is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer; False when loss scaling found inf/NaN gradients and skipped the step. Without a
        scaler this never reads anything from the device (no host sync)."""
        if self.scaler is None:
            optimizer.step()
            return True
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)  # reads the inf check on the host anyway: the comparison costs nothing more
        self.scaler.update()
        return self.scaler.get_scale() >= scale  # the scale backs off exactly when the step was skipped

    def state_dict(self) -> dict[str, Any] | None:
        """The grad scaler's state for ``scaler.pt``, or None when there is no loss scaling."""
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``scaler.pt`` (a resumed fp16 run continues with the same loss scale)."""
        if self.scaler is not None:
            self.scaler.load_state_dict(state)

    def cast_for_eval(self, model: torch.nn.Module) -> torch.nn.Module:
        """With ``fp16_full_eval``/``bf16_full_eval``: the model cast in place to that dtype (transformers' rule)."""
        return model if self.eval_dtype is None else model.to(dtype=self.eval_dtype)
