"""Counting: items (labels that count) and tokens of a batch, and micro-batches split from a batch."""


from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch


logger = logging.getLogger(__name__)


IGNORE_INDEX = -100


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
