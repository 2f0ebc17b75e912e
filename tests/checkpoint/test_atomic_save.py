"""A checkpoint folder is complete or absent: a save that fails while writing the weights leaves no
``checkpoint-N`` (whatever the staging folder is called) and the older checkpoints resume."""

import os

import pytest
import safetensors.torch
from test_resume import train

from cadence import TrainerCallback, get_last_checkpoint


class FailWeightsAt(TrainerCallback):
    """From the end of step ``step`` on, writing weights puts half a file down and then fails (a disk filling up)."""

    def __init__(self, step, monkeypatch):
        self.step, self.monkeypatch, self.failed = step, monkeypatch, []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.step:
            return

        real = safetensors.torch.save_file

        def half_written(tensors, filename, *a, **kw):
            if "checkpoint-2" in str(filename):  # an earlier save still being written in the background
                return real(tensors, filename, *a, **kw)
            with open(filename, "wb") as f:
                f.write(b"\x00" * 100)
            self.failed.append(filename)
            raise OSError(28, "No space left on device")

        self.monkeypatch.setattr(safetensors.torch, "save_file", half_written)


def test_failed_weights_write_leaves_no_checkpoint_folder(tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    fail = FailWeightsAt(4, monkeypatch)
    with pytest.raises(OSError, match="No space left on device|could not write"):
        train(out, save_steps=2, callbacks=[fail])
    assert len(fail.failed) == 1  # the weights of checkpoint-4 were being written
    monkeypatch.undo()
    # nothing but the complete checkpoint-2: no checkpoint-4, no staging leftovers under any name
    assert sorted(os.listdir(out)) == ["checkpoint-2"]
    assert get_last_checkpoint(out).endswith("checkpoint-2")
    trainer, _ = train(out, resume=True, save_steps=2, stop=4)  # the older one resumes, and step 4 saves now
    assert trainer.state.global_step == 4 and sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4"]
