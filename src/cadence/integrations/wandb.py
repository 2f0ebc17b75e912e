"""``report_to="wandb"``: Weights & Biases (``WANDB_MODE=offline`` writes the run to local files only).

The run goes to project ``WANDB_PROJECT`` (default ``huggingface``) under ``run_name``; the config
(model config and arguments) is logged once; metrics carry transformers' names against
``train/global_step``; the end-of-training numbers (``train_runtime``, ``train_loss``, ...) go to
the run summary. ``WANDB_LOG_MODEL=checkpoint`` uploads each checkpoint folder as a model artifact,
``end`` the final model; off by default. A resumed run reopens the run id kept in the checkpoint.

Values go to W&B as they are (it takes numbers, numpy scalars, tensors, texts, lists, its media objects);
when W&B refuses a log (a key that is not a string, an object it cannot encode), the values it cannot take
are left out with one warning per key and the rest of the log is sent.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from .base import SUMMARY_KEYS, TrackerCallback, number, rewrite_logs, run_config

logger = logging.getLogger(__name__)


class WandbCallback(TrackerCallback):
    """Send config, metrics and (optionally) model artifacts to Weights & Biases."""

    def __init__(self):
        super().__init__()
        import wandb

        self._wandb = wandb
        self._owns_run = False
        self._log_model = os.getenv("WANDB_LOG_MODEL", "false").lower()
        if self._log_model not in ("false", "checkpoint", "end"):
            raise ValueError(f"WANDB_LOG_MODEL={self._log_model!r} is invalid: use 'false', 'checkpoint' or 'end'")

    def start(self, args, state, model, resumed):
        wandb = self._wandb
        self._owns_run = wandb.run is None
        if self._owns_run:  # else: a run the user opened with wandb.init() is used as it is
            options = {"project": os.getenv("WANDB_PROJECT", "huggingface"), "name": state.trial_name or args.run_name}
            if state.trial_name is not None:
                options["group"] = args.run_name or args.output_dir
            if resumed:
                options.update(id=self.run_id, resume="allow")
            wandb.init(**options)
        self.run_id = wandb.run.id
        if not resumed:
            wandb.config.update(run_config(args, model), allow_val_change=True)
        wandb.define_metric("train/global_step")
        wandb.define_metric("*", step_metric="train/global_step", step_sync=True)

    def write(self, logs, step):
        try:
            self._send(logs, step)
        except (TypeError, ValueError, AttributeError, OverflowError, RecursionError):  # raised before sending
            self._send(self._takeable(logs), step)

    def _takeable(self, logs: dict) -> dict:
        """The values of ``logs`` W&B can take (its history encoder writes them); the others skipped."""
        encode = getattr(self._wandb.util, "json_dumps_safer_history", json.dumps)  # W&B's encoder for history rows
        kept = {}
        for key, value in logs.items():
            if not isinstance(key, str):
                self.skip(key, value, "a W&B metric name is a string")
                continue
            as_number = number(value)
            if as_number is not None or type(value).__module__.startswith("wandb"):  # its media objects are its own
                kept[key] = value if as_number is None else as_number
                continue
            try:
                encode(value)
            except (TypeError, ValueError, OverflowError, RecursionError) as error:
                self.skip(key, value, f"W&B cannot encode it ({error})")
                continue
            kept[key] = value
        return kept

    def _send(self, logs, step):
        run = self._wandb.run
        for key in SUMMARY_KEYS.intersection(logs):
            run.summary[key] = logs[key]
        curves = rewrite_logs({k: v for k, v in logs.items() if k not in SUMMARY_KEYS})
        run.log({**curves, "train/global_step": step})

    def saved(self, args, state):
        if self._log_model == "checkpoint":
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            self._upload(folder, aliases=[f"checkpoint_global_step_{state.global_step}"])

    def _upload(self, folder: Path, aliases: list[str]) -> None:
        artifact = self._wandb.Artifact(name=f"model-{self.run_id}", type="model")
        artifact.add_dir(str(folder))
        self._wandb.run.log_artifact(artifact, aliases=aliases)

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.is_world_process_zero and self._started and self._log_model == "end":
            if state.interrupted:  # a partly trained model is not the final one; its checkpoint is what resumes
                logger.warning("W&B: training was interrupted, so no final_model is uploaded (WANDB_LOG_MODEL=end)")
            else:
                self._safely("on_train_end", self._upload_final, model, processing_class)
        super().on_train_end(args, state, control, **kwargs)

    def _upload_final(self, model, processing_class) -> None:
        from ..checkpoint_io.formats import save_model_weights

        with tempfile.TemporaryDirectory() as folder:
            save_model_weights(model, folder, processing_class)
            self._upload(Path(folder), aliases=["final_model"])

    def finish(self, failed):
        if self._owns_run and self._wandb.run is not None:
            self._wandb.finish(exit_code=1 if failed else 0)
        self._owns_run = False
