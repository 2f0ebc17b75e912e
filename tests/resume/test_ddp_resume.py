"""Two processes: each writes its own rng_state_{rank}.pth, the main one the rest; a 2-process run
stopped and resumed equals the unbroken 2-process run; one process resumes it too, from the samples
the two had trained, with a warning that the run is not bit-identical. Under torchrun --max-restarts, a job whose
process was SIGKILLed resumes its own checkpoint by itself, and a restarted attempt's process group connects."""

import os
import re
import shutil
from types import SimpleNamespace

import dist_exit
import pytest
import torch
from dist_exit import assert_finished

from cadence import backend


def launch(nproc, out, *extra, timeout=240, torchrun=()):
    return dist_exit.launch("ddp_resume_worker.py", out, *extra, nproc=nproc, timeout=timeout, torchrun=torchrun)


def ok(proc):
    """Exit 0 and both workers ended cleanly (dist_exit.assert_finished); returns the step both stopped at."""
    assert_finished(proc, 2)
    stops = re.findall(r"STOPPED (\d+)", "\n".join(proc.said))
    assert len(stops) == 2 and stops[0] == stops[1], proc.stdout[-3000:]
    return int(stops[0])


@pytest.mark.slow
def test_two_process_resume_is_exact_and_one_process_resumes_it_too(tmp_path):
    full, out = str(tmp_path / "full"), str(tmp_path / "run")
    steps = ok(launch(2, full))
    assert ok(launch(2, out, "--stop", "2")) == 2 < steps
    ckpt = os.path.join(out, "checkpoint-2")
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(os.listdir(ckpt)) and "rng_state.pth" not in os.listdir(ckpt)
    one = str(tmp_path / "one")
    shutil.copytree(out, one)
    alone = launch(1, one, "--resume")
    assert_finished(alone, 1)
    # 2 steps x 2 accumulated batches x 2 rows x 2 processes = 16 samples of epoch 0 = 8 batches of one process
    assert "written with per-device batch 2 x accumulation 2 x 2 process(es)" in alone.stderr
    assert "the 16 samples of epoch 0 already trained (8 batches of this run)" in alone.stderr
    assert ok(launch(2, out, "--resume")) == steps
    expected = torch.load(os.path.join(full, "final.pt"), weights_only=True)
    got = torch.load(os.path.join(out, "final.pt"), weights_only=True)
    assert set(got) == set(expected) and all(torch.equal(got[k], v) for k, v in expected.items())


@pytest.mark.slow
def test_processes_whose_data_differs_resume_at_the_main_process_position(tmp_path):
    """A checkpoint written by one process, resumed by two whose train_datasets differ in content (process 1's, of the
    same length, is other rows): the main process's data is the checkpoint's, so the job resumes at the checkpoint's
    position (the 8 samples the one process had trained: 2 batches of epoch 0 for each process here). Each process
    deciding alone, process 1 resumed by steps (4 batches in) and ended epoch 0 at step 3, process 0 at step 4; now both
    resume at the main process's position, and process 1 is told its data differs."""
    from ddp_resume_worker import hf_rows
    from test_resume import DropoutTagger, make_args
    from tiny import pad_collate, stop_at

    from cadence import Trainer

    out = str(tmp_path / "run")  # the worker's run on one process, here: checkpoint-2
    Trainer(DropoutTagger(), make_args(out, save_steps=2, num_train_epochs=2, use_cpu=True), train_dataset=hf_rows(0),
            data_collator=pad_collate, callbacks=[stop_at(2)]).train()
    proc = launch(2, out, "--hf-data", "--other-data-rank1", "--resume")
    ends = sorted(re.findall(r"EPOCH END rank (\d) step (\d+)", "\n".join(proc.said)))
    assert ends == [("0", "4"), ("0", "6"), ("1", "4"), ("1", "6")], proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ok(proc) == 6
    assert "but the main process's agrees with the checkpoint's, and it decides for every process" in proc.stderr


@pytest.mark.slow
def test_sigterm_to_one_process_stops_all_at_the_same_step(tmp_path):
    out = str(tmp_path / "run")
    proc = launch(2, out, "--sigterm-rank0", "3")
    assert ok(proc) == 3  # both processes saved and stopped at step 3
    assert os.listdir(out) == ["checkpoint-3"]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(os.listdir(os.path.join(out, "checkpoint-3")))


@pytest.mark.slow
def test_a_job_torchrun_restarts_resumes_its_own_checkpoint_by_itself(tmp_path):
    """torchrun --max-restarts 3: process 1 is SIGKILLed at step 5 of the first attempt; torchrun restarts both, and
    the restarted attempt (not told to resume) starts at checkpoint-4, this job's newest, and ends with the weights of
    the job that never died. checkpoint-6 of another job (another torchrun launch), newer, is never resumed."""
    full, out = str(tmp_path / "full"), str(tmp_path / "run")
    steps = ok(launch(2, full))
    # another job's newer checkpoint there first: a restart must not take it for its own
    assert ok(launch(2, out, "--stop", "6", "--save-steps", "6")) == 6
    proc = launch(2, out, "--save-steps", "4", "--kill-rank1", "5", timeout=400,
                  torchrun=["--max-restarts", "3", "--monitor-interval", "0.2"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    starts = re.findall(r"ATTEMPT restart (\d+) rank (\d) starts at step (\d+)", "\n".join(proc.said))
    assert ("0", "0", "0") in starts and ("0", "1", "0") in starts, proc.stdout[-3000:]  # a new run: the other job's
    restarted = [(r, rank, step) for r, rank, step in starts if r != "0"]  # checkpoint-6 was only warned about
    assert restarted and all(step == "4" for _, _, step in restarted), starts
    assert "resuming from its newest intact checkpoint" in proc.stderr and "checkpoint-4" in proc.stderr
    assert ok(proc) == steps
    expected = torch.load(os.path.join(full, "final.pt"), weights_only=True)
    got = torch.load(os.path.join(out, "final.pt"), weights_only=True)
    assert set(got) == set(expected) and all(torch.equal(got[k], v) for k, v in expected.items())


@pytest.mark.slow
def test_a_restarted_attempt_connects_when_one_process_starts_late(tmp_path):
    """torchrun (torch 2.13 here) keeps one store for every attempt of a job, and the process group's setup keys name
    no attempt: a restarted process that read its peer's key before the peer wrote it again got the address of the
    killed attempt's process, and gloo's connect failed ("Connection refused"; here in about half the restarts where
    process 1 started 8 s late, depending on which side gloo has connect). cadence sets up a restarted attempt's group
    under keys of that attempt: the keys the killed attempt left are never read nor rewritten, and it connects."""
    proc = dist_exit.launch("restart_connect_worker.py", tmp_path, "8", timeout=240,
                            torchrun=["--max-restarts", "1", "--monitor-interval", "0.2"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    restarted = sorted(re.findall(r"ATTEMPT restart 1 rank (\d) sum (\S+) earlier keys (\d+) untouched (\w+)",
                                  "\n".join(proc.said)))
    assert [(rank, total) for rank, total, _, _ in restarted] == [("0", "3"), ("1", "3")], proc.stdout[-3000:]
    # the killed attempt's keys were there (torchrun's one store), and the restarted group left them alone
    assert all(int(n) > 0 and untouched == "True" for _, _, n, untouched in restarted), restarted
    assert_finished(proc, 2)


@pytest.mark.parametrize("restart, nodes, prefix", [("2", "1", "cadence/torchrun_attempt_2/"), ("0", "1", None),
                                                     ("2", "2", "cadence/torchrun_start_1/"),
                                                     ("0", "2", "cadence/torchrun_start_1/")])
def test_a_restart_keys_its_group_setup_by_an_attempt_every_process_names_alike(monkeypatch, restart, nodes, prefix):
    """In this process, a group of one over a TCPStore standing for torchrun's: a restart on one node sets its group up
    under ``cadence/torchrun_attempt_N/`` (one agent: its count names the attempt); the first attempt on one node keeps
    torch's keys; on several nodes each agent counts its own restarts (a healthy node's counts none), so every attempt,
    the first too, is named by the processes' own count of their starts, agreed through the store
    (``cadence/torchrun_start_N/``)."""
    agent = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(agent.port), "RANK": "0", "WORLD_SIZE": "1",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": restart, "GROUP_WORLD_SIZE": nodes}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    options = backend._process_group_options(SimpleNamespace(ddp_backend="gloo", ddp_timeout=60))
    torch.distributed.init_process_group(**options)
    try:
        total = torch.ones(1)
        torch.distributed.all_reduce(total)
        keys = [key for key in agent.list_keys() if not key.startswith("cadence/starts/")]
    finally:
        torch.distributed.destroy_process_group()
    assert total.item() == 1 and keys
    assert all(key.startswith(prefix) for key in keys) if prefix else not any(k.startswith("cadence/") for k in keys), keys
