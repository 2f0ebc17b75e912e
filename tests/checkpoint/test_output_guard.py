"""Who writes an output_dir: running again into it works as in transformers (warned, the earlier run's checkpoints
kept from this run's rotation, or cleared on request); two live runs are refused by an atomic lock."""

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors.torch import load_file
from test_resume import train
from tiny import RegressionDataset, RegressionModel, make_args

import cadence
from cadence import Trainer, TrainerCallback
from cadence import output_guard
from cadence.output_guard import LOCK_NAME
from repo_paths import TESTS, WORKERS, IMPORT_PATHS

HERE = TESTS


def listing(folder):
    return sorted(os.listdir(folder))


def earlier_run_warnings(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING and "checkpoints of an earlier run" in r.getMessage()]


def regression(lib, out, seed, **kw):
    """A tiny regression run of ``lib`` (cadence or transformers) with a checkpoint every 2 steps."""
    args = make_args(out, lib, max_steps=kw.pop("max_steps", 4), per_device_train_batch_size=4, learning_rate=0.1,
                     save_strategy="steps", save_steps=2, seed=seed, use_cpu=True, optim="sgd", **kw)
    torch.manual_seed(seed)
    trainer = lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(32, seed=seed))
    trainer.train()
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def saved_weights(folder):
    return load_file(os.path.join(folder, "model.safetensors"))


def test_running_again_into_an_output_dir_trains_like_transformers_and_keeps_the_earlier_checkpoints(tmp_path, caplog):
    """Run A leaves checkpoint-4 and -6; run B (another seed, save_total_limit=1) trains into the same folder: one
    warning naming them, B's weights equal B's in a fresh folder, B's checkpoint-4 replaced A's, A's checkpoint-6
    is untouched, B's own checkpoint-2 was rotated away. transformers also trains B there, to the same weights."""
    out = str(tmp_path / "run")
    regression(cadence, out, seed=1, max_steps=6, save_total_limit=2)
    assert listing(out) == ["checkpoint-4", "checkpoint-6"]
    a6 = (tmp_path / "run" / "checkpoint-6" / "model.safetensors").read_bytes()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        b = regression(cadence, out, seed=2, save_total_limit=1)
    warned = earlier_run_warnings(caplog)
    assert len(warned) == 1, [r.getMessage() for r in warned]
    for named in ("checkpoint-4, checkpoint-6", "replaces the earlier one atomically", "overwrite_output_dir=True",
                  "rotation (save_total_limit) deletes only checkpoints it writes"):
        assert named in warned[0].getMessage()
    fresh = regression(cadence, str(tmp_path / "fresh"), seed=2, save_total_limit=1)
    assert all(torch.equal(b[k], fresh[k]) for k in fresh)
    assert listing(out) == ["checkpoint-4", "checkpoint-6"]  # B's 2 rotated away by B's own limit, A's 6 kept
    assert (tmp_path / "run" / "checkpoint-6" / "model.safetensors").read_bytes() == a6
    replaced = saved_weights(os.path.join(out, "checkpoint-4"))
    assert all(torch.equal(replaced[k], fresh[k]) for k in fresh)  # B's, not A's
    state = json.loads((tmp_path / "run" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and json.loads((tmp_path / "fresh" / "checkpoint-4" / "trainer_state.json").read_text())["log_history"] == state["log_history"]
    # transformers: the same two runs into one folder; B trains (not refused) to the weights cadence's B has
    transformers = pytest.importorskip("transformers")
    hf_out = str(tmp_path / "hf")
    regression(transformers, hf_out, seed=1, max_steps=6, save_total_limit=2)
    # no limit for transformers' B: its rotation counts A's checkpoints and, ordering by step when all were written
    # within a second, can delete the checkpoint it just wrote (the difference README's re-run entry names)
    hf_b = regression(transformers, hf_out, seed=2)
    assert all(torch.allclose(hf_b[k], b[k], atol=1e-6, rtol=1e-5) for k in b)
    hf_replaced = saved_weights(os.path.join(hf_out, "checkpoint-4"))
    assert all(torch.allclose(hf_replaced[k], replaced[k], atol=1e-6, rtol=1e-5) for k in b)  # replaced there too


def test_the_earlier_runs_checkpoints_are_never_rotated_away(tmp_path):
    """Run A: checkpoint-2..-8 kept (no limit). Run B (save_total_limit=1, 4 steps) keeps only its newest own one
    plus all of A's that it did not replace; with limit 1 B never counts A's toward its limit."""
    out = str(tmp_path / "run")
    regression(cadence, out, seed=1, max_steps=8)
    a8 = (tmp_path / "run" / "checkpoint-8" / "model.safetensors").read_bytes()
    a2 = (tmp_path / "run" / "checkpoint-2" / "model.safetensors").read_bytes()
    regression(cadence, out, seed=2, max_steps=4, save_total_limit=1)
    # B wrote 2 (replacing A's) then 4 (replacing A's) and rotated its 2 away; A's 6 and 8 stay
    assert listing(out) == ["checkpoint-4", "checkpoint-6", "checkpoint-8"]
    assert (tmp_path / "run" / "checkpoint-8" / "model.safetensors").read_bytes() == a8
    assert a2 != (tmp_path / "run" / "checkpoint-4" / "model.safetensors").read_bytes()


def test_overwrite_output_dir_clears_the_earlier_runs_checkpoints_and_history(tmp_path):
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=2, report_to="jsonl")
    trainer, _ = train(str(out), stop=4, save_steps=2, resume=True)
    trainer.save_state()  # the earlier run's top-level trainer_state.json
    assert {"log_history.jsonl", "trainer_state.json"} <= set(listing(out))
    (out / "tmp-checkpoint-9").mkdir()  # a killed save's leftover is the earlier run's too
    (out / "notes.txt").write_text("mine")
    (out / "checkpoints-of-mine").mkdir()  # not a checkpoint-N name: kept
    trainer, _ = train(str(out), stop=1, save_steps=1, overwrite_output_dir=True)
    assert listing(out) == ["checkpoint-1", "checkpoints-of-mine", "notes.txt"]
    assert json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())["global_step"] == 1
    from cadence.plot import load_history

    history, path = load_history(out)  # what `cadence plot` draws: the new run
    assert path == out / "checkpoint-1" / "trainer_state.json" and all(h["step"] <= 1 for h in history)


def test_overwrite_output_dir_false_as_text_keeps_the_earlier_checkpoints(tmp_path):
    """"false" (from a JSON config or an environment variable) is False: the earlier run's checkpoint stays."""
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=4)
    before = (out / "checkpoint-4" / "model.safetensors").read_bytes()
    train(str(out), stop=1, overwrite_output_dir="false")
    assert listing(out) == ["checkpoint-4"] and (out / "checkpoint-4" / "model.safetensors").read_bytes() == before


def test_a_second_train_call_runs_again_in_its_own_output_dir(tmp_path, caplog):
    out = str(tmp_path / "run")
    trainer, _ = train(out, stop=2, save_steps=2)
    first = (tmp_path / "run" / "checkpoint-2" / "model.safetensors").read_bytes()
    with caplog.at_level(logging.WARNING):
        trainer.train()  # as transformers: a new run from step 0, its checkpoint-2 replaces the first call's
    assert len(earlier_run_warnings(caplog)) == 1
    assert listing(out) == ["checkpoint-2"]
    assert (tmp_path / "run" / "checkpoint-2" / "model.safetensors").read_bytes() != first  # the second run's


def test_resuming_continues_the_run_and_rotates_all_its_checkpoints(tmp_path, caplog):
    out = str(tmp_path / "run")
    train(out, stop=4, save_steps=2, save_total_limit=1)
    with caplog.at_level(logging.WARNING):
        trainer, _ = train(out, resume=True, stop=6, save_steps=2, save_total_limit=1)
    assert not earlier_run_warnings(caplog)  # the same run: nothing earlier
    assert trainer.state.global_step == 6 and listing(out) == ["checkpoint-6"]


# ------------------------------------------------------------------ the lock


def hold_lock(out):
    """Another process that takes ``out``'s lock and keeps it (until killed); returns it once it holds it."""
    base = os.path.dirname(os.path.dirname(out))  # out is BASE/round0/run
    open(os.path.join(base, "round0", "go"), "w").close()
    holder = subprocess.Popen([sys.executable, os.path.join(WORKERS, "lock_worker.py"), base, "1"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": pythonpath()})
    for line in holder.stdout:
        if line.startswith(("GOT", "REFUSED")):
            assert line.startswith("GOT"), line
            return holder
    raise AssertionError(f"the lock holder ended: {holder.wait()}")


def pythonpath():
    return os.pathsep.join([HERE, os.path.join(os.path.dirname(HERE), "src")])


def test_a_live_runs_lock_is_refused_and_a_killed_ones_taken_over(tmp_path):
    out = tmp_path / "round0" / "run"
    out.parent.mkdir()
    holder = hold_lock(str(out))
    try:
        with pytest.raises(ValueError) as info:
            train(str(out), stop=1)
        assert f"pid {holder.pid}" in str(info.value) and "in use by another run" in str(info.value)
        assert listing(out) == [LOCK_NAME]  # the other run's lock is left alone, nothing written
    finally:
        holder.kill()  # SIGKILL: no release, the file stays naming it, the OS drops its flock
        holder.wait()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == holder.pid
    trainer, _ = train(str(out), stop=2, save_steps=2)
    assert trainer.state.global_step == 2 and listing(out) == ["checkpoint-2"]  # and released at the end


def test_a_lock_file_whose_pid_lives_but_holds_no_lock_is_taken_over(tmp_path):
    """After a crash the pid in the file may belong to another process now: the OS lock, not the pid, decides."""
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    trainer, _ = train(str(out), stop=1)
    assert trainer.state.global_step == 1 and listing(out) == []


def test_a_lock_of_another_host_is_refused_naming_the_file(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "some-other-node"}))
    with pytest.raises(ValueError, match=f"pid 1 on host some-other-node.*delete .*{LOCK_NAME}"):
        train(str(out), stop=1)


def test_the_same_torchrun_job_takes_its_lock_over_from_another_host(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-42")
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "some-other-node", "job": output_guard.job_identity()}))
    lock = output_guard.OutputDirLock(out)
    lock.acquire()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-43")  # another job: refused
    (out / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "some-other-node", "job": "not-this-one"}))
    with pytest.raises(ValueError, match="in use by another run"):
        output_guard.OutputDirLock(out).acquire()


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.slow
@pytest.mark.parametrize("fallback", [False, True], ids=["flock", "exclusive-create"])
def test_runs_started_at_once_over_a_dead_runs_lock_exactly_one_gets_it(tmp_path, fallback):
    """6 processes, released at the same moment into a folder whose lock names a dead process: exactly one takes it
    over, every other is refused (8 rounds). The winner holds it until all have answered."""
    n, rounds = 6, 8
    for r in range(rounds):
        out = tmp_path / f"round{r}" / "run"
        out.mkdir(parents=True)
        (out / LOCK_NAME).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    procs = [subprocess.Popen([sys.executable, os.path.join(WORKERS, "lock_worker.py"), str(tmp_path), str(rounds),
                               *(["--no-fcntl"] if fallback else [])], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": pythonpath()}) for _ in range(n)]
    try:
        for p in procs:
            assert p.stdout.readline().startswith("READY")
        for r in range(rounds):
            folder = tmp_path / f"round{r}"
            (folder / "go").touch()
            answers = [p.stdout.readline() for p in procs]
            (folder / "release").touch()
            assert sum(a.startswith("GOT") for a in answers) == 1, (r, answers)
            assert sum(a.startswith("REFUSED") and "in use by another run" in a for a in answers) == n - 1, answers
    finally:
        for r in range(rounds):
            (tmp_path / f"round{r}" / "release").touch()
        for p in procs:
            p.wait(timeout=60)
    for r in range(rounds):
        assert listing(tmp_path / f"round{r}" / "run") == []  # the winner released it


def test_the_exclusive_create_fallback_refuses_a_live_run_and_takes_over_a_dead_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(output_guard, "fcntl", None)
    out = tmp_path / "run"
    out.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / LOCK_NAME).write_text(json.dumps({"pid": live.pid, "host": socket.gethostname()}))
        with pytest.raises(ValueError, match=f"pid {live.pid} on host"):
            train(str(out), stop=1)
    finally:
        live.kill()
        live.wait()
    trainer, _ = train(str(out), stop=2, save_steps=2)  # its pid is dead now: taken over
    assert trainer.state.global_step == 2 and listing(out) == ["checkpoint-2"]


@pytest.mark.parametrize("fallback", [False, True], ids=["flock", "exclusive-create"])
def test_two_threads_of_one_process_one_is_refused(tmp_path, monkeypatch, fallback):
    if fallback:
        monkeypatch.setattr(output_guard, "fcntl", None)
    out = str(tmp_path / "run")
    for _ in range(20):  # at once, many times: never both
        start, results = threading.Barrier(2), []
        locks = [output_guard.OutputDirLock(out) for _ in range(2)]

        def take(lock):
            start.wait()
            try:
                lock.acquire()
                results.append("got")
            except ValueError as e:
                results.append(str(e))

        threads = [threading.Thread(target=take, args=(lock,)) for lock in locks]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert sorted(r == "got" for r in results) == [False, True], results
        assert "in use by another run of this process" in next(r for r in results if r != "got")
        [lock.release(remove_created_dir=False) for lock in locks]
        assert listing(out) == []
    # and two Trainers training in two threads: the second is refused while the first trains, and its refusal
    # leaves the first's note of an earlier run's checkpoint-4 alone (never rotated away by the first)
    train(out, stop=4, save_steps=4)
    first_at_step_1, second_done, errors = threading.Event(), threading.Event(), []

    class Hold(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                first_at_step_1.set()
                second_done.wait(60)

    def first():
        try:
            train(out, stop=2, save_steps=1, save_total_limit=1, callbacks=[Hold()])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert first_at_step_1.wait(120)
        with pytest.raises(ValueError, match="in use by another run of this process"):
            train(out, stop=1)
    finally:
        second_done.set()
        thread.join()
    assert not errors and listing(out) == ["checkpoint-2", "checkpoint-4"]


def test_two_runs_at_once_the_second_refuses_and_the_first_finishes(tmp_path):
    """A second process starts while the first trains: it refuses before its first step; the first is unharmed."""
    out = tmp_path / "run"
    ready = tmp_path / "ready"
    script = f"""
import sys, time
sys.path[:0] = {IMPORT_PATHS!r}
from test_resume import train

from cadence import TrainerCallback
class Hold(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            open({str(ready)!r}, "w").close()
            deadline = time.time() + 120
            while not __import__("os").path.exists({str(ready)!r} + ".done") and time.time() < deadline:
                time.sleep(0.05)
trainer, _ = train({str(out)!r}, stop=4, save_steps=2, callbacks=[Hold()])
print("first done", trainer.state.global_step)
"""
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):
            if ready.exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), first.stderr.read() if first.poll() is not None else "first run did not start"
        with pytest.raises(ValueError, match="in use by another run"):
            train(str(out), stop=1, resume=True)  # even a resume may not write while another run does
        (tmp_path / "ready.done").touch()
        stdout, stderr = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, stderr[-3000:]
    assert "first done 4" in stdout
    assert listing(out) == ["checkpoint-2", "checkpoint-4"]


def test_an_unwritable_output_dir_is_refused_before_step_1(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=f"output_dir={str(blocker / 'run')!r} cannot be written"):
        train(str(blocker / "run"), stop=1)


def test_a_refused_run_leaves_no_folder_and_a_finished_one_keeps_it(tmp_path):
    args = make_args(str(tmp_path / "refused"), max_steps=1)
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(8), data_collator=lambda rows: None)
    with pytest.raises(TypeError, match="data_collator returned None"):
        trainer.train()
    assert not (tmp_path / "refused").exists()
    train(str(tmp_path / "done"), stop=1)  # nothing saved, but the folder is there for save_model (as transformers)
    assert listing(tmp_path / "done") == []




class StartStep(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.step = state.global_step


def test_a_restarted_torchrun_job_resumes_its_newest_intact_checkpoint_and_never_another_jobs(tmp_path, monkeypatch, caplog):
    """In one process, with torchrun's variables set: this job's checkpoint-4 is damaged, so its restart resumes its
    checkpoint-2 and ends as the unbroken run; another job restarting in that folder resumes nothing of it."""
    from test_resume import assert_same_run

    out = tmp_path / "run"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    full = train(str(tmp_path / "full"))
    train(str(out), stop=4, save_steps=2)
    assert json.loads((out / "checkpoint-4" / "loop_state.json").read_text())["job"] == output_guard.job_identity()
    data = bytearray((out / "checkpoint-4" / "optimizer.pt").read_bytes())
    data[-20] ^= 0xFF  # a flipped byte: the manifest's sha256 no longer matches
    (out / "checkpoint-4" / "optimizer.pt").write_bytes(bytes(data))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    start = StartStep()
    with caplog.at_level(logging.WARNING):
        resumed = train(str(out), callbacks=[start])  # not told to resume
    assert start.step == 2
    assert any("resuming from its newest intact checkpoint" in r.getMessage() and "checkpoint-2" in r.getMessage()
               for r in caplog.records)
    assert_same_run(full, resumed)
    # another job (another run id), restarted into this folder: a new run from step 0, the checkpoints kept
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-b")
    start = StartStep()
    train(str(out), stop=1, callbacks=[start])
    assert start.step == 0
