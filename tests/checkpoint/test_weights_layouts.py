"""Weights in every layout transformers writes: ``model.safetensors``, sharded safetensors (``model-0000k-of-0000n``
+ ``model.safetensors.index.json``, what ``save_pretrained(max_shard_size=...)`` writes), ``pytorch_model.bin`` and
its sharded index (transformers 4.x, or ``save_safetensors=False``; read with ``weights_only``).

cadence resumes each of them; it writes shards itself when the weights exceed ``formats.MAX_SHARD_SIZE`` (a
test lowers it); a cadence checkpoint whose weights a user re-sharded after the save resumes with a warning, its
other files still checked against the manifest.
"""

import json
import logging
import os
import shutil

import pytest
import torch
from test_cross_resume import WEIGHT_ATOL, run, weight_gap
from test_resume import assert_same_run, train
from test_safe_load import Evil

import cadence
from cadence.checkpoint import manifest
from cadence.checkpoint_io import formats
from cadence.checkpoint_io.formats import CorruptCheckpointError, UnsafeCheckpointError

transformers = pytest.importorskip("transformers")


def to_bin(folder):
    """The weights as transformers 4.x wrote them with safe_serialization=False: ``torch.save`` of the state dict,
    tied tensors under both names."""
    state = transformers.GPT2LMHeadModel.from_pretrained(folder).state_dict()
    os.remove(folder / "model.safetensors")
    torch.save(state, folder / "pytorch_model.bin")


def to_sharded_bin(folder):
    """transformers 4.x's sharded pickles: ``pytorch_model-0000k-of-0000n.bin`` + ``pytorch_model.bin.index.json``."""
    state = transformers.GPT2LMHeadModel.from_pretrained(folder).state_dict()
    os.remove(folder / "model.safetensors")
    names = sorted(state)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for k, keys in enumerate(halves, 1):
        shard = f"pytorch_model-{k:05d}-of-00002.bin"
        torch.save({key: state[key] for key in keys}, folder / shard)
        weight_map.update({key: shard for key in keys})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))


def to_sharded_safetensors(folder):
    """What ``save_pretrained(max_shard_size=...)`` writes, by transformers itself."""
    model = transformers.GPT2LMHeadModel.from_pretrained(folder)
    os.remove(folder / "model.safetensors")
    model.save_pretrained(folder, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file() and len(shards(folder)) > 1


def shards(folder):
    return sorted(p.name for p in folder.iterdir() if formats.WEIGHTS_FILE_RE.fullmatch(p.name) and "-of-" in p.name)


LAYOUTS = {"bin": to_bin, "sharded_bin": to_sharded_bin, "sharded_safetensors": to_sharded_safetensors}


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """transformers stopped at step 4 (its checkpoint), its unbroken run, and cadence resuming the checkpoint as
    transformers wrote it (model.safetensors)."""
    root = tmp_path_factory.mktemp("hf")
    full = run(transformers, str(root / "full"))
    run(transformers, str(root / "run"), stop=4, save_steps=4)
    resumed = run(cadence, str(root / "resumed"), resume=str(root / "run" / "checkpoint-4"), save_steps=4)
    return root / "run" / "checkpoint-4", full.model.state_dict(), resumed.model.state_dict()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cadence_resumes_transformers_checkpoints_in_every_weights_layout(tmp_path, hf_run, layout):
    source, hf_full, from_safetensors = hf_run
    ckpt = tmp_path / "checkpoint-4"
    shutil.copytree(source, ckpt)
    LAYOUTS[layout](ckpt)
    assert not (ckpt / "model.safetensors").exists()
    trainer = run(cadence, str(tmp_path / "out"), resume=str(ckpt), save_steps=4)
    assert trainer.state.global_step == 12
    weights = trainer.model.state_dict()
    # the same start as from model.safetensors: bit-identical; and where transformers' unbroken run ends
    assert all(torch.equal(weights[k], v) for k, v in from_safetensors.items())
    assert weight_gap(weights, hf_full) <= WEIGHT_ATOL


def test_a_planted_pickle_in_pytorch_model_bin_never_runs(tmp_path, hf_run):
    ckpt = tmp_path / "checkpoint-4"
    shutil.copytree(hf_run[0], ckpt)
    to_bin(ckpt)
    marker = tmp_path / "pwned.txt"
    state = torch.load(ckpt / "pytorch_model.bin", weights_only=True)
    torch.save({**state, "lm_head.weight": Evil(str(marker))}, ckpt / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match="refusing to load .*pytorch_model.bin.*nothing in it was executed"):
        run(cadence, str(tmp_path / "out"), resume=str(ckpt), save_steps=4)
    assert not marker.exists()


def test_an_index_naming_a_missing_shard_is_damage(tmp_path, hf_run):
    ckpt = tmp_path / "checkpoint-4"
    shutil.copytree(hf_run[0], ckpt)
    to_sharded_safetensors(ckpt)
    os.remove(ckpt / shards(ckpt)[-1])
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint-4 is damaged: model-0000.-of-0000.\\.safetensors is missing"):
        run(cadence, str(tmp_path / "out"), resume=str(ckpt), save_steps=4)


# ---------------------------------------------------------------- cadence writes shards


@pytest.fixture(scope="module")
def cadence_full(tmp_path_factory):
    return run(cadence, str(tmp_path_factory.mktemp("cadence_full")))


def test_a_model_larger_than_the_shard_size_is_saved_sharded_as_save_pretrained_does(tmp_path, monkeypatch, cadence_full):
    monkeypatch.setattr(formats, "MAX_SHARD_SIZE", "20KB")
    out = tmp_path / "run"
    stopped = run(cadence, str(out), stop=4, save_steps=4)
    ckpt = out / "checkpoint-4"
    assert not (ckpt / "model.safetensors").exists() and len(shards(ckpt)) > 1
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    reference = tmp_path / "hf"  # transformers' own save of the same model, same shard size
    stopped.model.save_pretrained(reference, max_shard_size="20KB")
    assert index == json.loads((reference / "model.safetensors.index.json").read_text())  # keys, shards, metadata
    assert shards(ckpt) == shards(reference)
    model = transformers.GPT2LMHeadModel.from_pretrained(ckpt)  # transformers reads the folder
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), stopped.model.state_dict().values()))
    fresh = transformers.GPT2LMHeadModel(model.config)
    # transformers' reader of a sharded folder (strict=False: the tied lm_head is stored once, under wte's name)
    keys = transformers.trainer_utils.load_sharded_checkpoint(fresh, ckpt, strict=False)
    assert keys.missing_keys == ["lm_head.weight"] and not keys.unexpected_keys
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    resumed = run(cadence, str(out), resume=True, save_steps=4)
    assert all(torch.equal(resumed.model.state_dict()[k], v) for k, v in cadence_full.model.state_dict().items())


def test_a_plain_module_is_sharded_too(tmp_path, monkeypatch):
    """A model without save_pretrained: cadence's own writer, the same names and index; resume exact."""
    unbroken = train(str(tmp_path / "full"), num_train_epochs=1)
    monkeypatch.setattr(formats, "MAX_SHARD_SIZE", 300)  # bytes: the tagger's ~1.2 KB of weights in shards
    out = tmp_path / "run"
    train(str(out), stop=4, save_steps=2, num_train_epochs=1)
    ckpt = out / "checkpoint-4"
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    state = unbroken[0].model.state_dict()
    assert sorted(index["weight_map"]) == sorted(state) and set(index["weight_map"].values()) == set(shards(ckpt))
    assert index["metadata"] == {"total_parameters": sum(t.numel() for t in state.values()),
                                 "total_size": sum(t.numel() * t.element_size() for t in state.values())}
    assert len(shards(ckpt)) > 2 and not (ckpt / "model.safetensors").exists()
    assert_same_run(unbroken, train(str(out), resume=True, num_train_epochs=1))


@pytest.mark.parametrize("size, expected", [(123, 123), ("20KB", 20_000), ("5GB", 5 * 10**9), ("500MiB", 500 * 2**20),
                                            ("8Mb", 10**6), ("2GiB", 2 * 2**30)])
def test_shard_sizes_read_as_transformers_reads_them(size, expected):
    assert formats.shard_size_bytes(size) == expected == transformers.utils.hub.convert_file_size_to_int(size)


# ---------------------------------------------------------------- a cadence checkpoint re-sharded by its user


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_weights_re_sharded_after_the_save_load_with_a_warning(tmp_path, caplog, cadence_full, layout):
    out = tmp_path / "run"
    run(cadence, str(out), stop=4, save_steps=4)
    LAYOUTS[layout](out / "checkpoint-4")
    with caplog.at_level(logging.WARNING, logger="cadence"):
        resumed = run(cadence, str(out), resume=True, save_steps=4)
    warned = [r.getMessage() for r in caplog.records if "no longer the files it was written with" in r.getMessage()]
    assert len(warned) == 1 and "model.safetensors" in warned[0]
    assert resumed.state.global_step == 12
    assert all(torch.equal(resumed.model.state_dict()[k], v) for k, v in cadence_full.model.state_dict().items())


def test_re_sharded_weights_do_not_excuse_other_files(tmp_path):
    """Only the weights may change layout: every other file the manifest lists is still checked."""
    out = tmp_path / "run"
    run(cadence, str(out), stop=4, save_steps=4)
    ckpt = out / "checkpoint-4"
    to_sharded_safetensors(ckpt)
    data = bytearray((ckpt / "optimizer.pt").read_bytes())
    data[-30] ^= 1
    (ckpt / "optimizer.pt").write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="checkpoint-4 is damaged: optimizer.pt"):
        manifest.verify_checkpoint(ckpt)
    os.remove(ckpt / "config.json")
    with pytest.raises(CorruptCheckpointError, match="checkpoint-4 is damaged: config.json is missing"):
        manifest.verify_checkpoint(ckpt)


def test_re_sharded_weights_are_parsed(tmp_path):
    """The new layout has no checksums: it is parsed, so a truncated shard is still found."""
    out = tmp_path / "run"
    run(cadence, str(out), stop=4, save_steps=4)
    ckpt = out / "checkpoint-4"
    to_sharded_safetensors(ckpt)
    last = ckpt / shards(ckpt)[-1]
    last.write_bytes(last.read_bytes()[:-10])
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint-4 is damaged: {last.name} cannot be read"):
        manifest.verify_checkpoint(ckpt)
