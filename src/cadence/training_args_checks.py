"""``TrainingArguments``' checks: the value rules, choices and step intervals of single fields, the combinations of
fields, and what cadence refuses (not built yet, or by design). ``TrainingArguments.__post_init__`` runs them, in its
order, after ``training_args_parsing`` resolved the input forms.

Every ValueError names the field, the bad value and the fix. Nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any


from .trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType
from .training_args_types import _LOG_LEVELS

TrainingArguments = Any  # what the checks get: the arguments object (training_args.py sits above this module)

logger = logging.getLogger("cadence.training_args")  # the arguments' messages keep their logger's name


# =============================================================================================
# The tables: value rules, choices, refusals. Edit these, not the functions below.
# =============================================================================================
def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _at_least(low: float, integer: bool = False, optional: bool = False) -> Callable[[Any], bool]:
    is_kind = _is_int if integer else _is_number
    return lambda v: (optional and v is None) or (is_kind(v) and v >= low)


def _in_unit_interval(v: Any) -> bool:
    return _is_number(v) and 0 <= v < 1


def _is_warmup(v: Any) -> bool:
    # Whole steps (integral when >= 1, so 2.5 is not silently truncated) or a ratio below 1.
    return _is_number(v) and v >= 0 and (v < 1 or float(v).is_integer())


def _is_max_steps(v: Any) -> bool:
    return _is_int(v) and (v == -1 or v >= 1)


def _is_seed(v: Any) -> bool:
    return _is_int(v) and 0 <= v < 2**32  # numpy refuses seeds outside [0, 2**32)


# field -> (is_valid, what it must be, how to fix it)
_VALUE_RULES: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "learning_rate": (_at_least(0), ">= 0", "pass a positive learning rate such as 5e-5"),
    "weight_decay": (_is_number, "a number", "pass 0.0 for no decay or a small value such as 0.01"),
    "adam_beta1": (_in_unit_interval, "in [0, 1)", "the usual value is 0.9"),
    "adam_beta2": (_in_unit_interval, "in [0, 1)", "the usual value is 0.999"),
    "adam_epsilon": (_at_least(0), ">= 0", "the usual value is 1e-8"),
    "max_grad_norm": (lambda v: v is None or _is_number(v), "a number (<= 0 or None: no clipping)",
                      "pass 1.0, or 0 to disable"),
    "label_smoothing_factor": (_in_unit_interval, "in [0, 1)", "pass 0.0 to disable or a small value such as 0.1"),
    "gradient_accumulation_steps": (_at_least(1, integer=True), "an integer >= 1", "pass 1 for no accumulation"),
    "per_device_train_batch_size": (_at_least(1, integer=True), "an integer >= 1", "pass a batch size such as 8"),
    "per_device_eval_batch_size": (_at_least(1, integer=True), "an integer >= 1", "pass a batch size such as 8"),
    "num_train_epochs": (
        lambda v: _at_least(0)(v) and math.isfinite(v),
        "a finite number >= 0",
        "pass the number of passes over the data, such as 3 (for an open-ended run set max_steps instead)",
    ),
    "max_steps": (_is_max_steps, "an integer >= 1, or -1 for unset", "pass -1 to train for num_train_epochs"),
    "warmup_steps": (
        _is_warmup,
        "a whole number of steps >= 0 or a fraction in [0, 1) of the total steps",
        "pass e.g. warmup_steps=100 or warmup_steps=0.1",
    ),
    "eval_delay": (_at_least(0), ">= 0", "pass 0 to allow evaluation from the start"),
    "save_total_limit": (lambda v: v is None or _is_int(v), "None or an integer (<= 0: no limit)",
                         "pass None to keep every checkpoint"),
    "neftune_noise_alpha": (_at_least(0, optional=True), "None or >= 0", "pass None to add no noise, or e.g. 5.0"),
    "torch_empty_cache_steps": (_at_least(1, True, True), "None or an integer >= 1", "pass None to never empty it"),
    "eval_accumulation_steps": (_at_least(1, True, True), "None or an integer >= 1", "pass None to keep all"),
    "dataloader_num_workers": (_at_least(0, integer=True), "an integer >= 0", "pass 0 to load in the main process"),
    "dataloader_prefetch_factor": (_at_least(1, True, True), "None or an integer >= 1", "pass None or e.g. 2"),
    "seed": (_is_seed, "an integer in [0, 2**32)", "pass a seed such as 42"),
    "data_seed": (lambda v: v is None or _is_seed(v), "None or an integer in [0, 2**32)", "pass None to use seed"),
    "liger_kernel_config": (
        lambda v: v is None or (isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, bool) for k, x in v.items())),
        "None or a dict of Liger kernel names to True/False", "pass e.g. {'rms_norm': False, 'swiglu': True}",
    ),
}


# field -> (is it odd?, what cadence does with it): values transformers accepts that usually are a slip; warned.
_ODD_VALUES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "weight_decay": (lambda v: v < 0, "weights grow instead of decaying (transformers accepts it too)"),
    "max_grad_norm": (lambda v: v is not None and v < 0, "gradients are not clipped, as with 0"),
    "save_total_limit": (lambda v: v is not None and v <= 0, "every checkpoint is kept, as with None"),
}


# field -> the accepted values (fields that are plain strings, not enums, in HF).
_CHOICES: dict[str, tuple[str, ...]] = {
    "log_level": tuple(_LOG_LEVELS),
    "log_level_replica": tuple(_LOG_LEVELS),
    "train_sampling_strategy": ("random", "sequential", "group_by_length", "batch_rebalance"),
    "include_num_input_tokens_seen": ("no", "all", "non_padding"),
}


# (strategy field, its interval field): the interval is checked when the strategy is "steps".
_STEP_INTERVALS = (
    ("logging_strategy", "logging_steps"),
    ("eval_strategy", "eval_steps"),
    ("save_strategy", "save_steps"),
)


# Features cadence does not have yet. "field" is refused when set to a truthy value other than its
# default; "field=value" when it equals that value. When a feature lands, delete its line(s).
_NOT_YET_BUILT: dict[str, str] = {}  # empty: Liger kernels and batch_rebalance, its last entries, are built


# Settings cadence refuses on purpose, with the reason.
_REFUSED_BY_DESIGN: dict[str, str] = {
    "average_tokens_across_devices=False": (
        "cadence always divides the summed loss by the item count of all processes, so N processes train "
        "exactly like one; a per-process average would weight processes with fewer items more"
    ),
    "save_safetensors=False": (
        "cadence always writes weights as safetensors, whose loading cannot run code"
    ),
}


# =============================================================================================
# The checks, in the order __post_init__ runs them.
# =============================================================================================
def _invalid(name: str, value: Any, rule: str, fix: str) -> ValueError:
    return ValueError(f"{name}={value!r} is invalid: it must be {rule}; {fix}")


def _plain(value: Any) -> Any:
    """Enums as their values, recursively through lists."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@functools.cache
def _field_defaults(cls: type) -> dict[str, Any]:
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
    }


def _annotation_names(annotation: Any) -> set[str]:
    """``"bool | None"`` (or ``Optional[bool]``, or the type objects) -> ``{"bool", "None"}``."""
    if isinstance(annotation, str):
        text = annotation.strip()
        if text.startswith("Optional[") and text.endswith("]"):
            text = text[len("Optional["):-1] + " | None"
        return {part.strip() for part in text.split("|")}
    members = typing.get_args(annotation) or (annotation,)
    return {"None" if m is type(None) else getattr(m, "__name__", str(m)) for m in members}


@functools.cache
def _scalar_fields(cls: type) -> dict[str, str]:
    """field -> "bool", "int" or "float": the fields of exactly that type (or it or None)."""
    kinds = {}
    for f in dataclasses.fields(cls):
        names = _annotation_names(f.type) - {"None"}
        if len(names) == 1 and (kind := names.pop()) in ("bool", "int", "float"):
            kinds[f.name] = kind
    return kinds


def _check_finite(args: TrainingArguments) -> None:
    # inf or NaN in a learning rate, a decay or a beta trains to NaN weights while the run "succeeds".
    for name, kind in _scalar_fields(type(args)).items():
        value = getattr(args, name)
        if kind == "float" and isinstance(value, float) and not math.isfinite(value):
            fix = _VALUE_RULES[name][2] if name in _VALUE_RULES else f"pass a finite {name}"
            raise _invalid(name, value, "a finite number", fix)


def _check_value_rules(args: TrainingArguments) -> None:
    for name, (is_valid, rule, fix) in _VALUE_RULES.items():
        value = getattr(args, name)
        if not is_valid(value):
            raise _invalid(name, value, rule, fix)


def _warn_odd_values(args: TrainingArguments) -> None:
    for name, (is_odd, effect) in _ODD_VALUES.items():
        value = getattr(args, name)
        if is_odd(value):
            logger.warning("%s=%r: %s", name, value, effect)


def _check_choices(args: TrainingArguments) -> None:
    for name, choices in _CHOICES.items():
        value = getattr(args, name)
        if value not in choices:
            raise _invalid(name, value, f"one of {', '.join(map(repr, choices))}", "pick one of those")
    for name in args.report_to:
        if not isinstance(name, str):
            raise _invalid("report_to", args.report_to, "'none', 'all' or a list of names", "pass names as strings")


# A negative interval: transformers takes it (no rule refuses it) and its state turns it into ceil(max_steps * value),
# a negative number of steps; `step % n == 0` then holds at the multiples of |n|, and `save_steps > 0` never.
_NEGATIVE_INTERVAL = ("%s=%r is negative: accepted as transformers accepts it, and run as transformers runs it (the "
                      "interval becomes ceil(max_steps * value) steps): %s. Pass a whole number of steps >= 1 or a "
                      "fraction in (0, 1) of the run for a regular interval, e.g. %s=500 or %s=0.1")


_NEGATIVE_EFFECT = {
    "logging_steps": "training logs every |ceil(max_steps * value)| steps, so at most once at the end for a value <= -1",
    "eval_steps": "evaluations every |ceil(max_steps * value)| steps, so at most once at the end for a value <= -1",
    "save_steps": "no checkpoint during training, one when training ends",
}


def _check_step_intervals(args: TrainingArguments) -> None:
    """With a "steps" strategy the interval is a whole number of steps >= 1 or a ratio in (0, 1); save_steps=0 is
    accepted too, as in transformers, and a negative interval with a warning (transformers accepts it)."""
    for strategy, name in _STEP_INTERVALS:
        if getattr(args, strategy) != IntervalStrategy.STEPS:
            continue
        value = getattr(args, name)
        if name == "save_steps" and _is_number(value) and value == 0:
            continue  # transformers accepts it: no save during training, one when training ends
        if _is_number(value) and value < 0:  # transformers accepts it: warned, with what its arithmetic makes of it
            logger.warning(_NEGATIVE_INTERVAL, name, value, _NEGATIVE_EFFECT[name], name, name)
            continue
        if not (_is_number(value) and value > 0 and (value < 1 or float(value).is_integer())):
            raise _invalid(
                name,
                value,
                f"a whole number of steps >= 1 or a fraction in (0, 1) of the total steps when {strategy}='steps'",
                f"pass e.g. {name}=500 or {name}=0.1, or another {strategy}",
            )
        if value >= 1:
            setattr(args, name, int(value))


def _check_one_precision(args: TrainingArguments) -> None:
    for a, b in (("fp16", "bf16"), ("fp16_full_eval", "bf16_full_eval")):
        if getattr(args, a) and getattr(args, b):
            raise ValueError(
                f"{a}=True together with {b}=True is invalid: only one half-precision type can be used; keep one"
            )


def _check_bf16_device(args: TrainingArguments) -> None:
    """transformers' rule: bf16 without use_cpu needs a GPU that computes in bfloat16. Without one it would run
    bfloat16 autocast on the CPU unasked (TRL's configs default to bf16=True), so it is refused before training."""
    name = "bf16" if args.bf16 else "bf16_full_eval" if args.bf16_full_eval else None
    if name is None or args.use_cpu:
        return
    from .backend import accelerator_available, bf16_gpu_available  # only then: this module stays light to import

    if bf16_gpu_available():
        return
    where = ("this GPU does not compute in bfloat16 (it needs an Ampere or newer GPU)" if accelerator_available()
             else "this machine has no GPU")
    raise ValueError(
        f"{name}=True is invalid without use_cpu=True here: {where}, and bfloat16 on the CPU is used only when asked "
        f"for (as in transformers); pass use_cpu=True to train in bfloat16 on the CPU, or {name}=False for float32 "
        f"(TRL's configs default to bf16=True)"
    )


def _check_debug(args: TrainingArguments) -> None:
    for name in args.debug:
        if name == "tpu_metrics_debug":
            raise ValueError(f"debug={args.debug!r}: 'tpu_metrics_debug' is not built in cadence yet (no TPU support); "
                             "remove it")
        if name != "underflow_overflow":
            raise _invalid("debug", args.debug, "'underflow_overflow' (space-separated names)", f"remove {name!r}")


def _check_best_model_strategies(args: TrainingArguments) -> None:
    """load_best_model_at_end reloads a saved evaluation point: saves must land on evaluations."""
    if not args.load_best_model_at_end or args.save_strategy == SaveStrategy.BEST:
        return
    if args.eval_strategy != args.save_strategy:
        raise ValueError(
            f"save_strategy={args.save_strategy.value!r} is invalid with load_best_model_at_end=True and "
            f"eval_strategy={args.eval_strategy.value!r}: the two strategies must match so that every evaluated "
            f"model is saved; set save_strategy={args.eval_strategy.value!r} (or 'best')"
        )
    if args.eval_strategy == IntervalStrategy.STEPS and not _is_multiple(args.save_steps, args.eval_steps):
        raise ValueError(
            f"save_steps={args.save_steps!r} is invalid with load_best_model_at_end=True: it must be a multiple "
            f"of eval_steps={args.eval_steps!r} (both whole steps or both ratios); set save_steps={args.eval_steps!r}"
        )


def _is_multiple(save_steps: float, eval_steps: float) -> bool:
    if save_steps == 0:
        return True  # saves only at the end, which evaluates too (transformers: 0 % eval_steps == 0)
    if (save_steps < 1) != (eval_steps < 1):
        return False  # a ratio and a step count: no multiple can be guaranteed
    # Ratios compared in millionths, so that 0.3 counts as a multiple of 0.1 despite float error.
    return round(save_steps * 1_000_000) % round(eval_steps * 1_000_000) == 0


def _check_scheduler_needs_eval(args: TrainingArguments) -> None:
    if args.lr_scheduler_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY):
        if args.eval_strategy == IntervalStrategy.NO:
            raise ValueError(
                f"lr_scheduler_type={args.lr_scheduler_type.value!r} is invalid with eval_strategy='no': this "
                f"schedule reacts to evaluation metrics; set eval_strategy='steps' or 'epoch'"
            )


def _check_prefetch_needs_workers(args: TrainingArguments) -> None:
    if args.dataloader_prefetch_factor is not None and args.dataloader_num_workers == 0:
        raise ValueError(
            f"dataloader_prefetch_factor={args.dataloader_prefetch_factor!r} is invalid with "
            f"dataloader_num_workers=0: only worker processes prefetch; set dataloader_num_workers > 0 or "
            f"leave dataloader_prefetch_factor=None"
        )


def _refuse_from_table(args: TrainingArguments, table: dict[str, str], verdict: str) -> None:
    defaults = _field_defaults(type(args))
    for key, what in table.items():
        name, _, refused_value = key.partition("=")
        value = getattr(args, name)
        if refused_value:
            refused = str(_plain(value)) == refused_value
        else:
            refused = bool(value) and _plain(value) != _plain(defaults[name])
        if refused:
            raise ValueError(
                f"{name}={_plain(value)!r} {verdict} ({what}); remove it or pass {name}={_plain(defaults[name])!r}. "
                f"cadence refuses rather than silently ignoring a setting."
            )


def _check_positive_steps(strategy: Any, steps: Any, setter: str) -> None:
    if str(_plain(strategy)) == "steps" and not steps:
        raise ValueError(f"{setter}(strategy='steps', steps={steps!r}) is invalid: 'steps' needs steps > 0; pass e.g. steps=500")


def _refuse_unbuilt_integrations(args: TrainingArguments) -> None:
    from .integrations.registry import check_names  # names only: no tracker package is imported here

    check_names(args.report_to)
