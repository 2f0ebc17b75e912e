"""The hyperparameter search's public types: the libraries' names, the best run, the default objective and spaces.

transformers keeps them in ``trainer_utils``, which re-exports them from here (users import them from there);
``hyperparameter_search.py`` runs the search with them. This module imports nothing of cadence, so it sits below
``trainer_utils``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, NamedTuple


class _StrEnum(str, Enum):
    """A `str` enum whose `str()` is its value and whose bad-value error lists the valid ones (the base of
    trainer_utils' strategies too: it lives here, below them)."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> None:
        valid = ", ".join(repr(member.value) for member in cls)
        raise ValueError(f"{value!r} is not a valid {cls.__name__}; valid values are {valid}")


class HPSearchBackend(_StrEnum):
    """Libraries ``Trainer.hyperparameter_search`` can run on (transformers' names; cadence runs optuna and ray)."""

    OPTUNA = "optuna"
    RAY = "ray"
    SIGOPT = "sigopt"
    WANDB = "wandb"


class BestRun(NamedTuple):
    """The best trial of a search: its id, objective (a list for a multi-objective study), its sampled
    hyperparameters, and the library's own summary (optuna's ``Study``, ray's ``ResultGrid``)."""

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any | None = None


def default_compute_objective(metrics: dict[str, float]) -> float:
    """HF's default objective: the eval loss when evaluation gives no other metric, else the sum of
    those other metrics (speed metrics and ``epoch`` never count)."""
    speed = ("_runtime", "_per_second", "_compilation_time")
    rest = {k: v for k, v in metrics.items() if k not in ("eval_loss", "epoch") and not k.endswith(speed)}
    return metrics.get("eval_loss") if not rest else sum(rest.values())


def default_hp_space_optuna(trial: Any) -> dict[str, Any]:
    """transformers' default optuna space: learning rate, epochs, seed, batch size."""
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
        "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 5),
        "seed": trial.suggest_int("seed", 1, 40),
        "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [4, 8, 16, 32, 64]),
    }


def default_hp_space_ray(trial: Any) -> dict[str, Any]:
    """transformers' default ray tune space (the same four values as optuna's)."""
    from ray import tune

    return {
        "learning_rate": tune.loguniform(1e-6, 1e-4),
        "num_train_epochs": tune.choice(list(range(1, 6))),
        "seed": tune.uniform(1, 40),
        "per_device_train_batch_size": tune.choice([4, 8, 16, 32, 64]),
    }
