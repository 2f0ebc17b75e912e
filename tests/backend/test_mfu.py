"""estimate_mfu: achieved FLOP/s per device over the GPU's dense bf16 peak, None where unknown."""

from __future__ import annotations

import pytest
import torch

from cadence.trainer_utils import estimate_mfu
from repo_paths import TESTS


@pytest.fixture
def gpu_named(monkeypatch):
    """Make ``torch.cuda.get_device_name`` report the given name, as on a machine with that GPU."""

    def set_name(name: str) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)

    return set_name


# (name torch reports, dense bf16 (fp16 for V100/T4) peak from NVIDIA's datasheets)
KNOWN = [
    ("NVIDIA H100 80GB HBM3", 989.4e12),  # SXM
    ("NVIDIA H100 PCIe", 756.5e12),
    ("NVIDIA H100 NVL", 835.5e12),
    ("NVIDIA H200", 989.4e12),
    ("NVIDIA H200 NVL", 835.5e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA A10G", 70e12),
    ("NVIDIA A10", 125e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA L40S", 362.05e12),
    ("NVIDIA L40", 181.05e12),
    ("NVIDIA GeForce RTX 4090", 165.2e12),
    ("Tesla V100-SXM2-16GB", 125e12),
    ("Tesla V100-PCIE-32GB", 112e12),
    ("Tesla V100S-PCIE-32GB", 130e12),
    ("Tesla T4", 65e12),
]


@pytest.mark.parametrize("name,peak", KNOWN)
def test_fraction_of_the_named_gpus_peak(gpu_named, name, peak):
    gpu_named(name)
    # 0.4 * peak FLOP/s sustained for 10 s on one device
    assert estimate_mfu(0.4 * peak * 10.0, 10.0, torch.device("cuda:0")) == pytest.approx(0.4)


def test_total_flos_are_shared_by_the_processes(gpu_named):
    gpu_named("NVIDIA H100 80GB HBM3")
    total = 989.4e12 * 8 * 0.5 * 2.0  # 8 GPUs each at 50 % for 2 s
    assert estimate_mfu(total, 2.0, "cuda", world_size=8) == pytest.approx(0.5)
    assert estimate_mfu(total, 2.0, "cuda", world_size=1) == pytest.approx(4.0)


def test_similar_names_do_not_borrow_each_others_peak(gpu_named):
    # "a10" is a prefix of "a100" and "l4" of "l40s": whole-word, longest-first matching keeps them apart
    results = {}
    for name in ("NVIDIA A10", "NVIDIA A100-SXM4-40GB", "NVIDIA L4", "NVIDIA L40S"):
        gpu_named(name)
        results[name] = estimate_mfu(1e12, 1.0, "cuda")
    assert len(set(results.values())) == 4
    assert results["NVIDIA A100-SXM4-40GB"] == pytest.approx(1e12 / 312e12)


@pytest.mark.parametrize("name", ["NVIDIA GeForce GTX 1080", "AMD Instinct MI300X", "Some Future GPU"])
def test_unknown_gpu_gives_none(gpu_named, name):
    gpu_named(name)
    assert estimate_mfu(1e15, 1.0, "cuda") is None


def test_cpu_and_zero_time_give_none(gpu_named):
    gpu_named("NVIDIA H100 80GB HBM3")  # even with a known GPU in the machine
    assert estimate_mfu(1e15, 1.0, torch.device("cpu")) is None
    assert estimate_mfu(1e15, 1.0, "cpu") is None
    assert estimate_mfu(1e15, 0.0, "cuda") is None


def test_cuda_device_without_a_runtime_gives_none(monkeypatch):
    def no_cuda(device=None):
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "get_device_name", no_cuda)
    assert estimate_mfu(1e15, 1.0, "cuda") is None


def test_train_metrics_carry_mfu_only_where_the_peak_is_known(tmp_path, monkeypatch):
    """On the CPU there is no train_mfu; on a device whose peak is known it is flops / time / peak."""
    import sys

    sys.path.insert(0, str(TESTS))
    from tiny import RegressionDataset, RegressionModel

    from cadence import Trainer, TrainingArguments
    from cadence import loop_state as final_metrics_module  # LoopState.final_metrics computes the MFU

    def train():
        args = TrainingArguments(str(tmp_path), max_steps=3, disable_tqdm=True, save_strategy="no")
        return Trainer(RegressionModel(), args, train_dataset=RegressionDataset(16)).train().metrics

    assert "train_mfu" not in train()
    seen = {}

    def fake(flos, seconds, device, world_size=1):
        seen.update(flos=flos, seconds=seconds, world_size=world_size)
        return 0.25

    monkeypatch.setattr(final_metrics_module, "estimate_mfu", fake)
    metrics = train()
    assert metrics["train_mfu"] == 0.25
    assert seen == {"flos": metrics["total_flos"], "seconds": metrics["train_runtime"], "world_size": 1}
