"""Bad input to the ``Trainer``, caught before the first optimizer step with the fix in the message.

``TrainingArguments`` checks its own fields (``training_args.py``); this module checks what only the
Trainer sees: the optimizer and scheduler it is given, the callbacks, whether evaluation can produce
``metric_for_best_model``, whether the model has anything to train, and (on the first batches, as
they come) what the collator and the loss return. Every message names the argument, the value and
the fix; each check is a few attribute looks, cheap enough to run on every batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch
from torch import nn


def _name(obj: Any) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__


def check_optimizers(model: nn.Module, optimizer: Any, lr_scheduler: Any) -> None:
    """``optimizers=(optimizer, lr_scheduler)``: an optimizer over this model, a scheduler of that optimizer.

    Raises:
        TypeError: the optimizer is not a ``torch.optim.Optimizer``.
        ValueError: a scheduler without its optimizer, a scheduler of another optimizer, or an
            optimizer none of whose parameters belongs to ``model``.
    """
    if optimizer is None:
        if lr_scheduler is not None:
            raise ValueError(
                f"optimizers=(None, {_name(lr_scheduler)}): a scheduler was passed without its optimizer, so the "
                "Trainer would create a new optimizer the scheduler does not drive; pass (optimizer, scheduler) "
                "with the optimizer the scheduler was built on, or neither"
            )
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizers=({_name(optimizer)}, ...): the first element must be a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}; pass (optimizer, scheduler) or (None, None)"
        )
    scheduled = getattr(lr_scheduler, "optimizer", optimizer)
    if lr_scheduler is not None and scheduled is not optimizer:
        raise ValueError(
            f"optimizers=({_name(optimizer)}, {_name(lr_scheduler)}): the scheduler was built on another optimizer "
            f"({_name(scheduled)}), so it would change a learning rate nobody uses; build the scheduler on the "
            "optimizer you pass"
        )
    own = {id(p) for p in model.parameters()}
    given = [p for group in optimizer.param_groups for p in group["params"]]
    if given and not any(id(p) in own for p in given):
        raise ValueError(
            f"optimizers=({_name(optimizer)}, ...): none of the optimizer's {len(given)} parameters belongs to the "
            f"model ({type(model).__name__}), so training would not change the model; build the optimizer from "
            "model.parameters() of the model you pass to Trainer (after model_init, if you use it: pass no optimizer)"
        )


def check_best_metric_named(args: Any) -> None:
    """``save_strategy="best"`` (and ``load_best_model_at_end``) compare evaluations by ``metric_for_best_model``;
    ``TrainingArguments`` defaults it to the loss only for the latter, and the Trainer refuses the former
    without one (transformers' rule and words)."""
    best_save = getattr(args.save_strategy, "value", args.save_strategy) == "best"
    if (best_save or args.load_best_model_at_end) and args.metric_for_best_model is None:
        raise ValueError(
            "`args.metric_for_best_model` must be provided when using 'best' save_strategy or if "
            "`args.load_best_model_at_end` is set to `True`: set metric_for_best_model='loss' (or a key your "
            "compute_metrics returns)"
        )


def check_best_save_has_evaluations(save_strategy: Any, eval_strategy: Any) -> None:
    """``save_strategy="best"`` saves when an evaluation improves; without evaluations it never saves.

    Checked by the Trainer, not ``TrainingArguments``, which accepts the pair as transformers does.
    """
    if getattr(save_strategy, "value", save_strategy) == "best" and getattr(eval_strategy, "value", eval_strategy) == "no":
        raise ValueError(
            "save_strategy='best' is invalid with eval_strategy='no': it saves when an evaluation improves "
            "metric_for_best_model, so this run would never save a checkpoint; set eval_strategy='steps' or 'epoch', "
            "or save_strategy='steps'"
        )


def check_trainable(model: nn.Module) -> None:
    """A model with no parameter that requires a gradient has nothing to train."""
    if not any(p.requires_grad for p in model.parameters()):
        count = sum(1 for _ in model.parameters())
        raise ValueError(
            f"model ({type(model).__name__}) has no trainable parameter ({count} parameters, none with "
            "requires_grad=True): training would change nothing; unfreeze some (p.requires_grad_(True)) or attach "
            "an adapter before train()"
        )


def check_batch(batch: Any, where: str = "data_collator") -> None:
    """A batch is a mapping of inputs (or a tuple/list of inputs, passed positionally, or of collated mappings,
    which a subclass's ``compute_loss`` unpacks).

    Raises:
        TypeError: None, a bare tensor (the model would get its rows as arguments), an empty or a
            list of dict samples (the collator did not collate), or anything else.
    """
    if isinstance(batch, Mapping):
        return
    if (isinstance(batch, (tuple, list)) and batch and not any(isinstance(t, Mapping) for t in batch)
            and not all(t is None or isinstance(t, (str, bytes)) for t in batch)):
        return  # positional inputs; a list of dicts, or of texts, is samples the collator did not collate
    if isinstance(batch, (tuple, list)) and batch and all(_collated(t) for t in batch):
        return  # several collated batches (a retrieval collator's (queries, passages)) for the user's compute_loss
    if batch is None:
        got = "None"
    elif torch.is_tensor(batch):
        got = f"a bare tensor of shape {tuple(batch.shape)}"
    elif isinstance(batch, (tuple, list)):
        first = type(batch[0]).__name__ if batch else "nothing"
        got = f"a {type(batch).__name__} of {len(batch)} {first} (not collated into tensors)"
    else:
        got = f"a {type(batch).__name__}"
    raise TypeError(
        f"{where} returned {got} as a batch: a batch must be a dict of tensors such as "
        "{'input_ids': ..., 'labels': ...} (or a tuple of tensors passed positionally to the model); make the "
        "collator return one, e.g. data_collator=default_data_collator"
    )


def _collated(part: Any) -> bool:
    """Whether ``part`` is a collated batch, not one sample: a mapping of tensors only, all with the same number of
    rows, at least one of them a matrix (a sample's tensors are rows or scalars)."""
    if not isinstance(part, Mapping) or not part:
        return False
    values = list(part.values())
    if not all(torch.is_tensor(v) and v.dim() >= 1 for v in values):
        return False
    return len({v.shape[0] for v in values}) == 1 and any(v.dim() >= 2 for v in values)


def check_loss(loss: Any, source: str) -> None:
    """A training loss is a 0-d tensor connected to the trainable parameters."""
    if not torch.is_tensor(loss):
        raise TypeError(
            f"{source} returned a loss of type {type(loss).__name__} ({loss!r}), not a tensor: gradients cannot flow "
            "through a Python number; return the torch tensor itself (no .item() or float())"
        )
    if loss.dim() != 0:
        raise ValueError(
            f"{source} returned a loss of shape {tuple(loss.shape)}, not a scalar: cadence normalises one number per "
            "batch; reduce it (loss.mean() over items, or loss.sum() / num_items_in_batch)"
        )
    if not loss.requires_grad:
        raise ValueError(
            f"{source} returned a loss that does not require a gradient: it is not connected to any trainable "
            "parameter (computed under torch.no_grad(), detached, or from frozen parameters only); compute it from "
            "the model's outputs without detaching"
        )


def explain_label_error(error: Exception, inputs: Any) -> None:
    """Re-raise torch's dtype error for float labels in a class-index loss as a ValueError naming the labels."""
    labels = inputs.get("labels") if isinstance(inputs, Mapping) else None
    text = str(error)
    if not (torch.is_tensor(labels) and labels.is_floating_point()):
        return
    if "Long" in text or "Int" in text or "class probabilities" in text or "target" in text.lower():
        raise ValueError(
            f"labels have dtype {labels.dtype} and shape {tuple(labels.shape)}, but the model's loss expects class "
            "indices (integers): make the dataset's labels integers (e.g. torch.long / int), or use a regression "
            f"loss for real-valued targets (torch said: {text.splitlines()[0]})"
        ) from error


def clean_metrics(metrics: Any, compute_metrics: Callable) -> dict[str, float]:
    """``compute_metrics``' result with 0-d tensors and numpy scalars as Python numbers.

    Raises:
        TypeError: the result is not a dict, or a value is not a number (a string, a list, an
            array or tensor with more than one element, None, an object).
    """
    name = f"compute_metrics ({_name(compute_metrics)})"
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"{name} returned {type(metrics).__name__} ({str(metrics)[:60]}), not a dict: return "
            "{'metric_name': number, ...}, e.g. {'accuracy': 0.9}"
        )
    clean = {}
    for key, value in metrics.items():
        if torch.is_tensor(value) and value.numel() == 1:
            value = value.item()
        elif isinstance(value, (np.generic, np.ndarray)) and np.size(value) == 1:
            value = value.item()
        if not isinstance(value, (int, float)):
            raise TypeError(
                f"{name} returned {key}={str(value)[:60]!r} of type {type(value).__name__}: every metric must be a "
                f"number (a float, or a one-element tensor/array, converted for you); compute {key!r} as a float or "
                "leave it out"
            )
        clean[key] = value
    return clean
