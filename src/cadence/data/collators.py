"""Collators: ``default_data_collator`` and ``DataCollatorWithPadding``, with errors that name the bad row."""


from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch


from .counting import IGNORE_INDEX


LABEL_COLUMNS = ("label", "label_ids", "labels")


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
