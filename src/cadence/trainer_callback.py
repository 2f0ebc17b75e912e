"""Callbacks: the objects that watch the loop, and the handler that calls them (the state they see: ``trainer_state``).

Callbacks observe and request (``control.should_*``); the Trainer acts. All interval rules live in
:class:`DefaultFlowCallback`. The names, fields, event signatures and the ``trainer_state.json``
layout are those of ``transformers.trainer_callback`` (5.x), so checkpoints move between the two
libraries in both directions.

Event order of one ``Trainer.train()`` run (the Trainer follows this list and tests it exactly)::

    Trainer.__init__                                              on_init_end
    train():
      on_train_begin
      if args.eval_on_start: one evaluation (below), before the first epoch
      for each epoch:
        on_epoch_begin
        for each optimizer step (a window of gradient_accumulation_steps micro-batches;
                                 the last window of an epoch may be shorter):
          on_step_begin                   once per optimizer step, before its first micro-batch
          for each micro-batch but the last:
            forward + backward            on_substep_end
          last micro-batch:
            forward + backward, clip      on_pre_optimizer_step
            optimizer.step()              on_optimizer_step
            scheduler.step(), zero_grad, global_step += 1, epoch updated
                                          on_step_end
          as control asks, in this order: on_log (training logs), evaluation, on_save
          leave the epoch if control.should_epoch_stop or control.should_training_stop
        on_epoch_end
        as control asks, in this order: on_log, evaluation, on_save
        leave training if control.should_training_stop
      on_log (final train metrics: train_loss, train_runtime, ...)
      on_train_end

    evaluation = evaluate():  on_prediction_step per batch, on_log (eval metrics), on_evaluate
    predict():                on_prediction_step per batch, on_predict   (no on_log)
    push_to_hub():            on_push_begin

So with ``gradient_accumulation_steps=1`` there is no ``on_substep_end`` at all, and
``eval_on_start`` evaluates directly from the Trainer (no callback requests it). Example, one
epoch of 4 batches, ``gradient_accumulation_steps=2``, ``logging_steps=1``, no eval, no save::

    on_init_end, on_train_begin, on_epoch_begin,
    on_step_begin, on_substep_end, on_pre_optimizer_step, on_optimizer_step, on_step_end, on_log,
    on_step_begin, on_substep_end, on_pre_optimizer_step, on_optimizer_step, on_step_end, on_log,
    on_epoch_end, on_log, on_train_end

With ``async_save=True`` (the default) the list above is that of ``async_save=False``, but for ``on_save``: a
checkpoint is written in the background, so its ``on_save`` fires once the folder is complete, at the first step
boundary after that (just after ``on_step_end`` or ``on_epoch_end``, before that step's ``on_log``), or where something
waits for it (the next save, the end of training: always before ``on_train_end``). Its ``state`` is the one of the
save step (``state.global_step`` names the checkpoint), and ``control.should_save`` is cleared at the save step.
Where transformers' order can be kept without waiting for the disk it is: a save at an epoch's last step fires
``on_save`` before ``on_epoch_end`` when its folder is complete by then (always at the last epoch, whose end waits
for it: the end of training waits anyway), and an epoch-end save before the next ``on_epoch_begin`` when complete by
then. Otherwise (a mid-epoch save, or a slow disk) it fires at a later boundary: matching transformers there would mean
waiting for every write, which is what ``async_save=False`` does (exactly transformers' order, ``test_hf_allows.py``).

The handler resets switches as it dispatches: ``on_train_begin`` clears ``should_training_stop``,
``on_epoch_begin`` clears ``should_epoch_stop``, ``on_step_begin`` clears log/evaluate/save,
and ``on_log``/``on_evaluate``/``on_save`` clear their own switch.
"""

from __future__ import annotations

import logging
import operator

from . import versions
from .callback_events import _EVENTS, TrainerCallback  # noqa: F401
# the progress printers live in progress.py; transformers' scripts import them from here
from .progress import PrinterCallback, ProgressCallback  # noqa: F401
# the state a checkpoint keeps: its own module (checkpoints need it, not the callbacks); importable from here as in
# transformers
from .trainer_state import ExportableState, TrainerControl, TrainerState, _is, _trial_params  # noqa: F401

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------- callbacks


# The base no-ops: the handler skips them so an event costs nothing for callbacks that ignore it.
_NOOPS = {event: getattr(TrainerCallback, event) for event in _EVENTS}


_NOTE = "raised by callback "  # the note a callback's exception carries (one, from the innermost event)


class CallbackHandler(TrainerCallback):
    """Calls the callbacks in order for each event and returns the resulting ``TrainerControl``.

    Every event passes ``model``, ``processing_class``, ``optimizer``, ``lr_scheduler``,
    ``train_dataloader`` and ``eval_dataloader`` (the handler's attributes of those names, which
    the Trainer may reassign) as keyword arguments.

    Args:
        callbacks: callback classes or instances.
        model, processing_class, optimizer, lr_scheduler: the objects passed to every event.
    """

    def __init__(self, callbacks, model, processing_class, optimizer, lr_scheduler):
        self._callbacks: list = []
        self._hooks: dict[str, tuple] = {}
        self._n_hooked = 0
        for cb in callbacks:
            self.add_callback(cb)
        self.model = model
        self.processing_class = processing_class
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader = None
        self.eval_dataloader = None
        if not any(isinstance(cb, DefaultFlowCallback) for cb in self._callbacks):
            logger.warning(
                "The Trainer will not log, evaluate, save or stop on schedule without a DefaultFlowCallback; "
                "add one with trainer.add_callback(DefaultFlowCallback). Current callbacks:\n%s",
                self.callback_list,
            )

    @property
    def callbacks(self) -> list:
        """The callbacks, in call order. Change it through add/pop/remove_callback."""
        return self._callbacks

    @callbacks.setter
    def callbacks(self, value) -> None:
        self._callbacks = list(value)
        self._hooks.clear()

    @property
    def callback_list(self) -> str:
        """Returns: the callback class names, one per line."""
        return "\n".join(type(cb).__name__ for cb in self._callbacks)

    def add_callback(self, callback) -> None:
        """Append a callback.

        Args:
            callback: a class (instantiated without arguments) or an instance.
        """
        if not any(hasattr(callback, event) for event in _EVENTS):  # transformers' callbacks have them too
            raise TypeError(
                f"callbacks: {callback!r} ({type(callback).__name__}) is not a TrainerCallback: it has none of the "
                "callback events (on_step_end, on_log, ...); pass a TrainerCallback subclass or an instance of one"
            )
        try:
            cb = callback() if isinstance(callback, type) else callback
        except TypeError as e:
            raise TypeError(
                f"callbacks: the class {callback.__name__} cannot be built without arguments ({e}); pass an "
                f"instance instead, e.g. callbacks=[{callback.__name__}(...)]"
            ) from e
        if any(type(c) is type(cb) for c in self._callbacks):
            logger.warning(  # formatted here: code that patches logger.warning reads the class in the message
                f"Adding a {type(cb)} to the callbacks, but there is already one. Current callbacks:\n{self.callback_list}"
            )
        self._callbacks.append(cb)
        self._hooks.clear()

    def pop_callback(self, callback):
        """Remove and return the first matching callback (None if there is none).

        Args:
            callback: a class (matches the first instance of it) or an instance.
        Returns:
            The removed callback or None.
        """
        for cb in self._callbacks:
            if isinstance(cb, callback) if isinstance(callback, type) else cb == callback:
                self._callbacks.remove(cb)
                self._hooks.clear()
                return cb
        return None

    def remove_callback(self, callback) -> None:
        """Remove the first matching callback.

        Args:
            callback: a class (silently nothing if absent) or an instance (ValueError if absent).
        """
        if isinstance(callback, type):
            self.pop_callback(callback)
        else:
            self._callbacks.remove(callback)
            self._hooks.clear()

    def _hooks_for(self, event: str) -> tuple:
        """(callback, bound method) for the callbacks that override ``event``, built once."""
        if self._n_hooked != len(self._callbacks):  # the list was changed in place
            self._hooks.clear()
            self._n_hooked = len(self._callbacks)
        hooks = []
        for cb in self._callbacks:
            # Ask the instance, not its class: instance attributes and __getattribute__ tricks count.
            method = getattr(cb, event, None)
            if method is not None and getattr(method, "__func__", None) is not _NOOPS[event]:
                hooks.append((cb, method))
        self._hooks[event] = hooks = tuple(hooks)
        return hooks

    def call_event(self, event: str, args, state, control, **kwargs):
        """Call ``event`` on every callback in order.

        Args:
            event: an event name, e.g. ``"on_step_end"``.
            args, state, control: passed positionally.
            **kwargs: extra event data (``logs``, ``metrics``), passed with the shared objects.
        Returns:
            ``control``, or the last non-None value a callback returned.
        Raises:
            Exception: what a callback raised, itself (``except ValueError:`` around ``train()`` sees it, as in
            transformers), with a note naming the callback and the event.
        """
        return self._dispatch(event, args, state, control, kwargs)

    def _dispatch(self, event: str, args, state, control, extra: dict):
        # Hot path (several events per optimizer step): only callbacks that override the event are
        # called, and the shared objects go as literal keywords, which CPython passes without
        # building an intermediate dict (about 3x cheaper than `**shared`).
        hooks = self._hooks.get(event)
        if hooks is None or self._n_hooked != len(self._callbacks):
            hooks = self._hooks_for(event)
        if not hooks:
            return control
        model, processing_class, optimizer = self.model, self.processing_class, self.optimizer
        lr_scheduler, train_dataloader, eval_dataloader = self.lr_scheduler, self.train_dataloader, self.eval_dataloader
        cb = None
        try:
            for cb, method in hooks:
                if extra:
                    result = method(
                        args, state, control, model=model, processing_class=processing_class, optimizer=optimizer,
                        lr_scheduler=lr_scheduler, train_dataloader=train_dataloader,
                        eval_dataloader=eval_dataloader, **extra,
                    )
                else:
                    result = method(
                        args, state, control, model=model, processing_class=processing_class, optimizer=optimizer,
                        lr_scheduler=lr_scheduler, train_dataloader=train_dataloader,
                        eval_dataloader=eval_dataloader,
                    )
                if result is not None:  # a callback may return a new control instead of mutating
                    control = result
        except Exception as exc:
            # The user's own exception goes through (transformers lets it through too); a note names the culprit.
            # A nested event (a callback that evaluates) already noted the innermost callback: that one is kept.
            if not any(str(n).startswith(_NOTE) for n in getattr(exc, "__notes__", ())):
                exc.add_note(f"{_NOTE}{type(cb).__name__} in {event}")
            raise
        return control

    # One thin method per event; some reset the switches the event consumes (see module docstring). Every one goes
    # through call_event, as in transformers: a library that replaces call_event on the instance (setfit) or in a
    # subclass sees every event.

    def on_init_end(self, args, state, control, **kwargs):
        return self.call_event("on_init_end", args, state, control, **kwargs)

    def on_train_begin(self, args, state, control, **kwargs):
        control._new_training()
        return self.call_event("on_train_begin", args, state, control, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        return self.call_event("on_train_end", args, state, control, **kwargs)

    def on_epoch_begin(self, args, state, control, **kwargs):
        control._new_epoch()
        return self.call_event("on_epoch_begin", args, state, control, **kwargs)

    def on_epoch_end(self, args, state, control, **kwargs):
        return self.call_event("on_epoch_end", args, state, control, **kwargs)

    def on_step_begin(self, args, state, control, **kwargs):
        control._new_step()
        return self.call_event("on_step_begin", args, state, control, **kwargs)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        return self.call_event("on_pre_optimizer_step", args, state, control, **kwargs)

    def on_optimizer_step(self, args, state, control, **kwargs):
        return self.call_event("on_optimizer_step", args, state, control, **kwargs)

    def on_substep_end(self, args, state, control, **kwargs):
        return self.call_event("on_substep_end", args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        return self.call_event("on_step_end", args, state, control, **kwargs)

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics, **kwargs)

    def on_predict(self, args, state, control, metrics, **kwargs):
        return self.call_event("on_predict", args, state, control, metrics=metrics, **kwargs)

    def on_save(self, args, state, control, **kwargs):
        control.should_save = False
        return self.call_event("on_save", args, state, control, **kwargs)

    def on_log(self, args, state, control, logs, **kwargs):
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs, **kwargs)

    def on_prediction_step(self, args, state, control, **kwargs):
        return self.call_event("on_prediction_step", args, state, control, **kwargs)

    def on_push_begin(self, args, state, control, **kwargs):
        return self.call_event("on_push_begin", args, state, control, **kwargs)


class DefaultFlowCallback(TrainerCallback):
    """All interval rules: when to log, evaluate, save and stop (HF's rules exactly).

    ``eval_on_start`` is not handled here: the Trainer evaluates right after ``on_train_begin``.
    """

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step == 1 and args.logging_first_step:
            control.should_log = True
        if _is(args.logging_strategy, "steps") and step % state.logging_steps == 0:
            control.should_log = True
        eval_by_steps = _is(args.eval_strategy, "steps") and args.eval_delay <= step
        if eval_by_steps and step % state.eval_steps == 0:
            control.should_evaluate = True
        if _is(args.save_strategy, "steps") and state.save_steps > 0 and step % state.save_steps == 0:
            control.should_save = True

        if step >= state.max_steps:
            control.should_training_stop = True
            # A step-wise run ends saved, even off the interval; since transformers 5.4 also evaluated (older pins:
            # the last evaluation is the interval's, and the model ends in training mode)
            if eval_by_steps and versions.evaluates_at_max_steps():
                control.should_evaluate = True
            if _is(args.save_strategy, "steps"):
                control.should_save = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if _is(args.logging_strategy, "epoch"):
            control.should_log = True
        if _is(args.eval_strategy, "epoch") and args.eval_delay <= state.epoch:  # delay in epochs here
            control.should_evaluate = True
        if _is(args.save_strategy, "epoch"):
            control.should_save = True
        return control


class EarlyStoppingCallback(TrainerCallback, ExportableState):
    """Stop training after ``early_stopping_patience`` evaluations without improvement.

    An evaluation improves when ``args.metric_for_best_model`` beats ``state.best_metric`` (in the
    direction of ``args.greater_is_better``) by more than ``early_stopping_threshold``. The
    Trainer updates ``state.best_metric`` after ``on_evaluate``. The counter is saved in
    checkpoints, so patience survives a resume.

    Args:
        early_stopping_patience: evaluations without improvement before stopping.
        early_stopping_threshold: the least change that counts as an improvement.

    Example:
        >>> trainer = Trainer(..., callbacks=[EarlyStoppingCallback(early_stopping_patience=3)])
    """

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0):
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold
        self.early_stopping_patience_counter = 0  # evaluations in a row without improvement

    def check_metric_value(self, args, state, control, metric_value) -> None:
        """Reset the counter on an improvement over ``state.best_metric``, else count one more."""
        better = operator.gt if args.greater_is_better else operator.lt
        threshold = self.early_stopping_threshold or 0.0
        best = state.best_metric
        if best is None or (better(metric_value, best) and abs(metric_value - best) > threshold):
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1

    def on_train_begin(self, args, state, control, **kwargs):
        if not args.load_best_model_at_end:
            logger.warning(
                "Using EarlyStoppingCallback without load_best_model_at_end=True: "
                "the best model will not be loaded at the end of training."
            )
        if args.metric_for_best_model is None:
            raise ValueError("EarlyStoppingCallback requires args.metric_for_best_model to be set.")
        if _is(args.eval_strategy, "no"):
            raise ValueError("EarlyStoppingCallback requires args.eval_strategy to be 'steps' or 'epoch', not 'no'.")

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        name = args.metric_for_best_model
        if not name.startswith("eval_"):
            name = f"eval_{name}"
        value = metrics.get(name)
        if value is None:
            logger.warning("Early stopping needs the metric %r, which this evaluation lacks: not counted.", name)
            return
        self.check_metric_value(args, state, control, value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict:
        """Returns: constructor args and the patience counter."""
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter},
        }
