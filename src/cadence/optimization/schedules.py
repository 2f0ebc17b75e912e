"""Schedules: the ``get_*_schedule_with_warmup`` factories and the ``lr_scheduler_type`` table."""


from __future__ import annotations

import inspect
import logging
import math
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau


from .greedy import GreedyLR, get_greedy_schedule
from .options import _as_name

logger = logging.getLogger(__name__)


# =============================================================================================
# Learning-rate factors. Module-level functions: a partial of one pickles as numbers only.
# =============================================================================================


def _warmup_factor(step: int, num_warmup_steps: int) -> float:
    return float(step) / float(max(1, num_warmup_steps))


def _constant_factor(_: int | None = None) -> int:
    return 1


def _constant_with_warmup_factor(step: int, *, num_warmup_steps: int) -> float:
    return _warmup_factor(step, num_warmup_steps) if step < num_warmup_steps else 1.0


def _linear_factor(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return _warmup_factor(step, num_warmup_steps)
    remaining = float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, remaining)


def _cosine_factor(
    step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float, min_lr_rate: float = 0.0
) -> float:
    if step < num_warmup_steps:
        return _warmup_factor(step, num_warmup_steps)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    wave = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return max(0.0, wave * (1.0 - min_lr_rate) + min_lr_rate)


def _hard_restarts_factor(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int) -> float:
    if step < num_warmup_steps:
        return _warmup_factor(step, num_warmup_steps)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def _polynomial_factor(
    step: int, *, num_warmup_steps: int, num_training_steps: int, lr_end: float, power: float, lr_init: float
) -> float:
    if step < num_warmup_steps:
        return _warmup_factor(step, num_warmup_steps)
    if step > num_training_steps:
        return lr_end / lr_init  # LambdaLR multiplies the factor by lr_init
    # max(1, ...): warmup == training steps would otherwise divide by zero on the last step
    remaining = 1 - (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def _inverse_sqrt_factor(step: int, *, num_warmup_steps: int, timescale: int) -> float:
    if step < num_warmup_steps:
        return _warmup_factor(step, num_warmup_steps)
    shift = timescale - num_warmup_steps
    return 1.0 / math.sqrt((step + shift) / timescale)


def _cosine_warmup_with_min_lr_factor(
    step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float,
    min_lr_rate: float = 0.0,
    warmup_lr_rate: float | None = None,
) -> float:
    # Unlike "cosine_with_min_lr", this schedule counts from step+1: its first lr is not 0.
    step, warmup, total = float(step), float(num_warmup_steps), float(num_training_steps)
    if step < warmup:
        if warmup_lr_rate is None:
            return (step + 1.0) / max(1.0, warmup)
        start = float(warmup_lr_rate)
        return start + (1.0 - start) * step / max(1, warmup - 1)
    progress = (step - warmup + 1.0) / max(1.0, total - warmup)
    wave = 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
    return max(0.0, wave * (1.0 - min_lr_rate) + min_lr_rate)


# Warmup-stable-decay shapes, as functions of progress in [0, 1) through their phase.
_WSD_WARMUP_SHAPES: dict[str, Callable[[float], float]] = {
    "linear": lambda p: p,
    "cosine": lambda p: 0.5 * (1.0 - math.cos(math.pi * p)),
    "1-sqrt": lambda p: 1.0 - math.sqrt(1.0 - p),
}
_WSD_DECAY_SHAPES: dict[str, Callable[[float, float], float]] = {
    "linear": lambda p, cycles: 1.0 - p,
    "cosine": lambda p, cycles: 0.5 * (1.0 + math.cos(math.pi * float(cycles) * 2.0 * p)),
    "1-sqrt": lambda p, cycles: 1.0 - math.sqrt(p),
}


def _wsd_factor(
    step: int,
    *,
    num_warmup_steps: int,
    num_stable_steps: int,
    num_decay_steps: int,
    warmup_type: str,
    decay_type: str,
    min_lr_ratio: float,
    num_cycles: float,
) -> float:
    if step < num_warmup_steps:
        shape = _WSD_WARMUP_SHAPES[warmup_type](float(step) / float(max(1, num_warmup_steps)))
        return max(0.0, shape * (1.0 - min_lr_ratio) + min_lr_ratio)
    decay_start = num_warmup_steps + num_stable_steps
    if step < decay_start:
        return 1.0
    if step < decay_start + num_decay_steps:
        progress = float(step - decay_start) / float(max(1, num_decay_steps))
        shape = _WSD_DECAY_SHAPES[decay_type](progress, num_cycles)
        return max(0.0, shape * (1.0 - min_lr_ratio) + min_lr_ratio)
    return min_lr_ratio


# =============================================================================================
# Schedules (transformers' names and signatures)
# =============================================================================================


def get_constant_schedule(optimizer: Optimizer, last_epoch: int = -1) -> LambdaLR:
    """Constant learning rate: the optimizer's own lr at every step.

    Args:
        optimizer: the optimizer whose lr is scheduled.
        last_epoch: the index of the last step when resuming (-1 starts fresh).

    Returns:
        A ``LambdaLR``.
    """
    return LambdaLR(optimizer, _constant_factor, last_epoch=last_epoch)


def get_reduce_on_plateau_schedule(optimizer: Optimizer, **kwargs: Any) -> ReduceLROnPlateau:
    """Constant lr that drops when the metric passed to ``step(metric)`` stops improving.

    Args:
        optimizer: the optimizer whose lr is scheduled.
        **kwargs: ``torch.optim.lr_scheduler.ReduceLROnPlateau`` options (mode, factor, patience, ...).

    Returns:
        A ``ReduceLROnPlateau``.
    """
    return ReduceLROnPlateau(optimizer, **kwargs)


def get_constant_schedule_with_warmup(optimizer: Optimizer, num_warmup_steps: int, last_epoch: int = -1) -> LambdaLR:
    """Linear warmup from 0 to the optimizer's lr over ``num_warmup_steps``, then constant.

    Args:
        optimizer: the optimizer whose lr is scheduled.
        num_warmup_steps: steps of the warmup.
        last_epoch: the index of the last step when resuming (-1 starts fresh).

    Returns:
        A ``LambdaLR``.
    """
    factor = partial(_constant_with_warmup_factor, num_warmup_steps=num_warmup_steps)
    return LambdaLR(optimizer, factor, last_epoch=last_epoch)


def get_linear_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup from 0 to the optimizer's lr, then linear decay to 0 at ``num_training_steps``.

    Args:
        optimizer: the optimizer whose lr is scheduled.
        num_warmup_steps: steps of the warmup.
        num_training_steps: total steps; the lr reaches 0 here.
        last_epoch: the index of the last step when resuming (-1 starts fresh).

    Returns:
        A ``LambdaLR``.

    Example:
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = get_linear_schedule_with_warmup(opt, 2, 4)
        >>> lrs = []
        >>> for _ in range(5):
        ...     lrs.append(sched.get_last_lr()[0])
        ...     opt.step()
        ...     sched.step()
        >>> lrs
        [0.0, 0.5, 1.0, 0.5, 0.0]
    """
    factor = partial(_linear_factor, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps)
    return LambdaLR(optimizer, factor, last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int, num_cycles: float = 0.5, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup, then a cosine from the optimizer's lr down to 0.

    Args:
        optimizer: the optimizer whose lr is scheduled.
        num_warmup_steps: steps of the warmup.
        num_training_steps: total steps.
        num_cycles: cosine periods over the decay (0.5: one half-cosine from the top to 0).
        last_epoch: the index of the last step when resuming (-1 starts fresh).

    Returns:
        A ``LambdaLR``.
    """
    factor = partial(
        _cosine_factor, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, num_cycles=num_cycles
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_cosine_with_hard_restarts_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int, num_cycles: int = 1, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup, then ``num_cycles`` half-cosines from the lr to 0, each restarting at the top.

    Args:
        optimizer: the optimizer whose lr is scheduled.
        num_warmup_steps: steps of the warmup.
        num_training_steps: total steps.
        num_cycles: how many half-cosines (hard restarts) over the decay.
        last_epoch: the index of the last step when resuming (-1 starts fresh).

    Returns:
        A ``LambdaLR``.
    """
    factor = partial(
        _hard_restarts_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_polynomial_decay_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_end: float = 1e-7,
    power: float = 1.0,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then a polynomial decay from the optimizer's lr to ``lr_end`` (BERT/fairseq).

    Args:
        optimizer: the optimizer whose lr is scheduled; its ``defaults["lr"]`` is the start lr.
        num_warmup_steps: steps of the warmup.
        num_training_steps: total steps; the lr stays at ``lr_end`` after them.
        lr_end: the final lr (must be below the start lr).
        power: the polynomial's power (1.0: linear).
        last_epoch: the index of the last step when resuming (-1 starts fresh).

    Returns:
        A ``LambdaLR``.
    """
    lr_init = optimizer.defaults["lr"]
    if not lr_init > lr_end:
        raise ValueError(f"lr_end ({lr_end}) must be smaller than the initial lr ({lr_init})")
    factor = partial(
        _polynomial_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        lr_end=lr_end,
        power=power,
        lr_init=lr_init,
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_inverse_sqrt_schedule(
    optimizer: Optimizer, num_warmup_steps: int, timescale: int | None = None, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup, then the lr times ``1 / sqrt((step + timescale - warmup) / timescale)``.

    Args:
        optimizer: the optimizer whose lr is scheduled.
        num_warmup_steps: steps of the warmup.
        timescale: the decay's time scale; defaults to ``num_warmup_steps`` (or 10000 without warmup).
        last_epoch: the index of the last step when resuming (-1 starts fresh).

    Returns:
        A ``LambdaLR``.
    """
    if timescale is None:
        timescale = num_warmup_steps or 10_000
    factor = partial(_inverse_sqrt_factor, num_warmup_steps=num_warmup_steps, timescale=timescale)
    return LambdaLR(optimizer, factor, last_epoch=last_epoch)


def _min_lr_rate(optimizer: Optimizer, min_lr: float | None, min_lr_rate: float | None) -> float:
    """The floor of a cosine schedule as a fraction of the start lr, from exactly one of the two options."""
    if min_lr is not None and min_lr_rate is not None:
        raise ValueError("Set only one of min_lr or min_lr_rate")
    if min_lr is not None:
        return min_lr / optimizer.defaults["lr"]
    if min_lr_rate is None:
        raise ValueError("Set one of min_lr or min_lr_rate (through `lr_scheduler_kwargs`)")
    return min_lr_rate


def get_cosine_with_min_lr_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
) -> LambdaLR:
    """Linear warmup, then a cosine from the optimizer's lr down to a floor (``min_lr`` or ``min_lr_rate``).

    Args:
        optimizer: the optimizer whose lr is scheduled.
        num_warmup_steps: steps of the warmup.
        num_training_steps: total steps.
        num_cycles: cosine periods over the decay (0.5: one half-cosine).
        last_epoch: the index of the last step when resuming (-1 starts fresh).
        min_lr: the floor as an absolute lr.
        min_lr_rate: the floor as a fraction of the start lr (set exactly one of the two).

    Returns:
        A ``LambdaLR``.
    """
    factor = partial(
        _cosine_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=_min_lr_rate(optimizer, min_lr, min_lr_rate),
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
    warmup_lr_rate: float | None = None,
) -> LambdaLR:
    """Like ``get_cosine_with_min_lr_schedule_with_warmup`` but the warmup starts above 0.

    The warmup starts at ``warmup_lr_rate`` times the lr (default ``1 / num_warmup_steps``) and the
    steps are counted from 1, so neither the first nor the last lr of a phase is wasted.

    Args:
        optimizer: the optimizer whose lr is scheduled.
        num_warmup_steps: steps of the warmup.
        num_training_steps: total steps.
        num_cycles: cosine periods over the decay (0.5: one half-cosine).
        last_epoch: the index of the last step when resuming (-1 starts fresh).
        min_lr: the floor as an absolute lr.
        min_lr_rate: the floor as a fraction of the start lr (set exactly one of the two).
        warmup_lr_rate: the first warmup lr as a fraction of the start lr.

    Returns:
        A ``LambdaLR``.
    """
    factor = partial(
        _cosine_warmup_with_min_lr_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=_min_lr_rate(optimizer, min_lr, min_lr_rate),
        warmup_lr_rate=warmup_lr_rate,
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_wsd_schedule(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_decay_steps: int,
    num_training_steps: int | None = None,
    num_stable_steps: int | None = None,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Warmup-stable-decay: warm up to the lr, hold it, decay to ``min_lr_ratio`` times it.

    Args:
        optimizer: the optimizer whose lr is scheduled.
        num_warmup_steps: steps of the warmup (which starts at ``min_lr_ratio`` times the lr).
        num_decay_steps: steps of the decay.
        num_training_steps: total steps; the stable phase is what warmup and decay leave of it.
        num_stable_steps: steps of the stable phase (wins over ``num_training_steps``).
        warmup_type: "linear", "cosine" or "1-sqrt".
        decay_type: "linear", "cosine" or "1-sqrt".
        min_lr_ratio: the floor as a fraction of the lr; also the lr after the decay.
        num_cycles: cosine periods of a cosine decay (0.5: one half-cosine).
        last_epoch: the index of the last step when resuming (-1 starts fresh).

    Returns:
        A ``LambdaLR``.
    """
    if num_training_steps is None and num_stable_steps is None:
        raise ValueError("get_wsd_schedule needs num_training_steps or num_stable_steps")
    if num_training_steps is not None and num_stable_steps is not None:
        warnings.warn("Both num_training_steps and num_stable_steps are set; num_stable_steps wins.")
    for option, value, shapes in (
        ("warmup_type", warmup_type, _WSD_WARMUP_SHAPES),
        ("decay_type", decay_type, _WSD_DECAY_SHAPES),
    ):
        if value not in shapes:
            raise ValueError(f"Unknown {option} {value!r}; expected one of {sorted(shapes)}")
    if num_stable_steps is None:
        num_stable_steps = num_training_steps - num_warmup_steps - num_decay_steps
    factor = partial(
        _wsd_factor,
        num_warmup_steps=num_warmup_steps,
        num_stable_steps=num_stable_steps,
        num_decay_steps=num_decay_steps,
        warmup_type=warmup_type,
        decay_type=decay_type,
        min_lr_ratio=min_lr_ratio,
        num_cycles=num_cycles,
    )
    return LambdaLR(optimizer, factor, last_epoch)


@dataclass(frozen=True)
class _Schedule:
    """How ``get_scheduler`` builds one ``lr_scheduler_type``."""

    factory: Callable[..., Any]
    steps: tuple[str, ...] = ()  # step counts passed on (num_warmup_steps / num_training_steps)
    required: tuple[str, ...] = ()  # the ones that must not be None, in the order they are checked
    # Whose signature lists the accepted scheduler_specific_kwargs; None: transformers drops them all.
    options_of: Callable[..., Any] | None = None

    def accepted_options(self) -> list[str]:
        if self.options_of is None:
            return []
        skip = {"self", "optimizer", *self.steps}
        params = inspect.signature(self.options_of).parameters.values()
        return sorted(p.name for p in params if p.name not in skip and p.kind is not p.VAR_KEYWORD)

    def checked_options(self, key: str, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` with each number-typed one a finite number (text such as YAML's "1e-6" read as one);
        anything else is a ValueError naming ``lr_scheduler_kwargs`` and the option, before any step."""
        params = inspect.signature(self.options_of).parameters
        checked = dict(options)
        for name, value in options.items():
            kind = _number_kind(params[name].annotation) if name in params else None
            if kind is None or value is None:
                continue
            if isinstance(value, str):
                try:
                    value = checked[name] = float(value) if kind == "float" else int(value)
                except ValueError:
                    pass
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not is_number or (kind == "int" and not float(value).is_integer()):
                default = params[name].default
                raise ValueError(
                    f"lr_scheduler_kwargs {name}={value!r} is invalid for the {key!r} lr scheduler: it must be a "
                    f"finite {'whole ' if kind == 'int' else ''}number; pass e.g. lr_scheduler_kwargs={{{name!r}: "
                    f"{default!r}}}"
                )
        return checked


def _number_kind(annotation: Any) -> str | None:
    """"float" or "int" for an option annotated as that type (or it or None); None for anything else."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    names = {part.strip() for part in text.split("|")} - {"None"}
    return names.pop() if len(names) == 1 and names <= {"float", "int"} else None


_WARMUP = ("num_warmup_steps",)
_WARMUP_AND_TOTAL = ("num_warmup_steps", "num_training_steps")


def _decaying(factory: Callable[..., Any]) -> _Schedule:
    """A schedule that needs both step counts and takes its own signature's options."""
    return _Schedule(factory, _WARMUP_AND_TOTAL, _WARMUP_AND_TOTAL, factory)


# Keyed by the string values of transformers' SchedulerType (lr_scheduler_type).
SCHEDULERS: dict[str, _Schedule] = {
    "linear": _decaying(get_linear_schedule_with_warmup),
    "cosine": _decaying(get_cosine_schedule_with_warmup),
    "cosine_with_restarts": _decaying(get_cosine_with_hard_restarts_schedule_with_warmup),
    "polynomial": _decaying(get_polynomial_decay_schedule_with_warmup),
    "constant": _Schedule(get_constant_schedule),
    "constant_with_warmup": _Schedule(get_constant_schedule_with_warmup, _WARMUP, _WARMUP),
    "inverse_sqrt": _Schedule(get_inverse_sqrt_schedule, _WARMUP, _WARMUP, get_inverse_sqrt_schedule),
    "reduce_lr_on_plateau": _Schedule(get_reduce_on_plateau_schedule, options_of=ReduceLROnPlateau),
    "cosine_with_min_lr": _decaying(get_cosine_with_min_lr_schedule_with_warmup),
    "cosine_warmup_with_min_lr": _decaying(get_cosine_with_min_lr_schedule_with_warmup_lr_rate),
    # num_training_steps may stay None here: num_stable_steps can replace it.
    "warmup_stable_decay": _Schedule(get_wsd_schedule, _WARMUP_AND_TOTAL, _WARMUP, get_wsd_schedule),
    "greedy": _Schedule(get_greedy_schedule, options_of=GreedyLR),
}

TYPE_TO_SCHEDULER_FUNCTION: dict[str, Callable[..., Any]] = {name: s.factory for name, s in SCHEDULERS.items()}


def get_scheduler(
    name: str,
    optimizer: Optimizer,
    num_warmup_steps: int | None = None,
    num_training_steps: int | None = None,
    scheduler_specific_kwargs: dict[str, Any] | None = None,
) -> Any:
    """Build the lr schedule called ``name`` (a ``lr_scheduler_type`` value).

    Args:
        name: "linear", "cosine", ... (a str or a str-Enum such as ``SchedulerType``).
        optimizer: the optimizer whose lr is scheduled.
        num_warmup_steps: warmup steps (required by every schedule except constant, plateau and greedy).
        num_training_steps: total steps (required by the decaying schedules).
        scheduler_specific_kwargs: extra options of that schedule (``lr_scheduler_kwargs``), e.g.
            ``{"num_cycles": 2}``; an option the schedule does not take raises ValueError.

    Returns:
        A ``LambdaLR``, ``ReduceLROnPlateau`` or ``GreedyLR``.

    Example:
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> get_scheduler("cosine", opt, 0, 10, {"num_cycles": 1.0}).get_last_lr()
        [1.0]
    """
    key = _as_name(name)
    schedule = SCHEDULERS.get(key)
    if schedule is None:
        raise ValueError(f"Unknown lr scheduler {key!r}; choose one of {sorted(SCHEDULERS)}")
    counts = {"num_warmup_steps": num_warmup_steps, "num_training_steps": num_training_steps}
    for arg in schedule.required:
        if counts[arg] is None:
            raise ValueError(f"The {key!r} lr scheduler requires `{arg}`, please provide that argument.")

    options = dict(scheduler_specific_kwargs or {})
    accepted = schedule.accepted_options()
    unknown = sorted(set(options) - set(accepted))
    if unknown and schedule.options_of is None:
        # transformers silently drops these; keep scripts running but say so.
        logger.warning("The %r lr scheduler takes no options; ignoring %s", key, unknown)
        options = {}
    elif unknown:
        raise ValueError(
            f"Unknown scheduler_specific_kwargs {unknown} for the {key!r} lr scheduler; it accepts {accepted}"
        )
    if options:
        options = schedule.checked_options(key, options)
    return schedule.factory(optimizer, **{arg: counts[arg] for arg in schedule.steps}, **options)
