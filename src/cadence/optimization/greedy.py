"""GreedyLR: a schedule that steps on an evaluation metric."""


from __future__ import annotations

import collections
import logging
import math
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau


logger = logging.getLogger(__name__)


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


def steps_on_metric(scheduler: Any) -> bool:
    """Whether the Trainer steps ``scheduler`` on the evaluation metric, not every optimizer step: torch's
    ``ReduceLROnPlateau``, cadence's ``GreedyLR``, or transformers' own ``GreedyLR`` (a script without the patch
    builds it from ``transformers.optimization``; known by its name, so transformers is never imported for it)."""
    return isinstance(scheduler, METRIC_SCHEDULERS) or type(scheduler).__name__ == "GreedyLR"


def get_greedy_schedule(optimizer: Optimizer, **kwargs: Any) -> GreedyLR:
    """A ``GreedyLR`` (metric-driven lr); ``kwargs`` are its options.

    Returns:
        A ``GreedyLR``.
    """
    return GreedyLR(optimizer, **kwargs)
