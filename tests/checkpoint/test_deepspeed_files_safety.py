"""DeepSpeed's checkpoint files (``latest``, ``global_step*/mp_rank_*_model_states.pt``, ``*_optim_states.pt``) are
unpickled by ``engine.load_checkpoint`` with ``weights_only=False``; cadence checks each with ``weights_only=True`` and
DeepSpeed's own few classes first. A real ZeRO-2/ZeRO-3 checkpoint (written by DeepSpeed on the CPU, in a process of
its own) passes and resumes exactly; a payload planted in any of its files, which plain ``torch.load`` runs, is
refused naming the file and the global, and never runs. The GPU run through the Trainer: scripts/gpu_check.py."""

import collections
import re
import json
import shutil
import types
from pathlib import Path

import pytest
import torch

import dist_exit
from cadence import TrainingArguments
from cadence.backend import Backend
from cadence.checkpoint_io.formats import CorruptCheckpointError, UnsafeCheckpointError

pytest.importorskip("deepspeed")
from cadence.checkpoint_io.deepspeed_files import check_deepspeed_folder  # noqa: E402


class Payload:
    """Unpickled by plain pickle, it writes ``marker``: what a crafted checkpoint file would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def plant(path, marker):
    """``path`` rewritten with a ``Payload`` beside its genuine contents (read here with plain pickle: our own file)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["payload"] = Payload(marker)
    torch.save(state, path)


def assert_refused_and_never_ran(folder, planted, marker):
    torch.load(planted, map_location="cpu", weights_only=False)  # the plant is live: plain unpickling runs it
    assert marker.read_text() == "ran"
    marker.unlink()
    with pytest.raises(UnsafeCheckpointError) as caught:
        check_deepspeed_folder(folder)
    message = str(caught.value)
    assert str(planted.relative_to(folder.parent)) in message and "builtins.exec" in message, message
    assert not marker.exists()


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def real_checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"ds{request.param}") / "checkpoint-3"
    proc = dist_exit.launch("deepspeed_cpu_worker.py", request.param, folder, nproc=1, env={"DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return folder, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_real_zero_checkpoint_passes_the_check_and_resumes_exactly(real_checkpoint):
    folder, result = real_checkpoint
    files = [f for f in result["written"] if f.endswith(".pt")]
    assert any(f.endswith("_model_states.pt") for f in files) and any(f.endswith("_optim_states.pt") for f in files)
    assert result["checked"] == files  # every file DeepSpeed reads went through the check, and passed
    assert result["differed_before"] and result["resumed_equal"]  # the engine then loaded the saved state exactly


@pytest.mark.slow
def test_a_payload_planted_in_each_file_of_a_real_checkpoint_is_refused(real_checkpoint, tmp_path):
    folder, result = real_checkpoint
    for name in (f for f in result["written"] if f.endswith(".pt")):
        copy = tmp_path / name.replace("/", "_") / folder.name
        shutil.copytree(folder, copy)
        marker = tmp_path / "ran.txt"
        plant(copy / name, marker)
        assert_refused_and_never_ran(copy, copy / name, marker)


def hand_built(folder):
    """A checkpoint laid out as DeepSpeed 0.19's ZeRO-2 save writes it, holding the same kinds of objects
    (engine._save_checkpoint's and the ZeRO optimizer's state_dict: the loss scaler, the stage enum, slices)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    tag = folder / "global_step3"
    tag.mkdir(parents=True)
    (folder / "latest").write_text("global_step3")
    shapes = collections.OrderedDict([("0.weight", torch.Size([8, 4])), ("0.bias", torch.Size([8]))])
    torch.save({"module": collections.OrderedDict([("0.weight", torch.ones(8, 4)), ("0.bias", torch.zeros(8))]),
                "buffer_names": [], "optimizer": None, "param_shapes": [shapes], "lr_scheduler": None,
                "global_steps": 3, "ds_config": {"zero_optimization": {"stage": 2}}, "ds_version": "0.19.8"},
               tag / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {"zero_stage": ZeroStageEnum.gradients, "loss_scaler": LossScaler(1.0),
                                         "dynamic": DynamicLossScaler(2.0 ** 16, 1000, 1.0, 2, True, dtype=torch.float16),
                                         "single_partition_of_fp32_groups": [torch.ones(40)],
                                         "param_slice_mappings": [collections.OrderedDict(
                                             [("0.weight", fragment_address(32, 0))])]},
                "ds_config": {}, "ds_version": "0.19.8"}, tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    return tag


def test_files_of_deepspeed_s_kinds_pass_and_a_payload_in_either_is_refused(tmp_path):
    tag = hand_built(tmp_path / "good" / "checkpoint-3")
    assert [p.name for p in check_deepspeed_folder(tag.parent)] == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        bad = hand_built(tmp_path / name / "checkpoint-3")
        plant(bad / name, tmp_path / "ran.txt")
        assert_refused_and_never_ran(bad.parent, bad / name, tmp_path / "ran.txt")


@pytest.mark.parametrize("tag", ["../elsewhere", "/tmp", "global_step9"])
def test_latest_naming_no_folder_of_the_checkpoint_is_refused(tmp_path, tag):
    folder = tmp_path / "checkpoint-3"
    hand_built(folder)
    (folder / "latest").write_text(tag)
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint-3 is damaged: latest names '{tag}'"):
        check_deepspeed_folder(folder)


def test_the_backend_checks_before_deepspeed_reads_a_file(tmp_path):
    """Backend's two DeepSpeed loads (weights only; everything) refuse a planted folder before calling the engine,
    and hand a sound one to it (an engine stand-in that records the calls; real engines resume in
    test_deepspeed_train.py)."""
    calls = []
    backend = Backend(TrainingArguments(str(tmp_path / "out"), use_cpu=True, report_to="none"))
    backend.deepspeed = {"zero_optimization": {"stage": 2}}  # what a DeepSpeed run's Backend holds
    backend.engine = types.SimpleNamespace(load_checkpoint=lambda folder, **kw: calls.append((Path(folder).name, kw)))
    good = hand_built(tmp_path / "good" / "checkpoint-3").parent
    backend.load_model_weights(None, good)
    backend.load_optimizer_state(None, None, good)
    assert calls == [("checkpoint-3", {"load_module_only": True}), ("checkpoint-3", {})]
    bad = hand_built(tmp_path / "bad" / "checkpoint-3")
    plant(bad / "zero_pp_rank_0_mp_rank_00_optim_states.pt", tmp_path / "ran.txt")
    for load in (lambda: backend.load_model_weights(None, bad.parent),
                 lambda: backend.load_optimizer_state(None, None, bad.parent)):
        with pytest.raises(UnsafeCheckpointError, match="zero_pp_rank_0_mp_rank_00_optim_states.pt names builtins.exec"):
            load()
    assert len(calls) == 2 and not (tmp_path / "ran.txt").exists()


@pytest.mark.slow
def test_universal_tags_and_links_out_of_a_real_checkpoint_are_refused_before_deepspeed_reads_them(tmp_path):
    """A real ZeRO-2 checkpoint written on the CPU, resumed through Backend with a real engine configured with
    "checkpoint": {"load_universal": true}, which reads latest_universal's tag (and its zero/ folder) instead of
    latest's: a payload there, a tag naming ../elsewhere, a tag folder or zero/ linked outside are each refused by
    both loads, and the payload never runs (before the fix each ran, through the same two calls)."""
    proc = dist_exit.launch("deepspeed_universal_worker.py", tmp_path, nproc=1, env={"DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows[0] == {"case": "genuine", "resumed_equal": True}  # the check passes what DeepSpeed wrote
    expected = {
        "universal_payload": "UnsafeCheckpointError: .* checkpoint-3/universal/mp_rank_00_model_states.pt names builtins.exec",
        "universal_dotdot": "CorruptCheckpointError: .* latest_universal names '../elsewhere', not a folder of this checkpoint",
        "tag_link_out": "UnsafeCheckpointError: .*: universal leads outside the checkpoint folder through a symbolic link",
        "zero_link_out": "UnsafeCheckpointError: .*: universal/zero leads outside the checkpoint folder through a symbolic link",
    }
    assert sorted((row["case"], row["load"]) for row in rows[1:]) == sorted(
        (case, load) for case in expected for load in ("load_optimizer_state", "load_model_weights"))
    for row in rows[1:]:
        assert not row["ran"], row  # the payload's marker file was never written
        assert re.match(expected[row["case"]], row["error"] or ""), row


def test_links_and_special_files_under_a_tag_are_refused_naming_the_link(tmp_path):
    """The same rule without an engine: a file under the tag linked outside (its size never said), a FIFO as a
    tag file or under the tag (never opened: it would hang), latest_universal checked even when latest is sound."""
    import os

    folder = tmp_path / "checkpoint-3"
    tag = hand_built(folder)
    outside = tmp_path / "secret.pt"
    torch.save({"x": torch.zeros(123)}, outside)
    os.symlink(outside, tag / "extra.pt")
    with pytest.raises(UnsafeCheckpointError, match="global_step3/extra.pt leads outside") as caught:
        check_deepspeed_folder(folder)
    assert str(outside.stat().st_size) not in str(caught.value) and "secret" not in str(caught.value)
    (tag / "extra.pt").unlink()
    os.mkfifo(tag / "pipe.pt")
    with pytest.raises(CorruptCheckpointError, match="global_step3/pipe.pt is a FIFO"):
        check_deepspeed_folder(folder)
    (tag / "pipe.pt").unlink()
    os.mkfifo(folder / "latest_universal")
    with pytest.raises(CorruptCheckpointError, match="latest_universal is a FIFO"):
        check_deepspeed_folder(folder)
    (folder / "latest_universal").unlink()
    (folder / "latest_universal").write_text("global_step3")
    assert len(check_deepspeed_folder(folder)) == 2  # one tag named twice: its files checked once
