"""``report_to="codecarbon"``: the energy and CO2 emissions of training, measured by CodeCarbon.

As transformers: the measurement covers ``train()`` and is appended to ``output_dir/emissions.csv``
(CodeCarbon's file: duration, energy, emissions, ...); CodeCarbon's own settings (``CODECARBON_*``
variables, ``.codecarbon.config``) apply. With ``CODECARBON_COUNTRY_ISO_CODE`` set (e.g. ``FRA``),
CodeCarbon's offline tracker is used: nothing is looked up online; without it, CodeCarbon finds the location
online (transformers' behaviour). Logs are not sent anywhere: this tracker measures, it does not record metrics.
"""

from __future__ import annotations

import os

from .base import TrackerCallback


class CodeCarbonCallback(TrackerCallback):
    """Measure the training's energy use and emissions with CodeCarbon."""

    def __init__(self):
        super().__init__()
        import torch

        if torch.version.hip:
            raise ValueError("report_to='codecarbon' does not work on AMD ROCm (CodeCarbon cannot measure it): "
                             "remove 'codecarbon' from report_to")
        import codecarbon

        self._codecarbon = codecarbon
        self.tracker = None

    def start(self, args, state, model, resumed):
        os.makedirs(args.output_dir, exist_ok=True)
        offline = bool(os.getenv("CODECARBON_COUNTRY_ISO_CODE"))
        make = self._codecarbon.OfflineEmissionsTracker if offline else self._codecarbon.EmissionsTracker
        self.tracker = make(output_dir=args.output_dir)
        self.tracker.start()
        run_id = getattr(self.tracker, "run_id", None)  # the row's id in emissions.csv
        self.run_id = None if run_id is None else str(run_id)

    def write(self, logs, step):
        pass  # nothing to record

    def on_log(self, args, state, control, **kwargs):
        pass  # a log outside train() (evaluate()) must not start a measurement that nothing would stop

    def finish(self, failed):
        if self.tracker is not None:
            self.tracker.stop()  # writes the row, also for a failed training: the energy was spent
            self.tracker = None
