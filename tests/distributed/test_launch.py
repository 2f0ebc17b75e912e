"""Launchers and ddp_* options: `torchrun --nnodes 2` (two "nodes" on this machine, one process each) and
`accelerate launch` with a user's accelerate config file run cadence unchanged; the ddp_* options reach DDP and
the process group."""

import json
import os
import socket
import subprocess
import sys

import pytest
from dist_exit import HERE, launch, worker_env

from test_fsdp import assert_same_training, result, run as run_worker
from repo_paths import WORKERS

ENV = worker_env()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    run_worker(1, out, "--batch", "8")
    return result(out)


@pytest.mark.slow
def test_torchrun_two_nodes_hybrid_shard_equals_one_process(one_process, tmp_path):
    """Two torchrun agents, as on two machines (--nnodes 2 --node_rank i): hybrid_shard replicates across the
    nodes and shards inside each; the result is one process's."""
    port = free_port()
    worker = [os.path.join(WORKERS, "fsdp_worker.py"), str(tmp_path), "--batch", "4", "--fsdp", "hybrid_shard auto_wrap"]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                               "--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port), *worker],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [node.communicate(timeout=600) for node in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    weights, logs = result(tmp_path)
    assert logs["fsdp_units"] == 3
    assert_same_training((weights, logs), one_process)


@pytest.mark.slow
def test_accelerate_launch_with_fsdp_config_file(one_process, tmp_path):
    """`accelerate launch --config_file` with distributed_type FSDP (its FSDP_* settings, no fsdp argument)."""
    config = tmp_path / "accelerate.yaml"
    config.write_text("\n".join([
        "compute_environment: LOCAL_MACHINE", "distributed_type: FSDP", "fsdp_config:", "  fsdp_version: 2",
        "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP", "  fsdp_transformer_layer_cls_to_wrap: GPT2Block",
        "  fsdp_reshard_after_forward: true", "  fsdp_state_dict_type: FULL_STATE_DICT", "machine_rank: 0",
        "mixed_precision: 'no'", "num_machines: 1", "num_processes: 2", "use_cpu: true", ""]))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
           os.path.join(WORKERS, "fsdp_worker.py"), str(tmp_path / "run"), "--batch", "4"]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights, logs = result(tmp_path / "run")
    assert logs["fsdp_units"] == 3  # sharded per the config file's GPT2Block
    assert_same_training((weights, logs), one_process)


@pytest.mark.slow
def test_ddp_options_reach_ddp_and_the_process_group(tmp_path):
    options = {"ddp_bucket_cap_mb": 3, "ddp_broadcast_buffers": False, "ddp_find_unused_parameters": True,
               "ddp_backend": "gloo", "ddp_timeout": 77}
    proc = launch("ddp_options_worker.py", tmp_path, json.dumps(options), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads(line[5:]) for line in proc.said if line.startswith("SEEN ")]
    assert sorted(s["rank"] for s in seen) == [0, 1]
    for s in seen:
        assert s["wrapper"] == "DistributedDataParallel" and s["backend"] == "gloo" and s["step"] == 2
        assert s["find_unused_parameters"] is True and s["broadcast_buffers"] is False
        assert s["bucket_bytes_cap"] == 3 * 1024 * 1024
    # ddp_timeout reaching the process group is shown by test_dead_rank.py (a silent peer fails after 20 s)


@pytest.mark.slow
def test_ddp_default_finds_unused_parameters_as_transformers(tmp_path):
    """ddp_find_unused_parameters unset: DDP searches for unused parameters as transformers' Trainer decides (any
    module but a transformers model that checkpoints activations), so a model with a parameter the loss never
    reaches trains on 2 processes (with the search off, DDP's second step raises "Expected to have finished
    reduction in the prior iteration")."""
    import transformers

    sys.path.insert(0, HERE)
    from ddp_options_worker import TaggerWithUnusedPooler

    hf_args = transformers.TrainingArguments(str(tmp_path / "hf"), use_cpu=True, report_to="none")
    hf_trainer = transformers.Trainer(TaggerWithUnusedPooler(), hf_args)
    (handler,) = hf_trainer._build_accelerator_args()["kwargs_handlers"]
    proc = launch("ddp_options_worker.py", tmp_path / "run", json.dumps({}), "unused", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads(line[5:]) for line in proc.said if line.startswith("SEEN ")]
    assert [s["step"] for s in seen] == [2, 2]
    assert {s["find_unused_parameters"] for s in seen} == {handler.find_unused_parameters} == {True}
