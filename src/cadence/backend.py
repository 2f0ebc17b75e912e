"""The only module that knows how processes and devices are run (accelerate over torch.distributed).

The loop asks verbs (``prepare_model``, ``no_sync``, ``autocast``, ``backward``, ``clip_grad_norm``,
``optimizer_step``, ``reduce_mean``, ``gather``, ``unwrap``, ``barrier``) and never asks which engine is
underneath. A single process
gets no wrapper at all: no DDP module, no optimizer wrapper, no accelerate dataloader; the model
is only moved to the device. Several processes (``torchrun``/``accelerate launch``) go through
accelerate's ``Accelerator``, with its gradient accumulation left at 1: cadence normalises the loss
of a step itself, once, over the items of all processes (see ``loss.py``).

Mixed precision is owned here too, the same way on one process or several: ``bf16``/``fp16`` run the
forward and the loss under ``torch.autocast`` (weights stay float32); ``fp16`` adds a
``torch.amp.GradScaler``: ``backward`` scales the loss, ``clip_grad_norm`` unscales first,
``optimizer_step`` skips a step whose gradients hold inf/NaN and returns False so that the schedule does
not advance. ``tf32=True`` needs a CUDA device of compute capability >= 8 (an error elsewhere, as in
transformers); ``tf32=False`` turns it off on CUDA and does nothing on a CPU.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
from datetime import timedelta
from typing import Any

import torch

logger = logging.getLogger(__name__)


def _destroy_process_group() -> None:
    """End the process group cadence started (at exit): its gloo/NCCL threads stop before the interpreter
    tears down, instead of "terminate called without an active exception" after the work is done."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # a Trainer lives in reference cycles: collect the unreachable ones now, so their DDP wrappers
        # release the group here, not at some point of the interpreter's teardown
        gc.collect()
        torch.distributed.destroy_process_group()


class Backend:
    """Runs the model on one process, or on several through accelerate.

    Args:
        args: the ``TrainingArguments`` (reads world_size, use_cpu, device and the ddp_* fields).

    Example:
        >>> backend = Backend(args)
        >>> model = backend.prepare_model(model)
        >>> with backend.no_sync(model):
        ...     backend.backward(loss)
    """

    def __init__(self, args: Any):
        self.world_size = args.world_size
        self.accelerator = None
        if self.world_size > 1:
            from accelerate import Accelerator
            from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

            ddp = DistributedDataParallelKwargs(
                find_unused_parameters=bool(args.ddp_find_unused_parameters),
                broadcast_buffers=True if args.ddp_broadcast_buffers is None else args.ddp_broadcast_buffers,
                static_graph=bool(args.ddp_static_graph),
                **({"bucket_cap_mb": args.ddp_bucket_cap_mb} if args.ddp_bucket_cap_mb else {}),
            )
            init = InitProcessGroupKwargs(timeout=timedelta(seconds=args.ddp_timeout), backend=args.ddp_backend)
            started_here = not torch.distributed.is_initialized()
            self.accelerator = Accelerator(cpu=args.use_cpu, kwargs_handlers=[ddp, init])
            if started_here:  # ours to end: a group left to the interpreter's teardown can abort the process
                atexit.register(_destroy_process_group)
            self.device = self.accelerator.device
        else:
            self.device = args.device
        self.process_index = args.process_index
        self.amp_dtype = _amp_dtype(args, self.device)
        self.eval_dtype = _HALF_DTYPES.get("fp16" if args.fp16_full_eval else "bf16" if args.bf16_full_eval else None)
        if self.eval_dtype is not None:
            _check_dtype_on_device(self.eval_dtype, self.device, "fp16_full_eval" if args.fp16_full_eval else "bf16_full_eval")
        # fp16's narrow range needs loss scaling; bf16 has float32's range and needs none
        self.scaler = torch.amp.GradScaler(self.device.type) if self.amp_dtype == torch.float16 else None
        _apply_tf32(args.tf32, self.device)
        self.compile_options = (
            dict(backend=args.torch_compile_backend, mode=args.torch_compile_mode, dynamic=True) if args.torch_compile else None
        )

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move to the device; compile once with ``torch_compile``; wrap for data parallelism only when
        there are several processes."""
        model = model.to(self.device)
        if self.compile_options is not None and not getattr(model, _COMPILED, False):
            # in place: no wrapper, so state-dict keys carry no `_orig_mod.`; dynamic shapes, so batches padded
            # to different lengths reuse one compilation instead of recompiling per length
            model.compile(**self.compile_options)
            setattr(model, _COMPILED, True)
        if self.accelerator is None:
            return model
        return self.accelerator.prepare_model(model)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module: without the DDP wrapper, and without torch.compile's (``_orig_mod``) if given one."""
        model = model if self.accelerator is None else self.accelerator.unwrap_model(model)
        return getattr(model, "_orig_mod", model)

    def no_sync(self, model: torch.nn.Module):
        """Skip the gradient all-reduce for a micro-batch that is not the last of its step."""
        if self.accelerator is None:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(model)

    def autocast(self):
        """The forward-and-loss context: ``torch.autocast`` in the mixed-precision dtype, else nothing."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        if self.accelerator is None:
            loss.backward()
        else:
            self.accelerator.backward(loss)

    def clip_grad_norm(self, parameters, max_norm: float, optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """Clip to ``max_norm`` (``inf`` only measures); returns the norm before clipping, on the device.

        Args:
            parameters: the parameters whose gradients are clipped.
            max_norm: the largest global norm.
            optimizer: the optimizer of these parameters; with loss scaling its gradients are unscaled
                first (once per step), so the norm is the true one.
        """
        if self.scaler is not None and optimizer is not None:
            self.scaler.unscale_(optimizer)
        if self.accelerator is None:
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return self.accelerator.clip_grad_norm_(parameters, max_norm)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer; False when loss scaling found inf/NaN gradients and skipped the step.

        Without a scaler this never reads anything from the device (no host sync).
        """
        if self.scaler is None:
            optimizer.step()
            return True
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)  # reads the inf check on the host anyway: the comparison costs nothing more
        self.scaler.update()
        return self.scaler.get_scale() >= scale  # the scale backs off exactly when the step was skipped

    def empty_cache(self) -> None:
        """Return the device's cached free memory to the driver (``torch_empty_cache_steps``); nothing on a CPU."""
        release = _EMPTY_CACHE.get(self.device.type)
        if release is not None:
            release()

    def scaler_state(self) -> dict[str, Any] | None:
        """The grad scaler's state for ``scaler.pt``, or None when there is no loss scaling."""
        return None if self.scaler is None else self.scaler.state_dict()

    def load_scaler_state(self, state: dict[str, Any]) -> None:
        """Restore ``scaler.pt`` (a resumed fp16 run continues with the same loss scale)."""
        if self.scaler is not None:
            self.scaler.load_state_dict(state)

    def cast_for_eval(self, model: torch.nn.Module) -> torch.nn.Module:
        """With ``fp16_full_eval``/``bf16_full_eval``: the model cast in place to that dtype (transformers' rule)."""
        return model if self.eval_dtype is None else model.to(dtype=self.eval_dtype)

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over processes (a collective: every process must call it)."""
        if self.accelerator is None:
            return tensor
        return self.accelerator.reduce(tensor, reduction="sum")

    def reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.accelerator is None:
            return tensor
        return self.accelerator.reduce(tensor, reduction="mean")

    def gather(self, tensor: Any) -> Any:
        """Concatenate along dim 0 over processes, in process order."""
        if self.accelerator is None:
            return tensor
        return self.accelerator.gather(tensor)

    def pad_across_processes(self, tensor: Any, dim: int = 1, pad_index: int = -100) -> Any:
        """Pad ``dim`` to the largest size over processes (a collective), so the tensors can be gathered."""
        if self.accelerator is None:
            return tensor
        return self.accelerator.pad_across_processes(tensor, dim=dim, pad_index=pad_index)

    def barrier(self) -> None:
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()


# device type -> how to release its allocator's cache (a CPU has none to release)
_EMPTY_CACHE = {
    "cuda": lambda: torch.cuda.empty_cache(),
    "mps": lambda: torch.mps.empty_cache(),
    "xpu": lambda: torch.xpu.empty_cache(),
}

_COMPILED = "_cadence_compiled"  # set on a module compiled in place, so it is compiled once

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
