"""The device verbs of backend.py that the rest of cadence asks instead of torch.cuda / torch.distributed:
pin_memory, free_memory, peak_flops, the device RNG entries of rng_state.pth, the process group's size and
rank, any_process (the JIT signal flag), default_device. Real behaviour on the machine the tests run on (a
CPU here; the GPU branches run on a GPU machine). Two processes combining the JIT flag: test_ddp_resume.py
(--sigterm-rank0)."""

from __future__ import annotations

import gc
import os
import random
import weakref

import numpy as np
import pytest
import torch
from tiny import RegressionDataset, RegressionModel

from cadence import Trainer, TrainingArguments, backend, data
from cadence.checkpoint import rng
from cadence.checkpoint_io import formats
from cadence.backend import Backend


def test_pin_memory_only_for_batches_that_go_to_a_gpu(tmp_path):
    args = TrainingArguments(str(tmp_path))  # dataloader_pin_memory=True by default, as in transformers
    on_gpu = Backend(args).device.type == "cuda"  # False on a machine without one
    assert Backend(args).pin_memory(True) is on_gpu and Backend(args).pin_memory(False) is False
    loader = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(8)).get_train_dataloader()
    assert loader.pin_memory is on_gpu  # pinning pages for a CPU model would only cost


def test_the_arguments_device_is_the_backends_default_device(tmp_path):
    assert backend.default_device(use_cpu=True, local_process_index=3) == torch.device("cpu")
    gpu = backend.accelerator_available()
    assert backend.default_device(local_process_index=0) == (torch.device("cuda", 0) if gpu else torch.device("cpu"))
    for use_cpu in (False, True):
        args = TrainingArguments(str(tmp_path), use_cpu=use_cpu)
        assert args.device == backend.default_device(use_cpu, args.local_process_index) == Backend(args).device


def test_free_memory_collects_the_failed_attempts_tensors():
    """What the out-of-memory retry relies on: tensors kept alive only by a reference cycle are freed at once."""

    class Attempt:  # e.g. a traceback frame that refers back to the activations of the failed step
        pass

    gc.disable()  # so that only free_memory can collect the cycle
    try:
        attempt = Attempt()
        attempt.self, attempt.activations = attempt, torch.zeros(1024)
        alive = weakref.ref(attempt.activations)
        del attempt
        assert alive() is not None
        backend.free_memory(torch.device("cpu"))  # a CPU has no cache to release: this is the collection alone
        assert alive() is None
    finally:
        gc.enable()


def test_peak_flops_only_for_a_known_gpu(monkeypatch):
    assert backend.peak_flops("cpu") is None and backend.peak_flops(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert backend.peak_flops("cuda:0") == 989.4e12  # NVIDIA's datasheet: H100 SXM, dense bf16


def _draws(device: torch.device) -> torch.Tensor:
    return torch.rand(4, device=device)


def test_device_rng_state_round_trips():
    """On a GPU: a draw after restoring the saved state repeats the draw after saving it. Without one there is no
    GPU entry to save, and a GPU run's entry (a transformers checkpoint resumed on a CPU) is ignored."""
    state = backend.device_rng_state()
    if not backend.accelerator_available():
        assert state == {} and backend.device_rng_state(all_devices=True) == {}
        backend.set_device_rng_state({"cuda": torch.zeros(16, dtype=torch.uint8)})  # ignored, no error
        backend.set_device_rng_state({})
        return
    device = backend.default_device()
    first = _draws(device)
    backend.set_device_rng_state(state)
    assert torch.equal(_draws(device), first)
    every = backend.device_rng_state(all_devices=True)
    assert len(every["cuda"]) == torch.cuda.device_count()
    first = _draws(device)
    backend.set_device_rng_state(every)
    assert torch.equal(_draws(device), first)


def test_rng_state_file_from_a_gpu_run_resumes_on_this_machine(tmp_path):
    """rng_state.pth written with a GPU entry (transformers' layout) restores python/numpy/torch here, wherever
    "here" is: the GPU entry is applied where there is a GPU, skipped where there is none."""
    state = rng.capture_rng_state()
    if "cuda" not in state:
        state["cuda"] = torch.zeros(16, dtype=torch.uint8)  # what a GPU run stores; a CPU never reads it
    torch.save(state, tmp_path / "rng_state.pth")
    expected = (random.random(), np.random.rand(), torch.rand(3))
    rng.restore_rng_state(formats.safe_load(tmp_path / "rng_state.pth"))
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


@pytest.fixture
def one_process_group(tmp_path):
    """A real gloo process group of one process, in this process (no launcher)."""
    assert not torch.distributed.is_initialized()
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def test_without_a_process_group():
    assert backend.process_group_size_and_rank() is None
    assert backend.any_process(True, torch.device("cpu")) is True
    assert backend.any_process(False, torch.device("cpu")) is False
    with pytest.raises(ValueError, match="num_replicas and rank are needed"):
        data.DistributedLengthGroupedSampler(2, lengths=[3, 8, 1, 7])
    # given both, no process group is needed
    assert len(data.DistributedLengthGroupedSampler(2, lengths=[3, 8, 1, 7], num_replicas=2, rank=1)) == 2


def test_with_a_process_group(one_process_group):
    assert backend.process_group_size_and_rank() == (1, 0)
    # through a real all-reduce (max) over the group
    assert backend.any_process(True, torch.device("cpu")) is True
    assert backend.any_process(False, torch.device("cpu")) is False
    sampler = data.DistributedLengthGroupedSampler(2, lengths=[3, 8, 1, 7])  # the group's size and rank
    assert (sampler.num_replicas, len(sampler)) == (1, 4)


def test_nothing_outside_backend_names_the_device_libraries():
    """Only the backend package and the device and process facts below it (runtime/) speak torch.cuda /
    torch.distributed (word-level facts such as file formats and field names excepted, listed here)."""
    import re

    import cadence

    root = os.path.dirname(cadence.__file__)
    allowed = {  # (file, text on the line): the word is the fact
        ("sharded.py", "torch.distributed.checkpoint"),  # FSDP shards' format
        ("training_args.py", "torch.distributed backend"),  # ddp_backend's help: what the field names
    }
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py") or os.path.relpath(folder, root) in ("backend", "runtime"):
                continue
            with open(os.path.join(folder, name)) as f:
                for line in f:
                    if re.search(r"torch\.cuda|torch\.distributed|\bdist\.", line) and not any(
                            name == file and text in line for file, text in allowed):
                        found.append(f"{name}: {line.strip()}")
    assert found == []
