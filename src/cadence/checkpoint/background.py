"""Asynchronous checkpoint saves: a snapshot taken on the training thread, written by one background thread.

At a save step the training thread only copies the state off the training path (:meth:`BackgroundWriter.snapshot`:
every tensor into a CPU buffer kept from the previous save, pinned and copied without blocking on CUDA); one
background thread then serialises, hashes, fsyncs, renames and rotates (:meth:`BackgroundWriter.submit`). One save
is in flight at a time: the next one waits for it (and logs how long). Whatever reads checkpoints waits for it first
(:meth:`BackgroundWriter.wait`), and an error in the background is raised in the training thread as a
:class:`CheckpointWriteError` naming the folder, chained to the cause. The thread is not a daemon, so the process
exit waits for it too; an ``atexit`` hook reports a failure nobody waited for.
"""

from __future__ import annotations

import atexit
import copy
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..runtime.devices import copies_done_event

logger = logging.getLogger(__name__)


class CheckpointWriteError(OSError):
    """A checkpoint written in the background failed: its folder was not created (the cause is chained)."""

    def __init__(self, folder: str | os.PathLike, cause: BaseException | None = None, detail: str = ""):
        self.folder = Path(folder)
        if getattr(cause, "checkpoint_named", False) and not detail:  # the writer's message says what failed and
            # what is left (after output_dir was deleted, no older checkpoint is intact)
            super().__init__(f"checkpoint {self.folder} could not be written (in the background): {cause.args[-1]}")
            return
        why = detail or (f"{type(cause).__name__}: {cause}" if cause is not None else "unknown cause")
        super().__init__(f"checkpoint {self.folder} could not be written (in the background): {why}. The checkpoint "
                         "does not exist; older checkpoints are intact")


class _Job:
    """One background write: its folder, its thread, and the error it ended with."""

    def __init__(self, folder: Path, write: Callable[[], Any], ready: Any):
        self.folder, self.error = folder, None
        self._write, self._ready = write, ready
        # not a daemon: the interpreter joins it before exiting, so a finished script still completes its save
        self.thread = threading.Thread(target=self._run, name=f"cadence-save-{folder.name}", daemon=False)

    def _run(self) -> None:
        try:
            if self._ready is not None:  # the device->host copies of the snapshot have landed
                self._ready.synchronize()
            self._write()
        except BaseException as e:  # noqa: BLE001 - handed to the training thread, which raises it
            self.error = e


_writers: weakref.WeakSet = weakref.WeakSet()  # every writer with a save possibly in flight, for the exit hook


class BackgroundWriter:
    """One Trainer's background checkpoint writer: its snapshot buffers and its save in flight (at most one).

    Example:
        >>> writer = BackgroundWriter()
        >>> states = writer.snapshot({"optimizer": optimizer.state_dict()})   # training thread: copies only
        >>> writer.submit(folder, lambda: write_files(folder, states))        # returns at once
        >>> writer.wait()                                                      # before reading the checkpoint
    """

    def __init__(self):
        self._job: _Job | None = None
        self._buffers: dict[tuple, torch.Tensor] = {}  # snapshot path -> CPU tensor, reused save after save
        self._ready = None  # a CUDA event recorded after the snapshot's copies, when there were any
        _writers.add(self)

    # ------------------------------------------------------------ the snapshot (training thread)

    def snapshot(self, value: Any) -> Any:
        """``value`` (nested dicts, lists, tuples of tensors and plain data) with every tensor copied to the CPU.

        Tensors sharing a view (tied weights) share their copy, so they are still stored once. A buffer of the
        previous save is reused when the shape and dtype match (``copy_``: no fresh allocation, no page faults).
        Call only once the previous save is collected (:meth:`wait`): its buffers are being written until then.
        """
        assert self._job is None, "snapshot() while a save is in flight would overwrite the buffers it writes"
        self._aliases: dict[tuple, torch.Tensor] = {}
        self._memo: dict[int, Any] = {}  # a container met twice (AdamW's betas in every group) is copied once
        self._on_device = False
        copied = self._copy(value, ())
        self._aliases, self._memo = {}, {}  # they hold the live objects: let them go
        self._ready = None
        if self._on_device:  # non_blocking CUDA copies: the writer waits for this event, the training thread does not
            self._ready = copies_done_event()
        return copied

    def _copy(self, value: Any, path: tuple) -> Any:
        if isinstance(value, torch.Tensor):
            return self._copy_tensor(value, path)
        if id(value) in self._memo:  # shared stays shared: the pickle written from the copy is the live one's
            return self._memo[id(value)]
        self._memo[id(value)] = copied = self._copy_new(value, path)
        return copied

    def _copy_new(self, value: Any, path: tuple) -> Any:
        if isinstance(value, dict):
            out = _empty_like(value)
            for key, item in value.items():
                out[key] = self._copy(item, (*path, key))
            if hasattr(value, "_metadata"):  # a module's state_dict carries its version numbers
                out._metadata = copy.deepcopy(value._metadata)
            return out
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(self._copy(item, (*path, i)) for i, item in enumerate(value))
        return copy.deepcopy(value, self._memo)  # numbers and strings as they are; anything else copied

    def _copy_tensor(self, tensor: torch.Tensor, path: tuple) -> torch.Tensor:
        tensor = tensor.detach()
        if is_traceable_wrapper_subclass(tensor):  # e.g. torchao's 4-/8-bit optimizer states: no storage of its own
            names, context = tensor.__tensor_flatten__()
            # fresh copies, not the reused per-path buffers: with those, a torchao 8-bit run resumed after other
            # runs in the same process read a wrong state (cause not pinned down; fresh copies resume exactly)
            inner = {name: getattr(tensor, name).detach().to("cpu", copy=True) for name in names}
            return type(tensor).__tensor_unflatten__(inner, context, tensor.size(), tensor.stride())
        alias = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                 tuple(tensor.stride()), tensor.dtype, tensor.device)
        if tensor.numel() and alias in self._aliases:  # a tied weight: the same copy under both names
            return self._aliases[alias]
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = tensor.device.type == "cuda"  # pinned host memory: the copy runs without blocking the stream
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[path] = buffer
        non_blocking = tensor.device.type == "cuda" and buffer.is_pinned()
        buffer.copy_(tensor, non_blocking=non_blocking)  # other devices copy synchronously
        self._on_device |= non_blocking
        self._aliases[alias] = buffer
        return buffer

    # ------------------------------------------------------------ the write (background thread)

    def submit(self, folder: str | os.PathLike, write: Callable[[], Any]) -> None:
        """Run ``write()`` (which creates ``folder``) in the background; returns at once. Call once the previous
        save is collected (:meth:`wait`): one save in flight."""
        assert self._job is None, "submit() while a save is in flight: wait() for it first"
        self._job = _Job(Path(folder), write, self._ready)
        self._ready = None
        self._job.thread.start()

    def done(self) -> bool:
        """Whether no save is running (a finished one may wait to be collected). Cheap: never blocks."""
        return self._job is None or not self._job.thread.is_alive()

    def failed(self) -> bool:
        """Whether the save in flight has finished with an error (not yet raised). Never blocks."""
        return self._job is not None and not self._job.thread.is_alive() and self._job.error is not None

    def wait(self, reason: str = "", stall: bool = False) -> Path | None:
        """Block until the save in flight is complete; returns its folder (None when there was none).

        Args:
            reason: what waits (logged with the time waited, when it had to wait).
            stall: the next save waits (saves come faster than they are written): logged as a warning.

        Raises:
            CheckpointWriteError: the background write failed (naming the folder; the cause chained).
        """
        job = self._job
        if job is None:
            return None
        if job.thread.is_alive():
            start = time.perf_counter()
            job.thread.join()
            waited = time.perf_counter() - start
            if waited >= 0.01:
                log = logger.warning if stall else logger.info
                log("waited %.2f s for the background save of %s to finish before %s", waited, job.folder.name,
                    reason or "going on")
        self._job = None
        if job.error is not None:
            raise CheckpointWriteError(job.folder, job.error) from job.error
        return job.folder


@atexit.register
def _wait_at_exit() -> None:
    """The interpreter already joined the writer threads (not daemons); report a failure nobody collected."""
    for writer in list(_writers):
        try:
            writer.wait(reason="the process exits")
        except CheckpointWriteError as e:
            logger.error("%s", e, exc_info=e.__cause__)


def _empty_like(value: dict) -> dict:
    """An empty dict of ``value``'s kind (an OrderedDict stays one: the files come out byte for byte as from the
    live state), or a plain dict when the kind needs arguments (a defaultdict's factory)."""
    try:
        return type(value)()
    except TypeError:
        return {}
