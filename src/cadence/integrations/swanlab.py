"""``report_to="swanlab"``: SwanLab (``SWANLAB_MODE=local`` keeps the run in local files, ``offline`` for a later sync).

Where: SwanLab's own settings (``SWANLAB_MODE``, ``SWANLAB_LOG_DIR``, ``SWANLAB_API_KEY``, ...), project
``SWANLAB_PROJECT``. As transformers: the run is named ``run_name`` (``run_name-trial`` in a search), the config
is the model config with the arguments over it, metrics carry transformers' names (``train/loss``,
``eval/loss``) with ``train/global_step``, and the end-of-training numbers are ``single_value/<key>``.
``SWANLAB_RUN_ID`` with ``SWANLAB_RESUME`` attach to a given run; a resumed training continues the run id kept
in the checkpoint (in the cloud one run; SwanLab's local store keeps it as a second experiment of that id). A
run the user opened with ``swanlab.init()`` is used as it is and left open.
"""

from __future__ import annotations

import os

from .base import SUMMARY_KEYS, TrackerCallback, rewrite_logs, run_config
from .fresh_random import fresh_random


class SwanLabCallback(TrackerCallback):
    """Send config and metrics to SwanLab."""

    def __init__(self):
        super().__init__()
        with fresh_random():  # importing swanlab draws from `random`
            import swanlab

        self._swanlab = swanlab
        self._owns_run = False

    def start(self, args, state, model, resumed):
        with fresh_random():  # its ids, names and colours are drawn from `random`
            self._start(args, state, model, resumed)

    def _start(self, args, state, model, resumed):
        swanlab = self._swanlab
        run = self._active_run()
        self._owns_run = run is None
        if self._owns_run:
            names = [n for n in (args.run_name, state.trial_name) if n is not None]
            options = {"project": os.getenv("SWANLAB_PROJECT"), "name": "-".join(names) or None}
            run_id = self.run_id if resumed else os.getenv("SWANLAB_RUN_ID")
            if run_id is not None:
                options.update(id=run_id, resume=os.getenv("SWANLAB_RESUME", "allow"))
            elif os.getenv("SWANLAB_RESUME"):
                options["resume"] = os.environ["SWANLAB_RESUME"]
            run = swanlab.init(**options)
        self.run_id = getattr(self._active_run() or run, "id", None)  # the run init made, where get_run cannot say
        if not resumed:
            swanlab.config.update(run_config(args, model))

    def _active_run(self):
        """The open SwanLab run, or None (``get_run()`` returns None in older SwanLab, raises in 0.10)."""
        try:
            return self._swanlab.get_run()
        except RuntimeError:
            return None

    def write(self, logs, step):
        summary = {f"single_value/{k}": logs[k] for k in SUMMARY_KEYS.intersection(logs)}
        curves = rewrite_logs({k: v for k, v in logs.items() if k not in SUMMARY_KEYS})
        self._swanlab.log({**summary, **curves, "train/global_step": step}, step=step)

    def finish(self, failed):
        with fresh_random():
            self._finish(failed)

    def _finish(self, failed):
        if self._owns_run and self._active_run() is not None:
            self._swanlab.finish(state="crashed" if failed else "success")
        self._owns_run = False
