"""``report_to="mlflow"``: parameters, metrics with steps, one MLflow run per training.

Where: ``MLFLOW_TRACKING_URI`` (else MLflow's own default), experiment ``MLFLOW_EXPERIMENT_NAME``
(else MLflow's default one). Parameters are the model config and the arguments, flattened
(``a/b``) and cut to MLflow's length limit; metrics keep the Trainer's names at the global step. The
run ends with the training (status FAILED when training raised). A resumed run reopens the run id
kept in the checkpoint; ``MLFLOW_RUN_ID`` attaches to a given run. A hyperparameter-search trial is
a nested run (under the active run, e.g. the one around the search). ``MLFLOW_NESTED_RUN=true``
nests every run, ``MLFLOW_TAGS`` (a JSON object) adds tags, as in transformers.
"""

from __future__ import annotations

import json
import logging
import os
import re

from .base import TrackerCallback, flatten, run_config

logger = logging.getLogger(__name__)

_TRUE = {"1", "TRUE", "YES", "ON"}


class MLflowCallback(TrackerCallback):
    """Send parameters and metrics to MLflow."""

    def __init__(self):
        super().__init__()
        import mlflow

        self._mlflow = mlflow
        self._owns_run = False  # a run the user started stays theirs to end

    def start(self, args, state, model, resumed):
        mlflow = self._mlflow
        uri = os.getenv("MLFLOW_TRACKING_URI")
        if uri and not mlflow.is_tracking_uri_set():
            mlflow.set_tracking_uri(uri)
        if os.getenv("MLFLOW_EXPERIMENT_NAME"):
            mlflow.set_experiment(os.getenv("MLFLOW_EXPERIMENT_NAME"))
        run_id = self.run_id if resumed else os.getenv("MLFLOW_RUN_ID")
        nested = state.is_hyper_param_search or os.getenv("MLFLOW_NESTED_RUN", "").upper() in _TRUE
        self._owns_run = False
        if run_id is not None:
            try:
                mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None)
                self._owns_run = True
            except mlflow.exceptions.MlflowException as error:  # e.g. a checkpoint moved to another tracking store
                logger.warning("MLflow run %s cannot be reopened (%s): starting a new run", run_id, error)
                resumed = False
        if not self._owns_run and (mlflow.active_run() is None or nested):
            mlflow.start_run(run_name=state.trial_name or args.run_name, nested=nested)
            self._owns_run = True
        self.run_id = mlflow.active_run().info.run_id
        if resumed:
            return  # parameters are logged once, by the run that started it
        self._log_params(run_config(args, model), state.trial_params)
        if os.getenv("MLFLOW_TAGS"):
            mlflow.set_tags(json.loads(os.environ["MLFLOW_TAGS"]))

    def _log_params(self, config: dict, trial_params: dict | None) -> None:
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = {**flatten(config), **(trial_params or {})}
        # MLflow refuses longer values; a cut value (marked "...") keeps the key visible
        params = {k: (v if len(str(v)) <= MAX_PARAM_VAL_LENGTH else str(v)[: MAX_PARAM_VAL_LENGTH - 3] + "...")
                  for k, v in params.items()}
        limit = os.getenv("MLFLOW_MAX_LOG_PARAMS", "")
        items = list(params.items())[: int(limit)] if limit.isdigit() else list(params.items())
        for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):  # MLflow's batch limit
            self._mlflow.log_params(dict(items[i: i + MAX_PARAMS_TAGS_PER_BATCH]), synchronous=False)

    def write(self, logs, step):
        # names MLflow refuses (parentheses, ...) get "_"; values that are not numbers are not metrics
        metrics = {re.sub(r"[^0-9A-Za-z_\-. :/]", "_", k): v for k, v in logs.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if metrics:
            self._mlflow.log_metrics(metrics, step=step, synchronous=False)

    def finish(self, failed):
        if self._owns_run and self._mlflow.active_run() is not None:
            self._mlflow.end_run(status="FAILED" if failed else "FINISHED")
        self._owns_run = False

