"""SIGTERM/SIGUSR1 to the whole process group (what schedulers send) with dataloader workers: the workers
ignore it, the main process saves a checkpoint at the step end, train() returns marked as interrupted,
and the resumed run ends bit-identical to one that was never signalled."""

import json
import logging
import os
import signal

import pytest
import torch
from dist_exit import launch
from test_crash import Signal
from test_resume import train


def run_worker(out, *extra):
    proc = launch("jit_worker.py", out, *extra, nproc=1, timeout=300, start_new_session=True)  # its own group
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{\"global_step\"")]
    return proc, (json.loads(lines[-1]) if lines else None)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGTERM", "SIGUSR1"])
def test_signal_to_the_process_group_with_workers_saves_and_exits_for_requeue(tmp_path, name):
    out = str(tmp_path / "run")
    proc, report = run_worker(out, "--signal", name, "3")
    assert proc.returncode == 128 + getattr(signal, name), proc.stderr[-3000:]
    assert "killed by signal" not in proc.stderr and "Traceback" not in proc.stderr
    assert report == {"global_step": 3, "interrupted_metric": True, "state_interrupted": True,
                      "listing": ["checkpoint-3"]}
    assert f"training was interrupted by {name} at step 3" in proc.stderr
    proc, report = run_worker(out, "--resume")  # the requeued job
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["global_step"] == 12 and report["interrupted_metric"] is None and report["state_interrupted"] is False
    reference = str(tmp_path / "reference")
    proc, _ = run_worker(reference)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, expected = (torch.load(os.path.join(d, "final.pt"), weights_only=True) for d in (out, reference))
    assert all(torch.equal(got[k], v) for k, v in expected.items())


def test_a_run_that_fails_with_workers_still_exits(tmp_path):
    """The workers take SIGTERM from their parent: exiting on an error, the main process can end them."""
    proc, report = run_worker(str(tmp_path / "run"), "--fail-at", "2")
    assert proc.returncode == 1 and "failing at step 2 on purpose" in proc.stderr and report is None


def test_an_interrupted_run_is_marked_and_a_finished_one_is_not(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="cadence"):
        trainer, result = train(str(tmp_path / "run"), callbacks=[Signal(2, signal.SIGUSR1)],
                                enable_jit_checkpoint=True, num_train_epochs=1)
    assert result.global_step == 2 and result.metrics["interrupted"] is True and trainer.state.interrupted
    assert trainer.state.log_history[-1]["interrupted"] is True  # trackers see it too
    assert any("interrupted by SIGUSR1 at step 2 of 6: checkpoint-2 is saved" in r.getMessage() for r in caplog.records)
    trainer, result = train(str(tmp_path / "full"), enable_jit_checkpoint=True, num_train_epochs=1)
    assert "interrupted" not in result.metrics and trainer.state.interrupted is False
    # not a field of trainer_state.json: transformers' TrainerState must still load cadence's files
    saved = json.loads((tmp_path / "run" / "checkpoint-2" / "trainer_state.json").read_text())
    assert "interrupted" not in saved
