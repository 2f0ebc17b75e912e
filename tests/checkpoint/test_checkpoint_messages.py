"""What a failed save or a refused resume says matches what is on disk: a staging folder a read-only disk kept is
named (not "nothing was kept"), and a checkpoint missing only ``scheduler.pt`` is named as damaged by that file (not
"holds weights only", which is what a ``save_only_model`` checkpoint is)."""

import errno
import os

import pytest
from test_checkpoint_write_errors import Unwritable
from test_resume import train

from cadence.checkpoint_io.formats import LOOP_STATE_NAME, CorruptCheckpointError
from cadence.checkpoint.manifest import MANIFEST_NAME


class ReadOnlyDisk(Unwritable):
    """From the end of step ``step`` nothing under ``out`` can be renamed or deleted, as on a disk remounted
    read-only (patched: as root, chmod stops nothing): the save fails at its rename and its staging folder stays."""

    error = (OSError, errno.EROFS, "Read-only file system")

    def refuses(self, path, kw) -> bool:
        return super().refuses(path, kw) or kw.get("dir_fd") is not None  # rmtree works by dir_fd


def test_a_staging_folder_left_by_a_read_only_disk_is_named(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with pytest.raises(OSError) as raised:
        train(str(out), max_steps=6, save_steps=2, async_save=False, callbacks=[ReadOnlyDisk(out, 4, monkeypatch)])
    monkeypatch.undo()
    message = str(raised.value)
    assert f"could not write checkpoint {out}/checkpoint-4" in message and "Read-only file system" in message
    assert (out / "tmp-checkpoint-4").is_dir()  # what the message must not deny
    assert f"staging folder {out}/tmp-checkpoint-4 could not be deleted and is still there" in message, message
    assert "nothing of this checkpoint was kept" not in message.lower()
    assert "older checkpoints are intact" in message


def test_a_missing_scheduler_is_named_not_taken_for_a_weights_only_save(tmp_path):
    out = tmp_path / "run"
    train(str(out), stop=2, save_steps=2, num_train_epochs=1)
    folder = out / "checkpoint-2"
    for name in (MANIFEST_NAME, LOOP_STATE_NAME, "scheduler.pt"):  # transformers' layout, one file deleted
        os.remove(folder / name)
    with pytest.raises(CorruptCheckpointError, match="checkpoint-2 is damaged: scheduler.pt is missing, though the "
                                                     "optimizer's state is there") as raised:
        train(str(out), resume=str(folder), num_train_epochs=1)
    assert "weights only" not in str(raised.value)
