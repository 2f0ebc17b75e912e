"""The Backend's set-up: which engine runs this job (a ``Strategy``) and its ``Precision``, picked once from the
arguments, the model and the layout (Lightning Fabric's connector). A new engine is one new strategy module and
one line here."""


from __future__ import annotations

import logging
import sys
from typing import Any

import torch

from ..runtime.processes import _end_at_exit_if_started, _process_group_options, accelerate_state
from .ddp import DataParallel, ddp_accelerator
from .deepspeed import _check_deepspeed_usable, deepspeed_accelerator, deepspeed_config
from .deepspeed_engine import DeepSpeedEngine
from .fsdp import _FullyShard, fsdp_plugin
from .meshes import _accelerate_parallelism, _mesh_sharding
from .precision import Precision, _amp_dtype
from .single import SingleDevice
from .strategy import Strategy

logger = logging.getLogger(__name__)


def connect(args: Any, model: torch.nn.Module | None, layout: Any) -> tuple[Strategy, Precision]:
    """The engine and the precision of a run: DeepSpeed's engine with ``deepspeed`` (on one process too: the engine
    partitions the optimizer state), else with several processes FSDP2 (``fsdp``), a model's device mesh (TP, FSDP x
    TP, HSDP) or DDP, else one device. The process group and accelerate's ``Accelerator`` are made here.

    Raises:
        ValueError: before anything runs, for a combination no engine runs (FSDP with DeepSpeed or ``torch_compile``),
            or a precision the device cannot compute in.
    """
    deepspeed = None
    if args.deepspeed:
        _check_deepspeed_usable(args)
        deepspeed = deepspeed_config(args)
    if deepspeed is not None:
        accelerator = _end_at_exit_if_started(lambda: deepspeed_accelerator(deepspeed, _process_group_options(args)))
    elif args.world_size > 1:
        accelerator = ddp_accelerator(args, model, _accelerate_parallelism(layout, args))
    else:
        accelerator = None
        if "accelerate" in sys.modules:  # a library built on it is in use (TRL calls accelerate's set_seed, which
            accelerate_state(args)  # reads AcceleratorState); a plain run does not pay accelerate's import
    device = args.device if accelerator is None else accelerator.device
    # DeepSpeed casts the model itself (its config's fp16/bf16, filled from the arguments): no autocast here
    amp_dtype = None if deepspeed is not None else _amp_dtype(args, device)
    plugin = fsdp_plugin(args)
    if plugin is not None and (deepspeed is not None or args.torch_compile):
        raise ValueError(f"fsdp={args.fsdp!r} with {'deepspeed' if deepspeed is not None else 'torch_compile=True'} is "
                         "not supported: choose FSDP or DeepSpeed, and FSDP runs uncompiled in cadence")
    if plugin is not None and args.world_size == 1:
        logger.info("fsdp with one process: nothing to shard, the model trains unwrapped")
    if deepspeed is not None:
        strategy: Strategy = DeepSpeedEngine(args, deepspeed, accelerator)
    elif accelerator is None:
        strategy = SingleDevice(args, device)
    else:
        sharding = _FullyShard(args, accelerator, plugin, amp_dtype) if plugin is not None else None
        if layout is not None:
            sharding = _mesh_sharding(args, accelerator, layout, model, plugin, amp_dtype) or sharding
        strategy = sharding or DataParallel(args, accelerator)
    return strategy, Precision(args, device, amp_dtype, forward=strategy.forward_autocasts)
