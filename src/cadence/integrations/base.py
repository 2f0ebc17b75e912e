"""What every tracker callback shares: main process only, started lazily, never stops training.

A tracker implements four small methods (``start``, ``write`` or ``write_rows``, ``finish`` and, if it
uploads checkpoints, ``saved``); this base class calls them from the Trainer's events, ``start`` through
transformers' ``setup(args, state, model, **kwargs)``, which users' subclasses override to change how a run is
created (``_initialized`` is transformers' name for "the run is open"):

- only the main process (``state.is_world_process_zero``) reports;
- the run starts at ``on_train_begin``, or at the first ``on_log`` (an ``evaluate()`` before training);
- a tracker that raises (disk gone, server down) logs one error and is switched off; training goes on;
- a value a tracker cannot take (a key that is not a string, an object JSON cannot write, a name MLflow
  refuses) is left out of that tracker's logs with one warning per key (``skip``); its other values and
  rows are written. Numbers are numbers everywhere: numpy scalars and one-element tensors or arrays too
  (``number``);
- a folder the run is told to write to (``logging_dir``) that cannot be written is refused when the
  ``Trainer`` is built (``check_args``), before anything is written;
- outside ``train()`` (an ``evaluate()`` after training, a user's ``log()``) each log opens the tracker's
  run, is written and closes it again: no file stays open after the call, and the next one continues
  the same run;
- ``run_id`` (what names the tracker's run: a folder, a run id) is kept in every checkpoint through
  ``TrainerState.stateful_callbacks`` (``ExportableState``), so a resumed run continues the same
  tracker run instead of starting a second one;
- a tracker with ``flush_secs > 0`` (TensorBoard and jsonl: local files) gets its logs in batches, through
  ``write_rows``: at most every ``flush_secs``, before every checkpoint is written, after every evaluation
  and at the end; outside ``train()`` (``evaluate()``, a user's ``log()``) each log at once. A log then
  costs the training loop a dict copy and a list append. Encoding each log as it came (JSON, protobuf)
  cost several times its warm cost, run between training steps whose code and data fill the CPU's
  caches: 13.5 us for one ``json.dumps`` there against 3.4 us in a loop (``benchmarks/bench_tracking.py``).
  The other trackers hand each log to their own library, which queues it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import time
from typing import Any

from ..trainer_callback import ExportableState, TrainerCallback
from .registry import INTEGRATIONS

logger = logging.getLogger(__name__)

FLUSH_SECS = 1.0  # a batching tracker's file is at most this far behind the training loop

# logged once at the end of training: a tracker keeps them as run summaries, not as curves
SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                          "total_flos"})


@functools.lru_cache(maxsize=4096)  # a run logs the same few keys over and over
def metric_name(key: str) -> str:
    """transformers' metric name for trackers: ``eval_x`` -> ``eval/x``, ``test_x`` -> ``test/x``, else ``train/x``.

    Example:
        >>> metric_name("eval_loss"), metric_name("loss")
        ('eval/loss', 'train/loss')
    """
    for prefix in ("eval", "test"):
        if key.startswith(prefix + "_"):
            return f"{prefix}/{key[len(prefix) + 1:]}"
    return f"train/{key}"


def rewrite_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """``logs`` under ``metric_name``'s names.

    Example:
        >>> rewrite_logs({"loss": 1.0, "eval_loss": 2.0})
        {'train/loss': 1.0, 'eval/loss': 2.0}
    """
    return {metric_name(key): value for key, value in logs.items()}


def run_config(args: Any, model: Any) -> dict[str, Any]:
    """The hyperparameters a tracker records: the model's config (if any), then the arguments over it."""
    config = getattr(model, "config", None)
    combined = {}
    if config is not None:
        combined.update(config if isinstance(config, dict) else config.to_dict())
    combined.update(args.to_dict())
    return combined


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``parent/child`` keys (trackers whose parameters are flat).

    Example:
        >>> flatten({"a": {"b": 1}, "c": 2})
        {'a/b': 1, 'c': 2}
    """
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "/"))
        else:
            out[name] = value
    return out


def number(value: Any) -> int | float | bool | None:
    """``value`` as a plain Python number if it is one, else None: ``int``, ``float`` and ``bool`` (subclasses
    such as ``numpy.float64`` as the plain type), numpy scalars, one-element numpy arrays and torch tensors.

    Example:
        >>> import numpy as np, torch
        >>> number(np.float32(0.5)), number(torch.tensor([2])), number("0.5"), number(torch.ones(2))
        (0.5, 2, None, None)
    """
    kind = type(value)
    if kind is float or kind is int or kind is bool:  # the usual log: nothing to convert
        return value
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    if kind.__module__.partition(".")[0] in ("numpy", "torch"):  # only their .item() is known to mean this
        try:
            value = value.item()  # a larger array or tensor raises (ValueError, RuntimeError), a meta tensor too
        except Exception:  # noqa: BLE001 - whatever it raises, it is not a number to log
            return None
        return value if type(value) in (int, float, bool) else None  # not a complex number, not a text
    return None


def as_float(value: int | float) -> float:
    """``float(value)``; an int beyond float64's range is infinity of its sign (as float32 trackers store it)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def unwritable(folder: str) -> str | None:
    """Why ``folder`` cannot be created or written to (its nearest existing part is a file, or not writable),
    else None. Creates nothing.

    Example:
        >>> unwritable("/proc/runs")
        '/proc is not writable'
    """
    path = os.path.abspath(os.path.expanduser(folder))
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"{path} is not a folder"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable"
    return None


def describe(value: Any) -> str:
    """``value``'s type and a short repr, for a warning."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


class TrackerCallback(TrainerCallback, ExportableState):
    """Base of the ``report_to`` callbacks (see the module docstring)."""

    flush_secs = 0.0  # > 0: logs are written in batches, at most this often (and at saves, evaluations, the end)

    def __init__(self):
        self.run_id: str | None = None  # names the tracker's run; saved in checkpoints
        self._started = False
        self._off = False  # set after a failure: nothing more is sent
        self._pending: list[tuple[dict, int, float]] = []  # (logs, step, wall time) not yet written
        self._write_at = 0.0  # time.monotonic() from which the pending logs are written
        self._in_train = False  # between on_train_begin and the end: logs may wait (outside, each is written at once)
        self._run_trained = False  # the open run has seen training (a new training from step 0 is a new run)
        self._skipped: set = set()  # keys already warned about (skip)

    # ---------------------------------------------------------------- what a tracker implements

    def start(self, args: Any, state: Any, model: Any, resumed: bool) -> None:
        """Open the run; continue ``self.run_id``'s run when ``resumed``. Set ``self.run_id``."""
        raise NotImplementedError

    def write(self, logs: dict[str, Any], step: int) -> None:
        """Send one log (``Trainer.log``'s dict: ``loss``, ``eval_loss``, ...) at ``step``."""
        raise NotImplementedError

    def write_rows(self, rows: list[tuple[dict[str, Any], int, float]]) -> None:
        """Send logs in order, each ``(logs, step, wall_time)`` (``time.time()`` when it was logged)."""
        for logs, step, _ in rows:
            self.write(logs, step)

    def finish(self, failed: bool) -> None:
        """Close the run (``failed``: training raised)."""

    def saved(self, args: Any, state: Any) -> None:
        """A checkpoint was written (``output_dir/checkpoint-{global_step}``)."""

    def check_args(self, args: Any) -> None:
        """Raise ValueError for arguments this tracker cannot run with (called when the ``Trainer`` is built)."""

    # ---------------------------------------------------------------- values a tracker cannot take

    def skip(self, key: Any, value: Any, why: str) -> None:
        """Leave ``key`` out of this tracker's logs; warn the first time for this key (``why``: what the tracker
        needs, e.g. "not a number")."""
        if key in self._skipped:
            return
        self._skipped.add(key)
        logger.warning("report_to %r cannot take the logged %r (%s): %s; left out of its logs (the other values are "
                       "written; this warning once per key)", self.report_to_name, key, describe(value), why)

    # ---------------------------------------------------------------- checkpointed state

    def state(self) -> dict:
        return {"args": {}, "attributes": {"run_id": self.run_id}}

    def _saved_run_id(self, state: Any) -> str | None:
        """The run id this callback wrote into the checkpoint being resumed (None if none)."""
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        return (saved or {}).get("attributes", {}).get("run_id")

    # ---------------------------------------------------------------- the guard

    def _safely(self, event: str, fn, *args) -> None:
        if self._off:
            return
        try:
            fn(*args)
        except Exception as error:  # noqa: BLE001 - a tracker must never stop training
            self._off = True
            logger.error("report_to %r failed in %s (%s: %s): switched off for the rest of this run; training goes on",
                         self.report_to_name, event, type(error).__name__, error)
            try:
                self.finish(failed=True)
            except Exception:  # noqa: BLE001 - already reported above
                pass

    @property
    def report_to_name(self) -> str:
        return next((n for n, i in INTEGRATIONS.items() if i.callback == type(self).__name__), type(self).__name__)

    def setup(self, args: Any, state: Any, model: Any, **kwargs) -> None:
        """Open the tracker's run (transformers' name for it: a subclass overrides ``setup`` to change how the run
        is created, and calls ``super().setup(args, state, model, **kwargs)``). The events call it once, at
        ``on_train_begin`` or the first log; a resumed training continues the run id its checkpoint keeps.

        Args:
            args: the run's ``TrainingArguments``.
            state: the ``TrainerState`` (``global_step`` > 0: a resumed or finished training).
            model: the model (its config is recorded with the arguments).
            **kwargs: the event's other keywords (``processing_class``, ...), as transformers passes them.
        """
        step = getattr(state, "global_step", 0)
        if step == 0:
            if self._run_trained:  # a new training from step 0 is a new tracker run (also each search trial);
                self.run_id = None  # an evaluate() before it belongs to its run
        elif self.run_id is None:  # a resumed run, or evaluate()/train() again after training
            self.run_id = self._saved_run_id(state)
        self.start(args, state, model, self.run_id is not None)
        self._started = True
        self._run_trained = step > 0

    # transformers' name for "the run is open" (its trackers' events check it; a subclass may clear it to reopen)
    _initialized = property(lambda self: self._started, lambda self, value: setattr(self, "_started", bool(value)))

    def _ensure_started(self, args: Any, state: Any, model: Any, **kwargs) -> None:
        if not self._started:
            # the event's keywords that the setup takes: transformers' own signatures differ by tracker (MLflow's
            # takes none, ClearML's needs processing_class), and a subclass overrides with its tracker's
            params = inspect.signature(self.setup).parameters
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                kwargs = {k: v for k, v in kwargs.items() if k in params}
            self.setup(args, state, model, **kwargs)

    def _write_pending(self) -> None:
        rows, self._pending = self._pending, []
        if rows:
            self.write_rows(rows)

    def _end(self, failed: bool) -> None:
        try:
            self._write_pending()  # also when training failed: its logs so far are the record
        finally:  # ended even when the pending logs are what fails
            self._pending.clear()
            self.finish(failed)

    def close(self, failed: bool = False) -> None:
        """End the run now (``Trainer.train`` calls this with ``failed=True`` when training raises)."""
        self._in_train = False
        if self._started and not self._off:
            self._started = False
            self._safely("close", self._end, failed)

    # ---------------------------------------------------------------- the Trainer's events

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.is_world_process_zero:
            self._safely("on_train_begin", functools.partial(self._ensure_started, **kwargs), args, state, model)
            self._in_train = self._run_trained = True

    def on_log(self, args, state, control, logs=None, model=None, processing_class=None, optimizer=None,
               lr_scheduler=None, train_dataloader=None, eval_dataloader=None, **kwargs):
        # the training loop's path: a copy (the caller's dict may change after the event) and an append; the
        # handler's keywords are named, so that calling this builds no **kwargs dict (0.4 us of 1.4 a call)
        if not state.is_world_process_zero or self._off:
            return
        if not self._started:
            self._safely("on_log", functools.partial(self._ensure_started, processing_class=processing_class,
                                                     optimizer=optimizer, lr_scheduler=lr_scheduler,
                                                     train_dataloader=train_dataloader,
                                                     eval_dataloader=eval_dataloader, **kwargs), args, state, model)
            if self._off:
                return
        self._pending.append((dict(logs), state.global_step, time.time()))
        now = time.monotonic()
        if now >= self._write_at or not self._in_train:
            self._write_at = now + self.flush_secs
            self._safely("on_log", self._write_pending)
            if not self._in_train:  # an evaluate() or a log() outside training: its files are closed again
                self.close()

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self._started:
            self._safely("on_save", self._write_pending)  # a checkpoint's logs are on disk with it
            self._safely("on_save", self.saved, args, state)

    def on_evaluate(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self._started:  # an evaluation's metrics are on disk when it ends
            self._safely("on_evaluate", self._write_pending)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.close(failed=False)


def check_args(args, callbacks: list) -> None:
    """Each tracker's check of ``args`` (e.g. an unwritable ``logging_dir``), on the main process (the one that
    writes); called when the ``Trainer`` is built. Raises ValueError."""
    if args.process_index == 0:
        for cb in callbacks:
            if isinstance(cb, TrackerCallback):
                cb.check_args(args)


def end_runs_on_error(callbacks: list) -> None:
    """Training raised: each tracker closes its run, marked failed where the tracker has that notion."""
    for cb in callbacks:
        if isinstance(cb, TrackerCallback):
            cb.close(failed=True)
