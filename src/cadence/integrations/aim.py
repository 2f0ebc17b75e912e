"""``report_to="aim"``: an Aim run in a local repository (``AIM_REPO``, else Aim's default: the working directory).

What Aim's own ``aim.hugging_face.AimCallback`` records: the arguments (and model config) under ``hparams``,
each number logged tracked at the global step and epoch with the prefix as context (``eval_loss`` -> metric
``loss`` in context ``{"subset": "eval"}``; ``loss`` has the empty context). The experiment is
``AIM_EXPERIMENT`` (else Aim's default). A resumed training reopens the run hash kept in the checkpoint.
Unlike Aim's callback, system metrics and terminal capture are off by default (a tracker observes the training,
not the machine; Aim's resource thread wakes every few seconds): ``AimCallback(system_tracking_interval=10,
capture_terminal_logs=True)`` in ``callbacks`` turns them on. ``report_to="all"`` does not include Aim, as
transformers has no Aim tracker.
"""

from __future__ import annotations

import os

from .base import FLUSH_SECS, TrackerCallback, run_config

_PREFIXES = ("train_", "eval_", "test_")


def aim_name(key: str) -> tuple[str, dict]:
    """Aim's (metric name, context) for a log key, as Aim's Hugging Face callback names them.

    Example:
        >>> aim_name("eval_loss"), aim_name("loss")
        (('loss', {'subset': 'eval'}), ('loss', {}))
    """
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):], {"subset": prefix[:-1]}
    return key, {}


class AimCallback(TrackerCallback):
    """Track hyperparameters and metrics in an Aim repository."""

    flush_secs = FLUSH_SECS  # a local database: rows are written in batches

    def __init__(self, repo: str | None = None, experiment: str | None = None,
                 system_tracking_interval: int | None = None, log_system_params: bool = False,
                 capture_terminal_logs: bool = False):
        super().__init__()
        import aim

        self._aim = aim
        self._repo = repo
        self._experiment = experiment
        self._system = {"system_tracking_interval": system_tracking_interval,
                        "capture_terminal_logs": capture_terminal_logs}
        self._log_system_params = log_system_params
        self._run = None

    def start(self, args, state, model, resumed):
        repo = self._repo or os.getenv("AIM_REPO")
        if resumed:
            self._run = self._aim.Run(run_hash=self.run_id, repo=repo, **self._system)
        else:
            self._run = self._aim.Run(repo=repo, experiment=self._experiment or os.getenv("AIM_EXPERIMENT"),
                                      log_system_params=self._log_system_params, **self._system)
            self._run.set("hparams", run_config(args, model), strict=False)
        self.run_id = self._run.hash

    def write_rows(self, rows):
        track = self._run.track
        for logs, step, _ in rows:
            epoch = logs.get("epoch")
            for key, value in logs.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    name, context = aim_name(key)
                    track(value, name=name, step=step, epoch=epoch, context=context)

    def finish(self, failed):
        if self._run is not None:
            self._run.close()
            self._run = None
