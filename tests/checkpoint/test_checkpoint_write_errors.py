"""Whatever fails while a checkpoint is written is named the same way, and says what happened.

Each case is a real run of a tiny model, synchronous and background (``async_save``) saves alike: the weights file
failing (safetensors' own error, a full disk inside it, or any other error), ``output_dir`` turning unwritable
(the write's error reaches the caller, never masked by the lock's release, and the lock is released: the next
``train()`` runs), ``output_dir`` deleted during the write (said so, not "free disk space"), and
``overwrite_output_dir=True`` over a ``checkpoint-N`` that is a symlink (the link goes, its target stays).
"""

import errno
import logging
import os
import re
import shutil

import pytest
import safetensors
import safetensors.torch
from test_resume import train

from cadence import TrainerCallback, get_last_checkpoint, output_guard
from cadence.checkpoint.background import CheckpointWriteError
from cadence.checkpoint.manifest import verify_checkpoint

ASYNC = pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])


def fail_weights_of(step, monkeypatch, make_error):
    """From now on writing the weights of ``checkpoint-{step}`` raises ``make_error(filename)``."""
    real = safetensors.torch.save_file

    def save_file(tensors, filename, *a, **kw):
        if f"checkpoint-{step}" in str(filename):
            raise make_error(filename)
        return real(tensors, filename, *a, **kw)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)


def raised_message(error):
    """The message that reaches the caller: sync saves raise the named OSError, background ones wrap it."""
    if isinstance(error, CheckpointWriteError):
        assert isinstance(error.__cause__, OSError)
    return str(error)


DISK_FULL = 'Error while serializing: I/O error: No space left on device (os error 28) at path "{}/.tmpA1b2C3"'


@ASYNC
def test_a_full_disk_inside_safetensors_names_folder_file_size_and_free_space(tmp_path, monkeypatch, async_save):
    out = tmp_path / "run"
    fail_weights_of(4, monkeypatch, lambda f: safetensors.SafetensorError(DISK_FULL.format(os.path.dirname(f))))
    with pytest.raises(OSError) as raised:
        train(out, max_steps=6, save_steps=2, async_save=async_save)
    message = raised_message(raised.value)
    assert f"could not write checkpoint {out}/checkpoint-4" in message
    assert "writing model.safetensors failed (No space left on device" in message
    assert "a checkpoint here takes about" in message and "(the size of checkpoint-2)" in message
    assert "is free there" in message and "save_total_limit=N needs room for N+1 checkpoints" in message
    cause = raised.value.__cause__ if async_save else raised.value
    assert cause.errno == errno.ENOSPC  # read from safetensors' "(os error 28)"
    assert sorted(os.listdir(out)) == ["checkpoint-2"]  # nothing half-written; the older checkpoint intact
    verify_checkpoint(out / "checkpoint-2")


@ASYNC
def test_any_error_writing_the_weights_is_named_without_disk_advice(tmp_path, monkeypatch, async_save):
    out = tmp_path / "run"
    fail_weights_of(4, monkeypatch, lambda f: ValueError("a tensor the serializer cannot take"))
    with pytest.raises(OSError) as raised:
        train(out, max_steps=6, save_steps=2, async_save=async_save)
    message = raised_message(raised.value)
    assert f"could not write checkpoint {out}/checkpoint-4" in message
    assert "writing model.safetensors failed (ValueError: a tensor the serializer cannot take)" in message
    assert "Free disk space" not in message  # not a space problem: the cause is the advice
    assert sorted(os.listdir(out)) == ["checkpoint-2"]


class Unwritable(TrainerCallback):
    """At the end of step ``step`` ``output_dir`` turns unwritable: nothing in it can be renamed or deleted any more
    (``os.replace``/``os.unlink`` patched: as root, chmod stops nothing). The save of that step fails at its rename,
    and the lock's release cannot delete ``cadence.lock``."""

    error = (PermissionError, errno.EACCES, "Permission denied")  # what the refused calls raise

    def __init__(self, out, step, monkeypatch):
        self.out, self.step, self.monkeypatch = str(out), step, monkeypatch

    def refuses(self, path, kw) -> bool:
        return str(path).startswith(self.out)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.step:
            return
        kind, number, text = self.error
        for name in ("replace", "rename", "unlink", "rmdir"):
            real = getattr(os, name)

            def refused(path, *a, _real=real, **kw):
                if self.refuses(path, kw):
                    raise kind(number, text, str(path))
                return _real(path, *a, **kw)

            self.monkeypatch.setattr(os, name, refused)


@ASYNC
def test_an_output_dir_turned_unwritable_raises_the_writes_error_and_releases_the_lock(tmp_path, monkeypatch,
                                                                                       async_save, caplog):
    out = tmp_path / "run"
    with pytest.raises(OSError) as raised, caplog.at_level(logging.WARNING):
        train(out, max_steps=6, save_steps=2, async_save=async_save, callbacks=[Unwritable(out, 4, monkeypatch)])
    message = raised_message(raised.value)
    # a background save of step 2 may still be renaming when the folder turns unwritable: then it is that one
    assert re.search(f"could not write checkpoint {re.escape(str(out))}/checkpoint-{'[24]' if async_save else '4'}: "
                     "renaming tmp-checkpoint-[24] to checkpoint-[24] failed \\(Permission denied\\)", message), message
    assert "cadence.lock" not in message  # the write's error, not the lock's
    assert "Free disk space" not in message and "permissions of" in message
    assert any("cadence.lock" in r.getMessage() for r in caplog.records)  # the lock file left behind is said
    assert output_guard._key(out) not in output_guard._held  # released in this process
    monkeypatch.undo()
    resume = True if get_last_checkpoint(out) else None  # none, when the save of step 2 was the one that failed
    trainer, _ = train(out, resume=resume, max_steps=6, save_steps=2, async_save=async_save)  # not refused
    assert trainer.state.global_step == 6


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder: the patched variant covers it")
def test_a_read_only_output_dir_raises_the_writes_error_and_releases_the_lock(tmp_path):
    out = tmp_path / "run"

    class ReadOnly(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 4:
                os.chmod(out, 0o555)

    try:
        with pytest.raises(OSError) as raised:
            train(out, max_steps=6, save_steps=2, async_save=False, callbacks=[ReadOnly()])
    finally:
        os.chmod(out, 0o755)
    assert f"could not write checkpoint {out}/checkpoint-4" in str(raised.value) and "cadence.lock" not in str(raised.value)
    trainer, _ = train(out, resume=True, max_steps=6, save_steps=2)
    assert trainer.state.global_step == 6


@ASYNC
def test_output_dir_deleted_during_the_write_is_said_not_disk_space(tmp_path, monkeypatch, async_save):
    out = tmp_path / "run"
    real = safetensors.torch.save_file

    def deleted_meanwhile(tensors, filename, *a, **kw):
        if "checkpoint-4" in str(filename):
            shutil.rmtree(out)  # someone deletes the run's folder while the weights are written
        return real(tensors, filename, *a, **kw)  # fails: its folder is gone

    monkeypatch.setattr(safetensors.torch, "save_file", deleted_meanwhile)
    with pytest.raises(OSError) as raised:
        train(out, max_steps=6, save_steps=2, async_save=async_save)
    message = raised_message(raised.value)
    assert f"could not write checkpoint {out}/checkpoint-4" in message
    assert f"output_dir {out} was deleted while the checkpoint was written" in message
    assert "Free disk space" not in message and "save_total_limit" not in message
    assert "older checkpoints are intact" not in message  # checkpoint-2 went with output_dir
    assert not out.exists()  # not recreated by the failing run
    assert output_guard._key(out) not in output_guard._held


def test_overwrite_output_dir_removes_a_symlinked_checkpoint_but_never_its_target(tmp_path, caplog):
    out, elsewhere = tmp_path / "run", tmp_path / "kept" / "checkpoint-9"
    elsewhere.mkdir(parents=True)
    (elsewhere / "model.safetensors").write_bytes(b"precious")
    out.mkdir()
    (out / "checkpoint-9").symlink_to(elsewhere, target_is_directory=True)
    with caplog.at_level(logging.WARNING):
        train(out, max_steps=2, save_steps=2, overwrite_output_dir=True)
    assert sorted(os.listdir(out)) == ["checkpoint-2"]  # the link is gone
    assert (elsewhere / "model.safetensors").read_bytes() == b"precious"  # its target is untouched
    assert any(f"{out}/checkpoint-9" in r.getMessage() and "symlink" in r.getMessage() for r in caplog.records)


def test_rotation_removes_a_symlinked_checkpoint_but_never_its_target(tmp_path):
    out, elsewhere = tmp_path / "run", tmp_path / "kept" / "checkpoint-1"
    train(out, max_steps=2, save_steps=2)
    shutil.copytree(out / "checkpoint-2", elsewhere)
    (out / "checkpoint-1").symlink_to(elsewhere, target_is_directory=True)  # an older checkpoint, linked in
    train(out, resume=True, max_steps=6, save_steps=2, save_total_limit=2)  # a resume rotates all checkpoints
    assert sorted(os.listdir(out)) == ["checkpoint-4", "checkpoint-6"]  # no deleting-checkpoint-1 link left
    verify_checkpoint(elsewhere)  # the target is intact

