"""``report_to="trackio"``: Hugging Face's local-first tracker.

Runs are stored locally (``TRACKIO_DIR``, default in the Hugging Face cache) in project
``args.project`` under ``run_name``, or on the Space ``trackio_space_id`` when set. Metrics carry
transformers' names at the global step; the config is logged once. A resumed run continues the
run name kept in the checkpoint.

Numbers are sent as plain numbers (Trackio drops tensors, and ints beyond 64 bits, which are sent as
floats); texts, None, lists and dicts, and Trackio's own media objects as they are. Another value, or a
key that is not a string, is left out with one warning per key.
"""

from __future__ import annotations

from .base import SUMMARY_KEYS, TrackerCallback, as_float, number, rewrite_logs, run_config

_INT64 = 2**63  # Trackio drops ints outside int64 ("exceeds 64-bit range")


def _is_trackio_object(value) -> bool:
    return type(value).__module__.startswith("trackio")  # trackio.Image, Table, Histogram, ...


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
        curves = rewrite_logs({k: v for k, v in self._takeable(logs).items() if k not in SUMMARY_KEYS})
        self._trackio.log({**curves, "train/global_step": step}, step=step)

    def _takeable(self, logs: dict) -> dict:
        """``logs`` as Trackio takes them: numbers plain, the values it cannot store skipped."""
        kept = {}
        for key, value in logs.items():
            as_number = number(value)
            if not isinstance(key, str):
                self.skip(key, value, "a Trackio metric name is a string")
            elif as_number is not None:
                kept[key] = as_float(as_number) if type(as_number) is int and abs(as_number) >= _INT64 else as_number
            elif value is None or isinstance(value, (str, list, tuple, dict)) or _is_trackio_object(value):
                kept[key] = value  # Trackio encodes these itself (its media objects included)
            else:
                self.skip(key, value, "Trackio takes numbers, texts, lists, dicts and its media objects")
        return kept

    def finish(self, failed):
        self._trackio.finish()
