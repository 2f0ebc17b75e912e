"""What survives a restart of the loop: ``TrainerState`` (saved as ``trainer_state.json``), ``TrainerControl`` (the
switches callbacks set, saved with the stateful callbacks) and ``ExportableState`` (an object whose state a
checkpoint keeps).

The names, fields and JSON layout are those of ``transformers.trainer_callback`` (5.x), where users import them
from (``cadence.trainer_callback`` re-exports them). They sit in a module of their own, below the callbacks:
checkpoints read and write them without the callbacks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar

logger = logging.getLogger(__name__)


def _is(strategy, name: str) -> bool:
    """``strategy == name`` for a plain string, a str-enum or a plain Enum."""
    # str and str-enums answer with ==; only a plain Enum needs .value (getattr on a str is slow).
    return strategy == name or (not isinstance(strategy, str) and getattr(strategy, "value", None) == name)


class ExportableState:
    """An object whose state is saved in ``trainer_state.json`` and restored on resume.

    Subclasses implement ``state()`` returning ``{"args": {...}, "attributes": {...}}``: ``args``
    rebuild the object through its constructor, ``attributes`` are then set on it.

    Example:
        >>> class Counter(TrainerCallback, ExportableState):
        ...     def __init__(self, start=0):
        ...         self.start, self.seen = start, 0
        ...     def state(self):
        ...         return {"args": {"start": self.start}, "attributes": {"seen": self.seen}}
        >>> Counter.from_state({"args": {"start": 2}, "attributes": {"seen": 5}}).seen
        5
    """

    def state(self) -> dict:
        """Returns: ``{"args": {...}, "attributes": {...}}``, JSON-serialisable."""
        raise NotImplementedError(f"{type(self).__name__} must implement `state()` to be saved.")

    @classmethod
    def from_state(cls, state: dict):
        """Rebuild an instance from what :meth:`state` returned.

        Args:
            state: ``{"args": ..., "attributes": ...}``.
        Returns:
            A new instance.
        """
        instance = cls(**state["args"])
        for name, value in state["attributes"].items():
            setattr(instance, name, value)
        return instance


def _json_value(value: Any) -> Any:
    """A logged value JSON cannot write, as ``trainer_state.json`` keeps it: a numpy or torch scalar as its number
    (``.item()``), anything else as its ``repr`` (the log is a record, not an object to rebuild)."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:  # noqa: BLE001 - a larger array or an object whose item() means something else
            pass
    return repr(value)


@dataclass
class TrainerState:
    """What the Trainer knows about the run; saved as ``trainer_state.json`` in each checkpoint.

    One "step" is one optimizer update (``gradient_accumulation_steps`` micro-batches).
    The fields, defaults and JSON layout equal ``transformers.TrainerState``.
    """

    epoch: float = 0
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list[dict[str, float]] = None  # None -> [] (HF's default, kept for equal behaviour)
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict[str, str | float | int | bool] | None = None
    stateful_callbacks: Any = None  # in: list of stateful callbacks or a loaded dict; stored: dict
    # cadence only, not saved: True after train() stopped early on SIGTERM/SIGUSR1 (enable_jit_checkpoint)
    interrupted: ClassVar[bool] = False

    def __post_init__(self):
        if self.log_history is None:
            self.log_history = []
        if self.stateful_callbacks is None:
            self.stateful_callbacks = {}
        elif not isinstance(self.stateful_callbacks, dict):  # a dict comes from a loaded file
            self.stateful_callbacks = _export_callback_states(self.stateful_callbacks)

    def save_to_json(self, json_path: str) -> None:
        """Write this state as HF does (indent 2, sorted keys, trailing newline).

        Args:
            json_path: file to write.
        """
        text = self.to_json_string()
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(text)

    def to_json_string(self) -> str:
        """The text ``save_to_json`` writes (an asynchronous checkpoint takes it at the save step)."""
        state = dataclasses.asdict(self)
        try:
            return json.dumps(state, indent=2, sort_keys=True) + "\n"
        except TypeError:  # a user's log() held what JSON cannot write: a numpy scalar, an object, an int key
            state["log_history"] = [{str(k): v for k, v in row.items()} for row in state["log_history"]]
            return json.dumps(state, indent=2, sort_keys=True, default=_json_value) + "\n"

    @classmethod
    def load_from_json(cls, json_path: str) -> TrainerState:
        """Read a ``trainer_state.json`` written by cadence or transformers.

        Keys this version does not know (written by a newer library) are skipped, not fatal.

        Args:
            json_path: file to read.
        Returns:
            The state.
        """
        with open(json_path, encoding="utf-8") as f:
            data = json.load(f)
        unknown = sorted(set(data) - _STATE_FIELDS)
        if unknown:
            logger.debug("Ignoring unknown keys in %s: %s", json_path, unknown)
        return cls(**{k: v for k, v in data.items() if k in _STATE_FIELDS})

    def compute_steps(self, args, max_steps: int) -> None:
        """Store absolute logging/eval/save intervals; a value below 1 is a fraction of max_steps.

        Args:
            args: has ``logging_steps``, ``eval_steps``, ``save_steps`` (None leaves the field).
            max_steps: total optimizer steps of the run.

        Example:
            >>> s = TrainerState(); s.compute_steps(SimpleNamespace(logging_steps=0.1,
            ...     eval_steps=None, save_steps=30), 95); (s.logging_steps, s.save_steps)
            (10, 30)
        """
        for kind in ("logging", "eval", "save"):
            steps = getattr(args, f"{kind}_steps")
            if steps is None:
                continue
            if steps < 1:  # a ratio of the run, rounded up so it is never 0
                steps = math.ceil(max_steps * steps)
            strategy = getattr(args, f"{kind}_strategy", "steps")
            if steps == 0 and kind != "save" and _is(strategy, "steps"):  # from a negative ratio above -1/max_steps:
                # transformers' `step % 0` raises ZeroDivisionError at the first step
                raise ValueError(f"{kind}_steps={getattr(args, f'{kind}_steps')!r} is invalid for a run of {max_steps} "
                                 f"steps: ceil(max_steps * {kind}_steps) is 0 steps between two {kind} events; pass "
                                 f"a whole number of steps >= 1 or a fraction in (0, 1) of the run")
            setattr(self, f"{kind}_steps", steps)

    def init_training_references(self, trainer, max_steps: int, num_train_epochs: int, trial) -> None:
        """Record run-level facts at the start of training (transformers' method, for code that calls it;
        cadence's Trainer builds its state in ``train()`` itself).

        Args:
            trainer: gives ``is_local_process_zero()``, ``is_world_process_zero()`` and,
                optionally, ``hp_name`` and ``_trial`` for hyperparameter search.
            max_steps: total optimizer steps.
            num_train_epochs: number of epochs.
            trial: the hyperparameter-search trial or None.
        """
        hp_name = getattr(trainer, "hp_name", None)
        current_trial = getattr(trainer, "_trial", None)
        if hp_name is not None and current_trial is not None:
            self.trial_name = hp_name(current_trial)
        self.trial_params = None if trial is None else _trial_params(trial)
        self.max_steps = max_steps
        self.num_train_epochs = num_train_epochs
        self.is_local_process_zero = trainer.is_local_process_zero()
        self.is_world_process_zero = trainer.is_world_process_zero()


_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainerState))


def _export_callback_states(callbacks) -> dict:
    """``{class name: state}``; several callbacks of one class give a list of states (as HF)."""
    states: dict[str, Any] = {}
    for cb in callbacks:
        if not callable(getattr(cb, "state", None)):
            raise TypeError(f"Stateful callbacks must implement `state()` (ExportableState), got {type(cb)}")
        name = type(cb).__name__
        if name not in states:
            states[name] = cb.state()
        elif isinstance(states[name], list):
            states[name].append(cb.state())
        else:
            states[name] = [states[name], cb.state()]
    return states


def _trial_params(trial) -> dict:
    """Parameters of an optuna trial (``.params``) or of a ray/wandb trial (a dict)."""
    if isinstance(trial, dict):
        return trial
    params = getattr(trial, "params", None)
    if isinstance(params, dict):
        return params
    raise RuntimeError(f"Unknown type for trial {type(trial)}")


@dataclass
class TrainerControl(ExportableState):
    """Switches callbacks set to ask the Trainer to act; the Trainer and handler reset them.

    The handler resets through the ``_new_*`` methods (transformers' names): ``should_training_stop``
    at train begin (``_new_training``), ``should_epoch_stop`` at each epoch begin (``_new_epoch``),
    ``should_save``/``should_evaluate``/``should_log`` at each step begin (``_new_step``).
    """

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self):
        self.should_training_stop = False

    def _new_epoch(self):
        self.should_epoch_stop = False

    def _new_step(self):
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False

    def state(self) -> dict:
        """Returns: the five switches as ``{"args": {...}, "attributes": {}}``."""
        return {"args": dataclasses.asdict(self), "attributes": {}}
