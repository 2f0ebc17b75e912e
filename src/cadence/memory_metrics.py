"""``skip_memory_metrics=False``: the memory each stage of a Trainer used, under transformers' metric names.

The stages are ``init`` (``Trainer.__init__``), ``train``, ``eval`` (``evaluate``) and ``test`` (``predict``).
For each, two numbers per kind of memory, in bytes:

- ``{stage}_mem_cpu_alloc_delta``: the process's resident memory (RSS) at the end minus at the start;
- ``{stage}_mem_cpu_peaked_delta``: the highest RSS during the stage minus the RSS at its end (at least 0),

so what the stage needed at its height is their sum; and the same as ``_mem_gpu_`` for the tensors on an
accelerator (its allocator's own counts). ``init``'s numbers, and ``before_init_mem_cpu`` (``_gpu``), the
memory in use when the Trainer was built, are added to the first stage reported after it, as transformers
does. An evaluation inside ``train()`` is part of the train stage and reports nothing of its own.

The CPU peak: on Linux the kernel's own high-water mark (``VmHWM``), reset when a stage starts, so the peak is
exact and costs nothing while the stage runs (the mark is the process's: a second Trainer measuring a stage
inside another's, e.g. built in a callback, restarts it); elsewhere a thread samples the RSS every millisecond (``psutil``,
which accelerate installs), which can miss a peak shorter than that (transformers samples without pause, using
a core).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any

import torch

from .runtime import devices as backend  # the device verbs (runtime/devices.py), read on each call

logger = logging.getLogger(__name__)

_PROC_STATUS = "/proc/self/status"


def _proc_status_bytes(field: str) -> int:
    with open(_PROC_STATUS) as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    raise OSError(f"{_PROC_STATUS} has no {field}")


class _LinuxRss:
    """RSS and its peak from the kernel: the peak is reset by writing 5 to ``/proc/self/clear_refs``."""

    @staticmethod
    def usable() -> bool:
        try:
            _LinuxRss().reset_peak()
            _proc_status_bytes("VmHWM:")
            return True
        except OSError:  # not Linux, or a kernel or sandbox without it
            return False

    def now(self) -> int:
        return _proc_status_bytes("VmRSS:")

    def reset_peak(self) -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def peak(self) -> int:
        return _proc_status_bytes("VmHWM:")


class _SampledRss:
    """RSS through psutil, its peak sampled by a thread every millisecond between ``reset_peak`` and ``peak``."""

    def __init__(self):
        import psutil

        self._process = psutil.Process()
        self._highest = 0
        self._running = threading.Event()
        self._thread: threading.Thread | None = None

    def now(self) -> int:
        return self._process.memory_info().rss

    def _sample(self) -> None:
        while self._running.is_set():
            self._highest = max(self._highest, self.now())
            time.sleep(0.001)

    def reset_peak(self) -> None:
        self._highest = self.now()
        self._running.set()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def peak(self) -> int:
        self._running.clear()
        if self._thread is not None:
            self._thread.join()
        return max(self._highest, self.now())


class TrainerMemoryTracker:
    """transformers' tracker: ``start(stage)`` / ``stop_and_update_metrics(stage, metrics)`` around a stage.

    Args:
        skip_memory_metrics: measure nothing (``TrainingArguments.skip_memory_metrics``, True by default).
        device: the accelerator whose tensors' memory is reported as ``_gpu_`` (none on a CPU).

    Example:
        >>> tracker = TrainerMemoryTracker(False)
        >>> tracker.start("train"); ...; metrics = {}
        >>> tracker.stop_and_update_metrics("train", metrics)
        >>> sorted(metrics)
        ['train_mem_cpu_alloc_delta', 'train_mem_cpu_peaked_delta']
    """

    stages = ("init", "train", "eval", "test")

    def __init__(self, skip_memory_metrics: bool = False, device: torch.device | None = None):
        self.skip_memory_metrics = skip_memory_metrics
        self.device = device if device is not None else torch.device("cpu")
        self.cur_stage: str | None = None
        self.cpu: dict[str, dict[str, int]] = {}
        self.gpu: dict[str, dict[str, Any]] = {}
        self.init_reported = False
        if skip_memory_metrics:
            return
        if _LinuxRss.usable():
            self._rss: Any = _LinuxRss()
        else:
            try:
                self._rss = _SampledRss()
            except ImportError:  # as transformers: no psutil, no memory metrics
                logger.warning("skip_memory_metrics=False needs psutil off Linux: pip install psutil; no memory metrics")
                self.skip_memory_metrics = True

    def start(self, stage: str) -> None:
        """Begin measuring ``stage``; ignored while another stage runs (an evaluation inside training)."""
        if self.skip_memory_metrics or self.cur_stage is not None:
            return
        if stage not in self.stages:
            raise ValueError(f"memory stage {stage!r}: expected one of {self.stages}")
        self.cur_stage = stage
        gc.collect()  # what the previous stage left for the collector is not this stage's
        backend.reset_device_peak_memory(self.device)
        backend.empty_cache(self.device)
        device = backend.device_memory(self.device)
        self._gpu_begin = None if device is None else device[0]
        self._cpu_begin = self._rss.now()
        self._rss.reset_peak()

    def stop(self, stage: str) -> None:
        """End measuring ``stage`` (nothing unless it is the one running)."""
        if self.skip_memory_metrics or self.cur_stage != stage:
            return
        cpu_peak = self._rss.peak()
        gc.collect()  # freed objects do not count as the stage's
        backend.empty_cache(self.device)
        cpu_now = self._rss.now()
        self.cpu[stage] = {"begin": self._cpu_begin, "end": cpu_now, "alloc": cpu_now - self._cpu_begin,
                           "peaked": max(0, cpu_peak - cpu_now)}
        device = backend.device_memory(self.device)
        if device is not None:
            now, peak = device
            self.gpu[stage] = {"begin": self._gpu_begin, "end": now, "alloc": now - self._gpu_begin,
                               "peaked": max(0, peak - now) if peak is not None else "Not available"}
        self.cur_stage = None

    def update_metrics(self, stage: str, metrics: dict[str, Any]) -> None:
        """Add ``stage``'s numbers to ``metrics`` (and, the first time, ``init``'s and ``before_init_mem_*``)."""
        if self.skip_memory_metrics or self.cur_stage not in (None, stage):
            return
        stages = [stage]
        if not self.init_reported:
            stages.insert(0, "init")
            self.init_reported = True
        for name in stages:
            for kind in ("alloc", "peaked"):
                if name in self.cpu:
                    metrics[f"{name}_mem_cpu_{kind}_delta"] = self.cpu[name][kind]
                if name in self.gpu:
                    metrics[f"{name}_mem_gpu_{kind}_delta"] = self.gpu[name][kind]
        if stages[0] == "init" and "init" in self.cpu:
            metrics["before_init_mem_cpu"] = self.cpu["init"]["begin"]
            if "init" in self.gpu:
                metrics["before_init_mem_gpu"] = self.gpu["init"]["begin"]

    def stop_and_update_metrics(self, stage: str, metrics: dict[str, Any] | None = None) -> None:
        """``stop(stage)``, then ``update_metrics(stage, metrics)`` when given metrics (``init`` gives none)."""
        if self.skip_memory_metrics or self.cur_stage != stage:
            return
        self.stop(stage)
        if metrics is not None:
            self.update_metrics(stage, metrics)
