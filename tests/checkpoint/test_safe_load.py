"""Loading a checkpoint never runs code: a crafted pickle in any loaded file is refused, and nothing executes."""

import logging
import os

import numpy as np
import pytest
import torch
from test_resume import train

from cadence.checkpoint_io.formats import UnsafeCheckpointError, safe_load

MARKER = "pwned.txt"


class Evil:
    """Unpickling this writes a marker file (what a real attack would do with os.system)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path, name):
    out = str(tmp_path / "run")
    train(out, stop=2, save_steps=2, num_train_epochs=1)
    ckpt = os.path.join(out, "checkpoint-2")
    marker = str(tmp_path / MARKER)
    torch.save({"state": Evil(marker)}, os.path.join(ckpt, name))
    with pytest.raises(UnsafeCheckpointError, match=f"refusing to load .*{name}.*nothing in it was executed"):
        train(out, resume=True, num_train_epochs=1)
    assert not os.path.exists(marker)
    # the same file, loaded the unsafe way, does run code: the test would catch a loader that did that
    torch.load(os.path.join(ckpt, name), weights_only=False)
    assert os.path.exists(marker)


def test_a_payload_in_training_args_bin_is_skipped_and_runs_nothing(tmp_path, caplog):
    """training_args.bin is not needed to resume, and libraries pickle their own TrainingArguments subclass there:
    a file weights_only refuses is skipped (one warning naming what it pickles), never unpickled."""
    out = str(tmp_path / "run")
    train(out, stop=2, save_steps=2, num_train_epochs=1)
    ckpt = os.path.join(out, "checkpoint-2")
    marker = str(tmp_path / MARKER)
    torch.save({"state": Evil(marker)}, os.path.join(ckpt, "training_args.bin"))
    for name in ("checkpoint_manifest.json", "loop_state.json", "training_args.json"):  # as transformers writes it
        os.remove(os.path.join(ckpt, name))
    with caplog.at_level(logging.INFO, logger="cadence"):
        _, out_run = train(out, resume=True, num_train_epochs=1)
    assert out_run.global_step > 2 and not os.path.exists(marker)
    skipped = [r.getMessage() for r in caplog.records if "training_args.bin pickles" in r.getMessage()]
    assert len(skipped) == 1 and "io.open" in skipped[0] and "not unpickled" in skipped[0], skipped
    torch.load(os.path.join(ckpt, "training_args.bin"), weights_only=False)  # the unsafe way does run it
    assert os.path.exists(marker)


def test_error_names_the_offending_global(tmp_path):
    path = tmp_path / "optimizer.pt"
    torch.save(Evil(str(tmp_path / MARKER)), path)
    with pytest.raises(UnsafeCheckpointError, match="builtins.open|open"):
        safe_load(path)


def test_numpy_arrays_only_where_allowed(tmp_path):
    """transformers' rng_state.pth holds numpy's state as an array: accepted there, not elsewhere."""
    path = tmp_path / "rng_state.pth"
    torch.save({"numpy": np.random.get_state()}, path)
    assert safe_load(path, allow_numpy_arrays=True)["numpy"][0] == "MT19937"
    with pytest.raises(UnsafeCheckpointError):
        safe_load(path)


def test_cadence_files_are_plain_data(tmp_path):
    out = str(tmp_path / "run")
    train(out, stop=2, save_steps=2, num_train_epochs=1)
    ckpt = os.path.join(out, "checkpoint-2")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        torch.load(os.path.join(ckpt, name), weights_only=True)  # nothing allowed beyond torch's plain types
