"""skip_memory_metrics=False (issue 19, item 3): transformers' keys, with numbers checked against allocations of
known size made by a callback in each stage."""

from __future__ import annotations

import pytest
import torch

import cadence
from cadence import TrainerCallback, memory_metrics
from tiny import RegressionDataset, RegressionModel, make_args

MiB = 2**20
SLACK = 12 * MiB  # what the rest of a stage may allocate besides the known tensors (a tiny model, a few batches)


def tensor_of(mib: int) -> torch.Tensor:
    return torch.ones(mib * MiB // 4)  # float32, every page written: resident


class Allocates(TrainerCallback):
    """Keeps 64 MiB from __init__ and 32 MiB from step 1 of training; holds 128 MiB for a moment at step 2,
    96 MiB during an evaluation and 48 MiB during a prediction (held by nobody afterwards)."""

    def __init__(self):
        self.kept = []

    def on_init_end(self, args, state, control, **kwargs):
        self.kept.append(tensor_of(64))

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.kept.append(tensor_of(32))
        if state.global_step == 2:
            transient = tensor_of(128)
            del transient

    def on_evaluate(self, args, state, control, **kwargs):
        transient = tensor_of(96)
        del transient

    def on_predict(self, args, state, control, **kwargs):
        transient = tensor_of(48)
        del transient


def run(lib, out, **kw):
    args = make_args(out, lib, max_steps=3, per_device_train_batch_size=8, **kw)
    trainer = lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64),
                          eval_dataset=RegressionDataset(16), callbacks=[Allocates()])
    return trainer, trainer.train().metrics, trainer.evaluate(), trainer.predict(RegressionDataset(8)).metrics


@pytest.fixture(scope="module", autouse=True)
def warmed(tmp_path_factory):
    """One run first: the first train() of a process imports torch._dynamo (with sympy: ~70 MiB), which would
    count in the measured stage."""
    run(cadence, tmp_path_factory.mktemp("warm"))


def memory_keys(metrics):
    return sorted(k for k in metrics if "_mem_" in k)


def test_memory_metrics_measure_known_allocations(tmp_path):
    trainer, train, evaluation, test = run(cadence, tmp_path, skip_memory_metrics=False)
    assert memory_keys(train) == ["before_init_mem_cpu", "init_mem_cpu_alloc_delta", "init_mem_cpu_peaked_delta",
                                  "train_mem_cpu_alloc_delta", "train_mem_cpu_peaked_delta"]  # transformers' (below)
    assert memory_keys(evaluation) == ["eval_mem_cpu_alloc_delta", "eval_mem_cpu_peaked_delta"]
    assert memory_keys(test) == ["test_mem_cpu_alloc_delta", "test_mem_cpu_peaked_delta"]
    assert train["init_mem_cpu_alloc_delta"] == pytest.approx(64 * MiB, abs=SLACK)
    assert train["train_mem_cpu_alloc_delta"] == pytest.approx(32 * MiB, abs=SLACK)
    assert train["train_mem_cpu_peaked_delta"] == pytest.approx(128 * MiB, abs=SLACK)
    assert train["before_init_mem_cpu"] > 64 * MiB  # the interpreter, torch, the test's objects
    assert evaluation["eval_mem_cpu_alloc_delta"] == pytest.approx(0, abs=SLACK)
    assert evaluation["eval_mem_cpu_peaked_delta"] == pytest.approx(96 * MiB, abs=SLACK)
    assert test["test_mem_cpu_peaked_delta"] == pytest.approx(48 * MiB, abs=SLACK)
    assert "init_mem_cpu_alloc_delta" not in evaluation  # init is reported once, with the first stage
    # as transformers: the train stage's numbers are logged, the evaluation's only returned
    assert "train_mem_cpu_alloc_delta" in trainer.state.log_history[-2]
    assert not any("eval_mem_cpu_alloc_delta" in h for h in trainer.state.log_history)
    shown = cadence.Trainer.metrics_format(train)["train_mem_cpu_peaked_delta"]  # log_metrics shows MB
    assert shown == f"{train['train_mem_cpu_peaked_delta'] >> 20}MB"


@pytest.mark.slow  # transformers' peak sampler spins a thread, which slows its run to ~30 s on two shared cores
def test_memory_metrics_keys_equal_transformers(tmp_path):
    import transformers

    _, *ours = run(cadence, tmp_path / "ours", skip_memory_metrics=False)
    _, *theirs = run(transformers, tmp_path / "theirs", skip_memory_metrics=False)
    assert [memory_keys(m) for m in ours] == [memory_keys(m) for m in theirs]
    assert memory_keys(ours[0]) == ["before_init_mem_cpu", "init_mem_cpu_alloc_delta", "init_mem_cpu_peaked_delta",
                                    "train_mem_cpu_alloc_delta", "train_mem_cpu_peaked_delta"]
    # the same allocations measured by both (transformers samples the peak with a spinning thread)
    assert ours[0]["train_mem_cpu_peaked_delta"] == pytest.approx(theirs[0]["train_mem_cpu_peaked_delta"], abs=SLACK)
    assert ours[1]["eval_mem_cpu_peaked_delta"] == pytest.approx(theirs[1]["eval_mem_cpu_peaked_delta"], abs=SLACK)


def test_skipped_by_default(tmp_path):
    _, train, evaluation, test = run(cadence, tmp_path)
    assert memory_keys(train) == memory_keys(evaluation) == memory_keys(test) == []


def test_an_evaluation_inside_training_is_part_of_the_train_stage(tmp_path):
    args = make_args(tmp_path, max_steps=3, eval_strategy="steps", eval_steps=1, skip_memory_metrics=False)
    trainer = cadence.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64),
                              eval_dataset=RegressionDataset(16), callbacks=[Allocates()])
    train = trainer.train().metrics
    assert train["train_mem_cpu_peaked_delta"] == pytest.approx(128 * MiB, abs=SLACK)  # the 96 MiB ones are less
    assert not any("eval_mem" in k for h in trainer.state.log_history for k in h)
    assert "eval_mem_cpu_peaked_delta" in trainer.evaluate()  # measured again once training is over


def test_a_failed_training_does_not_leave_the_train_stage_open(tmp_path):
    class Fails(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise RuntimeError("failing on purpose")

    args = make_args(tmp_path, max_steps=3, skip_memory_metrics=False)
    trainer = cadence.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64),
                              eval_dataset=RegressionDataset(16), callbacks=[Fails()])
    with pytest.raises(Exception, match="failing on purpose"):
        trainer.train()
    assert "eval_mem_cpu_alloc_delta" in trainer.evaluate()


def test_accelerator_memory_keys(monkeypatch):
    """On an accelerator the allocator's counts give the _gpu_ keys (transformers' names); faked here, as this
    machine has none: 100 MiB in use before, +10 MiB kept and a 50 MiB peak in init."""
    counts = {"now": 100 * MiB, "peak": 100 * MiB}
    monkeypatch.setattr(memory_metrics.backend, "device_memory", lambda device: (counts["now"], counts["peak"]))
    monkeypatch.setattr(memory_metrics.backend, "reset_device_peak_memory", lambda device: counts.update(peak=counts["now"]))
    monkeypatch.setattr(memory_metrics.backend, "empty_cache", lambda device: None)
    tracker = memory_metrics.TrainerMemoryTracker(False, torch.device("cuda"))
    tracker.start("init")
    counts.update(now=110 * MiB, peak=160 * MiB)
    tracker.stop_and_update_metrics("init")
    tracker.start("train")
    metrics = {}
    tracker.stop_and_update_metrics("train", metrics)
    assert metrics["init_mem_gpu_alloc_delta"] == 10 * MiB and metrics["init_mem_gpu_peaked_delta"] == 50 * MiB
    assert metrics["before_init_mem_gpu"] == 100 * MiB
    assert metrics["train_mem_gpu_alloc_delta"] == 0 and metrics["train_mem_gpu_peaked_delta"] == 0
    assert {k.replace("gpu", "cpu") for k in metrics if "gpu" in k} == {k for k in metrics if "cpu" in k}  # one per cpu key


def test_the_sampled_peak_off_linux(monkeypatch):
    """Where the kernel's peak cannot be reset, a thread samples the resident size (psutil)."""
    monkeypatch.setattr(memory_metrics._LinuxRss, "usable", staticmethod(lambda: False))
    tracker = memory_metrics.TrainerMemoryTracker(False)
    assert isinstance(tracker._rss, memory_metrics._SampledRss)
    tracker.start("eval")
    transient = tensor_of(96)
    import time

    time.sleep(0.05)  # the sampler sees it
    del transient
    metrics = {}
    tracker.stop_and_update_metrics("eval", metrics)
    assert metrics["eval_mem_cpu_peaked_delta"] == pytest.approx(96 * MiB, abs=SLACK)
