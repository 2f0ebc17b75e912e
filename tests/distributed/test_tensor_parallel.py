"""Tensor parallelism (a tiny Llama loaded with its tp_plan: DTensor parameters on a TP mesh) and 2-D layouts through
accelerate's ParallelismConfig, on CPU processes (gloo, torchrun): N processes train like one process with the same
global batch (GA 2, clipping, AdamW, linear schedule); checkpoints resume bit-identically and on another layout; bad
layouts are refused before step 1.

The one-process reference is the same cadence loop that test_hf_parity.py pins to transformers.Trainer. Tolerances:
the runs are float32, and a TP group sums a row-parallel matmul's halves in another order than one process does
(~1e-7 per op seen on the losses, ~5e-6 on the weights after 8 AdamW steps at lr 3e-3): 1e-5 is promised (5e-5
for the 4-process layouts, see there)."""

import json
import os

import pytest
import torch
from dist_exit import assert_finished, launch
from repo_paths import TESTS

DIR = TESTS


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A 2-layer Llama (hidden 64) saved once: every run loads the same weights."""
    folder = tmp_path_factory.mktemp("llama")
    proc = launch("tp_worker.py", "--make-model", folder, nproc=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


def run(nproc, llama, out, *extra):
    """tp_worker.py on ``nproc`` processes; every one must end cleanly (its process group ended, no abort at exit)."""
    proc = launch("tp_worker.py", llama, out, *extra, nproc=nproc, timeout=900)
    assert_finished(proc, nproc)
    return proc


def result(out):
    from safetensors.torch import load_file

    final = os.path.join(out, "final")
    with open(os.path.join(final, "losses.json")) as f:
        return load_file(os.path.join(final, "model.safetensors")), json.load(f)


@pytest.fixture(scope="module")
def one(llama, tmp_path_factory):
    """One process, batch 4, the model whole."""
    out = tmp_path_factory.mktemp("one")
    run(1, llama, out, "--batch", "4")
    return result(out)


@pytest.fixture(scope="module")
def tp2(llama, tmp_path_factory):
    """TP=2 on 2 processes (one data-parallel rank: the same batch 4 on both), checkpoints every 4 steps."""
    out = tmp_path_factory.mktemp("tp2")
    run(2, llama, out, "--batch", "4", "--distributed", '{"tp_size": 2}', "--save-steps", "4")
    return out


def assert_close_training(got, expected, atol=1e-5):
    (weights, logs), (ref_weights, ref_logs) = got, expected
    assert sorted(weights) == sorted(ref_weights) and len(weights) == 21  # gathered whole: every tensor, full shape
    for name, value in ref_weights.items():
        assert weights[name].shape == value.shape, name
        assert torch.allclose(weights[name], value, atol=atol, rtol=0), (name, (weights[name] - value).abs().max())
    assert logs["step"] == ref_logs["step"] == 8
    assert logs["losses"] == pytest.approx(ref_logs["losses"], rel=1e-5, abs=0)
    assert logs["grad_norms"] == pytest.approx(ref_logs["grad_norms"], rel=1e-5, abs=0)  # over every shard
    assert ref_logs["losses"][0] == pytest.approx(4.16, abs=0.05)  # ~ln(64): an untrained model, not a no-op run
    assert max(ref_logs["grad_norms"]) > 0.5  # max_grad_norm=0.5 clips: clipping is part of what is compared
    # predict() after training: every row once (not once per TP rank), the loss over the same items
    assert logs["predict_rows"] == ref_logs["predict_rows"] == 11
    assert logs["predict_loss"] == pytest.approx(ref_logs["predict_loss"], rel=1e-5, abs=0)
    assert logs["predict_logits_sum"] == pytest.approx(ref_logs["predict_logits_sum"], rel=1e-4, abs=1e-2)


@pytest.mark.slow
def test_tensor_parallel_two_processes_equal_one(one, tp2):
    """Both processes of the TP group read the same batches (one data-parallel rank), the items of a step are counted
    once (not twice), the norm is taken over both halves of each sharded gradient: the run equals one process's."""
    weights, logs = result(tp2)
    assert logs["tp_size"] == 2 and logs["data_parallel_size"] == 1
    assert_close_training((weights, logs), one)


@pytest.mark.slow
def test_tensor_parallel_checkpoint_resumes_bit_identically_and_on_one_process(llama, one, tp2, tmp_path):
    """checkpoint-4 of the TP run holds full model.safetensors and optimizer.pt (gathered): resumed on 2 processes it
    ends bit-identical to the unbroken TP run; resumed on 1 process it continues from the same weights."""
    from transformers import LlamaForCausalLM

    distributed = ["--distributed", '{"tp_size": 2}']
    run(2, llama, tmp_path / "tp", "--batch", "4", *distributed, "--save-steps", "4", "--stop", "4")
    ckpt = tmp_path / "tp" / "checkpoint-4"
    assert {"model.safetensors", "optimizer.pt", "config.json"} <= set(os.listdir(ckpt))
    whole = LlamaForCausalLM.from_pretrained(ckpt)  # transformers reads it as a plain model
    assert whole.model.layers[0].mlp.gate_proj.weight.shape == (128, 64)
    for target in ("tp_again", "one_again"):
        import shutil

        shutil.copytree(tmp_path / "tp", tmp_path / target)
    run(2, llama, tmp_path / "tp_again", "--batch", "4", *distributed, "--save-steps", "4", "--resume")
    (weights, logs), (ref_weights, ref_logs) = result(tmp_path / "tp_again"), result(tp2)
    assert all(torch.equal(weights[k], v) for k, v in ref_weights.items())
    assert logs["losses"] == ref_logs["losses"] and logs["grad_norms"] == ref_logs["grad_norms"]
    run(1, llama, tmp_path / "one_again", "--batch", "4", "--save-steps", "4", "--resume")
    weights, logs = result(tmp_path / "one_again")
    # steps 5..8 on one process from the TP run's state: the same losses as the TP run to float32 rounding
    assert logs["losses"] == pytest.approx(ref_logs["losses"], rel=1e-6, abs=0)
    assert_close_training((weights, logs), one)


def _plain_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))


@pytest.mark.parametrize("sizes, model, error, message", [
    (dict(tp_size=2), "llama", ValueError,
     r"tp_size=2 but the model's parameters are not sharded over a tensor-parallel mesh; load it with "
     r"from_pretrained\(\.\.\., tp_plan='auto'\)"),
    (dict(tp_size=2), "regression", ValueError, r"RegressionModel has no tensor-parallel plan \(no base_model_tp_plan\)"),
    (dict(dp_replicate_size=2, tp_size=2), "llama", ValueError,
     r"dp_replicate_size=2 x tp_size=2 without dp_shard_size: .*DDP x TP.*use dp_shard_size=2"),
    (dict(dp_replicate_size=3), "llama", ValueError,
     r"dp_replicate_size=3 x dp_shard_size=1 x tp_size=1 = 3 processes, but the run has 1"),
    (dict(cp_size=2), "llama", ValueError, r"cp_size=2 \(context parallelism\) is not supported.*need CUDA"),
    (dict(sp_size=2), "llama", ValueError, r"sp_size=2 \(sequence parallelism, sp_backend='deepspeed'\).*CUDA GPUs"),
], ids=["tp_without_tp_plan", "model_without_plan", "ddp_x_tp", "sizes_not_world", "cp", "sp"])
def test_bad_layouts_are_refused_before_training(sizes, model, error, message, tmp_path):
    from accelerate import ParallelismConfig
    from tiny import RegressionDataset, RegressionModel

    from cadence import Trainer, TrainingArguments

    args = TrainingArguments(str(tmp_path), parallelism_config=ParallelismConfig(**sizes), use_cpu=True,
                             report_to="none")
    net = _plain_llama() if model == "llama" else RegressionModel()
    with pytest.raises(error, match=message):
        Trainer(net, args, train_dataset=RegressionDataset())


def test_parallelism_config_is_written_and_read_back(tmp_path):
    """to_dict writes accelerate's to_json (as transformers does); TrainingArguments(**to_dict()) reads the sizes back:
    a one-process layout of all ones trains as plain one-process training."""
    from accelerate import ParallelismConfig
    from tiny import RegressionDataset, RegressionModel

    from cadence import Trainer, TrainingArguments

    args = TrainingArguments(str(tmp_path), parallelism_config=ParallelismConfig(tp_size=2), report_to="none")
    written = json.loads(args.to_json_string())["parallelism_config"]
    assert written["tp_size"] == 2 and written["dp_shard_size"] == 1
    again = TrainingArguments(str(tmp_path), parallelism_config={**written, "tp_size": 1}, use_cpu=True,
                              report_to="none", max_steps=2)
    trainer = Trainer(RegressionModel(), again, train_dataset=RegressionDataset())
    assert trainer.backend.layout.total_size == 1 and trainer.get_tp_size() == 1
    assert trainer.backend.data_parallel_size == 1 and trainer.backend.sharding is None
    trainer.train()


SHARDED = json.dumps({"state_dict_type": "SHARDED_STATE_DICT"})
# 4 processes: the global batch stays 8 (per-process batch x GA 2 x data-parallel ranks), as the one-process run's
FOUR = {
    # FSDP x TP: transformers shards the model at load over a (fsdp=2, tp=2) mesh; checkpoints are DCP shards
    "fsdp_x_tp": ["--batch", "2", "--distributed", '{"tp_size": 2, "fsdp_size": 2}', "--fsdp", "full_shard",
                  "--config", SHARDED],
    # HSDP: a whole model, fully_shard over parallelism_config's (dp_replicate=2, dp_shard=2) mesh
    "hsdp": ["--batch", "1", "--layout", '{"dp_replicate_size": 2, "dp_shard_size": 2}', "--fsdp", "full_shard auto_wrap",
             "--config", SHARDED],
}


@pytest.fixture(scope="module")
def four(llama, tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            run(4, llama, out, *FOUR[name], "--save-steps", "4")
            cache[name] = out
        return cache[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name, tp, mesh", [("fsdp_x_tp", 2, [2, 2]), ("hsdp", 1, [2, 2])])
def test_two_dimensional_layouts_on_four_processes_equal_one(name, tp, mesh, one, four):
    weights, logs = result(four(name))
    assert logs["tp_size"] == tp and logs["data_parallel_size"] == 4 // tp and logs["mesh"] == mesh
    # 4 processes sum the gradients in yet another order (reduce-scatter over the shards, then the TP halves); AdamW
    # divides by sqrt(v), so a weight with tiny gradients carries that rounding into its update: the worst weight
    # differed by 9.9e-6 on one CPU and 1.3e-5 on another. 5e-5 still fails on a real change (a lost clip or a
    # miscounted item moves weights by > 1e-3 here).
    assert_close_training((weights, logs), one, atol=5e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fsdp_x_tp", "hsdp"])
def test_two_dimensional_sharded_checkpoints_resume_bit_identically(name, llama, four, tmp_path):
    """Stopped at step 4 (its DCP shards: one file per process, read back through cadence's safe reader), resumed:
    the run ends bit-identical to the unbroken one."""
    run(4, llama, tmp_path, *FOUR[name], "--save-steps", "4", "--stop", "4")
    ckpt = tmp_path / "checkpoint-4"
    for folder in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert {".metadata", "__0_0.distcp", "__3_0.distcp"} <= set(os.listdir(ckpt / folder))
    run(4, llama, tmp_path, *FOUR[name], "--save-steps", "4", "--resume")
    (weights, logs), (ref_weights, ref_logs) = result(tmp_path), result(four(name))
    assert all(torch.equal(weights[k], v) for k, v in ref_weights.items())
    assert logs["losses"] == ref_logs["losses"] and logs["grad_norms"] == ref_logs["grad_norms"]


@pytest.mark.slow
def test_one_process_checkpoint_resumes_on_tensor_parallel(llama, one, tp2, tmp_path):
    """The reverse layout change: checkpoint-4 of one process (whole weights) resumed with TP=2, each process taking
    its shard of every tensor, continues as the TP run does."""
    run(1, llama, tmp_path, "--batch", "4", "--save-steps", "4", "--stop", "4")
    run(2, llama, tmp_path, "--batch", "4", "--distributed", '{"tp_size": 2}', "--save-steps", "4", "--resume")
    weights, logs = result(tmp_path)
    assert logs["tp_size"] == 2
    assert logs["losses"] == pytest.approx(result(tp2)[1]["losses"], rel=1e-6, abs=0)
    assert_close_training((weights, logs), one)
