"""DeepSpeed: accelerate's plugin and the config's "auto" entries filled from the arguments."""


from __future__ import annotations

import os
from typing import Any, Callable

import torch


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


def deepspeed_optimizers(config: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         scheduler_for: Callable[[Any], Any]) -> tuple[Any, Any]:
    """What accelerate's ``prepare`` gets beside the model for a config with ``optimizer``/``scheduler`` sections, as
    transformers passes them: accelerate's placeholders, from which DeepSpeed builds the section's optimizer (over
    every trainable parameter, weight decay on all, as the section says) and the section's scheduler; the arguments'
    optimizer where the config has no optimizer section; the arguments' schedule (``scheduler_for``) on DeepSpeed's
    optimizer where it has no scheduler section. The engine steps whichever scheduler it gets."""
    from accelerate.utils import DummyOptim, DummyScheduler

    if "optimizer" in config:
        optimizer = DummyOptim(params=[p for p in model.parameters() if p.requires_grad])
    if "scheduler" in config:
        return optimizer, DummyScheduler(optimizer)
    return optimizer, DummyScheduler(optimizer, lr_scheduler_callable=scheduler_for)


def unused_given_optimizers(config: dict, optimizer: Any, lr_scheduler: Any) -> str | None:
    """Why ``optimizers=(optimizer, lr_scheduler)`` given to the Trainer would go unused under this config, or None:
    DeepSpeed builds the ``optimizer`` section's optimizer instead of a given one (and then a given scheduler has
    nothing to drive), and the ``scheduler`` section's scheduler instead of a given one. transformers drops them
    silently."""
    unused = []
    if optimizer is not None and "optimizer" in config:
        unused.append("optimizer" + (" and scheduler" if lr_scheduler is not None else ""))
    elif lr_scheduler is not None and "scheduler" in config:
        unused.append("scheduler")
    if not unused:
        return None
    sections = "/".join(name for name in ("optimizer", "scheduler") if name in config)
    return (f"the Trainer's given {unused[0]} (optimizers=...) will not be used: the DeepSpeed config's {sections} "
            f"section(s) make DeepSpeed build its own, as under transformers; remove the section(s) to train with "
            "yours, or pass none")


def _check_deepspeed_usable(args: Any) -> None:
    """A clear error before anything runs, where DeepSpeed itself cannot run the config: its package missing,
    ``use_cpu=True`` while DeepSpeed would pick a GPU, or fp16/bf16 its accelerator has no kernels for.

    DeepSpeed picks its accelerator itself (``DS_ACCELERATOR``, else the first it detects: CUDA, ..., the CPU as a
    catch-all); on a CPU its engine communicates over gloo, as torch's own CPU runs do."""
    try:
        import deepspeed  # noqa: F401
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        raise ImportError("deepspeed=... needs the deepspeed package: pip install deepspeed") from None
    accelerator = get_accelerator()
    name = accelerator.device_name()
    if args.use_cpu and name != "cpu":
        raise ValueError(
            f"deepspeed=... with use_cpu=True, but DeepSpeed picked its {name!r} accelerator; set the environment "
            "variable DS_ACCELERATOR=cpu before starting (DeepSpeed reads it once), or remove use_cpu")
    for flag, supported in (("fp16", accelerator.is_fp16_supported), ("bf16", accelerator.is_bf16_supported)):
        if getattr(args, flag) and not supported():
            raise ValueError(f"{flag}=True under deepspeed=...: DeepSpeed's {name!r} accelerator reports no {flag} "
                             f"support on this machine; remove {flag}=True (float32 trains everywhere)")


def _launcher_environment() -> None:
    """A process started without a launcher (plain ``python train.py``) becomes a group of one, as DeepSpeed's
    and torch's launchers would set it up: DeepSpeed's engine needs a process group, and without ``RANK``/``WORLD_SIZE``
    it looks for MPI instead (transformers' runs stop there on ``mpi4py``). A launcher's values are kept."""
    if "WORLD_SIZE" in os.environ or "LOCAL_RANK" in os.environ:
        return
    import socket

    with socket.socket() as s:  # a free port for this process's own group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(port))):
        os.environ.setdefault(name, value)


def deepspeed_accelerator(config: dict, group_options: dict):
    """accelerate's ``Accelerator`` set up for DeepSpeed as transformers sets it up, on whichever accelerator DeepSpeed
    picked (a CPU included: accelerate's ``cpu=True`` would switch DeepSpeed off, so it is never passed here).

    accelerate selects DeepSpeed from ``ACCELERATE_USE_DEEPSPEED`` (set only while the state is created, as
    transformers' arguments do), and its process state then starts DeepSpeed's communication (gloo on a CPU). A
    state made earlier (``main_process_first``, a library's bare ``PartialState()``, an earlier run's DeepSpeed
    config) is reset first, keeping its process group, which DeepSpeed takes over.

    Args:
        config: the DeepSpeed config, "auto" values filled (:func:`deepspeed_config`).
        group_options: ``init_process_group``'s options (``_process_group_options``). Without a ``backend`` there,
            DeepSpeed's accelerator names it (gloo on a CPU): accelerate (1.16) finds none for a CPU that it is not
            told is one, and then counts one process of rank 0 on every process (transformers' CPU runs have that
            bug: each rank logs and saves as the main one, and reductions do not average).
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs
    from deepspeed.accelerator import get_accelerator

    _launcher_environment()
    AcceleratorState._reset_state(reset_partial_state=True)  # as transformers' arguments do: this run's plugin
    before = os.environ.get("ACCELERATE_USE_DEEPSPEED")
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    try:
        backend = group_options.get("backend") or get_accelerator().communication_backend_name()
        init = InitProcessGroupKwargs(**{**group_options, "backend": backend})
        return Accelerator(cpu=False, deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config), kwargs_handlers=[init])
    finally:
        if before is None:
            del os.environ["ACCELERATE_USE_DEEPSPEED"]
        else:
            os.environ["ACCELERATE_USE_DEEPSPEED"] = before
