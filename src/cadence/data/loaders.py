"""Dataloaders: the training dataloader, its one-batch look-ahead, dataset checks and worker start-up."""


from __future__ import annotations

import os
import signal
from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader, IterableDataset

from ..trainer_utils import seed_worker


class LookAhead:
    """An epoch's training batches, each next one collated before the current one is handed out, as accelerate's
    ``DataLoaderShard`` (a transformers Trainer's dataloader) does: a collator or ``__getitem__`` that draws from
    ``random`` draws in transformers' order relative to the training steps and to a mid-epoch evaluation.

    For an exact resume what the pending batch was drawn from is kept (``before_pending``, from ``capture()``
    before each fetch: the RNG states, a stream's position; None without it or when nothing is pending): a
    checkpoint saves that, and the resumed epoch draws its first batch from it (``replay``: called as
    ``replay[0]()`` before, ``replay[1]()`` after that first fetch), then goes on from the checkpoint's own RNG
    states.

    Args:
        batches: the epoch's batch iterator.
        capture: returns what to keep before each fetch (None: keep nothing).
        replay: ``(before, after)`` the resumed epoch's first fetch, or None.

    Example:
        >>> list(LookAhead(iter([1, 2, 3])))
        [1, 2, 3]
    """

    _END = object()

    def __init__(self, batches: Iterator, capture: Callable[[], Any] | None = None,
                 replay: tuple[Callable[[], None], Callable[[], None]] | None = None):
        self.batches, self.capture, self.replay = batches, capture, replay
        self.pending: Any = None
        self.started = False
        self.before_pending: Any = None

    def __iter__(self) -> "LookAhead":
        return self

    def _fetch(self) -> Any:
        if self.capture is not None:
            self.before_pending = self.capture()
        try:
            return next(self.batches)
        except StopIteration:
            self.before_pending = None
            return self._END

    def __next__(self) -> Any:
        if not self.started:  # lazily, at the first batch, as accelerate's iterator starts
            self.started = True
            if self.replay is not None:
                self.replay[0]()
                self.pending = next(self.batches, self._END)
                self.replay[1]()
            else:
                self.pending = self._fetch()
        current = self.pending
        if current is self._END:
            raise StopIteration
        self.pending = self._fetch()  # the next batch first, then the current one out
        return current


def is_iterable_dataset(dataset: Any) -> bool:
    return isinstance(dataset, IterableDataset) or (not hasattr(dataset, "__len__") and hasattr(dataset, "__iter__"))


class TrainerDataLoader(DataLoader):
    """A ``DataLoader`` with the attributes of accelerate's prepared loaders that callbacks read: ``batch_size`` (one
    process's, also when a batch sampler makes the batches) and ``total_batch_size`` (over all processes).

    Example:
        >>> loader = TrainerDataLoader(list(range(10)), num_processes=2, batch_size=4)
        >>> (loader.batch_size, loader.total_batch_size, len(loader.dataset))
        (4, 8, 10)
    """

    def __init__(self, dataset: Any, *, num_processes: int = 1, **kwargs: Any):
        self.num_processes = num_processes
        super().__init__(dataset, **kwargs)

    @property
    def batch_size(self) -> int | None:
        return self._batch_size if self._batch_size is not None else getattr(self.batch_sampler, "batch_size", None)

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:  # DataLoader.__init__ sets it (None with a batch sampler)
        self._batch_size = value

    @property
    def total_batch_size(self) -> int | None:
        return None if self.batch_size is None else self.batch_size * self.num_processes


def check_dataset(dataset: Any, name: str, allow_empty: bool = False) -> None:
    """Refuse what cannot be trained on, before the first step; ``allow_empty``: an eval or test set, which may be
    empty (transformers evaluates it to metrics without a loss)."""
    if dataset is None:
        return
    if not is_iterable_dataset(dataset):
        if not hasattr(dataset, "__getitem__"):
            raise ValueError(f"{name} of type {type(dataset).__name__} has neither __getitem__ nor __iter__: pass a torch Dataset")
        if len(dataset) == 0 and not allow_empty:
            raise ValueError(f"{name} is empty (len 0): pass a dataset with at least one sample")


def init_worker(worker_id: int, num_workers: int = 0, rank: int = 0, ignore_stop_signals: bool = False) -> None:
    """DataLoader ``worker_init_fn``: seeded like ``seed_worker``; with ``enable_jit_checkpoint``, deaf to
    SIGTERM and SIGUSR1 from anyone but the main process.

    Schedulers send SIGTERM to the whole process group: workers that died of it would crash the main
    process ("DataLoader worker ... killed by signal") before it could save. Here the signals are left
    to the main process, which checkpoints, stops, and shuts the workers down itself. (A signal in the
    few milliseconds between a worker's start and this function still ends that worker.)
    """
    if ignore_stop_signals:
        _leave_stop_signals_to_the_main_process()
    seed_worker(worker_id, num_workers, rank)


def _leave_stop_signals_to_the_main_process() -> None:
    """Block SIGTERM/SIGUSR1 in this worker and take them in a thread: one from the parent (the DataLoader
    or multiprocessing terminating its workers, e.g. when the main process exits on an error) ends the
    worker as torch's own handler does; any other (the scheduler's, to the whole group) is dropped.
    Simply ignoring SIGTERM would leave the parent waiting forever for a worker it terminates."""
    if not hasattr(signal, "sigwaitinfo"):  # not Linux: keep torch's behaviour
        return
    import threading

    signals = {signal.SIGTERM, signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # pending until the thread below takes them
    parent = os.getppid()

    def take_signals() -> None:
        while True:
            info = signal.sigwaitinfo(signals)
            if info.si_signo == signal.SIGTERM and info.si_pid == parent:
                os._exit(0)

    threading.Thread(target=take_signals, name="cadence-stop-signals", daemon=True).start()
