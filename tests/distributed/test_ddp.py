"""Two processes (CPU, gloo, launched with torchrun) train exactly like one with the same global batch."""

import dist_exit
import pytest
import torch
from dist_exit import assert_finished


def launch(nproc, model, out, batch, ga, data="random"):
    proc = dist_exit.launch("ddp_worker.py", model, out, batch, ga, data, nproc=nproc, timeout=240)
    assert_finished(proc, nproc)
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


def launch_eval(nproc, out, batch):
    assert_finished(dist_exit.launch("ddp_eval_worker.py", out, batch, nproc=nproc, timeout=240), nproc)
    return torch.load(out, weights_only=True)


@pytest.mark.slow
def test_two_process_evaluation_equals_one(tmp_path):
    one = launch_eval(1, str(tmp_path / "one.pt"), batch=3)
    two = launch_eval(2, str(tmp_path / "two.pt"), batch=3)
    # dataset order, padded duplicates dropped: the same rows, bit for bit
    assert torch.equal(one["predictions"], two["predictions"]) and torch.equal(one["label_ids"], two["label_ids"])
    assert one["predictions"].shape[0] == 19
    for key in ("eval_accuracy", "eval_rows", "eval_loss_rows"):
        assert two["metrics"][key] == one["metrics"][key], key
    assert one["metrics"]["eval_rows"] == 19
    assert two["metrics"]["eval_loss"] == pytest.approx(one["metrics"]["eval_loss"], rel=1e-12)
    assert two["test_metrics"]["test_loss"] == pytest.approx(one["metrics"]["eval_loss"], rel=1e-12)
    # batch_eval_metrics: 7 batches on one process, 4 gathered steps on two; the same accuracy
    assert one["flags"] == [False] * 6 + [True] and two["flags"] == [False] * 3 + [True]
    assert two["batched"]["eval_accuracy"] == one["batched"]["eval_accuracy"] == one["metrics"]["eval_accuracy"]
    assert two["batched"]["eval_loss"] == pytest.approx(one["metrics"]["eval_loss"], rel=1e-12)
@pytest.mark.slow
@pytest.mark.parametrize("data, steps", [("grouped", 6), ("stream", 5), pytest.param("default_device", 6, marks=(
    pytest.mark.skipif(torch.cuda.is_available(), reason="use_cpu=False means the GPU here")))])
def test_two_processes_equal_one_grouped_and_streamed(data, steps, tmp_path):
    """group_by_length groups over the global batch and a stream is cut per global batch: N processes = one. And
    `torchrun` on a machine without a GPU with use_cpu at its default (False) trains on 2 processes like one too (it
    trained each process alone: accelerate's state had no distributed type)."""
    one = launch(1, "plain", str(tmp_path / "one.pt"), batch=8, ga=2, data=data)
    two = launch(2, "plain", str(tmp_path / "two.pt"), batch=4, ga=2, data=data)
    assert len(one["losses"]) == len(two["losses"]) == steps
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-9)
    for name, value in one["weights"].items():
        assert torch.allclose(two["weights"][name], value, atol=1e-9, rtol=0), name
