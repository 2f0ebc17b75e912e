"""The one pair the Trainer calls: :func:`save` ``(folder, objects, backend, args)`` writes named objects
(model, optimizer, scheduler, scaler, loop state, stream state, ``TrainerState`` and the callbacks'
states) and rotates; :func:`load` ``(folder, objects, backend, args)`` restores them in place and
returns the :class:`~cadence.checkpoint.resume.ResumePoint` (``data.epoch_batches`` continues the data and the RNGs
from it).
Only the weights are loaded apart (``Backend.load_model_weights``, before the optimizer exists), and the best
model at the end of training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from pathlib import Path
from typing import Any, Callable

import torch

from .. import output_guard, peft_support
from ..runtime.processes import every_process
from ..trainer_state import ExportableState, TrainerState
from ..trainer_utils import compare_trainer_and_checkpoint_args
from .background import BackgroundWriter
from ..checkpoint_io.formats import (LOOP_STATE_NAME, OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME, STREAM_STATE_NAME,
                      TRAINER_STATE_NAME, TRAINING_ARGS_JSON, TRAINING_ARGS_NAME, WEIGHTS_NAME, load_training_args,
                      safe_load, _takes_keyword, save_json, save_model_weights, writing)
from .manifest import read_trainer_state
from .resume import ResumePoint, load_optimizer_and_scheduler, resume_point
from ..checkpoint_io.folders import keep_only_best, rotate_checkpoints
from .writer import (final_name, prepare_staging, remove_incomplete, save_rng_state, staging_folder,
                     staging_removed_on_error, write_atomically)

logger = logging.getLogger(__name__)

# named object -> its file, in writing order; trainer_state.json is written after them all (it marks completeness)
STATE_FILES = {"optimizer": OPTIMIZER_NAME, "scheduler": SCHEDULER_NAME, "loop_state": LOOP_STATE_NAME,
               "stream": STREAM_STATE_NAME, "scaler": SCALER_NAME}
# TrainerState fields a resumed run takes from its own arguments, not from the checkpoint
_RUN_FIELDS = ("is_local_process_zero", "is_world_process_zero", "logging_steps", "eval_steps", "save_steps",
               "train_batch_size", "max_steps", "num_train_epochs")


def save(folder: str | os.PathLike, objects: dict[str, Any], backend: Any, args: Any,
         writer: BackgroundWriter | None = None) -> Path:
    """Write the checkpoint ``folder`` from named objects, atomically, then rotate the older ones away.

    Every process calls it, as a state may be a collective (FSDP gathers the weights or writes shards,
    the loop's loss sums are reduced); each process writes its RNG file, the main one
    (``args.should_save``) every other file, ``trainer_state.json`` last, and only once every process
    agrees the folder is complete are incomplete folders and checkpoints beyond ``save_total_limit``
    deleted (never the best one nor this one). With ``save_only_model`` only the weights, the arguments
    and ``trainer_state.json`` are written.

    With a ``writer`` the save is asynchronous: the states are collected here as always (collectives stay on
    the training thread), the small files that are ready (every process's RNG state, weights a model's
    ``save_pretrained`` writes only from the live model, e.g. PEFT adapters) go into the staging folder now;
    FSDP's sharded state is copied to the CPU now and written by every process's writer thread (DCP, with its
    collectives on a group of their own); the main process hands a CPU snapshot of the rest to its writer's thread,
    which writes the shards, then the other files, hashes, renames and rotates. Returns at once;
    ``writer.wait()`` waits for the folder (on every process: for its shards). The caller has collected the previous
    save first (one in flight: ``Checkpointer.poll``, which also fires its ``on_save``), and passes no writer
    where ``backend.saves_in_background`` is False.

    Args:
        folder: ``{output_dir}/checkpoint-{global_step}``.
        objects: ``model`` (as trained: wrapped; its unwrapped module's weights are saved), ``processing_class``
            (saved with the weights), ``optimizer``, ``scheduler``, ``scaler``, ``loop_state``, ``stream``
            (each saved through its ``state_dict()`` into the file of :data:`STATE_FILES`; None: nothing),
            ``trainer_state``, and ``callbacks`` (the handler) and ``control``, whose states go into it.
        backend: the run's ``Backend`` (the model's and optimizer's states, barriers).
        args: the run's ``TrainingArguments`` (also saved, as ``training_args.bin`` and ``.json``).
        writer: the Trainer's ``BackgroundWriter`` (``async_save=True``), or None: written before returning.

    Returns:
        ``folder``.

    Example:
        >>> checkpoint.save(Path("out/checkpoint-10"), {"model": model, "optimizer": opt, ...}, backend, args)
    """
    folder = Path(folder)
    tmp = staging_folder(folder)
    full = not args.save_only_model
    if args.should_save:  # every process puts its files into the staging folder first
        prepare_staging(folder)
    backend.barrier()
    if full:
        save_rng_state(folder, args.process_index, args.world_size, objects.get("look_ahead_rng"))
    # every process, in the same order (collectives): under FSDP gathered to the main process, or written as shards
    model = objects["model"]
    pending = [] if writer is not None else None  # FSDP's sharded writes, for the writer's thread
    states = {"model": backend.model_state_dict(model, tmp, pending=pending)}
    if full:  # None: written as shards
        states["optimizer"] = backend.optimizer_state_dict(model, objects["optimizer"], tmp, pending=pending)
        for name in STATE_FILES:
            if name != "optimizer" and objects.get(name) is not None:
                states[name] = objects[name].state_dict()
    model_files = objects.get("model_files")
    if model_files is not None:  # a Trainer subclass's _save, on every process as transformers calls it, now: it
        # may read the live model, so an asynchronous save snapshots the other states only
        weights = states.pop("model")
        with staging_removed_on_error(folder), writing("writing the model files (the Trainer's _save)"):
            # the main process's _save is given checkpoint-N, as in transformers (a link to the staging folder
            # while it writes); another process's (transformers' _save writes on the main one only) the staging folder
            with final_name(folder) if args.should_save else contextlib.nullcontext(tmp) as where:
                model_files(str(where)) if weights is None else model_files(str(where), state_dict=weights)
    state = objects["trainer_state"]
    stateful = [cb for cb in [*objects["callbacks"].callbacks, objects["control"]] if isinstance(cb, ExportableState)]
    state.stateful_callbacks = TrainerState(stateful_callbacks=stateful).stateful_callbacks
    unwrapped, processing_class = backend.unwrap(model), objects.get("processing_class")
    write = None
    if args.should_save:
        logger.info(f"Saving model checkpoint to {folder}")
        if writer is not None:
            if "model" not in states:  # written by the Trainer's _save already
                pass
            elif _weights_from_state_dict(unwrapped):
                if states["model"] is None:
                    states["model"] = unwrapped.state_dict()
            else:  # written from the live model, now (adapters are small); the snapshot needs no weights
                _write_weights(folder, unwrapped, processing_class, states.pop("model"))
            states = writer.snapshot(states)
        write = functools.partial(_write_files, unwrapped, processing_class, states, args.to_dict(),
                                  state.to_json_string())
    backend.barrier()  # every process's part is in the staging folder, or (pending) on its way there
    if writer is None:
        _complete(folder, write, args, state.best_model_checkpoint, backend.barrier)
    elif write is not None:  # the main process: its shards, then its files, inside the atomic write
        write = functools.partial(_shards_first, pending, write)
        writer.submit(folder, functools.partial(_complete, folder, write, args, state.best_model_checkpoint, None))
    elif pending:  # another process: its shards (the main process's writer renames once they are all written)
        writer.submit(folder, functools.partial(_shards_first, pending, None, None))
    return folder


def _shards_first(pending: list, write: Callable[[Path], None] | None, tmp: Path | None) -> None:
    """In the writer's thread: this process's sharded writes (``Backend`` made them; each ends once every process's
    shards are written: DCP's own collectives), then ``write(tmp)`` (the main process's files)."""
    for write_shards in pending:
        write_shards()
    if write is not None:
        write(tmp)


def _weights_from_state_dict(model: torch.nn.Module) -> bool:
    """Whether ``model``'s weights file can be written from a snapshot of its state dict, later: its
    ``save_pretrained`` takes ``state_dict`` (transformers' models) or it has none (plain safetensors). A PEFT model
    saves its adapters from itself."""
    if peft_support.has_adapters(model):
        return False
    save_pretrained = getattr(model, "save_pretrained", None)
    return save_pretrained is None or _takes_keyword(save_pretrained, "state_dict")


def _write_weights(folder: Path, model: torch.nn.Module, processing_class: Any, state_dict: dict | None) -> None:
    """The weights into the staging folder of ``folder`` now, on the training thread."""
    with staging_removed_on_error(folder), writing(f"writing the weights ({WEIGHTS_NAME})"):
        save_model_weights(model, staging_folder(folder), processing_class, state_dict)


def _write_files(model: torch.nn.Module, processing_class: Any, states: dict, arguments: dict, state_text: str,
                 tmp: Path) -> None:
    """Every file of the main process into ``tmp`` from the collected ``states`` (live, or a snapshot of them),
    ``trainer_state.json`` (``state_text``) last: it marks completeness."""
    if "model" in states:  # else the weights are in the folder already
        with writing(f"writing the weights ({WEIGHTS_NAME})"):  # a shard's own name, when sharded
            save_model_weights(model, tmp, processing_class, states["model"])
    for name, file in STATE_FILES.items():
        if states.get(name) is not None:
            with writing(f"writing {file}"):
                (save_json if file.endswith(".json") else torch.save)(states[name], tmp / file)
    with writing(f"writing {TRAINING_ARGS_NAME}"):
        torch.save(arguments, tmp / TRAINING_ARGS_NAME)
    with writing(f"writing {TRAINING_ARGS_JSON}"):
        save_json(arguments, tmp / TRAINING_ARGS_JSON)
    with writing(f"writing {TRAINER_STATE_NAME}"):
        (tmp / TRAINER_STATE_NAME).write_text(state_text, encoding="utf-8")  # last: marks completeness


def _complete(folder: Path, write: Callable[[Path], None] | None, args: Any, best: str | None,
              barrier: Callable[[], None] | None) -> None:
    """The rest of a save, inline (``barrier``: every process) or in the writer's thread (``barrier`` None: only the
    main process, after every process's part is in the staging folder): ``write`` the main process's files (None on
    the others), the manifest, fsync and rename (:func:`write_atomically`); then every process agrees the folder is
    complete, and only then are killed saves' leftovers and checkpoints beyond ``save_total_limit`` deleted."""
    if write is not None:
        write_atomically(folder, write, fresh=False)
    if barrier is not None:
        barrier()
    if write is not None:
        remove_incomplete(args.output_dir)
        rotate_checkpoints(args.output_dir, args.save_total_limit, best, just_written=folder,
                           earlier=output_guard.earlier_checkpoints(args.output_dir, just_written=folder))


def finish_rotation(args: Any, best: str | None) -> list[Path]:
    """The rotation at the end of training (the main process, every save complete): with ``save_total_limit=1`` and
    a ``best`` checkpoint, only the best is left (:func:`keep_only_best`), as transformers leaves it.

    Returns the deleted folders.
    """
    if not args.should_save or best is None or args.save_total_limit != 1:
        return []
    return keep_only_best(args.output_dir, best, output_guard.earlier_checkpoints(args.output_dir))


def load(folder: str | os.PathLike, objects: dict[str, Any], backend: Any, args: Any) -> ResumePoint:
    """Restore the named objects from the checkpoint ``folder``; returns where the data continues.

    The weights are not among them: they are loaded before the optimizer is built (``Backend.load_model_weights``).
    Order: the arguments first (an unsafe file stops everything before anything else is read), then
    optimizer and scheduler, scaler, ``TrainerState`` (this run's step counts and intervals kept), the loop
    state and the data position; the Trainer then restores the callbacks' states (``_load_callback_state``). A
    transformers checkpoint has no ``loop_state.json``: the loss since its last log is unknown, so, as
    transformers does, the first log averages the steps since the resume.

    Args:
        folder: the checkpoint (from :func:`find_resume_folder`).
        objects: ``model`` (as trained: the optimizer's shards need it), ``optimizer``, ``scheduler``,
            ``scaler`` (None: not loaded), ``trainer_state`` (this run's: its step counts stay), ``loop_state``
            (this run's ``LoopState``: its layout and data identity are checked against the checkpoint's).
            Each is restored in place.
        backend: the run's ``Backend`` (the optimizer's state through the engine).
        args: the run's ``TrainingArguments``.

    Returns:
        The :class:`ResumePoint`: ``data.epoch_batches`` continues the data from it where it stopped.

    Raises:
        ValueError: the checkpoint holds weights only.
    """
    folder = Path(folder)
    saved_args = load_training_args(folder) or {}
    optim = getattr(args, "optim", None)
    load_optimizer_and_scheduler(folder, objects["optimizer"], objects["scheduler"], functools.partial(
        backend.load_optimizer_state, objects["model"], objects["optimizer"]), getattr(optim, "value", optim))
    if (folder / SCALER_NAME).exists():
        scaler_state = safe_load(folder / SCALER_NAME)
        if objects.get("scaler") is not None:  # a resumed fp16 run continues with the same loss scale
            objects["scaler"].load_state_dict(scaler_state)
    state = objects["trainer_state"]
    saved = read_trainer_state(folder)
    # kept only where every process holds it: each loads the best model from its own disk at the end
    if saved.best_model_checkpoint is not None and not all(every_process(os.path.isdir(saved.best_model_checkpoint))):
        logger.warning("the best checkpoint %s recorded in %s no longer exists (on the disk of every process): "
                       "forgotten", saved.best_model_checkpoint, folder)
        saved.best_model_checkpoint = None
    saved_batch_size = saved.train_batch_size
    compare_trainer_and_checkpoint_args(args, saved)  # this run's intervals and batch go on: said as transformers does
    for name in _RUN_FIELDS:
        setattr(saved, name, getattr(state, name))
    for field in dataclasses.fields(state):
        setattr(state, field.name, getattr(saved, field.name))
    loop = objects["loop_state"]
    resume = resume_point(folder, state.global_step, loop.batches_per_epoch, args, loop.layout, saved_args,
                          saved_batch_size, loop.identity)
    if resume.loop is not None:
        loop.load_state_dict(resume.loop)
    else:  # a transformers checkpoint: the loss since its last log is unknown; average this run's steps (HF's rule)
        loop.last_logged_step = loop.first_step = state.global_step
    if args.auto_find_batch_size and saved_batch_size and saved_batch_size < loop.layout.train_batch_size:
        # the saving run had shrunk its micro-batches after running out of memory: go on with them (transformers
        # restores its shrunk batch the same way), so the resume is exact and does not run out of memory again
        loop.micro_batch_rows = state.train_batch_size = saved_batch_size
    if state.global_step >= state.max_steps:  # nothing left to train; close the epoch if the saving run had not yet
        if resume.skip_batches and loop.batches_per_epoch:
            resume.skip_batches = loop.batches_per_epoch
        else:
            resume.epoch = state.num_train_epochs
    logger.info("resuming at step %d: epoch %d, %d batches into it (skipped in the sampler)",
                state.global_step, resume.epoch, resume.skip_batches)
    return resume


def save_model(folder: str | os.PathLike, model: torch.nn.Module, processing_class: Any, state_dict: dict | None,
               args: Any) -> None:
    """``Trainer.save_model``'s files: the weights (:func:`save_model_weights`) and ``training_args.bin``."""
    save_model_weights(model, folder, processing_class, state_dict)
    torch.save(args.to_dict(), Path(folder) / TRAINING_ARGS_NAME)


