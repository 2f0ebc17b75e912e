"""Writing a checkpoint folder atomically: staging, manifest, fsync, rename; cleaning up after killed saves; rotation.

A checkpoint is written into ``tmp-checkpoint-N/``, every file flushed and fsynced, and only then
renamed to ``checkpoint-N/``: a folder with that name is always complete (``get_last_checkpoint``
also requires ``trainer_state.json``, written last). Rotation keeps the newest checkpoints and the
best one, and never deletes the one just written.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Callable

import torch

from ..trainer_utils import CHECKPOINT_DIR_RE, DELETING_PREFIX, delete_oldest, sorted_checkpoints
from .manifest import write_manifest
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
        write_manifest(tmp)
        _fsync_tree(tmp)
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
    """On any error inside: the staging folder of ``final`` is removed, and an ``OSError``/``RuntimeError`` (torch.save
    reports a full disk as one) becomes the ``OSError`` of :func:`_write_error`, naming the folder and the file."""
    try:
        yield
    except BaseException as e:
        tmp = staging_folder(final)
        error = _write_error(final, tmp, e) if isinstance(e, (OSError, RuntimeError)) else None
        shutil.rmtree(tmp, ignore_errors=True)
        if error is not None:
            raise error from e
        raise


def _write_error(final: Path, tmp: Path, error: BaseException) -> OSError:
    """An ``OSError`` naming the checkpoint, the file being written (the newest in the staging folder),
    the cause, the size a checkpoint takes and the free space (read before the staging folder goes)."""
    cause = getattr(error, "strerror", None) or str(error).splitlines()[0]
    files = [p for p in tmp.rglob("*") if p.is_file()] if tmp.is_dir() else []
    culprit = getattr(error, "filename", None)
    if culprit is None and files:
        culprit = max(files, key=lambda p: p.stat().st_mtime_ns)  # the one being written when it failed
    culprit = Path(culprit).name if culprit is not None else "its first file"
    written = sum(p.stat().st_size for p in files)
    try:
        previous = sorted_checkpoints(final.parent)
        free = shutil.disk_usage(final.parent).free
    except OSError:
        previous, free = [], None
    if previous:
        needed = sum(p.stat().st_size for p in previous[-1].rglob("*") if p.is_file())
        size = f"a checkpoint here takes about {_human_bytes(needed)} (the size of {previous[-1].name})"
    else:
        needed = written
        size = f"a checkpoint here takes more than the {_human_bytes(written)} written before the failure"
    code = getattr(error, "errno", None)
    if code is None and free is not None and free < needed:  # torch.save hides the errno of a full disk
        code, cause = errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}; torch said: {cause}"
    room = f" and {_human_bytes(free)} is free there" if free is not None else ""
    message = (
        f"could not write checkpoint {final}: writing {culprit} failed ({cause}); {size}{room}. Nothing of this "
        "checkpoint was kept and older checkpoints are intact. Free disk space or lower save_total_limit: "
        "save_total_limit=N needs room for N+1 checkpoints (the oldest is deleted only after the new one is complete)"
    )
    return OSError(code, message) if code is not None else OSError(message)


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
        tmp.mkdir(parents=True)
    except OSError as e:
        raise _write_error(Path(final), tmp, e) from e
    return tmp


def save_rng_state(final: str | os.PathLike, process_index: int, world_size: int) -> None:
    """This process's RNG states into the staging folder of ``final`` (``rng_state[_{rank}].pth``)."""
    tmp = staging_folder(final)
    with staging_removed_on_error(Path(final)):
        tmp.mkdir(parents=True, exist_ok=True)  # a node that does not share the main process's disk
        torch.save(capture_rng_state(world_size), tmp / rng_state_name(process_index, world_size))


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_incomplete(output_dir: str | os.PathLike) -> list[Path]:
    """Delete ``tmp-checkpoint-*`` folders a killed save left behind and ``deleting-checkpoint-*`` ones a killed
    rotation left; put back an ``old-checkpoint-N`` whose replacement was interrupted. Returns the deleted folders."""
    output_dir = Path(output_dir)
    deleted = []
    for old in output_dir.glob("old-checkpoint-*"):
        final = output_dir / old.name[len("old-"):]
        if CHECKPOINT_DIR_RE.match(final.name) and not final.exists():
            os.replace(old, final)
        else:
            shutil.rmtree(old, ignore_errors=True)
            deleted.append(old)
    for doomed in output_dir.glob(DELETING_PREFIX + "checkpoint-*"):  # a rotation killed mid-delete
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(doomed)
    for tmp in output_dir.glob("tmp-checkpoint-*"):
        if CHECKPOINT_DIR_RE.match(tmp.name[len("tmp-"):]) and tmp.is_dir():
            logger.info("removing incomplete checkpoint %s (a save was interrupted)", tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            deleted.append(tmp)
    return deleted


def rotate_checkpoints(output_dir: str | os.PathLike, limit: int | None, best: str | None, just_written: Path,
                       earlier: set[Path] = frozenset()) -> list[Path]:
    """Delete the oldest checkpoints beyond ``limit``, never the best one nor the one just written; the
    ``earlier`` run's checkpoints (``output_guard.earlier_checkpoints``) neither count nor go.

    Returns the deleted folders.
    """
    if limit is None or limit <= 0:  # transformers: None or <= 0 keeps every checkpoint
        return []
    earlier = {Path(p).resolve() for p in earlier}
    own = [c for c in sorted_checkpoints(output_dir) if c.resolve() not in earlier]
    return delete_oldest(own, limit, {just_written, best})


