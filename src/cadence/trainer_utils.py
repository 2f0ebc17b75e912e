"""Small public types and helpers, at the import path `transformers.trainer_utils` users know.

Strategies are `str` enums so `args.eval_strategy == "steps"` holds; the result tuples keep HF's
field names and order; the helpers (`set_seed`, `get_last_checkpoint`, `speed_metrics`, ...) keep
HF's signatures and results. Importing this module costs stdlib + torch + numpy (torch imports
numpy anyway) and the checkpoint files' names (``checkpoint_io``), nothing else.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import random
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

# the checkpoint folders' helpers, at transformers' import path (cadence's own code imports checkpoint_io.folders)
from .checkpoint_io.folders import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, rotate_checkpoints, sort_checkpoints  # noqa: F401
# transformers' import paths of types that live below this module: the collator that drops unused columns, and the
# hyperparameter search's types
from .column_removal import RemoveColumnsCollator  # noqa: F401
from .search_types import (  # noqa: F401
    _StrEnum,
    BestRun,
    HPSearchBackend,
    default_compute_objective,
    default_hp_space_optuna,
    default_hp_space_ray,
)

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------
class IntervalStrategy(_StrEnum):
    """When an interval event (logging, evaluation) happens."""

    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


class SaveStrategy(_StrEnum):
    """When a checkpoint is written; `best` saves whenever the tracked metric improves."""

    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"
    BEST = "best"


class HubStrategy(_StrEnum):
    """What gets pushed to the Hub, and when."""

    END = "end"
    EVERY_SAVE = "every_save"
    CHECKPOINT = "checkpoint"
    ALL_CHECKPOINTS = "all_checkpoints"


class SchedulerType(_StrEnum):
    """Names accepted by `TrainingArguments.lr_scheduler_type` (same values as transformers)."""

    LINEAR = "linear"
    COSINE = "cosine"
    COSINE_WITH_RESTARTS = "cosine_with_restarts"
    POLYNOMIAL = "polynomial"
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    INVERSE_SQRT = "inverse_sqrt"
    REDUCE_ON_PLATEAU = "reduce_lr_on_plateau"
    COSINE_WITH_MIN_LR = "cosine_with_min_lr"
    COSINE_WARMUP_WITH_MIN_LR = "cosine_warmup_with_min_lr"
    WARMUP_STABLE_DECAY = "warmup_stable_decay"
    GREEDY = "greedy"


# --------------------------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------------------------
class EvalPrediction:
    """What `compute_metrics` receives: predictions and labels, plus inputs/losses when asked for.

    It unpacks like a tuple: `predictions, labels = eval_pred`, or with four names when both
    `inputs` and `losses` are present (only the present ones are yielded, in that order).

    Args:
        predictions: model outputs, usually a numpy array or a tuple of them.
        label_ids: the targets.
        inputs: the model inputs, when `include_for_metrics` contains "inputs".
        losses: per-batch losses, when `include_for_metrics` contains "loss".

    Example:
        >>> predictions, labels = EvalPrediction(np.zeros(2), np.ones(2))
    """

    def __init__(self, predictions: Any, label_ids: Any, inputs: Any = None, losses: Any = None):
        self.predictions = predictions
        self.label_ids = label_ids
        self.inputs = inputs
        self.losses = losses
        # Optional parts join only when present, so two-name unpacking keeps working.
        self.elements = (predictions, label_ids) + tuple(x for x in (inputs, losses) if x is not None)

    def __iter__(self):
        return iter(self.elements)

    def __getitem__(self, idx: int) -> Any:
        # Negative indices are refused, as in HF: `eval_pred[-1]` is ambiguous when parts are optional.
        if idx < 0 or idx >= len(self.elements):
            raise IndexError("tuple index out of range")
        return self.elements[idx]

    def __len__(self) -> int:
        return len(self.elements)

    def __repr__(self) -> str:
        parts = ["predictions", "label_ids"] + [n for n in ("inputs", "losses") if getattr(self, n) is not None]
        return f"EvalPrediction({', '.join(f'{n}={getattr(self, n)!r}' for n in parts)})"


class EvalLoopOutput(NamedTuple):
    predictions: Any
    label_ids: Any | None
    metrics: dict[str, float] | None
    num_samples: int | None


class PredictionOutput(NamedTuple):
    predictions: Any
    label_ids: Any | None
    metrics: dict[str, float] | None


class TrainOutput(NamedTuple):
    global_step: int
    training_loss: float
    metrics: dict[str, float]


def check_target_module_exists(optim_target_modules: str | list[str], key: str, return_is_regex: bool = False):
    """Whether the module name ``key`` is one of ``optim_target_modules`` (transformers' rule).

    A string is a regular expression that must match the whole name. A list matches when ``key`` is
    in it, contains one of its entries, or fully matches one of them as a regular expression.

    Returns:
        The match (bool), or ``(match, is_regex)`` with ``return_is_regex``; ``is_regex`` says the match
        came from a pattern rather than a name.

    Example:
        >>> check_target_module_exists(["attn", "mlp"], "model.layers.0.mlp.up_proj")
        True
    """
    if isinstance(optim_target_modules, str):
        found, is_regex = re.fullmatch(optim_target_modules, key) is not None, optim_target_modules != key
    elif key in optim_target_modules or any(target in key for target in optim_target_modules):
        found, is_regex = True, False
    else:
        found = any(re.fullmatch(target, key) is not None for target in optim_target_modules)
        is_regex = found
    return (found, is_regex) if return_is_regex else found


# --------------------------------------------------------------------------------------------
# Seeding
# --------------------------------------------------------------------------------------------
def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed python's `random`, numpy and torch (CPU and every CUDA device).

    Args:
        seed: the seed.
        deterministic: also switch torch to deterministic algorithms (slower); see
            `enable_full_determinism`.

    Example:
        >>> set_seed(42); a = torch.rand(2); set_seed(42); bool((a == torch.rand(2)).all())
        True
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device, lazily, when CUDA is available
    if deterministic:
        _use_deterministic_algorithms(warn_only=False)


def enable_full_determinism(seed: int, warn_only: bool = False) -> None:
    """Seed everything and make torch pick deterministic kernels, for bitwise-reproducible runs.

    Args:
        seed: the seed passed to `set_seed`.
        warn_only: warn instead of raising when an op has no deterministic implementation.
    """
    set_seed(seed)
    _use_deterministic_algorithms(warn_only=warn_only)


def _use_deterministic_algorithms(warn_only: bool) -> None:
    # cuBLAS needs a fixed workspace to be deterministic, and launches must be synchronous for some
    # CUDA versions; both are read when CUDA initialises, so they are set before any CUDA work.
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False  # benchmark mode may pick a different kernel per run


def seed_worker(worker_id: int, num_workers: int = 0, rank: int = 0) -> None:
    """DataLoader `worker_init_fn`: seed python, numpy and torch in a worker from its torch seed.

    torch already gives each worker its own `initial_seed()` (base seed + worker id); python's and
    numpy's generators would otherwise be copies of the parent's. `num_workers * rank` keeps the
    workers of different processes apart (bind them with `functools.partial`, as HF does).

    Args:
        worker_id: the worker index (unused: torch's initial seed already includes it).
        num_workers: workers per process.
        rank: this process's index.
    """
    del worker_id
    set_seed((torch.initial_seed() + num_workers * rank) % 2**32)  # numpy takes seeds < 2**32


# --------------------------------------------------------------------------------------------
# Metrics and small helpers
# --------------------------------------------------------------------------------------------
def speed_metrics(
    split: str,
    start_time: float,
    num_samples: int | None = None,
    num_steps: int | None = None,
    num_tokens: int | None = None,
) -> dict[str, float]:
    """Runtime and throughput since `start_time` (a `time.time()` value), with HF's keys and rounding.

    Args:
        split: key prefix, e.g. "train" or "eval".
        start_time: `time.time()` taken when the measured work started.
        num_samples, num_steps, num_tokens: counts processed; each one given adds a rate.

    Returns:
        `{split}_runtime` (4 decimals) and, when the runtime is not zero,
        `{split}_samples_per_second` / `_steps_per_second` / `_tokens_per_second` (3 decimals).

    Example:
        >>> speed_metrics("eval", time.time() - 2.0, num_samples=10)  # doctest: +SKIP
        {'eval_runtime': 2.0, 'eval_samples_per_second': 5.0}
    """
    runtime = time.time() - start_time
    result = {f"{split}_runtime": round(runtime, 4)}
    if runtime == 0:
        return result
    counts = {"samples": num_samples, "steps": num_steps, "tokens": num_tokens}
    for unit, count in counts.items():
        if count is not None:
            result[f"{split}_{unit}_per_second"] = round(count / runtime, 3)
    return result


def estimate_mfu(total_flos: float, seconds: float, device: Any, world_size: int = 1) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s per device over the device's dense bf16 peak.

    Args:
        total_flos: floating-point operations of the run summed over all processes (`state.total_flos`).
        seconds: wall time the operations took.
        device: the `torch.device` (or string) the run used.
        world_size: number of processes that shared `total_flos`.

    Returns:
        A fraction (0.4 means 40 % of peak), or None on a CPU, an unknown GPU, or no time.
    """
    from .runtime.devices import peak_flops  # on use: importing this module needs no device facts

    peak = peak_flops(device) if seconds > 0 else None
    if peak is None:
        return None
    return total_flos / max(1, world_size) / seconds / peak


def compare_trainer_and_checkpoint_args(training_args: Any, trainer_state: Any) -> list[str]:
    """Warn about the intervals and the batch size that differ from a checkpoint's ``trainer_state.json``, in
    transformers' wording (``save_steps: 10 (from args) != 5 (from trainer_state.json)``): the resumed run goes on
    with this run's values.

    Args:
        training_args: this run's ``TrainingArguments``.
        trainer_state: the checkpoint's ``TrainerState``.

    Returns:
        The lines warned about (empty when everything agrees).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> compare_trainer_and_checkpoint_args(NS(logging_steps=1, eval_steps=None, save_steps=10, n_gpu=1,
        ...     per_device_train_batch_size=4), NS(logging_steps=1, eval_steps=5, save_steps=5, train_batch_size=4))
        ['save_steps: 10 (from args) != 5 (from trainer_state.json)']
    """
    lines = []
    for name in ("logging_steps", "eval_steps", "save_steps"):
        ours, saved = getattr(training_args, name, None), getattr(trainer_state, name, None)
        if ours is not None and saved is not None and ours != saved:
            lines.append(f"{name}: {ours} (from args) != {saved} (from trainer_state.json)")
    saved_batch = getattr(trainer_state, "train_batch_size", None)
    if saved_batch is not None:  # the state's batch is of all the process's devices (transformers' n_gpu)
        saved_batch //= max(1, getattr(training_args, "n_gpu", 1))
        if training_args.per_device_train_batch_size != saved_batch:
            lines.append(f"per_device_train_batch_size: {training_args.per_device_train_batch_size} (from args) != "
                         f"{saved_batch} (from trainer_state.json)")
    if lines:
        logger.warning("Warning: The following arguments do not match the ones in the `trainer_state.json` within "
                       "the checkpoint directory: " + "".join(f"\n\t{line}" for line in lines))
    return lines


def has_length(dataset: Any) -> bool:
    """Whether `len(dataset)` works (iterable datasets and some wrappers raise instead)."""
    try:
        return len(dataset) is not None
    except (TypeError, AttributeError):  # AttributeError: some dataset libraries raise it from __len__
        return False


def denumpify_detensorize(metrics: Any) -> Any:
    """Turn numpy scalars and one-element tensors into python numbers, recursively.

    Args:
        metrics: a number, array scalar, tensor, or a list/tuple/dict of them.

    Returns:
        The same structure with plain python numbers where a scalar was.
    """
    if isinstance(metrics, (list, tuple)):
        return type(metrics)(denumpify_detensorize(m) for m in metrics)
    if isinstance(metrics, dict):
        return type(metrics)({k: denumpify_detensorize(v) for k, v in metrics.items()})
    if isinstance(metrics, np.generic):
        return metrics.item()
    if isinstance(metrics, torch.Tensor) and metrics.numel() == 1:
        return metrics.item()
    return metrics


def number_of_arguments(func: Callable) -> int:
    """How many parameters `func` still takes (a `functools.partial`'s bound ones are subtracted)."""
    if isinstance(func, functools.partial):
        total = len(inspect.signature(func.func).parameters)
        return total - len(func.args) - len(func.keywords)
    return len(inspect.signature(func).parameters)


# Messages of out-of-memory errors that surface as plain RuntimeError (CPU allocator, MPS, cuDNN).
_OOM_MESSAGES = (
    " out of memory",
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
)


def _is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _OOM_MESSAGES)


def find_executable_batch_size(
    function: Callable | None = None, starting_batch_size: int = 128, auto_find_batch_size: bool = False
) -> Callable:
    """Decorator: call `function(batch_size, ...)`, 10% smaller after each out-of-memory (accelerate's rule).

    HF's signature: with `auto_find_batch_size=False` (the default, as in transformers) the function
    is called once as `function(..., batch_size=starting_batch_size)` and errors propagate; with True
    the batch size is passed as the first positional argument (as accelerate does), and after a
    `torch.OutOfMemoryError` (or an out-of-memory `RuntimeError`) the call is retried at
    `int(0.9 * size)` (128 -> 115 -> 103 ...), raising `RuntimeError` once the size reaches 0.

    Args:
        function: the function to wrap; omit it to use the decorator with arguments.
        starting_batch_size: the first size tried.
        auto_find_batch_size: retry on out-of-memory.

    Returns:
        The wrapped function, which takes the remaining arguments of `function`.

    Example:
        >>> @find_executable_batch_size(starting_batch_size=64, auto_find_batch_size=True)
        ... def train(batch_size):
        ...     return batch_size
        >>> train()
        64
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            auto_find_batch_size=auto_find_batch_size,
        )
    if not auto_find_batch_size:
        return functools.partial(function, batch_size=starting_batch_size)

    @functools.wraps(function)
    def run_with_fitting_batch_size(*args, **kwargs):
        batch_size = starting_batch_size
        while batch_size > 0:
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - anything but out-of-memory is re-raised
                if not _is_out_of_memory(error):
                    raise
                smaller = int(batch_size * 0.9)  # accelerate's rule, which transformers uses: 10% at a time
                logger.info("Out of memory at batch size %d; retrying with %d", batch_size, smaller)
                from .runtime.devices import free_memory  # on use, as peak_flops above

                free_memory()  # the failed attempt's tensors and the device's cache, before retrying
                batch_size = smaller
        raise RuntimeError(
            f"No executable batch size found, reached zero: every size from {starting_batch_size} down ran out of memory."
        )

    return run_with_fitting_batch_size


def __getattr__(name: str) -> Any:
    # memory_metrics.py (skip_memory_metrics=False) imports backend and so accelerate: read on first use, so importing
    # this module stays cheap
    if name == "TrainerMemoryTracker":
        from .memory_metrics import TrainerMemoryTracker

        return TrainerMemoryTracker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "compare_trainer_and_checkpoint_args",
    "PREFIX_CHECKPOINT_DIR",
    "RemoveColumnsCollator",
    "check_target_module_exists",
    "rotate_checkpoints",
    "sort_checkpoints",
    "BestRun",
    "EvalLoopOutput",
    "EvalPrediction",
    "HPSearchBackend",
    "HubStrategy",
    "IntervalStrategy",
    "PredictionOutput",
    "SaveStrategy",
    "SchedulerType",
    "TrainOutput",
    "default_compute_objective",
    "default_hp_space_optuna",
    "default_hp_space_ray",
    "denumpify_detensorize",
    "enable_full_determinism",
    "estimate_mfu",
    "find_executable_batch_size",
    "get_last_checkpoint",
    "has_length",
    "number_of_arguments",
    "seed_worker",
    "set_seed",
    "speed_metrics",
]
