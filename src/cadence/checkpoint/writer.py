"""Writing a checkpoint folder atomically: staging, manifest, fsync, rename; cleaning up after killed saves.

A checkpoint is written into ``tmp-checkpoint-N/``, every file flushed and fsynced, and only then
renamed to ``checkpoint-N/``: a folder with that name is always complete (``get_last_checkpoint``
also requires ``trainer_state.json``, written last; while a Trainer subclass's ``_save`` writes, ``checkpoint-N``
is a link to the staging folder, which has none). Rotation is ``checkpoint_io.folders.rotate_checkpoints``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Callable

import torch

from ..checkpoint_io.folders import CHECKPOINT_DIR_RE, DELETING_PREFIX, remove_folder, sorted_checkpoints
from ..checkpoint_io.formats import writing
from .manifest import MANIFEST_NAME, write_manifest
from .rng import capture_rng_state, rng_state_name

logger = logging.getLogger(__name__)

def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staging_folder(final: str | os.PathLike) -> Path:
    """Where ``final`` is written before it is renamed into place (never chosen for resume)."""
    final = Path(final)
    return final.parent / f"tmp-{final.name}"


@contextlib.contextmanager
def final_name(final: str | os.PathLike):
    """Inside: ``final`` (``checkpoint-N``) is a link to its staging folder, so a Trainer subclass's ``_save`` is
    given the folder's final name, as transformers gives it, and what it writes lands in the staging folder; the
    link goes on leaving. The name is complete only once renamed (``get_last_checkpoint`` and resume never take the
    link: its folder has no ``trainer_state.json`` yet; a kill inside leaves a link that :func:`remove_incomplete`
    deletes). Yields the path to write to: ``final``, or the staging folder where no link can be made (``final``
    exists: the same step saved again; a filesystem without links).
    """
    final, tmp = Path(final), staging_folder(final)
    try:
        os.symlink(tmp.name, final, target_is_directory=True)  # relative: the pair moves together
    except OSError:
        yield tmp
        return
    try:
        yield final
    finally:
        _unlink_staging_link(final)


def _unlink_staging_link(link: Path) -> None:
    """Delete ``link`` if it is :func:`final_name`'s link to its own staging folder (never a user's link)."""
    with contextlib.suppress(OSError):
        if link.is_symlink() and os.readlink(link) == staging_folder(link).name:
            link.unlink()


def write_atomically(final: str | os.PathLike, write: Callable[[Path], None], fresh: bool = True) -> Path:
    """Run ``write(tmp_folder)``, add the checksum manifest, fsync, then rename the folder to ``final``.

    Args:
        final: the checkpoint folder to create (replaced if it exists, never left missing).
        write: writes the files into the folder it is given.
        fresh: start from an empty staging folder; False keeps files other processes put there.

    On any error the temporary folder is removed, older checkpoints are untouched, and an
    ``OSError`` names the folder, the file being written, the cause (disk full, permission
    denied, ...) and, for a full disk, the space a checkpoint needs and the space free.
    """
    final = Path(final)
    tmp = staging_folder(final)
    with staging_removed_on_error(final):
        if fresh:
            shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=not fresh)
        write(tmp)
        with writing(f"writing {MANIFEST_NAME}"):
            write_manifest(tmp)
        with writing("flushing the files to disk (fsync)"):
            _fsync_tree(tmp)
        with writing(f"renaming {tmp.name} to {final.name}"):
            if final.exists():  # saving the same step twice: swap, so a complete folder always exists
                old = final.parent / f"old-{final.name}"
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, final)
            _fsync_dir(final.parent)  # the rename itself survives a power cut
    return final


@contextlib.contextmanager
def staging_removed_on_error(final: Path):
    """On any error inside: the staging folder of ``final`` is removed, and the error (an ``OSError``, torch.save's
    ``RuntimeError`` for a full disk, safetensors' ``SafetensorError``, anything else) becomes the ``OSError`` of
    :func:`_write_error`, naming the folder, the file and what happened. Interrupts (Ctrl-C) pass as they are."""
    try:
        yield
    except BaseException as e:
        tmp = staging_folder(final)
        named = isinstance(e, Exception) and not getattr(e, "checkpoint_named", False)
        error = _write_error(final, tmp, e) if named else None
        shutil.rmtree(tmp, ignore_errors=True)
        if error is not None:
            raise _left_behind(error, tmp) from e
        raise


def _left_behind(error: OSError, tmp: Path) -> OSError:
    """``error``, saying so when the staging folder ``tmp`` could not be removed (a read-only disk): its message
    would otherwise claim nothing of the checkpoint was kept while ``tmp-checkpoint-N`` is still there."""
    if not os.path.lexists(tmp):
        return error
    said = str(error.args[-1]) if error.args else str(error)
    left = (f"its staging folder {tmp} could not be deleted and is still there (incomplete: it is never resumed, "
            "and the next checkpoint saved or resumed in this output_dir removes it; delete it by hand once the disk "
            "is writable)")
    for phrase in ("nothing of this checkpoint was kept", "Nothing of this checkpoint was kept"):
        said = said.replace(phrase, left[0].upper() + left[1:] if phrase[0] == "N" else left)
    if left not in said and left[0].upper() + left[1:] not in said:
        said += f". {left[0].upper() + left[1:]}"
    return _named(error.errno, said)


_SPACE_ERRNOS = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}  # no room, file too large, quota
_DENIED_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}
_RUST_IO_ERROR = re.compile(r"I/O error: (.+?) \(os error (\d+)\)")  # how safetensors reports an OS error


def _write_error(final: Path, tmp: Path, error: BaseException) -> OSError:
    """An ``OSError`` naming the checkpoint, what was being written (``formats.writing``'s label, else the newest
    file in the staging folder), the cause, and what happened: a full disk (with the size a checkpoint takes and
    the free space, read before the staging folder goes), ``output_dir`` or the staging folder deleted, permissions
    taken away, or another error."""
    output_dir = final.parent
    code = error.errno if isinstance(error, OSError) else None
    first_line = (str(error).splitlines() or [""])[0]
    if isinstance(error, OSError):
        cause = error.strerror or first_line or type(error).__name__
    elif isinstance(error, RuntimeError) and type(error).__module__ == "builtins":  # torch.save: its own words
        cause = first_line or type(error).__name__
    else:
        cause = f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__
    rust = _RUST_IO_ERROR.search(str(error))
    if code is None and rust:  # SafetensorError: the OS error inside its message
        cause, code = rust.group(1), int(rust.group(2))
    files = [p for p in tmp.rglob("*") if p.is_file()] if tmp.is_dir() else []
    doing = getattr(error, "checkpoint_step", None)
    if doing is None:
        culprit = getattr(error, "filename", None)
        if culprit is None and files:
            culprit = max(files, key=lambda p: p.stat().st_mtime_ns)  # the one being written when it failed
        doing = f"writing {Path(culprit).name if culprit is not None else 'its first file'}"
    written = sum(p.stat().st_size for p in files)
    try:
        previous = sorted_checkpoints(output_dir)
        free = shutil.disk_usage(output_dir).free
    except OSError:  # output_dir is gone (said below) or cannot be read
        previous, free = [], None
    needed = sum(p.stat().st_size for p in previous[-1].rglob("*") if p.is_file()) if previous else written
    hidden = code is None and isinstance(error, RuntimeError) and type(error).__module__ == "builtins"
    if hidden and free is not None and free < needed:  # torch.save hides the errno of a full disk
        code, cause = errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}; torch said: {cause}"
    head = f"could not write checkpoint {final}: {doing} failed ({cause})"
    if not output_dir.is_dir():  # deleted under the run: no disk advice, nothing is left to be intact
        return _named(code, f"{head}. output_dir {output_dir} was deleted while the checkpoint was written (by "
                      "another process or by hand), with the checkpoints in it. Leave output_dir in place while a run "
                      "writes into it, and train again")
    if code == errno.ENOENT and not tmp.is_dir():
        return _named(code, f"{head}. Its staging folder {tmp} was deleted while the checkpoint was written (by "
                      "another process or by hand); nothing of this checkpoint was kept and older checkpoints are "
                      "intact. Leave output_dir's folders alone while a run writes into it, and resume with "
                      "resume_from_checkpoint=True")
    if code in _DENIED_ERRNOS:
        return _named(code, f"{head}. output_dir {output_dir} cannot be written any more (its permissions or its "
                      "mount changed during the run); nothing of this checkpoint was kept and older checkpoints are "
                      f"intact. Restore the permissions of {output_dir} (or mount it writable again) and resume with "
                      "resume_from_checkpoint=True")
    if previous:
        size = f"a checkpoint here takes about {_human_bytes(needed)} (the size of {previous[-1].name})"
    else:
        size = f"a checkpoint here takes more than the {_human_bytes(written)} written before the failure"
    room = f" and {_human_bytes(free)} is free there" if free is not None else ""
    space = ("Free disk space or lower save_total_limit: save_total_limit=N needs room for N+1 checkpoints (the "
             "oldest is deleted only after the new one is complete)")
    if code in _SPACE_ERRNOS:
        advice = space
    elif hidden:  # torch.save's "enforce fail ... unexpected pos": a failed write whose OS error it does not give
        advice = ("torch.save does not say why the write failed; a full disk, a quota or a file-size limit "
                  f"(ulimit -f) are the usual causes. {space}")
    else:
        advice = "Fix the cause above and resume with resume_from_checkpoint=True"
    return _named(code, f"{head}; {size}{room}. Nothing of this checkpoint was kept and older checkpoints are "
                  f"intact. {advice}")


def _named(code: int | None, message: str) -> OSError:
    error = OSError(code, message) if code is not None else OSError(message)
    error.checkpoint_named = True  # an enclosing staging_removed_on_error passes it on as it is
    return error


def _human_bytes(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def prepare_staging(final: str | os.PathLike) -> Path:
    """An empty staging folder for ``final`` (the main process, before the others put files in it)."""
    tmp = staging_folder(final)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        with writing(f"creating {tmp.name}"):
            tmp.mkdir(parents=True)
    except OSError as e:
        raise _write_error(Path(final), tmp, e) from e
    return tmp


def save_rng_state(final: str | os.PathLike, process_index: int, world_size: int, look_ahead: dict | None = None) -> None:
    """This process's RNG states into the staging folder of ``final`` (``rng_state[_{rank}].pth``); ``look_ahead``:
    the states the training dataloader's pending batch was drawn from, kept under ``"look_ahead"`` (transformers
    reads the other keys only)."""
    tmp = staging_folder(final)
    with staging_removed_on_error(Path(final)):
        tmp.mkdir(parents=True, exist_ok=True)  # a node that does not share the main process's disk
        name = rng_state_name(process_index, world_size)
        with writing(f"writing {name}"):
            state = capture_rng_state(world_size)
            if look_ahead is not None:
                state["look_ahead"] = look_ahead
            torch.save(state, tmp / name)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_incomplete(output_dir: str | os.PathLike) -> list[Path]:
    """Delete ``tmp-checkpoint-*`` folders a killed save left behind (and the ``checkpoint-N`` link to one that
    :func:`final_name` made) and ``deleting-checkpoint-*`` ones a killed rotation left; put back an
    ``old-checkpoint-N`` whose replacement was interrupted. Returns the deleted folders."""
    output_dir = Path(output_dir)
    deleted = []
    for old in output_dir.glob("old-checkpoint-*"):
        final = output_dir / old.name[len("old-"):]
        if CHECKPOINT_DIR_RE.match(final.name) and not final.exists():
            os.replace(old, final)
        else:
            remove_folder(old)
            deleted.append(old)
    for doomed in output_dir.glob(DELETING_PREFIX + "checkpoint-*"):  # a rotation killed mid-delete
        remove_folder(doomed)
        deleted.append(doomed)
    for link in output_dir.glob("checkpoint-*"):  # a save killed while a subclass's _save wrote through its link
        if link.is_symlink() and os.readlink(link) == staging_folder(link).name:
            _unlink_staging_link(link)
            deleted.append(link)
    for tmp in output_dir.glob("tmp-checkpoint-*"):
        if CHECKPOINT_DIR_RE.match(tmp.name[len("tmp-"):]) and (tmp.is_dir() or tmp.is_symlink()):
            logger.info("removing incomplete checkpoint %s (a save was interrupted)", tmp)
            remove_folder(tmp)
            deleted.append(tmp)
    return deleted
