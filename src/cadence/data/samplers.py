"""Datasets to batches: samplers, collators, unused-column removal, streams, token and item counting.

- Order. The training order is the one `transformers.Trainer` gives for the same seed: epoch ``e``
  is ``torch.randperm(n, generator=Generator().manual_seed(seed + e))`` (what accelerate's seedable
  sampler draws); ``group_by_length`` uses HF's megabatch order drawn from the same generator. With
  N processes, process ``r`` takes every N-th index starting at ``r``, so the N per-process batches
  of a step hold exactly the samples of the one-process batch. A stream (``IterableDataset``) is
  cut per global batch instead (``IterableShard``). Evaluation keeps dataset order: process ``r``
  takes whole batches ``r, r+N, ...`` of the one-process batch list (``EvalBatchSampler``), and
  the batch that only pads is marked, not counted.
- Collators follow HF: ``default_data_collator`` stacks, ``DataCollatorWithPadding`` pads to the
  longest sample; a batch that cannot be made is an error naming the field and the sample.
- Columns the model's ``forward`` does not accept are dropped: with the column API for Hugging
  Face ``datasets`` (imported only if the caller already did), in the collator otherwise.
- Resuming a stream: one with ``state_dict``/``load_state_dict`` read in the main process
  (``stateful_stream``) continues from its saved position; any other is read again and its trained
  batches dropped (``skip_stream``). The checkpoint code saves and restores the position.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from .backend import process_group_size_and_rank, shard_batch_sampler
from .trainer_utils import RemoveColumnsCollator, check_columns, has_length, seed_worker

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
LABEL_COLUMNS = ("label", "label_ids", "labels")


class EpochSampler(Sampler[int]):
    """Indices of one process's share of an epoch; shuffled with a generator seeded by ``seed + epoch``.

    Args:
        num_samples: length of the dataset.
        shuffle: random order (training) or dataset order (evaluation).
        seed: base seed; the order of epoch ``e`` depends only on ``seed + e``.
        rank, world_size: this process's share: every ``world_size``-th index from ``rank``.
            The epoch is padded by wrapping around so every process gets the same count.

    ``set_epoch(epoch, skip)`` starts that epoch ``skip`` indices into this process's share: a
    resumed run skips the samples it already trained on without loading them (O(1) in the step).

    Example:
        >>> s = EpochSampler(4, shuffle=False)
        >>> list(s)
        [0, 1, 2, 3]
    """

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1):
        self.num_samples, self.shuffle, self.seed = num_samples, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Draw epoch ``epoch``'s order; leave out the first ``skip`` indices of this process's share."""
        self.epoch, self.skip = epoch, skip

    def _share(self) -> int:
        return -(-self.num_samples // self.world_size)

    def __len__(self) -> int:
        return max(self._share() - self.skip, 0)

    def _order(self) -> list[int]:
        """The epoch's order of the whole dataset (subclasses draw it differently)."""
        if not self.shuffle:
            return list(range(self.num_samples))
        return torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        padding = self._share() * self.world_size - self.num_samples
        order += order[:padding]  # equal shares, so no process waits at a collective for another
        return iter(order[self.rank :: self.world_size][self.skip :])


class EvalBatchSampler(Sampler[list[int]]):
    """Evaluation batches in dataset order; with N processes, process ``r`` takes batches ``r, r+N, ...``.

    The batches are the one-process batches ``[0..b), [b..2b), ...`` (the last may be shorter), so
    the N batches gathered at step ``k`` are the consecutive batches ``kN .. kN+N-1`` and the gathered
    rows are in dataset order. Every process runs the same number of steps (collectives stay in
    step): a process with no batch left runs a repeat of batch 0 that ``is_padding(step)`` marks, and
    whose rows and loss the evaluation leaves out.

    Args:
        num_samples: length of the dataset.
        batch_size: rows per batch of one process.
        rank, world_size: this process and the number of processes.
        drop_last: leave out the last, shorter batch.

    Example:
        >>> list(EvalBatchSampler(5, 2, rank=1, world_size=2))
        [[2, 3], [0, 1]]
    """

    def __init__(self, num_samples: int, batch_size: int, rank: int = 0, world_size: int = 1, drop_last: bool = False):
        self.num_samples, self.batch_size, self.rank, self.world_size = num_samples, batch_size, rank, world_size
        full, rest = divmod(num_samples, batch_size)
        self.num_batches = full if drop_last or not rest else full + 1  # of the whole, one-process list

    def __len__(self) -> int:
        return -(-self.num_batches // self.world_size)

    def is_padding(self, step: int) -> bool:
        """True when this process's batch at ``step`` only keeps the collectives in step."""
        return step * self.world_size + self.rank >= self.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(len(self)):
            batch = 0 if self.is_padding(step) else step * self.world_size + self.rank
            start = batch * self.batch_size
            yield list(range(start, min(start + self.batch_size, self.num_samples)))


def length_grouped_indices(lengths: list[int], batch_size: int, mega_batch_mult: int | None = None,
                           generator: torch.Generator | None = None) -> list[int]:
    """A random order in which each run of ``batch_size`` indices has similar lengths (HF's megabatches).

    The indices are shuffled, cut into megabatches of ``mega_batch_mult * batch_size`` (default:
    ``min(n // (4 * batch_size), 50)``, at least 1), each sorted longest first; the longest sample
    of all is swapped to the very front, so an out-of-memory error shows on the first step.

    Args:
        lengths: the length of each sample.
        batch_size: the number of samples that are padded together.
        mega_batch_mult: megabatch size in batches.
        generator: the torch generator of the shuffle.

    Example:
        >>> length_grouped_indices([1, 5, 2, 9], 2, generator=torch.Generator().manual_seed(0))[0]
        3
    """
    if mega_batch_mult is None:
        mega_batch_mult = max(min(len(lengths) // (batch_size * 4), 50), 1)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    size = mega_batch_mult * batch_size
    megabatches = [sorted(order[i : i + size], key=lengths.__getitem__, reverse=True) for i in range(0, len(order), size)]
    longest = max(range(len(megabatches)), key=lambda m: (lengths[megabatches[m][0]], -m))  # first of the longest
    megabatches[0][0], megabatches[longest][0] = megabatches[longest][0], megabatches[0][0]
    return [i for megabatch in megabatches for i in megabatch]


class LengthGroupedSampler(EpochSampler):
    """Samples grouped by length (less padding), still shuffled; deterministic per seed and epoch.

    HF's arguments, plus ``seed``/``rank``/``world_size``. Without a ``generator`` the order of epoch
    ``e`` is drawn from ``Generator().manual_seed(seed + e)``. With several processes the grouping
    is done over the global batch (``batch_size`` should be per-device batch x accumulation x
    processes) and each process takes every ``world_size``-th index, as ``EpochSampler`` does, so
    the processes of one step see samples of similar length.

    Args:
        batch_size: samples padded together (one optimizer step's, over all processes).
        dataset: samples with ``model_input_name`` (default ``input_ids``) to measure; or give ``lengths``.
        lengths: the length of each sample.
        model_input_name: the key measured when ``lengths`` is None.
        generator: a torch generator to draw every epoch from (HF's behaviour); None: ``seed + epoch``.
        seed, rank, world_size: see above.

    Example:
        >>> s = LengthGroupedSampler(2, lengths=[3, 8, 1, 7, 2, 9])
        >>> [[3, 8, 1, 7, 2, 9][i] for i in s][0]
        9
    """

    def __init__(self, batch_size: int, dataset: Any = None, lengths: list[int] | None = None,
                 model_input_name: str | None = None, generator: torch.Generator | None = None, *,
                 seed: int = 0, rank: int = 0, world_size: int = 1):
        if lengths is None:
            if dataset is None:
                raise ValueError("LengthGroupedSampler needs lengths=... or a dataset to measure")
            lengths = sample_lengths(dataset, model_input_name or "input_ids")
        self.lengths = lengths.tolist() if isinstance(lengths, (torch.Tensor, np.ndarray)) else list(lengths)
        super().__init__(len(self.lengths), shuffle=True, seed=seed, rank=rank, world_size=world_size)
        self.batch_size, self.generator = batch_size, generator

    def _order(self) -> list[int]:
        generator = self.generator if self.generator is not None else torch.Generator().manual_seed(self.seed + self.epoch)
        return length_grouped_indices(self.lengths, self.batch_size, generator=generator)


class BatchRebalanceSampler(Sampler[list[int]]):
    """Batches that balance padded-token cost over processes and accumulation steps (transformers 5.24's
    ``train_sampling_strategy="batch_rebalance"``, the same batches for the same seed).

    Each optimizer step takes the next ``effective_batch_size`` indices of the epoch's order (``randperm`` seeded by
    ``seed + epoch``, as ``EpochSampler``), sorts them longest first and cuts them into ``dp_size * grad_accum``
    contiguous groups whose cost ``size * longest + 0.001 * size * longest**2`` (padding plus attention's quadratic
    term) is made near-equal by moving one sample at a time from the dearest group to the cheapest. The groups,
    ranked by cost, are dealt slot by slot: the ``dp_size`` dearest are every process's first micro-batch, the next
    ``dp_size`` the second, ... So a batch of long rows holds few of them, one of short rows many, and the step's
    processes wait little for each other. Every process computes the same groups from the seed (no communication)
    and yields its own ``grad_accum`` micro-batches per step.

    Args:
        lengths: the length (tokens) of each sample.
        effective_batch_size: samples per optimizer step over all processes (per-device batch x accumulation x
            processes).
        dp_size: data-parallel processes.
        grad_accum: micro-batches per optimizer step.
        shuffle: draw each epoch's order (else dataset order).
        seed: base seed; epoch ``e``'s batches depend only on ``seed + e``.
        rank: this process.
        drop_last: leave out the epoch's last, partial step; else it is balanced too (padded by repeating the
            epoch's first samples when it has fewer than ``dp_size * grad_accum`` samples).

    ``set_epoch(epoch, skip)`` starts epoch ``epoch`` after ``skip`` of this process's micro-batches: a resumed run
    balances only the steps it still trains.

    Example:
        >>> s = BatchRebalanceSampler([9, 1, 1, 1, 2, 2], effective_batch_size=6, dp_size=1, grad_accum=2, shuffle=False)
        >>> list(s)
        [[4, 5, 1, 2, 3], [0]]
    """

    QUADRATIC_COST_COEF = 0.001  # weight of attention's O(length**2) work against the linear layers' O(length)

    def __init__(self, lengths: list[int], effective_batch_size: int, dp_size: int, grad_accum: int,
                 shuffle: bool = True, seed: int = 42, rank: int = 0, drop_last: bool = True):
        groups = dp_size * grad_accum
        if dp_size < 1 or grad_accum < 1 or effective_batch_size < groups:
            raise ValueError(
                f"BatchRebalanceSampler(effective_batch_size={effective_batch_size}, dp_size={dp_size}, "
                f"grad_accum={grad_accum}) is invalid: each of the dp_size x grad_accum micro-batches of a step needs "
                "a sample; pass effective_batch_size >= dp_size * grad_accum >= 1"
            )
        self.lengths = lengths.tolist() if isinstance(lengths, (torch.Tensor, np.ndarray)) else list(lengths)
        self.effective_batch_size, self.dp_size, self.grad_accum = effective_batch_size, dp_size, grad_accum
        self.shuffle, self.seed, self.rank, self.drop_last = shuffle, seed, rank, drop_last
        self.batch_size = effective_batch_size // groups  # the mean micro-batch (TrainerDataLoader.batch_size)
        self.epoch, self.skip = 0, 0
        full, rest = divmod(len(self.lengths), effective_batch_size)
        self.steps = full + (1 if rest and not drop_last else 0)  # optimizer steps per epoch

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Draw epoch ``epoch``'s order; leave out this process's first ``skip`` micro-batches."""
        self.epoch, self.skip = epoch, skip

    def __len__(self) -> int:
        return max(self.steps * self.grad_accum - self.skip, 0)

    def __iter__(self) -> Iterator[list[int]]:
        n = len(self.lengths)
        order = (torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
                 if self.shuffle else list(range(n)))
        first_step, first_slot = divmod(self.skip, self.grad_accum)  # trained steps are never balanced again
        for step in range(first_step, self.steps):
            batch = order[step * self.effective_batch_size : (step + 1) * self.effective_batch_size]
            short = self.dp_size * self.grad_accum - len(batch)
            if short > 0:  # a tiny last step: repeat the epoch's first samples so every micro-batch has one
                batch += (order * -(-short // n))[:short]
            slots = self._deal(batch)
            for slot in range(first_slot if step == first_step else 0, self.grad_accum):
                yield slots[slot][self.rank]

    def _cost(self, size: int, longest: int) -> float:
        return size * longest + self.QUADRATIC_COST_COEF * size * longest * longest

    def _deal(self, batch: list[int]) -> list[list[list[int]]]:
        """``[slot][rank]``: the step's indices as balanced groups, dearest groups in the first slot."""
        ranked = sorted(batch, key=self.lengths.__getitem__, reverse=True)  # stable: ties keep the drawn order
        counts = self._balanced_counts([self.lengths[i] for i in ranked])
        starts = [sum(counts[:g]) for g in range(len(counts))]
        groups = [ranked[start : start + count] for start, count in zip(starts, counts)]
        by_cost = sorted(range(len(groups)), key=lambda g: self._group_cost(counts, starts, g, ranked), reverse=True)
        d = self.dp_size
        return [[groups[g] for g in by_cost[slot * d : (slot + 1) * d]] for slot in range(self.grad_accum)]

    def _group_cost(self, counts: list[int], starts: list[int], g: int, ranked: list[int]) -> float:
        return self._cost(counts[g], self.lengths[ranked[starts[g]]]) if counts[g] else 0.0

    def _balanced_counts(self, longest_first: list[int]) -> list[int]:
        """Sizes of the contiguous groups of ``longest_first`` (lengths, longest first) with near-equal cost.

        Hill climbing: each round moves one sample from the dearest group still in play to the cheapest. A dearest
        group of one sample cannot shrink: its slot (the ``dp_size`` groups of its cost rank) is first topped up from
        cheaper groups outside it, up to its cost, then taken out of play. Stops at a repeated state, at equal costs,
        or after ``max(30 K, n)`` rounds, and returns the state of least spread seen.
        """
        n, k = len(longest_first), self.dp_size * self.grad_accum
        counts = [n // k + (1 if g < n % k else 0) for g in range(k)]

        def costs_of(sizes: list[int]) -> list[float]:
            out, start = [], 0
            for size in sizes:
                out.append(self._cost(size, longest_first[start]) if size else 0.0)
                start += size
            return out

        frozen: set[int] = set()
        seen: set[tuple[int, ...]] = set()
        best, best_spread = list(counts), float("inf")
        for _ in range(max(30 * k, self.effective_batch_size)):
            if tuple(counts) in seen:  # a cycle: no move improves any more
                break
            seen.add(tuple(counts))
            costs = costs_of(counts)
            active = [g for g in range(k) if g not in frozen]
            if len(active) <= 1:
                break
            dearest = max(active, key=costs.__getitem__)
            cheapest = min(active, key=costs.__getitem__)
            if costs[dearest] - costs[cheapest] < best_spread:
                best_spread, best = costs[dearest] - costs[cheapest], list(counts)
            if costs[dearest] == costs[cheapest]:
                break
            if counts[dearest] > 1:
                counts[dearest] -= 1
                counts[cheapest] += 1
            else:
                self._top_up_and_freeze(counts, costs, dearest, frozen, longest_first, costs_of)
        return best

    def _top_up_and_freeze(self, counts: list[int], costs: list[float], dearest: int, frozen: set[int],
                           longest_first: list[int], costs_of: Callable[[list[int]], list[float]]) -> None:
        """Take ``dearest``'s slot out of play, after giving its other groups samples of cheaper groups outside it
        while each stays at most ``dearest``'s cost (the slot's peak does not grow; the rest gets cheaper)."""
        rank_of_cost = sorted(range(len(costs)), key=costs.__getitem__, reverse=True)
        start = rank_of_cost.index(dearest) // self.dp_size * self.dp_size
        slot = set(rank_of_cost[start : start + self.dp_size])
        cap = costs[dearest]
        for g in slot:  # a set's order, as transformers iterates it (the top-ups depend on the order)
            if g in frozen or g == dearest:
                continue
            while True:
                now = costs_of(counts)
                first = sum(counts[:g])
                longest = longest_first[first] if counts[g] else 0
                if self._cost(counts[g] + 1, longest) > cap:
                    break
                donors = [d for d in range(len(counts)) if d not in frozen and d not in slot and counts[d] > 1]
                if not donors:
                    break
                donor = min(donors, key=now.__getitem__)
                counts[g] += 1
                counts[donor] -= 1
        frozen.update(slot)


def sample_lengths(dataset: Any, key: str, length_column: str | None = None) -> list[int]:
    """The length of every sample: a precomputed ``length_column`` if the dataset has one, else ``len(sample[key])``.

    A Hugging Face ``datasets.Dataset`` is read column-wise (fast); other datasets sample by sample.
    """
    columns = _hf_columns(dataset)
    if columns is not None:
        if length_column in columns:
            return list(dataset[length_column])
        if key in columns:
            return [len(v) for v in dataset[key]]
    first = _as_mapping(dataset[0])
    if not isinstance(first, Mapping) or (key not in first and length_column not in first):
        raise ValueError(
            f"group_by_length needs the length of each sample: the samples have no '{key}' field"
            + (f" and no '{length_column}' column" if length_column else "")
            + f" (sample 0 is {type(first).__name__}{' with keys ' + str(sorted(first)) if isinstance(first, Mapping) else ''}); "
            "add a length column (length_column_name) or an input_ids field"
        )
    name = length_column if length_column in first else key
    lengths = []
    for i in range(len(dataset)):
        value = _as_mapping(dataset[i])[name]
        lengths.append(int(value) if name == length_column else len(value))
    return lengths


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


# ---------------------------------------------------------------- collators


def _as_mapping(sample: Any) -> Any:
    """HF's rule: a dataclass or plain object sample (e.g. ``InputFeatures``) is read as its fields."""
    if isinstance(sample, Mapping) or isinstance(sample, (tuple, list, torch.Tensor, np.ndarray)):
        return sample
    return vars(sample) if hasattr(sample, "__dict__") else sample


class BadRowError(ValueError):
    """A sample a default collator cannot take (None, text, a non-dict among dicts), at ``position`` in its batch;
    the Trainer's ``NamedRows`` says which dataset and which of its rows."""

    def __init__(self, message: str, position: int, row: Any):
        super().__init__(message)
        self.position, self.row = position, row


def _row_kind(row: Any) -> str:
    return "None" if row is None else f"a {type(row).__name__} ({row!r:.40})"


def _is_bad_row(row: Any, among_dicts: bool) -> bool:
    """What a default collator cannot take: None, text (torch would hand the strings to forward as arguments),
    or, in a batch of dicts, anything that cannot be read as one."""
    if row is None or isinstance(row, (str, bytes)):
        return True
    return among_dicts and not isinstance(row, Mapping) and not isinstance(_as_mapping(row), Mapping)


def _what_a_row_is(row: Any) -> str:
    if isinstance(row, (str, bytes)):
        return ("the default collators stack dicts of numbers, not text: tokenize the dataset first (e.g. "
                "dataset.map(lambda r: tokenizer(r['text']))), or pass a data_collator that tokenizes the text")
    return ("a row must be a dict of inputs such as {'input_ids': [...], 'labels': ...} (or a tuple of tensors); "
            "drop the empty rows from the dataset, or pass a data_collator that takes them")


def _check_rows(features: list) -> None:
    """Every sample is one the default collators can take; else a ``BadRowError`` naming it (a few isinstance
    checks per batch)."""
    among_dicts = isinstance(features[0], Mapping)
    for i, row in enumerate(features):
        if _is_bad_row(row, among_dicts):
            raise BadRowError(f"sample {i} of the batch is {_row_kind(row)}: {_what_a_row_is(row)}", i, row)


def dataset_name(description: str | None) -> str:
    """The argument a dataloader's data came from, for messages: ``"training"`` -> ``train_dataset``."""
    return {"training": "train_dataset", "evaluation": "eval_dataset", "test": "test_dataset"}.get(
        description, f"the {description} dataset" if description else "the dataset")


class NamedRows:
    """The Trainer's collator, whose errors about a bad sample name the dataset and its row.

    A ``BadRowError`` of the default collators (None, text, a non-dict among dicts) becomes one naming the
    dataset and the index of its first such row (found by reading rows in order, on the error only, up to
    ``scan`` of them; a copy sent to a worker process does not carry the dataset and names the batch position).

    Args:
        collator: the collator.
        dataset: the map-style dataset the batches come from (None: a stream).
        description: ``"training"``, ``"evaluation"`` or ``"test"``.
    """

    scan = 10_000

    def __init__(self, collator: Callable, dataset: Any, description: str | None):
        self.collator, self.dataset, self.description = collator, dataset, description

    def __getstate__(self) -> dict:
        return {**self.__dict__, "dataset": None}  # workers get the dataset once, from the DataLoader

    def __call__(self, features: list) -> Any:
        try:
            return self.collator(features)
        except BadRowError as error:
            raise ValueError(self._named(error, isinstance(features[0], Mapping))) from None

    def _named(self, error: BadRowError, among_dicts: bool) -> str:
        name, index = dataset_name(self.description), None
        if self.dataset is not None and hasattr(self.dataset, "__len__"):
            index = next((j for j in range(min(len(self.dataset), self.scan))
                          if _is_bad_row(self.dataset[j], among_dicts)), None)
        row = error.row if index is None else self.dataset[index]
        where = f"row {index}" if index is not None else f"a row (sample {error.position} of a batch)"
        return f"{name} {where} is {_row_kind(row)}: {_what_a_row_is(row)}"


def _check_same_keys(features: list[Mapping]) -> None:
    """Every sample of a batch has the keys of the first; else an error naming the sample and the keys."""
    keys = features[0].keys()
    for i, f in enumerate(features[1:], start=1):
        if f.keys() != keys:
            missing, extra = sorted(set(keys) - set(f)), sorted(set(f) - set(keys))
            raise ValueError(
                f"sample {i} of the batch has different keys from sample 0 (missing {missing}, extra {extra}): every "
                "sample must have the same fields; fix the dataset's __getitem__ or drop the field in a collator"
            )


def _field_error(key: str, values: list, error: Exception) -> ValueError:
    """Why the values of one field cannot become one tensor, naming the field and the first odd sample."""
    for i, v in enumerate(values):
        if isinstance(v, str) or (isinstance(v, (list, tuple)) and any(isinstance(x, str) for x in v)):
            return ValueError(
                f"field '{key}' of sample {i} of the batch holds text ({v!r:.60}), not numbers: tokenize it in the "
                "dataset, or drop the field (remove_unused_columns=True drops fields the model does not accept)"
            )
    shapes = [tuple(np.shape(v)) for v in values]
    for i, shape in enumerate(shapes):
        if shape != shapes[0]:
            return ValueError(
                f"field '{key}': sample {i} of the batch has shape {shape} but sample 0 has {shapes[0]}, so they cannot "
                "be stacked; pad them with a padding collator (data_collator=DataCollatorWithPadding(tokenizer) or "
                "processing_class=tokenizer), or make the samples the same size"
            )
    return ValueError(f"cannot stack field '{key}' into a batch tensor: {error}")


def _to_tensor(key: str, values: list, dtype: torch.dtype | None = None) -> torch.Tensor:
    first = values[0]
    try:
        if isinstance(first, torch.Tensor):
            return torch.stack(values)
        if isinstance(first, np.ndarray):
            return torch.from_numpy(np.stack(values))
        return torch.tensor(values, dtype=dtype)
    except (ValueError, RuntimeError, TypeError) as e:
        raise _field_error(key, values, e) from e


def _labels(key: str, values: list) -> torch.Tensor:
    """HF's label types: ``label`` ids become int64 (float32 for other numbers); ``label_ids`` keep a
    tensor's dtype, and a list's type follows its first element."""
    first = values[0]
    if key == "label_ids" and isinstance(first, (torch.Tensor, np.ndarray)):
        return _to_tensor(key, values)
    probe = first.reshape(-1)[0].item() if isinstance(first, (torch.Tensor, np.ndarray)) and np.size(first) else first
    if isinstance(probe, (list, tuple)):
        probe = probe[0] if probe else 0
    is_int = isinstance(probe, (int, np.integer))  # bool is an int here, as in HF
    dtype = torch.long if is_int else torch.float
    return _to_tensor(key, values).to(dtype) if isinstance(first, (torch.Tensor, np.ndarray)) else _to_tensor(key, values, dtype)


def default_data_collator(features: list, return_tensors: str = "pt") -> Any:
    """Stack a list of samples (dicts of tensors, arrays, numbers or lists) into one batch dict.

    HF's rules: ``label`` and ``label_ids`` become ``labels`` (int64 for integer ids, float32
    otherwise); fields that are ``None`` or strings in the first sample are left out. Samples that
    are dataclasses are read as their fields; tuples and tensors go through torch's ``default_collate``.

    Args:
        features: the samples of one batch.
        return_tensors: only ``"pt"`` (HF's other values are for TensorFlow/numpy pipelines).

    Returns:
        a dict of tensors (or the ``default_collate`` result for non-dict samples).

    Example:
        >>> default_data_collator([{"x": [1, 2], "label": 0}, {"x": [3, 4], "label": 1}])["labels"]
        tensor([0, 1])
    """
    if return_tensors != "pt":
        raise ValueError(f"default_data_collator(return_tensors={return_tensors!r}): cadence collates to torch tensors only; pass 'pt'")
    _check_rows(features)
    if not isinstance(features[0], Mapping):
        features = [_as_mapping(f) for f in features]
        if not isinstance(features[0], Mapping):
            return torch.utils.data.default_collate(features)
    _check_same_keys(features)
    batch: dict[str, Any] = {}
    for key, value in features[0].items():
        if value is None or isinstance(value, str):
            continue
        values = [f[key] for f in features]
        if key in ("label", "label_ids"):
            if "labels" in batch:
                continue  # HF keeps the first label field only
            batch["labels"] = _labels(key, values)
        else:
            batch[key] = _to_tensor(key, values)
    return batch


class DefaultDataCollator:
    """The class form of ``default_data_collator`` (HF's ``DefaultDataCollator``).

    Example:
        >>> DefaultDataCollator()([{"x": 1.0}, {"x": 2.0}])["x"]
        tensor([1., 2.])
    """

    def __init__(self, return_tensors: str = "pt"):
        self.return_tensors = return_tensors

    def __call__(self, features: list, return_tensors: str | None = None) -> Any:
        return default_data_collator(features, return_tensors or self.return_tensors)


def _longest(lengths: list[int], max_length: int | None) -> int:
    return max(lengths)


def _to_max_length(lengths: list[int], max_length: int | None) -> int:
    if max_length is None:
        raise ValueError("DataCollatorWithPadding(padding='max_length') needs max_length=...")
    return max(max_length, max(lengths))


# padding strategy -> the length a batch is padded to (before rounding up to pad_to_multiple_of)
_PAD_LENGTH: dict[Any, Callable[[list[int], int | None], int]] = {
    True: _longest, "longest": _longest, "max_length": _to_max_length,
}


class DataCollatorWithPadding:
    """Pad the sequence fields of a batch to its longest sample (HF's dynamic padding).

    ``input_ids`` (and the tokenizer's main input) take ``pad_token_id``, labels -100 (the loss
    ignores them), ``attention_mask`` and other fields 0, ``special_tokens_mask`` 1. With a tokenizer
    whose ``model_input_names`` include ``attention_mask``, a missing mask is created, as
    ``tokenizer.pad`` does. The tokenizer's ``padding_side`` is respected.

    Args:
        tokenizer: anything with ``pad_token_id`` (a ``transformers`` tokenizer works), or None.
        padding: ``True``/``"longest"`` (the longest sample), ``"max_length"`` (``max_length``), or
            ``False``/``"do_not_pad"`` (stack as they are).
        max_length: the length for ``padding="max_length"``.
        pad_to_multiple_of: round the padded length up to a multiple of this (helps kernels and compile).
        return_tensors: only ``"pt"``.
        pad_token_id: the id of padded input positions when there is no tokenizer.

    Example:
        >>> c = DataCollatorWithPadding(pad_token_id=0)
        >>> c([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}])["input_ids"].tolist()
        [[5, 6, 7], [8, 0, 0]]
    """

    def __init__(self, tokenizer: Any = None, padding: bool | str = True, max_length: int | None = None,
                 pad_to_multiple_of: int | None = None, return_tensors: str = "pt", *, pad_token_id: int | None = None):
        if tokenizer is None and pad_token_id is None:
            raise ValueError("DataCollatorWithPadding needs a pad id: pass pad_token_id=... or a tokenizer with pad_token_id set")
        padding = getattr(padding, "value", padding)  # HF's PaddingStrategy enum
        if padding not in (*_PAD_LENGTH, False, "do_not_pad"):
            raise ValueError(f"DataCollatorWithPadding(padding={padding!r}): pass True, 'longest', 'max_length' or False")
        if return_tensors != "pt":
            raise ValueError(f"DataCollatorWithPadding(return_tensors={return_tensors!r}): cadence collates to torch tensors only; pass 'pt'")
        self.tokenizer, self.padding, self.max_length = tokenizer, padding, max_length
        self.pad_to_multiple_of, self.return_tensors = pad_to_multiple_of, return_tensors
        self.pad_token_id = pad_token_id if pad_token_id is not None else getattr(tokenizer, "pad_token_id", None)
        names = list(getattr(tokenizer, "model_input_names", None) or ["input_ids"])
        self.main_input = names[0]
        self.make_attention_mask = tokenizer is not None and "attention_mask" in names
        self.left = getattr(tokenizer, "padding_side", "right") == "left"

    def _pad_value(self, key: str) -> int:
        if key in LABEL_COLUMNS:
            return IGNORE_INDEX
        if key in ("input_ids", self.main_input):
            if self.pad_token_id is None:
                raise ValueError(
                    f"the samples of this batch have different lengths but {type(self.tokenizer).__name__} has no "
                    "pad_token_id: set one (e.g. tokenizer.pad_token = tokenizer.eos_token) or pass pad_token_id=..."
                )
            return self.pad_token_id
        if key == "token_type_ids":
            return getattr(self.tokenizer, "pad_token_type_id", 0)
        return 1 if key == "special_tokens_mask" else 0

    def __call__(self, features: list[Mapping]) -> dict[str, Any]:
        _check_rows(features)
        if not isinstance(features[0], Mapping):
            features = [_as_mapping(f) for f in features]
        if self.padding in (False, "do_not_pad"):
            return default_data_collator(features)
        _check_same_keys(features)
        first = features[0]
        if self.make_attention_mask and "attention_mask" not in first and self.main_input in first:
            features = [{**f, "attention_mask": [1] * len(f[self.main_input])} for f in features]
        batch: dict[str, Any] = {}
        for key, value in features[0].items():
            if value is None or isinstance(value, str):
                continue
            name = "labels" if key in ("label", "label_ids") else key
            if name in batch:
                continue
            try:
                rows = [torch.as_tensor(f[key]) for f in features]
            except (ValueError, RuntimeError, TypeError) as e:
                raise _field_error(key, [f[key] for f in features], e) from e
            if rows[0].dim() == 0:
                batch[name] = _to_tensor(key, rows)
                continue
            batch[name] = self._pad(key, rows)
        return batch

    def _pad(self, key: str, rows: list[torch.Tensor]) -> torch.Tensor:
        lengths = [r.shape[0] for r in rows]
        if len(set(lengths)) == 1 and self.padding != "max_length" and not self.pad_to_multiple_of:
            return _to_tensor(key, rows)  # nothing to pad (and no pad id needed)
        length = _PAD_LENGTH[self.padding](lengths, self.max_length)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        tail = rows[0].shape[1:]
        for i, r in enumerate(rows):
            if r.dim() == 0 or r.shape[1:] != tail:
                raise ValueError(
                    f"field '{key}': sample {i} of the batch has shape {tuple(r.shape)} but sample 0 has "
                    f"{tuple(rows[0].shape)}; only the first dimension can be padded"
                )
        padded = torch.full((len(rows), length, *tail), self._pad_value(key), dtype=rows[0].dtype)
        for i, r in enumerate(rows):
            if self.left:
                padded[i, length - r.shape[0]:] = r
            else:
                padded[i, : r.shape[0]] = r
        return padded


def _is_default_collator(collator: Callable) -> bool:
    return isinstance(collator, (DataCollatorWithPadding, DefaultDataCollator)) or collator is default_data_collator


def _refuse_text_inputs(sample: Mapping, accepted: set[str], collator: Callable, description: str | None) -> None:
    """A model argument holding text would be left out by cadence's collators (which skip strings, as
    HF's do) and the model would then miss it: say so before the first step."""
    if not _is_default_collator(collator):
        return  # a custom collator may tokenize text itself
    for key, value in sample.items():
        if key in accepted and isinstance(value, str):
            where = f" of the {description} dataset" if description else ""
            raise ValueError(
                f"field '{key}'{where} holds text ({value!r:.40}) but is an input of the model, which needs tensors: "
                "tokenize the dataset first (e.g. dataset.map(lambda r: tokenizer(r['text']))), or pass a "
                "data_collator that turns the text into tensors"
            )


def _hf_columns(dataset: Any) -> list[str] | None:
    """The column names of a Hugging Face ``datasets`` dataset (None for other datasets or unknown columns)."""
    hf = sys.modules.get("datasets")  # an instance implies the module is loaded: no import needed
    if hf is None or not isinstance(dataset, (hf.Dataset, hf.IterableDataset)):
        return None
    return dataset.column_names  # None for a stream whose features are not known yet


def drop_unused_columns(dataset: Any, collator: Callable, accepted: set[str] | None, model_name: str,
                        description: str | None = None) -> tuple[Any, Callable]:
    """Remove the columns the model does not accept: from a ``datasets`` dataset with its column API,
    else in the collator (map-style dict datasets are checked now, on their first sample).

    Args:
        dataset: the dataset.
        collator: the data collator.
        accepted: the names to keep (see ``forward_arguments``); None keeps everything.
        model_name, description: for the log line and errors.

    Returns:
        ``(dataset, collator)``, either of them replaced when columns are dropped.
    """
    if accepted is None:
        return dataset, collator
    columns = _hf_columns(dataset)
    if columns is not None:
        dropped = check_columns(columns, accepted, model_name, description)
        features = getattr(dataset, "features", None) or {}
        _refuse_text_inputs({c: "<a string column>" for c in columns if getattr(features.get(c), "dtype", None) == "string"},
                            set(columns) - set(dropped), collator, description)
        return (dataset.remove_columns(dropped) if dropped else dataset), collator
    if not is_iterable_dataset(dataset) and len(dataset) == 0:  # an empty eval set: no rows, no columns to drop
        return dataset, collator
    # the dataset is never read early (transformers reads none of it before the first batch): a __getitem__ that
    # draws from `random` gets transformers' draws; the columns are checked on the first batch
    return dataset, ColumnsDroppedInCollator(collator, accepted, model_name, description)


class ColumnsDroppedInCollator(RemoveColumnsCollator):
    """transformers' ``RemoveColumnsCollator`` (the unused keys dropped per batch, logged at the first), which also
    refuses, at the first batch, text in a model input that a default collator would silently leave out; once the
    first batch shows nothing to drop, the samples go to the collator as they are.

    Example:
        >>> collate = ColumnsDroppedInCollator(default_data_collator, {"x"}, "Model", "training")
        >>> collate([{"x": 1, "id": "a"}])
        {'x': tensor([1])}
    """

    def __init__(self, collator: Callable, accepted: set[str], model_name: str, description: str | None):
        super().__init__(collator, accepted, logger, model_name, description)
        self.nothing_to_drop = False

    def __call__(self, features: list) -> Any:
        if self.nothing_to_drop:
            return self.data_collator(features)
        first = features[0]
        if not self.checked and first is not None:  # a None row goes on to the collator, which names it
            if isinstance(_as_mapping(first), Mapping):
                _refuse_text_inputs(_as_mapping(first), self.keep, self.data_collator, self.description)
            # only dict samples lose keys (as in transformers); a dataclass or tuple goes on as it is
            self.nothing_to_drop = not isinstance(first, Mapping) or all(k in self.keep for k in first)
            if self.nothing_to_drop:
                return self.data_collator(features)
        return super().__call__(features)


def _peft_base(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model inside a PEFT-style wrapper (``get_base_model()`` or ``base_model.model``), else None."""
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        return get_base()
    return getattr(getattr(model, "base_model", None), "model", None)


def forward_arguments(model: torch.nn.Module) -> set[str] | None:
    """Names ``model.forward`` accepts, plus the label columns; None when it takes ``**kwargs`` only.

    Looks through PEFT-style wrappers (``get_base_model()``, ``base_model.model``) to the model that
    names its inputs, as HF does.

    Example:
        >>> sorted(forward_arguments(torch.nn.Linear(1, 1)))
        ['input', 'label', 'label_ids', 'labels']
    """
    for candidate in (_peft_base(model), model):
        if candidate is None:
            continue
        params = inspect.signature(candidate.forward).parameters
        named = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if named:
            return named | set(LABEL_COLUMNS)
    return None


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


class ShardSampler(Sampler[int]):
    """Dataset order, sharded batch by batch: of every ``batch_size * num_processes`` indices, process ``p``
    takes the ``p``-th run of ``batch_size``; the order is completed by wrapping around so every process
    gets whole batches (transformers' evaluation sampler). Without ``drop_last`` the last global batch is
    completed from the start; with it, dropped.

    Example:
        >>> list(ShardSampler(range(10), batch_size=2, num_processes=2, process_index=1))
        [2, 3, 6, 7, 0, 1]
    """

    def __init__(self, dataset: Any, batch_size: int = 1, drop_last: bool = False, num_processes: int = 1,
                 process_index: int = 0):
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.num_processes, self.process_index = num_processes, process_index
        self.total_batch_size = batch_size * num_processes
        full, rest = divmod(len(dataset), self.total_batch_size)
        self.total_num_samples = (full if drop_last or not rest else full + 1) * self.total_batch_size

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        order = [i % n for i in range(self.total_num_samples)]  # wraps around, as often as a tiny dataset needs
        for start in range(self.process_index * self.batch_size, self.total_num_samples, self.total_batch_size):
            yield from order[start : start + self.batch_size]

    def __len__(self) -> int:
        return self.total_num_samples // self.num_processes


def _distributed_defaults(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """The process group's world size and rank for the ones not given (it must then be started)."""
    if num_replicas is None or rank is None:
        group = process_group_size_and_rank()
        if group is None:
            raise ValueError("num_replicas and rank are needed when no process group is initialised; pass both")
        num_replicas = group[0] if num_replicas is None else num_replicas
        rank = group[1] if rank is None else rank
    return num_replicas, rank


class DistributedSamplerWithLoop(torch.utils.data.DistributedSampler):
    """torch's ``DistributedSampler`` whose share is completed to a multiple of ``batch_size`` by looping
    back over the share's start (its first index skipped when it was itself a wrap-around repeat);
    transformers' signature ``(dataset, batch_size, **kwargs)``."""

    def __init__(self, dataset: Any, batch_size: int, **kwargs: Any):
        super().__init__(dataset, **kwargs)
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[int]:
        share = list(super().__iter__())
        missing = -len(share) % self.batch_size
        wrapped = 1 if self.rank < len(self.dataset) % self.num_replicas else 0  # torch padded this share with a repeat
        return iter(share + share[wrapped : wrapped + missing])


class DistributedLengthGroupedSampler(LengthGroupedSampler):
    """``LengthGroupedSampler`` with transformers' distributed signature: grouped by length over megabatches
    of ``batch_size``, shuffled with ``seed + epoch``, process ``rank`` taking every ``num_replicas``-th
    index; ``drop_last`` drops the tail that does not divide evenly instead of repeating samples.

    Example:
        >>> s = DistributedLengthGroupedSampler(2, lengths=[3, 8, 1, 7, 2, 9], num_replicas=2, rank=0)
        >>> len(s)
        3
    """

    def __init__(self, batch_size: int, dataset: Any = None, num_replicas: int | None = None, rank: int | None = None,
                 seed: int = 0, drop_last: bool = False, lengths: list[int] | None = None,
                 model_input_name: str | None = None):
        if dataset is None and lengths is None:
            raise ValueError("DistributedLengthGroupedSampler needs lengths=... or a dataset to measure")
        num_replicas, rank = _distributed_defaults(num_replicas, rank)
        super().__init__(batch_size, dataset, lengths, model_input_name, seed=seed, rank=rank, world_size=num_replicas)
        self.num_replicas, self.drop_last = num_replicas, drop_last
        n = len(self.lengths)
        self.num_samples = -(-(n - num_replicas) // num_replicas) if drop_last and n % num_replicas else -(-n // num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __len__(self) -> int:
        return max(self.num_samples - self.skip, 0)

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        order = (order + order[: self.total_size - len(order)]) if self.total_size > len(order) else order[: self.total_size]
        return iter(order[self.rank : self.total_size : self.num_replicas][self.skip :])


def shard_sampler(sampler: Sampler, batch_size: int, drop_last: bool, rank: int, world_size: int,
                  even_batches: bool = True) -> Sampler:
    """A sampler that is not cadence's (a subclass's ``_get_train_sampler``: TRL's ``RepeatSampler``) as one
    data-parallel rank's batches, dealt as accelerate deals a transformers Trainer's: the sampler's indices cut
    into batches of ``batch_size``, rank ``r`` taking batches ``r, r + world_size, ...`` (``BatchSamplerShard``).
    Its ``set_epoch`` is still called each epoch (:func:`set_epoch`); a resume reads the trained batches again."""
    batches = torch.utils.data.BatchSampler(sampler, batch_size, drop_last)
    return shard_batch_sampler(batches, world_size, rank, even_batches)


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


# ---------------------------------------------------------------- token counting


class TokenCounter:
    """Input tokens trained on (``include_num_input_tokens_seen``); summed without a host sync per step.

    ``"all"`` counts every position of the main input (its shape: free); ``"non_padding"`` counts
    the ``attention_mask`` ones, else positions that are not ``pad_token_id``, on the device.

    Args:
        mode: ``"no"``, ``"all"`` or ``"non_padding"``.
        main_input_name: the key of the token ids (``model.main_input_name``, default ``input_ids``).
        pad_token_id: the padding id, for ``"non_padding"`` without an attention mask.

    Example:
        >>> c = TokenCounter("all")
        >>> c.add({"input_ids": torch.ones(2, 3)})
        >>> int(c.total())
        6
    """

    def __init__(self, mode: str, main_input_name: str = "input_ids", pad_token_id: int | None = None):
        self.mode, self.key, self.pad_token_id = mode, main_input_name, pad_token_id
        self.host = 0  # counts known from shapes
        self.device: torch.Tensor | None = None  # counts that need the data; stays on its device
        self.warned = False

    def add(self, inputs: Any) -> None:
        if self.mode == "no":
            return
        ids = inputs.get(self.key) if isinstance(inputs, Mapping) else None
        if ids is None:
            if not self.warned:
                self.warned = True
                logger.warning("include_num_input_tokens_seen: the batches have no '%s' to count; set "
                               "model.main_input_name to the key of the token ids", self.key)
            return
        mask = inputs.get("attention_mask")
        if self.mode == "non_padding" and (mask is not None or self.pad_token_id is not None):
            count = mask.sum() if mask is not None else ids.ne(self.pad_token_id).sum()
            self.device = count if self.device is None else self.device + count
        else:
            if self.mode == "non_padding" and not self.warned:
                self.warned = True
                logger.warning("include_num_input_tokens_seen='non_padding': the batches have no attention_mask and "
                               "there is no pad_token_id, so every token is counted")
            self.host += ids.numel()

    def total(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The count so far as an int64 tensor on ``device`` (reading it is the host sync)."""
        total = torch.tensor(self.host, dtype=torch.long, device=device)
        return total if self.device is None else total + self.device.to(device, torch.long)


def batch_tokens(inputs: Any, main_input_name: str = "input_ids") -> int:
    """Positions of the main input (its ``numel``), else the batch size: the "tokens" of a FLOP estimate."""
    if isinstance(inputs, Mapping):
        ids = inputs.get(main_input_name)
        if torch.is_tensor(ids):
            return ids.numel()
        values = inputs.values()
    else:
        values = inputs if isinstance(inputs, (tuple, list)) else [inputs]
    first = next((v for v in values if torch.is_tensor(v) and v.dim() > 0), None)
    return first.shape[0] if first is not None else 0


# ---------------------------------------------------------------- micro-batches


def _batch_size(batch: Any) -> int | None:
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else [batch]
    return next((v.shape[0] for v in values if torch.is_tensor(v) and v.dim() > 0), None)


def _split(value: Any, size: int, rows: int) -> list:
    """``value`` cut along its first dimension into pieces of ``rows`` (the last shorter) when it is per-sample,
    else repeated once per piece."""
    parts = -(-size // rows)
    if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == size:
        return list(value.split(rows))
    if isinstance(value, list) and len(value) == size:
        return [value[i * rows : (i + 1) * rows] for i in range(parts)]
    return [value] * parts


def split_batches(batches: list, rows: int | None) -> list:
    """Each collated batch cut into micro-batches of at most ``rows`` samples (auto_find_batch_size).

    The samples, their order and their padding stay the same, so the step's loss and gradients do
    too (the loss is weighted by items). ``rows=None``: the batches as they are.

    Example:
        >>> [b["x"].tolist() for b in split_batches([{"x": torch.arange(5)}], 3)]
        [[0, 1, 2], [3, 4]]
    """
    if rows is None:
        return batches
    out = []
    for batch in batches:
        size = _batch_size(batch)
        if size is None:
            raise ValueError("auto_find_batch_size needs batches with a tensor of samples to split, got "
                             f"{type(batch).__name__}")
        if size <= rows:
            out.append(batch)
        elif isinstance(batch, Mapping):
            pieces = {k: _split(v, size, rows) for k, v in batch.items()}
            out += [{k: p[i] for k, p in pieces.items()} for i in range(-(-size // rows))]
        elif isinstance(batch, (tuple, list)):
            pieces = [_split(v, size, rows) for v in batch]
            out += [type(batch)(p[i] for p in pieces) for i in range(-(-size // rows))]
        else:
            out += list(batch.split(rows))
    return out


# ---------------------------------------------------------------- item counting


def count_items(labels: torch.Tensor, shifted: bool) -> torch.Tensor:
    """Labels that enter the loss: ``!= -100``, and for causal LMs (which shift) not position 0."""
    if shifted:
        labels = labels[..., 1:]
    return labels.ne(IGNORE_INDEX).sum()


def batch_items(batch: Any, shifted: bool) -> torch.Tensor | None:
    """Items of one batch, the one rule training and evaluation share: its ``shift_labels`` (already
    shifted, so every position counts) when it has them, else its ``labels`` (``shifted``: a causal
    LM, whose label 0 never counts). None when the batch is not a mapping or carries no labels.

    Any ``Mapping`` counts (``BatchEncoding``, ``UserDict``), not only ``dict``.
    """
    if not isinstance(batch, Mapping):
        return None
    if torch.is_tensor(batch.get("shift_labels")):
        return count_items(batch["shift_labels"], False)
    labels = batch.get("labels")
    return count_items(labels, shifted) if torch.is_tensor(labels) else None


def loss_shifts_labels(model: torch.nn.Module) -> bool:
    """True for causal LMs, whose loss compares position i with label i+1 (so label 0 never counts).

    A model says so with ``shifts_labels = True``; ``transformers`` causal LMs say it with
    ``loss_type == "ForCausalLM"`` (encoder-decoders excluded: their labels are not shifted).
    """
    flag = getattr(model, "shifts_labels", None)
    if flag is not None:
        return bool(flag)
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    try:
        loss_type = getattr(model, "loss_type", None)
    except Exception:  # some HF models compute loss_type from a config that may be incomplete
        return False
    if loss_type is None:  # older architectures (GPT2LMHeadModel, ...) have none and fall back to the causal-LM loss
        name = type(model).__name__
        return name.endswith(("ForCausalLM", "LMHeadModel"))
    return loss_type == "ForCausalLM"


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


__all__ = [
    "TrainerDataLoader",
    "LookAhead",
    "EpochSampler",
    "EvalBatchSampler",
    "LengthGroupedSampler",
    "BatchRebalanceSampler",
    "length_grouped_indices",
    "default_data_collator",
    "DefaultDataCollator",
    "DataCollatorWithPadding",
    "RemoveColumnsCollator",
    "NamedRows",
    "drop_unused_columns",
    "forward_arguments",
    "IterableShard",
    "IterableDatasetShard",
    "ShardSampler",
    "DistributedSamplerWithLoop",
    "DistributedLengthGroupedSampler",
    "TokenCounter",
    "split_batches",
    "batch_items",
    "count_items",
    "loss_shifts_labels",
    "check_dataset",
    "Dataset",
    "DataLoader",
]


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
