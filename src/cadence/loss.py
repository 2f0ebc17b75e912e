"""Loss normalisation over an accumulation window, and label smoothing.

The loss of one optimizer step is the sum of the per-item losses of all its micro-batches, on all
processes, divided once by the number of items (labels that enter the loss). A micro-batch
contributes

- ``sum_of_its_item_losses / window_items`` when the loss was computed with ``num_items_in_batch``
  (a model that accepts it, a ``compute_loss_func``, label smoothing), or
- ``its_mean_loss * its_items / window_items`` when the model returned a mean over its own items,

and, with N processes, that times N, because data parallelism averages gradients over processes.
So GA=k with batch b trains exactly like GA=1 with batch k·b, and N processes like one.

This module is the one place that decides about items and weights: whether a step's items are counted
(``counts_items``), what the model does with them (``divides_by_items``, ``transformers_counts_items``), the step's
count over processes (``step_items``), each micro-batch's weight (``micro_batch_weight``), the data-parallel factor of
a loss divided by every process's items (``data_parallel_scale``) and the items behind an evaluation batch's mean
(``eval_items``). Counting the labels of one batch is ``data.batch_items``.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .data import IGNORE_INDEX, batch_items

logger = logging.getLogger(__name__)


def divides_by_items(model: Any) -> bool:
    """Whether the model divides its loss by ``num_items_in_batch`` itself: ``model.accepts_loss_kwargs``
    if set; else a ``num_items_in_batch`` parameter; else a ``**kwargs`` forward whose code hands them to
    a loss (``self.loss_function``, or names ``num_items_in_batch``). transformers takes any ``**kwargs``
    as a yes, so BERT's classification heads (which take ``**kwargs`` but average their own loss) count
    a GA-k step k times there; cadence weights such a model's mean by its share of the step's items."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model: its base
    flag = getattr(model, "accepts_loss_kwargs", None)
    if flag is not None:
        return bool(flag)
    params = inspect.signature(model.forward).parameters
    if "num_items_in_batch" in params:
        return True
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return False
    try:
        source = inspect.getsource(type(model).forward)
    except (OSError, TypeError):  # no source to read (compiled, built in the REPL): transformers' rule
        return True
    return "loss_function" in source or "num_items_in_batch" in source


def transformers_counts_items(model: Any) -> bool:
    """transformers' ``model_accepts_loss_kwargs`` (the flag, else any ``**kwargs`` forward): where transformers
    counts a step's items for ``compute_loss``."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    flag = getattr(model, "accepts_loss_kwargs", None)
    if flag is not None:
        return bool(flag)
    return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(model.forward).parameters.values())


def counts_items(gradient_accumulation_steps: int, data_parallel_size: int, compute_loss_func: Any, model: Any) -> bool:
    """Whether each optimizer step's items are counted (``num_items_in_batch``): where the count changes the result
    (accumulation or several data-parallel processes), and wherever transformers counts them for ``compute_loss``
    (a ``compute_loss_func``, or a model that takes loss kwargs), so an override can observe it."""
    return (gradient_accumulation_steps > 1 or data_parallel_size > 1 or compute_loss_func is not None
            or transformers_counts_items(model))


def step_items(window: list[Any], shifted: bool, backend: Any) -> torch.Tensor | None:
    """Items of one optimizer step's batches over all data-parallel processes, on the device (a collective);
    None when the batches carry no labels."""
    items = window_items(window, shifted)
    return None if items is None else backend.reduce_sum_data_parallel(items.to(backend.device))


def returns_normalised(model_divides: bool, compute_loss_func: Any, label_smoother: Any) -> bool:
    """Whether the Trainer's ``compute_loss`` divides its loss by ``num_items_in_batch`` (when given one): a model that
    divides by it, a ``compute_loss_func`` or the label smoother; else the loss is its batch's own mean."""
    return model_divides or compute_loss_func is not None or label_smoother is not None


def data_parallel_scale(loss: torch.Tensor, items: Any, normalised: bool, training: bool,
                        data_parallel_size: int) -> torch.Tensor:
    """transformers' contract, which subclasses (TRL's) follow in their own ``compute_loss``: in training, a loss
    divided by every process's items comes back times the data-parallel size, as the ranks' gradients are averaged
    (evaluation passes a batch's own items: nothing to average)."""
    if items is not None and normalised and training and data_parallel_size > 1:
        return loss * data_parallel_size
    return loss


def eval_items(inputs: Any, rows: int, shifted: bool) -> torch.Tensor | int:
    """Items behind one evaluation batch's mean loss: counted as in training (``data.batch_items``), else its rows."""
    items = batch_items(inputs, shifted)
    return rows if items is None else items


def loss_from_outputs(outputs: Any, inputs: Any) -> torch.Tensor:
    """The loss a model returned: its output's ``loss``, or a 0-d first element (a tuple), or a 0-d tensor.

    Raises:
        ValueError: the model returned no loss (naming what it returned and what it was given).
    """
    if isinstance(outputs, Mapping) and outputs.get("loss") is not None:
        return outputs["loss"]
    if isinstance(outputs, (tuple, list)) and outputs and torch.is_tensor(outputs[0]) and outputs[0].dim() == 0:
        return outputs[0]
    if torch.is_tensor(outputs) and outputs.dim() == 0:
        return outputs
    keys = list(outputs.keys()) if isinstance(outputs, Mapping) else type(outputs).__name__
    given = list(inputs.keys()) if isinstance(inputs, Mapping) else type(inputs).__name__
    raise ValueError(
        f"the model did not return a loss (it returned {keys}; its inputs were {given}). Give the batches "
        "'labels' the model uses to compute its loss, pass compute_loss_func=..., or override compute_loss"
    )


def can_return_loss(model: Any) -> bool:
    """transformers' ``can_return_loss``: the forward has ``return_loss=True`` (CLIP-like models), so evaluation
    asks it for a loss without labels."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    param = inspect.signature(type(model).forward).parameters.get("return_loss")
    return param is not None and param.default is True


def window_items(batches: list[Any], shifted: bool) -> torch.Tensor | None:
    """Items (``data.batch_items``) over the micro-batches of one step.

    Returns None when a batch carries no labels (then micro-batches are weighted equally).
    """
    counts = [batch_items(batch, shifted) for batch in batches]
    if any(count is None for count in counts):
        return None
    return torch.stack(counts).sum()


def micro_batch_weight(
    inputs: Any, loss_is_normalised: bool, items: torch.Tensor | None, window_len: int, shifted: bool,
    data_parallel_size: int = 1,
) -> torch.Tensor | float:
    """The factor that turns one micro-batch's returned loss into its share of the step's loss.

    Args:
        inputs: the micro-batch (its labels are counted when the loss is a per-batch mean).
        loss_is_normalised: the loss was already divided by ``items`` (the window's count; its data-parallel
            factor applied in ``compute_loss``, ``data_parallel_scale``).
        items: the window's item count over all processes, or None when there are no labels.
        window_len: micro-batches in this step (the last step of an epoch may have fewer).
        shifted: the model's loss shifts labels (causal LM).
        data_parallel_size: data-parallel ranks; a mean weighted by its share of every rank's items is multiplied
            by it, as data parallelism averages gradients over the ranks.
    """
    if items is None:
        return 1.0 / window_len
    if loss_is_normalised:
        return 1.0
    weight = batch_items(inputs, shifted).double() / items.clamp(min=1).double()
    return weight * data_parallel_size if data_parallel_size != 1 else weight  # no extra kernel on one rank


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

