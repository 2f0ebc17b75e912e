"""A damaged checkpoint is named, never loaded: resume_from_checkpoint=True falls back to the newest intact one.

Every checkpoint carries checkpoint_manifest.json (size and sha256 of each file), so truncation and
flipped bytes are both caught; transformers' checkpoints have no manifest and are parsed instead.
"""

import hashlib
import json
import logging
import os

import pytest
from test_resume import assert_same_run, train

from cadence.checkpoint import MANIFEST_NAME, CorruptCheckpointError, verify_checkpoint


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_byte(path):
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # inside the last tensor's data: the file still parses
    path.write_bytes(bytes(data))


def invalid_json(path):
    path.write_text(path.read_text()[:-10])


DAMAGES = [
    ("model.safetensors", truncate, "bytes but"),
    ("model.safetensors", flip_byte, "sha256"),
    ("trainer_state.json", invalid_json, "bytes but"),
    ("optimizer.pt", truncate, "bytes but"),
    ("rng_state.pth", truncate, "bytes but"),
    ("scheduler.pt", flip_byte, "sha256"),
]


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    return train(str(tmp_path_factory.mktemp("full") / "run"), num_train_epochs=1)


@pytest.mark.parametrize("name, damage, why", DAMAGES, ids=[f"{n}-{d.__name__}" for n, d, _ in DAMAGES])
def test_resume_true_falls_back_to_the_newest_intact_checkpoint(tmp_path, caplog, unbroken, name, damage, why):
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=2, num_train_epochs=1)
    damage(out / "checkpoint-4" / name)
    with pytest.raises(CorruptCheckpointError) as info:  # named explicitly: refused, naming the file
        train(str(out), resume=str(out / "checkpoint-4"), num_train_epochs=1)
    assert f"checkpoint-4 is damaged: {name}" in str(info.value) and why in str(info.value)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        resumed = train(str(out), resume=True, num_train_epochs=1)
    warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warnings) == 1 and f"checkpoint-4 is damaged: {name}" in warnings[0] and why in warnings[0]
    assert_same_run(unbroken, resumed)  # from checkpoint-2, bit-identical to the run that never stopped


def test_every_checkpoint_damaged_names_each(tmp_path):
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=2, num_train_epochs=1)
    truncate(out / "checkpoint-2" / "optimizer.pt")
    invalid_json(out / "checkpoint-4" / "trainer_state.json")
    with pytest.raises(CorruptCheckpointError, match="every checkpoint.*checkpoint-4 is damaged: trainer_state.json"
                                                     ".*checkpoint-2 is damaged: optimizer.pt"):
        train(str(out), resume=True, num_train_epochs=1)


def test_the_manifest_holds_every_files_sha256(tmp_path):
    out = tmp_path / "run"
    train(str(out), stop=2, save_steps=2, num_train_epochs=1)
    folder = out / "checkpoint-2"
    files = json.loads((folder / MANIFEST_NAME).read_text())["files"]
    on_disk = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST_NAME)
    assert sorted(files) == on_disk and "model.safetensors" in files and "trainer_state.json" in files
    for name, entry in files.items():
        data = (folder / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("name, damage, why", [
    ("model.safetensors", truncate, "header describes"),
    ("trainer_state.json", invalid_json, "JSONDecodeError"),
    ("optimizer.pt", truncate, "cannot be read"),
    ("rng_state.pth", truncate, "cannot be read"),
])
def test_without_a_manifest_truncation_is_still_found(tmp_path, name, damage, why):
    """transformers writes no manifest: such checkpoints load, and a truncated file is still named."""
    out = tmp_path / "run"
    train(str(out), stop=2, save_steps=2, num_train_epochs=1)
    folder = out / "checkpoint-2"
    os.remove(folder / MANIFEST_NAME)
    verify_checkpoint(folder)  # intact without a manifest: accepted
    damage(folder / name)
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint-2 is damaged: {name}.*{why}"):
        train(str(out), resume=str(folder), num_train_epochs=1)


def test_a_checkpoint_without_manifest_resumes_exactly(tmp_path, unbroken):
    out = tmp_path / "run"
    train(str(out), stop=2, save_steps=2, num_train_epochs=1)
    os.remove(out / "checkpoint-2" / MANIFEST_NAME)
    assert_same_run(unbroken, train(str(out), resume=True, num_train_epochs=1))
