"""A checkpoint is read only through regular files inside its folder.

Checking or loading a checkpoint opens no FIFO, device or socket (a FIFO blocks the open forever, /dev/zero never
ends), and inside a ``checkpoint-N`` folder nothing reached through a symlink may lie outside the folder (named by the
link; nothing of the target is read or printed). What users rely on keeps working: an ``output_dir`` that is itself a
symlink (a mount), a model folder laid out as the Hugging Face cache lays it out (files linked into ``../../blobs``),
a checkpoint folder reached through a link.
"""

import contextlib
import json
import logging
import os
import signal

import pytest
import torch
from test_resume import train

from cadence.checkpoint_io.formats import (LOOP_STATE_NAME, CorruptCheckpointError, UnsafeCheckpointError,
                                        load_model_weights, save_safetensors_sharded)
from cadence.checkpoint.manifest import MANIFEST_NAME, verify_checkpoint


@contextlib.contextmanager
def deadline(seconds):
    """Fail instead of hanging: before the rule, opening a planted FIFO blocked forever."""

    def expired(signum, frame):
        raise TimeoutError(f"still reading the checkpoint after {seconds} s (blocked on a FIFO?)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def as_transformers_wrote_them(out):
    """The run's checkpoints without cadence's own files: what the check reads file by file (no manifest)."""
    for folder in out.glob("checkpoint-*"):
        os.remove(folder / MANIFEST_NAME)
        os.remove(folder / LOOP_STATE_NAME)


def test_a_fifo_in_the_newest_checkpoint_is_named_and_resume_true_falls_back(tmp_path, caplog):
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=2, num_train_epochs=1)
    as_transformers_wrote_them(out)
    os.mkfifo(out / "checkpoint-4" / "extra.json")
    with deadline(60), caplog.at_level(logging.WARNING, logger="cadence"):
        trainer, _ = train(str(out), resume=True, num_train_epochs=1)
    warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warnings) == 1 and "checkpoint-4 is damaged: extra.json is a FIFO (named pipe), not a regular file" \
        in warnings[0], warnings
    assert trainer.state.global_step == 6  # resumed from checkpoint-2 and trained the epoch to its end
    with deadline(60), pytest.raises(CorruptCheckpointError, match="extra.json is a FIFO"):
        verify_checkpoint(out / "checkpoint-4")


@pytest.mark.parametrize("target", ["/dev/zero", "outside.json"])
def test_a_link_out_of_a_checkpoint_is_refused_naming_the_link_only(tmp_path, target):
    out = tmp_path / "run"
    train(str(out), stop=2, save_steps=2, num_train_epochs=1)
    as_transformers_wrote_them(out)
    if target != "/dev/zero":
        (tmp_path / target).write_text(json.dumps({"secret": "x" * 1000}))
        target = str(tmp_path / target)
    os.symlink(target, out / "checkpoint-2" / "rng_state_1.pth")
    with deadline(60), pytest.raises(UnsafeCheckpointError, match="rng_state_1.pth leads outside the checkpoint") as e:
        train(str(out), resume=str(out / "checkpoint-2"), num_train_epochs=1)
    assert target not in str(e.value)


def test_a_manifest_entry_through_a_linked_folder_is_refused_without_reading_its_target(tmp_path):
    """The manifest lists sub/secret.txt and sub/ links to an outside folder: before, the outside file was hashed and
    the refusal printed its size."""
    out = tmp_path / "run"
    train(str(out), stop=2, save_steps=2, num_train_epochs=1)
    folder = out / "checkpoint-2"
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "secret.txt").write_text("s" * 4321)
    os.symlink(tmp_path / "etc", folder / "sub")
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["files"]["sub/secret.txt"] = {"bytes": 1, "sha256": "0" * 64}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(UnsafeCheckpointError, match="checkpoint-2: sub leads outside the checkpoint folder") as e:
        verify_checkpoint(folder)
    assert "4321" not in str(e.value) and "secret" not in str(e.value)


def test_an_output_dir_that_is_a_link_and_a_checkpoint_reached_through_one_resume(tmp_path):
    mount = tmp_path / "mount"
    mount.mkdir()
    os.symlink(mount, tmp_path / "out")  # output_dir on a mount, reached through a link
    train(str(tmp_path / "out"), stop=2, save_steps=2, num_train_epochs=1)
    os.symlink(mount / "checkpoint-2", tmp_path / "checkpoint-2")  # a checkpoint folder that is itself a link
    verify_checkpoint(tmp_path / "checkpoint-2")
    trainer, _ = train(str(tmp_path / "out"), resume=True, num_train_epochs=1)
    assert trainer.state.global_step == 6


def test_the_best_model_is_loaded_at_the_end_through_an_output_dir_link(tmp_path):
    """best_model_checkpoint is a path under the link (as transformers records it): its files are compared with the
    checkpoint folder's resolved path, so the best model loads."""
    mount = tmp_path / "mount"
    mount.mkdir()
    os.symlink(mount, tmp_path / "out")
    trainer, _ = train(str(tmp_path / "out"), num_train_epochs=1, save_steps=2, eval_strategy="steps", eval_steps=2,
                       load_best_model_at_end=True, metric_for_best_model="loss", greater_is_better=True)
    best = trainer.state.best_model_checkpoint
    assert best.startswith(str(tmp_path / "out")) and best != str(tmp_path / "out" / "checkpoint-6"), best
    from safetensors.torch import load_file

    weights = load_file(os.path.join(best, "model.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items() if k in weights)


def test_a_model_folder_laid_out_as_the_hub_cache_loads_and_the_same_links_in_a_checkpoint_do_not(tmp_path):
    """models--x/snapshots/<rev>/model.safetensors -> ../../blobs/<sha>: followed in a model folder (as transformers
    follows it), refused inside a checkpoint-N folder, where it leads outside."""
    model = torch.nn.Linear(3, 2)
    blobs = tmp_path / "models--x" / "blobs"
    blobs.mkdir(parents=True)
    save_safetensors_sharded(model.state_dict(), blobs)
    os.rename(blobs / "model.safetensors", blobs / "0123abcd")
    for name in ("snapshots/main", "checkpoint-7"):
        folder = tmp_path / "models--x" / name
        folder.mkdir(parents=True)
        os.symlink(os.path.relpath(blobs / "0123abcd", folder), folder / "model.safetensors")
    loaded = torch.nn.Linear(3, 2)
    load_model_weights(loaded, tmp_path / "models--x" / "snapshots" / "main")
    assert torch.equal(loaded.weight, model.weight) and torch.equal(loaded.bias, model.bias)
    (tmp_path / "models--x" / "checkpoint-7" / "trainer_state.json").write_text("{}")
    with pytest.raises(UnsafeCheckpointError, match="checkpoint-7: model.safetensors leads outside"):
        verify_checkpoint(tmp_path / "models--x" / "checkpoint-7")
