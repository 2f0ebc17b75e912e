"""What every tracker callback shares: main process only, started lazily, never stops training.

A tracker implements four small methods (``start``, ``write``, ``finish`` and, if it uploads
checkpoints, ``saved``); this base class calls them from the Trainer's events:

- only the main process (``state.is_world_process_zero``) reports;
- the run starts at ``on_train_begin``, or at the first ``on_log`` (an ``evaluate()`` before training);
- a tracker that raises (disk gone, server down) logs one error and is switched off; training goes on;
- ``run_id`` (what names the tracker's run: a folder, a run id) is kept in every checkpoint through
  ``TrainerState.stateful_callbacks`` (``ExportableState``), so a resumed run continues the same
  tracker run instead of starting a second one.
"""

from __future__ import annotations

import logging
from typing import Any

from ..trainer_callback import ExportableState, TrainerCallback

logger = logging.getLogger(__name__)

# logged once at the end of training: a tracker keeps them as run summaries, not as curves
SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                          "total_flos"})


def rewrite_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """transformers' metric names for trackers: ``eval_x`` -> ``eval/x``, ``test_x`` -> ``test/x``, else ``train/x``.

    Example:
        >>> rewrite_logs({"loss": 1.0, "eval_loss": 2.0})
        {'train/loss': 1.0, 'eval/loss': 2.0}
    """
    out = {}
    for key, value in logs.items():
        for prefix in ("eval", "test"):
            if key.startswith(prefix + "_"):
                out[f"{prefix}/{key[len(prefix) + 1:]}"] = value
                break
        else:
            out[f"train/{key}"] = value
    return out


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


class TrackerCallback(TrainerCallback, ExportableState):
    """Base of the ``report_to`` callbacks (see the module docstring)."""

    def __init__(self):
        self.run_id: str | None = None  # names the tracker's run; saved in checkpoints
        self._started = False
        self._off = False  # set after a failure: nothing more is sent

    # ---------------------------------------------------------------- what a tracker implements

    def start(self, args: Any, state: Any, model: Any, resumed: bool) -> None:
        """Open the run; continue ``self.run_id``'s run when ``resumed``. Set ``self.run_id``."""
        raise NotImplementedError

    def write(self, logs: dict[str, Any], step: int) -> None:
        """Send one log (``Trainer.log``'s dict: ``loss``, ``eval_loss``, ...) at ``step``."""
        raise NotImplementedError

    def finish(self, failed: bool) -> None:
        """Close the run (``failed``: training raised)."""

    def saved(self, args: Any, state: Any) -> None:
        """A checkpoint was written (``output_dir/checkpoint-{global_step}``)."""

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
        from .registry import INTEGRATIONS

        return next((n for n, i in INTEGRATIONS.items() if i.callback == type(self).__name__), type(self).__name__)

    def _ensure_started(self, args: Any, state: Any, model: Any) -> None:
        if self._started:
            return
        resumed = state.global_step > 0  # a resumed run, or evaluate()/train() again after training
        if not resumed:
            self.run_id = None  # a new training from step 0 is a new tracker run (also each search trial)
        elif self.run_id is None:
            self.run_id = self._saved_run_id(state)
        self.start(args, state, model, resumed and self.run_id is not None)
        self._started = True

    def close(self, failed: bool = False) -> None:
        """End the run now (``Trainer.train`` calls this with ``failed=True`` when training raises)."""
        if self._started and not self._off:
            self._started = False
            self._safely("close", self.finish, failed)

    # ---------------------------------------------------------------- the Trainer's events

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.is_world_process_zero:
            self._safely("on_train_begin", self._ensure_started, args, state, model)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if state.is_world_process_zero and not self._off:
            self._safely("on_log", self._log, args, state, model, logs)

    def _log(self, args, state, model, logs) -> None:
        self._ensure_started(args, state, model)
        self.write(logs, state.global_step)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self._started:
            self._safely("on_save", self.saved, args, state)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.close(failed=False)
