"""The ``Backend``: the verbs the loop asks (prepare, no_sync, autocast, backward, clip, step, gather, unwrap), on one process or several."""


from __future__ import annotations

import contextlib
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any, Callable

import torch

from ..checkpoint_io import formats
from ..checkpoint_io.deepspeed_files import check_deepspeed_folder, has_tag_file

from .deepspeed import (_check_deepspeed_usable, deepspeed_accelerator, deepspeed_config, deepspeed_optimizers,
                        unused_given_optimizers)
from ..runtime.devices import empty_cache, free_memory
from .fsdp import _FullyShard, fsdp_plugin
from .meshes import _accelerate_parallelism, _mesh_sharding, parallelism_layout
from .precision import _HALF_DTYPES, _amp_dtype, _apply_tf32, _check_dtype_on_device, _forward_in_autocast, _map_tensors
from ..runtime.processes import (_end_at_exit_if_started, _is_collective_failure, _on_cpu, _process_group_options, accelerate_state,
                        find_unused_parameters)

logger = logging.getLogger(__name__)


class Backend:
    """Runs the model on one process, or on several through accelerate.

    Args:
        args: the ``TrainingArguments`` (reads world_size, use_cpu, device and the ddp_* fields).
        model: the model to train; one whose parameters are DTensors (tensor-parallel, or sharded at load) sets the
            layout (see ``parallelism_layout``).

    Example:
        >>> backend = Backend(args)
        >>> model = backend.prepare_model(model)
        >>> with backend.no_sync(model):
        ...     backend.backward(loss)
    """

    def __init__(self, args: Any, model: torch.nn.Module | None = None):
        self.world_size = args.world_size
        self.layout = parallelism_layout(args, model)  # checked before any process group or mesh exists
        self.accelerator = None
        self.engine = None  # the DeepSpeed engine, once prepare_model made it
        self.fused_optimizer = None  # an optimizer that updates inside backward (LOMO), once prepare_model saw it
        self.deepspeed = None
        if args.deepspeed:
            _check_deepspeed_usable(args)
            self.deepspeed = deepspeed_config(args)
        if self.deepspeed is not None:  # on one process too: the engine partitions the optimizer state
            self.accelerator = _end_at_exit_if_started(
                lambda: deepspeed_accelerator(self.deepspeed, _process_group_options(args)))
            self.device = self.accelerator.device
        elif self.world_size > 1:
            from accelerate import Accelerator
            from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

            ddp = DistributedDataParallelKwargs(
                find_unused_parameters=find_unused_parameters(args, model),
                broadcast_buffers=True if args.ddp_broadcast_buffers is None else args.ddp_broadcast_buffers,
                static_graph=bool(args.ddp_static_graph),
                **({"bucket_cap_mb": args.ddp_bucket_cap_mb} if args.ddp_bucket_cap_mb else {}),
            )
            init = InitProcessGroupKwargs(**_process_group_options(args))
            self.accelerator = _end_at_exit_if_started(
                lambda: Accelerator(cpu=_on_cpu(args), kwargs_handlers=[ddp, init],
                                    **_accelerate_parallelism(self.layout, args)))
            self.device = self.accelerator.device
        else:
            self.device = args.device
            if "accelerate" in sys.modules:  # a library built on it is in use (TRL calls accelerate's set_seed, which
                accelerate_state(args)  # reads AcceleratorState); a plain run does not pay accelerate's import
        self._args = args
        # accelerator_config's gradient_accumulation_kwargs: all-reduce every micro-batch (less memory, same sum)
        accumulation = getattr(args.accelerator_config, "gradient_accumulation_kwargs", None) or {}
        self.sync_each_batch = bool(accumulation.get("sync_each_batch", False))
        self.timeout_s = args.ddp_timeout
        self.process_index = args.process_index
        self.local_process_index = args.local_process_index
        # DeepSpeed casts the model itself (its config's fp16/bf16, filled from the arguments): no autocast here
        self.amp_dtype = None if self.deepspeed else _amp_dtype(args, self.device)
        plugin = fsdp_plugin(args)
        if plugin is not None and (self.deepspeed is not None or args.torch_compile):
            raise ValueError(f"fsdp={args.fsdp!r} with {'deepspeed' if self.deepspeed is not None else 'torch_compile=True'} is "
                             "not supported: choose FSDP or DeepSpeed, and FSDP runs uncompiled in cadence")
        if plugin is not None and self.world_size == 1:
            logger.info("fsdp with one process: nothing to shard, the model trains unwrapped")
        self.sharding = _FullyShard(plugin, self.device, self.amp_dtype) if plugin is not None and self.world_size > 1 else None
        if self.layout is not None and self.world_size > 1:
            self.sharding = _mesh_sharding(self.layout, model, plugin, self.device, self.amp_dtype) or self.sharding
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

    @property
    def shards_parameters(self) -> bool:
        """Whether each process holds only part of the weights (FSDP, DeepSpeed ZeRO-3): a forward is then a
        collective, so generation must run the same number of forwards on every process (``synced_gpus``)."""
        zero = (self.deepspeed or {}).get("zero_optimization", {})
        return self.sharding is not None or str(zero.get("stage")) == "3"

    @property
    def data_parallel_size(self) -> int:
        """How many processes read different batches: the world size, divided by the tensor-parallel degree."""
        return getattr(self.sharding, "data_parallel_size", self.world_size)

    @property
    def data_parallel_rank(self) -> int:
        """Which share of the data this process reads (the same for every process of one tensor-parallel group)."""
        return getattr(self.sharding, "data_parallel_rank", self.process_index)

    def reduce_sum_data_parallel(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel ranks (a collective over all processes): a value every process of a
        tensor-parallel group holds alike (its batch's item count) is counted once per group."""
        total, copies = self.reduce_sum(tensor), self.world_size // self.data_parallel_size
        if copies == 1:
            return total
        return total // copies if not total.is_floating_point() else total / copies  # whole counts: exact

    @property
    def saves_in_background(self) -> bool:
        """Whether a checkpoint's files can be written by a background thread from a snapshot of the states
        (``async_save``): not under DeepSpeed, whose engine writes its checkpoint with collectives of its own."""
        return not self.deepspeed

    def prepare_model(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> torch.nn.Module:
        """Move to the device; compile once with ``torch_compile``; wrap for data parallelism only when
        there are several processes (FSDP: shard in place, and point ``optimizer`` at the sharded parameters).
        An optimizer with ``fused_backward`` (LOMO, AdaLomo) is remembered: ``backward`` then runs its update,
        ``optimizer_step`` does nothing and ``clip_grad_norm`` reports the norm it measured."""
        if optimizer is not None:
            self.fused_optimizer = optimizer if callable(getattr(optimizer, "fused_backward", None)) else None
        if self.sharding is not None:
            return self.sharding.shard(model, optimizer)
        self.autocast_forward(model)
        if self.deepspeed is not None and optimizer is not None:  # the engine steps the optimizer (ZeRO partitions it)
            if self.engine is None:
                self.accelerator.state.deepspeed_plugin.deepspeed_config.update(deepspeed_config(self._args, model))
                self.engine, _ = self.accelerator.prepare(model, optimizer)
            return self.engine
        model = model.to(self.device)
        if self.compile_options is not None and not getattr(model, _COMPILED, False):
            # in place: no wrapper, so state-dict keys carry no `_orig_mod.`; dynamic shapes, so batches padded
            # to different lengths reuse one compilation instead of recompiling per length
            model.compile(**self.compile_options)
            setattr(model, _COMPILED, True)
        if self.accelerator is None:
            return model
        return self.accelerator.prepare_model(model)

    def warn_unused_optimizers(self, optimizer: Any, lr_scheduler: Any) -> None:
        """A warning where ``optimizers=(...)`` given to the Trainer go unused: DeepSpeed builds its config's
        ``optimizer``/``scheduler`` sections instead (``unused_given_optimizers``)."""
        reason = None if self.deepspeed is None else unused_given_optimizers(self.deepspeed, optimizer, lr_scheduler)
        if reason is not None:
            logger.warning(reason)

    def prepare_training(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any,
                         num_training_steps: int, scheduler_for: Callable[[Any], Any]) -> tuple[torch.nn.Module, Any, Any]:
        """``prepare_model`` for ``train()``, with the optimizer and the scheduler the loop then drives: the given
        ones, or, under DeepSpeed whose config has an ``optimizer`` or ``scheduler`` section, the engine's, built as
        transformers has them built (``deepspeed_optimizers``). The engine steps those itself at the window's end
        inside ``backward``, so their ``step()`` does nothing in the loop, and the learning rate they report after
        the step is the next step's (as transformers logs it under DeepSpeed).

        Args:
            model, optimizer, lr_scheduler: the module and the arguments' optimizer and schedule.
            num_training_steps: the run's optimizer steps (the config's "auto" scheduler steps are filled from it).
            scheduler_for: builds the arguments' schedule on another optimizer (the engine's, when the config has an
                optimizer section and no scheduler section).
        """
        if self.deepspeed is None or not {"optimizer", "scheduler"} & self.deepspeed.keys():
            return self.prepare_model(model, optimizer), optimizer, lr_scheduler
        if self.engine is None:
            self.autocast_forward(model)
            config = deepspeed_config(self._args, model, num_training_steps)
            self.accelerator.state.deepspeed_plugin.deepspeed_config.update(config)
            engine_optimizer, engine_scheduler = deepspeed_optimizers(config, model, optimizer, scheduler_for)
            self.engine, *self._engine_optimizers = self.accelerator.prepare(model, engine_optimizer, engine_scheduler)
        return self.engine, *self._engine_optimizers

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module: without the DDP wrapper, and without torch.compile's (``_orig_mod``) if given one."""
        model = model if self.accelerator is None else self.accelerator.unwrap_model(model)
        return getattr(model, "_orig_mod", model)

    def no_sync(self, model: torch.nn.Module):
        """Skip the gradient all-reduce for a micro-batch that is not the last of its step.

        FSDP reduce-scatters every micro-batch instead: skipping it would keep whole unsharded gradients
        on every process, the memory FSDP exists to save (the sum is the same either way)."""
        if self.engine is not None:
            return self._deepspeed_accumulating()
        if self.accelerator is None or self.sharding is not None or self.sync_each_batch:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(model)

    @contextlib.contextmanager
    def _deepspeed_accumulating(self):
        """DeepSpeed: a micro-batch that is not the step's last is no accumulation boundary. accelerate's DeepSpeed
        ``backward`` marks the boundary and runs ``engine.step()`` (clip, update, zero) whenever its
        ``sync_gradients`` is true, which it is unless told otherwise (transformers sets it per micro-batch): the
        window's end, not the engine's own micro-step count, decides, so a shortened window (an epoch's last)
        steps where cadence's loop steps."""
        state = self.accelerator.gradient_state
        state._set_sync_gradients(False)
        try:
            yield
        finally:
            state._set_sync_gradients(True)

    def autocast(self):
        """``torch.autocast`` in the mixed-precision dtype, else nothing."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    @property
    def forward_autocasts(self) -> bool:
        """Whether mixed precision lives in the prepared model's forward (``autocast_forward``) rather than
        around the whole loss: always with ``bf16``/``fp16``, except under FSDP."""
        return self.amp_dtype is not None and self.sharding is None

    def loss_context(self):
        """The context the Trainer runs ``compute_loss`` in: nothing when the forward autocasts itself (the outputs
        are float32, as accelerate gives them to transformers), else ``autocast``."""
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
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        if self.accelerator is None:
            loss.backward()
        elif self.engine is not None:
            # one normalisation: the engine would divide each micro-batch's loss by gradient_accumulation_steps, but
            # the loop's micro-batch losses already sum to the step's loss over all its items (times the process
            # count, which the engine's gradient averaging divides back), so it must not (transformers passes the
            # same). The boundary (no_sync) decides whether this backward ends the step: then the engine clips,
            # steps and zeroes inside it
            self.accelerator.backward(loss, scale_wrt_gas=False)
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
        if optimizer is not None and optimizer is self.fused_optimizer:  # clipped inside backward, gradients used up
            norms = getattr(optimizer, "grad_norms", None)  # the per-parameter norms of its last norm pass
            return torch.linalg.vector_norm(norms) if torch.is_tensor(norms) else torch.zeros((), device=self.device)
        if self.scaler is not None and optimizer is not None:
            self.scaler.unscale_(optimizer)
        if self.sharding is not None:
            return self.sharding.clip_grad_norm(parameters, max_norm)
        if self.engine is not None:  # clipped inside the engine's step (gradient_clipping = max_grad_norm)
            return torch.tensor(self.engine.get_global_grad_norm() or 0.0, device=self.device)
        if self.accelerator is None:
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return self.accelerator.clip_grad_norm_(parameters, max_norm)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer; False when loss scaling found inf/NaN gradients and skipped the step.

        Without a scaler this never reads anything from the device (no host sync).
        """
        if self.engine is not None:  # the engine stepped in backward at the window's end
            return bool(self.engine.was_step_applied())
        if optimizer is not None and optimizer is self.fused_optimizer:  # updated inside backward (its step() raises)
            optimizer._opt_called = True  # what step() marks: torch's scheduler warns of a skipped step otherwise
            return True
        if self.scaler is None:
            optimizer.step()
            return True
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)  # reads the inf check on the host anyway: the comparison costs nothing more
        self.scaler.update()
        return self.scaler.get_scale() >= scale  # the scale backs off exactly when the step was skipped

    def empty_cache(self) -> None:
        """Return the device's cached free memory to the driver (``torch_empty_cache_steps``); nothing on a CPU."""
        empty_cache(self.device)

    def free_memory(self) -> None:
        """After an out-of-memory error: see :func:`free_memory`."""
        free_memory(self.device)

    def pin_memory(self, requested: bool) -> bool:
        """Whether dataloaders pin host memory: when ``requested`` (``dataloader_pin_memory``) and the batches go to a
        CUDA device, the only kind whose copies pinned pages speed up (on a CPU they would only cost)."""
        return requested and self.device.type == "cuda"

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
        """Concatenate along dim 0 over processes, in process order (over data-parallel ranks: the processes of a
        tensor-parallel group hold the same rows, kept once)."""
        if self.accelerator is None:
            return tensor
        copies = self.world_size // self.data_parallel_size
        gathered = self.accelerator.gather(tensor)
        if copies == 1:
            return gathered
        # equal shapes on every process (accelerate's gather needs them): one block per process, the first of each group
        return _map_tensors(lambda t: t.reshape(self.world_size, -1, *t.shape[1:])[::copies].flatten(0, 1)
                            if t.dim() else t, gathered)

    def pad_across_processes(self, tensor: Any, dim: int = 1, pad_index: int = -100) -> Any:
        """Pad ``dim`` to the largest size over processes (a collective), so the tensors can be gathered."""
        if self.accelerator is None:
            return tensor
        return self.accelerator.pad_across_processes(tensor, dim=dim, pad_index=pad_index)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of process ``src`` on every process (picklable; a collective: every process must call it)."""
        if self.accelerator is None:
            return obj
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([obj], from_process=src)[0]

    def gather_object(self, obj: Any) -> list:
        """Every process's ``obj`` (picklable), in process order (a collective: every process must call it)."""
        if self.accelerator is None:
            return [obj]
        gathered: list = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, obj)
        return gathered[:: self.world_size // self.data_parallel_size]  # once per tensor-parallel group

    def barrier(self) -> None:
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()

    def end(self) -> None:
        """Destroy the process group (accelerate's ``end_training``); nothing with one process."""
        if self.accelerator is not None:
            self.accelerator.end_training()

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

    # ---------------------------------------------------------------- checkpoints (collectives under FSDP)

    def model_state_dict(self, model: torch.nn.Module, folder: str | os.PathLike, full: bool = False,
                         pending: list | None = None) -> dict | None:
        """The weights to write into ``folder``, called by every process (FSDP gathers them).

        Returns None when the model's own ``state_dict`` is the one to save (no sharding); under FSDP the
        consolidated full state on the saving process (``{}`` on the others), or ``{}`` once every process
        wrote its shard into ``folder`` (``state_dict_type`` sharded, unless ``full``). With a ``pending`` list
        (an asynchronous save) the shards are copied to the CPU here, and their write is appended to ``pending``
        for the writer's thread to call (it returns once every process's shards and DCP's metadata are written).
        """
        if self.engine is not None:
            if not full:  # DeepSpeed's own format (global_step*/, latest): every process its partitions
                self.engine.save_checkpoint(str(folder))
            try:  # ZeRO-3 consolidates only with stage3_gather_16bit_weights_on_model_save
                return self.accelerator.get_state_dict(self.engine)
            except ValueError:
                if full:  # save_model(): DeepSpeed's files instead, as transformers writes them
                    logger.warning("ZeRO-3 without stage3_gather_16bit_weights_on_model_save: %s gets DeepSpeed's "
                                   "checkpoint instead of model.safetensors; its zero_to_fp32.py recovers the weights",
                                   folder)
                    self.engine.save_checkpoint(str(folder))
                return {}
        if self.sharding is None:
            return None
        return self.sharding.model_state_dict(model, Path(folder), full, pending)

    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | os.PathLike,
                             pending: list | None = None) -> dict | None:
        """The optimizer state for ``optimizer.pt``, called by every process: ``optimizer.state_dict()``'s format
        (parameters numbered in group order) whatever the engine, so one process can resume it; None when
        every process wrote its shard into ``folder`` instead (FSDP, ``state_dict_type`` sharded; in the
        background with a ``pending`` list, as :meth:`model_state_dict`)."""
        if self.engine is not None:
            return None  # inside DeepSpeed's checkpoint
        if self.sharding is None:
            return optimizer.state_dict()
        return self.sharding.optimizer_state_dict(model, optimizer, Path(folder), pending)

    def load_model_weights(self, model: torch.nn.Module, folder: str | os.PathLike) -> None:
        """Put the weights saved in ``folder`` into ``model`` (every process; full or sharded).

        Under DeepSpeed, a folder with DeepSpeed's files (``latest``) is read by the engine once it exists; before
        that (``train(resume_from_checkpoint=...)`` loads the weights before the engine is made) from its
        ``model.safetensors`` if it has one, and else not at all: the engine's full load at the resume
        (:meth:`load_optimizer_state`) restores the weights with the optimizer (ZeRO-3 writes no consolidated
        weights without ``stage3_gather_16bit_weights_on_model_save``)."""
        # latest, or latest_universal: DeepSpeed's files, read by an engine (checked first) whenever one exists
        deepspeed_files = (self.deepspeed is not None or self.engine is not None) and has_tag_file(folder)
        if deepspeed_files and self.engine is not None:
            check_deepspeed_folder(folder)  # DeepSpeed unpickles its files with weights_only=False: checked first
            self.engine.load_checkpoint(str(folder), load_module_only=True)
        elif deepspeed_files and not formats.weights_files(folder):
            logger.debug("%s: no consolidated weights; DeepSpeed's engine loads them at the resume", folder)
        elif self.sharding is None:
            formats.load_model_weights(self.unwrap(model), folder)
        else:
            self.sharding.load_model_weights(model, Path(folder))

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | os.PathLike) -> None:
        """Restore the optimizer saved in ``folder`` (every process; full ``optimizer.pt`` or shards)."""
        if self.engine is not None:
            check_deepspeed_folder(folder)  # as in load_model_weights: no file of it may run code
            self.engine.load_checkpoint(str(folder))  # weights and partitioned optimizer state, DeepSpeed's format
        elif self.sharding is None:
            optimizer.load_state_dict(formats.safe_load(Path(folder) / formats.OPTIMIZER_NAME))
        else:
            self.sharding.load_optimizer_state(model, optimizer, Path(folder))


_COMPILED = "_cadence_compiled"  # set on a module compiled in place, so it is compiled once
_AUTOCAST_FORWARD = "_cadence_autocast_forward"  # set on a module whose forward autocast_forward wrapped
