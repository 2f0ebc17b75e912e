"""The events a callback receives, and ``TrainerCallback``, their no-op base class.

Below ``trainer_callback`` (which re-exports ``TrainerCallback`` and documents the order of the events) and the
progress printers (``progress.py``), which both build on it.
"""

from __future__ import annotations

# Every event a callback can receive, in the order trainer_callback documents them.
_EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
    "on_push_begin",
)


class TrainerCallback:
    """Base class: override the events you need; each receives ``(args, state, control, **kwargs)``.

    kwargs always hold ``model``, ``processing_class``, ``optimizer``, ``lr_scheduler``,
    ``train_dataloader``, ``eval_dataloader``; ``on_log`` also gets ``logs``, ``on_evaluate`` and
    ``on_predict`` get ``metrics``. Change ``control`` in place or return a new one; returning
    None keeps it. The order of events is in ``cadence.trainer_callback``'s docstring.

    Example:
        >>> class PrintLoss(TrainerCallback):
        ...     def on_log(self, args, state, control, logs=None, **kwargs):
        ...         print(state.global_step, logs.get("loss"))
    """

    def on_init_end(self, args, state, control, **kwargs):
        """End of ``Trainer.__init__``."""

    def on_train_begin(self, args, state, control, **kwargs):
        """Start of training, before the first epoch."""

    def on_train_end(self, args, state, control, **kwargs):
        """End of training."""

    def on_epoch_begin(self, args, state, control, **kwargs):
        """Start of an epoch."""

    def on_epoch_end(self, args, state, control, **kwargs):
        """End of an epoch."""

    def on_step_begin(self, args, state, control, **kwargs):
        """Start of an optimizer step (before its first micro-batch)."""

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """After gradient clipping, before ``optimizer.step()``: gradients are final here."""

    def on_optimizer_step(self, args, state, control, **kwargs):
        """After ``optimizer.step()``, before gradients are zeroed."""

    def on_substep_end(self, args, state, control, **kwargs):
        """After each micro-batch of an optimizer step except its last."""

    def on_step_end(self, args, state, control, **kwargs):
        """End of an optimizer step; ``state.global_step`` already counts it."""

    def on_evaluate(self, args, state, control, **kwargs):
        """After an evaluation; kwargs hold ``metrics``."""

    def on_predict(self, args, state, control, metrics, **kwargs):
        """After ``Trainer.predict``."""

    def on_save(self, args, state, control, **kwargs):
        """After a checkpoint was saved."""

    def on_log(self, args, state, control, **kwargs):
        """After logging; kwargs hold ``logs``."""

    def on_prediction_step(self, args, state, control, **kwargs):
        """After each evaluation/prediction batch."""

    def on_push_begin(self, args, state, control, **kwargs):
        """Before pushing the model to the Hub."""
