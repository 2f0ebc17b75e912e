"""DeepSpeed ZeRO-1/2/3 trained end to end on the CPU (DeepSpeed's CPU accelerator, gloo), against transformers'
Trainer on the same seed and config: a float32 tiny GPT-2, 6 steps of 8 sequences as 2 micro-batches (GA 2) over an
epoch of 44, so the sixth step is the epoch's last, shorter window (one micro-batch, weighted by its items), and a
checkpoint at step 3 that a second run resumes from.

Two launches serve every check (deepspeed_train_worker.py runs several trainings in one process): one process
(transformers' references and cadence's ZeRO-1, ZeRO-2, ZeRO-2 with optimizer offload, ZeRO-2 with the config's
own optimizer and/or scheduler sections (one beside an ``optim`` that cannot be built), a resume of a
transformers-written checkpoint, and ``auto_find_batch_size`` with a step that runs out of memory) and two processes
under torchrun (cadence's ZeRO-2 and ZeRO-3).

Tolerances. On one process, cadence and transformers run the same DeepSpeed operations in the same order: the
weights and grad norms are equal bit for bit, the logged losses to 1e-6 (transformers adds the step's float32
micro-batch losses, cadence sums them in float64). Two processes are compared with transformers on one process with
the same global batch (cadence's two processes read exactly those rows): DeepSpeed reduces the gradients of two
ranks instead of one, so float32 sums round differently; transformers' own ZeRO-2 and ZeRO-3 on one process, same
data, end 1e-5 apart, so the weights are held to 5e-5 and the losses to 1e-6. transformers' own two-process run is no
reference on a CPU: accelerate (1.16) finds no communication backend for a CPU it is not told is one, counts one
process of rank 0 on each, and both ranks then train on all the data as a one-process run does (checked by hand:
its losses equal those of one process with half the batch).
"""

import json
import re
from pathlib import Path

import dist_exit
import pytest
import torch
from dist_exit import assert_finished

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow


BOTH = ["optimizer", "scheduler"]
UNBUILT = "adamw_anyprecision"  # needs torchdistx, which is not on PyPI; cadence does not build it either


def run(name, lib, stage, batch=4, **extra):
    return {"name": name, "lib": lib, "stage": stage, "ga": 2, "batch": batch, **extra}


ONE = [
    run("hf1", "hf", 1), run("cd1", "cadence", 1), run("cd1r", "cadence", 1, resume="cd1/checkpoint-3"),
    run("hf2", "hf", 2), run("cd2", "cadence", 2), run("cd2r", "cadence", 2, resume="cd2/checkpoint-3"),
    run("cd2h", "cadence", 2, resume="hf2/checkpoint-3"),  # transformers' checkpoint, resumed on cadence
    run("hfo", "hf", 2, offload=True), run("cdo", "cadence", 2, offload=True),
    run("cdor", "cadence", 2, offload=True, resume="cdo/checkpoint-3"),
    run("hf3", "hf", 3, gather=True), run("hf3n", "hf", 3),  # two-process references, save_model's files
    # the config's own optimizer and scheduler sections, which DeepSpeed builds: both, or one beside the arguments'
    run("hfs", "hf", 2, sections=BOTH), run("cds", "cadence", 2, sections=BOTH),
    run("cdsr", "cadence", 2, sections=BOTH, resume="cds/checkpoint-3"),
    run("hfso", "hf", 2, sections=["optimizer"]), run("cdso", "cadence", 2, sections=["optimizer"]),
    run("hfss", "hf", 2, sections=["scheduler"]), run("cdss", "cadence", 2, sections=["scheduler"]),
    # an optim the sections replace, whose package (torchdistx) is not installed: never built, as in transformers
    run("hfsx", "hf", 2, sections=BOTH, optim=UNBUILT), run("cdsx", "cadence", 2, sections=BOTH, optim=UNBUILT),
    # auto_find_batch_size, out of memory in step 2's second micro-batch (its first one's gradients are in ZeRO-2's
    # partitions): last, as it stops with an error
    run("cdm", "cadence", 2, oom_after=3),
]
TWO = [  # 2 processes x 2 rows: the global batch of ONE's 4 rows
    run("cd2", "cadence", 2, batch=2), run("cd2r", "cadence", 2, batch=2, resume="cd2/checkpoint-3"),
    run("cd3", "cadence", 3, batch=2, gather=True),
    run("cd3r", "cadence", 3, batch=2, gather=True, resume="cd3/checkpoint-3"),
    run("cd3n", "cadence", 3, batch=2), run("cd3nr", "cadence", 3, batch=2, resume="cd3n/checkpoint-3"),
]


def launch(out, runs, nproc):
    proc = dist_exit.launch("deepspeed_train_worker.py", out, json.dumps(runs), nproc=nproc, timeout=600,
                            env={"DS_ACCELERATOR": "cpu"})
    assert_finished(proc, nproc)
    return {r["name"]: torch.load(out / r["name"] / "result.pt", weights_only=True) for r in runs}


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds1")
    return out, launch(out, ONE, 1)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds2")
    return out, launch(out, TWO, 2)


def assert_same_run(got, want, weights_atol=0.0):
    assert got["steps"] == want["steps"] == [1, 2, 3, 4, 5, 6]
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-6)
    assert got["weights"].keys() == want["weights"].keys()
    for name, value in want["weights"].items():
        assert torch.allclose(got["weights"][name], value, rtol=0, atol=weights_atol), name
    if weights_atol == 0:
        assert got["grad_norms"] == want["grad_norms"]


@pytest.mark.parametrize("hf,cd", [("hf1", "cd1"), ("hf2", "cd2"), ("hfo", "cdo")])
def test_one_process_trains_as_transformers(one, hf, cd):
    _, results = one
    assert_same_run(results[cd], results[hf])
    assert results[hf]["moved"] > 1e-3  # the runs trained: the weights moved from the initial model's


@pytest.mark.parametrize("hf,cd", [("hfs", "cds"), ("hfso", "cdso"), ("hfss", "cdss"), ("hfsx", "cdsx")])
def test_config_optimizer_and_scheduler_sections_train_as_transformers(one, hf, cd):
    """DeepSpeed builds the optimizer and/or the schedule from the config's sections, their "auto" values filled
    from the arguments; the engine steps the schedule, so the rate logged after a step is the next one's."""
    _, results = one
    assert_same_run(results[cd], results[hf])
    assert results[cd]["learning_rates"] == results[hf]["learning_rates"]
    assert len(set(results[hf]["learning_rates"])) > 2 and results[hf]["moved"] > 1e-3  # scheduled, trained


def test_auto_find_batch_size_is_warned_and_an_out_of_memory_step_stops_with_the_fix(one):
    """cadence cannot redo a step in smaller micro-batches under DeepSpeed (the engine keeps the earlier micro-batches'
    gradients in buffers it cannot discard): auto_find_batch_size is allowed, as transformers allows it, with a
    warning before step 1, and an out-of-memory error stops the run naming both fields and the fix (it was a
    TypeError from the engine's zero_grad)."""
    _, results = one
    result = results["cdm"]
    fields = ("auto_find_batch_size=True under deepspeed=...", "per_device_train_batch_size",
              "gradient_accumulation_steps")
    assert result["error"].startswith("OutOfMemoryError: CUDA out of memory (injected: batch 4 > 2)")
    assert all(field in result["error"] for field in fields), result["error"]
    assert any(all(field in w for field in fields) and "trains as with auto_find_batch_size=False" in w
               for w in result["warnings"]), result["warnings"]
    assert result["forwards"] == 4  # not retried: the 4th forward (step 2's second micro-batch) ran out of memory
    assert result["losses"] == results["cd2"]["losses"][:1]  # until then, trained as without auto_find_batch_size


@pytest.mark.parametrize("hf,cd", [("hf2", "cd2"), ("hf3", "cd3"), ("hf3n", "cd3n")])
def test_two_processes_train_as_transformers_on_one(one, two, hf, cd):
    assert_same_run(two[1][cd], one[1][hf], weights_atol=5e-5)


@pytest.mark.parametrize("unbroken,resumed", [("cd1", "cd1r"), ("cd2", "cd2r"), ("cdo", "cdor"), ("cds", "cdsr")])
def test_one_process_resumes_bit_identical(one, unbroken, resumed):
    _, results = one
    assert results[resumed]["steps"] == [1, 2, 3, 4, 5, 6]  # the resumed run's log history holds the first 3 too
    assert results[resumed]["losses"] == results[unbroken]["losses"]
    assert results[resumed]["learning_rates"] == results[unbroken]["learning_rates"]
    for name, value in results[unbroken]["weights"].items():
        assert torch.equal(results[resumed]["weights"][name], value), name


@pytest.mark.parametrize("unbroken,resumed", [("cd2", "cd2r"), ("cd3", "cd3r"), ("cd3n", "cd3nr")])
def test_two_processes_resume_bit_identical(two, unbroken, resumed):
    _, results = two
    assert results[resumed]["losses"] == results[unbroken]["losses"]
    for name, value in results[unbroken]["weights"].items():
        assert torch.equal(results[resumed]["weights"][name], value), name


def test_a_transformers_checkpoint_resumes_on_cadence(one):
    _, results = one
    assert_same_run(results["cd2h"], results["hf2"])


def names(folder: Path) -> set:
    """The files under ``folder``, ranks' and steps' numbers written as N (two processes against one)."""
    return {re.sub(r"(rank_|global_step)\d+", r"\1N", str(p.relative_to(folder)))
            for p in folder.rglob("*") if p.is_file()}


def test_zero3_save_model_and_checkpoints_write_what_transformers_writes(one, two):
    hf_out, cd_out = one[0], two[0]
    # with stage3_gather_16bit_weights_on_model_save: model.safetensors, which from_pretrained reads
    assert names(cd_out / "cd3" / "final") == names(hf_out / "hf3" / "final") == {
        "config.json", "generation_config.json", "model.safetensors", "training_args.bin"}
    assert two[1]["cd3"]["reloaded_equal"] is True
    # without: DeepSpeed's files and zero_to_fp32.py (the worker recovered the weights through it)
    without = names(hf_out / "hf3n" / "final")
    assert "model.safetensors" not in without and {"latest", "zero_to_fp32.py"} <= without
    assert names(cd_out / "cd3n" / "final") == without
    # checkpoints: transformers' files (rng_state.pth is one file a process in cadence), besides cadence's own
    for hf_run, cd_run in (("hf3", "cd3"), ("hf3n", "cd3n")):
        hf_files = names(hf_out / hf_run / "checkpoint-3") - {"rng_state.pth"}
        cd_files = names(cd_out / cd_run / "checkpoint-3")
        assert hf_files <= cd_files, hf_files - cd_files
        assert ("model.safetensors" in cd_files) == (hf_run == "hf3")
