"""Gathering, padding and concatenating predictions; the exact eval loss; metric prefixes; best metric.

How the eval loss is computed: every batch's mean loss is weighted by the number of items behind
it (labels ``!= -100``, without position 0 for causal LMs that shift; the row count when labels
are one per row), summed over batches and processes, and divided once by the total item count.
So ``eval_loss`` is the mean over all evaluated items: it does not change with
``per_device_eval_batch_size`` or the number of processes, and the last, short batch weighs what
its items weigh. (``transformers`` averages per-batch means, weighted by rows; for token losses
that differs.)

Distributed order: the eval batch sampler (``data.EvalBatchSampler``) gives process ``r`` the
batches ``r, r+N, ...`` of the one-process batch list, so the rows gathered at a step are in
dataset order; a process with no batch left runs a padding batch whose rows and loss are dropped
here, so N processes give exactly the one-process predictions, labels and loss.

Bounded memory: gathered predictions are moved to the CPU every ``eval_accumulation_steps`` steps
(every step when unset), so the device holds at most that many batches of predictions; with
``batch_eval_metrics`` ``evaluate()`` keeps nothing at all (``predict()`` still returns its predictions).
Host chunks are concatenated once, at the end.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable

import numpy as np
import torch

from . import checks
from .trainer_utils import EvalPrediction

logger = logging.getLogger(__name__)

PAD_INDEX = -100
FIELDS = ("predictions", "label_ids", "inputs", "losses")  # the order of EvalPrediction's arguments


def _map(fn: Callable, value: Any) -> Any:
    """Apply ``fn`` to every tensor/array of a nested tuple/list/dict."""
    if isinstance(value, Mapping):
        return type(value)({k: _map(fn, v) for k, v in value.items()})
    if isinstance(value, (tuple, list)):
        return type(value)(_map(fn, v) for v in value)
    return fn(value) if value is not None else None


def is_object_rows(value: Any) -> bool:
    """A list/tuple holding no tensor or array anywhere inside: one Python object per row (decoded strings, ids,
    dicts, ...), kept and gathered as a list; any other list/tuple is a structure of outputs."""
    if not isinstance(value, (list, tuple)):
        return False

    def holds_array(v: Any) -> bool:
        if torch.is_tensor(v) or isinstance(v, np.ndarray):
            return True
        if isinstance(v, Mapping):
            return any(holds_array(x) for x in v.values())
        if isinstance(v, (list, tuple)):
            return any(holds_array(x) for x in v)
        return False

    return not holds_array(value)


def _first_tensor(value: Any) -> Any:
    while isinstance(value, (tuple, list, Mapping)):
        items = list(value.values()) if isinstance(value, Mapping) else list(value)
        value = next((v for v in items if v is not None), None)
    return value


def batch_rows(inputs: Any) -> int:
    """Rows of a batch: the first dimension of its first tensor."""
    first = _first_tensor(inputs)
    return int(first.shape[0]) if first is not None and getattr(first, "ndim", 0) > 0 else 1


def _concat_all(chunks: list, padding_index: int = PAD_INDEX) -> Any:
    """Concatenate nested arrays along dim 0 in one allocation, padding dim 1 with -100 when lengths differ."""
    first = chunks[0]
    if first is None:
        return None
    if is_object_rows(first):  # one object per row: the rows of all batches, in order
        return [row for chunk in chunks for row in chunk]
    if isinstance(first, Mapping):
        return type(first)({k: _concat_all([c[k] for c in chunks], padding_index) for k in first})
    if isinstance(first, (tuple, list)):
        return type(first)(_concat_all([c[i] for c in chunks], padding_index) for i in range(len(first)))
    # Written batch by batch into one torch buffer, each batch dropped once copied so its memory can
    # be given back. (np.concatenate's result made compute_metrics' first pass over it several times
    # slower on this machine: lazily touched huge pages; benchmarks/bench_eval.py measured 1.53x -> 1.02x.)
    width = max(c.shape[1] for c in chunks) if first.ndim >= 2 else None
    shape = (sum(c.shape[0] for c in chunks), *((width,) if width is not None else ()), *first.shape[2:])
    out = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype=np.result_type(*chunks))).dtype)
    row = 0
    for i in range(len(chunks)):
        batch = torch.from_numpy(np.ascontiguousarray(chunks[i]))
        chunks[i] = None  # the caller's list too: its memory goes back as the buffer fills
        block = out[row : row + batch.shape[0]]
        if width is not None and batch.shape[1] < width:
            block[:, batch.shape[1] :] = padding_index
            block = block[:, : batch.shape[1]]
        block.copy_(batch)
        row += batch.shape[0]
    return out.numpy()


def numpy_pad_and_concatenate(array1: Any, array2: Any, padding_index: int = PAD_INDEX) -> np.ndarray:
    """Two arrays concatenated along dim 0, the narrower padded on dim 1 with ``padding_index`` (transformers' helper).

    Example:
        >>> numpy_pad_and_concatenate(np.ones((1, 2)), np.zeros((1, 3))).tolist()
        [[1.0, 1.0, -100.0], [0.0, 0.0, 0.0]]
    """
    return _concat_all([np.atleast_1d(array1), np.atleast_1d(array2)], padding_index)


def torch_pad_and_concatenate(tensor1: torch.Tensor, tensor2: torch.Tensor, padding_index: int = PAD_INDEX) -> torch.Tensor:
    """The torch version of ``numpy_pad_and_concatenate``, on the tensors' device."""
    tensor1, tensor2 = torch.atleast_1d(tensor1), torch.atleast_1d(tensor2)
    if tensor1.dim() == 1 or tensor1.shape[1] == tensor2.shape[1]:
        return torch.cat((tensor1, tensor2), dim=0)
    width = max(tensor1.shape[1], tensor2.shape[1])
    out = tensor1.new_full((tensor1.shape[0] + tensor2.shape[0], width, *tensor1.shape[2:]), padding_index)
    out[: tensor1.shape[0], : tensor1.shape[1]] = tensor1
    out[tensor1.shape[0] :, : tensor2.shape[1]] = tensor2
    return out


def nested_concat(tensors: Any, new_tensors: Any, padding_index: int = PAD_INDEX) -> Any:
    """Concatenate two equally nested tuples/lists/dicts of tensors or arrays, padding dim 1."""
    if isinstance(tensors, Mapping):
        return type(tensors)({k: nested_concat(v, new_tensors[k], padding_index) for k, v in tensors.items()})
    if isinstance(tensors, (tuple, list)):
        return type(tensors)(nested_concat(t, n, padding_index) for t, n in zip(tensors, new_tensors))
    if torch.is_tensor(tensors):
        return torch_pad_and_concatenate(tensors, new_tensors, padding_index)
    return numpy_pad_and_concatenate(tensors, new_tensors, padding_index)


class EvalLoopContainer:
    """Predictions of an evaluation loop, kept as tensors until ``to_cpu_and_numpy`` (transformers' container).

    Args:
        do_nested_concat: concatenate each added batch (padding dim 1); False keeps a list of batches.
        padding_index: the value that pads shorter batches.

    Example:
        >>> c = EvalLoopContainer(); c.add(torch.ones(2, 2)); c.add(torch.zeros(1, 3)); c.get_arrays().shape
        (3, 3)
    """

    def __init__(self, do_nested_concat: bool = True, padding_index: int = PAD_INDEX):
        self.do_nested_concat, self.padding_index = do_nested_concat, padding_index
        self.tensors: Any = None  # on the device, since the last move to the CPU
        self.arrays: Any = None  # numpy, on the CPU

    def add(self, tensors: Any) -> None:
        """Append one batch (a tensor or nested tensors)."""
        if self.tensors is None:
            self.tensors = tensors if self.do_nested_concat else [tensors]
        elif self.do_nested_concat:
            self.tensors = nested_concat(self.tensors, tensors, self.padding_index)
        else:
            self.tensors.append(tensors)

    def to_cpu_and_numpy(self) -> None:
        """Move what was added since the last call to the CPU as numpy arrays (frees the device copies)."""
        if self.tensors is None:
            return
        arrays = _map(_to_numpy, self.tensors)
        if self.arrays is None:
            self.arrays = arrays
        elif self.do_nested_concat:
            self.arrays = nested_concat(self.arrays, arrays, self.padding_index)
        else:
            self.arrays.extend(arrays)
        self.tensors = None

    def get_arrays(self) -> Any:
        """Everything added, as numpy arrays."""
        self.to_cpu_and_numpy()
        return self.arrays


def _to_numpy(t: Any) -> Any:
    if not torch.is_tensor(t):
        return t
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def with_last(iterable: Iterable) -> Iterator[tuple[Any, bool]]:
    """Yield ``(item, is_last)``, looking one item ahead."""
    iterator = iter(iterable)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True


def padding_marker(dataloader: Any) -> Callable[[int], bool]:
    """``f(step)``: whether this process's batch at ``step`` is padding (always False for other samplers)."""
    return getattr(getattr(dataloader, "batch_sampler", None), "is_padding", lambda step: False)


class Gatherer:
    """Gathers one step's outputs from all processes in process order, keeping only real rows.

    Each process sends how many of its rows are real (0 for a padding batch). Tensors are padded to
    common shapes (rows and dim 1, with -100), gathered, and the padding rows dropped. Lists of Python
    objects, one per row (:func:`is_object_rows`: decoded strings, ...), are gathered as objects (pickled,
    as accelerate's ``gather_object``) and concatenated; with ``use_gather_object``
    (``eval_use_gather_object``) tensors are gathered that way too, each process's rows as they are.
    Anything else (a 0-d tensor, a lone object) stays this process's.
    """

    def __init__(self, backend: Any, use_gather_object: bool = False):
        self.backend, self.use_gather_object = backend, use_gather_object

    def __call__(self, step_outputs: dict[str, Any], real_rows: int) -> dict[str, Any]:
        if self.backend.world_size == 1:
            return step_outputs
        backend = self.backend
        counts = backend.gather(torch.tensor([real_rows], device=backend.device)).tolist()

        def gather_tensor(t: torch.Tensor) -> torch.Tensor:
            t = backend.pad_across_processes(backend.pad_across_processes(t, dim=0), dim=1)
            block = t.shape[0]
            gathered = backend.gather(t)
            keep = torch.cat([torch.arange(r * block, r * block + n) for r, n in enumerate(counts)])
            return gathered[keep.to(gathered.device)]

        def gather_objects(value: Any) -> Any:
            parts = [part[:n] for part, n in zip(backend.gather_object(value), counts)]
            if not torch.is_tensor(value):
                return [row for part in parts for row in part]
            parts = [part.to(value.device) for part in parts]  # unpickled where each sender had it
            return functools.reduce(torch_pad_and_concatenate, parts)

        def gather(value: Any) -> Any:  # every process walks the same structure: the collectives pair up
            if value is None:
                return None
            if is_object_rows(value):
                return gather_objects(value)
            if isinstance(value, Mapping):
                return type(value)({k: gather(v) for k, v in value.items()})
            if isinstance(value, (tuple, list)):
                return type(value)(gather(v) for v in value)
            if torch.is_tensor(value) and value.dim() > 0:
                return gather_objects(value) if self.use_gather_object else gather_tensor(value)
            return value

        return {name: gather(value) for name, value in step_outputs.items()}


class Collector:
    """Keeps gathered step outputs: at most ``accumulation_steps`` steps on the device, the rest on the CPU.

    Args:
        accumulation_steps: steps kept on the device before moving to the CPU (None: every step).
        concat: concatenate the batches (padding dim 1 with -100); False keeps a list of batches.
    """

    def __init__(self, accumulation_steps: int | None, concat: bool = True, rows: int | None = None):
        self.every, self.concat = accumulation_steps or 1, concat
        self.device_steps: list[dict[str, Any]] = []
        self.host: dict[str, list] = {}
        # with the row count known, a plain tensor field is written straight into one host buffer
        # (one copy of the predictions, not per-batch pieces plus their concatenation)
        self.rows, self.buffers = (rows if concat else None), {}
        self.max_device_steps = 0  # the most steps ever held on the device (reported by the memory test)

    def add(self, step_outputs: dict[str, Any]) -> None:
        self.device_steps.append(step_outputs)
        self.max_device_steps = max(self.max_device_steps, len(self.device_steps))
        if len(self.device_steps) >= self.every:
            self._to_host()

    def _to_host(self) -> None:
        for step in self.device_steps:
            for name, value in step.items():
                if value is not None and not self._into_buffer(name, value):
                    self.host.setdefault(name, []).append(_map(_to_numpy, value))
        self.device_steps.clear()

    def _into_buffer(self, name: str, value: Any) -> bool:
        """Copy a tensor's rows into the field's buffer; False (buffer given up) when it does not fit."""
        if self.rows is None or not torch.is_tensor(value) or value.dim() == 0 or name in self.host:
            return False
        if name not in self.buffers:
            dtype = torch.float32 if value.dtype == torch.bfloat16 else value.dtype  # numpy has no bfloat16
            self.buffers[name] = [torch.empty((self.rows, *value.shape[1:]), dtype=dtype), 0]
        buffer, filled = self.buffers[name]
        if value.shape[1:] != buffer.shape[1:] or filled + value.shape[0] > self.rows:  # e.g. a wider batch
            self.host[name] = [buffer[:filled].numpy()]  # what was written continues as the first piece
            del self.buffers[name]
            return False
        buffer[filled : filled + value.shape[0]].copy_(value.detach())
        self.buffers[name][1] = filled + value.shape[0]
        return True

    def result(self) -> dict[str, Any]:
        """Each field as one array (or nested arrays), or a list of per-step arrays without ``concat``."""
        self._to_host()
        out = {name: buffer[:filled].numpy() for name, (buffer, filled) in self.buffers.items()}
        out.update({name: (_concat_all(chunks) if self.concat else chunks) for name, chunks in self.host.items()})
        return out


class ItemMean:
    """The eval loss: batch mean losses weighted by their item counts, summed over processes, divided once."""

    def __init__(self, device: torch.device):
        self.sum = torch.zeros((), device=device, dtype=torch.float64)
        self.items = torch.zeros((), device=device, dtype=torch.float64)
        self.batches = 0  # batches that gave a loss

    def add(self, batch_loss: torch.Tensor, items: torch.Tensor | int) -> None:
        items = torch.as_tensor(items, dtype=torch.float64, device=self.items.device)
        # a batch without items (every label masked) has a NaN mean: it adds nothing
        self.sum += torch.where(items > 0, batch_loss.double() * items, torch.zeros_like(self.sum))
        self.items += items
        self.batches += 1

    def result(self, backend: Any) -> float | None:
        """The mean; NaN when batches gave losses but no item was labelled (transformers reports NaN too, and
        ``load_best_model_at_end`` needs the key); None when no batch gave a loss (an empty set, no labels)."""
        batches = torch.tensor(float(self.batches), dtype=torch.float64, device=self.items.device)
        total, items, batches = backend.reduce_sum(torch.stack([self.sum, self.items, batches])).tolist()  # one collective
        if items > 0:
            return total / items
        if batches > 0:
            _warn_once("every label of the evaluation set is -100 (ignored), so there is no loss to average: "
                       "eval_loss is NaN; check the labels (or the collator that masks them)")
            return math.nan
        return None


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    logger.warning(message)


def call_compute_metrics(compute_metrics: Callable, outputs: dict[str, Any], compute_result: bool | None = None) -> dict:
    """``compute_metrics(EvalPrediction(...))``; with ``compute_result`` (batch_eval_metrics) it is passed on.

    Errors raised inside are re-raised naming the function.
    """
    prediction = EvalPrediction(**{name: outputs.get(name) for name in FIELDS})
    kwargs = {} if compute_result is None else {"compute_result": compute_result}
    try:
        metrics = compute_metrics(prediction, **kwargs)
    except Exception as e:
        name = getattr(compute_metrics, "__name__", type(compute_metrics).__name__)
        raise RuntimeError(f"compute_metrics ({name}) raised {type(e).__name__}: {e}") from e
    return checks.clean_metrics(metrics, compute_metrics)


def outputs_to_logits(outputs: Any, skip: set[str], had_loss: bool) -> Any:
    """The prediction part of model outputs: dict entries not in ``skip``, or a tuple without the loss."""
    if isinstance(outputs, Mapping):
        values = tuple(v for k, v in outputs.items() if k not in skip and v is not None)
    elif isinstance(outputs, (tuple, list)):
        values = tuple(outputs[1:] if had_loss else outputs)
    else:
        values = (outputs,)
    values = _map(lambda t: t.detach() if torch.is_tensor(t) else t, values)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def prefix_metrics(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """``accuracy`` -> ``eval_accuracy``; keys already prefixed stay as they are."""
    return {(k if k.startswith(f"{prefix}_") else f"{prefix}_{k}"): v for k, v in metrics.items()}


# ---------------------------------------------------------------- best metric


def best_metric_value(metrics: dict[str, float], metric_for_best_model: str) -> float:
    """The value of ``metric_for_best_model`` (``eval_`` added when missing) in ``metrics``.

    Raises:
        KeyError: naming the metric and the keys that exist.
    """
    name = metric_for_best_model if metric_for_best_model.startswith("eval_") else f"eval_{metric_for_best_model}"
    if name not in metrics:
        raise KeyError(
            f"metric_for_best_model={metric_for_best_model!r} looks for {name!r}, which the evaluation did not "
            f"report; it reported {sorted(metrics)}. Set metric_for_best_model to one of them (with or without 'eval_')"
        )
    return float(metrics[name])


def is_improvement(value: float, best: float | None, greater_is_better: bool) -> bool:
    """Whether ``value`` beats ``best`` (None: nothing yet) in the metric's direction; NaN never does."""
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value > best if greater_is_better else value < best


def metric_inputs(inputs: Any, loss: Any, logits: Any, labels: Any, rows: int, include_for_metrics: list[str],
                  main_input_name: str) -> dict[str, Any]:
    """One evaluation step's predictions and labels, plus what ``include_for_metrics`` asks for: the batch's
    ``main_input_name`` input (``"inputs"``), its loss repeated once per row (``"loss"``)."""
    step = {"predictions": logits, "label_ids": labels}
    if "inputs" in include_for_metrics and isinstance(inputs, Mapping):
        step["inputs"] = inputs.get(main_input_name)
    if "loss" in include_for_metrics and loss is not None:
        step["losses"] = loss.detach().reshape(1).repeat(rows)
    return step
