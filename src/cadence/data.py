"""Dataloaders, the default collators, unused-column removal, the seedable sampler and item counting.

The training order is the one `transformers.Trainer` gives for the same seed: epoch ``e`` is the
permutation ``torch.randperm(n, generator=Generator().manual_seed(seed + e))`` (what accelerate's
seedable sampler draws), and with N processes, process ``r`` takes every N-th index starting at ``r``,
so that the N per-process batches of a step hold exactly the samples of the one-process batch.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

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

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        padding = self._share() * self.world_size - self.num_samples
        order += order[:padding]  # equal shares, so no process waits at a collective for another
        return iter(order[self.rank :: self.world_size][self.skip :])


# ---------------------------------------------------------------- collators


def _to_tensor(values: list) -> torch.Tensor:
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(values)
    if isinstance(first, np.ndarray):
        return torch.from_numpy(np.stack(values))
    return torch.tensor(values)


def default_data_collator(features: list) -> dict[str, Any]:
    """Stack a list of samples (dicts of tensors, arrays, numbers or lists) into one batch dict.

    ``label`` and ``label_ids`` become ``labels`` (HF's rule); ``None`` values and strings are left
    out of the tensors. Samples that are not mappings go through torch's ``default_collate``.

    Example:
        >>> default_data_collator([{"x": [1, 2], "label": 0}, {"x": [3, 4], "label": 1}])["labels"]
        tensor([0, 1])
    """
    if not isinstance(features[0], Mapping):
        return torch.utils.data.default_collate(features)
    batch: dict[str, Any] = {}
    for key, value in features[0].items():
        if value is None or isinstance(value, str):
            continue
        name = "labels" if key in ("label", "label_ids") else key
        try:
            batch[name] = _to_tensor([f[key] for f in features])
        except (ValueError, RuntimeError, TypeError) as e:
            raise ValueError(
                f"cannot stack field '{key}' into a batch ({e}); samples of different lengths need a padding "
                "collator: pass data_collator=DataCollatorWithPadding(...) or a processing_class with pad_token_id"
            ) from e
    return batch


class DataCollatorWithPadding:
    """Pad ``input_ids``-like fields to the longest sample of the batch; labels are padded with -100.

    Args:
        tokenizer: anything with ``pad_token_id`` (a ``transformers`` tokenizer works); or pass ``pad_token_id``.
        pad_token_id: the id for padded input positions when there is no tokenizer.
        pad_to_multiple_of: round the padded length up to a multiple of this (helps kernels and compile).

    Example:
        >>> c = DataCollatorWithPadding(pad_token_id=0)
        >>> c([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}])["input_ids"].tolist()
        [[5, 6, 7], [8, 0, 0]]
    """

    def __init__(self, tokenizer: Any = None, pad_token_id: int | None = None, pad_to_multiple_of: int | None = None):
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
        if pad_token_id is None:
            raise ValueError("DataCollatorWithPadding needs a pad id: pass pad_token_id=... or a tokenizer with pad_token_id set")
        self.pad_token_id, self.pad_to_multiple_of = pad_token_id, pad_to_multiple_of

    def _pad_value(self, key: str) -> int:
        if key in LABEL_COLUMNS:
            return IGNORE_INDEX
        return 0 if "mask" in key or key == "token_type_ids" else self.pad_token_id

    def __call__(self, features: list[Mapping]) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        for key, value in features[0].items():
            name = "labels" if key in ("label", "label_ids") else key
            if value is None or isinstance(value, str):
                continue
            rows = [torch.as_tensor(f[key]) for f in features]
            if rows[0].dim() == 0:
                batch[name] = torch.stack(rows)
                continue
            length = max(r.shape[0] for r in rows)
            if self.pad_to_multiple_of:
                length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
            padded = torch.full((len(rows), length, *rows[0].shape[1:]), self._pad_value(key), dtype=rows[0].dtype)
            for i, r in enumerate(rows):
                padded[i, : r.shape[0]] = r
            batch[name] = padded
        return batch


class RemoveColumnsCollator:
    """Drop the keys the model's ``forward`` does not accept before collating (for dict datasets)."""

    def __init__(self, collator: Callable, keep: set[str]):
        self.collator, self.keep = collator, keep

    def __call__(self, features: list) -> Any:
        if isinstance(features[0], Mapping):
            features = [{k: v for k, v in f.items() if k in self.keep} for f in features]
        return self.collator(features)


def forward_arguments(model: torch.nn.Module) -> set[str] | None:
    """Names ``model.forward`` accepts, plus the label columns; None when it takes ``**kwargs`` only.

    Looks through PEFT-style wrappers (``base_model.model``) to the model that names its inputs.
    """
    for candidate in (model, getattr(model, "base_model", None), getattr(getattr(model, "base_model", None), "model", None)):
        if candidate is None:
            continue
        params = inspect.signature(candidate.forward).parameters
        named = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if named:
            return named | set(LABEL_COLUMNS)
    return None


def unused_columns(sample: Any, accepted: set[str] | None) -> list[str]:
    """Keys of a dict sample that the model does not accept (empty for other samples)."""
    if accepted is None or not isinstance(sample, Mapping):
        return []
    return [k for k in sample if k not in accepted]


# ---------------------------------------------------------------- item counting


def count_items(labels: torch.Tensor, shifted: bool) -> torch.Tensor:
    """Labels that enter the loss: ``!= -100``, and for causal LMs (which shift) not position 0."""
    if shifted:
        labels = labels[..., 1:]
    return labels.ne(IGNORE_INDEX).sum()


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
        return getattr(model, "loss_type", None) == "ForCausalLM"
    except Exception:  # some HF models compute loss_type from a config that may be incomplete
        return False


def is_iterable_dataset(dataset: Any) -> bool:
    return isinstance(dataset, IterableDataset) or (not hasattr(dataset, "__len__") and hasattr(dataset, "__iter__"))


def check_dataset(dataset: Any, name: str) -> None:
    """Refuse what cannot be trained on, before the first step."""
    if dataset is None:
        return
    if not is_iterable_dataset(dataset):
        if not hasattr(dataset, "__getitem__"):
            raise ValueError(f"{name} of type {type(dataset).__name__} has neither __getitem__ nor __iter__: pass a torch Dataset")
        if len(dataset) == 0:
            raise ValueError(f"{name} is empty (len 0): pass a dataset with at least one sample")


__all__ = [
    "EpochSampler",
    "default_data_collator",
    "DataCollatorWithPadding",
    "RemoveColumnsCollator",
    "forward_arguments",
    "count_items",
    "loss_shifts_labels",
    "check_dataset",
    "Dataset",
    "DataLoader",
]
