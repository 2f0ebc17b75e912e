"""``report_to="kubeflow"``: training progress for Kubeflow Trainer (a TrainJob's runtime status).

Inside a TrainJob with the ``TrainJobRuntimeStatus`` feature, the controller sets three variables:
``KUBEFLOW_TRAINER_SERVER_URL`` (where to POST), ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` (the CA that signs its
TLS certificate) and ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (a file holding the service-account token, re-read
every 5 minutes as the token rotates). What is sent is what transformers' ``KubeflowCallback`` sends: one
JSON object ``{"trainerStatus": {"lastUpdatedTime", "progressPercentage", "estimatedRemainingSeconds",
"metrics": [{"name", "value"}, ...]}}`` (values as strings): 0% when training starts, at most one update
every 5 seconds after optimizer steps (capped at 99%), 100% when training ends.

The callback keeps transformers' attributes and private methods (``_initialized``, ``_metrics``, ``_start_time``,
``_last_update_time``, ``_MIN_UPDATE_INTERVAL``, ``_get_token``, ``_get_ssl_context``, ``_update_status``), which
its tests and subclasses drive. Three differences: a resumed run starts at its share of the steps (not 0%); the
time left is estimated from the steps of this run, so a resumed run does not count the steps it skipped as done in
no time; and an update the controller refuses (an HTTP error, a timeout) logs one error and switches the callback
off, where transformers logs it at debug level and keeps sending.
``DISABLE_KUBEFLOW_INTEGRATION=TRUE`` turns it off; ``report_to="all"`` includes it only when the URL is set.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.request
from datetime import datetime, timezone

from ..trainer_callback import TrainerCallback

logger = logging.getLogger(__name__)

URL_ENV, CA_CERT_ENV, TOKEN_ENV = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT",
                                   "KUBEFLOW_TRAINER_SERVER_TOKEN")


class KubeflowCallback(TrainerCallback):
    """Report progress, time left and the latest metrics to the Kubeflow Trainer controller (main process only)."""

    _MIN_UPDATE_INTERVAL = 5.0  # seconds between two updates: the controller serves every job of the cluster
    _TOKEN_CACHE_DURATION = 300.0  # seconds a read token is reused (the Kubeflow SDK's period)
    _ENV_SERVER_URL, _ENV_CA_CERT, _ENV_TOKEN_PATH = URL_ENV, CA_CERT_ENV, TOKEN_ENV

    def __init__(self):
        if not os.getenv(URL_ENV):
            raise ValueError(f"report_to='kubeflow' needs {URL_ENV} (Kubeflow Trainer sets it in a TrainJob's pods "
                             f"when TrainJobRuntimeStatus is on); outside a TrainJob remove 'kubeflow' from report_to")
        self._initialized = False  # on_train_begin ran on the main process: the other events report
        self._metrics: dict[str, float] = {}  # the latest value of each number logged
        self._start_time: float | None = None  # time.time() when this run started
        self._start_step = 0  # global_step then: the time left is paced by this run's steps
        self._last_update_time = 0.0  # time.monotonic() of the last update sent
        self._cached_token: str | None = None
        self._token_read_time = 0.0
        self._ssl_context: ssl.SSLContext | None = None
        self._ssl_context_initialized = False
        self._off = False  # an update failed: nothing more is sent

    # ---------------------------------------------------------------- the request

    def _get_ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context trusting the controller's CA (``KUBEFLOW_TRAINER_SERVER_CA_CERT``), made once; None:
        the system's CAs."""
        if not self._ssl_context_initialized:
            ca_file = os.getenv(CA_CERT_ENV)
            self._ssl_context = ssl.create_default_context(cafile=ca_file) if ca_file else None
            self._ssl_context_initialized = True
        return self._ssl_context

    def _get_token(self) -> str | None:
        """The service-account token from ``KUBEFLOW_TRAINER_SERVER_TOKEN``'s file, re-read every
        ``_TOKEN_CACHE_DURATION`` seconds; None without the variable or the file."""
        now = time.monotonic()
        if self._cached_token and now - self._token_read_time < self._TOKEN_CACHE_DURATION:
            return self._cached_token
        path = os.getenv(TOKEN_ENV)
        if not path or not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            self._cached_token, self._token_read_time = f.read().strip(), now
        return self._cached_token

    def _update_status(self, progress_percent: int | None = None, estimated_time_remaining: float | None = None,
                       metrics: dict | None = None, force: bool = False) -> bool:
        """POST one status update; returns whether the controller took it. Nothing is sent (False) without the
        URL, without a token, within ``_MIN_UPDATE_INTERVAL`` of the last update unless ``force``, or after a
        failure; a failure (HTTP error, timeout) logs one error and switches the callback off."""
        url, now = os.getenv(URL_ENV), time.monotonic()
        throttled = not force and now - self._last_update_time < self._MIN_UPDATE_INTERVAL
        if not url or throttled or getattr(self, "_off", False):  # _off: absent where a test skipped __init__
            return False
        self._last_update_time = now
        try:
            token = self._get_token()
            if not token:
                logger.debug("report_to 'kubeflow': no token in %s; the update is not sent", TOKEN_ENV)
                return False
            status: dict = {"lastUpdatedTime": datetime.now(timezone.utc).isoformat()}
            if progress_percent is not None:
                status["progressPercentage"] = max(0, min(100, int(progress_percent)))
            if estimated_time_remaining is not None:
                status["estimatedRemainingSeconds"] = max(0, int(estimated_time_remaining))
            if metrics:
                status["metrics"] = [{"name": str(k), "value": str(v)} for k, v in metrics.items()]
            request = urllib.request.Request(url, data=json.dumps({"trainerStatus": status}).encode(), method="POST",
                                             headers={"Authorization": f"Bearer {token}",
                                                      "Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5, context=self._get_ssl_context()) as response:
                return response.status == 200  # >= 400 raises HTTPError
        except Exception as error:  # noqa: BLE001 - a tracker must never stop training
            self._off = True
            logger.error("report_to 'kubeflow' failed (%s: %s): switched off for the rest of this run; training goes "
                         "on", type(error).__name__, error)
            return False

    # ---------------------------------------------------------------- the Trainer's events

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self._start_time, self._start_step = time.time(), state.global_step
        self._metrics = {}
        self._initialized = True
        # a resumed training starts at its share of the steps (transformers: 0%, then the share at the next step)
        done = int(100 * state.global_step / state.max_steps) if state.max_steps else 0
        total = {"total_steps": state.max_steps} if state.max_steps else None
        self._update_status(progress_percent=done, metrics=total, force=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._initialized and state.is_world_process_zero and logs is not None:
            self._metrics.update((k, v) for k, v in logs.items()
                                 if isinstance(v, (int, float)) and not isinstance(v, bool))

    def on_step_end(self, args, state, control, **kwargs):
        # the loop's cost between updates: one clock read (the update itself is built only when it can be sent)
        if not self._initialized or not state.is_world_process_zero or not state.max_steps or state.max_steps <= 0:
            return
        if time.monotonic() - self._last_update_time < self._MIN_UPDATE_INTERVAL:
            return
        done = state.global_step - getattr(self, "_start_step", 0)
        left = None
        if self._start_time is not None and done > 0:
            left = (time.time() - self._start_time) / done * (state.max_steps - state.global_step)
        metrics = {**self._metrics, "current_step": state.global_step, "total_steps": state.max_steps}
        if state.epoch is not None:
            metrics["current_epoch"] = round(state.epoch, 2)
        self._update_status(progress_percent=min(99, int(100 * state.global_step / state.max_steps)),
                            estimated_time_remaining=left, metrics=metrics)

    def on_train_end(self, args, state, control, **kwargs):
        if self._initialized and state.is_world_process_zero:  # a failed run never gets here: not reported complete
            self._update_status(progress_percent=100, estimated_time_remaining=0, metrics=self._metrics, force=True)
