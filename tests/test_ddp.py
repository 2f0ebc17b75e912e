"""Two processes (CPU, gloo, launched with torchrun) train exactly like one with the same global batch."""

import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(__file__)


def launch(nproc, model, out, batch, ga, data="random"):
    src = os.path.join(os.path.dirname(HERE), "src")  # this checkout's cadence, even beside another install
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([HERE, src])}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           os.path.join(HERE, "ddp_worker.py"), model, out, str(batch), str(ga), data]
    if nproc == 1:
        cmd = [sys.executable, os.path.join(HERE, "ddp_worker.py"), model, out, str(batch), str(ga), data]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["plain", "items"])
def test_two_processes_equal_one(model, tmp_path):
    one = launch(1, model, str(tmp_path / "one.pt"), batch=8, ga=2)
    two = launch(2, model, str(tmp_path / "two.pt"), batch=4, ga=2)
    assert len(one["losses"]) == len(two["losses"]) == 6
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-9)
    for name, value in one["weights"].items():
        assert torch.allclose(two["weights"][name], value, atol=1e-9, rtol=0), name


@pytest.mark.slow
@pytest.mark.parametrize("data, steps", [("grouped", 6), ("stream", 5)])
def test_two_processes_equal_one_grouped_and_streamed(data, steps, tmp_path):
    """group_by_length groups over the global batch and a stream is cut per global batch: N processes = one."""
    one = launch(1, "plain", str(tmp_path / "one.pt"), batch=8, ga=2, data=data)
    two = launch(2, "plain", str(tmp_path / "two.pt"), batch=4, ga=2, data=data)
    assert len(one["losses"]) == len(two["losses"]) == steps
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-9)
    for name, value in one["weights"].items():
        assert torch.allclose(two["weights"][name], value, atol=1e-9, rtol=0), name
