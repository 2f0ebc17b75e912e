"""DeepSpeed: accelerate's plugin and the config's "auto" entries filled from the arguments."""


from __future__ import annotations

import os
from typing import Any

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
