"""``report_to="comet_ml"``: a Comet experiment (``COMET_START_ONLINE=false``: an offline archive to upload later).

Comet's own settings choose where (``COMET_API_KEY``, ``COMET_PROJECT_NAME``, ``COMET_OFFLINE_DIRECTORY``,
...). As transformers: ``COMET_MODE`` is ``get_or_create`` / ``create`` / ``get`` (with
``COMET_EXPERIMENT_KEY``), a search trial always creates its own experiment, the experiment is named
``run_name``, the arguments are parameters ``args|...`` and the model config ``config|...``, metrics carry
transformers' names at the global step and epoch, and ``COMET_LOG_ASSETS=TRUE`` uploads ``output_dir`` when
training ends. One difference: the experiment is ended when training ends (transformers leaves it to exit),
so an offline archive is complete then; a resumed training continues the experiment key kept in the
checkpoint (offline: a second archive that Comet merges into the first on upload).
"""

from __future__ import annotations

import os

from .base import TrackerCallback, rewrite_logs
from .fresh_random import fresh_random

_MODES = ("get", "get_or_create", "create")


class CometCallback(TrackerCallback):
    """Send parameters and metrics to Comet."""

    def __init__(self):
        super().__init__()
        mode = os.getenv("COMET_MODE", "").lower()
        if mode and mode not in _MODES:
            raise ValueError(f"COMET_MODE={mode!r} is invalid: use one of {', '.join(_MODES)}")
        with fresh_random():  # importing comet_ml draws from `random`
            import comet_ml

        self._comet = comet_ml
        self._experiment = None
        self._assets_dir: str | None = None

    def start(self, args, state, model, resumed):
        comet_ml = self._comet
        mode = os.getenv("COMET_MODE", "").lower() or None
        options = {}
        if state.is_hyper_param_search:
            mode = "create"  # one experiment per trial
        elif resumed:
            mode, options["experiment_key"] = "get", self.run_id
        with fresh_random():  # the offline archive's name (<key>-<6 letters>): unique per run
            config = comet_ml.ExperimentConfig(name=args.run_name)
            self._experiment = comet_ml.start(mode=mode, experiment_config=config, **options)
        self.run_id = self._experiment.get_key()
        if os.getenv("COMET_LOG_ASSETS", "FALSE").upper() in ("TRUE", "1"):
            self._assets_dir = args.output_dir
        if resumed:
            return  # parameters are logged once, by the run that started the experiment
        params = {"args": args.to_dict()}
        config = getattr(model, "config", None)
        if config is not None:
            params["config"] = config if isinstance(config, dict) else config.to_dict()
        self._experiment.log_parameters(params)
        if state.is_hyper_param_search:
            self._experiment.log_optimization(optimization_id=state.trial_name, parameters=state.trial_params)

    def write(self, logs, step):
        self._experiment.log_metrics(rewrite_logs(logs), step=step, epoch=logs.get("epoch"))

    def finish(self, failed):
        if self._experiment is None:
            return
        if self._assets_dir and not failed:
            self._experiment.log_asset_folder(self._assets_dir, recursive=True, log_file_name=True)
        self._experiment.end()
        self._experiment = None
