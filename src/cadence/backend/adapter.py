"""The ``Backend``: the verbs the loop asks (prepare, no_sync, autocast, backward, clip, step, gather, unwrap), on one
process or several. Each verb is the engine's (``strategy``, picked once by ``connect``) or the mixed precision's
(``precision``); none asks which engine runs."""


from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import torch

from ..runtime.devices import empty_cache, free_memory
from .connector import connect
from .deepspeed_engine import DeepSpeedEngine
from .meshes import parallelism_layout
from .precision import _apply_tf32


class Backend:
    """Runs the model on one process, or on several through accelerate.

    Args:
        args: the ``TrainingArguments`` (reads world_size, use_cpu, device and the ddp_* fields).
        model: the model to train; one whose parameters are DTensors (tensor-parallel, or sharded at load) sets the
            layout (see ``parallelism_layout``).

    Attributes:
        strategy: the engine's verbs (``SingleDevice``, ``DataParallel``, ``_FullyShard``, ``_MeshParallel``,
            ``DeepSpeedEngine``); precision: autocast and the fp16 grad scaler (``Precision``).

    Example:
        >>> backend = Backend(args)
        >>> model = backend.prepare_model(model)
        >>> with backend.no_sync(model):
        ...     backend.backward(loss)
    """

    def __init__(self, args: Any, model: torch.nn.Module | None = None):
        self._args = args
        self.world_size, self.timeout_s = args.world_size, args.ddp_timeout
        self.process_index, self.local_process_index = args.process_index, args.local_process_index
        self.layout = parallelism_layout(args, model)  # checked before any process group or mesh exists
        self.strategy, self.precision = connect(args, model, self.layout)
        self.device = self.strategy.device
        self.fused_optimizer = None  # an optimizer that updates inside backward (LOMO), once prepare_model saw it
        _apply_tf32(args.tf32, self.device)

    # ------------------------------------------------ what the Trainer and transformers' attributes read
    accelerator = property(lambda self: self.strategy.accelerator, doc="accelerate's ``Accelerator``, or None")
    sharding = property(lambda self: self.strategy.sharding, doc="the FSDP2 or mesh strategy (``is_fsdp_enabled``), or None")
    amp_dtype = property(lambda self: self.precision.amp_dtype, doc="the autocast dtype, or None")
    scaler = property(lambda self: self.precision.scaler, doc="fp16's ``GradScaler`` (``scaler.pt``), or None")
    is_main_process = property(lambda self: self.process_index == 0)
    deepspeed = property(lambda self: self.strategy.deepspeed, doc="DeepSpeed's config (\"auto\" filled), or None")
    engine = property(lambda self: self.strategy.engine, doc="the DeepSpeed engine, once ``prepare_model`` made it")
    optimizer_from_config = property(lambda self: self.strategy.optimizer_from_config, doc="DeepSpeed's config builds it")
    # whether each process holds only part of the weights (FSDP, ZeRO-3): generation then needs ``synced_gpus``
    shards_parameters = property(lambda self: self.strategy.shards_parameters)
    # whether ``async_save`` may write a checkpoint from a background thread (not DeepSpeed's own collectives)
    saves_in_background = property(lambda self: self.strategy.saves_in_background)
    # how many processes read different batches (the world size over the tensor-parallel degree), and which this is
    data_parallel_size = property(lambda self: self.strategy.data_parallel_size)
    data_parallel_rank = property(lambda self: self.strategy.data_parallel_rank)

    @deepspeed.setter
    def deepspeed(self, config: dict) -> None:  # a Backend built without DeepSpeed, given its config (tests)
        self.strategy = DeepSpeedEngine(self._args, config, self.accelerator, self.device)

    @engine.setter
    def engine(self, engine: Any) -> None:
        self.strategy.engine = engine

    # ------------------------------------------------------------------------------------ the training verbs

    def prepare_model(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> torch.nn.Module:
        """Move to the device; compile once with ``torch_compile``; wrap for data parallelism only when
        there are several processes (FSDP: shard in place, and point ``optimizer`` at the sharded parameters).
        An optimizer with ``fused_backward`` (LOMO, AdaLomo) is remembered: ``backward`` then runs its update,
        ``optimizer_step`` does nothing and ``clip_grad_norm`` reports the norm it measured."""
        self._set_up(model, optimizer)
        return self.strategy.prepare(model, optimizer)

    def _set_up(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:  # either prepare
        if optimizer is not None:
            self.fused_optimizer = optimizer if callable(getattr(optimizer, "fused_backward", None)) else None
        self.precision.autocast_forward(model)

    def warn_unused_optimizers(self, optimizer: Any, lr_scheduler: Any) -> None:
        """A warning where ``optimizers=(...)`` given to the Trainer go unused (DeepSpeed's config sections)."""
        self.strategy.warn_unused_optimizers(optimizer, lr_scheduler)

    def prepare_training(self, model: torch.nn.Module, create_optimizer: Callable, create_scheduler: Callable,
                         num_training_steps: int, scheduler_for: Callable) -> tuple[torch.nn.Module, Any, Any]:
        """``prepare_model`` for ``train()``: the model, optimizer and scheduler to drive (``Strategy.create_optimizers``)."""
        optimizer, lr_scheduler = self.strategy.create_optimizers(create_optimizer, create_scheduler)
        self._set_up(model, optimizer)
        return self.strategy.prepare_training(model, optimizer, lr_scheduler, num_training_steps, scheduler_for)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module: without the DDP wrapper, and without torch.compile's (``_orig_mod``) if given one."""
        return self.strategy.unwrap(model)

    def no_sync(self, model: torch.nn.Module):
        """The context of a micro-batch that is not the last of its step (DDP skips its all-reduce)."""
        return self.strategy.no_sync(model)

    def autocast(self):
        """``torch.autocast`` in the mixed-precision dtype, else nothing."""
        return self.precision.autocast()

    def loss_context(self):
        """The context the Trainer runs ``compute_loss`` in (``Precision.loss_context``)."""
        return self.precision.loss_context()

    def autocast_forward(self, model: torch.nn.Module) -> None:
        """Wrap ``model.forward`` in autocast with float32 outputs (``Precision.autocast_forward``)."""
        self.precision.autocast_forward(model)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, with fp16 loss scaling, DDP or DeepSpeed; for a fused optimizer (LOMO) its update.

        A fused optimizer gets the lr its param groups hold now (the scheduler's, which transformers passes as
        ``_get_learning_rate()``); with its ``clip_grad_norm`` set, a first backward (graph kept) measures the
        global gradient norm that the second one clips by, as the package's README drives it."""
        fused = self.fused_optimizer
        if fused is not None:
            clip = getattr(fused, "clip_grad_norm", None)
            if clip is not None and clip > 0:
                fused.grad_norm(loss)
            fused.fused_backward(loss, fused.param_groups[0]["lr"])
            return
        self.strategy.backward(self.precision.scale(loss))

    def clip_grad_norm(self, parameters, max_norm: float, optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """Clip to ``max_norm`` (``inf`` only measures); returns the norm before clipping, on the device.

        Args:
            parameters: the parameters whose gradients are clipped.
            max_norm: the largest global norm.
            optimizer: the optimizer of these parameters; with loss scaling its gradients are unscaled
                first (once per step), so the norm is the true one.
        """
        if optimizer is not None and optimizer is self.fused_optimizer:  # clipped inside backward, gradients used up
            norms = getattr(optimizer, "grad_norms", None)  # the per-parameter norms of its last norm pass
            return torch.linalg.vector_norm(norms) if torch.is_tensor(norms) else torch.zeros((), device=self.device)
        self.precision.unscale(optimizer)
        return self.strategy.clip_grad_norm(parameters, max_norm)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer; False when loss scaling found inf/NaN gradients and skipped the step. Without a scaler
        this never reads anything from the device (no host sync)."""
        if optimizer is not None and optimizer is self.fused_optimizer:  # updated inside backward (its step() raises)
            optimizer._opt_called = True  # what step() marks: torch's scheduler warns of a skipped step otherwise
            return True
        return self.strategy.optimizer_step(optimizer, self.precision)

    def empty_cache(self) -> None:
        """Return the device's cached free memory to the driver (``torch_empty_cache_steps``); nothing on a CPU."""
        empty_cache(self.device)

    def free_memory(self, model: torch.nn.Module | None = None, error: BaseException | None = None) -> None:
        """After an out-of-memory ``error``: ``model``'s step gradients dropped (``Strategy.drop_gradients``), memory freed."""
        self.strategy.drop_gradients(model, error)
        free_memory(self.device)

    def pin_memory(self, requested: bool) -> bool:
        """Whether dataloaders pin host memory: when ``requested`` and the batches go to a CUDA device (not a CPU)."""
        return requested and self.device.type == "cuda"

    def scaler_state(self) -> dict[str, Any] | None:
        """The grad scaler's state for ``scaler.pt``, or None when there is no loss scaling."""
        return self.precision.state_dict()

    def load_scaler_state(self, state: dict[str, Any]) -> None:
        """Restore ``scaler.pt`` (a resumed fp16 run continues with the same loss scale)."""
        self.precision.load_state_dict(state)

    def cast_for_eval(self, model: torch.nn.Module) -> torch.nn.Module:
        """With ``fp16_full_eval``/``bf16_full_eval``: the model cast in place to that dtype (transformers' rule)."""
        return self.precision.cast_for_eval(model)

    # ------------------------------------------------------------ collectives: every process must call them

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over processes."""
        return self.strategy.reduce_sum(tensor)

    def reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.strategy.reduce_mean(tensor)

    def reduce_sum_data_parallel(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel ranks: a value every process of a tensor-parallel group holds alike (its
        batch's item count) is counted once per group."""
        total, copies = self.strategy.reduce_sum(tensor), self.world_size // self.strategy.data_parallel_size
        if copies == 1:
            return total
        return total // copies if not total.is_floating_point() else total / copies  # whole counts: exact

    def gather(self, tensor: Any) -> Any:
        """Concatenate along dim 0 over processes, in process order (over data-parallel ranks: the processes of a
        tensor-parallel group hold the same rows, kept once)."""
        return self.strategy.gather(tensor)

    def pad_across_processes(self, tensor: Any, dim: int = 1, pad_index: int = -100) -> Any:
        """Pad ``dim`` to the largest size over processes, so the tensors can be gathered."""
        return self.strategy.pad_across_processes(tensor, dim=dim, pad_index=pad_index)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of process ``src`` on every process (picklable)."""
        return self.strategy.broadcast_object(obj, src)

    def gather_object(self, obj: Any) -> list:
        """Every process's ``obj`` (picklable), in process order (once per tensor-parallel group)."""
        return self.strategy.gather_object(obj)

    def barrier(self) -> None:
        self.strategy.barrier()

    def end(self) -> None:
        """Destroy the process group (accelerate's ``end_training``); nothing with one process."""
        self.strategy.end()

    def collectives_guard(self, step: Callable[[], int]):
        """A failed collective (a process died, or did not answer within ``ddp_timeout``) raised as an error naming
        this process and ``step()`` + 1 (``Strategy.collectives_guard``)."""
        return self.strategy.collectives_guard(step)

    # ---------------------------------------------------------------- checkpoints (collectives under FSDP)

    def model_state_dict(self, model: torch.nn.Module, folder: str | os.PathLike, full: bool = False,
                         pending: list | None = None) -> dict | None:
        """The weights to write into ``folder``, called by every process (FSDP gathers them); None when the model's
        own ``state_dict`` is the one to save. See ``Strategy.model_state_dict``."""
        return self.strategy.model_state_dict(model, Path(folder), full, pending)

    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | os.PathLike,
                             pending: list | None = None) -> dict | None:
        """The optimizer state for ``optimizer.pt``, called by every process, in ``optimizer.state_dict()``'s format
        whatever the engine; None where FSDP's shards or DeepSpeed's checkpoint in ``folder`` hold it."""
        return self.strategy.optimizer_state_dict(model, optimizer, Path(folder), pending)

    def load_model_weights(self, model: torch.nn.Module, folder: str | os.PathLike) -> None:
        """Put the weights saved in ``folder`` into ``model`` (every process; full, sharded or DeepSpeed's)."""
        self.strategy.load_model_weights(model, Path(folder))

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | os.PathLike) -> None:
        """Restore the optimizer saved in ``folder`` (every process; full ``optimizer.pt``, shards or DeepSpeed's)."""
        self.strategy.load_optimizer_state(model, optimizer, Path(folder))
