"""Samplers: the seeded epoch order, length-grouped and rebalanced batches, evaluation and per-rank shards."""


from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from ..runtime.processes import process_group_size_and_rank, shard_batch_sampler

from .collators import _as_mapping
from .columns import _hf_columns


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
