"""cadence.trainer_utils: the public types and helpers, checked against transformers where it has them."""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from cadence import trainer_utils as tu
from cadence.trainer_utils import (
    EvalLoopOutput,
    EvalPrediction,
    HubStrategy,
    IntervalStrategy,
    PredictionOutput,
    SaveStrategy,
    SchedulerType,
    TrainOutput,
    denumpify_detensorize,
    enable_full_determinism,
    find_executable_batch_size,
    get_last_checkpoint,
    has_length,
    number_of_arguments,
    seed_worker,
    set_seed,
    speed_metrics,
)


@pytest.fixture(scope="module")
def hf_utils():
    pytest.importorskip("transformers")
    import transformers.trainer_utils

    return transformers.trainer_utils


# ---------------------------------------------------------------------------------- strategies
@pytest.mark.parametrize("name", ["IntervalStrategy", "SaveStrategy", "HubStrategy", "SchedulerType"])
def test_enum_values_match_transformers(hf_utils, name):
    ours, theirs = getattr(tu, name), getattr(hf_utils, name)
    assert [m.value for m in ours] == [m.value for m in theirs]
    assert [m.name for m in ours] == [m.name for m in theirs]


def test_strategies_are_str_enums():
    assert IntervalStrategy("steps") is IntervalStrategy.STEPS
    assert IntervalStrategy.STEPS == "steps" and SaveStrategy.BEST == "best"
    assert str(SchedulerType.COSINE) == "cosine" and f"{HubStrategy.END}" == "end"
    assert SaveStrategy.EPOCH == IntervalStrategy.EPOCH  # compared by value, as the trainer does
    with pytest.raises(ValueError, match=r"'sometimes' is not a valid IntervalStrategy.*'no', 'steps', 'epoch'"):
        IntervalStrategy("sometimes")


# ---------------------------------------------------------------------------------- result types
@pytest.mark.parametrize("extra", [{}, {"inputs": "I"}, {"losses": "L"}, {"inputs": "I", "losses": "L"}])
def test_eval_prediction_unpacks_like_transformers(hf_utils, extra):
    ours = EvalPrediction("P", "Y", **extra)
    theirs = hf_utils.EvalPrediction("P", "Y", **extra)
    assert tuple(ours) == tuple(theirs) == ("P", "Y", *extra.values())
    assert [ours[i] for i in range(len(ours))] == list(theirs)
    with pytest.raises(IndexError):
        ours[len(ours)]
    with pytest.raises(IndexError):
        ours[-1]


def test_eval_prediction_two_name_unpacking():
    predictions, labels = EvalPrediction(np.array([1.0, 2.0]), np.array([1, 0]))
    assert predictions.tolist() == [1.0, 2.0] and labels.tolist() == [1, 0]


@pytest.mark.parametrize("name", ["EvalLoopOutput", "PredictionOutput", "TrainOutput"])
def test_named_tuples_have_transformers_fields(hf_utils, name):
    assert getattr(tu, name)._fields == getattr(hf_utils, name)._fields


def test_named_tuples_unpack():
    step, loss, metrics = TrainOutput(3, 0.5, {"train_runtime": 1.0})
    assert (step, loss, metrics) == (3, 0.5, {"train_runtime": 1.0})
    assert PredictionOutput([1], None, {}).label_ids is None
    assert EvalLoopOutput([1], [2], {"eval_loss": 1.0}, 4).num_samples == 4


# ---------------------------------------------------------------------------------- checkpoints
def _checkpoint(root, name, complete=True):
    path = root / name
    path.mkdir()
    if complete:
        (path / "trainer_state.json").write_text("{}")
    return str(path)


def test_get_last_checkpoint_picks_highest_complete_step(tmp_path):
    _checkpoint(tmp_path, "checkpoint-9")
    best = _checkpoint(tmp_path, "checkpoint-10")  # 10 > 9 numerically, though "10" < "9" as text
    _checkpoint(tmp_path, "checkpoint-20", complete=False)  # no trainer_state.json: not complete
    _checkpoint(tmp_path, "tmp-checkpoint-30")  # being written: never a checkpoint
    _checkpoint(tmp_path, "checkpoint-40-old")
    (tmp_path / "checkpoint-50").write_text("a file, not a folder")
    assert get_last_checkpoint(tmp_path) == best
    assert get_last_checkpoint(str(tmp_path)) == best


def test_get_last_checkpoint_none(tmp_path):
    assert get_last_checkpoint(tmp_path) is None
    _checkpoint(tmp_path, "checkpoint-3", complete=False)
    _checkpoint(tmp_path, "tmp-checkpoint-4")
    assert get_last_checkpoint(tmp_path) is None


def test_prefix_matches_transformers(hf_utils):
    assert tu.PREFIX_CHECKPOINT_DIR == hf_utils.PREFIX_CHECKPOINT_DIR == "checkpoint"


# ---------------------------------------------------------------------------------- metrics
def test_speed_metrics_values(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1000.0)
    metrics = speed_metrics("eval", 997.0, num_samples=10, num_steps=4, num_tokens=1001)
    assert metrics == {
        "eval_runtime": 3.0,
        "eval_samples_per_second": 3.333,
        "eval_steps_per_second": 1.333,
        "eval_tokens_per_second": 333.667,
    }
    assert speed_metrics("train", 1000.0 - 1 / 3) == {"train_runtime": 0.3333}
    assert speed_metrics("test", 1000.0, num_samples=5) == {"test_runtime": 0.0}  # no rate from a zero runtime


def test_speed_metrics_match_transformers(hf_utils, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 50.0)
    for kwargs in ({}, {"num_samples": 7}, {"num_steps": 3, "num_tokens": 99}):
        assert speed_metrics("train", 42.123456, **kwargs) == hf_utils.speed_metrics("train", 42.123456, **kwargs)


def test_denumpify_detensorize():
    metrics = {"a": np.float32(0.5), "b": [np.int64(3), torch.tensor(2.5)], "c": (torch.tensor([7]),), "d": "x"}
    out = denumpify_detensorize(metrics)
    assert out == {"a": 0.5, "b": [3, 2.5], "c": (7,), "d": "x"}
    assert type(out["a"]) is float and type(out["b"][0]) is int and type(out["c"]) is tuple
    vector = torch.tensor([1.0, 2.0])
    assert denumpify_detensorize(vector) is vector  # only scalars are converted


def test_has_length():
    class Unsized:
        def __len__(self):
            raise TypeError("no length")

    assert has_length([1, 2]) and has_length(range(0)) is True
    assert not has_length(iter([1])) and not has_length(Unsized())


def test_number_of_arguments():
    import functools

    def f(a, b, c):
        return a

    assert number_of_arguments(f) == 3
    assert number_of_arguments(functools.partial(f, 1, c=2)) == 1


# ---------------------------------------------------------------------------------- seeding
def _draw():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_set_seed_reproduces_every_generator():
    set_seed(123)
    first = _draw()
    set_seed(123)
    assert _draw() == first
    set_seed(124)
    assert _draw() != first


def test_seed_worker_matches_transformers(hf_utils):
    for num_workers, rank in ((0, 0), (2, 1)):
        torch.manual_seed(7)
        hf_utils.seed_worker(0, num_workers, rank)
        expected = _draw()
        torch.manual_seed(7)
        seed_worker(0, num_workers, rank)
        assert _draw() == expected


def test_seed_worker_differs_per_rank():
    torch.manual_seed(7)
    seed_worker(0)
    rank0 = random.random()
    torch.manual_seed(7)
    seed_worker(0, num_workers=2, rank=1)
    assert random.random() != rank0


@pytest.mark.parametrize("via", ["enable_full_determinism", "set_seed"])
def test_determinism_switch(monkeypatch, via):
    for var in ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC"):
        monkeypatch.setenv(var, "unset")  # restored (removed) by monkeypatch at teardown
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    try:
        enable_full_determinism(5) if via == "enable_full_determinism" else set_seed(5, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
        value = torch.rand(1).item()
        set_seed(5)
        assert torch.rand(1).item() == value  # it seeded too
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]


# ---------------------------------------------------------------------------------- batch size search
def _fits_at_most(limit, error):
    tried = []

    def train(batch_size, scale=1):
        tried.append(batch_size)
        if batch_size > limit:
            raise error
        return batch_size * scale

    return train, tried


@pytest.fixture
def frozen_heap():
    """Both searches call gc.collect() after each of their 16 out-of-memory errors, and a collection walks every object
    the test session holds (seconds each late in the suite): gc.freeze() sets the objects alive now aside for the
    test, so each collection walks only the test's own; the calls and the sizes tried are the same."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize(
    "error",
    [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"),
     RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB")],
)
def test_find_executable_batch_size_shrinks_10_percent_on_oom_as_accelerate(error, frozen_heap):
    from accelerate.utils import find_executable_batch_size as accelerate_find

    train, tried = _fits_at_most(20, error)
    wrapped = find_executable_batch_size(train, starting_batch_size=128, auto_find_batch_size=True)
    assert wrapped(scale=10) == 190
    assert tried == [128, 115, 103, 92, 82, 73, 65, 58, 52, 46, 41, 36, 32, 28, 25, 22, 19]
    reference, theirs = _fits_at_most(20, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    accelerate_find(reference, starting_batch_size=128)(scale=10)
    assert theirs == tried


def test_find_executable_batch_size_as_decorator_with_arguments():
    tried = []

    @find_executable_batch_size(starting_batch_size=8, auto_find_batch_size=True)
    def train(batch_size):
        tried.append(batch_size)
        if batch_size > 2:
            raise torch.OutOfMemoryError("out of memory")
        return batch_size

    assert train() == 2 and tried == [8, 7, 6, 5, 4, 3, 2]


def test_find_executable_batch_size_gives_up_at_zero():
    train, tried = _fits_at_most(0, torch.OutOfMemoryError("out of memory"))
    with pytest.raises(RuntimeError, match="No executable batch size"):
        find_executable_batch_size(train, starting_batch_size=5, auto_find_batch_size=True)()
    assert tried == [5, 4, 3, 2, 1]


def test_find_executable_batch_size_reraises_other_errors():
    train, tried = _fits_at_most(1, ValueError("a bug, not memory"))
    with pytest.raises(ValueError, match="a bug"):
        find_executable_batch_size(train, starting_batch_size=4, auto_find_batch_size=True)()
    assert tried == [4]


def test_find_executable_batch_size_without_search_calls_once(hf_utils):
    # transformers' default: no search, batch_size passed by keyword, errors propagate.
    train, tried = _fits_at_most(1000, RuntimeError("unused"))
    assert find_executable_batch_size(train, starting_batch_size=16)() == 16
    assert hf_utils.find_executable_batch_size(train, starting_batch_size=16)() == 16
    oom, _ = _fits_at_most(1, torch.OutOfMemoryError("out of memory"))
    with pytest.raises(torch.OutOfMemoryError):
        find_executable_batch_size(oom, starting_batch_size=16)()


# ---------------------------------------------------------------------------------- import cost
def test_modules_import_without_transformers_or_accelerate():
    code = (
        "import sys, cadence.trainer_utils, cadence.training_args; "
        "bad = [m for m in ('transformers', 'accelerate') if m in sys.modules]; "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
