"""Integrations with other tools, at the import path of ``transformers.integrations``.

Experiment trackers (``report_to``): ``registry`` maps each name to its callback module
(``tensorboard``, ``mlflow``, ``wandb``, ``trackio``, ``comet``, ``dvclive``, ``codecarbon``, ``clearml``,
``swanlab``, ``aim``, ``kubeflow``, ``jsonl``); a tracker's package is imported only when a run asks for it.
"""

from .neftune import activate_neftune, deactivate_neftune  # noqa: F401
