"""``report_to="kubeflow"``: training progress for Kubeflow Trainer (a TrainJob's runtime status).

Inside a TrainJob with the ``TrainJobRuntimeStatus`` feature, the controller sets three variables:
``KUBEFLOW_TRAINER_SERVER_URL`` (where to POST), ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` (the CA that signs its
TLS certificate) and ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (a file holding the service-account token, re-read
every 5 minutes as the token rotates). What is sent is what transformers' ``KubeflowCallback`` sends: one
JSON object ``{"trainerStatus": {"lastUpdatedTime", "progressPercentage", "estimatedRemainingSeconds",
"metrics": [{"name", "value"}, ...]}}`` (values as strings): 0% when training starts, at most one update
every 5 seconds after optimizer steps (capped at 99%), 100% when training ends. One difference: the time left
is estimated from the steps of this run, so a resumed run does not count the steps it skipped as done in
no time. ``DISABLE_KUBEFLOW_INTEGRATION=TRUE`` turns it off; ``report_to="all"`` includes it only when
the URL is set.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.request
from datetime import datetime, timezone

from .base import TrackerCallback

logger = logging.getLogger(__name__)

URL_ENV, CA_CERT_ENV, TOKEN_ENV = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT",
                                   "KUBEFLOW_TRAINER_SERVER_TOKEN")
MIN_INTERVAL = 5.0  # seconds between two updates: the controller serves every job of the cluster
TOKEN_TTL = 300.0  # seconds a read token is reused (the Kubeflow SDK's period)


class KubeflowCallback(TrackerCallback):
    """Report progress, time left and the latest metrics to the Kubeflow Trainer controller."""

    def __init__(self):
        super().__init__()
        self._url = os.getenv(URL_ENV)
        if not self._url:
            raise ValueError(f"report_to='kubeflow' needs {URL_ENV} (Kubeflow Trainer sets it in a TrainJob's pods "
                             f"when TrainJobRuntimeStatus is on); outside a TrainJob remove 'kubeflow' from report_to")
        self.min_interval = MIN_INTERVAL
        self._metrics: dict[str, float] = {}  # the latest value of each number logged
        self._next_update = 0.0  # time.monotonic() from which the next progress update may be sent
        self._begin = (0.0, 0)  # (time.monotonic(), global_step) when this run started: the pace for the time left
        self._token: tuple[str, float] | None = None  # (token, when read)
        self._ssl: ssl.SSLContext | None = None

    def start(self, args, state, model, resumed):
        self.run_id = self._url
        self._metrics = {}
        self._begin = (time.monotonic(), state.global_step)
        self._next_update = self._begin[0] + self.min_interval
        ca_file = os.getenv(CA_CERT_ENV)
        self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file and self._url.startswith("https") else None
        if state.max_steps:
            self._send(progress=self._progress(state, cap=100), metrics={"total_steps": state.max_steps})

    def write(self, logs, step):
        self._metrics.update((k, v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool))

    def on_step_end(self, args, state, control, **kwargs):
        # the loop's cost: one clock read per step; an update at most every min_interval seconds
        if self._started and not self._off and state.max_steps and time.monotonic() >= self._next_update:
            if state.is_world_process_zero:
                self._safely("on_step_end", self._report, state)

    def _report(self, state) -> None:
        now = time.monotonic()
        self._next_update = now + self.min_interval
        begin_time, begin_step = self._begin
        done = state.global_step - begin_step
        left = (now - begin_time) / done * (state.max_steps - state.global_step) if done > 0 else None
        metrics = {**self._metrics, "current_step": state.global_step, "total_steps": state.max_steps}
        if state.epoch is not None:
            metrics["current_epoch"] = round(state.epoch, 2)
        self._send(progress=self._progress(state, cap=99), seconds_left=left, metrics=metrics)

    @staticmethod
    def _progress(state, cap: int) -> int:
        """Percent of the steps done, at most ``cap`` (99 until training has really ended)."""
        return max(0, min(cap, int(100 * state.global_step / state.max_steps)))

    def finish(self, failed):
        if not failed:  # a failed run is not reported complete; the controller sees the pod fail
            self._send(progress=100, seconds_left=0, metrics=self._metrics)

    # ---------------------------------------------------------------- the request

    def _bearer(self) -> str | None:
        path = os.getenv(TOKEN_ENV)
        if not path:
            return None
        if self._token is None or time.monotonic() - self._token[1] >= TOKEN_TTL:
            with open(path, encoding="utf-8") as f:  # a missing token file is an error: the update would be refused
                self._token = (f.read().strip(), time.monotonic())
        return self._token[0]

    def _send(self, progress: int, seconds_left: float | None = None, metrics: dict | None = None) -> None:
        """POST one status update; an HTTP error or a timeout raises (the tracker is then switched off)."""
        status = {"lastUpdatedTime": datetime.now(timezone.utc).isoformat(), "progressPercentage": progress}
        if seconds_left is not None:
            status["estimatedRemainingSeconds"] = max(0, int(seconds_left))
        if metrics:
            status["metrics"] = [{"name": str(k), "value": str(v)} for k, v in metrics.items()]
        headers = {"Content-Type": "application/json"}
        token = self._bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self._url, data=json.dumps({"trainerStatus": status}).encode(),
                                         headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=5, context=self._ssl) as response:  # >= 400 raises HTTPError
            response.read()
