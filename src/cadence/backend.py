"""The only module that knows how processes and devices are run (accelerate over torch.distributed).

The loop asks verbs (``prepare_model``, ``no_sync``, ``backward``, ``clip_grad_norm``, ``reduce_mean``,
``gather``, ``unwrap``, ``barrier``) and never asks which engine is underneath. A single process
gets no wrapper at all: no DDP module, no optimizer wrapper, no accelerate dataloader; the model
is only moved to the device. Several processes (``torchrun``/``accelerate launch``) go through
accelerate's ``Accelerator``, with its gradient accumulation left at 1: cadence normalises the loss
of a step itself, once, over the items of all processes (see ``loss.py``).
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any

import torch

logger = logging.getLogger(__name__)


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
            self.accelerator = Accelerator(cpu=args.use_cpu, kwargs_handlers=[ddp, init])
            self.device = self.accelerator.device
        else:
            self.device = args.device
        self.process_index = args.process_index

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move to the device; wrap for data parallelism only when there are several processes."""
        model = model.to(self.device)
        if self.accelerator is None:
            return model
        return self.accelerator.prepare_model(model)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model if self.accelerator is None else self.accelerator.unwrap_model(model)

    def no_sync(self, model: torch.nn.Module):
        """Skip the gradient all-reduce for a micro-batch that is not the last of its step."""
        if self.accelerator is None:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(model)

    def backward(self, loss: torch.Tensor) -> None:
        if self.accelerator is None:
            loss.backward()
        else:
            self.accelerator.backward(loss)

    def clip_grad_norm(self, parameters, max_norm: float) -> torch.Tensor:
        """Clip to ``max_norm`` (``inf`` only measures); returns the norm before clipping, on the device."""
        if self.accelerator is None:
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return self.accelerator.clip_grad_norm_(parameters, max_norm)

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
