"""Damage in the files a resume reads beside the weights: named, never a raw exception.

A tampered state file (``rng_state.pth``, ``loop_state.json``, ``trainer_state.json``, with the manifest rewritten to
match, as a tamperer would) is a ``CorruptCheckpointError`` naming the file and the field, found before step 1, so
``resume_from_checkpoint=True`` falls back to the next older intact checkpoint. A damaged ``training_args.bin``
(truncated, empty, a TorchScript archive) never blocks a resume, which does not need it: skipped with one warning.
"""

import hashlib
import json
import logging
import os
import sys
import types

import pytest
import torch
from test_resume import assert_same_run, train

from cadence import TrainingArguments
from cadence.checkpoint_io.formats import (LOOP_STATE_NAME, TRAINING_ARGS_NAME, CorruptCheckpointError,
                                        load_training_args)
from cadence.checkpoint.manifest import MANIFEST_NAME


def rewrite(folder, name, data):
    """``folder/name`` replaced by ``data``, and the manifest rewritten to match (a tamperer's edit)."""
    (folder / name).write_bytes(data)
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))


def rng_with(folder, **fields):
    import io

    state = torch.load(folder / "rng_state.pth", weights_only=True)
    state.update(fields)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def loop_with(folder, **fields):
    return json.dumps({**json.loads((folder / LOOP_STATE_NAME).read_text()), **fields}).encode()


TAMPERS = [
    ("rng_state.pth", lambda f: rng_with(f, look_ahead="garbage"), "has look_ahead='garbage'"),
    ("rng_state.pth", lambda f: rng_with(f, python="x"), "has python='x'"),
    ("loop_state.json", lambda f: loop_with(f, epoch="0"), "has epoch='0', which is not a whole number"),
    ("loop_state.json", lambda f: loop_with(f, total=None), "has total=None, which is not a number"),
    ("loop_state.json", lambda f: b"[1, 2]", "holds a list, not an object"),
    ("trainer_state.json", lambda f: b"[" * 200_000 + b"]" * 200_000, "cannot be read \\(RecursionError"),
]


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    return train(str(tmp_path_factory.mktemp("full") / "run"), num_train_epochs=1)


@pytest.mark.parametrize("name, tamper, why", TAMPERS, ids=[f"{n}-{w[:20]}" for n, _, w in TAMPERS])
def test_a_tampered_state_file_is_named_and_resume_true_falls_back(tmp_path, caplog, unbroken, name, tamper, why):
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=2, num_train_epochs=1)
    rewrite(out / "checkpoint-4", name, tamper(out / "checkpoint-4"))
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint-4 is damaged: {name} {why}"):
        train(str(out), resume=str(out / "checkpoint-4"), num_train_epochs=1)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        resumed = train(str(out), resume=True, num_train_epochs=1)
    warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warnings) == 1 and f"checkpoint-4 is damaged: {name}" in warnings[0], warnings
    assert_same_run(unbroken, resumed)  # from checkpoint-2, bit-identical to the run that never stopped


def torchscript_archive(path):
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(path))


DAMAGED_ARGS = [
    ("truncated", lambda p: p.write_bytes(p.read_bytes()[:100])),
    ("empty", lambda p: p.write_bytes(b"")),
    ("torchscript", torchscript_archive),
]


@pytest.mark.parametrize("damage", [d for _, d in DAMAGED_ARGS], ids=[n for n, _ in DAMAGED_ARGS])
def test_a_damaged_training_args_bin_is_skipped_with_one_warning(tmp_path, caplog, damage):
    """A checkpoint laid out as transformers writes it (no manifest): transformers resumes it, and so does cadence;
    from_checkpoint reads training_args.json instead."""
    out = tmp_path / "run"
    train(str(out), stop=2, save_steps=2, num_train_epochs=1, learning_rate=0.03)
    folder = out / "checkpoint-2"
    os.remove(folder / MANIFEST_NAME)
    os.remove(folder / LOOP_STATE_NAME)
    damage(folder / TRAINING_ARGS_NAME)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        trainer, _ = train(str(out), resume=str(folder), num_train_epochs=1, learning_rate=0.03)
        args = TrainingArguments.from_checkpoint(folder)
    assert trainer.state.global_step == 6 and args.learning_rate == 0.03
    said = [r.getMessage() for r in caplog.records if TRAINING_ARGS_NAME in r.getMessage()]
    why = "is a TorchScript archive" if damage is torchscript_archive else "cannot be read ("
    assert said and all(str(folder / TRAINING_ARGS_NAME) in m and why in m and "skipped" in m for m in said), said
    os.remove(folder / "training_args.json")
    with pytest.raises(ValueError, match="holds no arguments cadence can read"):
        TrainingArguments.from_checkpoint(folder)


def test_a_pickle_naming_a_package_that_only_starts_like_transformers_is_not_taken_for_transformers(tmp_path, caplog):
    """``transformers_evil.Args`` is not transformers' TrainingArguments: a warning names it (a prefix test on the
    package name would take it for transformers' and say so at info level only)."""
    module = types.ModuleType("transformers_evil")

    class Args:
        pass

    Args.__module__, Args.__qualname__ = "transformers_evil", "Args"
    module.Args = Args
    sys.modules["transformers_evil"] = module
    try:
        torch.save(Args(), tmp_path / TRAINING_ARGS_NAME)
    finally:
        del sys.modules["transformers_evil"]
    with caplog.at_level(logging.INFO, logger="cadence"):
        assert load_training_args(tmp_path) is None
    (record,) = [r for r in caplog.records if TRAINING_ARGS_NAME in r.getMessage()]
    assert record.levelno == logging.WARNING and "transformers_evil.Args" in record.getMessage()
