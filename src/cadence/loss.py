"""Loss normalisation over an accumulation window, and label smoothing.

The loss of one optimizer step is the sum of the per-item losses of all its micro-batches, on all
processes, divided once by the number of items (labels that enter the loss). A micro-batch
contributes

- ``sum_of_its_item_losses / window_items`` when the loss was computed with ``num_items_in_batch``
  (a model that accepts it, a ``compute_loss_func``, label smoothing), or
- ``its_mean_loss * its_items / window_items`` when the model returned a mean over its own items,

and, with N processes, that times N, because data parallelism averages gradients over processes.
So GA=k with batch b trains exactly like GA=1 with batch k·b, and N processes like one.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .data import IGNORE_INDEX, batch_items

logger = logging.getLogger(__name__)


def window_items(batches: list[Any], shifted: bool) -> torch.Tensor | None:
    """Items (``data.batch_items``) over the micro-batches of one step.

    Returns None when a batch carries no labels (then micro-batches are weighted equally).
    """
    counts = [batch_items(batch, shifted) for batch in batches]
    if any(count is None for count in counts):
        return None
    return torch.stack(counts).sum()


def micro_batch_weight(
    inputs: Any, loss_is_normalised: bool, items: torch.Tensor | None, window_len: int, shifted: bool
) -> torch.Tensor | float:
    """The factor that turns one micro-batch's returned loss into its share of the step's loss.

    Args:
        inputs: the micro-batch (its labels are counted when the loss is a per-batch mean).
        loss_is_normalised: the loss was already divided by ``items`` (the window's count).
        items: the window's item count over all processes, or None when there are no labels.
        window_len: micro-batches in this step (the last step of an epoch may have fewer).
        shifted: the model's loss shifts labels (causal LM).
    """
    if items is None:
        return 1.0 / window_len
    if loss_is_normalised:
        return 1.0
    own = batch_items(inputs, shifted)
    return own.double() / items.clamp(min=1).double()


class LabelSmoother:
    """Cross-entropy with label smoothing: ``(1 - eps) * nll + eps * mean over classes of -log p``.

    Args:
        epsilon: the smoothing factor (``label_smoothing_factor``).
        ignore_index: label value that does not count.

    Example:
        >>> smoother = LabelSmoother(epsilon=0.1)
        >>> loss = smoother({"logits": logits}, labels, shift_labels=True)
    """

    def __init__(self, epsilon: float = 0.1, ignore_index: int = IGNORE_INDEX):
        self.epsilon, self.ignore_index = epsilon, ignore_index

    def __call__(self, model_output: Any, labels: torch.Tensor, shift_labels: bool = False, num_items_in_batch=None):
        logits = model_output["logits"] if isinstance(model_output, Mapping) else model_output[0]
        if shift_labels:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # the softmax of half-precision logits loses too much
        log_probs = F.log_softmax(logits, dim=-1)
        keep = labels.ne(self.ignore_index)
        safe_labels = labels.clamp(min=0).unsqueeze(-1)
        nll = -log_probs.gather(-1, safe_labels).squeeze(-1)
        uniform = -log_probs.mean(dim=-1)
        per_item = (1 - self.epsilon) * nll + self.epsilon * uniform
        total = per_item.masked_fill(~keep, 0.0).sum()
        denominator = keep.sum() if num_items_in_batch is None else num_items_in_batch
        if torch.is_tensor(denominator):
            denominator = denominator.to(total.device)
        return total / denominator


def label_smoother_for(model: Any, epsilon: float) -> LabelSmoother | None:
    """The Trainer's ``label_smoother``: None without smoothing, and (as transformers, with its warning) for a
    multi-label classifier, whose float targets a softmax cross-entropy cannot smooth."""
    if not epsilon:
        return None
    config = getattr(model, "config", None)
    if getattr(config, "problem_type", None) == "multi_label_classification":
        warnings.warn("Label smoothing is not compatible with multi-label classification. "
                      "Disabling label smoothing for this training run.", UserWarning, stacklevel=3)
        return None
    return LabelSmoother(epsilon)

