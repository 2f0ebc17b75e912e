"""``report_to`` names -> tracker callbacks.

Only this table knows which trackers exist. It imports nothing heavy: a tracker's module, and its
package, load when a ``Trainer`` asks for it. ``report_to="all"`` means every installed one (the
rule of ``transformers``); an unknown name, or one whose package is missing, is a ValueError before
the first step that says what to install.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import NamedTuple

logger = logging.getLogger(__name__)


class Integration(NamedTuple):
    module: str  # under cadence.integrations
    callback: str  # the class name there
    package: str | None  # the import name it needs (None: nothing beyond cadence)
    pip: str = ""  # how to install it


INTEGRATIONS: dict[str, Integration] = {
    "tensorboard": Integration("tensorboard", "TensorBoardCallback", "tensorboard", "pip install tensorboard"),
    "mlflow": Integration("mlflow", "MLflowCallback", "mlflow", "pip install mlflow"),
    "wandb": Integration("wandb", "WandbCallback", "wandb", "pip install wandb"),
    "trackio": Integration("trackio", "TrackioCallback", "trackio", "pip install trackio"),
    "jsonl": Integration("jsonl", "JsonlCallback", None),
}

# transformers' report_to names that cadence does not have: refused with their own message
TRANSFORMERS_ONLY = ("azure_ml", "clearml", "codecarbon", "comet_ml", "dagshub", "dvclive", "flyte", "kubeflow",
                     "neptune", "swanlab")


def is_installed(name: str) -> bool:
    """Whether the tracker ``name`` can run here (its package is importable; mlflow not disabled)."""
    from ..optimization import _package_available

    package = INTEGRATIONS[name].package
    if name == "mlflow" and os.getenv("DISABLE_MLFLOW_INTEGRATION", "FALSE").upper() == "TRUE":  # HF's switch
        return False
    return package is None or _package_available(package)


def available_integrations() -> list[str]:
    """The names ``report_to="all"`` stands for: every tracker whose package is installed."""
    return [name for name in INTEGRATIONS if is_installed(name)]


def check_names(report_to: list[str]) -> None:
    """Raise ValueError for a name that is not a tracker (called by ``TrainingArguments``)."""
    for name in report_to:
        if name in INTEGRATIONS:
            continue
        why = ("transformers has it, cadence does not yet" if name in TRANSFORMERS_ONLY
               else "it is not a tracker name ('none' and 'all' stand alone)")
        raise ValueError(
            f"report_to={report_to!r} is invalid: {name!r}: {why}; use 'none', 'all' or names from "
            f"{', '.join(map(repr, INTEGRATIONS))}"
        )


def get_reporting_integration_callbacks(report_to: list[str]) -> list[type]:
    """The callback classes for ``report_to`` (a list of names, as ``TrainingArguments`` leaves it).

    Raises:
        ValueError: a name is unknown, or its package is not installed (the message says how to install it).

    Example:
        >>> get_reporting_integration_callbacks(["jsonl"])
        [<class 'cadence.integrations.jsonl.JsonlCallback'>]
    """
    check_names(report_to)
    classes = []
    for name in report_to:
        spec = INTEGRATIONS[name]
        if not is_installed(name):
            raise ValueError(
                f"report_to includes {name!r}, which needs the `{spec.package}` package: {spec.pip} "
                f"(or pip install 'cadence[{name}]'), or remove {name!r} from report_to"
            )
        module = importlib.import_module(f"{__package__}.{spec.module}")
        classes.append(getattr(module, spec.callback))
    return classes


def check_args(args, callbacks: list) -> None:
    """Each tracker's check of ``args`` (e.g. an unwritable ``logging_dir``), on the main process (the one that
    writes); called when the ``Trainer`` is built. Raises ValueError."""
    from .base import TrackerCallback

    if args.process_index == 0:
        for cb in callbacks:
            if isinstance(cb, TrackerCallback):
                cb.check_args(args)


def end_runs_on_error(callbacks: list) -> None:
    """Training raised: each tracker closes its run, marked failed where the tracker has that notion."""
    from .base import TrackerCallback

    for cb in callbacks:
        if isinstance(cb, TrackerCallback):
            cb.close(failed=True)
