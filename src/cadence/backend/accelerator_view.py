"""``trainer.accelerator``: accelerate's ``Accelerator`` methods and arguments as transformers' Trainer exposes them."""


from __future__ import annotations

import contextlib
import os
from typing import Any

import torch


from .adapter import Backend
from .precision import _map_tensors
from ..runtime.processes import accelerate_state, find_unused_parameters, process_state


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


def skip_first_batches(dataloader: Any, num_batches: int) -> Any:
    """accelerate's ``skip_first_batches``: ``dataloader`` without its first ``num_batches`` batches (what
    transformers' ``get_resumed_dataloader`` returns).

    Example:
        >>> rest = skip_first_batches(loader, 3)  # doctest: +SKIP
    """
    from accelerate import skip_first_batches as skip  # on use: accelerate's data module is not needed otherwise

    return skip(dataloader, num_batches)


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
    ddp = {"find_unused_parameters": find_unused_parameters(args, model)}
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
