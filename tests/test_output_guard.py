"""One run per output_dir: another run's checkpoints are refused (or cleared on request), a live run's lock too."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from test_resume import train
from tiny import RegressionDataset, RegressionModel

from cadence import Trainer, TrainingArguments
from cadence.output_guard import LOCK_NAME


def listing(folder):
    return sorted(os.listdir(folder))


def test_new_run_over_another_runs_checkpoints_is_refused_before_step_1(tmp_path):
    out = str(tmp_path / "run")
    first, _ = train(out, stop=4, save_steps=2, save_total_limit=1)
    before = listing(out)
    assert before == ["checkpoint-4"]
    weights = (tmp_path / "run" / "checkpoint-4" / "model.safetensors").read_bytes()
    with pytest.raises(ValueError) as info:
        train(out, save_steps=2, save_total_limit=1)
    message = str(info.value)
    for culprit in (f"output_dir={out!r}", "checkpoint-4", "resume_from_checkpoint", "overwrite_output_dir=True"):
        assert culprit in message
    assert listing(out) == before  # no lock left behind, nothing rotated away
    assert (tmp_path / "run" / "checkpoint-4" / "model.safetensors").read_bytes() == weights
    # resuming the same run is the first way on
    trainer, _ = train(out, resume=True, stop=6, save_steps=2, save_total_limit=1)
    assert trainer.state.global_step == 6 and listing(out) == ["checkpoint-6"]


def test_overwrite_output_dir_clears_only_the_checkpoint_folders(tmp_path):
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=2)
    (out / "tmp-checkpoint-9").mkdir()  # a killed save's leftover is another run's too
    (out / "notes.txt").write_text("mine")
    (out / "checkpoints-of-mine").mkdir()  # not a checkpoint-N name: kept
    trainer, _ = train(str(out), stop=1, save_steps=1, overwrite_output_dir=True)
    assert listing(out) == ["checkpoint-1", "checkpoints-of-mine", "notes.txt"]
    assert json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())["global_step"] == 1


def test_a_second_train_call_reuses_its_own_output_dir(tmp_path):
    out = str(tmp_path / "run")
    trainer, _ = train(out, stop=2, save_steps=2)
    trainer.train()  # the same Trainer: its own checkpoints, not another run's
    assert "checkpoint-2" in listing(out)


def test_a_live_runs_lock_is_refused_and_a_dead_ones_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / LOCK_NAME).write_text(json.dumps({"pid": live.pid, "host": socket.gethostname()}))
        with pytest.raises(ValueError) as info:
            train(str(out), stop=1)
        assert f"pid {live.pid}" in str(info.value) and "in use by another run" in str(info.value)
        assert listing(out) == [LOCK_NAME]  # the other run's lock is left alone, nothing written
    finally:
        live.kill()
        live.wait()
    # the same pid, now dead, on this host: a crashed run's lock, taken over
    trainer, _ = train(str(out), stop=2, save_steps=2)
    assert trainer.state.global_step == 2 and listing(out) == ["checkpoint-2"]  # and released at the end


def test_a_lock_of_another_host_is_refused_naming_the_file(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "some-other-node"}))
    with pytest.raises(ValueError, match=f"pid 1 on host some-other-node.*delete .*{LOCK_NAME}"):
        train(str(out), stop=1)


def test_two_runs_at_once_the_second_refuses_and_the_first_finishes(tmp_path):
    """A second process starts while the first trains: it refuses before its first step; the first is unharmed."""
    out = tmp_path / "run"
    ready = tmp_path / "ready"
    script = f"""
import sys, time
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_resume import train
from tiny import RegressionDataset, RegressionModel

from cadence import Trainer, TrainingArguments
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
    args = TrainingArguments(str(tmp_path / "refused"), report_to="none", disable_tqdm=True, max_steps=1)
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(8), data_collator=lambda rows: None)
    with pytest.raises(TypeError, match="data_collator returned None"):
        trainer.train()
    assert not (tmp_path / "refused").exists()
    train(str(tmp_path / "done"), stop=1)  # nothing saved, but the folder is there for save_model (as transformers)
    assert listing(tmp_path / "done") == []
