"""The checkpoint folders of an ``output_dir``: their names (``checkpoint-N``), which are complete, the newest, and
rotation (deleting the oldest beyond ``save_total_limit``, renamed first so a kill never leaves half a checkpoint).

transformers exposes ``PREFIX_CHECKPOINT_DIR``, ``get_last_checkpoint``, ``sort_checkpoints`` and
``rotate_checkpoints`` from ``trainer_utils``; ``cadence.trainer_utils`` re-exports them from here. A checkpoint is
complete once it holds ``trainer_state.json``: the writer renames a staging folder into place only when it is whole,
and writes that file last.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from .formats import TRAINER_STATE_NAME

logger = logging.getLogger(__name__)


PREFIX_CHECKPOINT_DIR = "checkpoint"
# Anchored at both ends: "tmp-checkpoint-7" (a checkpoint being written) must never match.
CHECKPOINT_DIR_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def get_last_checkpoint(folder: str | os.PathLike) -> str | None:
    """The newest complete `checkpoint-N` folder inside `folder` (highest N), or None.

    Args:
        folder: the training output directory (it must exist).

    Returns:
        `os.path.join(folder, "checkpoint-N")`, or None when no complete checkpoint exists.

    Example:
        >>> get_last_checkpoint("out")  # doctest: +SKIP
        'out/checkpoint-1500'
    """
    found = sorted_checkpoints(folder)
    return os.path.join(folder, found[-1].name) if found else None


def sorted_checkpoints(folder: str | os.PathLike) -> list[Path]:
    """The complete ``checkpoint-N`` folders inside ``folder``, lowest N first.

    Raises:
        FileNotFoundError: when ``folder`` does not exist.
    """
    steps = {}
    for name in os.listdir(folder):
        match = CHECKPOINT_DIR_RE.match(name)
        path = Path(folder) / name
        if match and (path / TRAINER_STATE_NAME).is_file():
            steps[int(match.group(1))] = path
    return [steps[step] for step in sorted(steps)]


def sort_checkpoints(output_dir: str | os.PathLike, checkpoint_prefix: str = PREFIX_CHECKPOINT_DIR, use_mtime: bool = False,
                     best_model_checkpoint: str | None = None) -> list[str]:
    """The ``{checkpoint_prefix}-N`` folders in ``output_dir``, oldest first (transformers' helper).

    Args:
        output_dir: the folder holding the checkpoints.
        checkpoint_prefix: the folder-name prefix.
        use_mtime: order by modification time (falls back to N when all lie within one second, as on
            filesystems that fake mtimes).
        best_model_checkpoint: moved to second-to-last, so a rotation that deletes from the front keeps it
            and the newest stays last.

    Returns:
        Paths as strings, ``os.path.join(output_dir, name)``-style.

    Example:
        >>> sort_checkpoints("out")  # doctest: +SKIP
        ['out/checkpoint-500', 'out/checkpoint-1000']
    """
    pattern = re.compile(rf"^{re.escape(checkpoint_prefix)}-(\d+)$")
    found = [(int(m.group(1)), str(path)) for path in Path(output_dir).iterdir()
             if path.is_dir() and (m := pattern.match(path.name))]
    if use_mtime and len(found) > 1:
        by_time = sorted((os.path.getmtime(path), path) for _, path in found)
        if by_time[-1][0] - by_time[0][0] >= 1.0:
            found = by_time
        else:
            logger.warning("checkpoint modification times lie within one second (unreliable here): ordering by step")
    ordered = [path for _, path in sorted(found)]
    best = str(Path(best_model_checkpoint)) if best_model_checkpoint is not None else None
    if best in ordered and ordered[-1] != best:
        ordered.remove(best)
        ordered.insert(len(ordered) - 1, best)
    return ordered


DELETING_PREFIX = "deleting-"  # a rotated-away checkpoint between its rename and the end of its deletion


def delete_oldest(ordered: list[Path], limit: int, keep: set) -> list[Path]:
    """Delete from the front of ``ordered`` (oldest first) until ``limit`` are left, never one in ``keep``;
    the kept ones count toward the limit (with ``limit=1`` and a best that is not the newest, both stay).

    Returns the deleted folders.
    """
    keep = {Path(k).resolve() for k in keep if k is not None}
    budget = max(limit, len(keep))
    deletable = [c for c in ordered if Path(c).resolve() not in keep]
    deleted = deletable[: max(len(ordered) - budget, 0)]
    for path in deleted:
        logger.info("deleting older checkpoint %s (save_total_limit=%d)", path, limit)
        # renamed first (atomic), then deleted: a kill mid-delete leaves a deleting-checkpoint-N, never a partial checkpoint-N
        doomed = Path(path).with_name(DELETING_PREFIX + Path(path).name)
        os.replace(path, doomed)
        remove_folder(doomed)
    return deleted


def remove_folder(path: str | os.PathLike) -> None:
    """Delete a checkpoint folder, ignoring errors; a symlink to one (linked in from elsewhere) loses only the
    link, never what it points to (``shutil.rmtree`` refuses links, which would leave it forever)."""
    path = Path(path)
    if path.is_symlink():
        try:
            path.unlink()
        except OSError:
            pass
    else:
        shutil.rmtree(path, ignore_errors=True)


def rotate_checkpoints(output_dir: str | os.PathLike, save_total_limit: int | None = None,
                       best_model_checkpoint: str | None = None, use_mtime: bool = False,
                       checkpoint_prefix: str = PREFIX_CHECKPOINT_DIR, *, just_written: str | os.PathLike | None = None,
                       earlier: set[Path] = frozenset()) -> list[Path]:
    """Delete the oldest checkpoints beyond ``save_total_limit``, never the newest nor the best (transformers'
    helper, its signature and rule).

    The Trainer's rotation (``Checkpointer``, after each save) passes ``just_written``: then only complete
    ``checkpoint-N`` folders are candidates, the one just written is kept in place of the newest (a run resumed from
    an older checkpoint may leave a stale newer one, which may go), and the ``earlier`` run's checkpoints
    (``output_guard.earlier_checkpoints``) neither count nor go.

    Args:
        output_dir: the folder holding the checkpoints.
        save_total_limit: how many to keep; None or <= 0 keeps all.
        best_model_checkpoint: a checkpoint that is never deleted.
        use_mtime, checkpoint_prefix: see ``sort_checkpoints`` (without ``just_written`` only).
        just_written: the checkpoint this run just wrote (kept), or None: transformers' rule.
        earlier: checkpoints of an earlier run in ``output_dir``, left alone (with ``just_written`` only).

    Returns:
        The deleted folders.

    Example:
        >>> rotate_checkpoints("out", 2, "out/checkpoint-500")  # doctest: +SKIP
        [PosixPath('out/checkpoint-1000')]
    """
    if save_total_limit is None or save_total_limit <= 0:  # transformers: None or <= 0 keeps every checkpoint
        return []
    if just_written is None:
        ordered = [Path(p) for p in sort_checkpoints(output_dir, checkpoint_prefix, use_mtime)]
        return delete_oldest(ordered, save_total_limit, {ordered[-1] if ordered else None, best_model_checkpoint})
    earlier = {Path(p).resolve() for p in earlier}
    own = [c for c in sorted_checkpoints(output_dir) if c.resolve() not in earlier]
    return delete_oldest(own, save_total_limit, {just_written, best_model_checkpoint})


def keep_only_best(output_dir: str | os.PathLike, best: str | os.PathLike,
                   earlier: set[Path] = frozenset()) -> list[Path]:
    """When a run with ``save_total_limit=1`` ends: delete every checkpoint but ``best``, as transformers does after
    its last save (during training rotation also keeps the newest, for a resume). The ``earlier`` run's checkpoints
    neither count nor go, as in :func:`rotate_checkpoints`.

    Returns the deleted folders.
    """
    earlier = {Path(p).resolve() for p in earlier}
    own = [c for c in sorted_checkpoints(output_dir) if c.resolve() not in earlier]
    if Path(best).resolve() not in {c.resolve() for c in own}:  # gone, or the earlier run's: delete nothing
        return []
    return delete_oldest(own, 1, {best})
