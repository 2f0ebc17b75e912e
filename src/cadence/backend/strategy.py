"""``Strategy``: the verbs one engine answers (prepare, no_sync, backward, clip, step, collectives, checkpoints).

One subclass per engine, each in its own module: ``single`` (one device), ``ddp`` (several processes through
accelerate), ``fsdp`` (FSDP2's ``fully_shard``), ``meshes`` (a model on a device mesh: TP, FSDP x TP, HSDP) and
``deepspeed_engine`` (DeepSpeed's engine). The ``Backend`` picks one at set-up (``connector``) and hands every verb
to it, so no verb asks which engine runs; mixed precision (autocast, the grad scaler) is a ``Precision`` beside it.
The defaults here are those of one process: collectives return their input, checkpoints are the model's and the
optimizer's own ``state_dict``.
"""


from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable

import torch

from ..checkpoint_io import formats
from ..runtime.processes import _is_collective_failure

_COMPILED = "_cadence_compiled"  # set on a module compiled in place, so it is compiled once


class Strategy:
    """One engine's verbs. Subclasses implement ``prepare``, ``backward`` and ``clip_grad_norm``, and override
    what their engine does differently.

    Args:
        args: the ``TrainingArguments`` (world size, ranks, ``torch_compile*``).
        device: the device this process computes on.
        accelerator: accelerate's ``Accelerator`` for several processes (or DeepSpeed), else None.
    """

    engine = None  # the DeepSpeed engine, once made
    deepspeed: dict | None = None  # DeepSpeed's config, "auto" values filled
    sharding = None  # this strategy where the parameters are sharded (FSDP2) or on a mesh (transformers' is_fsdp_enabled)
    shards_parameters = False  # a forward is a collective (FSDP, ZeRO-3): generation needs ``synced_gpus``
    forward_autocasts = True  # mixed precision wraps the model's forward (FSDP casts its parameters instead)
    saves_in_background = True  # a checkpoint's files can be written from a snapshot by a background thread

    def __init__(self, args: Any, device: torch.device, accelerator: Any = None):
        self.device, self.accelerator = device, accelerator
        self.world_size, self.process_index, self.timeout_s = args.world_size, args.process_index, args.ddp_timeout
        self.data_parallel_size, self.data_parallel_rank = self.world_size, self.process_index
        self.compile_options = (
            dict(backend=args.torch_compile_backend, mode=args.torch_compile_mode, dynamic=True) if args.torch_compile else None
        )

    # ------------------------------------------------------------------------------------------------ training

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> torch.nn.Module:
        """The model the loop trains: placed, compiled and wrapped as the engine needs (``optimizer`` pointed at
        the engine's parameters where it replaces them)."""
        raise NotImplementedError

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move ``model`` to the device; compile it once, in place, with ``torch_compile``."""
        model = model.to(self.device)
        if self.compile_options is not None and not getattr(model, _COMPILED, False):
            # in place: no wrapper, so state-dict keys carry no `_orig_mod.`; dynamic shapes, so batches padded
            # to different lengths reuse one compilation instead of recompiling per length
            model.compile(**self.compile_options)
            setattr(model, _COMPILED, True)
        return model

    optimizer_from_config = False  # the engine builds the optimizer from its own config (DeepSpeed's section)

    def create_optimizers(self, create_optimizer: Callable[[], Any],
                          create_scheduler: Callable[[Any], Any]) -> tuple[Any, Any]:
        """The Trainer's optimizer and scheduler for ``train()`` (``create_optimizer()``, then
        ``create_scheduler(optimizer)``), or None for each that the engine builds itself instead (DeepSpeed's config
        sections), so that nothing of the arguments' is built only to be discarded."""
        optimizer = create_optimizer()
        return optimizer, create_scheduler(optimizer)

    def prepare_training(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, lr_scheduler: Any,
                         num_training_steps: int, scheduler_for: Any) -> tuple[torch.nn.Module, Any, Any]:
        """``prepare`` for ``train()``, returning the model, optimizer and scheduler the loop drives (the given ones
        here; DeepSpeed may build its own)."""
        return self.prepare(model, optimizer), optimizer, lr_scheduler

    def drop_gradients(self, model: torch.nn.Module | None, error: BaseException | None) -> None:
        """Discard the partial gradients of a training step of ``model`` that ran out of memory (``error``), so
        ``auto_find_batch_size`` can redo it: they live on the parameters (None: evaluation, nothing to drop)."""
        if model is not None:
            model.zero_grad(set_to_none=True)

    def warn_unused_optimizers(self, optimizer: Any, lr_scheduler: Any) -> None:
        """Warn where ``optimizers=(...)`` given to the Trainer go unused (only DeepSpeed replaces them)."""

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module, without torch.compile's wrapper (``_orig_mod``) if given one."""
        return getattr(model, "_orig_mod", model)

    def no_sync(self, model: torch.nn.Module):
        """The context of a micro-batch that is not its step's last: nothing to skip with one process."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Gradients of ``loss`` (already scaled by the precision's grad scaler)."""
        raise NotImplementedError

    def clip_grad_norm(self, parameters, max_norm: float) -> torch.Tensor:
        """Clip to ``max_norm`` (``inf`` only measures); the global norm before clipping, on the device."""
        raise NotImplementedError

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Any) -> bool:
        """Step ``optimizer`` through ``precision`` (its grad scaler); False where the step was skipped."""
        return precision.step(optimizer)

    # ------------------------------------- collectives (every process must call them; one process: the input)

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over processes."""
        return tensor

    def reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean over processes."""
        return tensor

    def gather(self, tensor: Any) -> Any:
        """Concatenated along dim 0 over the data-parallel ranks, in process order."""
        return tensor

    def pad_across_processes(self, tensor: Any, dim: int = 1, pad_index: int = -100) -> Any:
        """``dim`` padded with ``pad_index`` to its largest size over processes."""
        return tensor

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Process ``src``'s ``obj`` (picklable) on every process."""
        return obj

    def gather_object(self, obj: Any) -> list:
        """Every data-parallel rank's ``obj`` (picklable), in process order."""
        return [obj]

    def barrier(self) -> None:
        """Wait for every process."""

    def end(self) -> None:
        """Destroy the process group (accelerate's ``end_training``)."""

    @contextlib.contextmanager
    def collectives_guard(self, step: Callable[[], int]):
        """Turn a failed collective (another process died, or did not answer within ``ddp_timeout``) into an
        error naming this process and the step, instead of a bare transport message (gloo) or a hang.

        Args:
            step: returns the optimizer step being run, read only when something failed.
        """
        try:
            yield
        except Exception as error:
            if self.world_size == 1 or not _is_collective_failure(error):
                raise
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise RuntimeError(
                f"process {self.process_index} of {self.world_size} stopped at step {step() + 1}: a collective with the "
                f"other processes failed ({first_line[:300]}); another process has likely died or did not answer "
                f"within ddp_timeout={self.timeout_s}s: see its log for the cause"
            ) from error

    # ------------------------------------------------------------------------------------------------ checkpoints

    def model_state_dict(self, model: torch.nn.Module, folder: Path, full: bool, pending: list | None) -> dict | None:
        """The weights to write into ``folder``, called by every process.

        Returns None when the model's own ``state_dict`` is the one to save (no sharding); under FSDP the
        consolidated full state on the saving process (``{}`` on the others), or ``{}`` once every process
        wrote its shard into ``folder`` (``state_dict_type`` sharded, unless ``full``). With a ``pending`` list
        (an asynchronous save) the shards are copied to the CPU here, and their write is appended to ``pending``
        for the writer's thread to call (it returns once every process's shards and DCP's metadata are written).
        """
        return None

    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
                             pending: list | None) -> dict | None:
        """The optimizer state for ``optimizer.pt`` (``optimizer.state_dict()``'s format); None when written into
        ``folder`` otherwise."""
        return optimizer.state_dict()

    def load_model_weights(self, model: torch.nn.Module, folder: str | os.PathLike) -> None:
        formats.load_model_weights(self.unwrap(model), folder)

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | os.PathLike) -> None:
        optimizer.load_state_dict(formats.safe_load(Path(folder) / formats.OPTIMIZER_NAME))
