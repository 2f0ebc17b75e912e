"""The Trainer's samplers and DataLoaders, assembled from its arguments.

``train_sampler`` picks the training order (``train_sampling_strategy``); ``build_dataloader`` puts a dataset, its
collator and a sampler together with the arguments' worker, pinning and sharding options: evaluation in dataset order
over processes, a stream cut per process, a subclass's own sampler sharded per data-parallel rank. The Trainer's
transformers-named methods (``_get_train_sampler``, ``_get_dataloader``, ``get_train_dataloader``, ...) delegate here.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from torch.utils.data import Sampler

from .collators import NamedRows
from .loaders import TrainerDataLoader, init_worker, is_iterable_dataset
from .samplers import (BatchRebalanceSampler, EpochSampler, EvalBatchSampler, LengthGroupedSampler, sample_lengths,
                       shard_sampler)
from .streams import IterableShard


def train_sampler(dataset: Any, args: Any, input_name: str, global_batch: int, rank: int, world_size: int
                  ) -> Sampler | None:
    """The training sampler: shuffled per epoch (``EpochSampler``), in order, or grouped by length.

    Args:
        dataset: the training dataset (a stream gets None: the DataLoader's own order, as transformers).
        args: the run's ``TrainingArguments`` (``train_sampling_strategy``, the seeds, ``length_column_name``).
        input_name: the model's first input name (the length of a row, without a length column).
        global_batch: samples per optimizer step over all data-parallel ranks.
        rank: this process's data-parallel rank; world_size: the number of data-parallel ranks (the processes of a
            tensor-parallel group read the same batches).

    Example:
        >>> train_sampler(range(10), args, "input_ids", 8, 0, 1)
        <cadence.data.samplers.EpochSampler ...>
    """
    if is_iterable_dataset(dataset):
        return None
    seed = args.data_seed if args.data_seed is not None else args.seed
    if args.train_sampling_strategy == "group_by_length":
        lengths = sample_lengths(dataset, input_name, args.length_column_name)
        return LengthGroupedSampler(global_batch, lengths=lengths, seed=seed, rank=rank, world_size=world_size)
    if args.train_sampling_strategy == "batch_rebalance":  # micro-batches of balanced cost: a batch sampler
        lengths = sample_lengths(dataset, input_name, args.length_column_name)
        return BatchRebalanceSampler(lengths, global_batch, world_size, args.gradient_accumulation_steps,
                                     seed=seed, rank=rank, drop_last=args.dataloader_drop_last)
    shuffle = args.train_sampling_strategy != "sequential"
    return EpochSampler(len(dataset), shuffle, seed, rank, world_size)


def build_dataloader(dataset: Any, collate_fn: Callable, batch_size: int, args: Any, backend: Any,
                     description: str | None = None, sampler: Sampler | None = None, evaluation: bool = False,
                     even_batches: Callable[[], bool] = lambda: True) -> TrainerDataLoader:
    """A DataLoader over ``dataset`` (its unused columns already removed): evaluation in dataset order over
    processes, training with ``sampler`` (None, as ``train_sampler`` gives for a stream: the DataLoader's own order).

    Args:
        dataset: the dataset; collate_fn: its collator; batch_size: rows per batch on each process.
        args: the run's ``TrainingArguments`` (the ``dataloader_*`` options, ``world_size``).
        backend: the run's ``Backend`` (pinning, the data-parallel rank and size).
        description: the dataset's name in error messages ("training", "evaluation", ...).
        sampler: the order; a subclass's own sampler is sharded per data-parallel rank.
        evaluation: an evaluation dataloader (dataset order over processes, the last batch's padding marked).
        even_batches: accelerate's ``even_batches`` (read only to shard a subclass's sampler).

    Raises:
        ValueError: evaluation over an iterable dataset on several processes.
    """
    # a bad row (None, text) named by its dataset and index, not by torch's collate or the model's forward
    collate_fn = NamedRows(collate_fn, None if is_iterable_dataset(dataset) else dataset, description)
    rank, world = backend.data_parallel_rank, backend.data_parallel_size
    kwargs: dict[str, Any] = dict(
        batch_size=batch_size,
        collate_fn=collate_fn,
        num_workers=args.dataloader_num_workers,
        pin_memory=backend.pin_memory(args.dataloader_pin_memory),
        drop_last=args.dataloader_drop_last,
    )
    if args.dataloader_num_workers > 0:  # python/numpy/torch seeded per worker and process: runs repeat
        kwargs.update(worker_init_fn=functools.partial(init_worker, num_workers=args.dataloader_num_workers,
                                                       rank=args.process_index,
                                                       ignore_stop_signals=args.enable_jit_checkpoint),
                      persistent_workers=args.dataloader_persistent_workers,
                      prefetch_factor=args.dataloader_prefetch_factor,
                      multiprocessing_context=args.dataloader_multiprocessing_context,
                      in_order=args.dataloader_in_order)
    if evaluation and is_iterable_dataset(dataset) and args.world_size > 1:
        raise ValueError(
            f"{description or 'evaluation'} on an iterable dataset with {args.world_size} processes is not supported: "
            "its last, padded batch cannot be told from real rows, so metrics would count some rows twice; "
            "pass a map-style dataset (with __len__) or evaluate on one process"
        )
    if is_iterable_dataset(dataset) and args.world_size > 1:  # each process its share of a stream
        dataset = IterableShard(dataset, batch_size, rank, world, args.dataloader_drop_last)
    if evaluation and sampler is None and not is_iterable_dataset(dataset):  # dataset order over processes
        kwargs["batch_sampler"] = EvalBatchSampler(len(dataset), batch_size, rank, world, kwargs.pop("drop_last"))
        del kwargs["batch_size"]
    elif isinstance(sampler, BatchRebalanceSampler):  # it makes the (variable-size) batches itself
        kwargs["batch_sampler"] = sampler
        del kwargs["batch_size"], kwargs["drop_last"]
    elif sampler is not None and not evaluation and world > 1 and not isinstance(sampler, EpochSampler):
        # a subclass's own sampler: each rank its batches, as accelerate deals them
        kwargs["batch_sampler"] = shard_sampler(sampler, batch_size, kwargs.pop("drop_last"), rank, world,
                                                even_batches())
        del kwargs["batch_size"]
    elif sampler is not None:
        kwargs["sampler"] = sampler
    return TrainerDataLoader(dataset, num_processes=args.world_size, **kwargs)
