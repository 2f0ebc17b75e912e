"""The only module that knows how processes and devices are run (accelerate over torch.distributed).

The loop asks verbs (``prepare_model``, ``no_sync``, ``autocast``, ``backward``, ``clip_grad_norm``,
``optimizer_step``, ``reduce_mean``, ``gather``, ``broadcast_object``, ``unwrap``, ``barrier``, and for checkpoints
``model_state_dict``, ``optimizer_state_dict``, ``load_model_weights``, ``load_optimizer_state``) and never
asks which engine is underneath; ``pin_memory``, ``empty_cache`` and ``free_memory`` answer for its device. Code
with no ``Backend`` at hand (arguments, checkpoints, samplers, callbacks) asks this module's functions instead:
``default_device``, ``accelerator_available``, ``device_rng_state``/``set_device_rng_state``, ``peak_flops``,
``process_group_size_and_rank``, ``any_process``. No other module calls torch.cuda or torch.distributed.
``AcceleratorView`` is ``trainer.accelerator``: accelerate's ``Accelerator`` methods for subclasses, on one
process or several.

A single process gets no wrapper at all: no DDP module, no optimizer wrapper, no accelerate dataloader; the model
is only moved to the device. Several processes (``torchrun``/``accelerate launch``) go through
accelerate's ``Accelerator``, with its gradient accumulation left at 1: cadence normalises the loss
of a step itself, once, over the items of all processes (see ``loss.py``).

Mixed precision is owned here too, the same way on one process or several, as accelerate does it: ``bf16``/``fp16``
run the model's forward under ``torch.autocast`` and hand its outputs back in float32 (``prepare_model`` wraps the
module's ``forward``, so a loss a subclass computes from the outputs is float32 as in transformers; FSDP, whose
``MixedPrecisionPolicy`` casts the parameters, autocasts forward and loss instead); weights stay float32; ``fp16`` adds a
``torch.amp.GradScaler``: ``backward`` scales the loss, ``clip_grad_norm`` unscales first,
``optimizer_step`` skips a step whose gradients hold inf/NaN and returns False so that the schedule does
not advance. An optimizer that updates inside backward (LOMO/AdaLomo: ``fused_backward``) is driven by the same
verbs: ``backward`` runs its update with the current lr, ``optimizer_step`` does nothing, ``clip_grad_norm`` reports
the norm it clipped by; the loop does not know. ``tf32=True`` needs a CUDA device of compute capability >= 8 (an error elsewhere, as in
transformers); ``tf32=False`` turns it off on CUDA and does nothing on a CPU.

FSDP (``fsdp``/``fsdp_config`` as transformers spells them, or ``accelerate launch`` with an FSDP config file)
is torch's FSDP2 ``fully_shard``, configured through accelerate's ``FullyShardedDataParallelPlugin``
(``fsdp_version=2``) and applied here, on every device type, so the same code runs on CPUs (gloo) and
GPUs; accelerate's own FSDP path only runs on accelerators. See ``_FullyShard``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import logging
import os
import sys
import types
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch

from .checkpoint import formats
from .checkpoint.deepspeed_files import check_deepspeed_folder
from .checkpoint.sharded import load_dcp

logger = logging.getLogger(__name__)


def _destroy_process_group() -> None:
    """End the process group cadence started (at exit): its gloo/NCCL threads stop before the interpreter
    tears down, instead of "terminate called without an active exception" after the work is done."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # a Trainer lives in reference cycles: collect the unreachable ones now, so their DDP wrappers
        # release the group here, not at some point of the interpreter's teardown
        gc.collect()
        torch.distributed.destroy_process_group()


def _end_at_exit_if_started(start: Callable[[], Any]) -> Any:
    """Run ``start`` (which may create the process group); a group it created is ours to end at exit: one left to
    the interpreter's teardown can abort the process. Whichever of ``main_process_first`` and ``Backend`` comes
    first creates the group, so both come through here."""
    started_here = not torch.distributed.is_initialized()
    result = start()
    if started_here and torch.distributed.is_initialized():
        atexit.unregister(_destroy_process_group)  # once, however many times a group is started
        atexit.register(_destroy_process_group)
    return result


def _process_group_options(args: Any) -> dict[str, Any]:
    """``init_process_group``'s options for this run, the same wherever the group is started (``Backend``,
    ``main_process_first``, ``trainer.accelerator``): ``ddp_backend``, ``ddp_timeout`` and, in a job torchrun
    restarted on one node, a rendezvous of this attempt's own (see ``_attempt_rendezvous``)."""
    options: dict[str, Any] = {"backend": args.ddp_backend, "timeout": timedelta(seconds=args.ddp_timeout)}
    if _restarted_on_torchruns_shared_store():
        from torch.distributed.rendezvous import register_rendezvous_handler

        with contextlib.suppress(RuntimeError):  # registered already (torch refuses a second registration)
            register_rendezvous_handler(_ATTEMPT_SCHEME, _attempt_rendezvous)
        options["init_method"] = f"{_ATTEMPT_SCHEME}://"
    return options


_ATTEMPT_SCHEME = "cadence-torchrun-attempt"


def _restarted_on_torchruns_shared_store() -> bool:
    """A worker torchrun restarted (``TORCHELASTIC_RESTART_COUNT > 0``) on one node, whose process group would be
    set up through the agent's TCPStore. torchrun keeps that one store for every attempt of the job (torch 2.13
    here), and gloo's and NCCL's setup keys carry no attempt: a restarted rank that reads its peer's key before the
    peer wrote it again gets the address of the killed attempt's process, and the connect fails ("Connection
    refused", "Connect timeout"; torch issue 135712). The attempt count is the same for every worker of one agent,
    so on one node it names the attempt for all of them; across nodes each agent counts its own restarts."""
    env = os.environ
    return (env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and env.get("GROUP_WORLD_SIZE") == "1"
            and env.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"))


def _attempt_rendezvous(url: str, **kwargs: Any):
    """torch's ``env://`` rendezvous, with the store's keys under this attempt's own prefix: the process group's
    setup never reads a key a killed attempt left in torchrun's store."""
    from torch.distributed.rendezvous import rendezvous

    store, rank, world_size = next(rendezvous("env" + url[len(_ATTEMPT_SCHEME):], **kwargs))
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    yield torch.distributed.PrefixStore(f"cadence/torchrun_attempt_{attempt}", store), rank, world_size


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
            if "optimizer" in self.deepspeed or "scheduler" in self.deepspeed:
                raise ValueError(
                    "the DeepSpeed config has an optimizer/scheduler section: cadence builds both from TrainingArguments "
                    "(optim, learning_rate, lr_scheduler_type, ...) and DeepSpeed wraps them; remove those sections"
                )
        if self.world_size > 1 or self.deepspeed is not None:
            from accelerate import Accelerator
            from accelerate.utils import DeepSpeedPlugin, DistributedDataParallelKwargs, InitProcessGroupKwargs

            ddp = DistributedDataParallelKwargs(
                find_unused_parameters=bool(args.ddp_find_unused_parameters),
                broadcast_buffers=True if args.ddp_broadcast_buffers is None else args.ddp_broadcast_buffers,
                static_graph=bool(args.ddp_static_graph),
                **({"bucket_cap_mb": args.ddp_bucket_cap_mb} if args.ddp_bucket_cap_mb else {}),
            )
            init = InitProcessGroupKwargs(**_process_group_options(args))
            engine = {"deepspeed_plugin": DeepSpeedPlugin(hf_ds_config=self.deepspeed)} if self.deepspeed else {}
            self.accelerator = _end_at_exit_if_started(
                lambda: Accelerator(cpu=_on_cpu(args), kwargs_handlers=[ddp, init], **engine,
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

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module: without the DDP wrapper, and without torch.compile's (``_orig_mod``) if given one."""
        model = model if self.accelerator is None else self.accelerator.unwrap_model(model)
        return getattr(model, "_orig_mod", model)

    def no_sync(self, model: torch.nn.Module):
        """Skip the gradient all-reduce for a micro-batch that is not the last of its step.

        FSDP reduce-scatters every micro-batch instead: skipping it would keep whole unsharded gradients
        on every process, the memory FSDP exists to save (the sum is the same either way)."""
        if self.accelerator is None or self.sharding is not None or self.engine is not None or self.sync_each_batch:
            return contextlib.nullcontext()  # DeepSpeed counts the accumulation window itself
        return self.accelerator.no_sync(model)

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
        elif self.engine is not None:  # the loop already normalised over the window: DeepSpeed must not divide again
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
        """Put the weights saved in ``folder`` into ``model`` (every process; full or sharded)."""
        if self.engine is not None and (Path(folder) / "latest").exists():
            check_deepspeed_folder(folder)  # DeepSpeed unpickles its files with weights_only=False: checked first
            self.engine.load_checkpoint(str(folder), load_module_only=True)
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


class AcceleratorView:
    """``trainer.accelerator``: accelerate's ``Accelerator`` methods that subclasses call, acting on cadence's processes.

    transformers' subclasses and callers use ``trainer.accelerator`` (``gather``, ``unwrap_model``, ``is_main_process``,
    ``backward``, ...). cadence gives a single process no ``Accelerator`` at all (nothing to wrap: that is part of its
    speed), so this view answers those methods from the ``Backend`` on one process and hands them to the run's real
    ``Accelerator`` on several; any other attribute (``state``, ``split_between_processes``, ...) is the real one's, or
    on one process accelerate's ``PartialState``'s. ``backward``, ``autocast`` and ``clip_grad_norm_`` go through the
    Backend, so cadence's mixed precision and loss scaling apply to a subclass's own step as to the loop's. The loop
    never calls it: it costs nothing unless used.

    Args:
        backend: the Trainer's ``Backend``.

    Example:
        >>> class MyTrainer(Trainer):
        ...     def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ...         seen = self.accelerator.gather(inputs["labels"]).numel()  # over all processes
        ...         return self.accelerator.unwrap_model(model)(**inputs).loss
    """

    def __init__(self, backend: Backend):
        self._backend = backend
        self._even_batches = True  # what a subclass assigns on one process (cadence's eval batches are marked)

    @property
    def _accelerator(self):
        return self._backend.accelerator

    # --------------------------------------------------------- accelerate's state, as transformers' Accelerator has it
    @property
    def state(self):
        """accelerate's ``AcceleratorState`` of the run (initialised on one process too, so accelerate's own helpers,
        such as ``set_seed(seed, device_specific=True)``, work); ``state.deepspeed_plugin`` is None without DeepSpeed."""
        return self._accelerator.state if self._accelerator is not None else accelerate_state(self._backend._args)

    @property
    def parallelism_config(self):
        """accelerate's ``ParallelismConfig`` of the run: None unless tensor/context parallelism is set up."""
        return getattr(self._accelerator, "parallelism_config", None)

    @property
    def dataloader_config(self):
        """accelerate's ``DataLoaderConfiguration`` (cadence shards batches itself; a subclass may set its fields)."""
        if self._accelerator is not None:
            return self._accelerator.dataloader_config
        if getattr(self, "_dataloader_config", None) is None:
            from accelerate.utils import DataLoaderConfiguration

            self._dataloader_config = DataLoaderConfiguration()
        return self._dataloader_config

    @property
    def even_batches(self) -> bool:
        return self._accelerator.even_batches if self._accelerator is not None else self._even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        if self._accelerator is not None:
            self._accelerator.even_batches = value
        self._even_batches = value

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> torch.nn.Module:
        """A model the trainer does not train (a reference or teacher model): on the device, and with
        ``evaluation_mode=False`` wrapped for the run's processes by accelerate; on one process just moved."""
        self._backend.autocast_forward(model)  # accelerate's mixed precision, as for the trained model
        if self._accelerator is not None:
            return self._accelerator.prepare_model(model, device_placement=device_placement,
                                                   evaluation_mode=evaluation_mode)
        return model.to(self._backend.device) if device_placement is not False else model

    def prepare(self, *objects: Any, device_placement: list[bool] | None = None) -> Any:
        """accelerate's ``prepare``: on several processes the real one; on one, models moved to the device and
        everything else (dataloaders, optimizers, schedulers) returned as it is (cadence's loaders are sharded)."""
        if self._accelerator is not None:
            return self._accelerator.prepare(*objects, device_placement=device_placement)
        placed = tuple(self.prepare_model(o) if isinstance(o, torch.nn.Module) else o for o in objects)
        return placed[0] if len(placed) == 1 else placed

    # --------------------------------------------------------- who and where
    @property
    def device(self) -> torch.device:
        return self._backend.device

    @property
    def num_processes(self) -> int:
        return self._backend.world_size

    @property
    def process_index(self) -> int:
        return self._backend.process_index

    @property
    def local_process_index(self) -> int:
        return self._backend.local_process_index

    @property
    def is_main_process(self) -> bool:
        return self._backend.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self._backend.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self._backend.process_index == self._backend.world_size - 1

    @property
    def use_distributed(self) -> bool:
        return self._backend.world_size > 1

    @property
    def distributed_type(self):
        if self._accelerator is not None:
            return self._accelerator.distributed_type
        from accelerate.utils import DistributedType

        return DistributedType.NO

    @property
    def mixed_precision(self) -> str:
        """``"bf16"``/``"fp16"`` when cadence runs the forward under autocast, else ``"no"``."""
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self._backend.amp_dtype, "no")

    @property
    def gradient_accumulation_steps(self) -> int:
        return 1  # cadence accumulates itself; accelerate's own accumulation stays at 1

    @property
    def sync_gradients(self) -> bool:
        return True

    # --------------------------------------------------------- collectives (every process must call them)
    def gather(self, tensor: Any) -> Any:
        """Concatenate ``tensor`` (or nested tensors) along dim 0 over processes; unchanged on one process."""
        return tensor if self._accelerator is None else self._accelerator.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        return input_data if self._accelerator is None else self._accelerator.gather_for_metrics(input_data, use_gather_object)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Sum (``"sum"``), average (``"mean"``) or keep (``"none"``) over processes; a copy on one process."""
        if self._accelerator is None:
            return _map_tensors(lambda t: t.clone(), tensor)  # accelerate also returns a copy, unscaled
        return self._accelerator.reduce(tensor, reduction=reduction, scale=scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        if self._accelerator is None:
            return tensor
        return self._accelerator.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def wait_for_everyone(self) -> None:
        self._backend.barrier()

    # --------------------------------------------------------- the model and its step
    def unwrap_model(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> torch.nn.Module:
        """The user's module without the DDP wrapper (and without torch.compile's unless ``keep_torch_compile``)."""
        if self._accelerator is not None:
            return self._accelerator.unwrap_model(model, keep_fp32_wrapper=keep_fp32_wrapper,
                                                  keep_torch_compile=keep_torch_compile)
        compiled = getattr(model, "_orig_mod", None)
        inner = model if compiled is None else compiled
        while isinstance(inner, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            inner = inner.module  # a user's own nn.DataParallel, unwrapped as accelerate unwraps it
        if compiled is None or not keep_torch_compile:
            return inner
        model._orig_mod = inner
        return model

    def autocast(self, autocast_handler: Any = None):
        """cadence's forward context (autocast with ``bf16``/``fp16``); a handler with ``enabled=False`` turns it off."""
        if autocast_handler is not None and not getattr(autocast_handler, "enabled", True):
            return contextlib.nullcontext()
        return self._backend.autocast()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()`` with cadence's loss scaling (fp16) and DDP; the loss is not divided by anything."""
        self._backend.backward(loss)

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        if norm_type != 2:
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
        return self._backend.clip_grad_norm(parameters, max_norm)

    def no_sync(self, model: torch.nn.Module):
        return self._backend.no_sync(model)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_backend":  # copy/pickle probes; a half-built view
            raise AttributeError(name)
        target = self._accelerator if self._accelerator is not None else self._partial_state()
        try:
            return getattr(target, name)
        except AttributeError:
            raise AttributeError(
                f"trainer.accelerator has no attribute {name!r}: it is accelerate's {type(target).__name__} here "
                f"({self.num_processes} process(es)), which has none either"
            ) from None

    def _partial_state(self):
        """accelerate's process state with the run's settings (what ``main_process_first`` creates too)."""
        return process_state(self._backend._args)


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


# what torch.distributed's transports say when a peer is gone or silent (gloo raises plain RuntimeErrors)
_COLLECTIVE_FAILURES = ("connection closed by peer", "connection reset by peer", "timed out", "timeout", "gloo", "nccl",
                        "broken pipe", "socket")


def _is_collective_failure(error: BaseException) -> bool:
    dist_error = getattr(torch.distributed, "DistError", ())
    if dist_error and isinstance(error, dist_error):
        return True
    return isinstance(error, RuntimeError) and any(word in str(error).lower() for word in _COLLECTIVE_FAILURES)


def process_state(args: Any):
    """accelerate's ``PartialState`` with the run's settings (``TrainingArguments.distributed_state``)."""
    from accelerate import PartialState

    return _end_at_exit_if_started(lambda: PartialState(cpu=_on_cpu(args), **_process_group_options(args)))


def _on_cpu(args: Any) -> bool:
    """Whether accelerate is told ``cpu=True``: with ``use_cpu``, and on a machine without a GPU, where accelerate
    (1.16) would otherwise set up no distributed state at all under torchrun (each process then trains alone, its
    reductions doing nothing: transformers' runs have that bug)."""
    return args.use_cpu or not accelerator_available()


def require_configured_state(args: Any) -> None:
    """``accelerator_config={"use_configured_state": True}``: on several processes accelerate's state must exist
    already (transformers' rule); it is then the run's ``distributed_state``. One process needs none: cadence never
    resets the state, so there is nothing to keep (sentence-transformers builds such arguments inside its Trainer)."""
    from accelerate import PartialState

    if not PartialState._shared_state and args.world_size > 1:
        raise ValueError(
            "accelerator_config use_configured_state=True is invalid here: no accelerate PartialState or "
            "AcceleratorState was created before the TrainingArguments; create one first (accelerate.PartialState()) "
            "or remove use_configured_state")
    if args.deepspeed and PartialState().distributed_type.value != "DEEPSPEED":
        raise ValueError("accelerator_config use_configured_state=True with deepspeed is invalid: the configured "
                         "accelerate state was not set up for DeepSpeed; remove use_configured_state")


def accelerator_kwargs(args: Any, model: torch.nn.Module, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments transformers' Trainer gives accelerate's ``Accelerator`` for ``args`` and ``model``
    (``Trainer._build_accelerator_args``, for subclasses that read or extend them). cadence's own ``Accelerator``
    (several processes or DeepSpeed) takes only what its data loading and exact loss allow; this is transformers'
    view, value for value.

    Args:
        args: the run's ``TrainingArguments``.
        model: the model (transformers decides DDP's ``find_unused_parameters`` from it).
        overrides: entries replacing the computed ``mixed_precision``, ``deepspeed_plugin``, ``dataloader_config``,
            ``fsdp_plugin`` or ``gradient_accumulation_plugin``, as transformers' ``**kwargs``.

    Returns:
        ``mixed_precision``, ``deepspeed_plugin``, ``dataloader_config`` (accelerator_config's four loader options,
        ``data_seed``, ``non_blocking``), ``fsdp_plugin`` (None: cadence shards with torch's ``fully_shard``
        itself), ``gradient_accumulation_plugin`` (accelerate accumulates 1 step: the loop accumulates),
        ``kwargs_handlers`` (DDP's options), ``dynamo_plugin`` and, when set, ``parallelism_config``.
    """
    from accelerate.utils import (DataLoaderConfiguration, DistributedDataParallelKwargs,
                                  GradientAccumulationPlugin, TorchDynamoPlugin)

    config = args.accelerator_config
    loader_config = DataLoaderConfiguration(split_batches=config.split_batches,
                                            dispatch_batches=config.dispatch_batches,
                                            even_batches=config.even_batches,
                                            use_seedable_sampler=config.use_seedable_sampler)
    loader_config.data_seed, loader_config.non_blocking = args.data_seed, config.non_blocking
    accumulation = {**(config.gradient_accumulation_kwargs or {}), "num_steps": 1}  # num_steps was applied to args
    precision = "fp16" if args.fp16 else "bf16" if args.bf16 else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    kwargs = {"mixed_precision": precision, "deepspeed_plugin": args.deepspeed_plugin,
              "dataloader_config": loader_config, "fsdp_plugin": None,
              "gradient_accumulation_plugin": GradientAccumulationPlugin(**accumulation), **overrides}
    find_unused = args.ddp_find_unused_parameters
    if find_unused is None:  # transformers' rule: a transformers model knows whether it checkpoints activations
        hf = sys.modules.get("transformers")  # a transformers model implies the module is loaded
        pretrained = hf is not None and isinstance(model, hf.PreTrainedModel)
        find_unused = not (getattr(model, "is_activation_checkpointing", False) or args.activation_checkpointing) \
            if pretrained else True
    ddp = {"find_unused_parameters": find_unused}
    for name, value in (("bucket_cap_mb", args.ddp_bucket_cap_mb), ("broadcast_buffers", args.ddp_broadcast_buffers),
                        ("static_graph", args.ddp_static_graph)):
        if value is not None:
            ddp[name] = value
    kwargs["kwargs_handlers"] = [DistributedDataParallelKwargs(**ddp)]
    if args.parallelism_config is not None:
        kwargs["parallelism_config"] = args.parallelism_config
    tp_size = getattr(model, "tp_size", None) or 1
    if tp_size > 1:  # sharded when loaded (tp_plan): accelerate needs the model's layout
        from accelerate import ParallelismConfig

        dp_size = model.config.distributed_config.dp_size
        if kwargs.get("parallelism_config") is None:
            kwargs["parallelism_config"] = ParallelismConfig(tp_size=tp_size, dp_shard_size=dp_size)
        else:
            kwargs["parallelism_config"].tp_size, kwargs["parallelism_config"].dp_shard_size = tp_size, dp_size
    kwargs["dynamo_plugin"] = TorchDynamoPlugin(backend=args.torch_compile_backend, mode=args.torch_compile_mode)
    return kwargs


def accelerate_state(args: Any):
    """accelerate's ``AcceleratorState`` on one process, as transformers' ``Accelerator`` leaves it: libraries built on
    the Trainer call accelerate's helpers that read it (``set_seed(seed, device_specific=True)``)."""
    from accelerate.state import AcceleratorState

    process_state(args)  # the process group with the run's options, before AcceleratorState reuses it
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "no"
    # _from_accelerator: accelerate refuses to build it outside an Accelerator, which one process here never makes
    from accelerate.utils import TorchDynamoPlugin

    shared = AcceleratorState._shared_state
    if shared and (shared.get("_mixed_precision") != precision or shared.get("device") != args.device):
        # an earlier run in this process set it otherwise; transformers resets it for each run's arguments too
        AcceleratorState._reset_state()
    return AcceleratorState(cpu=_on_cpu(args), mixed_precision=precision, dynamo_plugin=TorchDynamoPlugin(),
                            _from_accelerator=True)


def main_process_first(args: Any, local: bool = True):
    """accelerate's "main process goes first" barrier (``TrainingArguments.main_process_first``).

    accelerate's process state is created here with the run's ``ddp_backend`` and ``ddp_timeout``, the same
    ones ``Backend``'s ``Accelerator`` asks for; whichever comes first creates it, the other reuses it.
    """
    state = process_state(args)
    return state.local_main_process_first() if local else state.main_process_first()


# device type -> how to release its allocator's cache (a CPU has none to release)
_EMPTY_CACHE = {
    "cuda": lambda: torch.cuda.empty_cache(),
    "mps": lambda: torch.mps.empty_cache(),
    "xpu": lambda: torch.xpu.empty_cache(),
}

_COMPILED = "_cadence_compiled"  # set on a module compiled in place, so it is compiled once
_AUTOCAST_FORWARD = "_cadence_autocast_forward"  # set on a module whose forward autocast_forward wrapped

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


# ------------------------------------------------------------------ device verbs for code with no Backend at hand


def accelerator_available() -> bool:
    """Whether a CUDA GPU is visible: the device a process trains on unless ``use_cpu`` (see :func:`default_device`)."""
    return torch.cuda.is_available()


def bf16_gpu_available() -> bool:
    """Whether the GPU a process trains on without ``use_cpu`` computes in bfloat16 (transformers' test: a CUDA GPU
    whose torch says it supports bfloat16)."""
    return accelerator_available() and torch.cuda.is_bf16_supported()


def default_device(use_cpu: bool = False, local_process_index: int = 0) -> torch.device:
    """The device of one process (``TrainingArguments.device``; a single-process ``Backend`` runs on it, and
    accelerate picks the same one for each of several): ``cpu`` with ``use_cpu`` or without a GPU, else
    ``cuda:<local_process_index>``.

    Example:
        >>> default_device(use_cpu=True)
        device(type='cpu')
    """
    if use_cpu or not accelerator_available():
        return torch.device("cpu")
    return torch.device("cuda", local_process_index)


def empty_cache(device: torch.device) -> None:
    """Return ``device``'s cached free memory to its driver; nothing on a CPU."""
    release = _EMPTY_CACHE.get(device.type)
    if release is not None:
        release()


def free_memory(device: torch.device | None = None) -> None:
    """After an out-of-memory error: collect the failed attempt's tensors and return the device's cached memory
    to its driver, so that a retry with a smaller batch can use it. ``device`` None: :func:`default_device`."""
    gc.collect()
    empty_cache(device or default_device())


# device type -> (allocated bytes, peak allocated bytes since the last reset or None, reset the peak)
_MEMORY_STATS = {
    "cuda": (lambda d: torch.cuda.memory_allocated(d), lambda d: torch.cuda.max_memory_allocated(d),
             lambda d: torch.cuda.reset_peak_memory_stats(d)),
    "xpu": (lambda d: torch.xpu.memory_allocated(d), lambda d: torch.xpu.max_memory_allocated(d),
            lambda d: torch.xpu.reset_peak_memory_stats(d)),
    "mps": (lambda d: torch.mps.current_allocated_memory(), lambda d: None, lambda d: None),  # mps keeps no peak
}


def device_memory(device: torch.device) -> tuple[int, int | None] | None:
    """``(allocated, peak)`` bytes of the tensors on ``device`` (the peak since :func:`reset_device_peak_memory`,
    None where the device keeps none); None on a CPU, whose memory the process's resident size tells."""
    stats = _MEMORY_STATS.get(device.type)
    if stats is None:
        return None
    return stats[0](device), stats[1](device)


def reset_device_peak_memory(device: torch.device) -> None:
    """Start ``device``'s peak-memory count afresh (for :func:`device_memory`); nothing on a CPU."""
    stats = _MEMORY_STATS.get(device.type)
    if stats is not None:
        stats[2](device)


def copies_done_event() -> Any:
    """An event recorded on the current CUDA stream after non-blocking device-to-host copies (a checkpoint's
    snapshot): its ``synchronize()``, called by the writer's thread, returns once they have landed."""
    event = torch.cuda.Event()
    event.record()
    return event


def device_rng_state(all_devices: bool = False) -> dict[str, Any]:
    """The GPU entries of ``rng_state.pth``, under transformers' key: ``{"cuda": state}``, every visible GPU's
    states (a list) with ``all_devices`` (transformers' choice with several processes), else the current GPU's;
    ``{}`` without a GPU."""
    if not torch.cuda.is_available():
        return {}
    return {"cuda": torch.cuda.random.get_rng_state_all() if all_devices else torch.cuda.random.get_rng_state()}


def set_device_rng_state(state: dict[str, Any]) -> None:
    """Restore the GPU entry of an RNG state (from :func:`device_rng_state`, or transformers' file); nothing when
    it has none or this process has no GPU."""
    saved = state.get("cuda")
    if saved is None or not torch.cuda.is_available():
        return
    if isinstance(saved, (list, tuple)):
        torch.cuda.random.set_rng_state_all(saved)
    else:
        torch.cuda.random.set_rng_state(saved)


def process_group_size_and_rank() -> tuple[int, int] | None:
    """``(world size, rank)`` of the started process group, or None when none is started."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    return torch.distributed.get_world_size(), torch.distributed.get_rank()


def shard_batch_sampler(batch_sampler: Any, num_processes: int, process_index: int, even_batches: bool = True) -> Any:
    """accelerate's ``BatchSamplerShard`` over ``batch_sampler``: of every ``num_processes`` batches, process
    ``process_index`` takes its own; the last round is completed from the epoch's first indices (``even_batches``).
    What ``Accelerator.prepare`` deals a transformers Trainer's training dataloader (never ``split_batches``: cadence
    refuses it)."""
    from accelerate.data_loader import BatchSamplerShard

    return BatchSamplerShard(batch_sampler, num_processes=num_processes, process_index=process_index,
                             split_batches=False, even_batches=even_batches)


def any_process(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` is True on any process (a max all-reduce of one number on ``device``; a collective when a
    process group is started, so every process must call it); ``flag`` itself without a process group."""
    if process_group_size_and_rank() is None:
        return bool(flag)
    combined = torch.tensor([1.0 if flag else 0.0], device=device)
    torch.distributed.all_reduce(combined, op=torch.distributed.ReduceOp.MAX)
    return bool(combined.item())


# Dense (no 2:4 sparsity) bf16 tensor-core peak FLOP/s per GPU, from NVIDIA's datasheets; fp16 where
# the GPU has no bf16 (V100, T4). Keys are matched as whole words against the lower-cased
# `torch.cuda.get_device_name()` with "-" read as " ", longest key first, so "h100 nvl" wins over "h100"
# and "a10g" never matches "a100". A bare "h100"/"h200"/"v100" is the SXM part.
_PEAK_DENSE_BF16_FLOPS: dict[str, float] = {
    "b200": 2250e12,
    "h200 nvl": 835.5e12,
    "h200": 989.4e12,
    "h100 nvl": 835.5e12,
    "h100 pcie": 756.5e12,
    "h100": 989.4e12,
    "h800": 989.4e12,
    "a100": 312e12,
    "a800": 312e12,
    "l40s": 362.05e12,
    "l40": 181.05e12,
    "l4": 121e12,
    "a40": 149.7e12,
    "rtx a6000": 154.8e12,
    "a10g": 70e12,  # AWS-only part with no NVIDIA datasheet; the figure commonly quoted for it
    "a10": 125e12,
    "rtx 4090": 165.2e12,  # with fp32 accumulation, as autocast uses
    "v100s": 130e12,
    "v100 pcie": 112e12,
    "v100": 125e12,
    "t4": 65e12,
}


def _peak_flops(device_name: str) -> float | None:
    """The table's peak for a CUDA device name, or None when no key matches."""
    name = device_name.lower().replace("-", " ")
    for key in sorted(_PEAK_DENSE_BF16_FLOPS, key=len, reverse=True):
        if re.search(rf"\b{re.escape(key)}\b", name):
            return _PEAK_DENSE_BF16_FLOPS[key]
    return None


def peak_flops(device: torch.device | str) -> float | None:
    """The dense bf16 peak FLOP/s of ``device`` (one GPU) from the table above; None on a CPU, on a CUDA device
    without a runtime behind it, or on a GPU the table does not know."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        name = torch.cuda.get_device_name(device)
    except (RuntimeError, AssertionError):  # no CUDA runtime behind a "cuda" device
        return None
    peak = _peak_flops(name)
    if peak is None:
        logger.debug("No peak FLOP/s known for %r; no MFU", name)
    return peak


# ---------------------------------------------------------------------------------------------- FSDP

# transformers' `fsdp` words -> what each sets (sharding words are exclusive; "offload"/"auto_wrap" add)
_FSDP_SHARDING = {
    "full_shard": {"reshard_after_forward": True},
    "shard_grad_op": {"reshard_after_forward": False},
    "hybrid_shard": {"reshard_after_forward": True, "hybrid": True},
    "hybrid_shard_zero2": {"reshard_after_forward": False, "hybrid": True},
}
_FSDP_WORDS = (*_FSDP_SHARDING, "offload", "auto_wrap")
# fsdp_config keys cadence reads (transformers' names; an "fsdp_" prefix is accepted, as transformers does)
_FSDP_CONFIG_KEYS = (
    "version", "min_num_params", "transformer_layer_cls_to_wrap", "reshard_after_forward", "cpu_offload",
    "offload_params", "activation_checkpointing", "state_dict_type", "cpu_ram_efficient_loading",
)
# FSDP1 options that FSDP2 has no use for: accepted and ignored, so configs written for transformers still run
_FSDP1_ONLY_KEYS = ("backward_prefetch", "forward_prefetch", "use_orig_params", "sync_module_states", "limit_all_gathers", "xla")
_STATE_DICT_TYPES = {"full": "FULL_STATE_DICT", "full_state_dict": "FULL_STATE_DICT",
                     "sharded": "SHARDED_STATE_DICT", "sharded_state_dict": "SHARDED_STATE_DICT"}


def _fsdp_words(fsdp: Any) -> list[str]:
    if fsdp in (None, False, "", []):
        return []
    if fsdp is True:
        return ["full_shard"]
    words = fsdp.split() if isinstance(fsdp, str) else [str(getattr(w, "value", w)) for w in fsdp]
    unknown = [w for w in words if w not in _FSDP_WORDS]
    if unknown:
        hint = " ('no_shard' is plain data parallelism: leave fsdp unset)" if "no_shard" in unknown else ""
        raise ValueError(f"fsdp={fsdp!r} is invalid: {unknown} unknown{hint}; use words from {list(_FSDP_WORDS)}, "
                         "e.g. fsdp='full_shard auto_wrap'")
    if sum(w in _FSDP_SHARDING for w in words) > 1:
        raise ValueError(f"fsdp={fsdp!r} is invalid: it names more than one sharding strategy; keep one of {list(_FSDP_SHARDING)}")
    return words


def _fsdp_config(args: Any) -> dict[str, Any]:
    raw = args.fsdp_config
    if isinstance(raw, str):  # a JSON file (a JSON string was parsed by TrainingArguments)
        import json

        with open(raw) as f:
            raw = json.load(f)
    config = {k.removeprefix("fsdp_"): v for k, v in (raw or {}).items()}
    unknown = [k for k in config if k not in _FSDP_CONFIG_KEYS + _FSDP1_ONLY_KEYS]
    if unknown:
        raise ValueError(f"fsdp_config has unknown keys {unknown}; cadence reads {list(_FSDP_CONFIG_KEYS)}")
    if _fsdp_config_int(config, "version", 2) != 2:
        raise ValueError(f"fsdp_config version={config['version']!r} is invalid: cadence runs FSDP2 only; set version=2")
    _fsdp_config_int(config, "min_num_params", 0)
    if config.get("xla"):
        raise ValueError("fsdp_config xla=True is invalid: cadence has no XLA/TPU support; remove it")
    kind = str(config.get("state_dict_type", "full")).lower()
    if kind not in _STATE_DICT_TYPES:
        raise ValueError(f"fsdp_config state_dict_type={config['state_dict_type']!r} is invalid; use 'FULL_STATE_DICT' or 'SHARDED_STATE_DICT'")
    config["state_dict_type"] = _STATE_DICT_TYPES[kind]
    return config


def _fsdp_config_int(config: dict[str, Any], key: str, default: int) -> int:
    """A whole number >= 0 from fsdp_config (JSON may hold "2"); anything else names the key, not int()'s text."""
    value = config.get(key, default)
    text = str(value).strip()
    if isinstance(value, bool) or not ((isinstance(value, int) and value >= 0) or (isinstance(value, str) and text.isdigit())):
        raise ValueError(f"fsdp_config {key}={value!r} is invalid: it must be a whole number >= 0; e.g. {key}={default}")
    return int(text) if isinstance(value, str) else value


def fsdp_plugin(args: Any):
    """accelerate's ``FullyShardedDataParallelPlugin`` (FSDP2) from transformers' ``fsdp``/``fsdp_config``, or
    from the environment ``accelerate launch`` sets from an FSDP config file; None without FSDP.

    Raises:
        ValueError: an unknown word or key, FSDP version 1, or ``fsdp_config`` without ``fsdp``.
    """
    words = _fsdp_words(args.fsdp)
    from_launcher = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if not words and not from_launcher:
        if args.fsdp_config:
            raise ValueError("fsdp_config is set but fsdp is not: FSDP is off; set fsdp='full_shard' (or remove fsdp_config)")
        return None
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        raise ValueError(f"fsdp needs torch >= 2.6 (FSDP2's fully_shard); this is torch {torch.__version__}: upgrade torch") from None
    from accelerate.utils import FullyShardedDataParallelPlugin

    if not words:  # `accelerate launch --config_file` with distributed_type FSDP: its FSDP_* variables
        plugin = FullyShardedDataParallelPlugin()
        if plugin.fsdp_version != 2:
            raise ValueError("the accelerate config asks for FSDP version 1: cadence runs FSDP2; set fsdp_version: 2 in it")
        plugin.state_dict_type = getattr(plugin.state_dict_type, "name", plugin.state_dict_type)
        return plugin
    config = _fsdp_config(args)
    sharding = next((_FSDP_SHARDING[w] for w in words if w in _FSDP_SHARDING), _FSDP_SHARDING["full_shard"])
    min_params = _fsdp_config_int(config, "min_num_params", 0)
    layers = config.get("transformer_layer_cls_to_wrap")
    wrap = "auto_wrap" in words or min_params > 0 or layers is not None
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=bool(config.get("reshard_after_forward", sharding["reshard_after_forward"])),
        cpu_offload=bool("offload" in words or config.get("cpu_offload") or config.get("offload_params")),
        auto_wrap_policy=("size_based_wrap" if min_params > 0 else "transformer_based_wrap") if wrap else "no_wrap",
        transformer_cls_names_to_wrap=[layers] if isinstance(layers, str) else layers,
        min_num_params=min_params,
        state_dict_type=config["state_dict_type"],
        activation_checkpointing=bool(config.get("activation_checkpointing", False)),
        cpu_ram_efficient_loading=bool(config.get("cpu_ram_efficient_loading", False)),
    )
    plugin.hybrid = sharding.get("hybrid", False)
    plugin.state_dict_type = config["state_dict_type"]
    return plugin


def _fqn(name: str) -> str:
    """A parameter's name as torch's state-dict helpers write it (wrappers' prefixes removed)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


class _FullyShard:
    """torch's FSDP2: ``fully_shard`` on each wrapped layer, then the root; checkpoints through
    ``torch.distributed.checkpoint`` (DCP): consolidated on the saving process, or one shard per process.

    Numerics: a reduce-scatter averages gradients over processes, as DDP's all-reduce does, so the loop's
    loss weighting is the same; clipping measures the norm over all shards (one collective).
    """

    def __init__(self, plugin: Any, device: torch.device, amp_dtype: torch.dtype | None):
        self.plugin, self.device, self.amp_dtype = plugin, device, amp_dtype
        self.sharded_state = plugin.state_dict_type == "SHARDED_STATE_DICT"
        self.pending: Path | None = None  # sharded weights to load once the model is sharded (a resume)
        self._save_group = None  # the gloo group of DCP's background writes (async_save), made at the first one

    def shard(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> torch.nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

        if isinstance(model, FSDPModule):
            return model
        from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

        model = model.to(self.device)
        wrap = fsdp2_prepare_auto_wrap_policy(self.plugin, model) or (lambda module: False)
        layers = [(n, m) for n, m in model.named_modules() if m is not model and wrap(m)]
        if self.plugin.activation_checkpointing:  # recompute each wrapped layer's activations in backward
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            for name, layer in layers:
                model.set_submodule(name, checkpoint_wrapper(layer))
            if getattr(getattr(model, "config", None), "use_cache", False):  # a cache filled twice (forward and
                model.config.use_cache = False  # its recomputation) breaks the shapes, as transformers warns
            layers = [(n, model.get_submodule(n)) for n, _ in layers]
        before = {_fqn(n): p for n, p in model.named_parameters()}
        options = dict(
            reshard_after_forward=self.plugin.reshard_after_forward,
            mesh=self._mesh(),
            # mixed precision: compute in the autocast dtype, reduce gradients in float32
            mp_policy=MixedPrecisionPolicy(param_dtype=self.amp_dtype, reduce_dtype=torch.float32) if self.amp_dtype else MixedPrecisionPolicy(),
        )
        if self.plugin.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=self.device.type == "cuda")
        for _, layer in reversed(layers):  # innermost first, the root last
            fully_shard(layer, **options)
        fully_shard(model, **options)
        if optimizer is not None:  # fully_shard replaced the parameters: the optimizer must step the new ones
            after = {_fqn(n): p for n, p in model.named_parameters()}
            new = {id(before[name]): after[name] for name in before}
            for group in optimizer.param_groups:
                group["params"] = [new.get(id(p), p) for p in group["params"]]
        if self.plugin.cpu_ram_efficient_loading:  # the main process's weights are the ones everyone trains
            self._broadcast_from_main(model)
        if self.pending is not None:
            folder, self.pending = self.pending, None
            self.load_model_weights(model, folder)
        return model

    def _mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        if getattr(self, "layout", None) is not None:  # parallelism_config's dp_replicate x dp_shard (HSDP)
            mesh = self.layout.get_device_mesh(self.device.type)
            return mesh[tuple(self.layout.fsdp_dim_names)] if self.layout.dp_replicate_enabled else mesh["dp_shard_cp"]
        world = int(os.environ.get("WORLD_SIZE", 1))
        if not getattr(self.plugin, "hybrid", False):
            return init_device_mesh(self.device.type, (world,))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # replicate across nodes, shard inside one
        return init_device_mesh(self.device.type, (world // local, local), mesh_dim_names=("replicate", "shard"))

    def _broadcast_from_main(self, model: torch.nn.Module) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

    @staticmethod
    def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
        parameters = list(parameters)
        grads = [p.grad for p in parameters if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)  # over all shards: a replicated DTensor
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
        return norm

    def _save_shards(self, state: dict, folder: Path, pending: list | None) -> None:
        """Every process writes its shards of ``state`` into the DCP folder ``folder``: now, or (``pending``) from a
        CPU copy taken now, by the writer's thread, which calls what this appends to ``pending``. Those writes run
        DCP's collectives on a gloo group of their own, one after the other in the same order on every process, while
        the training thread's collectives go on over the default group."""
        import torch.distributed.checkpoint as dcp

        if pending is None:
            dcp.save(state, checkpoint_id=folder)
            return
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._save_group is None:  # every process saves at the same step: they create it together
            self._save_group = torch.distributed.new_group(backend="gloo")
        stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                              use_async_staging=False, use_non_blocking_copy=False))
        try:
            staged = stager.stage(state)  # each local shard copied to the CPU, here: training changes them next
        finally:
            stager.close()
        pending.append(functools.partial(dcp.save, staged, checkpoint_id=folder, process_group=self._save_group))

    def model_state_dict(self, model: torch.nn.Module, folder: Path, full: bool, pending: list | None = None) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.sharded_state and not full:
            self._save_shards({"model": get_model_state_dict(model)}, folder / formats.MODEL_SHARDS_NAME, pending)
            return {}
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        first: dict[int, str] = {}  # tied parameters (GPT-2's lm_head and wte) come back as copies: tie them again,
        for name, p in model.named_parameters(remove_duplicate=False):  # so they are stored once, as unsharded
            name = _fqn(name)
            if id(p) in first and name in state:
                state[name] = state[first[id(p)]]
            first.setdefault(id(p), name)
        return state

    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
                             pending: list | None = None) -> dict | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        if self.sharded_state:
            self._save_shards({"optimizer": get_optimizer_state_dict(model, optimizer)},
                              folder / formats.OPTIMIZER_SHARDS_NAME, pending)
            return None
        state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if "param_groups" not in state:  # not the saving process: nothing gathered here
            return {}
        # parameter names -> their numbers in group order: the format of optimizer.state_dict()
        number = {name: i for i, name in enumerate(n for g in state["param_groups"] for n in g["params"])}
        return {"state": {number[name]: value for name, value in state["state"].items()},
                "param_groups": [{**g, "params": [number[n] for n in g["params"]]} for g in state["param_groups"]]}

    def load_model_weights(self, model: torch.nn.Module, folder: Path) -> None:
        from torch.distributed.fsdp import FSDPModule

        if (folder / formats.MODEL_SHARDS_NAME).is_dir():
            if not isinstance(model, FSDPModule):  # shards load into a sharded model: after prepare_model
                self.pending = folder
                return
            from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

            state = {"model": get_model_state_dict(model)}
            load_dcp(state, folder / formats.MODEL_SHARDS_NAME)  # no file in it can run code
            set_model_state_dict(model, state["model"])
        elif not isinstance(model, FSDPModule):
            formats.load_model_weights(model, folder)  # full weights, before sharding: sharding splits them
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            state = formats.read_model_weights(folder, torch.device("cpu"))
            set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        if (folder / formats.OPTIMIZER_SHARDS_NAME).is_dir():
            state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
            load_dcp(state, folder / formats.OPTIMIZER_SHARDS_NAME)  # no file in it can run code
            set_optimizer_state_dict(model, optimizer, state["optimizer"])
            return
        saved = formats.safe_load(folder / formats.OPTIMIZER_NAME)
        names = {id(p): _fqn(n) for n, p in model.named_parameters()}
        order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]  # numbers -> parameter names
        state = {"state": {order[i]: value for i, value in saved["state"].items()},
                 "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in saved["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


# ------------------------------------------------- tensor, 2-D and hybrid parallelism (accelerate's ParallelismConfig)
#
# A model whose parameters are DTensors (loaded with ``from_pretrained(..., tp_plan="auto")`` or
# ``distributed_config=DistributedConfig(tp_size=..., fsdp_size=..., dp_replicate_size=...)``, or given a
# ``parallelize_module`` plan) owns its placement and its gradient reduction, as in transformers: it trains as it is,
# with no DDP wrapper. The backend works out the layout (transformers' rule: ``tp_size`` from the model,
# ``dp_shard_size`` from the rest), builds accelerate's device mesh from the ``ParallelismConfig``, and answers the
# loop's two questions: this process's data-parallel rank and how many data-parallel ranks there are. Processes of
# one TP group (consecutive ranks: tp is the innermost mesh dimension in accelerate's and in transformers' meshes)
# read the same batch, and the items of a step are counted over the data-parallel ranks only.

_CP_NEEDS = ("cp_size={cp} (context parallelism) is not supported by cadence: torch's context_parallel shards the "
             "sequence of scaled_dot_product_attention, whose ring kernels need CUDA (flash or efficient attention) and "
             "FSDP2 over a cp mesh dimension; set cp_size=1")
_SP_NEEDS = ("sp_size={sp} (sequence parallelism, sp_backend={backend!r}) is not supported by cadence: DeepSpeed's "
             "Ulysses sequence parallelism runs on CUDA GPUs through DeepSpeed; set sp_size=1")


def model_tp_size(model: torch.nn.Module | None) -> int:
    """The tensor-parallel degree the model was sharded with: transformers' ``tp_size`` (``_tp_size``), else the size of
    the mesh dimension its DTensor parameters are sharded over (a ``parallelize_module`` plan), else 1."""
    size = getattr(model, "_tp_size", None) or getattr(model, "tp_size", None)
    if isinstance(size, int) and size > 1:
        return size
    for p in (model.parameters() if model is not None else ()):
        mesh = getattr(p, "device_mesh", None)
        names = getattr(mesh, "mesh_dim_names", None) or ()
        if mesh is not None and "tp" in names:
            return mesh["tp"].size()
    return 1


def _has_dtensor_parameters(model: torch.nn.Module | None) -> bool:
    return model is not None and any(hasattr(p, "device_mesh") and hasattr(p, "placements") for p in model.parameters())


def parallelism_layout(args: Any, model: torch.nn.Module | None):
    """The run's ``ParallelismConfig`` (accelerate's), or None for plain DDP/FSDP/one process.

    transformers' rule: a model sharded at load time fixes ``tp_size`` (its own) and ``dp_shard_size`` (its
    ``distributed_config.dp_size``, else the processes left over); ``args.parallelism_config`` gives the rest.

    Raises:
        ValueError: before step 1, naming the numbers: sizes whose product is not the number of processes,
            ``tp_size`` > 1 with a model that is not tensor-parallel, DDP x TP (replicas without sharding, which
            accelerate forbids), or cp_size/sp_size (see ``_CP_NEEDS``/``_SP_NEEDS``).

    Example:
        >>> parallelism_layout(TrainingArguments("out"), model)  # a model loaded with tp_plan="auto" on 2 processes
        ParallelismConfig(... tp_size=2 ...)
    """
    import copy

    config, tp, on_mesh = args.parallelism_config, model_tp_size(model), _has_dtensor_parameters(model)
    if config is None and tp == 1 and not on_mesh:
        return None
    from accelerate import ParallelismConfig

    if isinstance(config, dict):  # from a config file or to_dict(): its sizes and backends
        keys = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size", "sp_backend")
        config = ParallelismConfig(**{k: config[k] for k in keys if config.get(k) is not None})
    if config is not None and not isinstance(config, ParallelismConfig):
        raise TypeError(f"parallelism_config={config!r} is invalid: it must be an accelerate.ParallelismConfig, e.g. "
                        "ParallelismConfig(tp_size=2)")
    config = copy.copy(config) if config is not None else ParallelismConfig()  # the user's stays as given
    config._sizes = dict(config._sizes)
    config.device_mesh = None
    if config.cp_size > 1:
        raise ValueError(_CP_NEEDS.format(cp=config.cp_size))
    if config.sp_size > 1:
        raise ValueError(_SP_NEEDS.format(sp=config.sp_size, backend=config.sp_backend))
    world = args.world_size
    _refuse_ddp_with_tp(config)
    distributed = getattr(getattr(model, "config", None), "distributed_config", None) if on_mesh else None
    if tp > 1 or distributed is not None:  # the model's own layout wins, as transformers' Trainer sets it
        dp = getattr(distributed, "dp_size", None) or world // tp
        replicas = getattr(distributed, "dp_replicate_size", None) or config.dp_replicate_size
        if config.tp_size not in (1, tp):
            raise ValueError(f"parallelism_config tp_size={config.tp_size} but the model was sharded with tp_size={tp}; "
                             f"set tp_size={tp} (or leave it out: the model's is used)")
        if tp > 1:
            config.tp_handler = config.tp_handler or copy.copy(ParallelismConfig(tp_size=2).tp_handler)
            config._set_size("tp", tp)
        config._set_size("dp_replicate", replicas)
        config._set_size("dp_shard", dp // replicas)
    elif config.tp_size > 1:
        plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or getattr(model, "_tp_plan", None)
        how = ("load it with from_pretrained(..., tp_plan='auto') (or distributed_config=DistributedConfig(tp_size="
               f"{config.tp_size}))" if plan else f"{type(model).__name__} has no tensor-parallel plan (no "
               "base_model_tp_plan): give its layers a torch.distributed.tensor.parallel.parallelize_module plan, "
               "or set tp_size=1")
        raise ValueError(f"parallelism_config tp_size={config.tp_size} but the model's parameters are not sharded "
                         f"over a tensor-parallel mesh; {how}")
    _refuse_ddp_with_tp(config)
    if config.total_size == 1 and world > 1:  # plain data parallelism over every process, as accelerate does
        config._set_size("dp_replicate", world)
    sizes = (f"dp_replicate_size={config.dp_replicate_size} x dp_shard_size={config.dp_shard_size} x "
             f"tp_size={config.tp_size}")
    if config.total_size != world:
        raise ValueError(f"parallelism_config {sizes} = {config.total_size} processes, but the run has {world}: "
                         f"make the product {world} (tp_size must divide the number of processes)")
    return config


def _refuse_ddp_with_tp(config: Any) -> None:
    if config.tp_size > 1 and config.dp_replicate_size > 1 and config.dp_shard_size == 1:
        raise ValueError(f"parallelism_config dp_replicate_size={config.dp_replicate_size} x tp_size={config.tp_size} "
                         "without dp_shard_size: data-parallel replicas of a tensor-parallel model need sharding (DDP x TP "
                         f"is not supported by accelerate); use dp_shard_size={config.dp_replicate_size} and "
                         "dp_replicate_size=1 (FSDP x TP), or both > 1 (HSDP x TP)")


def _accelerate_parallelism(layout: Any, args: Any) -> dict[str, Any]:
    """The ``Accelerator`` keyword for the layout, as transformers hands it over; none on CPUs, where accelerate
    refuses a ``ParallelismConfig`` (its check wants GPUs or FSDP), so the backend builds the same mesh itself."""
    if layout is None or default_device(args.use_cpu, args.local_process_index).type == "cpu":
        return {}
    return {"parallelism_config": layout}


class _MeshParallel(_FullyShard):
    """A model already distributed over a device mesh (DTensor parameters: TP, or FSDP x TP / HSDP applied at load):
    it runs as it is, its gradients reduced by its own hooks (FSDP2's) or not at all (TP alone: a TP group computes
    one gradient together). Checkpoints go through DCP as FSDP's do: gathered into full ``model.safetensors`` and
    ``optimizer.pt`` (resumable on any layout), or one shard per process with ``state_dict_type`` sharded. Clipping
    measures the norm of each mesh's gradients and combines them, as transformers does for mixed meshes.

    Args:
        layout: the run's ``ParallelismConfig``; its ``device_mesh`` is built here (accelerate's builder).
        sharded: write DCP shards (``fsdp_config`` ``state_dict_type`` sharded) instead of full files.
    """

    def __init__(self, layout: Any, device: torch.device, amp_dtype: torch.dtype | None, sharded: bool = False):
        from types import SimpleNamespace

        plugin = SimpleNamespace(state_dict_type="SHARDED_STATE_DICT" if sharded else "FULL_STATE_DICT",
                                 cpu_ram_efficient_loading=False)
        super().__init__(plugin, device, amp_dtype)
        self.layout = layout
        self.mesh = layout.get_device_mesh(device.type)
        self.data_parallel_size = layout.data_parallel_size
        self.data_parallel_rank = torch.distributed.get_rank() // layout.non_data_parallel_size  # tp innermost: a TP group is consecutive

    def check_model(self, model: torch.nn.Module) -> None:
        """The model's TP groups must be the mesh's: consecutive ranks (else two processes of one TP group would
        read different batches)."""
        tp = self.layout.tp_size
        for name, p in model.named_parameters():
            mesh = getattr(p, "device_mesh", None)
            if mesh is None or "tp" not in (mesh.mesh_dim_names or ()):
                continue
            group = sorted(mesh["tp"].mesh.flatten().tolist())
            first = self.data_parallel_rank * tp
            if group != list(range(first, first + tp)):
                raise ValueError(f"{name} is sharded over the tensor-parallel ranks {group}, but cadence gives one batch "
                                 f"to ranks {list(range(first, first + tp))}: build the model's mesh with tp as its last "
                                 "(innermost) dimension, as from_pretrained(..., tp_plan='auto') does")
            return

    def shard(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> torch.nn.Module:
        self.check_model(model)
        if self.pending is not None:  # sharded weights of a resume, loaded now that the model is known
            folder, self.pending = self.pending, None
            self.load_model_weights(model, folder)
        return model

    @staticmethod
    def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        by_mesh: dict[Any, list] = {}
        for p in parameters:
            if p.grad is not None:  # DTensors of different meshes (and plain tensors) cannot share one norm kernel
                by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
        norms = []
        for params in by_mesh.values():
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # over the mesh's shards
        total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
        for params in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    def load_model_weights(self, model: torch.nn.Module, folder: Path) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

        if (folder / formats.MODEL_SHARDS_NAME).is_dir():
            state = {"model": get_model_state_dict(model)}
            load_dcp(state, folder / formats.MODEL_SHARDS_NAME)  # no file in it can run code
            set_model_state_dict(model, state["model"])
        else:  # full weights, each process keeping its shard of every DTensor
            state = formats.read_model_weights(folder, torch.device("cpu"))
            set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def _mesh_sharding(layout: Any, model: torch.nn.Module | None, plugin: Any, device: torch.device,
                   amp_dtype: torch.dtype | None) -> _FullyShard | None:
    """The engine of a ``ParallelismConfig`` layout: ``_MeshParallel`` for a model already on a mesh (DTensor
    parameters), None where the FSDP plugin (or plain DDP) runs it.

    Raises:
        ValueError: ``dp_shard_size`` > 1 for a model that is not sharded, without ``fsdp`` to shard it.
    """
    if _has_dtensor_parameters(model):
        from torch.distributed.fsdp import FSDPModule

        if layout.data_parallel_size > 1 and not isinstance(model, FSDPModule):  # nothing would average its gradients
            raise ValueError(f"the model's parameters are on a device mesh and the layout has {layout.data_parallel_size} "
                             "data-parallel ranks, but the model is not sharded over them (FSDP2): load it with "
                             "distributed_config=DistributedConfig(tp_size=..., fsdp_size=..., dp_replicate_size=...), "
                             "which applies FSDP2 at load")
        sharded = plugin is not None and plugin.state_dict_type == "SHARDED_STATE_DICT"
        return _MeshParallel(layout, device, amp_dtype, sharded=sharded)
    if layout.dp_shard_size > 1 and plugin is None:
        raise ValueError(f"parallelism_config dp_shard_size={layout.dp_shard_size} shards the model with FSDP, but "
                         "fsdp is not set: set fsdp='full_shard' (or load the model sharded, with "
                         "distributed_config=DistributedConfig(fsdp_size=...))")
    if plugin is None:
        return None
    if layout.dp_shard_size == 1:
        raise ValueError(f"fsdp is set but parallelism_config has dp_shard_size=1 (dp_replicate_size="
                         f"{layout.dp_replicate_size}): FSDP has no dimension to shard across; set dp_shard_size > 1 "
                         "or remove fsdp")
    sharding = _FullyShard(plugin, device, amp_dtype)
    sharding.layout = layout  # fully_shard over the layout's data-parallel mesh: (dp_replicate, dp_shard) is HSDP
    return sharding


# ---------------------------------------------------------------------------------------------- DeepSpeed

# DeepSpeed config entry -> how transformers fills its "auto" from TrainingArguments (and checks a set value)
_DS_FROM_ARGS: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": lambda a: a.per_device_train_batch_size,
    "gradient_accumulation_steps": lambda a: a.gradient_accumulation_steps,
    "train_batch_size": lambda a: a.train_batch_size * a.gradient_accumulation_steps * a.world_size,  # global
    "gradient_clipping": lambda a: a.max_grad_norm,
    "optimizer.params.lr": lambda a: a.learning_rate,
    "optimizer.params.betas": lambda a: [a.adam_beta1, a.adam_beta2],
    "optimizer.params.eps": lambda a: a.adam_epsilon,
    "optimizer.params.weight_decay": lambda a: a.weight_decay,
    "scheduler.params.warmup_max_lr": lambda a: a.learning_rate,
    "fp16.enabled": lambda a: bool(a.fp16 or a.fp16_full_eval),
    "bf16.enabled": lambda a: bool(a.bf16 or a.bf16_full_eval),
}
# filled when "auto", never checked (transformers' "fill only" entries)
_DS_FILL_ONLY: dict[str, Any] = {"scheduler.params.warmup_min_lr": lambda a: 0}
# filled once the model and the number of steps are known (fill only)
_DS_FROM_MODEL: dict[str, Any] = {
    "zero_optimization.reduce_bucket_size": lambda hidden, steps, a: hidden * hidden,
    "zero_optimization.stage3_prefetch_bucket_size": lambda hidden, steps, a: int(0.9 * hidden * hidden),
    "zero_optimization.stage3_param_persistence_threshold": lambda hidden, steps, a: 10 * hidden,
    "scheduler.params.total_num_steps": lambda hidden, steps, a: steps,
    "scheduler.params.warmup_num_steps": lambda hidden, steps, a: a.get_warmup_steps(steps) if steps else None,
}


def _ds_entry(config: dict, dotted: str) -> tuple[dict | None, str]:
    *parents, key = dotted.split(".")
    for name in parents:
        config = config.get(name)
        if not isinstance(config, dict):
            return None, key
    return config, key


def deepspeed_plugin(args: Any):
    """accelerate's ``DeepSpeedPlugin`` for ``args.deepspeed`` (``TrainingArguments.deepspeed_plugin``)."""
    from accelerate.utils import DeepSpeedPlugin

    return DeepSpeedPlugin(hf_ds_config=deepspeed_config(args))


def deepspeed_config(args: Any, model: torch.nn.Module | None = None, num_training_steps: int | None = None) -> dict:
    """``args.deepspeed`` (a dict, or the path of a JSON file) with its ``"auto"`` values filled as transformers
    fills them: batch sizes, accumulation, clipping, optimizer and scheduler values and fp16/bf16 from the
    arguments; bucket sizes from the model's ``hidden_size`` and the schedule's steps when given.

    Raises:
        ValueError: a value that is set (not "auto") and differs from the arguments, listed with both values.

    Example:
        >>> deepspeed_config(TrainingArguments("out", deepspeed={"train_micro_batch_size_per_gpu": "auto"}))
        {'train_micro_batch_size_per_gpu': 8}
    """
    import copy
    import json

    config = args.deepspeed
    if isinstance(config, (str, os.PathLike)):
        with open(config) as f:
            config = json.load(f)
    config = copy.deepcopy(dict(config))
    mismatches = []
    for dotted, value in [*_DS_FROM_ARGS.items(), *_DS_FILL_ONLY.items()]:
        section, key = _ds_entry(config, dotted)
        if section is None or key not in section:
            continue
        wanted = value(args)
        if section[key] == "auto":
            section[key] = wanted
        elif dotted in _DS_FROM_ARGS and section[key] != wanted:
            mismatches.append(f"{dotted}={section[key]!r} but TrainingArguments give {wanted!r}")
    if mismatches:
        raise ValueError("the DeepSpeed config disagrees with TrainingArguments: " + "; ".join(mismatches)
                         + '; set those entries to "auto" or make the arguments match')
    config_of = getattr(model, "config", None)
    hidden = getattr(config_of, "hidden_size", None) or max(getattr(config_of, "hidden_sizes", None) or [0]) or None
    for dotted, value in _DS_FROM_MODEL.items():
        section, key = _ds_entry(config, dotted)
        if section is None or section.get(key) != "auto":
            continue
        if dotted.startswith("zero_optimization") and model is not None:
            if hidden is None:
                raise ValueError(f'the DeepSpeed config has {dotted}="auto" but {type(model).__name__} has no '
                                 "config.hidden_size to derive it from; set a number there")
            section[key] = value(hidden, num_training_steps, args)
        elif dotted.startswith("scheduler") and num_training_steps is not None:
            section[key] = value(hidden, num_training_steps, args)
    return config


def _check_deepspeed_usable(args: Any) -> None:
    """A clear error before anything runs: DeepSpeed needs CUDA GPUs and its package."""
    if args.use_cpu or not torch.cuda.is_available():
        raise ValueError(
            "deepspeed=... needs CUDA GPUs: DeepSpeed's ZeRO runs on NVIDIA/AMD GPUs and this run has none "
            f"({'use_cpu=True' if args.use_cpu else 'torch.cuda.is_available() is False'}); remove deepspeed, or use "
            "fsdp='full_shard' (torch's FSDP2, which also shards parameters, gradients and optimizer state, on CPUs too)"
        )
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        raise ImportError("deepspeed=... needs the deepspeed package: pip install deepspeed") from None
