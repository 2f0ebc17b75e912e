"""The progress printers: a tqdm bar over training steps (``ProgressCallback``), or the logs printed
(``PrinterCallback``, with ``disable_tqdm=True``). ``trainer_callback`` re-exports both (transformers' import path).
"""

from __future__ import annotations

import sys

from .callback_events import TrainerCallback


def _short_logs(logs: dict, max_str_len: int | None = None) -> dict:
    """Logs for display: floats to 4 significant digits, long strings replaced, no total_flos."""
    shown = {}
    for key, value in logs.items():
        if key == "total_flos":
            continue
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif max_str_len is not None and isinstance(value, str) and len(value) > max_str_len:
            value = (
                f"[String too long to display, length: {len(value)} > {max_str_len}. "
                "Consider increasing `max_str_len` if needed.]"
            )
        shown[key] = value
    return shown


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ProgressCallback(TrainerCallback):
    """A tqdm bar over training steps (and one over prediction batches), logs written under it.

    Only the world main process draws. The Trainer adds this callback, or :class:`PrinterCallback`
    when ``args.disable_tqdm``.

    Args:
        max_str_len: longer string values in logs are replaced by a short notice.
    """

    def __init__(self, max_str_len: int = 100):
        self.training_bar = None
        self.prediction_bar = None
        self.max_str_len = max_str_len
        self.current_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            from tqdm.auto import tqdm  # lazily: keeps `import cadence` fast

            self.training_bar = tqdm(total=state.max_steps, dynamic_ncols=True)
        self.current_step = 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.update(state.global_step - self.current_step)
            self.current_step = state.global_step

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        from .trainer_utils import has_length  # here, not at the top: this module does not import torch

        if state.is_world_process_zero and has_length(eval_dataloader):
            if self.prediction_bar is None:
                from tqdm.auto import tqdm

                # Left on screen only outside training, where it is the only bar. Under the training bar it is drawn
                # on the next line with cursor-movement escapes, which a log file or a pipe shows as stray "[A":
                # there only the training bar is drawn.
                leave = self.training_bar is None
                if not leave and not _is_terminal(sys.stderr):
                    return
                self.prediction_bar = tqdm(total=len(eval_dataloader), leave=leave, dynamic_ncols=True)
            self.prediction_bar.update(1)

    def _close_prediction_bar(self, state):
        if state.is_world_process_zero and self.prediction_bar is not None:
            self.prediction_bar.close()
            self.prediction_bar = None

    def on_evaluate(self, args, state, control, **kwargs):
        self._close_prediction_bar(state)

    def on_predict(self, args, state, control, **kwargs):
        self._close_prediction_bar(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs is not None:
            self.training_bar.write(str(_short_logs(logs, self.max_str_len)))

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.close()
            self.training_bar = None


class PrinterCallback(TrainerCallback):
    """Prints the logs (floats to 4 significant digits) on the local main process."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero and logs is not None:
            print(_short_logs(logs))
