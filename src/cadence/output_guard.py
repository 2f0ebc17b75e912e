"""Who may write an ``output_dir``: one live run at a time; an earlier run's checkpoints are kept, not refused.

Before the first step, ``train()``:

1. takes ``output_dir/cadence.lock`` (main process). The lock is an OS lock, ``fcntl.flock`` on that file,
   so taking it is atomic (of N runs started at once, exactly one gets it) and the OS releases it when the
   owning process dies, however it dies: a crashed run's lock is simply taken by the next run. The file also
   names the owner (pid, host, torchrun job) for the error message of the run that is refused. Two threads of
   one process are told apart by an in-process registry (and by ``flock`` itself, which locks per open file).
   A lock file naming another host whose run is gone is refused (a network filesystem may not carry
   ``flock`` between hosts), naming the file to delete, unless it is the same torchrun job restarting.
   Where ``fcntl`` is missing (Windows) or the filesystem refuses ``flock``, the lock is an exclusive create
   (``O_EXCL``) of the file instead; a dead owner's file (its pid gone, on this host) is renamed away before
   the exclusive create, so of several runs taking over one stale lock only one creates the new file. That
   fallback cannot tell a live run on another host from a dead one, and the OS does not release it: a killed
   run leaves the file, taken over as above.
2. for a new run (no resume), notes the ``checkpoint-N`` folders already there, written by an earlier run.
   As in transformers the run goes on, with one warning naming them: this run's rotation
   (``save_total_limit``) deletes only checkpoints this run wrote; a checkpoint this run saves at the same
   step replaces the earlier one atomically. ``overwrite_output_dir=True`` deletes them first, with the
   earlier run's top-level ``trainer_state.json`` and ``log_history.jsonl``, so ``cadence plot`` draws the
   new run only.
3. under ``torchrun``, the job's identity (:func:`job_identity`) goes into each checkpoint
   (``loop_state.json``): a job that torchrun restarted (``TORCHELASTIC_RESTART_COUNT > 0``) resumes the
   newest intact checkpoint that carries its identity by itself, and never one of another job.

The lock is released when ``train()`` returns or raises; when it raises, a folder the lock created and
nothing else used is removed again, so a refused run leaves the disk as it was.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

from .checkpoint_io.formats import LOOP_STATE_NAME, UnsafeCheckpointError, checked_path  # holds the job identity
from .checkpoint_io.folders import CHECKPOINT_DIR_RE, sorted_checkpoints

try:
    import fcntl
except ImportError:  # Windows: the exclusive-create fallback
    fcntl = None

logger = logging.getLogger(__name__)

LOCK_NAME = "cadence.lock"
EARLIER_RUN_FILES = ("trainer_state.json", "log_history.jsonl")  # what `cadence plot` would draw of an earlier run

_registry_lock = threading.Lock()
_held: dict[str, "OutputDirLock"] = {}  # output_dir (absolute) -> the lock a thread of this process holds
_earlier: dict[str, set[str]] = {}  # output_dir (absolute) -> names of the earlier run's checkpoints, this run


def _key(output_dir: str | os.PathLike) -> str:
    return os.path.abspath(output_dir)


def _checkpoint_folders(output_dir: Path, leftovers: bool) -> list[Path]:
    """Every ``checkpoint-N`` folder (complete or not) and ``old-checkpoint-N`` (one being replaced, put
    back on resume); with ``leftovers`` also the ``tmp-checkpoint-N`` of saves killed half-way (and the
    ``deleting-checkpoint-N`` of rotations killed half-way), which are never resumed from."""
    found = []
    for path in output_dir.iterdir():
        name = path.name
        for prefix in ("", "old-", *(("tmp-", "deleting-") if leftovers else ())):
            if name.startswith(prefix) and CHECKPOINT_DIR_RE.match(name[len(prefix):]) and path.is_dir():
                found.append(path)
                break
    return sorted(found)


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would terminate the process there: ask the kernel instead
        return _windows_pid_alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _windows_pid_alive(pid: int) -> bool:
    """OpenProcess + GetExitCodeProcess (STILL_ACTIVE = 259); a process we may not open exists. Not run here."""
    import ctypes

    kernel32 = ctypes.windll.kernel32
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return kernel32.GetLastError() == 5  # ERROR_ACCESS_DENIED: it exists
    try:
        code = ctypes.c_ulong()
        return not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)) or code.value == 259
    finally:
        kernel32.CloseHandle(handle)


# ------------------------------------------------------------------ the job torchrun runs


def job_identity() -> str | None:
    """A hash naming this torchrun job, the same in every attempt torchrun restarts (or this SLURM job, the same
    when SLURM requeues it); None outside both.

    torchrun's run id (``--rdzv-id``; a fresh uuid with ``--standalone``) and the command line name the job.
    Without a run id (static rendezvous: ``none``), the launching agent does (this process's parent, its
    host and start time): torchrun restarts workers from the same agent.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None and os.environ.get("SLURM_JOB_ID"):  # a SLURM job (srun, sbatch): requeued, it keeps its id
        return hashlib.sha256("\0".join(["slurm", os.environ["SLURM_JOB_ID"], *sys.argv]).encode()).hexdigest()[:16]
    if run_id is None:
        return None
    parts = [run_id, *sys.argv]
    if run_id in ("", "none"):
        parent = os.getppid()
        parts += [socket.gethostname(), str(parent), _start_time(parent)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _start_time(pid: int) -> str:
    """The start time of ``pid`` in clock ticks (Linux), so a reused pid is another agent; '' elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after the command name
    except (OSError, IndexError):
        return ""


def restarted_by_torchrun() -> bool:
    """This process is a worker torchrun started again after a failure (``TORCHELASTIC_RESTART_COUNT > 0``), or
    one of a SLURM job that SLURM requeued (``SLURM_RESTART_COUNT > 0``, outside torchrun). On several nodes each
    torchrun agent counts its own restarts: the Trainer asks every process and takes any one's yes."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if count is None and os.environ.get("SLURM_JOB_ID"):
        count = os.environ.get("SLURM_RESTART_COUNT")
    try:
        return int(count or "0") > 0
    except ValueError:
        return False


def job_checkpoints(output_dir: str | os.PathLike, job: str) -> list[Path]:
    """The complete checkpoints of ``output_dir`` that the job ``job`` wrote, newest first."""
    if not os.path.isdir(output_dir):
        return []
    own = []
    for folder in reversed(sorted_checkpoints(output_dir)):
        try:  # a regular file inside the folder only (formats' rule): a planted FIFO would stall the start
            loop = json.loads(checked_path(folder, folder / LOOP_STATE_NAME).read_text())
        except (OSError, ValueError, RecursionError, UnsafeCheckpointError):  # none (transformers'), or unreadable:
            continue  # not this job's
        if isinstance(loop, dict) and loop.get("job") == job:
            own.append(folder)
    return own


# ------------------------------------------------------------------ the lock


class OutputDirLock:
    """The lock of one ``output_dir``; ``acquire()`` before writing, ``release()`` after.

    Args:
        output_dir: the run's output folder (created by ``acquire`` when missing).

    Example:
        >>> lock = OutputDirLock("out"); lock.acquire()  # raises ValueError while another run holds it
        >>> lock.release()
    """

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / LOCK_NAME
        self.created_dir = False
        self.held = False
        self._fd: int | None = None  # the flock'ed file, open while held
        self.noted = False  # note_earlier_run ran for this run

    def acquire(self) -> None:
        """Create ``output_dir`` and take its lock, or take over a dead owner's.

        Raises:
            ValueError: ``output_dir`` cannot be created or written, or another live run holds it.
        """
        me = {"pid": os.getpid(), "host": socket.gethostname(), "job": job_identity()}
        with _registry_lock:  # threads of this process: the registry decides, before any file is touched
            holder = _held.get(_key(self.output_dir))
            if holder is self:
                return
            if holder is not None:
                raise ValueError(
                    f"output_dir={str(self.output_dir)!r} is in use by another run of this process (pid "
                    f"{me['pid']}, another thread's train(), see {self.path}): two runs writing one folder overwrite "
                    "and rotate away each other's checkpoints; pass another output_dir, or wait for that run"
                )
            try:
                self.created_dir = not self.output_dir.exists()
                self.output_dir.mkdir(parents=True, exist_ok=True)
                owner = self._take(me)
            except OSError as e:
                self._remove_created_dir()
                raise ValueError(
                    f"output_dir={str(self.output_dir)!r} cannot be written ({e.strerror or e}): checkpoints and the "
                    "final model go there; pass an output_dir you can write to, or fix its permissions"
                ) from e
            if not self.held:
                self._remove_created_dir()
                raise ValueError(
                    f"output_dir={str(self.output_dir)!r} is in use by another run (pid {owner.get('pid', '?')} on host "
                    f"{owner.get('host', '?')}, see {self.path}): two runs writing one folder overwrite and rotate away "
                    f"each other's checkpoints; pass another output_dir, or wait for that run (delete {self.path} if "
                    "it is gone)"
                )
            _held[_key(self.output_dir)] = self

    def _take(self, me: dict) -> dict:
        """Take the lock (``self.held``) and write ``me`` into it; returns the owner found in the file."""
        if fcntl is not None:
            try:
                return self._take_flock(me)
            except OSError as e:
                if not _flock_unsupported(e):
                    raise
                logger.warning("%s: the filesystem refuses flock (%s); locking by exclusive create", self.path, e)
        return self._take_exclusive(me)

    def _take_flock(self, me: dict) -> dict:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live process holds it
                os.close(fd)
                return self._read_owner() or {}
            except BaseException:
                os.close(fd)
                raise
            # a releasing run deletes the file after we opened it: the lock must be on the file at the path
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            opened = os.fstat(fd)
            if current is not None and (current.st_ino, current.st_dev) == (opened.st_ino, opened.st_dev):
                break
            os.close(fd)
        owner = _parse(os.read(fd, 4096))
        if not self._may_take_over(owner, me, os_locked=True):
            os.close(fd)  # releases the flock: the file stays for its owner
            return owner
        if owner:
            logger.warning("taking over %s: its owner (pid %s on %s) no longer holds it", self.path, owner.get("pid"),
                           owner.get("host"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self._fd, self.held = fd, True
        return owner

    def _take_exclusive(self, me: dict) -> dict:
        for _ in range(500):  # each round creates the file, or finds a live owner, or a dead one's file went
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = self._read_owner()
                if owner is None:  # gone since: try again
                    continue
                if not self._may_take_over(owner, me, os_locked=False):
                    return owner
                self._remove_stale(owner)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(me) + "\n")
            self.held = True
            return {}
        return self._read_owner() or {}

    def _remove_stale(self, stale: dict) -> None:
        """Delete a dead owner's lock file while holding ``cadence.lock.takeover`` (an exclusive create), and only
        if it still names that owner when read under it: of several runs judging one stale file, one deletes it,
        and a file another run created meanwhile is never deleted. The runs then race to create it again."""
        guard = self.path.with_name(LOCK_NAME + ".takeover")
        try:
            os.close(os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:  # another run is taking over: look again shortly
            try:
                if time.time() - guard.stat().st_mtime > 30:  # left by a run killed inside the takeover
                    guard.unlink()
            except FileNotFoundError:
                pass
            time.sleep(0.005)
            return
        try:
            if self._read_owner() == stale:
                self.path.unlink(missing_ok=True)
                logger.warning("taking over %s: its owner (pid %s on %s) no longer runs", self.path,
                               stale.get("pid"), stale.get("host"))
        finally:
            guard.unlink(missing_ok=True)

    def _may_take_over(self, owner: dict, me: dict, os_locked: bool) -> bool:
        """Whether the lock file's owner is gone. ``os_locked``: this process holds the file's OS lock now, so
        no live process does (a live pid in the file is another process that reused the number)."""
        if owner.get("job") is not None and owner.get("job") == me["job"]:
            return True  # the same torchrun job, restarted (perhaps with its main process on another host)
        if owner and owner.get("host") != me["host"]:
            return False  # a process of another host cannot be checked from here
        pid = owner.get("pid")
        if not isinstance(pid, int) or pid == me["pid"]:
            # empty or unreadable: a run that died writing it, or (fallback) one writing it now
            return os_locked or pid == me["pid"]
        return os_locked or not _pid_alive(pid)

    def _read_owner(self) -> dict | None:
        """The owner the lock file names; None when the file is gone."""
        try:
            return _parse(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except OSError:  # unreadable: an unknown run
            return {"pid": "?"}

    def release(self, remove_created_dir: bool = True) -> None:
        """Delete the lock; with ``remove_created_dir``, also ``output_dir`` if the lock created it and it is empty."""
        with _registry_lock:
            if self.held:
                try:
                    self.path.unlink(missing_ok=True)  # while still holding it: a run that opened it retries
                except OSError as e:  # output_dir turned unwritable: never mask the error the run is raising
                    logger.warning("could not delete %s (%s): the lock is released all the same (its OS lock goes "
                                   "with the file closed here); the next run takes the file over", self.path,
                                   e.strerror or e)
                finally:
                    if self._fd is not None:
                        try:
                            os.close(self._fd)
                        except OSError:
                            pass
                        self._fd = None
                    self.held = False
            if _held.get(_key(self.output_dir)) is self:
                del _held[_key(self.output_dir)]
            if self.noted:  # this run's note of the earlier run's checkpoints (not another thread's)
                _earlier.pop(_key(self.output_dir), None)
                self.noted = False
        if remove_created_dir:
            self._remove_created_dir()

    def _remove_created_dir(self) -> None:
        if self.created_dir:
            try:
                self.output_dir.rmdir()  # only when empty: a run that wrote something keeps it
            except OSError:
                pass
            self.created_dir = False


def _parse(raw: bytes) -> dict:
    """The owner a lock file names: {} for an empty file, ``{"pid": "?"}`` for one that cannot be read."""
    try:
        owner = json.loads(raw.decode() or "{}")
        return owner if isinstance(owner, dict) else {"pid": "?"}
    except (ValueError, UnicodeDecodeError):  # unreadable: held by an unknown run
        return {"pid": "?"}


def _flock_unsupported(error: OSError) -> bool:
    return error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _close_in_child() -> None:
    """A forked child (a DataLoader worker) shares the parent's open lock file: close its copy, so the lock
    ends with the run's own process (the parent's stays held) and the child never releases it."""
    for lock in list(_held.values()):
        if lock._fd is not None:
            try:
                os.close(lock._fd)
            except OSError:
                pass
            lock._fd, lock.held = None, False
    _held.clear()
    _earlier.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


# ------------------------------------------------------------------ an earlier run's checkpoints


def note_earlier_run(lock: OutputDirLock, overwrite: bool, main: bool) -> list[Path]:
    """Before a new run (not a resume): the ``checkpoint-N`` folders of an earlier run in ``output_dir``.

    Warns once (main process) naming them and remembers them, so this run's rotation leaves them alone
    (:func:`earlier_checkpoints`); with ``overwrite`` the main process deletes them instead, with the earlier
    run's ``trainer_state.json`` and ``log_history.jsonl``.

    Args:
        lock: this run's lock of ``output_dir`` (held on the main process); its ``release()`` forgets them.
        overwrite: ``overwrite_output_dir``.
        main: this is the main process, which deletes and warns (the others only note).

    Returns:
        The earlier run's checkpoint folders kept (none when ``overwrite``).
    """
    output_dir = lock.output_dir
    lock.noted = True
    _earlier.pop(_key(output_dir), None)
    if not output_dir.is_dir():
        return []
    if overwrite:
        if main:
            doomed = _checkpoint_folders(output_dir, leftovers=True)
            doomed += [output_dir / name for name in EARLIER_RUN_FILES if (output_dir / name).is_file()]
            for path in doomed:
                if path.is_symlink():  # a checkpoint linked in from elsewhere: the link goes, never what it points to
                    logger.warning("overwrite_output_dir=True: removing the symlink %s of an earlier run (its target "
                                   "%s is kept)", path, os.path.realpath(path))
                    path.unlink()
                    continue
                logger.warning("overwrite_output_dir=True: deleting %s of an earlier run", path)
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        return []
    found = _checkpoint_folders(output_dir, leftovers=False)
    if not found:
        return []
    _earlier[_key(output_dir)] = {p.name for p in found}
    if not main:
        return found
    names = ", ".join(p.name for p in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    logger.warning(
        "output_dir=%r holds checkpoints of an earlier run (%s). This run starts at step 0 (as transformers does); "
        "its rotation (save_total_limit) deletes only checkpoints it writes itself; a checkpoint it saves at the "
        "same step replaces the earlier one atomically; resume_from_checkpoint=True later continues the newest "
        "checkpoint, whichever run wrote it. To continue the earlier run pass train(resume_from_checkpoint=True); "
        "to delete its checkpoints first set overwrite_output_dir=True; or pass another output_dir",
        str(output_dir), names)
    return found


def earlier_checkpoints(output_dir: str | os.PathLike, just_written: str | os.PathLike | None = None) -> set[Path]:
    """The earlier run's checkpoints this run's rotation must keep; ``just_written`` (a folder this run just
    saved, replacing one of the same name) is this run's from now on."""
    names = _earlier.get(_key(output_dir), set())
    if just_written is not None and Path(just_written).name in names:
        logger.info("%s of the earlier run was replaced by this run's checkpoint of the same step", just_written)
        names.discard(Path(just_written).name)
    return {Path(output_dir) / name for name in names}
