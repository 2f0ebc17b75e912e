"""Streams: an ``IterableDataset`` cut per global batch for each process."""


from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import IterableDataset


# ---------------------------------------------------------------- iterable datasets


class IterableShard(IterableDataset):
    """One process's share of a stream: of every ``batch_size * world_size`` samples, the ``rank``-th
    run of ``batch_size`` (so the processes' batches of a step are the one-process global batch).

    The last, incomplete global batch is dropped with ``drop_last``; otherwise it is completed with
    the first samples of the stream, so every process gets the same number of batches and none waits
    at a collective for another.

    Args:
        dataset: a torch or Hugging Face iterable dataset.
        batch_size: the per-process batch size.
        rank, world_size: this process and the number of processes.
        drop_last: drop the incomplete last global batch.
    """

    def __init__(self, dataset: Any, batch_size: int, rank: int, world_size: int, drop_last: bool = False):
        self.dataset, self.batch_size, self.rank, self.world_size, self.drop_last = dataset, batch_size, rank, world_size, drop_last

    def set_epoch(self, epoch: int) -> None:
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        return self._shard(iter(self.dataset))

    def _shard(self, samples: Iterator[Any]) -> Iterator[Any]:
        size = self.batch_size * self.world_size
        mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        head: list = []  # the stream's first samples, to complete a short last batch
        buffer: list = []
        for sample in samples:
            buffer.append(sample)
            if len(head) < size:
                head.append(sample)
            if len(buffer) == size:
                yield from buffer[mine]
                buffer = []
        if buffer and not self.drop_last:
            while len(buffer) < size:
                buffer += head[: size - len(buffer)]
            yield from buffer[mine]


class IterableDatasetShard(IterableShard):
    """``IterableShard`` with transformers' signature: ``IterableDatasetShard(dataset, batch_size=1,
    drop_last=False, num_processes=1, process_index=0, seed=0)``.

    Also as in transformers: ``set_epoch(e)`` reseeds a ``torch.Generator`` found at ``dataset.generator``
    with ``seed + e`` (when the dataset has no ``set_epoch`` of its own), so every process shuffles alike;
    ``num_examples`` counts the samples read from the dataset in the current pass; ``len()`` is this
    process's sample count when the dataset has a length.

    Example:
        >>> list(IterableDatasetShard(range(12), batch_size=2, num_processes=2, process_index=1))
        [2, 3, 6, 7, 10, 11]
    """

    def __init__(self, dataset: Any, batch_size: int = 1, drop_last: bool = False, num_processes: int = 1,
                 process_index: int = 0, seed: int = 0):
        super().__init__(dataset, batch_size, process_index, num_processes, drop_last)
        self.num_processes, self.process_index, self.seed = num_processes, process_index, seed
        self.epoch = self.num_examples = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self.num_examples = 0
        generator = getattr(self.dataset, "generator", None)
        if not callable(getattr(self.dataset, "set_epoch", None)) and isinstance(generator, torch.Generator):
            generator.manual_seed(self.seed + self.epoch)

        def counted() -> Iterator[Any]:
            for sample in self.dataset:
                self.num_examples += 1
                yield sample

        return self._shard(counted())

    def __len__(self) -> int:
        size = self.batch_size * self.num_processes
        batches = len(self.dataset) // size if self.drop_last else -(-len(self.dataset) // size)
        return batches * self.batch_size
