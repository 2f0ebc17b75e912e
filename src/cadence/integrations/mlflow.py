"""``report_to="mlflow"``: parameters, metrics with steps, one MLflow run per training.

Where: ``MLFLOW_TRACKING_URI`` (else MLflow's own default), experiment ``MLFLOW_EXPERIMENT_NAME``
(else MLflow's default one). Parameters are the model config and the arguments, flattened
(``a/b``) and cut to MLflow's length limit; metrics keep the Trainer's names at the global step. The
run ends with the training (status FAILED when training raised). A resumed run reopens the run id
kept in the checkpoint; ``MLFLOW_RUN_ID`` attaches to a given run. A hyperparameter-search trial is
a nested run (under the active run, e.g. the one around the search). ``MLFLOW_NESTED_RUN=true``
nests every run, ``MLFLOW_TAGS`` (a JSON object) adds tags, as in transformers.

Metrics are numbers (numpy scalars and one-element tensors too, bools as 0/1, an int beyond float64 as
infinity). A value that is not a number (a text, None), a key that is not a string, or a name MLflow
refuses even after its characters are replaced (``a//b``, ``/a``, over 250 characters) is left out with
one warning per key; the log's other metrics are sent.

A resumed run whose MLflow run holds metrics after the checkpoint's step (logged by the interrupted run
after its checkpoint) continues in a copy of that run: a new run with the same name, parameters, tags and
metrics up to the checkpoint's step; the old run is deleted (MLflow keeps deleted runs until ``mlflow gc``:
``mlflow.MlflowClient().restore_run`` brings it back). MLflow cannot delete single metric values, and the
resumed run logs those steps again.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re

from .base import TrackerCallback, as_float, flatten, number, run_config

logger = logging.getLogger(__name__)

_TRUE = {"1", "TRUE", "YES", "ON"}
_MAX_NAME_LENGTH = 250  # MLflow's limit on a metric's name (MAX_ENTITY_KEY_LENGTH)


@functools.lru_cache(maxsize=4096)  # a run logs the same few keys over and over
def metric_key(key: str) -> str | None:
    """``key`` as an MLflow metric name (characters MLflow refuses, e.g. parentheses, as ``_``); None when MLflow
    refuses the name still (``a//b``, ``/a``, ``a/``, too long).

    Example:
        >>> metric_key("eval_f1(macro)"), metric_key("eval//x")
        ('eval_f1_macro_', None)
    """
    name = re.sub(r"[^0-9A-Za-z_\-. :/]", "_", key)
    try:  # MLflow's own rule, where this version has it
        from mlflow.utils.validation import _validate_metric_name
    except ImportError:
        return name if 0 < len(name) <= _MAX_NAME_LENGTH else None
    try:
        _validate_metric_name(name)
    except Exception:  # noqa: BLE001 - MlflowException: refused
        return None
    return name if len(name) <= _MAX_NAME_LENGTH else None


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
                if resumed and run_id != os.getenv("MLFLOW_RUN_ID"):  # a run the user named is left as it is
                    run_id = self._without_steps_after(run_id, state.global_step)
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

    def _without_steps_after(self, run_id: str, step: int) -> str:
        """``run_id``, or the id of a copy of it up to ``step`` when it holds metrics after ``step`` (the old
        run is then deleted; see the module docstring)."""
        client = self._mlflow.MlflowClient()
        old = client.get_run(run_id)
        latest = getattr(old.data, "_metric_objs", None)  # each key's value at its highest step: a cheap first look
        if latest is not None and not any(m.step > step for m in latest):
            return run_id  # the usual case (an evaluate() after training, a run stopped at its checkpoint)
        history = {key: client.get_metric_history(run_id, key) for key in old.data.metrics}
        if not any(m.step > step for values in history.values() for m in values):
            return run_id
        from mlflow.entities import Metric, Param

        tags = {k: v for k, v in old.data.tags.items() if k != "mlflow.runName"}  # the name is create_run's
        new = client.create_run(old.info.experiment_id, run_name=old.info.run_name, tags=tags)
        new_id = new.info.run_id
        metrics = [Metric(m.key, m.value, m.timestamp, m.step) for values in history.values() for m in values
                   if m.step <= step]
        params = [Param(k, v) for k, v in old.data.params.items()]
        for i in range(0, len(params), 100):  # MLflow's batch limits: 100 params, 1000 metrics
            client.log_batch(new_id, params=params[i: i + 100])
        for i in range(0, len(metrics), 1000):
            client.log_batch(new_id, metrics=metrics[i: i + 1000])
        client.set_tag(new_id, "cadence.resumed_from_run_id", run_id)
        client.delete_run(run_id)
        logger.warning("MLflow run %s held metrics after step %d, logged after the checkpoint by the interrupted run: "
                       "continued as run %s (a copy up to step %d); run %s is deleted (restorable until `mlflow gc`)",
                       run_id, step, new_id, step, run_id)
        return new_id

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
        metrics = {}
        for key, value in logs.items():
            name = metric_key(key) if isinstance(key, str) else None
            as_number = number(value)
            if name is None:
                self.skip(key, value, "not a name MLflow takes as a metric (letters, digits, _-. :/, a path "
                                      "without empty or relative parts, at most 250 characters)")
            elif as_number is None:
                self.skip(key, value, "an MLflow metric is a number")
            else:
                metrics[name] = as_float(as_number)  # MLflow stores float64; a bool is 0/1
        if metrics:
            self._mlflow.log_metrics(metrics, step=step, synchronous=False)

    def finish(self, failed):
        if self._owns_run and self._mlflow.active_run() is not None:
            self._mlflow.end_run(status="FAILED" if failed else "FINISHED")
        self._owns_run = False

