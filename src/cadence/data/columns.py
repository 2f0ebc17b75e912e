"""Columns: the ones the model's ``forward`` does not take dropped, never indexing a dataset early."""


from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Mapping
from typing import Any, Callable

import torch

from ..column_removal import RemoveColumnsCollator, check_columns

from .collators import DataCollatorWithPadding, DefaultDataCollator, LABEL_COLUMNS, _as_mapping, default_data_collator
from .loaders import is_iterable_dataset

logger = logging.getLogger(__name__)


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


def label_names(model: torch.nn.Module) -> list[str]:
    """transformers' ``find_labels``: the forward's parameters named like labels (a question-answering model's
    span positions too); ``[]`` for a model that takes none (sentence-transformers'), as in transformers."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model: its base
    params = inspect.signature(type(model).forward).parameters
    qa = "QuestionAnswering" in type(model).__name__
    return [n for n in params if "label" in n or (qa and n in ("start_positions", "end_positions"))]
