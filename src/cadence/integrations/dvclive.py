"""``report_to="dvclive"``: DVCLive's files (``dvclive/`` in the working directory, as transformers).

As transformers: the arguments go to ``params.yaml``; each number logged goes to its DVCLive metric, named
by DVCLive's rule for transformers (``eval_loss`` -> ``eval/loss``, ``loss`` stays ``loss``), as a row of
``plots/metrics/<name>.tsv``, and the latest values to ``metrics.json``. A value that is not a number is
skipped with a warning. One difference: a row's ``step`` is the global step (transformers counts logs, so its
steps drift from the Trainer's once evaluations are logged too). A resumed training continues the folder
(``Live(resume=True)``); a new one starts it afresh, as DVCLive does. Pass ``DVCLiveCallback(live=Live(...))``
in ``callbacks`` to choose the folder or other DVCLive options; that ``Live`` is then ended by its owner.
"""

from __future__ import annotations

import logging

from .base import FLUSH_SECS, TrackerCallback

logger = logging.getLogger(__name__)


class DVCLiveCallback(TrackerCallback):
    """Write params and metrics with DVCLive."""

    flush_secs = FLUSH_SECS  # local files: rows are written in batches

    def __init__(self, live=None):
        super().__init__()
        from dvclive import Live

        if live is not None and not isinstance(live, Live):
            raise ValueError(f"DVCLiveCallback(live={type(live).__name__}) is invalid: pass a dvclive.Live or None")
        self.live = live
        self._owns_live = live is None
        self._skipped: set[str] = set()  # keys already warned about

    def start(self, args, state, model, resumed):
        from dvclive import Live

        if self._owns_live:
            self.live = Live(resume=resumed)
        self.run_id = str(self.live.dir)
        if not resumed:
            self.live.log_params(args.to_dict())

    def write_rows(self, rows):
        from dvclive.plots import Metric
        from dvclive.utils import standardize_metric_name

        live = self.live
        for logs, step, _ in rows:
            live.step = step
            for key, value in logs.items():
                if Metric.could_log(value):
                    live.log_metric(standardize_metric_name(key, "dvclive.huggingface"), value)
                elif key not in self._skipped:
                    self._skipped.add(key)
                    logger.warning("dvclive: %r = %r is not a number: not logged", key, value)
        live.make_summary()  # metrics.json: the latest values, once a batch

    def finish(self, failed):
        if self._owns_live and self.live is not None:
            self.live.end()
            self.live = None
