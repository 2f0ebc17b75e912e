"""Optimizers and learning-rate schedules, at the names users import from ``transformers.optimization``.

Two dispatch tables drive everything:

- ``SCHEDULERS``: ``lr_scheduler_type`` string -> how to build the schedule (which step counts it
  needs, which ``lr_scheduler_kwargs`` it accepts). ``get_scheduler`` reads it.
- ``OPTIMIZERS``: ``optim`` string -> ``entry(args, model=None) -> (optimizer_cls, kwargs)``.
  ``create_optimizer`` reads it after splitting the parameters into a weight-decay group and a
  no-decay group.

Every schedule multiplies the optimizer's initial lr by a factor computed by a module-level function
bound with ``functools.partial`` (not a lambda), so ``LambdaLR.state_dict()`` holds only numbers and
a ``scheduler.pt`` loads with ``torch.load(weights_only=True)``, from either library. The factors are
the same floating-point expressions as transformers', so the per-step learning rates are identical.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import inspect
import logging
import math
import re
import sys
import warnings
from dataclasses import dataclass
from functools import cache as functools_cache, partial
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from .trainer_utils import check_target_module_exists

logger = logging.getLogger(__name__)

__all__ = [
    "Adafactor",
    "AdafactorSchedule",
    "GreedyLR",
    "LayerwiseOptimizer",
    "OPTIMIZERS",
    "SCHEDULERS",
    "TYPE_TO_SCHEDULER_FUNCTION",
    "check_optimizer",
    "create_optimizer",
    "get_adafactor_schedule",
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
    "get_decay_parameter_names",
    "get_greedy_schedule",
    "get_inverse_sqrt_schedule",
    "get_linear_schedule_with_warmup",
    "get_optimizer_cls_and_kwargs",
    "get_parameter_groups",
    "get_parameter_names",
    "get_polynomial_decay_schedule_with_warmup",
    "get_reduce_on_plateau_schedule",
    "get_scheduler",
    "get_wsd_schedule",
    "eval_weights",
    "is_optimizer_factory",
    "parse_optim_args",
    "set_optimizer_mode",
]


def _as_name(value: Any) -> str:
    """A plain string from a str or a str-Enum member (``SchedulerType.LINEAR`` -> ``"linear"``)."""
    return str(getattr(value, "value", value))


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


class _RollingMean:
    """Mean of the last ``window_size`` values (a running sum, so each update is O(1))."""

    def __init__(self, window_size: int) -> None:
        self.window_size = window_size
        self.values: collections.deque[float] = collections.deque()
        self.sum = 0.0

    def add(self, value: float) -> float:
        self.values.append(value)
        self.sum += value
        if len(self.values) > self.window_size:
            self.sum -= self.values.popleft()
        return self.sum / len(self.values)

    # Same keys as transformers' StreamingAverage, so GreedyLR checkpoints cross over.
    def state_dict(self) -> dict[str, Any]:
        return {"window_size": self.window_size, "values": list(self.values), "sum": self.sum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window_size = state.get("window_size", self.window_size)
        self.values = collections.deque(state.get("values", []))
        self.sum = state.get("sum", 0.0)


class GreedyLR:
    """Adaptive lr (arXiv:2512.14527): divide the lr by ``factor`` while the metric keeps improving,
    multiply by it when the metric plateaus; reset to the start after ``reset_start`` plateaus at the floor.

    Call ``step(metric)`` once per evaluation (or step), like ``ReduceLROnPlateau``.

    Args:
        optimizer: the optimizer whose lr is scheduled.
        mode: "min" (lower metric is better) or "max".
        factor: multiplier (< 1) applied on a plateau; its inverse on improvement.
        patience: calls without improvement (or with improvement) before the lr changes.
        threshold: the least change that counts as an improvement.
        threshold_mode: "abs" or "rel".
        cooldown: calls to ignore after a decrease.
        warmup: calls to ignore after an increase.
        min_lr: floor lr, one value or one per param group.
        max_lr: ceiling lr, one value or one per param group.
        eps: lr changes smaller than this are skipped.
        verbose: log every change.
        smooth: judge a rolling mean of the metric over ``window_size`` calls.
        window_size: the rolling window when ``smooth``.
        reset_start: plateaus at the floor before the lr and counters reset.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.95,
        patience: int = 10,
        threshold: float = 1e-6,
        threshold_mode: str = "abs",
        cooldown: int = 0,
        warmup: int = 0,
        min_lr: float | list[float] = 1e-3,
        max_lr: float | list[float] = 1.0,
        eps: float = 1e-8,
        verbose: bool = False,
        smooth: bool = False,
        window_size: int = 50,
        reset_start: int = 500,
    ) -> None:
        if factor >= 1.0:
            raise ValueError("GreedyLR factor must be < 1.0")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        if mode not in ("min", "max"):
            raise ValueError(f"GreedyLR mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"GreedyLR threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        self.optimizer = optimizer
        self.min_lrs = self._per_group(min_lr, "min_lr")
        self.max_lrs = self._per_group(max_lr, "max_lr")
        self.factor, self.patience, self.verbose = factor, patience, verbose
        self.cooldown, self.warmup, self.cooldown_counter, self.warmup_counter = cooldown, warmup, 0, 0
        self.mode, self.threshold, self.threshold_mode, self.eps = mode, threshold, threshold_mode, eps
        self.smooth, self.window_size = smooth, window_size
        self.reset_start = self.reset_start_original = reset_start
        self.last_epoch = 0
        self._init_lrs = [group["lr"] for group in optimizer.param_groups]
        self._last_lr = list(self._init_lrs)
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = self.num_good_epochs = 0
        self._streaming_avg = _RollingMean(window_size) if smooth else None

    def _per_group(self, value: float | list[float], option: str) -> list[float]:
        groups = len(self.optimizer.param_groups)
        if isinstance(value, (list, tuple)):
            if len(value) != groups:
                raise ValueError(f"expected {groups} values of {option}, got {len(value)}")
            return list(value)
        return [value] * groups

    def step(self, metrics: float, epoch: int | None = None) -> None:
        """Judge one metric value and move the lr if patience ran out.

        Args:
            metrics: the metric value.
            epoch: the call's index (default: the last one plus 1).
        """
        current = float(metrics)
        if self._streaming_avg is not None:
            current = self._streaming_avg.add(current)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch

        if self.cooldown_counter > 0 or self.warmup_counter > 0:
            # Right after a change: let the metric settle before judging again.
            if self.cooldown_counter > 0:
                self.cooldown_counter -= 1
            else:
                self.warmup_counter -= 1
            self.num_bad_epochs = self.num_good_epochs = 0
        else:
            if self.is_better(current, self.best):
                self.best = current
                self.num_bad_epochs, self.num_good_epochs = 0, self.num_good_epochs + 1
            else:
                self.num_bad_epochs, self.num_good_epochs = self.num_bad_epochs + 1, 0
            if self.num_good_epochs > self.patience:
                self._increase_lr()
                self.warmup_counter, self.num_good_epochs = self.warmup, 0
            elif self.num_bad_epochs > self.patience:
                self._reduce_lr()
                self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def is_better(self, current: float, best: float) -> bool:
        """Whether ``current`` beats ``best`` by more than the threshold."""
        relative = self.threshold_mode == "rel"
        if self.mode == "min":
            return current < (best * (1.0 - self.threshold) if relative else best - self.threshold)
        return current > (best * (1.0 + self.threshold) if relative else best + self.threshold)

    def _reduce_lr(self) -> None:
        all_at_floor = True
        for i, group in enumerate(self.optimizer.param_groups):
            old_lr = float(group["lr"])
            new_lr = max(old_lr * self.factor, self.min_lrs[i])
            if old_lr - new_lr > self.eps:
                group["lr"] = new_lr
                if self.verbose:
                    logger.info("GreedyLR step %d: lr of group %d reduced to %.4e", self.last_epoch, i, new_lr)
            all_at_floor = all_at_floor and not group["lr"] > self.min_lrs[i]
        if all_at_floor:
            self.reset_start -= 1
            if self.reset_start <= 0:
                self._reset()

    def _increase_lr(self) -> None:
        for i, group in enumerate(self.optimizer.param_groups):
            old_lr = float(group["lr"])
            new_lr = min(old_lr / self.factor, self.max_lrs[i])
            if new_lr - old_lr > self.eps:
                group["lr"] = new_lr
                if self.verbose:
                    logger.info("GreedyLR step %d: lr of group %d increased to %.4e", self.last_epoch, i, new_lr)
        self.reset_start = self.reset_start_original

    def _reset(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self._init_lrs):
            group["lr"] = lr
        self.best = math.inf if self.mode == "min" else -math.inf
        self.num_bad_epochs = self.num_good_epochs = self.cooldown_counter = self.warmup_counter = 0
        self.reset_start = self.reset_start_original
        if self.smooth:
            self._streaming_avg = _RollingMean(self.window_size)
        if self.verbose:
            logger.info("GreedyLR reset to its initial state")

    def get_last_lr(self) -> list[float]:
        """The lr of each param group after the last ``step``."""
        return self._last_lr

    # transformers' key names, so a scheduler.pt from either library loads in the other.
    _STATE_KEYS = (
        "factor", "min_lrs", "max_lrs", "patience", "verbose", "cooldown", "warmup", "cooldown_counter",
        "warmup_counter", "mode", "threshold", "threshold_mode", "best", "num_bad_epochs", "num_good_epochs",
        "eps", "last_epoch", "smooth", "window_size", "reset_start", "reset_start_original", "_last_lr", "_init_lrs",
    )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer, as plain numbers and strings."""
        state = {key: getattr(self, key) for key in self._STATE_KEYS}
        if self._streaming_avg is not None:
            state["_streaming_avg"] = self._streaming_avg.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output, and put the saved lrs back into the optimizer."""
        for key in self._STATE_KEYS:
            if key in state_dict:
                setattr(self, key, state_dict[key])
        if "_streaming_avg" in state_dict:
            self._streaming_avg = self._streaming_avg or _RollingMean(self.window_size)
            self._streaming_avg.load_state_dict(state_dict["_streaming_avg"])
        if "_last_lr" in state_dict:
            for group, lr in zip(self.optimizer.param_groups, self._last_lr):
                group["lr"] = lr


# schedulers that step on an evaluation metric (the Trainer calls step(metric) after evaluating)
METRIC_SCHEDULERS = (ReduceLROnPlateau, GreedyLR)


def get_greedy_schedule(optimizer: Optimizer, **kwargs: Any) -> GreedyLR:
    """A ``GreedyLR`` (metric-driven lr); ``kwargs`` are its options.

    Returns:
        A ``GreedyLR``.
    """
    return GreedyLR(optimizer, **kwargs)


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


# =============================================================================================
# Adafactor (Shazeer & Stern, 2018, arXiv:1804.04235)
# =============================================================================================


def _rms(tensor: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(tensor) / math.sqrt(tensor.numel())


class Adafactor(Optimizer):
    """Adafactor: Adam-like steps with a factored second moment, so a matrix costs O(rows + cols) memory.

    For parameters with 2 or more dims the running mean of ``grad**2`` is kept as a row vector and a
    column vector (their outer product, normalised, estimates the full matrix); 1-D parameters keep
    the full vector. The update ``grad / sqrt(v)`` is clipped to RMS ``clip_threshold``, scaled by the
    step size, optionally averaged with momentum ``beta1``, and subtracted. With ``relative_step`` the
    step size is ``min(1e-2, 1/sqrt(step))`` (or ``1e-6 * step`` with ``warmup_init``) and ``lr`` must be
    None; with ``scale_parameter`` it is also multiplied by ``max(eps[1], RMS(param))``. The state uses
    transformers' key names, so optimizer checkpoints cross over.

    Args:
        params: parameters or param-group dicts.
        lr: the external lr (None with ``relative_step``).
        eps: (added to ``grad**2``, floor of the parameter scale).
        clip_threshold: the largest RMS of an update.
        decay_rate: the second-moment decay is ``1 - step**decay_rate``.
        beta1: momentum of the update (None: no first moment, the memory-saving default).
        weight_decay: decoupled weight decay, scaled by the step size.
        scale_parameter: scale the step size by the parameter's RMS.
        relative_step: compute the step size from the step count instead of ``lr``.
        warmup_init: with ``relative_step``, grow the step size linearly from 0.

    Example:
        >>> layer = torch.nn.Linear(4, 3)
        >>> opt = Adafactor(layer.parameters(), lr=1e-3, scale_parameter=False, relative_step=False)
        >>> layer(torch.ones(2, 4)).sum().backward(); opt.step()
        >>> sorted(opt.state[layer.weight])
        ['RMS', 'exp_avg_sq_col', 'exp_avg_sq_row', 'step']
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: float | None = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = True,
        warmup_init: bool = False,
    ) -> None:
        if lr is not None and relative_step:
            raise ValueError("Adafactor: a manual `lr` cannot be combined with relative_step=True")
        if warmup_init and not relative_step:
            raise ValueError("Adafactor: warmup_init=True requires relative_step=True")
        defaults = {
            "lr": lr,
            "eps": eps,
            "clip_threshold": clip_threshold,
            "decay_rate": decay_rate,
            "beta1": beta1,
            "weight_decay": weight_decay,
            "scale_parameter": scale_parameter,
            "relative_step": relative_step,
            "warmup_init": warmup_init,
        }
        super().__init__(params, defaults)

    @staticmethod
    def _get_lr(group: dict[str, Any], state: dict[str, Any]) -> Any:
        """The step size of one parameter (transformers' name: AdafactorSchedule reads it)."""
        step_size = group["lr"]
        if group["relative_step"]:
            ceiling = 1e-6 * state["step"] if group["warmup_init"] else 1e-2
            step_size = min(ceiling, 1.0 / math.sqrt(state["step"]))
        if not group["scale_parameter"]:
            return step_size
        rms, floor = state["RMS"], group["eps"][1]
        # clamp, not max(): max() would read the tensor back to the host on every parameter.
        scale = rms.clamp(min=floor) if isinstance(rms, torch.Tensor) else max(floor, rms)
        return scale * step_size

    def _init_state(self, state: dict[str, Any], grad: torch.Tensor, factored: bool, momentum: bool) -> None:
        state["step"] = 0
        state["RMS"] = 0
        if momentum:
            state["exp_avg"] = torch.zeros_like(grad)
        if factored:
            state["exp_avg_sq_row"] = grad.new_zeros(grad.shape[:-1])
            state["exp_avg_sq_col"] = grad.new_zeros(grad.shape[:-2] + grad.shape[-1:])
        else:
            state["exp_avg_sq"] = torch.zeros_like(grad)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient.

        Args:
            closure: re-evaluates the model and returns the loss (optional).

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        if p.grad.is_sparse:
            raise RuntimeError("Adafactor does not support sparse gradients.")
        low_precision = p.dtype in (torch.float16, torch.bfloat16)
        # Low-precision parameters are updated in float32 and copied back.
        grad = p.grad.float() if p.grad.dtype in (torch.float16, torch.bfloat16) else p.grad
        param = p.float() if low_precision else p
        factored, momentum = grad.dim() >= 2, group["beta1"] is not None

        state = self.state[p]
        if not state:
            self._init_state(state, grad, factored, momentum)
        else:
            # A loaded state comes back in the parameter's dtype; the moments live in the grad's.
            for key in ("exp_avg", "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(grad)

        state["step"] += 1
        state["RMS"] = _rms(param)
        lr = self._get_lr(group, state)
        beta2 = 1.0 - math.pow(state["step"], group["decay_rate"])

        squared = grad.square().add_(group["eps"][0])
        if factored:
            row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
            row.mul_(beta2).add_(squared.mean(dim=-1), alpha=1.0 - beta2)
            col.mul_(beta2).add_(squared.mean(dim=-2), alpha=1.0 - beta2)
            # v ~= outer(row, col) / mean(row): the rank-1 estimate of the full second moment.
            row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
            update = row_factor * col.rsqrt().unsqueeze(-2) * grad
        else:
            v = state["exp_avg_sq"]
            v.mul_(beta2).add_(squared, alpha=1.0 - beta2)
            update = v.rsqrt() * grad

        update.div_((_rms(update) / group["clip_threshold"]).clamp_(min=1.0))
        update.mul_(lr)
        if momentum:
            update = state["exp_avg"].mul_(group["beta1"]).add_(update, alpha=1.0 - group["beta1"])
        if group["weight_decay"] != 0:
            param.add_(param * (-group["weight_decay"] * lr))
        param.sub_(update)
        if low_precision:
            p.copy_(param)


class AdafactorSchedule(LambdaLR):
    """A read-only schedule for ``Adafactor`` with ``relative_step``: reports the step size it computes.

    The Trainer logs ``scheduler.get_last_lr()``; Adafactor schedules itself, so this proxy reads the
    step size of each group's first parameter (``initial_lr`` before the first step).

    Args:
        optimizer: an ``Adafactor``.
        initial_lr: the lr reported before the first step.
    """

    def __init__(self, optimizer: Optimizer, initial_lr: float = 0.0) -> None:
        # LambdaLR takes its base lrs from "initial_lr"; Adafactor's lr is None, so lend one for init.
        for group in optimizer.param_groups:
            group["initial_lr"] = initial_lr
        super().__init__(optimizer, _constant_factor)
        for group in optimizer.param_groups:
            del group["initial_lr"]

    def get_lr(self) -> list[float]:
        opt = self.optimizer
        lrs = [
            float(opt._get_lr(group, opt.state[group["params"][0]]))
            for group in opt.param_groups
            if group["params"][0].grad is not None
        ]
        return lrs or list(self.base_lrs)


def get_adafactor_schedule(optimizer: Optimizer, initial_lr: float = 0.0) -> AdafactorSchedule:
    """An ``AdafactorSchedule`` proxy for ``optimizer``.

    Returns:
        An ``AdafactorSchedule``.
    """
    return AdafactorSchedule(optimizer, initial_lr)


# =============================================================================================
# Parameter groups
# =============================================================================================

# transformers' rule: no weight decay inside nn.LayerNorm modules, nor for parameters whose
# lower-cased dotted name matches one of these (biases and norm weights by naming convention,
# which covers RMSNorm and most custom norms).
_NO_DECAY_NAME_PATTERNS = tuple(
    re.compile(pattern) for pattern in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
)


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that weight decay applies to (transformers' rule and order).

    Excluded: every parameter inside an ``nn.LayerNorm`` and every parameter whose lower-cased
    name contains "bias", "layernorm", "rmsnorm", or a ``norm`` / ``*_norm`` path component. Other
    normalisation layers are excluded only through their names, as in transformers.

    Args:
        model: the model.

    Returns:
        Dotted names, children before a module's own parameters.

    Example:
        >>> get_decay_parameter_names(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)))
        ['0.weight']
    """
    return get_parameter_names(model, [nn.LayerNorm], _NO_DECAY_NAME_PATTERNS)


def get_parameter_names(model: nn.Module, forbidden_layer_types: Iterable[type],
                        forbidden_layer_names: Iterable[str | re.Pattern] | None = None) -> list[str]:
    """Names of the parameters outside modules of ``forbidden_layer_types`` whose lower-cased dotted name
    matches none of ``forbidden_layer_names`` (regular expressions, searched); transformers' helper.

    Args:
        model: the model.
        forbidden_layer_types: module classes whose parameters (at any depth) are left out.
        forbidden_layer_names: patterns; a parameter whose name matches one is left out.

    Returns:
        Dotted names, children before a module's own parameters (transformers' order).

    Example:
        >>> get_parameter_names(torch.nn.Sequential(torch.nn.Linear(2, 2)), [], ["bias"])
        ['0.weight']
    """
    forbidden_types = tuple(forbidden_layer_types)
    patterns = [re.compile(p) if isinstance(p, str) else p for p in forbidden_layer_names or ()]
    names: list[str] = []

    def visit(module: nn.Module, prefix: str, forbidden: bool) -> None:
        for child_name, child in module.named_children():
            visit(child, f"{prefix}{child_name}.", forbidden or isinstance(child, forbidden_types))
        for name in module._parameters:  # own parameters, after the children
            full = prefix + name
            if not forbidden and not any(p.search(full.lower()) for p in patterns):
                names.append(full)

    visit(model, "", False)
    return names


def get_parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The two param groups the Trainer optimizes: with weight decay, then without.

    Both groups are always present (even when empty) and in this order, as in transformers, so
    optimizer state dicts line up with its checkpoints. Frozen parameters are left out.

    Args:
        model: the model.
        weight_decay: the decay of the first group.

    Returns:
        ``[{"params": [...], "weight_decay": weight_decay}, {"params": [...], "weight_decay": 0.0}]``.
    """
    decay = set(get_decay_parameter_names(model))
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for name, p in trainable if name in decay], "weight_decay": weight_decay},
        {"params": [p for name, p in trainable if name not in decay], "weight_decay": 0.0},
    ]


# =============================================================================================
# optim_args and the optimizer table
# =============================================================================================


def _convert_value(text: str) -> Any:
    """"True"/"False" -> bool, "3" -> int, "1e-3" -> float, anything else stays a string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_optim_args(optim_args: str | None) -> dict[str, Any]:
    """Parse ``TrainingArguments.optim_args`` ("k=v,k2=v2") into a dict of typed values.

    Spaces are ignored (as in transformers) and values become bool, int or float when they read as
    one. Empty entries (a trailing comma) are skipped.

    Args:
        optim_args: the string, or None.

    Returns:
        The options.

    Example:
        >>> parse_optim_args("momentum=0.9, nesterov=True, rank=8, proj_type=std")
        {'momentum': 0.9, 'nesterov': True, 'rank': 8, 'proj_type': 'std'}
    """
    if not optim_args:
        return {}
    options: dict[str, Any] = {}
    for entry in optim_args.replace(" ", "").split(","):
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        if not key or not sep or "=" in value:
            raise ValueError(
                f"optim_args={optim_args!r} is invalid: the entry {entry!r} is not key=value; write e.g. "
                "optim_args='momentum=0.9,nesterov=True'"
            )
        options[key] = _convert_value(value)
    return options


def _as_bool(value: Any) -> bool:
    # HfArgumentParser's words; anything else ("maybe") is an error, never a silent False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "t", "y", "false", "0", "no", "f", "n"):
        return value.lower() in ("true", "1", "yes", "t", "y")
    raise ValueError("not True or False")


def _finite_float(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not finite")
    return number


def _finite_int(value: Any) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise ValueError("not a whole number")
    return int(value)


# converter -> what a value must be, for the error message
_CONVERTED = {_as_bool: "True or False", _finite_float: "a finite number", _finite_int: "a whole number"}


def _optim_options(args: Any, name: str, converters: dict[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """The optim_args this optimizer reads, converted; the rest are reported (transformers drops them)."""
    options = parse_optim_args(getattr(args, "optim_args", None))
    ignored = sorted(set(options) - set(converters))
    if ignored:
        logger.warning("optim=%r ignores optim_args %s (it reads %s)", name, ignored, sorted(converters))
    converted = {}
    for key, convert in converters.items():
        if key in options:
            try:
                converted[key] = convert(options[key])
            except (TypeError, ValueError):
                raise ValueError(
                    f"optim_args {key}={options[key]!r} is invalid for optim={name!r}: it must be "
                    f"{_CONVERTED.get(convert, 'a ' + getattr(convert, '__name__', 'value'))}; fix it in "
                    f"optim_args={getattr(args, 'optim_args', None)!r}"
                ) from None
    return converted


def _adam_options(args: Any) -> dict[str, Any]:
    return {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}


def _adamw_torch(args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    _optim_options(args, "adamw_torch", {})
    return torch.optim.AdamW, {"lr": args.learning_rate, **_adam_options(args)}


def _adamw_torch_fused(args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    _optim_options(args, "adamw_torch_fused", {})
    return torch.optim.AdamW, {"lr": args.learning_rate, **_adam_options(args), "fused": True}


def _adafactor(args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    _optim_options(args, "adafactor", {})
    # An external lr and schedule, like every other optimizer of the Trainer.
    return Adafactor, {"lr": args.learning_rate, "scale_parameter": False, "relative_step": False}


def _torch_optimizer(
    name: str,
    cls: type[Optimizer],
    converters: dict[str, Callable[[Any], Any]],
    args: Any,
    model: nn.Module | None = None,
) -> tuple[type[Optimizer], dict[str, Any]]:
    """A torch optimizer with the lr plus the optim_args transformers passes to it."""
    return cls, {"lr": args.learning_rate, **_optim_options(args, name, converters)}


# The optim_args transformers forwards to each plain torch optimizer, and their types.
_TORCH_OPTIMIZERS: dict[str, tuple[type[Optimizer], dict[str, Callable[[Any], Any]]]] = {
    "sgd": (
        torch.optim.SGD,
        {"momentum": _finite_float, "dampening": _finite_float, "weight_decay": _finite_float, "nesterov": _as_bool},
    ),
    "adagrad": (torch.optim.Adagrad, {"lr_decay": _finite_float, "weight_decay": _finite_float, "eps": _finite_float}),
    "rmsprop": (
        torch.optim.RMSprop,
        {"momentum": _finite_float, "alpha": _finite_float, "eps": _finite_float, "weight_decay": _finite_float,
         "centered": _as_bool},
    ),
}

_BITSANDBYTES = (
    "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit",
    "ademamix", "ademamix_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "lion_32bit", "lion_8bit", "paged_lion_32bit", "paged_lion_8bit",
    "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
)  # fmt: skip


def _bitsandbytes(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """bitsandbytes' AdamW / Lion / RMSprop / AdEMAMix, 8- or 32-bit, paged or not (name decides)."""
    _require_package(name)
    import bitsandbytes.optim as bnb

    bits = {"optim_bits": 8 if "8bit" in name else 32}
    if "rmsprop" in name:
        # transformers forwards every optim_arg here (as strings; typed by parse_optim_args here).
        return bnb.RMSprop, {"lr": args.learning_rate, **parse_optim_args(args.optim_args), **bits}
    bits["is_paged"] = "paged" in name
    if "lion" in name:
        _optim_options(args, name, {})
        return bnb.Lion, {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2), **bits}
    if "ademamix" in name:
        keys = ("beta1", "beta2", "beta3", "alpha", "eps", "t_alpha", "t_beta3")
        opts = _optim_options(args, name, {k: (_finite_int if k.startswith("t_") else _finite_float) for k in keys})
        betas = (opts.get("beta1", args.adam_beta1), opts.get("beta2", args.adam_beta2), opts.get("beta3", 0.9999))
        ademamix = {
            "betas": betas,
            "alpha": opts.get("alpha", 5.0),
            "eps": opts.get("eps", args.adam_epsilon),
            **{k: opts[k] for k in ("t_alpha", "t_beta3") if k in opts},
        }
        return bnb.AdEMAMix, {"lr": args.learning_rate, **ademamix, **bits}
    _optim_options(args, name, {})
    return bnb.AdamW, {"lr": args.learning_rate, **_adam_options(args), **bits}


@functools_cache
def _resumable_grokadamw() -> type[Optimizer]:
    """grokadamw's GrokAdamW, with a state dict that resumes.

    GrokAdamW keeps each parameter's moments in its param group (``group["state"]``), keyed by the parameter
    object; saved that way, the keys load as new tensors that match no parameter, so a resumed run silently
    starts from fresh moments (what transformers' checkpoints of it do). Here the group's states are saved as a
    list in the group's parameter order (tensors and ints: loads with ``weights_only``), and loaded back onto
    the parameters; a checkpoint in the package's own layout (transformers') is mapped by position too.
    """
    from grokadamw import GrokAdamW

    class ResumableGrokAdamW(GrokAdamW):
        def state_dict(self) -> dict[str, Any]:
            saved = super().state_dict()
            for group, packed in zip(self.param_groups, saved["param_groups"]):
                states = group.get("state", {})
                packed["state"] = [states.get(p) for p in group["params"]]
            return saved

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            saved = [group.get("state") for group in state_dict["param_groups"]]
            super().load_state_dict(state_dict)
            for index, (group, states) in enumerate(zip(self.param_groups, saved)):
                states = list(states.values()) if isinstance(states, dict) else states or []
                if states and len(states) != len(group["params"]):
                    raise ValueError(
                        f"the GrokAdamW checkpoint's param group {index} holds {len(states)} parameter states for "
                        f"{len(group['params'])} parameters: it was saved for another model or parameter grouping"
                    )
                group["state"] = {p: state for p, state in zip(group["params"], states) if state is not None}

    ResumableGrokAdamW.__name__ = ResumableGrokAdamW.__qualname__ = "GrokAdamW"
    return ResumableGrokAdamW


def _grokadamw(args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """GrokAdamW: the lr and transformers' five options (its own betas/eps defaults: transformers passes no adam_*)."""
    _require_package("grokadamw")
    GrokAdamW = _resumable_grokadamw()

    defaults = {"alpha_init": 0.98, "lamb": 2.0, "gamma": 0.1, "grokking_signal_decay_rate": 0.1,
                "gradient_clipping": 1.0}
    options = _optim_options(args, "grokadamw", dict.fromkeys(defaults, _finite_float))
    return GrokAdamW, {"lr": args.learning_rate, **defaults, **options}


def _stable_adamw(args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """torch-optimi's StableAdamW with the adam_* fields and ``decouple_lr``/``max_lr``/``kahan_sum``.

    transformers converts the two flags with ``bool(text)``, so ``kahan_sum=False`` turns Kahan summation
    on there; here "False" means False (the README lists the difference)."""
    _require_package("stable_adamw")
    from optimi import StableAdamW

    options = _optim_options(args, "stable_adamw", {"decouple_lr": _as_bool, "max_lr": _finite_float,
                                                    "kahan_sum": _as_bool})
    return StableAdamW, {"lr": args.learning_rate, **_adam_options(args), "weight_decay": args.weight_decay,
                         "decouple_lr": options.get("decouple_lr", False), "max_lr": options.get("max_lr"),
                         "kahan_sum": options.get("kahan_sum")}


def _torchao_adamw(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """torchao's AdamW with 4- or 8-bit states (blocks of ``block_size`` values, 256 as in transformers)."""
    _require_package(name)
    try:
        from torchao.optim import AdamW4bit, AdamW8bit
    except ImportError:  # torchao < 0.11 kept them under prototype/
        raise ValueError(f"optim={name!r} needs torchao >= 0.11 (torchao.optim): pip install -U torchao") from None

    options = _optim_options(args, name, {"block_size": _finite_int, "bf16_stochastic_round": _as_bool})
    cls = AdamW4bit if name == "adamw_torch_4bit" else AdamW8bit
    return cls, {"lr": args.learning_rate, "block_size": options.get("block_size", 256),
                 "bf16_stochastic_round": options.get("bf16_stochastic_round", False), **_adam_options(args)}


# schedule-free optim name -> (schedulefree's class, takes the adam_* fields, takes warmup_steps): transformers' choice
_SCHEDULE_FREE = {
    "schedule_free_adamw": ("AdamWScheduleFree", True, True),
    "schedule_free_radam": ("RAdamScheduleFree", True, False),  # RAdam warms itself up
    "schedule_free_sgd": ("SGDScheduleFree", False, True),
}


def _schedule_free(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """A schedule-free optimizer (its own warmup and iterate averaging; the Trainer switches its
    ``train()``/``eval()`` modes: see :func:`set_optimizer_mode`)."""
    _require_package(name)
    import schedulefree

    class_name, adam, warmup = _SCHEDULE_FREE[name]
    cls = getattr(schedulefree, class_name, None)
    if cls is None:
        raise ValueError(f"optim={name!r} needs schedulefree >= 1.4 ({class_name}): pip install -U schedulefree")
    options = _optim_options(args, name, {"weight_lr_power": _finite_float, "r": _finite_float})
    kwargs = {"lr": args.learning_rate, **(_adam_options(args) if adam else {}), "weight_decay": args.weight_decay}
    if warmup:
        steps = getattr(args, "warmup_steps", 0) or 0
        if 0 < steps < 1:  # transformers passes the ratio on as a step count (0.1 "steps": lr x10 at step 0)
            raise ValueError(
                f"warmup_steps={steps!r} is a ratio, but optim={name!r} warms up inside the optimizer, which is "
                "built before the run's length is known: pass warmup_steps as a number of steps (e.g. 100)"
            )
        kwargs["warmup_steps"] = int(steps)
    kwargs["weight_lr_power"] = options.get("weight_lr_power", 2.0)
    kwargs["r"] = options.get("r", 0.0)
    return cls, kwargs


# The projector classes a low-rank optimizer's state may hold: (module, class) -> how a checkpoint names it.
_PROJECTORS = {
    ("galore_torch.galore_projector", "GaLoreProjector"): "galore",
    ("apollo_torch.svd_projector", "GaLoreProjector"): "apollo_svd",
    ("apollo_torch.random_projector", "GradientProjector"): "apollo_random",
}


def _projector_class(kind: str) -> type:
    module, name = next(key for key, value in _PROJECTORS.items() if value == kind)
    return getattr(importlib.import_module(module), name)


def _strided(tensor: torch.Tensor, stride: list[int] | None) -> torch.Tensor:
    """``tensor``'s values laid out with ``stride`` (a saved tensor comes back row-major)."""
    if stride is None or list(tensor.stride()) == list(stride) or tensor.dim() != len(stride) or not tensor.numel():
        return tensor
    size = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, stride))
    out = tensor.new_empty(size).as_strided(tensor.shape, stride)
    return out.copy_(tensor)


@functools_cache
def _with_plain_projectors(cls: type[Optimizer]) -> type[Optimizer]:
    """``cls`` (a GaLore or APOLLO optimizer) whose state dict holds each projector as a dict of its fields.

    The packages keep a projector object per parameter (``state["projector"]``: rank, scale, the projection
    matrix, ...); pickled as it is, ``torch.load(weights_only=True)`` refuses it. Saved as ``{"projector_kind":
    ..., **fields}`` it is tensors, numbers and strings, and is rebuilt on load from one of the three known
    classes only (:data:`_PROJECTORS`), so no pickle global is added.
    """

    class PlainProjectors(cls):
        def state_dict(self) -> dict[str, Any]:
            saved = super().state_dict()
            for key, state in saved["state"].items():
                projector = state.get("projector")
                if projector is not None and not isinstance(projector, dict):
                    kind = _PROJECTORS[(type(projector).__module__, type(projector).__name__)]
                    fields = vars(projector)
                    # the layout too: LAPACK's SVD gives column-major matrices, and a matmul with a row-major copy
                    # rounds otherwise on some CPUs, so a resume would not be bit-identical (seen: 1.5e-8)
                    strides = {k: list(v.stride()) for k, v in fields.items() if torch.is_tensor(v)}
                    # a new dict: the per-parameter dicts are the live state's
                    saved["state"][key] = {**state, "projector": {"projector_kind": kind, **fields,
                                                                  "projector_strides": strides}}
            return saved

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            # taken out first: torch's load casts a state's values and would turn their strings into generators
            states, projectors = dict(state_dict["state"]), {}
            for key, state in states.items():
                if isinstance(state.get("projector"), dict):
                    projectors[key] = state["projector"]
                    states[key] = {k: v for k, v in state.items() if k != "projector"}
            super().load_state_dict({**state_dict, "state": states})
            params = [p for group in self.param_groups for p in group["params"]]  # a state's key: its index here
            for key, fields in projectors.items():
                strides = fields.get("projector_strides", {})
                fields = {k: _strided(v.to(params[key].device), strides.get(k)) if torch.is_tensor(v) else v
                          for k, v in fields.items() if k != "projector_strides"}
                projector = object.__new__(_projector_class(fields.pop("projector_kind")))
                vars(projector).update(fields)
                self.state[params[key]]["projector"] = projector

    PlainProjectors.__name__ = PlainProjectors.__qualname__ = cls.__name__
    return PlainProjectors


def _low_rank_groups(args: Any, model: nn.Module | None, name: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    """transformers' two groups for GaLore/APOLLO: every parameter not targeted, then the targeted weights with the
    low-rank ``options``. Targeted: the ``nn.Linear`` modules that ``optim_target_modules`` names (a regex
    string, a list of names, substrings or regexes, or "all-linear")."""
    targets = getattr(args, "optim_target_modules", None)
    if targets is None:
        raise ValueError(f"optim={name!r} needs optim_target_modules: the modules whose weights it projects, e.g. "
                         "optim_target_modules=['attn', 'mlp'] or 'all-linear'")
    if not isinstance(targets, (list, str)):
        raise TypeError(f"optim_target_modules={targets!r} is invalid: it must be a list of strings, a regex string "
                        "or 'all-linear'")
    if model is None:
        raise ValueError(f"optim={name!r} needs the model to find optim_target_modules in")
    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    names = set()
    for module_name, module in model.named_modules():
        found, is_regex = check_target_module_exists(targets, module_name, return_is_regex=True)
        if not isinstance(module, nn.Linear):
            if found and not is_regex:
                logger.warning("%s matched optim_target_modules but is no nn.Linear: %s leaves it out", module_name,
                               name)
            continue
        if found or all_linear:
            names.add(module_name + ".weight")
    if not names:
        raise ValueError(f"optim_target_modules={targets!r} matches no nn.Linear module of the model, so optim={name!r} "
                         "has nothing to project: name modules of model.named_modules(), or pass 'all-linear'")
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if n not in names]},
            {"params": [p for n, p in named if n in names], **options}]


class LayerwiseOptimizer(Optimizer):
    """One optimizer per parameter, each stepped by a gradient hook as soon as its parameter's gradient is
    complete in backward (then that gradient is freed): the ``*_layerwise`` optimizers, which never hold every
    gradient at once. ``step()`` and ``zero_grad()`` do nothing; ``param_groups`` are the per-parameter
    optimizers' own groups (the same dicts), so one lr scheduler over this object sets every optimizer's lr,
    which the next backward uses, as transformers' per-parameter schedulers do. ``state_dict()`` holds every
    per-parameter optimizer's state in parameter order (transformers' layer-wise checkpoints hold none).

    Args:
        params: parameter groups; each parameter gets its own ``optimizer_cls`` over ``{**group, "params": [p]}``.
        optimizer_cls: the optimizer class, built with ``**kwargs``.

    Example:
        >>> lin = torch.nn.Linear(2, 1)
        >>> opt = LayerwiseOptimizer([{"params": list(lin.parameters())}], torch.optim.SGD, lr=0.1)
        >>> before = lin.weight.detach().clone()
        >>> lin(torch.ones(1, 2)).sum().backward()  # the hooks step each parameter here
        >>> bool((lin.weight != before).all()), lin.weight.grad is None
        (True, True)
    """

    def __init__(self, params: Iterable[dict[str, Any]], optimizer_cls: type[Optimizer], **kwargs: Any):
        self.optimizers: dict[nn.Parameter, Optimizer] = {}
        for group in params:
            for param in group["params"]:
                self.optimizers[param] = optimizer_cls([{**group, "params": [param]}], **kwargs)
        super().__init__([torch.zeros(1)], {"lr": kwargs.get("lr", 1e-3)})  # torch's bookkeeping; replaced below
        self.param_groups = [g for optimizer in self.optimizers.values() for g in optimizer.param_groups]
        self._hooks = [param.register_post_accumulate_grad_hook(self._step_one)
                       for param in self.optimizers if param.requires_grad]

    def _step_one(self, param: nn.Parameter) -> None:
        optimizer = self.optimizers[param]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def step(self, closure: Callable[[], float] | None = None) -> None:  # the hooks stepped every parameter
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:  # the hooks freed every gradient
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"layerwise": [optimizer.state_dict() for optimizer in self.optimizers.values()]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("layerwise")
        if saved is None or len(saved) != len(self.optimizers):
            raise ValueError(
                f"this optimizer.pt is not a layer-wise optimizer's state for {len(self.optimizers)} parameters "
                f"(it holds {'no per-parameter states' if saved is None else f'{len(saved)} of them'}): resume a "
                "*_layerwise run from its own checkpoints, with the same model"
            )
        for optimizer, state in zip(self.optimizers.values(), saved):
            optimizer.load_state_dict(state)
        self.param_groups = [g for optimizer in self.optimizers.values() for g in optimizer.param_groups]

    def remove_hooks(self) -> None:
        """Detach the gradient hooks (the parameters train with another optimizer afterwards)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def _check_layerwise(name: str, args: Any) -> None:
    """transformers' refusals for a layer-wise optimizer, plus what cannot work with gradients consumed in backward."""
    fix = f"or use {name.removesuffix('_layerwise')!r}, which steps once per optimizer step"
    if getattr(args, "world_size", 1) > 1:
        raise ValueError(f"optim={name!r} does not support several processes (DDP), as in transformers: run one "
                         f"process, {fix}")
    if getattr(args, "gradient_accumulation_steps", 1) != 1:
        raise ValueError(f"optim={name!r} steps each parameter inside backward, so gradient_accumulation_steps="
                         f"{args.gradient_accumulation_steps} cannot add gradients up (transformers refuses it too): "
                         f"set gradient_accumulation_steps=1, {fix}")
    if getattr(args, "max_grad_norm", 0) and args.max_grad_norm > 0:
        raise ValueError(f"optim={name!r} steps each parameter inside backward, before the gradients' norm is known, "
                         f"so max_grad_norm={args.max_grad_norm} cannot clip them (transformers silently does not): "
                         f"set max_grad_norm=0, {fix}")
    if getattr(args, "fp16", False):
        raise ValueError(f"optim={name!r} steps inside backward, before fp16 loss scaling unscales the gradients: use "
                         f"bf16=True or float32, {fix}")


# low-rank optim name -> (package, class, its options from optim_args with transformers' defaults)
_LOW_RANK: dict[str, tuple[str, str, dict[str, tuple[Callable[[Any], Any], Any]]]] = {
    **{name: ("galore_torch", cls, {"rank": (_finite_int, 128), "update_proj_gap": (_finite_int, 200),
                                    "scale": (_finite_float, 0.25), "proj_type": (str, "std")})
       for base, cls in (("galore_adamw", "GaLoreAdamW"), ("galore_adamw_8bit", "GaLoreAdamW8bit"),
                         ("galore_adafactor", "GaLoreAdafactor")) for name in (base, base + "_layerwise")},
    **dict.fromkeys(("apollo_adamw", "apollo_adamw_layerwise"), ("apollo_torch", "APOLLOAdamW", {
        "rank": (_finite_int, 128), "proj": (str, "random"), "scale_type": (str, "channel"),
        "update_proj_gap": (_finite_int, 200), "scale": (_finite_float, 1.0), "proj_type": (str, "std")})),
}


def _low_rank(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """GaLore / APOLLO: the targeted weights projected to a low rank, every other parameter a plain group (no
    weight decay in either, as transformers groups them)."""
    _require_package(name)
    package, class_name, spec = _LOW_RANK[name]
    cls = _with_plain_projectors(getattr(importlib.import_module(package), class_name))
    given = _optim_options(args, name, {key: convert for key, (convert, _) in spec.items()})
    options = {key: given.get(key, default) for key, (_, default) in spec.items()}
    if name.startswith("apollo"):  # transformers puts the adam_* fields into APOLLO's low-rank group
        options.update(_adam_options(args))
    if name.endswith("_layerwise"):
        _check_layerwise(name, args)
    kwargs: dict[str, Any] = {"lr": args.learning_rate, "params": _low_rank_groups(args, model, name, options)}
    if name.startswith("galore_adafactor"):  # the Trainer's lr and schedule (transformers: not for the layer-wise
        kwargs.update(scale_parameter=False, relative_step=False)  # one, whose lr with relative_step is refused)
    if name.endswith("_layerwise"):
        return LayerwiseOptimizer, {**kwargs, "optimizer_cls": cls}
    return cls, kwargs


@contextlib.contextmanager
def _cuda_calls_stay_put():
    """lomo-optim 0.1.1's AdaLomo creates its second moments with ``.cuda()`` whatever the model's device (an error
    where torch has no CUDA, a device mismatch for a CPU model beside a GPU): inside the block ``.cuda()`` leaves a
    tensor where it is, and the caller moves the state to each parameter's device."""
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


_ADALOMO_STATES = ("exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col")


@functools_cache
def _resumable_adalomo() -> type[Optimizer]:
    """lomo-optim's AdaLomo, with its state on the parameters' devices and a state dict that resumes.

    AdaLomo keeps its factored second moments in dicts keyed by parameter name and its step count (which sets the
    moments' decay) in an attribute, outside torch's ``state``: its own state dict holds neither, so a resumed run
    starts from fresh moments at step 0 (what transformers' checkpoints of it do). Here they are saved under
    ``"adalomo"`` (names -> tensors, and an int: loads with ``weights_only``) and copied back into the live tensors;
    a checkpoint without them (transformers') loads as transformers resumes it, from fresh moments, warned.
    """
    from lomo_optim import AdaLomo

    class ResumableAdaLomo(AdaLomo):
        def __init__(self, model: nn.Module, **kwargs: Any):
            with _cuda_calls_stay_put():
                super().__init__(model, **kwargs)
            devices = {name: p.device for name, p in model.named_parameters()}
            for states in (getattr(self, key) for key in _ADALOMO_STATES):
                for name, tensor in states.items():
                    states[name] = tensor.to(devices[name])

        def state_dict(self) -> dict[str, Any]:
            saved = super().state_dict()
            saved["adalomo"] = {"step_num": self.step_num, **{key: dict(getattr(self, key)) for key in _ADALOMO_STATES}}
            return saved

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            state_dict = dict(state_dict)
            saved = state_dict.pop("adalomo", None)
            super().load_state_dict(state_dict)
            if saved is None:
                logger.warning("this optimizer.pt holds no AdaLomo second moments (a transformers checkpoint): they "
                               "start again from zero at step 0, as transformers resumes them")
                return
            for key in _ADALOMO_STATES:
                live, stored = getattr(self, key), saved[key]
                if set(live) != set(stored):
                    raise ValueError(f"the AdaLomo checkpoint's {key} holds the parameters {sorted(stored)}, this model "
                                     f"{sorted(live)}: it was saved for another model; resume with the same model")
                for name, tensor in stored.items():
                    live[name].copy_(tensor)
            self.step_num = int(saved["step_num"])

    ResumableAdaLomo.__name__ = ResumableAdaLomo.__qualname__ = "AdaLomo"
    return ResumableAdaLomo


def _check_fused(name: str, args: Any, model: nn.Module | None) -> None:
    """What cannot work with an update fused into backward, refused before step 1 (transformers refuses no model only)."""
    if model is None:
        raise ValueError(f"optim={name!r} needs the model (it updates the weights from gradient hooks on its "
                         "parameters): call create_optimizer() with the model, as the Trainer does")
    if getattr(args, "deepspeed", None):
        raise ValueError(f"optim={name!r} with deepspeed={args.deepspeed!r}: DeepSpeed's engine runs its own backward "
                         "and step, so the fused update never happens; train without deepspeed, or choose another optim")
    if getattr(args, "world_size", 1) > 1:
        raise ValueError(f"optim={name!r} with world_size={args.world_size}: its hooks update each process's weights "
                         "from that process's gradients alone (no all-reduce outside DeepSpeed ZeRO-3), so the "
                         "processes would drift apart; run one process, or choose another optim")
    if getattr(args, "fp16", False):
        raise ValueError(f"optim={name!r} with fp16=True: fp16 loss scaling runs a plain backward that never hands the "
                         "scheduler's lr to fused_backward; use bf16=True or float32")
    if getattr(args, "auto_find_batch_size", False):
        raise ValueError(f"optim={name!r} with auto_find_batch_size=True: a micro-batch that runs out of memory inside "
                         "backward has already updated part of the weights, so the step cannot be redone in smaller "
                         "batches; set auto_find_batch_size=False and choose per_device_train_batch_size yourself")
    odd = {n: tuple(p.shape) for n, p in model.named_parameters() if p.dim() not in (1, 2)}
    if name == "adalomo" and odd:  # the package indexes shape[0] and shape[1] (an IndexError, or a shape mismatch)
        listed = ", ".join(f"{n} {shape}" for n, shape in list(odd.items())[:5]) + (" ..." if len(odd) > 5 else "")
        raise ValueError(f"optim='adalomo' keeps second moments for 1-D and 2-D parameters only (lomo-optim's AdaLomo), "
                         f"and {len(odd)} parameter(s) have another shape: {listed}; use optim='lomo', or reshape "
                         "them into 1-D/2-D parameters")


def _lomo(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """LOMO / AdaLomo: built from the model (transformers' ``model`` kwarg) with the Trainer's lr. The backend's
    backward verb calls ``fused_backward(loss, lr)`` with the scheduler's current lr, and its step does nothing.
    ``max_grad_norm > 0`` becomes the package's ``clip_grad_norm`` (a norm pass before each fused backward: the
    gradients are used up inside backward, so clipping after it has nothing left to clip)."""
    _require_package(name)
    _check_fused(name, args, model)
    from lomo_optim import Lomo

    if getattr(args, "weight_decay", 0.0):
        logger.warning("optim=%r: weight_decay=%s is not applied (transformers builds LOMO with the lr only; the "
                       "package's own weight_decay would decay every parameter, norms and biases too)",
                       name, args.weight_decay)
    if getattr(args, "gradient_accumulation_steps", 1) > 1:
        logger.warning("optim=%r with gradient_accumulation_steps=%d: each micro-batch updates the weights with its "
                       "share of the step's loss (nothing accumulates), as in transformers", name,
                       args.gradient_accumulation_steps)
    clip = args.max_grad_norm if args.max_grad_norm is not None and args.max_grad_norm > 0 else None
    cls = Lomo if name == "lomo" else _resumable_adalomo()
    return cls, {"model": model, "lr": args.learning_rate, **({"clip_grad_norm": clip} if clip else {})}


# Optimizers that need a package torch does not ship: optim name -> (import name, pip command).
_OPTIONAL_PACKAGES: dict[str, tuple[str, str]] = {
    **dict.fromkeys(_BITSANDBYTES, ("bitsandbytes", "pip install -U bitsandbytes")),
    "adamw_torch_xla": ("torch_xla", "pip install torch_xla"),
    "adamw_torch_npu_fused": ("torch_npu", "pip install torch_npu"),
    "adamw_anyprecision": ("torchdistx", "pip install git+https://github.com/pytorch/torchdistx"),
    "adamw_torch_4bit": ("torchao", "pip install torchao"),
    "adamw_torch_8bit": ("torchao", "pip install torchao"),
    **dict.fromkeys(
        ("galore_adamw", "galore_adamw_8bit", "galore_adafactor")
        + ("galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise"),
        ("galore_torch", "pip install galore-torch"),
    ),
    "apollo_adamw": ("apollo_torch", "pip install apollo-torch"),
    "apollo_adamw_layerwise": ("apollo_torch", "pip install apollo-torch"),
    "lomo": ("lomo_optim", "pip install lomo-optim"),
    "adalomo": ("lomo_optim", "pip install lomo-optim"),
    "grokadamw": ("grokadamw", "pip install grokadamw"),
    **dict.fromkeys(
        ("schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd"),
        ("schedulefree", "pip install schedulefree"),
    ),
    "stable_adamw": ("optimi", "pip install torch-optimi"),
}

# transformers has these; cadence does not build them yet (users can pass optimizers=(...)).
_NOT_BUILT = tuple(name for name in _OPTIONAL_PACKAGES if name not in _BITSANDBYTES and name not in (
    "grokadamw", "stable_adamw", "adamw_torch_4bit", "adamw_torch_8bit", "lomo", "adalomo", *_SCHEDULE_FREE, *_LOW_RANK))


def _not_built_message(name: str) -> str:
    module, pip = _OPTIONAL_PACKAGES[name]
    missing = "" if _package_available(module) else f" (it would also need `{module}`: {pip})"
    return f"optim={name!r} is not built yet in cadence{missing}; pass Trainer(optimizers=(...)) instead"


def _not_built(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    raise ValueError(_not_built_message(name))


# Keyed by the string values of transformers' OptimizerNames (TrainingArguments.optim).
# Each entry: (args, model=None) -> (optimizer_cls, kwargs); create_optimizer adds the params.
OPTIMIZERS: dict[str, Callable[..., tuple[Any, dict[str, Any]]]] = {
    "adamw_torch": _adamw_torch,
    "adamw_torch_fused": _adamw_torch_fused,
    "adafactor": _adafactor,
    **{name: partial(_torch_optimizer, name, cls, conv) for name, (cls, conv) in _TORCH_OPTIMIZERS.items()},
    **{name: partial(_bitsandbytes, name) for name in _BITSANDBYTES},
    "grokadamw": _grokadamw,
    "stable_adamw": _stable_adamw,
    "adamw_torch_4bit": partial(_torchao_adamw, "adamw_torch_4bit"),
    "adamw_torch_8bit": partial(_torchao_adamw, "adamw_torch_8bit"),
    **{name: partial(_schedule_free, name) for name in _SCHEDULE_FREE},
    **{name: partial(_low_rank, name) for name in _LOW_RANK},
    "lomo": partial(_lomo, "lomo"),
    "adalomo": partial(_lomo, "adalomo"),
    **{name: partial(_not_built, name) for name in _NOT_BUILT},
}


def _package_available(module: str) -> bool:
    if module in sys.modules:  # also honours sys.modules[module] = None, which blocks an import
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def _require_package(name: str) -> None:
    module, pip = _OPTIONAL_PACKAGES[name]
    if not _package_available(module):
        raise ValueError(f"optim={name!r} needs the `{module}` package, which is not installed: {pip}")


def check_optimizer(name: str) -> None:
    """Raise ValueError now if ``optim=name`` cannot be built, so no run fails at its first step.

    Args:
        name: an ``optim`` value (str or str-Enum).

    Raises:
        ValueError: unknown name; its package is missing (the message has the pip command); or an
            optimizer transformers has and cadence does not build yet.
    """
    name = _as_name(name)
    if name not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    if name in _NOT_BUILT:
        raise ValueError(_not_built_message(name))
    if name in _OPTIONAL_PACKAGES:
        _require_package(name)


def is_optimizer_factory(optimizer_cls_or_factory: Any) -> bool:
    """Whether an optimizer handler returned a factory (any callable that builds the optimizer from the
    model, e.g. for Muon-style optimizers) rather than a ``torch.optim.Optimizer`` subclass.

    Example:
        >>> is_optimizer_factory(torch.optim.AdamW), is_optimizer_factory(lambda model: None)
        (False, True)
    """
    return not (isinstance(optimizer_cls_or_factory, type) and issubclass(optimizer_cls_or_factory, torch.optim.Optimizer))


def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[Any, dict[str, Any]]:
    """The optimizer class and its keyword arguments (without params) that ``args.optim`` names.

    Args:
        args: has ``optim``, ``optim_args``, ``learning_rate``, ``adam_beta1``, ``adam_beta2``,
            ``adam_epsilon`` (a ``TrainingArguments``).
        model: the model, for optimizers that need it.

    Returns:
        ``(optimizer_cls, kwargs)``.
    """
    name = _as_name(args.optim)
    check_optimizer(name)
    return OPTIMIZERS[name](args, model)


def _keep_embeddings_32bit(model: nn.Module) -> None:
    """8-bit bitsandbytes optimizers are unstable on embeddings: keep those in 32-bit (as transformers)."""
    import bitsandbytes

    manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            manager.register_module_override(module, "weight", {"optim_bits": 32})


def create_optimizer(
    model: nn.Module, args: Any, optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None
) -> Optimizer:
    """Build the Trainer's optimizer: the two weight-decay groups, then the class ``args.optim`` names.

    Args:
        model: the model to optimize.
        args: a ``TrainingArguments`` (``weight_decay`` and the fields ``get_optimizer_cls_and_kwargs`` reads).
        optimizer_cls_and_kwargs: the user's ``(cls, kwargs)`` instead of ``args.optim``. A "params"
            entry in kwargs replaces the groups, a "model" entry is passed instead of them (LOMO's
            ``cls(model, **kwargs)``); a ``cls`` that is not an Optimizer class is a
            factory, called as ``cls()(model, **kwargs)`` (transformers' convention).

    Returns:
        The optimizer.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> args = NS(optim="sgd", optim_args="momentum=0.9", learning_rate=0.1, weight_decay=0.01,
        ...           adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
        >>> opt = create_optimizer(torch.nn.Linear(2, 2), args)
        >>> [(len(g["params"]), g["weight_decay"], g["momentum"]) for g in opt.param_groups]
        [(1, 0.01, 0.9), (1, 0.0, 0.9)]
    """
    if optimizer_cls_and_kwargs is None:
        optimizer_cls, kwargs = get_optimizer_cls_and_kwargs(args, model)
    else:
        optimizer_cls, kwargs = optimizer_cls_and_kwargs
    kwargs = dict(kwargs)  # never mutate the caller's dict
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, Optimizer)):
        return optimizer_cls()(model, **kwargs)
    if "model" in kwargs:  # LOMO-style: built from the model itself (transformers' convention), no groups
        return optimizer_cls(kwargs.pop("model"), **kwargs)
    params = kwargs.pop("params", None) or get_parameter_groups(model, args.weight_decay)
    optimizer = optimizer_cls(params, **kwargs)
    if optimizer_cls.__module__.startswith("bitsandbytes") and kwargs.get("optim_bits") == 8:
        _keep_embeddings_32bit(model)
    return optimizer


def set_optimizer_mode(optimizer: Any, training: bool) -> None:
    """Switch an optimizer that has ``train()``/``eval()`` (schedule-free ones) into that mode; others are untouched.

    A schedule-free optimizer trains on one point (y) and averages another (x): ``eval()`` puts x into the
    parameters, ``train()`` puts y back. The Trainer calls it where transformers does (``training_step``:
    train; ``evaluation_loop``: eval), and also around checkpoints and ``save_model`` and at the end of
    ``train()``, so whatever is evaluated or saved holds the averaged weights.

    Args:
        optimizer: the optimizer (or None).
        training: True for ``train()``, False for ``eval()``.

    Example:
        >>> set_optimizer_mode(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), training=False)
    """
    switch = getattr(optimizer, "train" if training else "eval", None)
    if callable(switch):
        switch()


@contextlib.contextmanager
def eval_weights(optimizer: Any, restore: bool = True):
    """The parameters hold the optimizer's evaluation weights inside the block (see :func:`set_optimizer_mode`).

    Args:
        optimizer: the optimizer (or None).
        restore: switch back to training mode afterwards (inside ``train()``).
    """
    set_optimizer_mode(optimizer, training=False)
    try:
        yield
    finally:
        if restore:
            set_optimizer_mode(optimizer, training=True)
