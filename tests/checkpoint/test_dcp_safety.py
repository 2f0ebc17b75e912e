"""FSDP's sharded checkpoints (torch.distributed.checkpoint folders) never run code when read: a pickle planted in
``.metadata`` or in a ``.distcp`` blob (a non-tensor value such as the optimizer's lr, or a tensor) is refused,
naming the file, and the marker file it would write never appears. torch's own reader unpickles ``.metadata`` with
plain pickle and loads non-tensor blobs with ``weights_only=False``: each planted file below runs code through it.

The fast tests build a DCP folder in this process; the slow ones resume a real 2-process FSDP run under torchrun.
"""

import contextlib
import io
import os
import pickle
import shutil
import warnings

import pytest
import torch
from test_fsdp import FSDP, run
from test_safe_load import Evil

from cadence.checkpoint import manifest
from cadence.checkpoint_io import formats, sharded
from cadence.checkpoint_io.formats import CorruptCheckpointError, UnsafeCheckpointError


def plant_metadata(folder, marker):
    """``.metadata`` replaced by a pickle that writes ``marker`` when unpickled (the metadata itself kept inside)."""
    meta = pickle.loads((folder / ".metadata").read_bytes())
    meta.planner_data = {"x": Evil(marker)}  # buried in a valid Metadata, not just the whole file
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    return ".metadata"


def plant_blob(folder, marker, kind):
    """A ``torch.save`` payload appended to a ``.distcp`` file, and ``.metadata`` (legitimately pickled) pointed at it
    for the first entry of ``kind`` ("bytes": a non-tensor value; "tensor"); returns the file's name."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    meta = pickle.loads((folder / ".metadata").read_bytes())
    index = next(i for i in sorted(meta.storage_data, key=lambda i: meta.storage_data[i].relative_path)
                 if isinstance(meta.state_dict_metadata[i.fqn], BytesStorageMetadata) == (kind == "bytes"))
    payload = io.BytesIO()
    torch.save({"x": Evil(marker)}, payload)
    path = folder / meta.storage_data[index].relative_path
    meta.storage_data[index].offset = path.stat().st_size
    meta.storage_data[index].length = len(payload.getvalue())
    with open(path, "ab") as f:
        f.write(payload.getvalue())
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    return path.name


PLANTS = {
    "metadata": plant_metadata,
    "distcp-value": lambda folder, marker: plant_blob(folder, marker, "bytes"),
    "distcp-tensor": lambda folder, marker: plant_blob(folder, marker, "tensor"),
}


def optimizer_state():
    """A trained Linear's AdamW state in DCP's form: tensors, plus plain values (lr, betas, ...) stored as blobs."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return model, optimizer, {"optimizer": get_optimizer_state_dict(model, optimizer)}


@pytest.fixture
def dcp_folder(tmp_path):
    import torch.distributed.checkpoint as dcp

    _, _, state = optimizer_state()
    folder = tmp_path / "optimizer_0"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: one process"
        dcp.save(state, checkpoint_id=folder)
    return folder


def fresh_state():
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    return {"optimizer": get_optimizer_state_dict(model, optimizer)}


def test_an_intact_folder_loads_every_value(dcp_folder):
    _, optimizer, saved = optimizer_state()
    sharded.check_dcp_folder(dcp_folder)
    state = fresh_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sharded.load_dcp(state, dcp_folder)
    loaded = state["optimizer"]
    assert loaded["param_groups"][0]["lr"] == 0.1 and loaded["param_groups"][0]["betas"] == (0.9, 0.999)  # blobs
    for name, values in saved["optimizer"]["state"].items():
        for key, value in values.items():
            assert torch.equal(loaded["state"][name][key], value), (name, key)


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_pickle_never_runs(dcp_folder, tmp_path, plant):
    import torch.distributed.checkpoint as dcp

    marker = str(tmp_path / "pwned.txt")
    name = PLANTS[plant](dcp_folder, marker)
    with pytest.raises(UnsafeCheckpointError, match=f"refusing to load .*optimizer_0/{name}.*nothing in it was executed"):
        sharded.check_dcp_folder(dcp_folder)
    with warnings.catch_warnings(), pytest.raises(UnsafeCheckpointError, match=f"refusing to load .*optimizer_0/{name}"):
        warnings.simplefilter("ignore")
        sharded.load_dcp(fresh_state(), dcp_folder)  # what FSDP's resume and best-model loading call
    reader, planner = sharded._safe_dcp_classes()  # and torch's load with only cadence's reader and planner
    with warnings.catch_warnings(), pytest.raises(BaseException, match="refusing to load|Weights only load failed"):
        warnings.simplefilter("ignore")
        dcp.load(fresh_state(), storage_reader=reader(dcp_folder), planner=planner(dcp_folder))
    assert not os.path.exists(marker)
    if plant != "distcp-tensor":  # torch's own reader runs it: the test would see a loader that did the same
        with warnings.catch_warnings(), contextlib.suppress(BaseException):  # whatever follows the payload
            warnings.simplefilter("ignore")
            dcp.load(fresh_state(), checkpoint_id=dcp_folder)
        assert os.path.exists(marker)


def test_metadata_pointing_outside_its_folder_is_refused(dcp_folder):
    meta = pickle.loads((dcp_folder / ".metadata").read_bytes())
    next(iter(meta.storage_data.values())).relative_path = "../../etc/passwd"
    (dcp_folder / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(CorruptCheckpointError, match="optimizer_0/.metadata points .* at '../../etc/passwd'"):
        sharded.check_dcp_folder(dcp_folder)


@pytest.mark.parametrize("damage, where, why", [
    (lambda f: (f / ".metadata").write_bytes((f / ".metadata").read_bytes()[:100]), ".metadata", "cannot be read"),
    (lambda f: (f / "__0_0.distcp").write_bytes((f / "__0_0.distcp").read_bytes()[:100]), "__0_0.distcp", "is shorter than"),
    (lambda f: (f / ".metadata").write_bytes(pickle.dumps({"not": "metadata"})), ".metadata", "is not torch.distributed"),
], ids=["metadata-truncated", "distcp-truncated", "metadata-other-object"])
def test_damaged_files_are_named(dcp_folder, damage, where, why):
    damage(dcp_folder)
    with pytest.raises(CorruptCheckpointError, match=f"is damaged: optimizer_0/{where} {why}"):
        sharded.check_dcp_folder(dcp_folder)


# ---------------------------------------------------------------- a real FSDP run under torchrun

SHARDED = ["--batch", "4", "--fsdp", FSDP, "--config", '{"state_dict_type": "SHARDED_STATE_DICT"}', "--save-steps", "2"]


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded") / "run"
    run(2, out, *SHARDED, "--stop", "4")
    return out


def resume_fails(out):
    proc = run(2, out, *SHARDED, "--resume", check=False)
    assert proc.returncode != 0
    return proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("shards, plant, listing", [
    ("pytorch_model_fsdp_0", "metadata", "recomputed"), ("optimizer_0", "metadata", "recomputed"),
    ("optimizer_0", "distcp-value", "recomputed"), ("pytorch_model_fsdp_0", "distcp-tensor", "recomputed"),
    ("optimizer_0", "distcp-value", "deleted"),
])
def test_resuming_a_sharded_fsdp_checkpoint_never_runs_a_planted_pickle(sharded_run, tmp_path, shards, plant, listing):
    out = tmp_path / "run"
    shutil.copytree(sharded_run, out)
    ckpt = out / "checkpoint-4"
    marker = str(tmp_path / "pwned.txt")
    name = PLANTS[plant](ckpt / shards, marker)
    if listing == "recomputed":  # an attacker who rewrites the manifest too: the hashes match
        manifest.write_manifest(ckpt)
    else:  # or who makes it look like a checkpoint without one (a cadence checkpoint without its manifest is damaged)
        os.remove(ckpt / manifest.MANIFEST_NAME)
        os.remove(ckpt / formats.LOOP_STATE_NAME)
    stderr = resume_fails(out)
    assert f"UnsafeCheckpointError: refusing to load checkpoint-4/{shards}/{name}" in stderr, stderr[-3000:]
    assert not os.path.exists(marker)
