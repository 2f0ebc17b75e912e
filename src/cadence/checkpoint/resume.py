"""Which checkpoint a run resumes, and where its data, RNGs and loop continue.

Resume (``Trainer.train(resume_from_checkpoint=...)``) and its decisions:

- Checkpoints are written only at optimizer-step ends and epoch ends, never inside an accumulation
  window; a run killed mid-window resumes from the step before it.
- The data position is ``(epoch, batches into it)``; the sampler starts after the trained batches,
  so none is read again. The RNGs are restored where the saving run was: before the epoch's events
  for a save between epochs, after the epoch's iterator exists for a save inside it. Randomness
  drawn inside dataloader *workers* is not replayed by a mid-epoch resume (the workers restart);
  the main process's draws (dropout, collators, ``num_workers=0`` datasets) are.
- A cadence checkpoint also restores the loss summed since the last log, so the resumed run logs
  and reports ``train_loss`` exactly as an unbroken run. A transformers checkpoint lacks it, so, as
  transformers does, the first log averages the steps since the resume and ``train_loss`` this
  call's steps. Logging/eval/save intervals come from this run's arguments.
- A checkpoint written by another number of processes, per-device batch size or accumulation is
  resumed as transformers allows: the position is recomputed from the samples the saving run had
  trained in its epoch (its batches x its per-device batch x its processes), rounded down to a whole
  batch of this run, with a warning that the run is no longer bit-identical to an unbroken one. Another
  dataset (its length, or a ``datasets`` fingerprint, differs from the saved one) is resumed by steps, as
  transformers resumes (epoch = global_step // this data's steps per epoch, the rest skipped), with a warning
  that the data position is approximate; ``ignore_data_skip=True`` starts the epoch from its first batch.
- The position is one for the job, the main process's: it reads what decides it (``loop_state.json``, the saving
  run's layout, whether its own data is the checkpoint's) and shares it, so every process trains as many batches and
  meets the others in the same collectives; a process whose data alone differs is warned.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from ..runtime.processes import every_process, process_group_size_and_rank
from ..checkpoint_io.folders import sorted_checkpoints
from ..checkpoint_io.formats import (OPTIMIZER_NAME, OPTIMIZER_SHARDS_NAME, SCHEDULER_NAME, STREAM_STATE_NAME,
                      TRAINER_STATE_NAME, CorruptCheckpointError, load_training_args, safe_load)
from .manifest import read_loop_state, verify_checkpoint
from .rng import checkpoint_world_size, read_rng_state, rng_state_name
from .writer import remove_incomplete

logger = logging.getLogger(__name__)


def resolve_checkpoint(resume_from_checkpoint: str | os.PathLike | bool, output_dir: str | os.PathLike,
                       among: set[str] | None = None) -> Path:
    """``True`` -> the newest complete ``checkpoint-N`` of ``output_dir`` whose files are intact; a path ->
    that folder, checked. ``among``: with ``True``, only the checkpoints of these names are candidates (those every
    process of the job holds, :func:`agreed_checkpoint`).

    A damaged newest checkpoint (a truncated or changed file, see :func:`verify_checkpoint`) is
    skipped with a warning naming the file, and the next older one is tried.

    Raises:
        ValueError: no complete checkpoint exists, or the path is not a checkpoint folder.
        CorruptCheckpointError: the given folder, or every checkpoint of ``output_dir``, is damaged.
    """
    if resume_from_checkpoint is True:
        found = sorted_checkpoints(output_dir) if os.path.isdir(output_dir) else []
        if among is not None and found:  # only what every process of the job holds on its own disk
            held = [folder for folder in found if folder.name in among]
            if not held:
                raise ValueError(
                    f"resume_from_checkpoint=True, but no checkpoint of output_dir={str(output_dir)!r} is on the disk "
                    f"of every process of the job (the main process holds {', '.join(f.name for f in found)}): each "
                    "process reads the checkpoint from its own disk; put output_dir on a filesystem every node shares, "
                    "or set save_on_each_node=True so that each node writes its own copy")
            if held[-1] != found[-1]:
                logger.warning("%s is not on the disk of every process of the job: resuming from %s, the newest "
                               "checkpoint they all hold", found[-1].name, held[-1].name)
            found = held
        if not found:
            raise ValueError(  # it starts with transformers' wording, which scripts and tests match on
                f"No valid checkpoint found in output directory ({output_dir}): "
                f"resume_from_checkpoint=True, but output_dir={str(output_dir)!r} has no complete checkpoint-N "
                f"folder (one with {TRAINER_STATE_NAME}): train without resume_from_checkpoint, or pass a checkpoint path"
            )
        errors = []
        for folder in reversed(found):
            try:
                verify_checkpoint(folder)
                return folder
            except CorruptCheckpointError as e:
                logger.warning("%s; resuming from an older checkpoint instead", e)
                errors.append(str(e))
        raise CorruptCheckpointError(
            f"resume_from_checkpoint=True, but every checkpoint in output_dir={str(output_dir)!r} is damaged: "
            + "; ".join(errors) + ". Start a new run (overwrite_output_dir=True deletes them)"
        )
    path = Path(resume_from_checkpoint)
    if not path.is_dir():
        raise ValueError(  # it starts with transformers' wording, which scripts and tests match on
            f"Can't find a valid checkpoint at {resume_from_checkpoint}: "
            f"resume_from_checkpoint={str(resume_from_checkpoint)!r} is not a folder: pass a checkpoint-N folder, "
            "or True for the newest checkpoint in output_dir"
        )
    if not (path / TRAINER_STATE_NAME).is_file():
        raise ValueError(
            f"Can't find a valid checkpoint at {resume_from_checkpoint}: "
            f"resume_from_checkpoint={str(resume_from_checkpoint)!r} is not a complete checkpoint: it has no "
            f"{TRAINER_STATE_NAME} (written last, so either its save was interrupted or it is not a checkpoint "
            "folder); pass a checkpoint-N folder, or True for the newest complete one"
        )
    try:
        verify_checkpoint(path)
    except CorruptCheckpointError as e:
        raise CorruptCheckpointError(
            f"resume_from_checkpoint={str(resume_from_checkpoint)!r}: {e}; pass an older checkpoint-N folder, or "
            "True for the newest intact one"
        ) from e
    return path


# ---------------------------------------------------------------- where to resume


@dataclass
class ResumePoint:
    """Where a resumed run continues, and what it restores when it gets there (the data side,
    ``data.epoch_batches``, starts the resumed epoch from it).

    Attributes:
        folder: the checkpoint.
        epoch: the epoch the run continues in.
        skip_batches: batches of that epoch already trained; the sampler starts after them.
        rng: the RNG states to set once that epoch's data iterator exists (``skip_batches > 0``:
            the saving run had already created it) or just before it is created (``== 0``).
        loop: cadence's ``loop_state.json`` (loss summed since the last log, ...), None for
            checkpoints written by transformers.
        stream_state: an iterable dataset's saved ``state_dict()``; when set, the stream continues
            from it and ``skip_batches`` is 0.
        trained_batches: batches of the epoch already trained, whatever skips them (``skip_batches``
            but for a stream restored from its state): what a subclass's ``get_resumed_dataloader`` is told.
    """

    folder: Path
    epoch: int
    skip_batches: int
    rng: dict | None
    loop: dict | None
    stream_state: dict | None = None
    trained_batches: int = 0


def _epoch_batches(num_samples: int, batch: int, world: int, drop_last: bool) -> int:
    """Batches of one process in an epoch (the sampler pads the epoch to equal shares)."""
    share = -(-num_samples // world)
    return share // batch if drop_last else -(-share // batch)


def _data_changed(folder: Path, loop: dict, identity: dict, expected_batches: int | None) -> str | None:
    """Whether a checkpoint was written on other data: its saved length/fingerprint (or, for checkpoints that
    predate them, its batches per epoch: ``expected_batches`` for this data in its layout) differs. Returns what
    differs (a warning's text), else None: the resume then goes on by steps, as transformers resumes
    (:func:`resume_point`, which warns)."""
    saved_n, saved_fp = loop.get("num_samples"), loop.get("fingerprint")
    n, fp = identity.get("num_samples"), identity.get("fingerprint")
    if saved_n is None and loop.get("batches_per_epoch") not in (None, expected_batches):
        saved_n = f"data giving {loop['batches_per_epoch']} batches per epoch"
    other_fp = bool(saved_fp and fp and saved_fp != fp)
    if other_fp and saved_n == n and loop.get("sample") and loop.get("sample") == identity.get("sample"):
        # datasets gives a .map() whose function it cannot hash a random fingerprint: the length and rows decide
        logger.warning("checkpoint %s was written with train_dataset fingerprint %s, this run's is %s, but the "
                       "length (%s) and a sample of the rows agree: resuming (datasets gives a .map() whose function "
                       "it cannot hash a random fingerprint)", folder, saved_fp, fp, n)
        other_fp = False
    if not ((saved_n is not None and n is not None and saved_n != n) or other_fp):
        return None
    what = f"{saved_n} samples" if isinstance(saved_n, int) else (saved_n or "the same length")
    return (f"checkpoint {folder} was trained on another train_dataset ({what}, fingerprint {saved_fp}) than this "
            f"run's ({n} samples, fingerprint {fp})")


_BY_STEPS = ("resuming by steps as transformers does (epoch = global_step // steps per epoch of this data, then the "
             "rest of the steps' batches skipped), so the data position is approximate and the run is not the one that "
             "was checkpointed; resume with the same train_dataset for an exact resume, or set ignore_data_skip=True "
             "to start the epoch from its first batch")


def _warn_data_changed(main_says: str | None, mine: str | None) -> None:
    """The warning of a resume on other data, given the main process's finding (which decides for the job) and this
    process's own (each compares its own train_dataset with the checkpoint's)."""
    if main_says is not None and mine is not None:
        logger.warning("%s: %s", mine, _BY_STEPS)
    elif main_says is not None:
        logger.warning("%s, on the main process, which decides for every process of the job (this process's "
                       "train_dataset agrees with the checkpoint's): %s", main_says, _BY_STEPS)
    elif mine is not None:
        logger.warning("%s, but the main process's agrees with the checkpoint's, and it decides for every process of "
                       "the job (processes resuming at different positions could train different numbers of batches "
                       "and wait in different collectives): resuming at the checkpoint's data position; give every "
                       "process the same train_dataset", mine)


def _position_inputs(folder: Path, batches_per_epoch: int | None, args: Any, layout: Any, saved_args: dict,
                     saved_batch_size: int | None, identity: dict) -> tuple:
    """What a resume's data position follows from, read on the main process (:func:`resume_point` shares it):
    ``loop_state.json``, the saving run's ``BatchLayout`` (from it, else from the checkpoint's arguments and files),
    whether this process's data differs from the checkpoint's (:func:`_data_changed`) and a stream's saved state."""
    loop = read_loop_state(folder)  # each field checked: damage is a CorruptCheckpointError naming it
    saved = dataclasses.replace(  # a BatchLayout (loop_state.py) like ``layout``
        layout,
        train_batch_size=(loop or {}).get("train_batch_size") or saved_args.get("per_device_train_batch_size")
        or saved_batch_size or layout.train_batch_size,
        gradient_accumulation_steps=(loop or {}).get("gradient_accumulation_steps")
        or saved_args.get("gradient_accumulation_steps") or layout.gradient_accumulation_steps,
        world_size=(loop or {}).get("world_size") or checkpoint_world_size(folder) or layout.world_size)
    changed = _compared(folder, loop, identity, _saved_epoch_batches(batches_per_epoch, identity, saved, layout, args),
                        args)
    stream = folder / STREAM_STATE_NAME
    read_stream = batches_per_epoch is None and not args.ignore_data_skip and stream.exists()
    stream_state = safe_load(stream) if read_stream else None
    return loop, saved, changed, stream_state


def _saved_epoch_batches(batches_per_epoch: int | None, identity: dict, saved: Any, layout: Any,
                         args: Any) -> int | None:
    """This data's batches per epoch in the saving run's layout ``saved``."""
    if saved == layout or batches_per_epoch is None or identity.get("num_samples") is None:
        return batches_per_epoch
    return _epoch_batches(identity["num_samples"], saved.train_batch_size, saved.world_size, args.dataloader_drop_last)


def _compared(folder: Path, loop: dict | None, identity: dict, saved_epoch_batches: int | None,
              args: Any) -> str | None:
    """What differs between this process's data and the checkpoint's (:func:`_data_changed`); None where nothing
    does, or nothing is compared (a transformers checkpoint, ``ignore_data_skip``)."""
    if loop is None or args.ignore_data_skip:
        return None
    return _data_changed(folder, loop, identity, saved_epoch_batches)


def resume_point(folder: Path, global_step: int, batches_per_epoch: int | None, args: Any, layout: Any,
                 saved_args: dict | None = None, saved_batch_size: int | None = None,
                 identity: dict | None = None) -> ResumePoint:
    """Read the position, RNG and loop state of ``folder`` for this process, checking they fit this run.

    Args:
        folder: the checkpoint folder.
        global_step: ``trainer_state.json``'s step.
        batches_per_epoch: micro-batches in one epoch of this run (None for an iterable dataset).
        args: this run's ``TrainingArguments``.
        layout: this run's ``BatchLayout`` (``loop_state.py``).
        saved_args: the checkpoint's arguments (:func:`load_training_args`), when readable.
        saved_batch_size: ``trainer_state.json``'s ``train_batch_size`` (all a transformers checkpoint says).
        identity: this run's data identity (``loop_state.data_identity``).

    A checkpoint written with another per-device batch, accumulation or number of processes
    continues after the samples that run trained (logged as a warning: not bit-identical); one written on another
    dataset continues by steps, as transformers does (warned: the data position is approximate).
    """
    saved_args, identity = saved_args or {}, identity or {}
    # One position for the job: it sets how many batches each process trains, hence its collectives. The main
    # process reads what decides it (the checkpoint's loop state and layout from its disk, whether its own data is the
    # checkpoint's, a stream's state) and every process gets it; the others compare their own data only to warn.
    main, found = (process_group_size_and_rank() or (1, 0))[1] == 0, None
    if main:
        try:
            found = _position_inputs(folder, batches_per_epoch, args, layout, saved_args, saved_batch_size, identity)
        except Exception as error:  # noqa: BLE001 - every process raises it (a damaged loop_state.json), not one alone
            found = error
    found = every_process(found)[0]
    if isinstance(found, BaseException):
        raise found
    loop, saved, main_says, stream_state = found
    saved_epoch_batches = _saved_epoch_batches(batches_per_epoch, identity, saved, layout, args)
    mine = main_says if main else _compared(folder, loop, identity, saved_epoch_batches, args)
    _warn_data_changed(main_says, mine)
    other_data = main_says is not None
    world = layout.world_size
    if loop is not None and not args.ignore_data_skip and not other_data:
        epoch, skip = loop["epoch"], loop["batches_in_epoch"]
    elif batches_per_epoch is None:  # a stream: its trained batches cannot be skipped, only read again
        epoch, skip = 0, 0 if args.ignore_data_skip else global_step * saved.gradient_accumulation_steps
    elif other_data:  # transformers' rule in this run's layout: the saved position is of other data
        steps_per_epoch = layout.steps_per_epoch(batches_per_epoch)
        epoch = global_step // steps_per_epoch
        skip = (global_step % steps_per_epoch) * layout.gradient_accumulation_steps
        saved = layout  # nothing to rescale: the position is already in this run's batches
    else:  # transformers' rule: whole optimizer steps of ga batches into the epoch (of the saving run's layout)
        steps_per_epoch = saved.steps_per_epoch(saved_epoch_batches)
        epoch = global_step // steps_per_epoch
        skip = 0 if args.ignore_data_skip else (global_step % steps_per_epoch) * saved.gradient_accumulation_steps
    if saved != layout:
        skip = _rescale_position(folder, skip, saved, layout, args, epoch, saved_epoch_batches, batches_per_epoch)
    trained = skip
    if batches_per_epoch is None and skip and stream_state is not None:
        skip = 0  # the stream knows its own position
    else:
        stream_state = None
    rng_file = folder / rng_state_name(args.process_index, args.world_size)
    same_world = saved.world_size == world  # another count: another process's RNG is not ours
    rng = read_rng_state(folder, rng_file.name) if rng_file.exists() and same_world else None
    if rng is None and not same_world:
        logger.warning("checkpoint %s was written by %d process(es), this run has %d: the RNG states "
                       "(dropout) are not restored", folder, saved.world_size, world)
    elif rng is None:
        logger.warning("checkpoint %s has no %s: the RNGs are not restored, so the resumed run is not exact", folder, rng_file.name)
    return ResumePoint(folder=folder, epoch=epoch, skip_batches=skip, rng=rng, loop=loop, stream_state=stream_state,
                       trained_batches=trained)


def _rescale_position(folder: Path, skip: int, saved: Any, layout: Any, args: Any, epoch: int,
                      saved_epoch_batches: int | None, batches_per_epoch: int | None) -> int:
    """The saving run's ``skip`` batches of the epoch as batches of this run: the samples they held
    (the sampler deals the epoch's order out to processes in turn, so ``skip x batch x processes``
    samples lead it), divided by this run's batch x processes and rounded down. Warns."""
    batch, world = layout.train_batch_size, layout.world_size
    seen = skip * saved.train_batch_size * saved.world_size  # samples of the epoch's order already trained, all processes together
    if batches_per_epoch is not None and saved_epoch_batches is not None and skip >= saved_epoch_batches:
        new_skip, again = batches_per_epoch, 0  # the saving run had trained its whole epoch
    else:
        new_skip = seen // (batch * world)
        again = seen - new_skip * batch * world
        if batches_per_epoch is not None:
            new_skip = min(new_skip, batches_per_epoch)
    logger.warning(
        "checkpoint %s was written with per-device batch %d x accumulation %d x %d process(es) and this run has "
        "%d x %d x %d: the data position is recomputed from the %d samples of epoch %d already trained (%d batches "
        "of this run%s%s). The run continues where that one stopped but is no longer bit-identical to an unbroken one; "
        "global_step goes on counting this run's optimizer steps (as in transformers), so set max_steps to choose how many "
        "more to train",
        folder, *dataclasses.astuple(saved), *dataclasses.astuple(layout), seen, epoch, new_skip,
        f"; the last {again} samples are trained again, as they do not fill a batch here" if again else "",
        "; group_by_length orders the epoch by the global batch, so its order differs too"
        if getattr(args, "train_sampling_strategy", None) == "group_by_length" else "",
    )
    return new_skip


def load_optimizer_and_scheduler(folder: Path, optimizer: Any, lr_scheduler: Any,
                                 load_optimizer: Callable[[Path], None] | None = None,
                                 run_optim: str | None = None) -> None:
    """Load ``optimizer.pt`` and ``scheduler.pt`` (``weights_only``) into the run's objects.

    Raises ``ValueError`` when the checkpoint's optimizer is another than the run's (``run_optim``: its ``optim``,
    for the message): its state lacks keys the run's optimizer reads.

    ``load_optimizer(folder)`` (the backend's, e.g. for FSDP shards in ``optimizer_0/``) replaces the plain load.
    """
    missing = [name for name in (OPTIMIZER_NAME, SCHEDULER_NAME) if not (folder / name).exists()]
    if OPTIMIZER_NAME in missing and ((folder / OPTIMIZER_SHARDS_NAME).is_dir() or (folder / "latest").exists()):
        missing.remove(OPTIMIZER_NAME)  # FSDP's sharded optimizer state, or DeepSpeed's checkpoint
    if len(missing) == 2:
        raise ValueError(
            f"checkpoint {folder} has no {' / '.join(missing)} (written with save_only_model=True?): it holds weights "
            "only and cannot resume training; load its weights into the model and start a new run instead"
        )
    if missing:  # the other one is there: not a weights-only save, but a file deleted since
        present = SCHEDULER_NAME if missing[0] == OPTIMIZER_NAME else "the optimizer's state"
        raise CorruptCheckpointError(
            f"checkpoint {folder} is damaged: {missing[0]} is missing, though {present} is there (so it was not "
            "written with save_only_model=True: the file was deleted or moved since); resume from another checkpoint"
        )
    needed = _optimizer_structure(optimizer)  # before the load replaces it with the checkpoint's
    if load_optimizer is not None:
        load_optimizer(folder)
    else:
        optimizer.load_state_dict(safe_load(folder / OPTIMIZER_NAME))
    _check_same_optimizer(folder, optimizer, needed, run_optim)
    lr_scheduler.load_state_dict(safe_load(folder / SCHEDULER_NAME))


def _optimizer_structure(optimizer: Any) -> tuple[list[set], dict[int, set]]:
    """The keys ``optimizer`` reads: those of each param group, and of each parameter's state it already has
    (most optimizers create it at their first step; Adagrad at construction)."""
    groups = [set(group) for group in getattr(optimizer, "param_groups", [])]
    state = getattr(optimizer, "state", {})
    params = [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]
    return groups, {i: set(state[p]) for i, p in enumerate(params) if p in state and isinstance(state[p], Mapping)}


def _check_same_optimizer(folder: Path, optimizer: Any, needed: tuple[list[set], dict[int, set]],
                          run_optim: str | None) -> None:
    """A checkpoint of another optimizer (AdamW's state resumed with optim='sgd') loads without a complaint from
    torch, which takes the saved param groups as they are, and fails at the first step on a key only this run's
    optimizer has (KeyError: 'momentum'): refused now, naming both. Only keys this run's optimizer reads count,
    so a checkpoint of transformers (which does not record the optimizer) with a compatible optimizer resumes."""
    group_keys, state_keys = needed
    loaded_groups, loaded_state = _optimizer_structure(optimizer)
    missing = sorted({k for need, got in zip(group_keys, loaded_groups) for k in need - got}
                     | {k for i, need in state_keys.items() for k in need - loaded_state.get(i, set())})
    if not missing:
        return
    saved_args = None
    try:
        saved_args = load_training_args(folder)
    except Exception:  # noqa: BLE001 - only for the message: the optimizer's keys name it as well
        pass
    saved_optim = (saved_args or {}).get("optim")
    theirs = sorted(set().union(*loaded_groups) - set().union(*group_keys)) if loaded_groups else []
    written = f"optim={saved_optim!r}" if saved_optim else "an optimizer this run does not know (its optim is not recorded)"
    ours = type(optimizer).__name__ + (f" (optim={run_optim!r})" if run_optim else "")
    raise ValueError(
        f"checkpoint {folder} holds the state of another optimizer: it was written with {written}, whose param "
        f"groups have {theirs}, and this run's optimizer is {ours}, which needs {missing}: the first resumed step "
        f"would fail. Resume with the checkpoint's optimizer{f' (optim={saved_optim!r})' if saved_optim else ''}, "
        "or start a new run from its weights (model.from_pretrained(checkpoint), without resume_from_checkpoint)"
    )


def restore_callback_states(handler: Any, control: Any, states: dict) -> tuple[Any, list[str]]:
    """Rebuild stateful callbacks (and ``TrainerControl``) from ``state.stateful_callbacks``, as transformers does.

    Each callback whose class name has a saved state is rebuilt from it (several of a class are matched in order):
    the saved ``args`` passed to its constructor, then the saved ``attributes`` set on it, either of them allowed
    to be absent (a user's ``state()`` may return ``args`` only). The rebuilt callbacks leave their places and join
    the end of the list in the checkpoint's order, where transformers adds them back, so the callbacks run in
    transformers' order after a resume. Returns the control to use and the names of saved callbacks this run does
    not have (the Trainer warns about those).
    """
    callbacks = list(handler.callbacks)
    rebuilt, replaced, unmatched = [], set(), []
    for name, saved in states.items():
        saved = saved if isinstance(saved, list) else [saved]
        if type(control).__name__ == name:
            control = _rebuild(type(control), saved[0])
            continue
        matches = [cb for cb in callbacks if type(cb).__name__ == name]
        if not matches:
            unmatched.append(name)
        for callback, state in zip(matches, saved):
            replaced.add(id(callback))
            rebuilt.append(_rebuild(type(callback), state))
    handler.callbacks = [cb for cb in callbacks if id(cb) not in replaced] + rebuilt
    return control, unmatched


def _rebuild(cls: type, state: dict) -> Any:
    """``cls`` built from one saved ``{"args": ..., "attributes": ...}`` (a missing part counts as empty)."""
    instance = cls(**state.get("args", {}))
    for name, value in state.get("attributes", {}).items():
        setattr(instance, name, value)
    return instance


def find_resume_folder(resume_from_checkpoint: str | os.PathLike | bool, args: Any, barrier: Callable[[], None]) -> Path:
    """The checkpoint ``train(resume_from_checkpoint=...)`` continues from (:func:`resolve_checkpoint`), after
    the main process removed what killed saves left in ``output_dir`` (never chosen); every process calls it, and
    every process gets the main process's choice among the checkpoints they all hold (:func:`agreed_checkpoint`)."""
    if args.should_save and os.path.isdir(args.output_dir):
        remove_incomplete(args.output_dir)
    barrier()  # so every process sees the same checkpoints
    named = None if resume_from_checkpoint is True else resume_from_checkpoint
    return agreed_checkpoint(lambda among: resolve_checkpoint(resume_from_checkpoint, args.output_dir, among),
                             args.output_dir, named)


def agreed_checkpoint(choose: Callable[[set[str] | None], Path | None], output_dir: str | os.PathLike,
                      named: str | os.PathLike | None = None) -> Path | None:
    """One checkpoint for the whole job, whatever each machine's disk holds: every process lists the complete
    checkpoints of ``output_dir`` on its own disk (and whether it holds ``named``, a folder the user passed), the
    main process calls ``choose(names every process holds)`` (``None`` on one process), and every process gets its
    answer, or raises its error. A choice taken on each process from its own disk could differ between machines
    (a checkpoint written on one node's disk only), and the processes would then load different states or wait in
    different collectives; a ``named`` folder missing on some process is an error on every process, naming them.
    The first process of each other machine then checks its own copy of the answer (:func:`verify_checkpoint`, as
    the main process checked its own): a copy damaged there is skipped for an older checkpoint every process holds,
    or, for a ``named`` folder, an error on every process naming it. Collectives when a process group is started:
    every process calls it.

    Returns:
        ``choose``'s folder (the same on every process).
    """
    held = sorted_checkpoints(output_dir) if os.path.isdir(output_dir) else []
    mine = {"host": socket.gethostname(), "names": [folder.name for folder in held]}
    if named is not None:
        mine["named"] = (Path(named) / TRAINER_STATE_NAME).is_file()
    every = every_process(mine)
    if len(every) == 1:
        return choose(None)
    rank = process_group_size_and_rank()[1]
    common, damaged = set.intersection(*(set(theirs["names"]) for theirs in every)), []
    while True:
        answer = None
        if rank == 0:
            try:
                answer = _main_choice(choose, common, every, mine, named, output_dir)
            except Exception as error:  # noqa: BLE001 - every process raises it, not the main one alone
                answer = error
                if damaged and isinstance(error, ValueError):  # what was refused for damage elsewhere, named too
                    answer = type(error)(f"{error}; damaged on another machine's disk: {'; '.join(damaged)}")
        answer = every_process(answer)[0]
        if isinstance(answer, BaseException):
            raise answer
        folder = answer[0](Path(output_dir) / answer[1]) if isinstance(answer, tuple) else answer
        # the main process checked its own copy while choosing; the first process of each other machine checks its
        # own (one read a machine), so a copy damaged on one node's disk alone is seen by every process at once
        harm = None
        if folder is not None and rank != 0 and os.environ.get("LOCAL_RANK", "0") == "0":
            try:
                verify_checkpoint(folder)
            except CorruptCheckpointError as error:
                harm = f"process {rank} on {mine['host']}: {error}"
        harm = [said for said in every_process(harm) if said is not None]
        if not harm:
            return folder
        if named is not None or not isinstance(answer, tuple) or answer[1] not in common:  # the user's folder
            raise CorruptCheckpointError(f"resume_from_checkpoint={str(folder)!r} is damaged on the disk of "
                                         f"{'; '.join(harm)}; pass a checkpoint every process holds intact")
        logger.warning("%s is damaged on the disk of %s; trying an older checkpoint every process holds",
                       answer[1], "; ".join(harm))
        damaged += harm
        common.discard(answer[1])


def _main_choice(choose: Callable[[set[str] | None], Path | None], common: set[str], every: list, mine: dict,
                 named: str | os.PathLike | None, output_dir: str | os.PathLike) -> Any:
    """The main process's answer in :func:`agreed_checkpoint`: ``choose(common)``, as ``(type, name)`` when it is a
    folder of ``output_dir`` (each process then takes its own disk's ``output_dir/name``)."""
    lacking = [f"process {rank} on {theirs['host']}" for rank, theirs in enumerate(every)
               if not theirs.get("named", True)]
    if lacking and mine.get("named"):
        raise ValueError(
            f"resume_from_checkpoint={str(named)!r} is not a complete checkpoint on the disk of "
            f"{', '.join(lacking)} (the main process holds it): each process reads the checkpoint from its own "
            "disk; pass a folder every node sees (a shared filesystem), or copy it to each node")
    answer = choose(common)
    if answer is not None and Path(answer).parent.resolve() == Path(output_dir).resolve():
        return type(answer), Path(answer).name  # each process's own output_dir/name (its own disk)
    return answer
