"""Just-in-time checkpoints: SIGTERM / SIGUSR1 save a checkpoint at the next step end and stop training."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from ..runtime.processes import any_process
from ..trainer_callback import TrainerCallback

logger = logging.getLogger(__name__)


class JITCheckpointCallback(TrainerCallback):
    """On SIGTERM or SIGUSR1 (SLURM's warning), save a checkpoint at the next step end and stop.

    Installed by the Trainer when ``enable_jit_checkpoint=True`` (transformers' name; off by
    default, as there), which calls ``set_trainer(trainer)`` as transformers does: ``.trainer`` and
    ``.jit_manager`` (a :class:`CheckpointManager`, its SIGTERM handler installed) are then set. The
    signal only sets a flag; the save happens at a step boundary through the normal save path, so the
    checkpoint is complete and the resume exact (transformers also saves mid-step, at ``on_step_begin``
    or ``on_pre_optimizer_step``, without the loop's state). A request made through ``jit_manager``
    (``is_checkpoint_requested``) is served the same way. The previous handlers come back when training
    ends. With several processes the flags are combined at every step end (one tiny all-reduce, only when
    this option is on), so all processes save and stop at the same step even when the signal reaches
    them at different moments.
    """

    SIGNALS = ("SIGTERM", "SIGUSR1")

    def __init__(self):
        self.trainer = None  # transformers' attributes, set by set_trainer
        self.jit_manager: CheckpointManager | None = None
        self.requested = None  # the signal's name once one arrived
        self._previous: dict = {}

    def set_trainer(self, trainer: Any) -> None:
        """Keep ``trainer`` and, with ``enable_jit_checkpoint``, make ``jit_manager`` and install its handler."""
        self.trainer = trainer
        if trainer.args.enable_jit_checkpoint:
            self.jit_manager = CheckpointManager(trainer)
            try:
                self.jit_manager.setup_signal_handler()
            except ValueError:  # not the main thread: on_train_begin says so once more if training starts here
                logger.warning("enable_jit_checkpoint: cannot install a SIGTERM handler outside the main thread")

    def _handle(self, signum, frame) -> None:
        self.requested = signal.Signals(signum).name

    def on_train_begin(self, args, state, control, **kwargs):
        self.requested = None
        for name in self.SIGNALS:
            if hasattr(signal, name):
                try:
                    self._previous[name] = signal.signal(getattr(signal, name), self._handle)
                except ValueError:  # not the main thread: signals cannot be caught here
                    logger.warning("enable_jit_checkpoint: cannot install a %s handler outside the main thread", name)

    def _agreed(self, args) -> bool:
        if self.jit_manager is not None and self.jit_manager.is_checkpoint_requested and not self.requested:
            self.jit_manager.is_checkpoint_requested = False  # served here, once
            self.requested = "a request through CheckpointManager"
        agreed = any_process(bool(self.requested), args.device)
        if agreed and not self.requested:
            self.requested = "a signal to another process"
        return agreed

    def on_step_end(self, args, state, control, **kwargs):
        if self._agreed(args):
            logger.warning("%s received: saving checkpoint-%d and stopping training", self.requested, state.global_step)
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        for name, previous in self._previous.items():
            signal.signal(getattr(signal, name), previous)
        self._previous.clear()
        manager = self.jit_manager
        if manager is not None and manager._original_sigterm_handler is not None:  # the one before set_trainer
            signal.signal(signal.SIGTERM, manager._original_sigterm_handler)


class CheckpointManager:
    """transformers' object for just-in-time checkpoints, for scripts that drive one themselves: SIGTERM
    requests a checkpoint ``kill_wait`` seconds later (a SIGKILL that follows at once leaves nothing half
    written), and ``execute_jit_checkpoint()`` writes it through the Trainer's atomic save.

    The Trainer itself uses ``JITCheckpointCallback`` (``enable_jit_checkpoint=True``), which saves at the
    next step end with the loop's state, so that resume is exact; a checkpoint written here from outside
    the loop resumes like a transformers one (the logged-loss sums since the last log are not in it).

    Args:
        trainer: the ``Trainer`` whose checkpoint is written.
        kill_wait: seconds between SIGTERM and the request.
    """

    def __init__(self, trainer: Any, kill_wait: int = 3):
        self.trainer, self.kill_wait = trainer, kill_wait
        self.is_checkpoint_requested = False
        self._original_sigterm_handler = None

    def setup_signal_handler(self) -> None:
        self._original_sigterm_handler = signal.signal(signal.SIGTERM, self._sigterm_handler)

    def _sigterm_handler(self, signum, frame) -> None:
        if not self.is_checkpoint_requested:
            threading.Timer(self.kill_wait, self._enable_checkpoint).start()

    def _enable_checkpoint(self) -> None:
        self.is_checkpoint_requested = True

    # the spellings of earlier transformers 5 releases, for code written against them
    _toggle_checkpoint_flag = _enable_checkpoint

    @property
    def checkpoint_requested(self) -> bool:
        return self.is_checkpoint_requested

    @checkpoint_requested.setter
    def checkpoint_requested(self, value: bool) -> None:
        self.is_checkpoint_requested = value

    def should_checkpoint_now(self) -> bool:
        return self.is_checkpoint_requested

    def execute_jit_checkpoint(self) -> Path:
        """Write ``checkpoint-{global_step}`` now (an asynchronous save is waited for) and fire ``on_save``; returns
        its folder.

        transformers fires no ``on_save`` here; cadence does, as after every checkpoint: the trackers write
        the logs they keep in batches, so the checkpoint's logs are on disk with it even if the process
        is killed next."""
        self.is_checkpoint_requested = False
        trainer = self.trainer
        logger.warning("saving a just-in-time checkpoint at step %d", trainer.state.global_step)
        folder = trainer._save_checkpoint(trainer.model, trial=None)  # transformers' call, which code may patch
        # an asynchronous save is waited for, and fires on_save itself; a synchronous one is written: fire it here
        if not trainer.checkpointer.poll(wait=True, reason="a just-in-time checkpoint returns"):
            trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
        return folder
