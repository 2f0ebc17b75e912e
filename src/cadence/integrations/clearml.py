"""``report_to="clearml"``: a ClearML task (``CLEARML_OFFLINE_MODE=1``: an offline session to import later).

As transformers: the task is ``CLEARML_PROJECT`` / ``CLEARML_TASK`` (defaults "HuggingFace Transformers" /
"Trainer"), unless a task is already running (a pipeline, or the user's ``Task.init``), which is then used and
left open; ClearML's automatic TensorBoard and PyTorch logging is off (this callback reports). The arguments
are the hyperparameter section ``Transformers``, the model config the configuration object ``Model
Configuration``; each number logged is a scalar at the global step, title ``train`` / ``eval`` / ``test`` by
its prefix, series the rest of the key, and the end-of-training numbers (and ``epoch``) are single values. A
value that is not a number is skipped. Not built: uploading checkpoints as ClearML models
(``CLEARML_LOG_MODEL``). A resumed training reopens the task id kept in the checkpoint.
"""

from __future__ import annotations

import logging
import os

from .base import SUMMARY_KEYS, TrackerCallback, flatten
from .fresh_random import fresh_random

logger = logging.getLogger(__name__)

SINGLE_VALUES = SUMMARY_KEYS | {"epoch"}  # transformers reports these once, not as curves


class ClearMLCallback(TrackerCallback):
    """Report hyperparameters and scalars to a ClearML task."""

    def __init__(self):
        super().__init__()
        with fresh_random():  # importing clearml draws from `random`
            import clearml

        self._clearml = clearml
        self._task = None
        self._owns_task = False

    def start(self, args, state, model, resumed):
        with fresh_random():  # its ids, names and colours are drawn from `random`
            self._start(args, state, model, resumed)

    def _start(self, args, state, model, resumed):
        Task = self._clearml.Task
        self._task = Task.current_task()
        self._owns_task = self._task is None
        if self._owns_task:
            self._task = Task.init(
                project_name=os.getenv("CLEARML_PROJECT", "HuggingFace Transformers"),
                task_name=os.getenv("CLEARML_TASK", "Trainer"),
                auto_connect_frameworks={"tensorboard": False, "pytorch": False},
                continue_last_task=self.run_id if resumed else False,
            )
        self.run_id = self._task.id
        if resumed:
            # a continued task adds its last iteration to the ones reported; ours are global steps already
            self._task.set_initial_iteration(0)
            return
        hparams = {k: v for k, v in args.to_dict().items() if not k.endswith("_token")}  # never send secrets
        self._task.connect(flatten(hparams), name="Transformers")
        config = getattr(model, "config", None)
        if config is not None:
            self._task.set_configuration_object(name="Model Configuration",
                                                config_dict=config if isinstance(config, dict) else config.to_dict())

    def write(self, logs, step):
        report = self._task.get_logger()
        for key, value in logs.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if key in SINGLE_VALUES:
                report.report_single_value(name=key, value=value)
                continue
            title, _, series = key.partition("_") if key.startswith(("eval_", "test_")) else ("train", "", key)
            report.report_scalar(title=title, series=series, value=value, iteration=step)

    def finish(self, failed):
        with fresh_random():
            self._finish(failed)

    def _finish(self, failed):
        if self._owns_task and self._task is not None:
            if failed:
                self._task.mark_failed(status_reason="training raised", force=True)
            self._task.close()
        self._task = None
        self._owns_task = False
