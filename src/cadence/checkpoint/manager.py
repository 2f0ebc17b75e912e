"""The ``Checkpointer``: the one object the Trainer asks about checkpoints (torchtitan's ``CheckpointManager``).

It owns what lives between two saves and around one resume: the background writer and the save in flight (whose
``on_save`` fires once its folder is complete), the lock on ``output_dir`` and, after a torchrun restart, the job's
own newest checkpoint; rotation (in the save); and the objects a checkpoint holds, read from the Trainer's
transformers-named attributes at each save (``optimizer``, ``lr_scheduler``, ``state``, ``control``,
``callback_handler``, ...), so they are registered once, when the Trainer is built.

One save, in order::

    Trainer._save_checkpoint -> Checkpointer.save -> save_load.save (states collected; files written now or by
    the background writer: writer.write_atomically, then rotate_checkpoints) ... Checkpointer.poll -> on_save

One resume, in order (each verb at the moment its objects exist)::

    Checkpointer.claim_output_dir (lock; a torchrun restart's own checkpoint) -> resume_folder (which checkpoint)
    -> load_weights (before the model is wrapped; Trainer._load_from_checkpoint) -> load (after the optimizer exists:
    optimizer, scheduler, scaler, TrainerState, loop state; returns the ResumePoint) -> load_callback_states
    (Trainer._load_callback_state) -> restore_rng (where the data continues, from the ResumePoint)

The Trainer's transformers-named methods (``_save_checkpoint``, ``_load_from_checkpoint``,
``_load_optimizer_and_scheduler``, ``_load_callback_state``, ``_load_best_model``) call these verbs, so a subclass
that overrides one of them still changes what happens there.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from pathlib import Path
from typing import Any, Callable

import torch

from .. import output_guard
from ..checkpoint_io.folders import PREFIX_CHECKPOINT_DIR
# transformers' module constants, which the Trainer's module exposes (scripts import them from transformers.trainer)
from ..checkpoint_io.formats import (OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME,  # noqa: F401
                                     TRAINING_ARGS_NAME, CorruptCheckpointError)
from ..optimization.optimizers import eval_weights
from ..runtime.processes import any_process, every_process
from ..trainer_state import TrainerState
from . import save_load
from .background import BackgroundWriter, CheckpointWriteError
from .manifest import verify_checkpoint
from .resume import (ResumePoint, agreed_checkpoint, find_resume_folder, load_optimizer_and_scheduler,  # noqa: F401
                     restore_callback_states)
from .rng import capture_rng_state, restore_rng_state
from .writer import remove_incomplete

logger = logging.getLogger(__name__)


def _state_at_save(state: TrainerState) -> TrainerState:
    """A copy of ``state`` for an ``on_save`` that fires steps after its save (``async_save``): its step, epoch and
    best checkpoint as saved; its log history as it was then (the rows themselves are shared, never changed)."""
    saved = copy.copy(state)
    saved.log_history = list(state.log_history)
    return saved


class Checkpointer:
    """Saves and resumes one Trainer's checkpoints; every process holds one and calls its verbs at the same points.

    Args:
        trainer: the ``Trainer`` whose objects a checkpoint holds (read at each save: they change between
            ``train()`` calls) and whose callbacks hear ``on_save``.
        model_files: a Trainer subclass's ``_save``, which then writes a checkpoint's model files (called as
            transformers calls it); None: cadence writes them (in the background with ``async_save``).
        data_states: ``(loop, dataloader) -> dict``, what a checkpoint keeps of the data (``loop_state.data_states``):
            given by the Trainer, so that this package, below the data's, never imports them.

    Example:
        >>> checkpointer = Checkpointer(trainer, None, loop_state.data_states)
        >>> checkpointer.save(model, loop)        # checkpoint-{global_step}, maybe in the background
        >>> checkpointer.poll(wait=True)          # written: on_save fired
    """

    def __init__(self, trainer: Any, model_files: Any, data_states: Callable[[Any, Any], dict]):
        self.trainer, self.model_files, self.data_states = trainer, model_files, data_states
        self.writer = BackgroundWriter()  # async_save: its snapshot buffers, its save in flight
        # a background save whose on_save has not fired (every process): its folder and the state as it was saved
        self.unannounced: tuple[Path, TrainerState] | None = None
        self.lock: output_guard.OutputDirLock | None = None  # output_dir, held while train() runs

    @property
    def args(self) -> Any:
        return self.trainer.args

    @property
    def backend(self) -> Any:
        return self.trainer.backend

    # ------------------------------------------------------------------ what a checkpoint holds

    def objects(self, model: torch.nn.Module, loop: Any) -> dict[str, Any]:
        """What a checkpoint holds, by name (``save_load.save`` / ``save_load.load``); the weights are ``model``'s.

        Args:
            model: the model as trained (wrapped).
            loop: the running ``train()``'s ``LoopState``, or None (a save outside ``train()``).
        """
        trainer = self.trainer
        return {"model": model, "processing_class": trainer._saved_processor(), "optimizer": trainer.optimizer,
                "scheduler": trainer.lr_scheduler, "scaler": self.backend.scaler, "trainer_state": trainer.state,
                "callbacks": trainer.callback_handler, "control": trainer.control, "loop_state": loop,
                # the stream's position and the RNGs the batch collated ahead was drawn from
                **self.data_states(loop, trainer.callback_handler.train_dataloader),
                "model_files": self.model_files}

    # ------------------------------------------------------------------ saving

    def save(self, model: torch.nn.Module, loop: Any = None) -> Path:
        """Write ``checkpoint-{global_step}`` atomically, then rotate (every process calls it); with ``async_save``
        the files are written in the background and ``on_save`` fires from :meth:`poll` once they are complete.

        Args:
            model: the model being trained (its unwrapped module is what is saved).
            loop: the loop's state (data position, loss sums: ``loop_state.json``), or None.

        Returns:
            The checkpoint folder.
        """
        trainer, args = self.trainer, self.args
        self.poll(wait=True, reason="the next checkpoint", stall=True)  # one in flight; the best exists below
        state = trainer.state
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        best_step = state.best_global_step
        if best_step and args.save_strategy in ("steps", "epoch", "best"):
            best = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{best_step}"
            if best_step == state.global_step or best.exists():  # set before trainer_state.json is written
                state.best_model_checkpoint = str(best)
        in_background = args.async_save and self.backend.saves_in_background
        with eval_weights(trainer.optimizer, restore=trainer.is_in_train):  # schedule-free: the averaged weights
            folder = save_load.save(folder, self.objects(model, loop), self.backend, args,
                                    self.writer if in_background else None)
        # on_save, when it fires later, sees the state of this step (callbacks find checkpoint-{global_step} by it)
        self.unannounced = (folder, _state_at_save(state)) if in_background else None
        return folder

    @property
    def in_flight(self) -> bool:
        """Whether a background save's ``on_save`` is still to fire."""
        return self.unannounced is not None

    def poll(self, wait: bool, reason: str = "", stall: bool = False) -> bool:
        """Finish the background save whose ``on_save`` has not fired: once its folder is complete (at once when
        ``wait``, else only if it already is: a cheap check at each step boundary), raise its error in this
        thread or fire ``on_save``. Every process calls it at the same points; with several, they agree (one small
        all-reduce while a save is pending), so ``on_save`` fires at the same step everywhere. ``reason`` and
        ``stall`` are logged with the time waited (a warning with ``stall``: the next save had to wait).

        Returns:
            Whether ``on_save`` fired.

        Raises:
            CheckpointWriteError: the background write failed; the folder does not exist (the cause chained).
        """
        if self.unannounced is None:
            return False
        (folder, saved_state), saver, trainer = self.unannounced, self.writer, self.trainer
        error = None
        if wait:
            try:
                saver.wait(reason, stall)
            except CheckpointWriteError as e:
                error = e
        busy, failed = not saver.done(), error is not None or saver.failed()
        if self.args.world_size > 1:  # the main process writes the folder (every process its FSDP shards): agree
            flags = self.backend.reduce_sum(torch.tensor([float(busy), float(failed)], device=self.backend.device))
            busy, failed = (bool(v > 0) for v in flags.tolist())
        if busy:
            return False
        self.unannounced = None
        try:
            saver.wait(reason)  # finished: returns at once, or raises its error
        except CheckpointWriteError as e:
            error = error or e
        if error is not None:
            raise error
        if failed:
            raise CheckpointWriteError(folder, detail="another process's background write failed "
                                       "(its log names the cause)")
        should_save = trainer.control.should_save  # a save requested at this step stays requested
        trainer.control = trainer.callback_handler.on_save(self.args, saved_state, trainer.control)
        trainer.control.should_save = trainer.control.should_save or should_save
        return True

    def abandon(self) -> None:
        """After train() failed: wait for the save in flight (the lock on ``output_dir`` goes after it), on this
        process alone (no collective: another may be gone), and log its error instead of hiding the first one."""
        self.unannounced = None
        try:
            self.writer.wait(reason="train() stops on an error")
        except CheckpointWriteError as e:
            logger.error("%s", e, exc_info=e.__cause__)

    def finish(self) -> list[Path]:
        """The rotation at the end of training (every save complete): with ``save_total_limit=1`` only the best
        checkpoint is left, as transformers leaves it. Returns the deleted folders."""
        return save_load.finish_rotation(self.args, self.trainer.state.best_model_checkpoint)

    def save_model(self, output_dir: str | os.PathLike, model: torch.nn.Module, processing_class: Any,
                   state_dict: dict | None) -> None:
        """``Trainer.save_model``'s files into ``output_dir`` (the weights and ``training_args.bin``)."""
        save_load.save_model(output_dir, model, processing_class, state_dict, self.args)

    # ------------------------------------------------------------------ output_dir

    def claim_output_dir(self, resume_from_checkpoint: str | bool | None) -> str | bool | None:
        """Lock ``output_dir`` for this run (main process; see ``output_guard``). A job torchrun restarted
        continues its own newest intact checkpoint when none is given; a new run notes (warns, keeps away from
        rotation) an earlier run's checkpoints there, or with ``overwrite_output_dir=True`` deletes them.

        Returns:
            The ``resume_from_checkpoint`` to use.
        """
        args, backend = self.args, self.backend
        self.lock = lock = output_guard.OutputDirLock(args.output_dir)
        main = args.process_index == 0  # one owner, also with save_on_each_node on a shared disk
        refused = None
        if main:
            try:
                lock.acquire()
            except ValueError as error:
                refused = error
        refused = every_process(refused)[0]  # the main process's answer on every process: none waits for a refused one
        if refused is not None:
            raise refused
        # one answer for the job: each node's torchrun agent counts its own restarts, and one that restarts its
        # healthy worker because another node's failed counts none (a membership change): any process's yes counts
        if resume_from_checkpoint is None and any_process(output_guard.restarted_by_torchrun(), args.device):
            resume_from_checkpoint = self._restarted_job_checkpoint()  # (False: told not to resume)
        if resume_from_checkpoint in (None, False):
            output_guard.note_earlier_run(lock, args.overwrite_output_dir, main=main)
        backend.barrier()
        return resume_from_checkpoint

    def release_output_dir(self, failed: bool) -> None:
        """Unlock ``output_dir`` (a failed run leaves no empty ``output_dir`` it created behind)."""
        if self.lock is not None:
            self.lock.release(remove_created_dir=failed)
            self.lock = None

    def _restarted_job_checkpoint(self) -> str | None:
        """torchrun restarted this job: its newest intact checkpoint in ``output_dir`` that every process holds (the
        main process decides among them, every process gets its answer: ``agreed_checkpoint``), or None when it
        wrote none yet. Logged."""
        args, job = self.args, output_guard.job_identity()  # the main process's: it wrote the checkpoints' loop state
        if args.process_index == 0 and job is not None and os.path.isdir(args.output_dir):
            remove_incomplete(args.output_dir)  # a save the restart interrupted: never chosen
        self.backend.barrier()

        def newest_own(among: set[str] | None) -> str | None:
            if job is None:
                return None
            for path in output_guard.job_checkpoints(args.output_dir, job):
                if among is not None and path.name not in among:
                    logger.warning("%s is not on the disk of every process of the job; trying this job's older "
                                   "checkpoint", path)
                    continue
                try:
                    verify_checkpoint(path)
                except CorruptCheckpointError as e:
                    logger.warning("%s; trying this job's older checkpoint", e)
                    continue
                return str(path)
            return None

        folder = agreed_checkpoint(newest_own, args.output_dir)
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if folder is not None:
            logger.warning("torchrun (or SLURM) restarted this job (restart %s here): resuming from its newest intact "
                           "checkpoint %s", restart, folder)
        else:
            logger.warning("torchrun (or SLURM) restarted this job (restart %s here): no intact checkpoint of this job "
                           "that every process holds in output_dir=%r, training from the start", restart,
                           args.output_dir)
        return folder

    # ------------------------------------------------------------------ resuming, each piece when its objects exist

    def resume_folder(self, resume_from_checkpoint: str | os.PathLike | bool | None) -> Path | None:
        """The checkpoint ``train(resume_from_checkpoint=...)`` continues from (True: the newest intact one), the
        same on every process; None or False: none. What killed saves left is removed first, never chosen."""
        if resume_from_checkpoint in (None, False):
            return None
        return find_resume_folder(resume_from_checkpoint, self.args, self.backend.barrier)

    def load_weights(self, model: torch.nn.Module, folder: str | os.PathLike) -> None:
        """The weights of a checkpoint folder into ``model`` (before it is wrapped): safetensors or ``weights_only``
        files, sharded, PEFT adapters, through the engine."""
        self.backend.load_model_weights(model, folder)

    def load(self, folder: str | os.PathLike, model: torch.nn.Module, loop: Any) -> ResumePoint:
        """Once the optimizer exists: restore the optimizer, scheduler, scaler, ``TrainerState`` and the loop state
        (``save_load.load``); returns where the data continues.

        Args:
            folder: the checkpoint (from :meth:`resume_folder`).
            model: the model as trained (wrapped: the optimizer's shards need it).
            loop: this ``train()``'s ``LoopState``.
        """
        return save_load.load(folder, self.objects(model, loop), self.backend, self.args)

    def load_optimizer_and_scheduler(self, folder: str | os.PathLike) -> None:
        """The optimizer's and scheduler's states of a checkpoint folder into the Trainer's."""
        trainer = self.trainer
        load_optimizer_and_scheduler(Path(folder), trainer.optimizer, trainer.lr_scheduler, functools.partial(
            self.backend.load_optimizer_state, trainer.model_wrapped, trainer.optimizer))

    def load_callback_states(self) -> list[str]:
        """Rebuild the stateful callbacks and the ``TrainerControl`` from ``state.stateful_callbacks``; returns the
        names of the checkpoint's callbacks this run does not have."""
        trainer = self.trainer
        trainer.control, missing = restore_callback_states(trainer.callback_handler, trainer.control,
                                                           trainer.state.stateful_callbacks)
        return missing

    def capture_rng(self) -> dict:
        """Every RNG state of this process now (what the batch collated ahead is drawn from)."""
        return capture_rng_state(self.args.world_size)

    def restore_rng(self, states: dict | None) -> None:
        """Put back RNG states a checkpoint saved (``ResumePoint.rng``, or the look-ahead's)."""
        restore_rng_state(states)

    def load_best_model(self) -> None:
        """Put the weights of ``state.best_model_checkpoint`` into the model (every process reads them), once the
        save in flight is complete."""
        trainer = self.trainer
        self.poll(wait=True, reason="loading the best model")
        logger.info("loading the best model from %s (%s=%s)", trainer.state.best_model_checkpoint,
                    self.args.metric_for_best_model, trainer.state.best_metric)
        self.backend.load_model_weights(trainer.model, trainer.state.best_model_checkpoint)

