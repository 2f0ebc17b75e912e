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

from cadence import TrainerCallback
from cadence.checkpoint_io.formats import LOOP_STATE_NAME, CorruptCheckpointError
from cadence.checkpoint.manifest import MANIFEST_NAME, read_trainer_state, verify_checkpoint, write_manifest


class StepRecorder(TrainerCallback):
    def __init__(self, steps):
        self.steps = steps

    def on_step_begin(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


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
    """transformers writes no manifest (nor loop_state.json): such checkpoints load, and a truncated file is still named."""
    out = tmp_path / "run"
    train(str(out), stop=2, save_steps=2, num_train_epochs=1)
    folder = out / "checkpoint-2"
    os.remove(folder / MANIFEST_NAME)
    os.remove(folder / LOOP_STATE_NAME)
    verify_checkpoint(folder)  # intact without a manifest: accepted
    damage(folder / name)
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint-2 is damaged: {name}.*{why}"):
        train(str(out), resume=str(folder), num_train_epochs=1)


@pytest.mark.parametrize("damage", [None, flip_byte], ids=["intact", "flipped-weight-byte"])
def test_a_cadence_checkpoint_without_its_manifest_is_damaged(tmp_path, caplog, unbroken, damage):
    """cadence writes a manifest into every checkpoint (loop_state.json marks one of cadence's): without it a flipped
    byte could not be seen, so the checkpoint is refused and resume=True falls back to the older one, exactly."""
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=2, num_train_epochs=1)
    os.remove(out / "checkpoint-4" / MANIFEST_NAME)
    if damage:
        damage(out / "checkpoint-4" / "model.safetensors")
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint-4 is damaged: {MANIFEST_NAME} is missing, but "
                                                     f"{LOOP_STATE_NAME} shows cadence wrote"):
        train(str(out), resume=str(out / "checkpoint-4"), num_train_epochs=1)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        resumed = train(str(out), resume=True, num_train_epochs=1)
    assert any(f"checkpoint-4 is damaged: {MANIFEST_NAME} is missing" in r.getMessage() for r in caplog.records)
    assert_same_run(unbroken, resumed)  # from checkpoint-2


def rewrite_json(path, change):
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def set_key(key, value):
    def change(data):
        data[key] = value
        return data
    return change


MANIFESTS = [
    ("a list", lambda m: [m]),
    ("files a list", set_key("files", [["model.safetensors", 1]])),
    ("an entry a string", lambda m: {"files": {**m["files"], "model.safetensors": "abc"}}),
    ("bytes a string", lambda m: {"files": {**m["files"], "model.safetensors": {**m["files"]["model.safetensors"], "bytes": "1"}}}),
    ("no sha256", lambda m: {"files": {**m["files"], "scheduler.pt": {"bytes": 3}}}),
    ("a path outside", lambda m: {"files": {**m["files"], "../../secret": {"bytes": 1, "sha256": "0"}}}),
    ("null", lambda m: None),
]


@pytest.mark.parametrize("change", [c for _, c in MANIFESTS], ids=[n for n, _ in MANIFESTS])
def test_a_manifest_of_the_wrong_shape_is_damage_and_the_fallback_works(tmp_path, caplog, unbroken, change):
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=2, num_train_epochs=1)
    rewrite_json(out / "checkpoint-4" / MANIFEST_NAME, change)
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint-4 is damaged: {MANIFEST_NAME} is not a valid manifest"):
        verify_checkpoint(out / "checkpoint-4")
    with caplog.at_level(logging.WARNING, logger="cadence"):
        resumed = train(str(out), resume=True, num_train_epochs=1)
    assert any(f"{MANIFEST_NAME} is not a valid manifest" in r.getMessage() for r in caplog.records)
    assert_same_run(unbroken, resumed)  # from checkpoint-2


STATES = [
    ("global_step", "4", "a whole number >= 0"),
    ("global_step", -1, "a whole number >= 0"),
    ("log_history", {"loss": 1}, "a list of objects or null"),
    ("log_history", [1, 2], "a list of objects or null"),
    ("best_metric", "0.5", "a number or null"),
    ("epoch", "1.5", "a number or null"),
    ("is_hyper_param_search", "false", "true or false"),
    ("stateful_callbacks", [], "an object or null"),
    ("train_batch_size", True, "a whole number >= 0 or null"),
]


@pytest.mark.parametrize("key, value, expected", STATES, ids=[f"{k}={v!r}" for k, v, _ in STATES])
def test_trainer_state_with_wrong_types_is_named_before_step_1(tmp_path, key, value, expected):
    """A trainer_state.json edited by hand (its manifest written again to match): refused before any step, naming
    the file, the field and the value; no file of output_dir changes."""
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=2, num_train_epochs=1)
    ckpt = out / "checkpoint-4"
    rewrite_json(ckpt / "trainer_state.json", set_key(key, value))
    write_manifest(ckpt)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    steps = []
    with pytest.raises(CorruptCheckpointError, match=rf"checkpoint-4 is damaged: trainer_state.json has {key}=.*which is not {expected};"):
        train(str(out), resume=str(ckpt), num_train_epochs=1, callbacks=[StepRecorder(steps)])
    assert steps == [] and {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_a_transformers_trainer_state_passes_the_type_check(tmp_path):
    """What transformers.Trainer writes (its types, its extra keys) is accepted."""
    import transformers
    from tiny import RegressionDataset, RegressionModel, make_args

    args = make_args(str(tmp_path), transformers, save_strategy="steps", save_steps=2, max_steps=2, use_cpu=True)
    trainer = transformers.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(16))
    trainer.train()
    state = read_trainer_state(tmp_path / "checkpoint-2")
    assert state.global_step == 2 and isinstance(state.log_history, list)
