"""``TrainingArguments``' input forms resolved: text for bools and numbers, the 4.x spellings, JSON strings, the
``None``/``str``/``bool`` shorthands, names into enums, HF's derived defaults, ``accelerator_config``, and accelerate's
process state under a launcher; the field kinds ``to_dict`` serialises. ``TrainingArguments.__post_init__`` runs these
steps, in its order, before ``training_args_checks``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import os
import sys
import typing
import warnings
from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np
import torch

from .trainer_utils import HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType
from .training_args_checks import _check_value_rules, _field_defaults, _invalid, _is_number, _plain, _scalar_fields
from .training_args_types import AcceleratorConfig, OptimizerNames

TrainingArguments = Any  # what the steps get: the arguments object (training_args.py sits above this module)

logger = logging.getLogger("cadence.training_args")  # the arguments' messages keep their logger's name


# =============================================================================================
# The tables: aliases, enum fields, field kinds. Edit these, not the functions below.
# =============================================================================================
def _keep(name: str, value: Any) -> Any:
    return value


def _when_true(new_value: Any) -> Callable[[str, Any], Any]:
    # A 4.x boolean switch: True means new_value (a fresh copy: lists must not be shared between
    # instances); False was the 4.x default and says nothing.
    return lambda name, on: copy.deepcopy(new_value) if on else None


def _warmup_ratio_as_steps(name: str, ratio: Any) -> float:
    if not (_is_number(ratio) and 0 <= ratio < 1):
        raise _invalid(
            name, ratio, "a fraction in [0, 1)", "for warmup over the whole run pass warmup_steps=<total steps>"
        )
    return float(ratio)  # HF 5 reads a warmup_steps value below 1 as a ratio of the total steps


# 4.x name -> (5.x name, converter(name, value) -> 5.x value or None for "no opinion").
_ALIASES: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "evaluation_strategy": ("eval_strategy", _keep),
    "warmup_ratio": ("warmup_steps", _warmup_ratio_as_steps),
    "group_by_length": ("train_sampling_strategy", _when_true("group_by_length")),
    "no_cuda": ("use_cpu", _when_true(True)),
    "include_inputs_for_metrics": ("include_for_metrics", _when_true(["inputs"])),
}


# The 4.x names transformers deprecated before removing them, and how it said so (4.57 for no_cuda and
# include_inputs_for_metrics, 4.45 for evaluation_strategy): a FutureWarning, or a logged warning. warmup_ratio and
# group_by_length are plain options of 4.57, so they pass silently.
_DEPRECATED: dict[str, type[Warning] | None] = {
    "evaluation_strategy": FutureWarning, "no_cuda": FutureWarning, "include_inputs_for_metrics": None,
}


# Accepted, kept on the object, but not options of HF 5: left out of to_dict().
_LEGACY_ONLY = frozenset(_ALIASES) | {"overwrite_output_dir", "save_safetensors"}


# cadence's own options, which transformers.TrainingArguments does not have (in to_dict(), so saved with a checkpoint)
CADENCE_ONLY = frozenset({"async_save"})


_ENUM_FIELDS: dict[str, type[Enum]] = {
    "eval_strategy": IntervalStrategy,
    "logging_strategy": IntervalStrategy,
    "save_strategy": SaveStrategy,
    "hub_strategy": HubStrategy,
    "lr_scheduler_type": SchedulerType,
    "optim": OptimizerNames,
}


def _dtype_names(value: Any) -> Any:
    # torch.dtype values inside option dicts (e.g. a subclass's model kwargs) become "float32" etc. for JSON.
    if isinstance(value, dict):
        return {k: _dtype_names(v) for k, v in value.items()}
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return value


_ATOMS = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _dict_fields(cls: type) -> tuple[str, ...]:
    """The fields ``to_dict`` writes, in order (4.x-only aliases left out)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init and f.name not in _LEGACY_ONLY)


@functools.cache
def _token_fields(cls: type) -> tuple[str, ...]:
    return tuple(name for name in _dict_fields(cls) if name.endswith("_token"))


@functools.cache
def _default_dict(cls: type) -> dict[str, Any]:
    try:
        return cls().to_dict()
    except Exception:  # noqa: BLE001 - a subclass with required fields: show every field instead
        return {}


# The words HfArgumentParser's string_to_bool reads as True / False (any case).
_TRUE_WORDS = ("yes", "true", "t", "y", "1")


_FALSE_WORDS = ("no", "false", "f", "n", "0")


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
        return value.strip().lower() in _TRUE_WORDS
    raise _invalid(name, value, "True or False (as text: one of " + "/".join(_TRUE_WORDS) + " or "
                   + "/".join(_FALSE_WORDS) + ", any case)", f"pass {name}=True or {name}=False")


def _parse_text_values(args: TrainingArguments) -> None:
    """Bool, int and float fields given as text (a JSON or YAML config, an environment variable) become what
    HfArgumentParser makes of the same text on a command line: "false" is False (a non-empty string is truthy,
    so taken as it is it would switch the option on), "1e-3" is 0.001. Other values of a bool field are refused."""
    for name, kind in _scalar_fields(type(args)).items():
        value = getattr(args, name)
        if value is None:
            continue  # None of a plain bool field is falsy, as in transformers
        if kind == "bool":
            setattr(args, name, _as_bool(name, value))
        elif isinstance(value, str):
            try:
                setattr(args, name, int(value) if kind == "int" else float(value))
            except ValueError:
                default = _field_defaults(type(args))[name]
                raise _invalid(name, value, "an integer" if kind == "int" else "a number",
                               f"pass a number such as {name}={default!r}") from None


def _declared_by_a_subclass(cls: type, name: str, base: type) -> bool:
    """Whether a subclass of cadence's arguments declares field ``name`` itself (GLiNER's arguments declare
    ``warmup_ratio: float = 0.0`` and read it in their own ``get_warmup_steps``): transformers 5 has no such field
    and leaves it to the subclass, so cadence does not read it as the 4.x spelling either. ``base``: cadence's
    ``TrainingArguments``."""
    return any(name in vars(k).get("__annotations__", {}) for k in cls.__mro__
               if k is not base and issubclass(k, base) and not k.__module__.startswith("cadence."))


def _resolve_aliases(args: TrainingArguments, base: type) -> None:
    """Move each 4.x spelling into its 5.x field; the two disagreeing is an error (``base``: cadence's
    ``TrainingArguments``, whose subclasses may declare a 4.x name as a field of their own)."""
    defaults = _field_defaults(type(args))
    for old, (new, convert) in _ALIASES.items():
        old_value = getattr(args, old)
        if old_value is None or _declared_by_a_subclass(type(args), old, base):
            continue
        if old in _DEPRECATED and old_value:
            _warn_deprecated(old, new, _DEPRECATED[old])
        value = convert(old, old_value)
        setattr(args, old, None)  # consumed, so a dataclasses.replace() copy does not apply it again
        current = getattr(args, new)
        if value is None or _plain(current) == _plain(value):
            continue
        if _plain(current) != _plain(defaults[new]):
            raise ValueError(
                f"{old}={old_value!r} conflicts with {new}={_plain(current)!r}: {old} is the transformers 4.x "
                f"spelling of {new}; pass only {new}"
            )
        setattr(args, new, value)


def _warn_deprecated(old: str, new: str, category: type[Warning] | None) -> None:
    message = f"`{old}` is deprecated (transformers 4.x's name, gone in 5.0): pass `{new}` instead"
    if category is None:
        logger.warning(message)
    else:
        warnings.warn(message, category, stacklevel=5)  # the caller of TrainingArguments(...)


def _resolve_output_dir(args: TrainingArguments) -> None:
    if args.output_dir is None:
        logger.info("No output_dir given: using 'trainer_output'")
        args.output_dir = "trainer_output"
    args.output_dir = os.path.expanduser(os.fspath(args.output_dir))
    if not args.output_dir.strip():
        raise _invalid("output_dir", args.output_dir, "a folder name", "pass e.g. output_dir='out', or None for 'trainer_output'")


# accelerator_config values cadence refuses, with why: each would make processes read different data or a different
# order than cadence's sharded, seedable, resumable loaders (exact and bit-identical on resume).
_ACCELERATOR_CONFIG_REFUSED = {
    ("split_batches", True): "cadence gives every process its own batch of per_device_train_batch_size; to split "
                             "a batch of B over N processes set per_device_train_batch_size=B/N",
    ("dispatch_batches", True): "every process reads its own shard of the data in cadence (batches are never "
                                "sent from the main process); remove it",
    ("even_batches", False): "every process must take the same number of steps for the summed loss to be exact, "
                             "and evaluation already drops the repeated samples; remove it",
    ("use_seedable_sampler", False): "cadence's sampler is always seeded from seed/data_seed, which is what makes "
                                     "resume bit-identical; remove it",
}


_GRADIENT_ACCUMULATION_KEYS = ("num_steps", "adjust_scheduler", "sync_with_dataloader", "sync_each_batch")


def _build_accelerator_config(args: TrainingArguments) -> None:
    """``accelerator_config`` as an ``AcceleratorConfig``, from a dict, a JSON file path or a config object
    (transformers' own ``AcceleratorConfig`` too), checked; ``gradient_accumulation_kwargs["num_steps"]`` applied
    as transformers does."""
    value = args.accelerator_config
    if isinstance(value, type):
        raise TypeError(f"accelerator_config={value!r} is invalid: it is a class; pass an instance, e.g. "
                        f"{value.__name__}(), or a dict")
    if value is None:
        config = AcceleratorConfig()
    elif isinstance(value, dict):
        unknown = sorted(k for k in value if k not in AcceleratorConfig.__dataclass_fields__)
        if unknown:
            raise TypeError(f"accelerator_config={value!r} is invalid: unknown keys {unknown}; the keys are "
                            f"{sorted(AcceleratorConfig.__dataclass_fields__)}")
        config = AcceleratorConfig(**value)
    elif isinstance(value, (str, os.PathLike)):
        if not os.path.isfile(value):
            raise _invalid("accelerator_config", value, "a dict, an AcceleratorConfig or the path of a JSON file",
                           "no such file: give the file's path")
        config = AcceleratorConfig.from_json_file(value)
    elif dataclasses.is_dataclass(value):  # cadence's, or transformers' AcceleratorConfig
        config = AcceleratorConfig(**{k: v for k, v in vars(value).items() if k in AcceleratorConfig.__dataclass_fields__})
    else:
        raise TypeError(f"accelerator_config={value!r} is invalid: it must be a dict, an AcceleratorConfig or a JSON "
                        f"file path, not {type(value).__name__}")
    for (name, bad), why in _ACCELERATOR_CONFIG_REFUSED.items():
        if getattr(config, name) is bad:
            raise ValueError(f"accelerator_config {name}={bad} is not supported by cadence: {why}")
    kwargs = config.gradient_accumulation_kwargs
    if kwargs is not None:
        if not isinstance(kwargs, dict) or any(k not in _GRADIENT_ACCUMULATION_KEYS for k in kwargs):
            raise TypeError(f"accelerator_config gradient_accumulation_kwargs={kwargs!r} is invalid: it must be a dict "
                            f"with keys among {list(_GRADIENT_ACCUMULATION_KEYS)}")
        if "num_steps" in kwargs:
            if args.gradient_accumulation_steps > 1:
                raise ValueError(
                    f"accelerator_config gradient_accumulation_kwargs num_steps={kwargs['num_steps']!r} and "
                    f"gradient_accumulation_steps={args.gradient_accumulation_steps} both set the accumulation: "
                    "set only one of them")
            args.gradient_accumulation_steps = kwargs["num_steps"]
            _check_value_rules(args)  # num_steps obeys gradient_accumulation_steps's rule
    if config.pop("use_configured_state", False):  # popped, as transformers does (to_dict() leaves it out)
        from .backend import require_configured_state  # only then: a plain run does not import accelerate

        require_configured_state(args)
    args.accelerator_config = config


def _start_process_state(args: TrainingArguments) -> None:
    """accelerate's ``PartialState`` with the run's settings exists once the arguments do (as in transformers).
    On several processes, a library's own bare ``PartialState()`` (TRL's dataset preparation makes one) then reuses it
    instead of creating one without them (on a machine without a GPU: no distributed state, each process training
    alone). On one process, libraries log through ``accelerate.logging`` between their arguments and their Trainer
    (TRL's ORPO and CPO), which needs the state; it is created when accelerate is imported already (every library
    that uses it imported it), so a plain run never imports accelerate (0.2 s). DeepSpeed's state is left to the
    Trainer's accelerator, which sets it up for DeepSpeed."""
    from .runtime.slurm import apply_slurm_environment  # light: SLURM's srun as a launcher

    apply_slurm_environment()  # before anything reads RANK/WORLD_SIZE: a job srun started sets them from SLURM's
    if args.deepspeed:
        return
    if args.world_size > 1 or "accelerate" in sys.modules:
        args.distributed_state  # noqa: B018 - the cached property creates the state


def _parse_json_dict_fields(args: TrainingArguments) -> None:
    for name in type(args)._VALID_DICT_FIELDS:  # the class's list: a subclass's own dict fields are parsed too
        value = getattr(args, name)
        if isinstance(value, str) and value.lstrip().startswith("{"):  # other strings are file paths
            try:
                setattr(args, name, _typed_strings(json.loads(value)))
            except json.JSONDecodeError as error:
                raise _invalid(name, value, "a dict or a JSON object string", f"fix the JSON ({error})") from None


def _typed_strings(value: dict) -> dict:
    """``"true"``/``"false"``/``"3"``/``"0.5"`` inside a JSON dict as bool/int/float, as transformers reads them."""
    for key, item in value.items():
        if isinstance(item, dict):
            value[key] = _typed_strings(item)
        elif isinstance(item, str) and item.lower() in ("true", "false"):
            value[key] = item.lower() == "true"
        elif isinstance(item, str) and item.isdigit():
            value[key] = int(item)
        elif isinstance(item, str) and item.replace(".", "", 1).isdigit():
            value[key] = float(item)
    return value


def _resolve_checkpointing_names(args: TrainingArguments) -> None:
    # HF 5's rule: the old name is read only when the new one is unset; afterwards they mirror.
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if getattr(args, new) is None:
            setattr(args, new, getattr(args, old))
        setattr(args, old, getattr(args, new))
    if args.activation_checkpointing is None:
        args.activation_checkpointing = args.gradient_checkpointing = False


def _normalise_shorthands(args: TrainingArguments) -> None:
    if isinstance(args.include_num_input_tokens_seen, bool):
        args.include_num_input_tokens_seen = "all" if args.include_num_input_tokens_seen else "no"
    if args.debug is None or isinstance(args.debug, str):
        args.debug = (args.debug or "").split()  # HF takes space-separated names


def _normalise_report_to(args: TrainingArguments) -> None:
    """report_to becomes a list of names; "none" is the empty list, "all" the installed trackers."""
    names = args.report_to
    if names is None or isinstance(names, str):
        names = [] if names is None else [names]
    names = list(names)
    if names in (["none"], []):
        args.report_to = []
    elif names == ["all"]:
        from .integrations.registry import available_integrations

        args.report_to = available_integrations()
        logger.info("report_to='all': reporting to %s", args.report_to)
    else:
        args.report_to = names
    if os.getenv("KUBEFLOW_TRAINER_SERVER_URL") is not None and "kubeflow" not in args.report_to:
        from .integrations.registry import is_installed

        if is_installed("kubeflow"):  # inside a Kubeflow TrainJob progress is reported, as in transformers 5.x
            args.report_to = [*args.report_to, "kubeflow"]


def _convert_enums(args: TrainingArguments) -> None:
    for name, enum_cls in _ENUM_FIELDS.items():
        value = getattr(args, name)
        try:
            setattr(args, name, enum_cls(_plain(value)))
        except ValueError:
            valid = ", ".join(repr(m.value) for m in enum_cls)
            raise _invalid(name, value, f"one of {valid}", f"pick one of those {enum_cls.__name__} names") from None


def _derive_eval_steps(args: TrainingArguments) -> None:
    # HF's rule: evaluating "every steps" without eval_steps (or with 0) evaluates as often as it logs.
    if args.eval_strategy == IntervalStrategy.STEPS and not args.eval_steps:
        if _is_number(args.logging_steps) and args.logging_steps <= 0:  # transformers refuses it here too
            raise _invalid("eval_steps", args.eval_steps, "set when logging_steps is not above 0 (eval_steps falls "
                           f"back to logging_steps={args.logging_steps!r})", "pass e.g. eval_steps=500")
        logger.info("eval_steps not set: using logging_steps=%s", args.logging_steps)
        args.eval_steps = args.logging_steps


def _derive_best_model_metric(args: TrainingArguments) -> None:
    # What compares evaluations needs a metric: HF defaults it to the loss, except for save_strategy="best",
    # where the Trainer asks for it (checks.check_best_metric_named)
    needs_metric = (
        args.load_best_model_at_end
        or args.lr_scheduler_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY)
    )
    if needs_metric and args.metric_for_best_model is None:
        args.metric_for_best_model = "loss"
    if args.greater_is_better is None and args.metric_for_best_model is not None:
        args.greater_is_better = not args.metric_for_best_model.endswith("loss")  # losses go down


def _derive_simple_defaults(args: TrainingArguments) -> None:
    if args.eval_strategy != IntervalStrategy.NO:
        args.do_eval = True  # HF: evaluating during training implies do_eval for the user's script
    if args.disable_tqdm is None:
        args.disable_tqdm = logging.getLogger("cadence").getEffectiveLevel() > logging.WARNING
    if args.use_cpu:
        args.dataloader_pin_memory = False  # pinning only speeds up copies to a GPU


def _derive_torch_compile(args: TrainingArguments) -> None:
    # HF's rule: naming a backend or mode turns compilation on; the backend defaults to inductor.
    if args.torch_compile_backend is not None or args.torch_compile_mode is not None:
        args.torch_compile = True
    if args.torch_compile and args.torch_compile_backend is None:
        args.torch_compile_backend = "inductor"
