"""Crashes and signals: SIGKILL at any moment (mid-step, mid-save) leaves a resumable run that ends
bit-identical to one never killed; SIGTERM/SIGUSR1 save at the next step end and stop cleanly; a
failed save (disk full, permission denied) raises a clear error and leaves older checkpoints intact."""

import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_resume import assert_same_run, train

from cadence import TrainerCallback, get_last_checkpoint
from cadence.checkpoint_io.folders import sorted_checkpoints
from repo_paths import TESTS, WORKERS

HERE = TESTS
CHECKPOINT = re.compile(r"checkpoint-\d+")


def start(out, *extra):
    src = os.path.join(os.path.dirname(HERE), "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([HERE, src])}
    return subprocess.Popen([sys.executable, os.path.join(WORKERS, "crash_worker.py"), out, *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(proc):
    """Block until the worker reports its first step (imports and set-up are over); the line."""
    for line in proc.stdout:
        if line.startswith(("STEP", "DONE")):
            return line
    raise AssertionError(f"worker ended without training: {proc.stderr.read()[-3000:]}")


def finish(proc):
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    return stdout


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_is_bit_identical(tmp_path):
    reference = str(tmp_path / "reference")
    finish(start(reference))
    expected = torch.load(os.path.join(reference, "final.pt"), weights_only=True)

    out = str(tmp_path / "run")
    proc = start(out, "--kill-in-save", "3")  # killed half-way through writing checkpoint-3
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(os.path.join(out, "checkpoint-3")) and get_last_checkpoint(out).endswith("checkpoint-2")
    assert [n for n in os.listdir(out) if not CHECKPOINT.fullmatch(n)]  # the killed save's staging folder, by any name

    rng = random.Random(0)
    kills = 0
    for _ in range(4):  # killed at a random moment of a step or a save, then resumed
        proc = start(out)
        if wait_for_step(proc).startswith("DONE"):
            break
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=120)
        kills += proc.returncode == -signal.SIGKILL
        assert not any(n.startswith("checkpoint-") and not os.path.exists(os.path.join(out, n, "trainer_state.json"))
                       for n in os.listdir(out))  # every checkpoint-N folder is complete
    assert kills >= 3
    finish(start(out))
    got = torch.load(os.path.join(out, "final.pt"), weights_only=True)
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
    assert all(CHECKPOINT.fullmatch(n) or n == "final.pt" for n in os.listdir(out))  # killed saves' leftovers are gone


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(tmp_path):
    out = str(tmp_path / "run")
    proc = start(out, "--jit")
    wait_for_step(proc)
    proc.send_signal(signal.SIGTERM)
    stdout = finish(proc)  # exit code 0: train() returned normally
    stopped = int(stdout.strip().splitlines()[-1].split()[1])
    assert stopped < 18 and get_last_checkpoint(out).endswith(f"checkpoint-{stopped}")
    finish(start(out))  # resume to the end
    reference = str(tmp_path / "reference")
    finish(start(reference))
    got, expected = (torch.load(os.path.join(d, "final.pt"), weights_only=True) for d in (out, reference))
    assert all(torch.equal(got[k], v) for k, v in expected.items())


class Signal(TrainerCallback):
    def __init__(self, step, signum):
        self.step, self.signum = step, signum

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_checkpoints_at_the_step_end_and_stops(tmp_path, signum):
    out = str(tmp_path / "run")
    before = signal.getsignal(signum)
    trainer, result = train(out, callbacks=[Signal(4, signum)], enable_jit_checkpoint=True, save_strategy="no")
    assert result.global_step == 4 and os.listdir(out) == ["checkpoint-4"]
    assert signal.getsignal(signum) == before  # handler given back after training
    full = train(str(tmp_path / "full"))
    assert_same_run(full, train(out, resume=True))


def test_signals_are_not_caught_by_default(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    class Look(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(signal.getsignal(signal.SIGTERM))
            control.should_training_stop = True

    train(str(tmp_path / "run"), callbacks=[Look()])
    assert seen == [before]  # transformers' default: enable_jit_checkpoint=False


@pytest.mark.parametrize("name", ["rng_state.pth", "optimizer.pt", "training_args.bin"])
@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), PermissionError(13, "Permission denied"),
                                   RuntimeError("[enforce fail at inline_container.cc] file write failed")])
def test_failed_save_is_a_clear_error_and_keeps_older_checkpoints(tmp_path, monkeypatch, error, name):
    out = str(tmp_path / "run")
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):  # the disk fills up (or turns read-only) while checkpoint-4 is written
        if "checkpoint-4" in str(f) and str(f).endswith(name):
            raise error
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="could not write checkpoint .*checkpoint-4.*older checkpoints are intact"):
        train(out, save_steps=2)
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(os.listdir(out)) == ["checkpoint-2"]  # no half-written folder
    trainer, _ = train(out, resume=True, save_steps=2, stop=3)  # the older one still resumes
    assert trainer.state.global_step == 3


def test_tmp_leftovers_are_never_chosen_and_are_cleaned_at_the_next_save(tmp_path):
    out = str(tmp_path / "run")
    train(out, stop=2, save_steps=2)
    os.makedirs(os.path.join(out, "tmp-checkpoint-9"))
    with open(os.path.join(out, "tmp-checkpoint-9", "trainer_state.json"), "w") as f:
        f.write("{}")  # even a leftover that looks complete inside
    assert get_last_checkpoint(out).endswith("checkpoint-2")
    assert [p.name for p in sorted_checkpoints(out)] == ["checkpoint-2"]
    train(str(out), stop=4, save_steps=4, resume=True)  # the same run continues (a new one is refused there)
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4"]


def test_interrupted_replacement_puts_the_old_checkpoint_back(tmp_path):
    """Killed between moving checkpoint-N aside and moving its replacement in: the old one comes back."""
    out = str(tmp_path / "run")
    train(out, stop=2, save_steps=2)
    os.replace(os.path.join(out, "checkpoint-2"), os.path.join(out, "old-checkpoint-2"))
    trainer, _ = train(out, resume=True, stop=3, save_steps=100)
    assert trainer.state.global_step == 3 and os.path.isdir(os.path.join(out, "checkpoint-2"))
