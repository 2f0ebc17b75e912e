"""Gathering, padding and concatenating predictions; metric prefixes.

Predictions are gathered from all processes, padded to a common length with -100 and moved to
the CPU every ``eval_accumulation_steps`` batches (every batch when unset), so the device holds at
most that many batches of predictions. Samples the sampler repeated to even out process shares
are dropped at the end (the result has exactly ``len(dataset)`` rows).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch

from .trainer_utils import EvalPrediction, denumpify_detensorize

logger = logging.getLogger(__name__)

PAD_INDEX = -100


def _map(fn: Callable, value: Any) -> Any:
    """Apply ``fn`` to every tensor of a nested tuple/list/dict."""
    if isinstance(value, Mapping):
        return type(value)({k: _map(fn, v) for k, v in value.items()})
    if isinstance(value, (tuple, list)):
        return type(value)(_map(fn, v) for v in value)
    return fn(value) if value is not None else None


def _concat(a: Any, b: Any) -> Any:
    """Concatenate nested tensors/arrays along dim 0, padding dim 1 with -100 when lengths differ."""
    if a is None:
        return b
    if isinstance(a, Mapping):
        return type(a)({k: _concat(a[k], b[k]) for k in a})
    if isinstance(a, (tuple, list)):
        return type(a)(_concat(x, y) for x, y in zip(a, b))
    if a.ndim < 2 or a.shape[1] == b.shape[1]:
        return np.concatenate([a, b], axis=0)
    width = max(a.shape[1], b.shape[1])
    out = np.full((a.shape[0] + b.shape[0], width, *a.shape[2:]), PAD_INDEX, dtype=np.result_type(a, b))
    out[: a.shape[0], : a.shape[1]] = a
    out[a.shape[0] :, : b.shape[1]] = b
    return out


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


class Collector:
    """Keeps gathered predictions and labels, at most ``accumulation_steps`` batches on the device.

    Args:
        backend: gathers across processes.
        accumulation_steps: batches kept on the device before moving to the CPU (None: every batch).
        num_samples: the dataset length, to drop padded duplicates; None for iterable datasets.
    """

    def __init__(self, backend: Any, accumulation_steps: int | None, num_samples: int | None):
        self.backend, self.every, self.num_samples = backend, accumulation_steps or 1, num_samples
        self.device_batches: list[tuple[Any, Any]] = []
        self.host: list[Any] = [None, None]
        self.num_seen = 0

    def add(self, logits: Any, labels: Any) -> None:
        gather = lambda t: self.backend.gather(self.backend.pad_across_processes(t))  # noqa: E731
        logits, labels = _map(gather, logits), _map(gather, labels)
        first = labels if labels is not None else logits
        while isinstance(first, (tuple, list, Mapping)):
            first = next(iter(first.values())) if isinstance(first, Mapping) else first[0]
        self.num_seen += first.shape[0] if first is not None else 0
        self.device_batches.append((logits, labels))
        if len(self.device_batches) >= self.every:
            self._to_host()

    def _to_host(self) -> None:
        for logits, labels in self.device_batches:
            for i, value in enumerate((logits, labels)):
                if value is not None:
                    self.host[i] = _concat(self.host[i], _map(_to_numpy, value))
        self.device_batches.clear()

    def result(self) -> tuple[Any, Any]:
        self._to_host()
        if self.num_samples is None:
            return tuple(self.host)
        truncate = lambda a: a[: self.num_samples]  # noqa: E731
        return tuple(_map(truncate, v) if v is not None else None for v in self.host)


def outputs_to_logits(outputs: Any, skip: set[str], had_loss: bool) -> Any:
    """The prediction part of model outputs: dict entries not in ``skip``, or a tuple without the loss."""
    if isinstance(outputs, Mapping):
        values = tuple(v for k, v in outputs.items() if k not in skip and v is not None)
    elif isinstance(outputs, (tuple, list)):
        values = tuple(outputs[1:] if had_loss else outputs)
    else:
        values = (outputs,)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def call_compute_metrics(compute_metrics: Callable, predictions: Any, label_ids: Any) -> dict[str, float]:
    try:
        metrics = compute_metrics(EvalPrediction(predictions=predictions, label_ids=label_ids))
    except Exception as e:
        name = getattr(compute_metrics, "__name__", type(compute_metrics).__name__)
        raise RuntimeError(f"compute_metrics ({name}) raised {type(e).__name__}: {e}") from e
    return denumpify_detensorize(dict(metrics))


def prefix_metrics(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """``accuracy`` -> ``eval_accuracy``; keys already prefixed stay as they are."""
    return {(k if k.startswith(f"{prefix}_") else f"{prefix}_{k}"): v for k, v in metrics.items()}
