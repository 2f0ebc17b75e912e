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

Modules, each importing only the ones before it: ``counting`` (items, tokens, micro-batches), ``collators``,
``loaders`` (``TrainerDataLoader``, the one-batch look-ahead), ``columns``, ``samplers``, ``streams``,
``dataloaders`` (the Trainer's samplers and DataLoaders from its arguments), ``resume`` (resume skipping, the start
of an epoch). Every name is importable from ``cadence.data``.
"""

from torch.utils.data import DataLoader, Dataset  # noqa: F401 - in __all__, as data.py had them

from ..column_removal import RemoveColumnsCollator  # noqa: F401 - in __all__: a collator users import from here
from .counting import (  # noqa: F401
    batch_items, count_items, IGNORE_INDEX, loss_shifts_labels, split_batches, TokenCounter,
)
from .collators import (  # noqa: F401
    BadRowError, DataCollatorWithPadding, dataset_name, default_data_collator, DefaultDataCollator,
    LABEL_COLUMNS, NamedRows,
)
from .loaders import (  # noqa: F401
    check_dataset, init_worker, is_iterable_dataset, LookAhead, TrainerDataLoader,
)
from .columns import (  # noqa: F401
    ColumnsDroppedInCollator, drop_unused_columns, forward_arguments, label_names,
)
from .samplers import (  # noqa: F401
    BatchRebalanceSampler, DistributedLengthGroupedSampler, DistributedSamplerWithLoop, EpochSampler,
    EvalBatchSampler, length_grouped_indices, LengthGroupedSampler, sample_lengths, shard_sampler, ShardSampler,
)
from .streams import (  # noqa: F401
    IterableDatasetShard, IterableShard,
)
from .dataloaders import build_dataloader, train_sampler  # noqa: F401
from .resume import (  # noqa: F401
    content_sample, epoch_batches, resumed_epoch, SavedState, set_epoch, skip_stream, skips_by_reading,
    stateful_stream,
)

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
