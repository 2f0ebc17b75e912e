"""transformers' ``transformers.integrations.integration_utils`` names, for code that imports them from there.

Re-exports only: the ``report_to`` callbacks (``TensorBoardCallback``, ``MLflowCallback``, ``WandbCallback``,
``TrackioCallback``, ... every class ``registry.INTEGRATIONS`` names), ``INTEGRATION_TO_CALLBACK``,
``get_reporting_integration_callbacks``, ``get_available_reporting_integrations``, ``rewrite_logs``,
``default_logdir`` and transformers' ``is_<tracker>_available()`` checks. The callbacks resolve on first use,
so importing this module imports no tracker's package. An ``is_<tracker>_available()`` is True when cadence
has that tracker and its package is installed (a tracker cadence does not have is never available here).

Example:
    >>> from cadence.integrations.integration_utils import TensorBoardCallback, is_tensorboard_available
"""

from __future__ import annotations

import functools
import importlib

from .base import rewrite_logs  # noqa: F401
from .registry import INTEGRATIONS, get_reporting_integration_callbacks, is_installed  # noqa: F401
from .registry import available_integrations as get_available_reporting_integrations  # noqa: F401
from .tensorboard import default_logdir  # noqa: F401

# transformers' availability checks -> the report_to name each asks about
_AVAILABILITY = {
    "is_tensorboard_available": "tensorboard", "is_mlflow_available": "mlflow", "is_wandb_available": "wandb",
    "is_trackio_available": "trackio", "is_comet_available": "comet_ml", "is_clearml_available": "clearml",
    "is_codecarbon_available": "codecarbon", "is_dvclive_available": "dvclive", "is_swanlab_available": "swanlab",
    "is_kubeflow_available": "kubeflow", "is_azureml_available": "azure_ml", "is_dagshub_available": "dagshub",
    "is_neptune_available": "neptune", "is_flytekit_available": "flyte",
}


def _available(name: str) -> bool:
    return name in INTEGRATIONS and is_installed(name)


def _callback(spec) -> type:
    return getattr(importlib.import_module(f"{__package__}.{spec.module}"), spec.callback)


def __getattr__(name: str):
    for spec in INTEGRATIONS.values():
        if spec.callback == name:
            return _callback(spec)
    if name in _AVAILABILITY:
        check = functools.partial(_available, _AVAILABILITY[name])
        check.__doc__ = f"Whether report_to={_AVAILABILITY[name]!r} can run here (transformers' {name})."
        return check
    if name == "INTEGRATION_TO_CALLBACK":  # transformers' table: report_to name -> callback class
        return {report_to: _callback(spec) for report_to, spec in INTEGRATIONS.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    names = [spec.callback for spec in INTEGRATIONS.values()] + list(_AVAILABILITY) + ["INTEGRATION_TO_CALLBACK"]
    return sorted(set(globals()) | set(names))
