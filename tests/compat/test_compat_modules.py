"""The public helpers at transformers' module paths (trainer_pt_utils, trainer_utils, trainer_jit_checkpoint,
trainer_optimizer, integrations, the top-level schedules) are cadence's own code and give what transformers'
give on the same input."""

from __future__ import annotations

import os
import shutil
import signal
import time

import numpy as np
import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
import transformers.trainer_pt_utils as hf_pt  # noqa: E402
import transformers.trainer_utils as hf_utils  # noqa: E402

import cadence  # noqa: E402
from cadence import trainer_pt_utils as pt  # noqa: E402
from cadence import trainer_utils as utils  # noqa: E402


def test_names_are_cadence_code():
    import re

    names = {
        pt: ["IterableDatasetShard", "ShardSampler", "DistributedLengthGroupedSampler", "DistributedSamplerWithLoop",
             "EvalLoopContainer", "numpy_pad_and_concatenate", "torch_pad_and_concatenate", "get_parameter_names",
             "LabelSmoother", "LengthGroupedSampler", "get_length_grouped_indices"],
        utils: ["sort_checkpoints", "rotate_checkpoints", "RemoveColumnsCollator", "check_target_module_exists",
                "TrainerMemoryTracker"],
    }
    from cadence import integrations, trainer_jit_checkpoint, trainer_optimizer

    names[trainer_jit_checkpoint] = ["CheckpointManager", "JITCheckpointCallback"]
    names[trainer_optimizer] = ["is_optimizer_factory"]
    names[integrations] = ["activate_neftune"]
    names[cadence] = [n for n in dir(transformers) if re.match(r"get_.*schedule", n)]
    assert len(names[cadence]) == 13
    for module, members in names.items():
        for name in members:
            assert getattr(module, name).__module__.startswith("cadence."), (module.__name__, name)


@pytest.mark.parametrize("n, batch, procs, drop_last", [(12, 2, 2, False), (13, 2, 2, False), (13, 2, 2, True),
                                                        (7, 3, 3, False), (2, 4, 2, False), (25, 4, 3, True)])
def test_iterable_dataset_shard_matches_transformers(n, batch, procs, drop_last):
    for rank in range(procs):
        ours = pt.IterableDatasetShard(range(n), batch_size=batch, drop_last=drop_last, num_processes=procs,
                                       process_index=rank)
        theirs = hf_pt.IterableDatasetShard(range(n), batch_size=batch, drop_last=drop_last, num_processes=procs,
                                            process_index=rank)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
        assert ours.num_examples == theirs.num_examples == n


class ShuffledStream(torch.utils.data.IterableDataset):
    """A stream that shuffles with its own generator attribute (the pattern IterableDatasetShard reseeds)."""

    def __init__(self):
        self.generator = torch.Generator()

    def __iter__(self):
        return iter(torch.randperm(10, generator=self.generator).tolist())


def test_iterable_dataset_shard_reseeds_the_dataset_generator_per_epoch():
    runs = []
    for cls in (pt.IterableDatasetShard, hf_pt.IterableDatasetShard):
        shard = cls(ShuffledStream(), batch_size=2, num_processes=2, process_index=1, seed=5)
        shard.set_epoch(3)
        runs.append(list(shard))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("n, batch, procs, drop_last", [(10, 2, 2, False), (10, 2, 2, True), (3, 4, 2, False),
                                                        (17, 3, 4, False)])
def test_shard_sampler_matches_transformers(n, batch, procs, drop_last):
    data = list(range(n))
    for rank in range(procs):
        ours = pt.ShardSampler(data, batch, drop_last, procs, rank)
        theirs = hf_pt.ShardSampler(data, batch, drop_last, procs, rank)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


@pytest.mark.parametrize("n, batch, replicas, shuffle", [(10, 4, 3, True), (11, 3, 2, False), (5, 4, 2, True)])
def test_distributed_sampler_with_loop_matches_transformers(n, batch, replicas, shuffle):
    data = list(range(n))
    for rank in range(replicas):
        ours = pt.DistributedSamplerWithLoop(data, batch, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=3)
        theirs = hf_pt.DistributedSamplerWithLoop(data, batch, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=3)
        ours.set_epoch(2), theirs.set_epoch(2)
        assert list(ours) == list(theirs)
        assert len(list(ours)) % batch == 0


@pytest.mark.parametrize("replicas, drop_last", [(2, False), (3, False), (3, True)])
def test_distributed_length_grouped_sampler_matches_transformers(replicas, drop_last):
    lengths = torch.randint(1, 50, (41,), generator=torch.Generator().manual_seed(0)).tolist()
    for rank in range(replicas):
        ours = pt.DistributedLengthGroupedSampler(4, lengths=lengths, num_replicas=replicas, rank=rank, seed=7,
                                                  drop_last=drop_last)
        theirs = hf_pt.DistributedLengthGroupedSampler(4, lengths=lengths, num_replicas=replicas, rank=rank, seed=7,
                                                       drop_last=drop_last)
        for epoch in (0, 1):
            ours.set_epoch(epoch), theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)
    with pytest.raises(ValueError, match="num_replicas and rank"):
        pt.DistributedLengthGroupedSampler(4, lengths=lengths)  # no process group to ask


def test_pad_and_concatenate_match_transformers():
    a, b = np.arange(6.0).reshape(2, 3), np.ones((1, 5))
    assert np.array_equal(pt.numpy_pad_and_concatenate(a, b, -7), hf_pt.numpy_pad_and_concatenate(a, b, -7))
    assert np.array_equal(pt.numpy_pad_and_concatenate(a, a), hf_pt.numpy_pad_and_concatenate(a, a))
    assert np.array_equal(pt.numpy_pad_and_concatenate(np.float32(2), np.float32(3)),
                          hf_pt.numpy_pad_and_concatenate(np.float32(2), np.float32(3)))
    x, y = torch.arange(8).reshape(2, 2, 2), torch.ones(3, 4, 2, dtype=torch.long)
    assert torch.equal(pt.torch_pad_and_concatenate(x, y), hf_pt.torch_pad_and_concatenate(x, y))
    assert torch.equal(pt.torch_pad_and_concatenate(y, x, 0), hf_pt.torch_pad_and_concatenate(y, x, 0))


@pytest.mark.parametrize("concat", [True, False])
def test_eval_loop_container_matches_transformers(concat):
    batches = [(torch.ones(2, 3), {"x": torch.zeros(2, 1)}), (torch.full((1, 5), 2.0), {"x": torch.ones(1, 2)}),
               (torch.zeros(3, 4), {"x": torch.ones(3, 2)})]
    ours, theirs = pt.EvalLoopContainer(concat, padding_index=-1), hf_pt.EvalLoopContainer(concat, padding_index=-1)
    for i, batch in enumerate(batches):
        ours.add(batch), theirs.add(batch)
        if i == 1:
            ours.to_cpu_and_numpy(), theirs.to_cpu_and_numpy()
    a, b = ours.get_arrays(), theirs.get_arrays()
    flat_a = [a[0], a[1]["x"]] if concat else [x for step in a for x in (step[0], step[1]["x"])]
    flat_b = [b[0], b[1]["x"]] if concat else [x for step in b for x in (step[0], step[1]["x"])]
    assert len(flat_a) == len(flat_b) and all(np.array_equal(x, y) for x, y in zip(flat_a, flat_b))


def test_get_parameter_names_matches_transformers():
    from tiny import tiny_gpt2

    model = tiny_gpt2()
    patterns = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    for types_, names in (([nn.LayerNorm], patterns), ([], None), ([nn.Linear], ["wte"])):
        assert pt.get_parameter_names(model, types_, names) == hf_pt.get_parameter_names(model, types_, names)


def make_checkpoints(folder, steps, mtimes=None):
    for i, step in enumerate(steps):
        path = folder / f"checkpoint-{step}"
        path.mkdir(parents=True)
        (path / "trainer_state.json").write_text("{}")
        if mtimes:
            os.utime(path, (mtimes[i], mtimes[i]))
    (folder / "checkpoint-notes.txt").write_text("not a folder")


@pytest.mark.parametrize("use_mtime", [False, True])
@pytest.mark.parametrize("best", [None, "checkpoint-2", "checkpoint-30"])
def test_sort_and_rotate_checkpoints_match_transformers(tmp_path, use_mtime, best):
    steps, now = [10, 2, 30, 7], time.time()
    mtimes = [now - 100, now - 50, now - 300, now - 10]  # time order differs from step order
    for name in ("ours", "theirs"):
        make_checkpoints(tmp_path / name, steps, mtimes)
    best_of = {name: None if best is None else str(tmp_path / name / best) for name in ("ours", "theirs")}
    ours = utils.sort_checkpoints(str(tmp_path / "ours"), use_mtime=use_mtime, best_model_checkpoint=best_of["ours"])
    theirs = hf_utils.sort_checkpoints(str(tmp_path / "theirs"), use_mtime=use_mtime, best_model_checkpoint=best_of["theirs"])
    assert [os.path.basename(p) for p in ours] == [os.path.basename(p) for p in theirs]
    for limit in (3, 1):
        utils.rotate_checkpoints(str(tmp_path / "ours"), limit, best_of["ours"], use_mtime)
        hf_utils.rotate_checkpoints(str(tmp_path / "theirs"), limit, best_of["theirs"], use_mtime)
        assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "theirs"))


@pytest.mark.parametrize("targets, key", [("attn.*", "attn.c_proj"), ("attn", "attn"), (["attn", "mlp"], "h.0.mlp.fc"),
                                          (["h\\.\\d\\.attn"], "h.1.attn"), (["q_proj"], "h.0.mlp"), ("mlp", "h.0.mlp")])
def test_check_target_module_exists_matches_transformers(targets, key):
    for flag in (False, True):
        assert utils.check_target_module_exists(targets, key, flag) == hf_utils.check_target_module_exists(targets, key, flag)


def test_remove_columns_collator_matches_transformers():
    import logging

    features = [{"input_x": torch.tensor(1.0), "labels": torch.tensor(2.0), "id": "a"},
                {"input_x": torch.tensor(3.0), "labels": torch.tensor(4.0), "id": "b"}]
    ours = utils.RemoveColumnsCollator(cadence.default_data_collator, ["input_x", "labels"], logging.getLogger("t"))
    theirs = hf_utils.RemoveColumnsCollator(transformers.default_data_collator, ["input_x", "labels"], logging.getLogger("t"))
    a, b = ours(features), theirs(features)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_is_optimizer_factory_matches_transformers():
    from cadence.trainer_optimizer import is_optimizer_factory
    from transformers.trainer_optimizer import is_optimizer_factory as hf_is_factory

    for candidate in (torch.optim.AdamW, torch.optim.SGD, cadence.Adafactor, lambda model: None, int, "adamw"):
        assert is_optimizer_factory(candidate) == hf_is_factory(candidate)


def test_activate_neftune_adds_the_noise_transformers_adds():
    from transformers.integrations import activate_neftune as hf_activate

    from cadence.integrations import activate_neftune, deactivate_neftune
    from tiny import tiny_gpt2

    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    outputs = []
    for activate in (activate_neftune, hf_activate):
        model = tiny_gpt2().train()
        handle = activate(model, 5.0)
        torch.manual_seed(11)
        outputs.append(model.get_input_embeddings()(ids))
        handle.remove()
    assert torch.equal(outputs[0], outputs[1])
    clean = tiny_gpt2().get_input_embeddings()(ids)
    assert not torch.equal(outputs[0], clean)
    model = tiny_gpt2().train()
    deactivate_neftune(model, activate_neftune(model, 5.0))
    assert torch.equal(model.get_input_embeddings()(ids), clean)


def test_checkpoint_manager_writes_a_resumable_checkpoint_on_sigterm(tmp_path):
    from cadence.trainer_jit_checkpoint import CheckpointManager
    from tiny import RegressionDataset, RegressionModel

    args = cadence.TrainingArguments(str(tmp_path), max_steps=3, save_strategy="no", report_to="none", use_cpu=True,
                                     disable_tqdm=True)
    trainer = cadence.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(32))
    trainer.train()
    manager = CheckpointManager(trainer, kill_wait=0)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        manager.setup_signal_handler()
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.time() + 10
        while not manager.is_checkpoint_requested and time.time() < deadline:
            time.sleep(0.01)
        assert manager.is_checkpoint_requested
        folder = manager.execute_jit_checkpoint()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not manager.is_checkpoint_requested
    assert cadence.get_last_checkpoint(str(tmp_path)) == str(folder) == os.path.join(str(tmp_path), "checkpoint-3")
    more = cadence.TrainingArguments(str(tmp_path), max_steps=5, save_strategy="no", report_to="none", use_cpu=True,
                                     disable_tqdm=True)
    resumed = cadence.Trainer(RegressionModel(), more, train_dataset=RegressionDataset(32))
    assert resumed.train(resume_from_checkpoint=True).global_step == 5
    shutil.rmtree(tmp_path)
