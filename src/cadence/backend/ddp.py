"""Several processes through accelerate's ``Accelerator``: DDP's wrapper, its all-reduce skipped inside an
accumulation window, and the collectives every multi-process engine (FSDP, meshes, DeepSpeed) shares."""


from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..runtime.processes import _end_at_exit_if_started, _on_cpu, _process_group_options, find_unused_parameters
from .precision import _map_tensors
from .strategy import Strategy


def ddp_accelerator(args: Any, model: torch.nn.Module | None, parallelism: dict[str, Any]):
    """accelerate's ``Accelerator`` for several processes, from the arguments' ``ddp_*`` fields and ``parallelism``
    (the layout's ``parallelism_config`` keyword, where accelerate takes one), with its gradient accumulation at 1."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    ddp = DistributedDataParallelKwargs(
        find_unused_parameters=find_unused_parameters(args, model),
        broadcast_buffers=True if args.ddp_broadcast_buffers is None else args.ddp_broadcast_buffers,
        static_graph=bool(args.ddp_static_graph),
        **({"bucket_cap_mb": args.ddp_bucket_cap_mb} if args.ddp_bucket_cap_mb else {}),
    )
    init = InitProcessGroupKwargs(**_process_group_options(args))
    return _end_at_exit_if_started(lambda: Accelerator(cpu=_on_cpu(args), kwargs_handlers=[ddp, init],
                                                       **parallelism))


class DataParallel(Strategy):
    """DDP through accelerate: each process a replica, gradients averaged by an all-reduce in ``backward``.

    Args:
        args: as ``Strategy``; ``accelerator_config``'s ``gradient_accumulation_kwargs`` ``sync_each_batch``
            all-reduces every micro-batch (less memory, the same sum).
        accelerator: the run's ``Accelerator`` (``ddp_accelerator``); its device is this process's, unless ``device``.
    """

    def __init__(self, args: Any, accelerator: Any, device: torch.device | None = None):
        super().__init__(args, accelerator.device if device is None else device, accelerator)
        accumulation = getattr(args.accelerator_config, "gradient_accumulation_kwargs", None) or {}
        self.sync_each_batch = bool(accumulation.get("sync_each_batch", False))

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> torch.nn.Module:
        return self.accelerator.prepare_model(self.place(model))

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return super().unwrap(self.accelerator.unwrap_model(model))

    def no_sync(self, model: torch.nn.Module):
        """Skip the gradient all-reduce of a micro-batch that is not its step's last."""
        return contextlib.nullcontext() if self.sync_each_batch else self.accelerator.no_sync(model)

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def clip_grad_norm(self, parameters, max_norm: float) -> torch.Tensor:
        return self.accelerator.clip_grad_norm_(parameters, max_norm)

    # ------------------------------------------------------------------------ collectives (every process calls them)

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(tensor, reduction="sum")

    def reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(tensor, reduction="mean")

    def gather(self, tensor: Any) -> Any:
        copies = self.world_size // self.data_parallel_size
        gathered = self.accelerator.gather(tensor)
        if copies == 1:
            return gathered
        # equal shapes on every process (accelerate's gather needs them): one block per process, the first of each group
        return _map_tensors(lambda t: t.reshape(self.world_size, -1, *t.shape[1:])[::copies].flatten(0, 1)
                            if t.dim() else t, gathered)

    def pad_across_processes(self, tensor: Any, dim: int = 1, pad_index: int = -100) -> Any:
        return self.accelerator.pad_across_processes(tensor, dim=dim, pad_index=pad_index)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([obj], from_process=src)[0]

    def gather_object(self, obj: Any) -> list:
        gathered: list = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, obj)
        return gathered[:: self.world_size // self.data_parallel_size]  # once per tensor-parallel group

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    def end(self) -> None:
        self.accelerator.end_training()
