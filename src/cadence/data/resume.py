"""Resume skipping: where a resumed epoch's data continues (samplers skip, streams restore or read again)."""


from __future__ import annotations

import logging
from typing import Any, Iterator

from torch.utils.data import DataLoader

from ..trainer_utils import has_length

from .loaders import is_iterable_dataset
from .samplers import BatchRebalanceSampler, EpochSampler
from .streams import IterableShard

logger = logging.getLogger(__name__)


def content_sample(dataset: Any, rows: int = 8) -> str | None:
    """A hash of ``rows`` rows spread over a ``datasets.Dataset`` (first and last included), in its raw format.

    Resume compares it when the dataset's fingerprint changed: ``datasets`` gives a ``.map()`` whose function it
    cannot hash a random fingerprint, so the same data can come back under another one. None for other datasets
    (their rows may be drawn at random, e.g. augmented) and where the rows cannot be read.

    Example:
        >>> content_sample(datasets.Dataset.from_dict({"x": [1, 2, 3]}))
        '5f1c...'
    """
    import hashlib
    import json

    if getattr(dataset, "_fingerprint", None) is None or not hasattr(dataset, "with_format"):
        return None
    try:
        n = len(dataset)
        raw = dataset.with_format(None)  # no set_transform: what is stored, not what a transform draws
        picked = sorted({round(k * (n - 1) / max(rows - 1, 1)) for k in range(rows)}) if n else []
        text = json.dumps([raw[i] for i in picked], sort_keys=True, default=repr)
    except Exception as e:  # noqa: BLE001 - a dataset that cannot be sampled is recognised by its fingerprint only
        logger.debug("no content sample of the train_dataset: %s", e)
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def set_epoch(dataloader: DataLoader, epoch: int, skip: int = 0, skip_batches: int | None = None) -> None:
    """Tell the sampler and the dataset (e.g. a shuffling ``datasets.IterableDataset``) the epoch.

    ``skip``: samples of this process's share already trained (a resumed epoch); cadence's samplers leave
    them out, so no batch is loaded to be thrown away. ``skip_batches``: the same position in batches, for a
    batch sampler whose batches vary in size (``BatchRebalanceSampler``). Another sampler (a subclass's, e.g.
    TRL's ``RepeatSampler``) cannot skip: its trained batches are read again and dropped (:func:`skips_by_reading`).
    """
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    sampler = getattr(dataloader, "sampler", None)
    if isinstance(batch_sampler, BatchRebalanceSampler):  # its batches vary in size: it skips whole batches
        batch_sampler.set_epoch(epoch, skip_batches or 0)
    if isinstance(sampler, EpochSampler):  # and LengthGroupedSampler, its subclass
        sampler.set_epoch(epoch, skip)
    elif callable(getattr(sampler, "set_epoch", None)):
        sampler.set_epoch(epoch)
    sharded = getattr(getattr(batch_sampler, "batch_sampler", None), "sampler", None)  # a subclass's, per rank
    if callable(getattr(sharded, "set_epoch", None)):
        sharded.set_epoch(epoch)
    dataset = getattr(dataloader, "dataset", None)
    if callable(getattr(dataset, "set_epoch", None)):
        dataset.set_epoch(epoch)


def skips_by_reading(dataloader: DataLoader) -> bool:
    """Whether a resumed epoch must read its trained batches again to pass them (as transformers always does):
    a stream, or a sampler that is not cadence's."""
    if isinstance(getattr(dataloader, "batch_sampler", None), BatchRebalanceSampler):
        return False
    return not has_length(dataloader) or not isinstance(getattr(dataloader, "sampler", None), EpochSampler)


class SavedState:
    """A ``state_dict()`` taken earlier (a stream's position before the batch collated ahead), for a checkpoint."""

    def __init__(self, state: Any):
        self.state = state

    def state_dict(self) -> Any:
        return self.state


def stateful_stream(dataloader: DataLoader | None) -> Any:
    """The iterable dataset behind ``dataloader`` when its position can be saved and restored.

    That is a dataset with ``state_dict``/``load_state_dict`` (a Hugging Face ``IterableDataset``,
    for one) read in the main process (``num_workers == 0``: with workers, the main process's copy
    does not advance). None otherwise: a resumed stream is then skipped by reading it.
    """
    dataset = getattr(dataloader, "dataset", None)
    if isinstance(dataset, IterableShard):
        dataset = dataset.dataset
    if dataset is None or not is_iterable_dataset(dataset) or getattr(dataloader, "num_workers", 0) > 0:
        return None
    if callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None)):
        return dataset
    return None


def skip_stream(batches: Iterator, count: int) -> None:
    """Read and drop ``count`` batches of a stream or sampler that cannot restore its position (logged: it
    costs time)."""
    logger.warning("resuming: reading and dropping the %d batches already trained (an iterable dataset with "
                   "state_dict/load_state_dict, or cadence's own sampler, resumes without reading them)", count)
    for _ in zip(range(count), batches):
        pass
