"""``report_to`` names -> tracker callbacks.

Only this table knows which trackers exist. It imports nothing heavy: a tracker's module, and its
package, load when a ``Trainer`` asks for it. ``report_to="all"`` means every installed one (the
rule of ``transformers``: Comet only with an API key configured, Kubeflow only inside a Kubeflow TrainJob,
Aim never, as transformers has no Aim tracker); an unknown name, or one whose package is missing, is a
ValueError before the first step that says what to install.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import Callable, NamedTuple

logger = logging.getLogger(__name__)


class Integration(NamedTuple):
    module: str  # under cadence.integrations
    callback: str  # the class name there
    package: str | None  # the import name it needs (None: nothing beyond cadence)
    pip: str = ""  # how to install it
    in_all: Callable[[], bool] | None = None  # a further condition for report_to="all" (None: installed is enough)


def _comet_api_key() -> bool:
    """Whether a Comet API key is configured (transformers' condition for "all"), without importing comet_ml."""
    if os.getenv("COMET_API_KEY"):
        return True
    files = [os.getenv("COMET_CONFIG", ""), Path.home() / ".comet.config", Path.cwd() / ".comet.config"]
    return any(str(f) and Path(f).is_file() and "api_key" in Path(f).read_text(errors="replace") for f in files)


def _kubeflow_server() -> bool:
    """Whether this process runs in a Kubeflow TrainJob that takes progress reports (its controller sets the URL)."""
    return os.getenv("KUBEFLOW_TRAINER_SERVER_URL") is not None


INTEGRATIONS: dict[str, Integration] = {
    "tensorboard": Integration("tensorboard", "TensorBoardCallback", "tensorboard", "pip install tensorboard"),
    "mlflow": Integration("mlflow", "MLflowCallback", "mlflow", "pip install mlflow"),
    "wandb": Integration("wandb", "WandbCallback", "wandb", "pip install wandb"),
    "trackio": Integration("trackio", "TrackioCallback", "trackio", "pip install trackio"),
    "comet_ml": Integration("comet", "CometCallback", "comet_ml", "pip install comet_ml", _comet_api_key),
    "dvclive": Integration("dvclive", "DVCLiveCallback", "dvclive", "pip install dvclive"),
    "codecarbon": Integration("codecarbon", "CodeCarbonCallback", "codecarbon", "pip install codecarbon"),
    "clearml": Integration("clearml", "ClearMLCallback", "clearml", "pip install clearml"),
    "swanlab": Integration("swanlab", "SwanLabCallback", "swanlab", "pip install swanlab"),
    "aim": Integration("aim", "AimCallback", "aim", "pip install aim", lambda: False),
    "kubeflow": Integration("kubeflow", "KubeflowCallback", None, "", _kubeflow_server),
    "jsonl": Integration("jsonl", "JsonlCallback", None),
}

# transformers' report_to names that cadence does not have: refused with their own message
TRANSFORMERS_ONLY = ("azure_ml", "dagshub", "flyte", "neptune")

# transformers' switches that turn a tracker off even when it is installed
_DISABLE_SWITCHES = {"mlflow": "DISABLE_MLFLOW_INTEGRATION", "kubeflow": "DISABLE_KUBEFLOW_INTEGRATION"}


def is_installed(name: str) -> bool:
    """Whether the tracker ``name`` can run here (its package is importable; not disabled by its switch)."""
    from ..optimization.requirements import _package_available

    package = INTEGRATIONS[name].package
    switch = _DISABLE_SWITCHES.get(name)
    if switch and os.getenv(switch, "FALSE").upper() == "TRUE":  # HF's switches
        return False
    return package is None or _package_available(package)


def available_integrations() -> list[str]:
    """The names ``report_to="all"`` stands for: every tracker installed here (and, for some, configured)."""
    return [name for name, spec in INTEGRATIONS.items()
            if is_installed(name) and (spec.in_all is None or spec.in_all())]


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
        switch = _DISABLE_SWITCHES.get(name)
        if switch and os.getenv(switch, "FALSE").upper() == "TRUE":
            raise ValueError(f"report_to includes {name!r}, which {switch}=TRUE turns off: unset {switch} or "
                             f"remove {name!r} from report_to")
        if not is_installed(name):
            raise ValueError(
                f"report_to includes {name!r}, which needs the `{spec.package}` package: {spec.pip} "
                f"(or pip install 'cadence[{name}]'), or remove {name!r} from report_to"
            )
        module = importlib.import_module(f"{__package__}.{spec.module}")
        classes.append(getattr(module, spec.callback))
    return classes
