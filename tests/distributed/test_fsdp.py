"""FSDP2 (torch's fully_shard) on 2 CPU processes (gloo, launched with torchrun) trains a float64 tiny GPT-2
exactly like one process with the same global batch (GA 2, clipping, AdamW weight decay, linear schedule);
its checkpoints, full (model.safetensors + optimizer.pt) and sharded (torch.distributed.checkpoint), resume
bit-identically; CPU offload and activation checkpointing change nothing but memory.

The one-process reference is itself pinned to transformers.Trainer in test_hf_parity.py."""

import json
import os

import pytest
import torch
from dist_exit import launch

FSDP = "full_shard auto_wrap"


def run(nproc, out, *extra, check=True):
    """Run fsdp_worker.py on ``nproc`` processes; returns the finished process (stdout has each rank's STOPPED line),
    which must have succeeded (``check``)."""
    proc = launch("fsdp_worker.py", out, *extra, nproc=nproc, timeout=600)
    assert proc.returncode == 0 or not check, proc.stderr[-4000:]
    return proc


def result(out):
    from safetensors.torch import load_file

    final = os.path.join(out, "final")
    with open(os.path.join(final, "losses.json")) as f:
        logs = json.load(f)
    return load_file(os.path.join(final, "model.safetensors")), logs


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, batch 8 (= 2 x 4), both model kinds: computed once for the module."""
    cache = {}

    def get(no_items=False):
        if no_items not in cache:
            out = tmp_path_factory.mktemp("one")
            run(1, out, "--batch", "8", *(["--no-items"] if no_items else []))
            cache[no_items] = result(out)
        return cache[no_items]

    return get


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """2 processes, batch 4 each, FSDP, no checkpoint: the run the one-process reference is compared with, and the
    unbroken run every resume must end identical to; computed once for the module."""
    cache = []

    def get():
        if not cache:
            out = tmp_path_factory.mktemp("two")
            run(2, out, "--batch", "4", "--fsdp", FSDP)
            cache.append(result(out))
        return cache[0]

    return get


def retied(weights):
    """Both names of GPT-2's tied embedding (a file stores one of them, under either name)."""
    for a, b in (("lm_head.weight", "transformer.wte.weight"), ("gpt.lm_head.weight", "gpt.transformer.wte.weight")):
        if (a in weights) != (b in weights):
            weights[a] = weights[b] = weights.get(a, weights.get(b))
    return weights


def assert_same_training(got, expected):
    (weights, logs), (ref_weights, ref_logs) = got, expected
    assert len(weights) == len(ref_weights)  # the tied embedding stored once, as one process stores it
    weights, ref_weights = retied(dict(weights)), retied(dict(ref_weights))
    assert sorted(weights) == sorted(ref_weights)
    for name, value in ref_weights.items():
        assert weights[name].dtype == torch.float64
        # float64 sums in another order (sharded reduce-scatter vs one process): ~1e-15 seen, 1e-9 promised
        assert torch.allclose(weights[name], value, atol=1e-9, rtol=0), name
    assert logs["step"] == ref_logs["step"] == 6
    assert logs["grad_norms"] == pytest.approx(ref_logs["grad_norms"], rel=1e-9)  # total norm over all shards
    # transformers computes the causal-LM loss in float32 even for a float64 model: logged losses agree to ~1e-7
    assert logs["losses"] == pytest.approx(ref_logs["losses"], rel=1e-6)
    assert logs["losses"][0] == pytest.approx(4.15, abs=0.02)  # ~ln(64): an untrained 64-token model, not a no-op run


@pytest.mark.slow
@pytest.mark.parametrize("no_items", [False, True], ids=["num_items_in_batch", "mean_loss"])
def test_fsdp_two_processes_equal_one(no_items, reference, two_processes, tmp_path):
    if no_items:  # the wrapper has no _no_split_modules: its layers are named in transformer_layer_cls_to_wrap
        run(2, tmp_path, "--batch", "4", "--fsdp", FSDP, "--no-items", "--config",
            '{"transformer_layer_cls_to_wrap": ["GPT2Block"]}')
        weights, logs = result(tmp_path)
    else:
        weights, logs = two_processes()
    assert logs["fsdp_units"] == 3  # each GPT2Block (the model's _no_split_modules) and the root
    assert_same_training((weights, logs), reference(no_items))


@pytest.mark.slow
@pytest.mark.parametrize("words, config, checkpointed", [
    ("full_shard auto_wrap offload", None, 0),
    ("shard_grad_op auto_wrap", '{"activation_checkpointing": true}', 2),
], ids=["cpu_offload", "activation_checkpointing"])
def test_fsdp_offload_and_activation_checkpointing_change_nothing(words, config, checkpointed, reference, tmp_path):
    run(2, tmp_path, "--batch", "4", "--fsdp", words, *(["--config", config] if config else []))
    weights, logs = result(tmp_path)
    assert logs["checkpointed"] == checkpointed
    assert_same_training((weights, logs), reference())


@pytest.mark.slow
@pytest.mark.parametrize("state_dict_type", ["FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_fsdp_checkpoint_resumes_bit_identically(state_dict_type, two_processes, tmp_path):
    """Stopped after step 4 and resumed from checkpoint-4, the run ends bit-identical to one that never stopped (nor
    saved: the module's two-process run)."""
    config = json.dumps({"state_dict_type": state_dict_type})
    common = ["--batch", "4", "--fsdp", FSDP, "--config", config, "--save-steps", "2"]
    run(2, tmp_path / "run", *common, "--stop", "4")
    ckpt = tmp_path / "run" / "checkpoint-4"
    files = set(os.listdir(ckpt))
    if state_dict_type == "FULL_STATE_DICT":  # the one-process layout: transformers and one process read it
        assert {"model.safetensors", "optimizer.pt", "config.json"} <= files and "pytorch_model_fsdp_0" not in files
        from transformers import GPT2LMHeadModel

        loaded = GPT2LMHeadModel.from_pretrained(ckpt)
        assert loaded.lm_head.weight is loaded.transformer.wte.weight and loaded.dtype == torch.float64
        optimizer = torch.load(ckpt / "optimizer.pt", weights_only=True)  # numbered as optimizer.state_dict() numbers
        n_params = len(list(loaded.parameters()))
        assert sorted(optimizer["state"]) == list(range(n_params))
        assert sum(len(g["params"]) for g in optimizer["param_groups"]) == n_params
    else:  # one torch.distributed.checkpoint folder each, a shard per process
        assert {"pytorch_model_fsdp_0", "optimizer_0"} <= files and "model.safetensors" not in files
        for name in ("pytorch_model_fsdp_0", "optimizer_0"):
            assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(ckpt / name))
    assert not [p for p in os.listdir(tmp_path / "run") if p.startswith("tmp-")]  # staging renamed away
    run(2, tmp_path / "run", *common, "--resume")
    (full_weights, full_logs), (weights, logs) = two_processes(), result(tmp_path / "run")
    assert all(torch.equal(weights[k], v) for k, v in full_weights.items())
    assert logs["losses"] == full_logs["losses"] and logs["grad_norms"] == full_logs["grad_norms"]


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [True, False], ids=["async_save", "sync_save"])
def test_fsdp_sharded_state_is_written_by_a_background_thread(async_save, tmp_path):
    """async_save: every process's shards are written off the training thread (by its writer's thread), and each
    folder, renamed once they all are, verifies against a manifest listing both processes' shards; async_save=False
    writes them on the training thread. (A resume from them is exact: test_fsdp_checkpoint_resumes_bit_identically.)"""
    from cadence.checkpoint.manifest import verify_checkpoint

    config = json.dumps({"state_dict_type": "SHARDED_STATE_DICT"})
    run(2, tmp_path, "--batch", "4", "--fsdp", FSDP, "--config", config, "--save-steps", "2", "--stop", "4",
        "--dcp-threads", *([] if async_save else ["--sync-save"]))
    for rank in (0, 1):
        threads = json.loads((tmp_path / f"dcp_threads_{rank}.json").read_text())
        assert len(threads) == 4  # model and optimizer, at steps 2 and 4
        assert all((name != "MainThread") == async_save for name in threads), threads
    for step in (2, 4):
        ckpt = tmp_path / f"checkpoint-{step}"
        verify_checkpoint(ckpt)  # the manifest lists both processes' shards, as written
        for name in ("pytorch_model_fsdp_0", "optimizer_0"):
            assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(ckpt / name))
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tmp-")]


@pytest.mark.slow
def test_a_failed_background_shard_write_stops_every_process_naming_the_folder(tmp_path):
    """Process 1 cannot write its shards of checkpoint-4 (in the background): both processes stop with the
    error naming the folder, checkpoint-4 does not exist (nor its staging folder), checkpoint-2 is intact."""
    from cadence.checkpoint.manifest import verify_checkpoint

    config = json.dumps({"state_dict_type": "SHARDED_STATE_DICT"})
    proc = run(2, tmp_path, "--batch", "4", "--fsdp", FSDP, "--config", config, "--save-steps", "2", "--stop", "4",
               "--fail-shards-at", "4", check=False)
    assert proc.returncode != 0
    named = f"checkpoint {tmp_path / 'checkpoint-4'} could not be written (in the background)"
    assert proc.stderr.count(named) >= 2, proc.stderr[-4000:]  # each process raises it, naming the folder
    assert "No space left on device (injected)" in proc.stderr
    assert sorted(p for p in os.listdir(tmp_path) if "checkpoint" in p) == ["checkpoint-2"]
    verify_checkpoint(tmp_path / "checkpoint-2")


@pytest.mark.slow
@pytest.mark.parametrize("state_dict_type", ["FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_fsdp_evaluation_and_load_best_model_at_end(state_dict_type, tmp_path):
    """Evaluation under FSDP equals one process's; the best checkpoint (step 2 of 6, not the last) is loaded
    back into the sharded model, and save_model writes it whole."""
    run(1, tmp_path / "one", "--batch", "8", "--best", "--save-steps", "2")
    run(2, tmp_path / "two", "--batch", "4", "--fsdp", FSDP, "--best", "--save-steps", "2",
        "--config", json.dumps({"state_dict_type": state_dict_type}))
    (ref_weights, ref_logs), (weights, logs) = result(tmp_path / "one"), result(tmp_path / "two")
    assert ref_logs["best"].endswith("checkpoint-2") and logs["best"].endswith("checkpoint-2")
    assert logs["eval_losses"] == pytest.approx(ref_logs["eval_losses"], rel=1e-12) and len(logs["eval_losses"]) == 3
    for name, value in ref_weights.items():  # the step-2 weights, not the step-6 ones
        assert torch.allclose(weights[name], value, atol=1e-9, rtol=0), name
    if state_dict_type == "FULL_STATE_DICT":
        from safetensors.torch import load_file

        best = load_file(os.path.join(logs["best"], "model.safetensors"))
        assert all(torch.equal(weights[k], v) for k, v in best.items())


@pytest.mark.parametrize("fsdp, config, message", [
    ("full_shard typo", None, r"\['typo'\] unknown"),
    ("no_shard", None, "plain data parallelism"),
    ("full_shard shard_grad_op", None, "more than one sharding strategy"),
    (None, {"version": 2}, "fsdp_config is set but fsdp is not"),
    ("full_shard", {"version": 1}, "FSDP2 only"),
    ("full_shard", {"fsdp_min_num_params": 10, "sharding": 1}, r"unknown keys \['sharding'\]"),
    ("full_shard", {"state_dict_type": "LOCAL_STATE_DICT"}, "state_dict_type='LOCAL_STATE_DICT' is invalid"),
])
def test_bad_fsdp_settings_are_refused_before_training(fsdp, config, message, tmp_path):
    from cadence.backend import fsdp_plugin
    from cadence import TrainingArguments

    with pytest.raises(ValueError, match=message):
        fsdp_plugin(TrainingArguments(str(tmp_path), fsdp=fsdp, fsdp_config=config, report_to="none"))


def test_fsdp_settings_map_to_the_plugin(tmp_path):
    from cadence.backend import fsdp_plugin
    from cadence import TrainingArguments

    def plugin(fsdp, config=None):
        return fsdp_plugin(TrainingArguments(str(tmp_path), fsdp=fsdp, fsdp_config=config, report_to="none"))

    full = plugin("full_shard")
    assert full.fsdp_version == 2 and full.reshard_after_forward is True and full.state_dict_type == "FULL_STATE_DICT"
    assert full.auto_wrap_policy is None or "no_wrap" in str(full.auto_wrap_policy).lower()
    zero2 = plugin(["shard_grad_op", "offload", "auto_wrap"], {"fsdp_state_dict_type": "SHARDED_STATE_DICT"})
    assert zero2.reshard_after_forward is False and zero2.state_dict_type == "SHARDED_STATE_DICT"
    assert type(zero2.cpu_offload).__name__ == "CPUOffloadPolicy"
    assert zero2.auto_wrap_policy.__name__ == "transformer_auto_wrap_policy"
    sized = plugin("full_shard auto_wrap", {"min_num_params": 1000})
    assert sized.auto_wrap_policy.__name__ == "size_based_auto_wrap_policy" and sized.min_num_params == 1000
    assert plugin("hybrid_shard").hybrid and not plugin("full_shard").hybrid
    assert plugin(None) is None


@pytest.mark.slow
def test_fsdp_early_stopping_stops_every_process_at_the_same_step(tmp_path):
    """Evaluation at step 4 is no better than at step 2: every process decides to stop at step 4 from the same
    (reduced) metric, so none is left waiting in a collective."""
    proc = run(2, tmp_path, "--batch", "4", "--fsdp", FSDP, "--best", "--early-stop", "--save-steps", "2")
    assert sorted(line for line in proc.said if line.startswith("STOPPED")) == ["STOPPED 0 4", "STOPPED 1 4"]
    assert result(tmp_path)[1]["best"].endswith("checkpoint-2")


@pytest.mark.slow
def test_full_fsdp_checkpoint_resumes_on_one_process(reference, tmp_path):
    """A FULL_STATE_DICT checkpoint of 2 processes x batch 4 resumes on 1 process x batch 8 (the same global
    batch, so the same data order): it ends where one unbroken process ends (the model has no dropout, so the
    per-process RNG states, which cannot carry over, do not matter)."""
    run(2, tmp_path, "--batch", "4", "--fsdp", FSDP, "--save-steps", "2", "--stop", "4")
    run(1, tmp_path, "--batch", "8", "--fsdp", FSDP, "--save-steps", "2", "--resume")
    weights, logs = result(tmp_path)
    ref_weights, ref_logs = reference()
    for name, value in ref_weights.items():
        assert torch.allclose(weights[name], value, atol=1e-9, rtol=0), name
    assert logs["losses"] == pytest.approx(ref_logs["losses"], rel=1e-6) and logs["step"] == 6


def test_fsdp_with_torch_compile_is_refused(tmp_path):
    from tiny import RegressionDataset, RegressionModel

    from cadence import Trainer, TrainingArguments

    args = TrainingArguments(str(tmp_path), fsdp="full_shard", torch_compile=True, use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="torch_compile=True is not supported"):
        Trainer(RegressionModel(), args, train_dataset=RegressionDataset())
