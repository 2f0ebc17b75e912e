"""Asynchronous checkpoint saves (``async_save=True``, the default): the training thread snapshots, one background
thread writes. Checked here with real runs of tiny models: a resume from a background-written checkpoint is
bit-identical to the unbroken run and to the same run saved synchronously (whose files it matches byte for byte);
every checkpoint is complete when ``train()`` returns; ``on_save`` fires once per save, after its folder is complete;
a failed background write surfaces in the training thread naming the folder; the next save waits for a slow one and
says so; ``save_model``, a just-in-time checkpoint and the process exit wait for the save in flight.
"""

import json
import logging
import os
import subprocess
import sys
import threading
import time
import zipfile

import pytest
import torch
from test_resume import DropoutTagger, assert_same_run, make_args
from tiny import LMDataset, TokenDataset, lm_collate, pad_collate, stop_at, tiny_gpt2

from cadence import Trainer, TrainerCallback, get_last_checkpoint
from cadence.checkpoint import writer
from cadence.checkpoint.background import CheckpointWriteError
from cadence.checkpoint.manifest import MANIFEST_NAME, verify_checkpoint
from cadence.checkpoint.signals import CheckpointManager
from repo_paths import TESTS, IMPORT_PATHS


def train(out, stop=None, resume=None, callbacks=(), **kw):
    trainer = Trainer(DropoutTagger(), make_args(out, **kw), train_dataset=TokenDataset(22), data_collator=pad_collate,
                      callbacks=[*callbacks, *([stop_at(stop)] if stop else [])])
    return trainer, trainer.train(resume_from_checkpoint=resume)


def in_background() -> bool:
    return threading.current_thread() is not threading.main_thread()


@pytest.fixture
def slow_writes(monkeypatch):
    """Every background write takes ``delay`` seconds longer (a slow disk): saves are still in flight at later steps."""
    real = writer.write_manifest
    delay = {"s": 0.3}

    def slow_manifest(folder):
        if in_background():
            time.sleep(delay["s"])
        real(folder)

    monkeypatch.setattr(writer, "write_manifest", slow_manifest)
    return delay


def test_async_resume_is_bit_identical_to_unbroken_and_to_sync_saves(tmp_path):
    unbroken = train(tmp_path / "unbroken", save_steps=4)
    synchronous = train(tmp_path / "sync", save_steps=4, async_save=False)
    assert_same_run(unbroken, synchronous)
    stopped, _ = train(tmp_path / "resumed", stop=8, save_steps=4)  # checkpoint-8 written in the background
    resumed = train(tmp_path / "resumed", resume=str(tmp_path / "resumed" / "checkpoint-8"), save_steps=4)
    assert_same_run(unbroken, resumed)
    # the background thread wrote what the synchronous save wrote, byte for byte (the arguments differ by async_save)
    for step in (4, 8, 12, 16):
        ours, theirs = tmp_path / "unbroken" / f"checkpoint-{step}", tmp_path / "sync" / f"checkpoint-{step}"
        names = sorted(os.listdir(ours))
        assert names == sorted(os.listdir(theirs))
        for name in names:
            if not name.startswith("training_args") and name != MANIFEST_NAME:
                assert file_content(ours / name) == file_content(theirs / name), (step, name)


def file_content(path):
    """The bytes of a file; of a torch.save zip, every entry's but the id torch draws for each save."""
    if not zipfile.is_zipfile(path):
        return path.read_bytes()
    with zipfile.ZipFile(path) as z:
        return {n.split("/", 1)[1]: z.read(n) for n in z.namelist() if not n.endswith("serialization_id")}


def test_tied_weights_saved_once_and_byte_identical_to_sync(tmp_path):
    """GPT-2's lm_head is tied to its embedding: the snapshot keeps them one tensor, save_pretrained stores it once."""
    folders = {}
    for name, async_save in (("async", True), ("sync", False)):
        torch.manual_seed(0)
        trainer = Trainer(tiny_gpt2(), make_args(tmp_path / name, per_device_train_batch_size=4, max_steps=4,
                                                 save_strategy="steps", save_steps=2, async_save=async_save),
                          train_dataset=LMDataset(16), data_collator=lm_collate)
        trainer.train()
        folders[name] = tmp_path / name / "checkpoint-4"
    sha = {n: json.loads((f / MANIFEST_NAME).read_text())["files"]["model.safetensors"] for n, f in folders.items()}
    assert sha["async"] == sha["sync"]
    from safetensors import safe_open
    with safe_open(str(folders["async"] / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys() and "transformer.wte.weight" in f.keys()


class SaveWatcher(TrainerCallback):
    """Records events; at every ``on_save`` checks that the checkpoint of ``state.global_step`` is complete."""

    def __init__(self):
        self.events = []

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("step_end", state.global_step))

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        staging = os.path.join(args.output_dir, f"tmp-checkpoint-{state.global_step}")
        assert os.path.isdir(folder) and not os.path.exists(staging)
        verify_checkpoint(folder)  # every file as written, manifest included
        self.events.append(("save", state.global_step))

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append(("train_end", state.global_step))


def test_on_save_fires_once_per_save_after_the_folder_is_complete(tmp_path, slow_writes):
    watcher = SaveWatcher()
    _, out = train(tmp_path, max_steps=9, save_steps=3, callbacks=[watcher])
    saves = [step for kind, step in watcher.events if kind == "save"]
    assert saves == [3, 6, 9]  # once each, with the state of its own step
    assert watcher.events[-1] == ("train_end", 9) and watcher.events[-2] == ("save", 9)
    # deferred: a 0.3 s write outlasts the next step, so checkpoint-3's on_save came after step 4 ended
    assert watcher.events.index(("save", 3)) > watcher.events.index(("step_end", 4))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-3", "checkpoint-6", "checkpoint-9"]


def test_every_checkpoint_is_complete_when_train_returns(tmp_path, slow_writes):
    train(tmp_path, max_steps=5, save_steps=1, save_total_limit=3)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-3", "checkpoint-4", "checkpoint-5"]  # rotated, nothing staged
    for name in os.listdir(tmp_path):
        verify_checkpoint(tmp_path / name)


def test_next_save_waits_for_a_slow_one_and_logs_it(tmp_path, slow_writes, caplog):
    with caplog.at_level(logging.WARNING, logger="cadence.background_save"):
        train(tmp_path, max_steps=3, save_steps=1)
    waits = [r.getMessage() for r in caplog.records if "before the next checkpoint" in r.getMessage()]
    assert waits and all(m.startswith("waited ") and " s for the background save of checkpoint-" in m for m in waits)
    assert float(waits[0].split()[1]) > 0.1  # it really waited for the 0.3 s write


def test_a_failed_background_write_surfaces_naming_the_folder(tmp_path, monkeypatch):
    real = torch.save

    def failing_save(obj, path, *a, **kw):
        if in_background() and "checkpoint-4" in str(path):
            raise OSError(5, "Input/output error")
        return real(obj, path, *a, **kw)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(CheckpointWriteError) as raised:
        train(tmp_path, max_steps=12, save_steps=2)
    error = raised.value
    assert error.folder == tmp_path / "checkpoint-4" and f"checkpoint {tmp_path}/checkpoint-4" in str(error)
    assert isinstance(error.__cause__, OSError) and "Input/output error" in str(error)
    # nothing half written, the older checkpoint intact, and the run stopped there (not at step 12)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]
    verify_checkpoint(tmp_path / "checkpoint-2")
    monkeypatch.undo()
    trainer, _ = train(tmp_path, resume=True, max_steps=12, save_steps=2)
    assert trainer.state.global_step == 12


def test_save_model_and_jit_checkpoint_wait_for_the_save_in_flight(tmp_path, slow_writes):
    trainer, _ = train(tmp_path / "run", max_steps=2)
    slow_writes["s"] = 0.5
    trainer._save_checkpoint(trainer.model)  # a save in flight, outside the loop
    trainer.save_model(str(tmp_path / "model"))
    verify_checkpoint(tmp_path / "run" / "checkpoint-2")  # save_model returned after the checkpoint was complete
    trainer.state.global_step = 3
    folder = CheckpointManager(trainer).execute_jit_checkpoint()
    assert folder == tmp_path / "run" / "checkpoint-3"
    verify_checkpoint(folder)  # the just-in-time checkpoint is on disk when the call returns


EXIT_SCRIPT = """
import sys, time
sys.path[:0] = {tests!r}
from test_async_save import train
from cadence.checkpoint import writer
real = writer.write_manifest
writer.write_manifest = lambda folder: (time.sleep(1.0), real(folder))
trainer, _ = train({out!r}, max_steps=2)
trainer._save_checkpoint(trainer.model)  # in flight when the script ends
print("LEFT", flush=True)
"""


def test_the_process_exit_waits_for_the_save_in_flight(tmp_path):
    out = str(tmp_path / "run")
    script = EXIT_SCRIPT.format(tests=IMPORT_PATHS, out=out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(TESTS, "..", "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "LEFT" in run.stdout
    assert get_last_checkpoint(out).endswith("checkpoint-2")
    verify_checkpoint(os.path.join(out, "checkpoint-2"))


def test_snapshot_reuses_its_buffers_and_keeps_ties_and_sharing():
    from cadence.checkpoint.background import BackgroundWriter

    saver = BackgroundWriter()
    weight = torch.arange(6.0).reshape(2, 3)
    betas = (0.9, 0.999)
    live = {"model": {"a": weight, "tied": weight}, "groups": [{"betas": betas}, {"betas": betas}],
            "step": torch.tensor(3.0)}
    first = saver.snapshot(live)
    assert first["model"]["a"] is first["model"]["tied"] and first["model"]["a"].data_ptr() != weight.data_ptr()
    assert first["groups"][0]["betas"] is first["groups"][1]["betas"]  # pickled once, as from the live state
    weight.add_(1)  # training goes on: the snapshot keeps the values of its step
    assert torch.equal(first["model"]["a"], torch.arange(6.0).reshape(2, 3))
    second = saver.snapshot(live)
    assert second["model"]["a"] is first["model"]["a"]  # the same buffer, copied into again: no new allocation
    assert torch.equal(second["model"]["a"], weight) and second["step"].item() == 3.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: pinned buffers, non-blocking copies")
def test_snapshot_of_cuda_tensors_is_pinned_and_ready_for_the_writer():
    from cadence.checkpoint.background import BackgroundWriter

    saver = BackgroundWriter()
    live = {"w": torch.randn(1024, 1024, device="cuda")}
    copied = saver.snapshot(live)
    assert copied["w"].device.type == "cpu" and copied["w"].is_pinned()
    seen = {}
    saver.submit("unused/checkpoint-1", lambda: seen.update(w=copied["w"].clone()))  # waits for the copy's event
    saver.wait()
    assert torch.equal(seen["w"], live["w"].cpu())


def test_async_save_is_on_by_default_and_read_from_text_as_other_bools():
    from cadence import TrainingArguments

    assert TrainingArguments().async_save is True
    assert TrainingArguments(async_save="false").async_save is False and TrainingArguments(async_save="1").async_save
    with pytest.raises(ValueError, match="async_save"):
        TrainingArguments(async_save="sometimes")


def test_a_failing_run_still_completes_its_save_in_flight_before_releasing_output_dir(tmp_path, slow_writes):
    class Boom(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise RuntimeError("a bug in the user's callback")

    with pytest.raises(RuntimeError, match="a bug in the user's callback"):
        train(tmp_path, max_steps=6, save_steps=2, callbacks=[Boom()])
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]  # written, renamed, the lock file gone
    verify_checkpoint(tmp_path / "checkpoint-2")
