"""The start of an epoch: resume skipping (samplers skip, streams restore or read again), the RNGs set where a
saving run was, and the one-batch look-ahead with what each pending batch was drawn from."""


from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader

from ..trainer_utils import has_length

from .loaders import LookAhead, is_iterable_dataset
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


def resumed_epoch(resume: Any, dataloader: DataLoader, begin_epoch: Callable[[], None],
                  restore_rng: Callable[[Any], None],
                  resumed_dataloader: Callable[[Any, int], Any] | None = None) -> Iterator:
    """The resumed epoch's batch iterator (its sampler already set past the trained batches), with
    ``begin_epoch()`` (the epoch's events) called in between, and the RNGs set where the saving run was.

    A save between epochs had not yet fired the epoch's events nor drawn its iterator's seeds: the RNGs
    are restored before both. A save inside the epoch came after them: restored once the iterator exists.
    A stream continues from its saved state, or, without ``state_dict()``, reads its trained batches again;
    so does a sampler that cannot skip (not cadence's). ``resumed_dataloader`` (a subclass's
    ``get_resumed_dataloader``) gets the un-skipped dataloader and ``trained_batches`` and alone decides
    what is skipped: no stream state is loaded and nothing is read again.

    Args:
        resume: the checkpoint's ``ResumePoint`` (``skip_batches``, ``trained_batches``, ``rng``, ``stream_state``).
        dataloader: the training dataloader, its epoch set.
        begin_epoch: fires the epoch's events.
        restore_rng: sets the RNGs from a saved state (``checkpoint.rng.restore_rng_state``).
        resumed_dataloader: a subclass's ``get_resumed_dataloader``, or None.
    """
    if resumed_dataloader is not None and resume.trained_batches:
        dataloader = resumed_dataloader(dataloader, resume.trained_batches)
        begin_epoch()
        batches = iter(dataloader)
        restore_rng(resume.rng)  # after the iterator, as for any resume inside an epoch
        return batches
    if resume.stream_state is not None:
        stateful_stream(dataloader).load_state_dict(resume.stream_state)
    if not resume.skip_batches:
        restore_rng(resume.rng)
    begin_epoch()
    batches = iter(dataloader)
    if resume.skip_batches:
        if skips_by_reading(dataloader):
            skip_stream(batches, resume.skip_batches)
        restore_rng(resume.rng)
    return batches


def epoch_batches(dataloader: DataLoader, epoch: int, begin_epoch: Callable[[], None], batch_size: int,
                  resume: Any = None, resumed_dataloader: Callable[[Any, int], Any] | None = None,
                  capture_rng: Callable[[], Any] | None = None,
                  restore_rng: Callable[[Any], None] | None = None) -> LookAhead:
    """One epoch's batches: the sampler told the epoch (after a resume: without the batches already trained),
    ``begin_epoch()`` called where the saving run called it, and one batch collated ahead, as transformers'
    dataloader, keeping what each pending batch was drawn from (the RNGs, a stream's position) for a checkpoint.

    Args:
        dataloader: the training dataloader.
        epoch: the epoch's index.
        begin_epoch: fires the epoch's events (``on_epoch_begin``).
        batch_size: rows of one batch on this process (a resumed sampler skips ``skip_batches`` of them).
        resume: the checkpoint's ``ResumePoint`` for the resumed epoch, else None.
        resumed_dataloader: a subclass's ``get_resumed_dataloader``: it alone skips the trained batches.
        capture_rng: returns the RNG states before each fetch (None: not kept, where no checkpoint is written or
            workers collate).
        restore_rng: sets the RNGs from a saved state (needed with ``resume``).

    Returns:
        The epoch's ``LookAhead`` (its ``before_pending`` is what a checkpoint saves).
    """
    skip = 0 if resume is None or resumed_dataloader is not None else resume.skip_batches  # never loaded again
    set_epoch(dataloader, epoch, skip * batch_size if has_length(dataloader) else 0, skip_batches=skip)
    if resume is not None:  # the RNGs, and a stream's state, restored where the saving run was
        batches = resumed_epoch(resume, dataloader, begin_epoch, restore_rng, resumed_dataloader)
    else:
        begin_epoch()
        batches = iter(dataloader)
    stream = stateful_stream(dataloader)  # its position before the pending batch, always (cheap)

    def capture() -> dict:
        return {"rng": capture_rng() if capture_rng is not None else None,
                "stream": None if stream is None else stream.state_dict()}

    inside = resume is not None and (resume.skip_batches or resume.trained_batches)  # a pending batch was saved
    look_ahead = (resume.rng or {}).get("look_ahead") if inside else None
    replay = None if look_ahead is None else (lambda: restore_rng(look_ahead), lambda: restore_rng(resume.rng))
    return LookAhead(batches, capture if capture_rng is not None or stream is not None else None, replay)
