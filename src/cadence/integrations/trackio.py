"""``report_to="trackio"``: Hugging Face's local-first tracker.

Runs are stored locally (``TRACKIO_DIR``, default in the Hugging Face cache) in project
``args.project`` under ``run_name``, or on the Space ``trackio_space_id`` when set. Metrics carry
transformers' names at the global step; the config is logged once. A resumed run continues the
run name kept in the checkpoint.
"""

from __future__ import annotations

from .base import SUMMARY_KEYS, TrackerCallback, rewrite_logs, run_config


class TrackioCallback(TrackerCallback):
    """Send config and metrics to Trackio."""

    def __init__(self):
        super().__init__()
        import trackio

        self._trackio = trackio

    def start(self, args, state, model, resumed):
        name = self.run_id if resumed else (state.trial_name or args.run_name)
        run = self._trackio.init(
            project=args.project, name=name, space_id=args.trackio_space_id, bucket_id=args.trackio_bucket_id,
            resume="allow", private=args.hub_private_repo, config=None if resumed else run_config(args, model),
        )
        self.run_id = run.name

    def write(self, logs, step):
        curves = rewrite_logs({k: v for k, v in logs.items() if k not in SUMMARY_KEYS})
        self._trackio.log({**curves, "train/global_step": step}, step=step)

    def finish(self, failed):
        self._trackio.finish()
