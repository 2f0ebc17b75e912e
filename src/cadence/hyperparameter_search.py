"""``Trainer.hyperparameter_search``: one small class per search library (optuna, ray tune) behind a table.

A search runs trials. Each trial, whatever the library:

1. copies the search's starting ``TrainingArguments`` and applies the sampled values to the copy (a key
   that is not a field is an error naming it), with ``output_dir = <output_dir>/run-{trial id}`` (or
   ``hp_name(trial)``), so every trial's checkpoints lie in their own folder;
2. re-derives what ``Trainer.__init__`` derived from the arguments (backend, label smoother, checks),
   resets the ``TrainerControl`` and the state of stateful callbacks to what they were when the search
   began, then trains a fresh model from ``model_init`` (given the trial when it takes one argument);
3. reports the objective at every evaluation (optuna may prune the trial there: it stops at once), and
   evaluates once at the end when training never did.

So nothing carries from one trial to the next, and the trainer gets its own arguments back at the end.
Under ``torchrun`` process 0 runs the library; the values it samples, and each pruning decision, go to
every process through ``Backend.broadcast_object``, so all processes train the same trial together.
The libraries are imported only here, only when a search runs.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any, Callable

from .trainer_callback import ExportableState, TrainerControl
from .search_types import (  # noqa: F401 - the search's types, importable from here too
    BestRun,
    HPSearchBackend,
    default_compute_objective,
    default_hp_space_optuna,
    default_hp_space_ray,
)
from .trainer_utils import number_of_arguments

logger = logging.getLogger(__name__)


def hyperparameter_search(trainer, hp_space: Callable | None, compute_objective: Callable | None, n_trials: int,
                          direction: str | list[str], backend: str | HPSearchBackend | None,
                          hp_name: Callable | None, **kwargs) -> BestRun | list[BestRun] | None:
    """The body of ``Trainer.hyperparameter_search`` (see its docstring)."""
    name = HPSearchBackend(backend) if backend is not None else default_backend()
    ALL_HYPERPARAMETER_SEARCH_BACKENDS[name].ensure_available()  # one not built in cadence: ValueError naming it
    search = _BACKENDS[name]
    if trainer.model_init is None:
        raise RuntimeError(
            "hyperparameter_search needs a model_init: pass Trainer(model_init=...) (a function returning a fresh "
            "model, optionally taking the trial), so that every trial starts from new weights"
        )
    trainer.hp_search_backend = name
    trainer.hp_space = search.default_hp_space if hp_space is None else hp_space
    trainer.hp_name = hp_name
    trainer.compute_objective = default_compute_objective if compute_objective is None else compute_objective
    start = _Start(trainer)
    try:
        return search.run(trainer, start, n_trials, direction, **kwargs)
    finally:
        start.restore(trainer)
        trainer.hp_search_backend = None


def default_backend() -> HPSearchBackend:
    """The first installed library, in transformers' order."""
    for name, search in _BACKENDS.items():
        if search.is_available():
            return name
    raise RuntimeError(
        "hyperparameter_search needs a search library: pip install optuna (or 'ray[tune]'), "
        "or pip install 'cadence[optuna]'"
    )


def report(trainer, metrics: dict[str, float]) -> None:
    """Called by the Trainer after each evaluation inside a trial: set ``trainer.objective`` and tell the library
    (which may stop the trial here)."""
    trial = getattr(trainer, "_trial", None)
    if trial is None or getattr(trainer, "hp_search_backend", None) is None:
        return
    trainer.objective = trainer.compute_objective(dict(metrics))
    _BACKENDS[trainer.hp_search_backend].report(trainer, trial, trainer.objective, metrics)


def record_trial(trainer, trial: Any) -> None:
    """Mark ``trainer.state`` as a trial's: its sampled values and its folder's name (``trainer_state.json``)."""
    from .trainer_state import _trial_params

    state = trainer.state
    state.is_hyper_param_search = True
    state.trial_params = _trial_params(trial)
    if getattr(trainer, "hp_search_backend", None) is not None:
        state.trial_name = os.path.basename(os.path.normpath(trainer.args.output_dir))


def trial_arguments(args, params: dict[str, Any], output_dir: str):
    """A copy of ``args`` with the trial's values (cast to each field's current type, as transformers does)
    and its own ``output_dir``; the copy is validated like any ``TrainingArguments``."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(args) if f.init}
    check_hp_space_result(params)
    changes: dict[str, Any] = {}
    for key, value in params.items():
        if key not in fields:
            raise ValueError(
                f"hp_space returned the key {key!r}, which is not a TrainingArguments field: every key must name one "
                f"(such as 'learning_rate' or 'num_train_epochs'); rename or remove {key!r}"
            )
        current = getattr(args, key)
        if isinstance(value, dict) and not isinstance(current, dict):
            raise ValueError(
                f"hp_space returned a nested value for {key!r} ({value!r}), but TrainingArguments.{key} is not a "
                f"dict: return a flat mapping of field names to values"
            )
        numeric_into_float = isinstance(value, (int, float)) and "float" in fields[key]  # e.g. warmup_steps=0.1
        # a bool field keeps text ("false"): TrainingArguments reads it as the command line does, bool() would not
        as_is = numeric_into_float or isinstance(current, bool) or isinstance(value, str)
        if current is not None and not isinstance(value, type(current)) and not as_is:
            try:
                value = type(current)(value)  # ray's tune.uniform seed is a float; the field is an int
            except (TypeError, ValueError):
                raise ValueError(
                    f"hp_space returned {key}={value!r}, which is not a {type(current).__name__} as "
                    f"TrainingArguments.{key} is: sample a {type(current).__name__}"
                ) from None
        changes[key] = value
    return dataclasses.replace(args, output_dir=output_dir, **changes)


def check_hp_space_result(params: Any) -> None:
    """``hp_space(trial)`` must give a mapping of ``TrainingArguments`` field names to values.

    Raises:
        TypeError: anything else (None from a missing ``return``, a string, a list of values).
    """
    if not isinstance(params, Mapping):
        raise TypeError(
            f"hp_space returned {str(params)[:60]!r} ({type(params).__name__}), not a dict: return a dict of "
            "TrainingArguments field names to sampled values, e.g. "
            "{'learning_rate': trial.suggest_float('learning_rate', 1e-6, 1e-4, log=True)}"
        )


def run_trial(trainer, start: _Start, trial: Any, params: dict[str, Any], name: str,
              final_report: Callable | None = None):
    """Train one trial from a clean start; returns its objective.

    When training never evaluated, it evaluates once at the end, and ``final_report(metrics, objective)``
    (when given) passes that result to the library.
    """
    args = trial_arguments(start.args, params, os.path.join(start.args.output_dir, name))
    start.reset(trainer, args)
    trainer.objective = None
    trainer.train(trial=trial)
    if trainer.objective is None:
        metrics = trainer.evaluate()
        trainer.objective = trainer.compute_objective(dict(metrics))
        if final_report is not None:
            final_report(metrics, trainer.objective)
    return trainer.objective


class _Start:
    """What the trainer was when the search began; every trial starts from it, and the search ends on it."""

    def __init__(self, trainer):
        self.args, self.backend, self.label_smoother = trainer.args, trainer.backend, trainer.label_smoother
        # what each stateful callback declares as its state (ExportableState), not all its attributes: a tracker
        # also holds its library's module and open handles, which are neither copyable nor per-trial
        self.callback_states = [copy.deepcopy(cb.state().get("attributes", {})) for cb in self._stateful(trainer)]

    @staticmethod
    def _stateful(trainer) -> list:
        return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ExportableState)]

    def reset(self, trainer, args) -> None:
        """Give the trainer the trial's arguments and derive again what ``__init__`` derived from them."""
        from . import loss
        from .backend import Backend

        trainer.args = args
        # one process: a new backend from the trial's arguments (precision, compile; a fresh loss scaler). Under
        # torchrun the search's own is kept: its accelerator and process group are made once per process
        trainer.backend = Backend(args) if args.world_size == 1 else self.backend
        trainer.label_smoother = loss.label_smoother_for(trainer.model, args.label_smoothing_factor)
        trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        trainer.control = TrainerControl()
        for cb, state in zip(self._stateful(trainer), self.callback_states):  # e.g. an early-stopping counter
            for name, value in copy.deepcopy(state).items():
                setattr(cb, name, value)
        trainer._validate_setup()

    def restore(self, trainer) -> None:
        trainer.args, trainer.backend, trainer.label_smoother = self.args, self.backend, self.label_smoother
        trainer.current_gradient_accumulation_steps = self.args.gradient_accumulation_steps


def call_model_init(model_init: Callable, trial: Any):
    """transformers' rule: ``model_init()`` or ``model_init(trial)``, by its number of arguments."""
    count = number_of_arguments(model_init)
    if count > 1:
        raise RuntimeError(f"model_init takes {count} arguments; it must take none, or one (the trial)")
    model = model_init(trial) if count == 1 else model_init()
    if model is None:
        raise RuntimeError("model_init returned None; it must return a model")
    return model


# ------------------------------------------------------------------------------------------ backends


class _SearchBackend:
    """One search library: availability, its default space, the search loop, and per-evaluation reports."""

    name: HPSearchBackend
    pip_package: str

    # class methods, as transformers' backends: code asks ALL_HYPERPARAMETER_SEARCH_BACKENDS[name].is_available()
    @classmethod
    def is_available(cls) -> bool:
        import importlib.util

        return importlib.util.find_spec(cls.name.value) is not None

    @classmethod
    def pip_install(cls) -> str:
        return f"`pip install {cls.pip_package}`"

    @classmethod
    def ensure_available(cls) -> None:
        if not cls.is_available():
            raise RuntimeError(
                f"hyperparameter_search(backend={cls.name.value!r}) needs {cls.pip_package}: "
                f"pip install {cls.pip_package}"
            )

    @staticmethod
    def default_hp_space(trial: Any) -> dict[str, Any]:
        raise NotImplementedError

    def run(self, trainer, start: _Start, n_trials: int, direction, **kwargs):
        raise NotImplementedError

    def report(self, trainer, trial: Any, objective, metrics: dict[str, float]) -> None:
        raise NotImplementedError


@dataclasses.dataclass
class _SharedTrial:
    """What a process other than 0 knows of process 0's optuna trial (sent each trial)."""

    number: int
    params: dict[str, Any]
    prunable: bool


class OptunaBackend(_SearchBackend):
    """optuna: ``kwargs`` go to ``optuna.create_study`` (``storage``, ``study_name``, ``load_if_exists``,
    ``sampler``, ``pruner``, ...), except ``timeout``, ``n_jobs`` and ``gc_after_trial`` (to ``optimize``)."""

    name = HPSearchBackend.OPTUNA
    pip_package = "optuna"
    default_hp_space = staticmethod(default_hp_space_optuna)

    def run(self, trainer, start: _Start, n_trials: int, direction, **kwargs):
        import optuna

        timeout = kwargs.pop("timeout", None)
        n_jobs = kwargs.pop("n_jobs", 1)
        gc_after_trial = kwargs.pop("gc_after_trial", False)
        if n_jobs != 1:
            raise ValueError(
                f"n_jobs={n_jobs} is invalid: the trials of one Trainer share its model and arguments, so they run "
                "one at a time; pass n_jobs=1 (for parallel trials, run several processes on one optuna storage)"
            )
        backend = trainer.backend
        if not backend.is_main_process:
            return self._follow(trainer, start)
        directions = list(direction) if isinstance(direction, (list, tuple)) else None
        study = optuna.create_study(direction=None if directions else direction, directions=directions, **kwargs)
        prunable = len(study.directions) == 1  # optuna prunes single-objective studies only

        def objective(trial):
            params = trainer.hp_space(trial)
            name = trainer.hp_name(trial) if trainer.hp_name is not None else f"run-{trial.number}"
            if backend.world_size > 1:  # the other processes train this same trial
                backend.broadcast_object({"number": trial.number, "params": params, "name": name, "prunable": prunable})
            return run_trial(trainer, start, trial, params, name)

        study.optimize(objective, n_trials=n_trials, timeout=timeout, n_jobs=1, gc_after_trial=gc_after_trial)
        if backend.world_size > 1:
            backend.broadcast_object(None)  # the search is over
        if not prunable:
            return [BestRun(str(t.number), t.values, t.params, study) for t in study.best_trials]
        if not any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
            states = sorted({t.state.name for t in study.trials})
            raise RuntimeError(f"no trial of study {study.study_name!r} completed (states: {states}), so there is no "
                               "best run; run more trials, or loosen the pruner")
        best = study.best_trial
        return BestRun(str(best.number), best.value, best.params, study)

    def _follow(self, trainer, start: _Start) -> None:
        """A process other than 0: train each trial process 0 sends, until it sends None. Returns None (HF's)."""
        import optuna

        while True:
            message = trainer.backend.broadcast_object(None)
            if message is None:
                return None
            trial = _SharedTrial(message["number"], message["params"], message["prunable"])
            try:
                run_trial(trainer, start, trial, trial.params, message["name"])
            except optuna.TrialPruned:
                pass

    def report(self, trainer, trial: Any, objective, metrics: dict[str, float]) -> None:
        import optuna

        shared = isinstance(trial, _SharedTrial)
        if not (trial.prunable if shared else len(trial.study.directions) == 1):
            return
        step = trainer.state.global_step
        prune = None
        if not shared:
            trial.report(float(objective), step)
            prune = trial.should_prune()
        prune = trainer.backend.broadcast_object(prune)  # every process stops at the same step
        if prune:
            trainer.control = trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
            raise optuna.TrialPruned(f"trial {trial.number} pruned at step {step} (objective {objective})")


_TUNE_CONFIG_KEYS = ("search_alg", "scheduler", "max_concurrent_trials", "time_budget_s", "reuse_actors",
                     "trial_name_creator", "trial_dirname_creator")


class RayTuneBackend(_SearchBackend):
    """ray tune: the trainer is sent to each trial's worker, rebuilt there and trained.

    ``resources_per_trial`` (default one CPU, and one GPU when CUDA is there) goes to
    ``tune.with_resources``; ``scheduler``, ``search_alg``, ``max_concurrent_trials``, ``time_budget_s``,
    ... go to ``tune.TuneConfig``; the rest (``name``, ``storage_path``, ``stop``, ``verbose``, ...) to
    ``tune.RunConfig``. The objective is reported as ``"objective"`` at every evaluation, so a scheduler
    such as ASHA can stop a trial early.
    """

    name = HPSearchBackend.RAY
    pip_package = "'ray[tune]'"
    default_hp_space = staticmethod(default_hp_space_ray)

    def run(self, trainer, start: _Start, n_trials: int, direction, **kwargs):
        from ray import tune

        from .backend import accelerator_available

        if isinstance(direction, (list, tuple)):
            raise ValueError(f"direction={direction!r}: ray tune optimizes one objective; pass 'minimize' or 'maximize'")
        mode = direction[:3]
        resources = kwargs.pop("resources_per_trial", None) or {"cpu": 1, **({"gpu": 1} if accelerator_available() else {})}
        tune_config = tune.TuneConfig(num_samples=n_trials, metric="objective", mode=mode,
                                      **{k: kwargs.pop(k) for k in _TUNE_CONFIG_KEYS if k in kwargs})
        run_config = tune.RunConfig(**kwargs)
        # a worker runs in its trial's folder: the run folders must not be relative to it
        start.args = dataclasses.replace(start.args, output_dir=os.path.abspath(start.args.output_dir))
        start.reset(trainer, start.args)  # what each worker receives is the trainer as the search began
        trainable = tune.with_resources(tune.with_parameters(_ray_trial, trainer=trainer), resources)
        param_space = trainer.hp_space(None)
        check_hp_space_result(param_space)
        results = tune.Tuner(trainable, param_space=param_space, tune_config=tune_config, run_config=run_config).fit()
        best = results.get_best_result(metric="objective", mode=mode, scope="last")
        return BestRun(best.metrics["trial_id"], best.metrics["objective"], best.config, results)

    def report(self, trainer, trial: Any, objective, metrics: dict[str, float]) -> None:
        from ray import tune

        tune.report({**metrics, "objective": objective})


def _ray_trial(config: dict[str, Any], trainer=None) -> None:
    """One ray trial, in its worker: ``trainer`` arrives unpickled, a copy of its own, as the search began."""
    from ray import tune

    start = _Start(trainer)
    params = {k: v for k, v in config.items() if k != "wandb"}  # transformers leaves a wandb entry to ray
    trial_id = tune.get_context().get_trial_id()
    name = trainer.hp_name(config) if trainer.hp_name is not None else f"run-{trial_id}"
    run_trial(trainer, start, config, params, name,
              final_report=lambda metrics, objective: tune.report({**metrics, "objective": objective, "done": True}))


class _NotBuiltBackend(_SearchBackend):
    """A library transformers names that cadence does not run: listed, never available."""

    @classmethod
    def is_available(cls) -> bool:
        return False

    @classmethod
    def ensure_available(cls) -> None:
        built = sorted(b.value for b in _BACKENDS)
        raise ValueError(f"backend={cls.name.value!r} is not built in cadence; use one of {built}")


class SigOptBackend(_NotBuiltBackend):
    name = HPSearchBackend.SIGOPT
    pip_package = "sigopt"


class WandbBackend(_NotBuiltBackend):
    name = HPSearchBackend.WANDB
    pip_package = "wandb"


# the searches cadence runs
_BACKENDS: dict[HPSearchBackend, _SearchBackend] = {
    HPSearchBackend.OPTUNA: OptunaBackend(),
    HPSearchBackend.RAY: RayTuneBackend(),
}

# transformers' table: every HPSearchBackend, in the enum's order, to its backend class
ALL_HYPERPARAMETER_SEARCH_BACKENDS: dict[HPSearchBackend, type[_SearchBackend]] = {
    HPSearchBackend(backend.name): backend for backend in [OptunaBackend, RayTuneBackend, SigOptBackend, WandbBackend]
}


def default_hp_search_backend() -> str:
    """transformers' name: the first available backend's name (``"optuna"``, ``"ray"``)."""
    return default_backend().value
