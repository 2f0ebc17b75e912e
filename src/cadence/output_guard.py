"""Who may write an ``output_dir``: one run at a time, and never over another run's checkpoints.

Before the first step, ``train()`` (on the main process):

1. takes ``output_dir/cadence.lock``, a small JSON file naming the owner's pid and host. A second
   run into the same folder while the first is alive is refused; a lock left by a process that no
   longer exists on this host (killed, crashed) is taken over. A lock of another host cannot be
   checked from here: it is refused, naming the file to delete if that run is gone.
2. refuses a new run (no ``resume_from_checkpoint``) into a folder that holds ``checkpoint-N``
   folders it did not write: they would be overwritten step by step, deleted by rotation, and a
   later ``resume_from_checkpoint=True`` would continue the wrong run. ``overwrite_output_dir=True``
   deletes those checkpoint folders (and only them) first.

The lock is released when ``train()`` returns or raises; when it raises, a folder the lock created
and nothing else used is removed again, so a refused run leaves the disk as it was.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from pathlib import Path

from .trainer_utils import CHECKPOINT_DIR_RE

logger = logging.getLogger(__name__)

LOCK_NAME = "cadence.lock"


def _checkpoint_folders(output_dir: Path, leftovers: bool) -> list[Path]:
    """Every ``checkpoint-N`` folder (complete or not) and ``old-checkpoint-N`` (one being replaced, put
    back on resume); with ``leftovers`` also the ``tmp-checkpoint-N`` of saves killed half-way (and the
    ``deleting-checkpoint-N`` of rotations killed half-way), which
    are never resumed from and so belong to nobody."""
    found = []
    for path in output_dir.iterdir():
        name = path.name
        for prefix in ("", "old-", *(("tmp-", "deleting-") if leftovers else ())):
            if name.startswith(prefix) and CHECKPOINT_DIR_RE.match(name[len(prefix):]) and path.is_dir():
                found.append(path)
                break
    return sorted(found)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class OutputDirLock:
    """The lock file of one ``output_dir``; ``acquire()`` before writing, ``release()`` after."""

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / LOCK_NAME
        self.created_dir = False
        self.held = False

    def acquire(self) -> None:
        """Create the lock (and ``output_dir``), or take over a dead owner's.

        Raises:
            ValueError: ``output_dir`` cannot be created or written, or another live run holds it.
        """
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        try:
            self.created_dir = not self.output_dir.exists()
            self.output_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.output_dir / f".{LOCK_NAME}.{me['pid']}"
            tmp.write_text(json.dumps(me) + "\n")
            try:
                os.link(tmp, self.path)  # atomic: fails when a lock exists
                self.held = True
                return
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as e:
            self._remove_created_dir()
            raise ValueError(
                f"output_dir={str(self.output_dir)!r} cannot be written ({e.strerror or e}): checkpoints and the "
                "final model go there; pass an output_dir you can write to, or fix its permissions"
            ) from e
        owner = self._read_owner()
        same_host = owner.get("host") == me["host"]
        if owner.get("pid") == me["pid"] and same_host:  # this process (an earlier train() that did not release)
            self.held = True
            return
        if same_host and isinstance(owner.get("pid"), int) and not _pid_alive(owner["pid"]):
            logger.warning("taking over %s: its owner (pid %s on %s) no longer runs", self.path, owner["pid"], owner["host"])
            self.path.write_text(json.dumps(me) + "\n")
            self.held = True
            return
        raise ValueError(
            f"output_dir={str(self.output_dir)!r} is in use by another run (pid {owner.get('pid', '?')} on host "
            f"{owner.get('host', '?')}, see {self.path}): two runs writing one folder overwrite and rotate away each "
            f"other's checkpoints; pass another output_dir, or wait for that run (delete {self.path} if it is gone)"
        )

    def _read_owner(self) -> dict:
        try:
            owner = json.loads(self.path.read_text())
            return owner if isinstance(owner, dict) else {}
        except (OSError, ValueError):  # unreadable: treat as held by an unknown run
            return {}

    def release(self, remove_created_dir: bool = True) -> None:
        """Delete the lock; with ``remove_created_dir``, also ``output_dir`` if the lock created it and it is empty."""
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
        if remove_created_dir:
            self._remove_created_dir()

    def _remove_created_dir(self) -> None:
        if self.created_dir:
            try:
                self.output_dir.rmdir()  # only when empty: a run that wrote something keeps it
            except OSError:
                pass
            self.created_dir = False


def refuse_foreign_checkpoints(output_dir: str | os.PathLike, overwrite: bool) -> None:
    """Before a new run (not a resume): ``output_dir`` must hold no ``checkpoint-N`` folders.

    Args:
        output_dir: the run's output folder.
        overwrite: ``overwrite_output_dir``; True deletes those folders instead of refusing.

    Raises:
        ValueError: checkpoints are there and ``overwrite`` is False.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return
    if overwrite:
        for path in _checkpoint_folders(output_dir, leftovers=True):
            logger.warning("overwrite_output_dir=True: deleting %s from an earlier run", path)
            shutil.rmtree(path)
        return
    found = _checkpoint_folders(output_dir, leftovers=False)
    if not found:
        return
    names = ", ".join(p.name for p in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    raise ValueError(
        f"output_dir={str(output_dir)!r} holds checkpoints of another run ({names}): a new run there would overwrite "
        "them and delete them by rotation. To continue that run pass train(resume_from_checkpoint=True) (or a "
        "checkpoint folder); to start over and delete them set overwrite_output_dir=True; or pass another output_dir"
    )
