"""train_sampling_strategy="batch_rebalance" (issue 29): transformers 5.24's BatchRebalanceSampler batches, seeded and
resumable like cadence's other samplers. The reference is transformers' own sampler (same seed, same batches); the
two-process run is in ``test_batch_rebalance_ddp`` below (``rebalance_worker.py`` under torchrun)."""

import random

import dist_exit
import pytest
import torch
from dist_exit import assert_finished
from tiny import TokenDataset, TokenTagger, args_with, pad_collate
from transformers.trainer_pt_utils import BatchRebalanceSampler as HFBatchRebalanceSampler

from cadence import Trainer
from cadence.data import BatchRebalanceSampler
from cadence.trainer_pt_utils import BatchRebalanceSampler as ReExported

make_args = args_with(use_cpu=True, train_sampling_strategy="batch_rebalance", per_device_train_batch_size=4,
                      gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=0.1, optim="sgd",
                      lr_scheduler_type="constant", logging_steps=1, remove_unused_columns=False, seed=42)


class Indexed(TokenDataset):
    """TokenDataset rows with their index, so the batches a run trains on can be read back."""

    def __getitem__(self, i):
        return {**super().__getitem__(i), "idx": i}


class Recorder:
    """A collator that notes each batch's sample indices (in order) and pads the rest."""

    def __init__(self):
        self.batches = []

    def __call__(self, features):
        self.batches.append([f.pop("idx") for f in features])
        return pad_collate(features)


def _lengths(n, seed, mode):
    rng = random.Random(seed)
    if mode == "same":
        return [7] * n
    if mode == "skewed":
        return [int(rng.paretovariate(1.2) * 20) for _ in range(n)]
    return [rng.randint(1, 2048) for _ in range(n)]


@pytest.mark.parametrize("dp, ga, per_group, n, mode, drop_last", [
    (1, 1, 8, 50, "uniform", False), (1, 2, 4, 41, "skewed", True), (2, 2, 3, 61, "uniform", False),
    (4, 3, 2, 97, "skewed", False), (8, 1, 5, 200, "uniform", True), (2, 4, 1, 19, "same", False),
    (3, 2, 5, 7, "uniform", False),  # fewer samples than one step: the step is padded with the epoch's first ones
])
def test_same_batches_as_transformers(dp, ga, per_group, n, mode, drop_last):
    lengths = _lengths(n, n, mode)
    for rank in range(dp):
        for epoch in (0, 3):
            ours = BatchRebalanceSampler(lengths, dp * ga * per_group, dp, ga, seed=5, rank=rank, drop_last=drop_last)
            theirs = HFBatchRebalanceSampler(lengths, dp * ga * per_group, dp, ga, seed=5, rank=rank,
                                             drop_last=drop_last)
            ours.set_epoch(epoch), theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_balances_cost_over_processes():
    # 4 processes x 2 micro-batches of a 64-sample step: every process's micro-batch of one slot costs about the same,
    # while a length-blind split (4 rows each, drawn order) differs by far more
    lengths = _lengths(64, 3, "skewed")
    cost = lambda rows: len(rows) * max(lengths[i] for i in rows) * (1 + 0.001 * max(lengths[i] for i in rows))  # noqa: E731
    samplers = [BatchRebalanceSampler(lengths, 64, 4, 2, seed=1, rank=r) for r in range(4)]
    slots = list(zip(*[list(s) for s in samplers]))  # [slot][rank]
    assert sorted(i for slot in slots for rows in slot for i in rows) == list(range(64))  # each sample once
    order = torch.randperm(64, generator=torch.Generator().manual_seed(1)).tolist()
    blind = [order[i : i + 8] for i in range(0, 64, 8)]
    spread = lambda groups: max(map(cost, groups)) / min(map(cost, groups))  # noqa: E731
    assert max(spread(slot) for slot in slots) < 1.5 < spread(blind)


def test_skip_starts_after_the_trained_batches():
    lengths = _lengths(90, 1, "uniform")
    whole = BatchRebalanceSampler(lengths, 12, 2, 3, seed=9, rank=1)
    whole.set_epoch(2)
    for skip in (0, 1, 3, 7, len(whole)):
        part = BatchRebalanceSampler(lengths, 12, 2, 3, seed=9, rank=1)
        part.set_epoch(2, skip)
        assert list(part) == list(whole)[skip:] and len(part) == len(whole) - skip


def test_reexported_at_transformers_path():
    assert ReExported is BatchRebalanceSampler


def test_invalid_step_is_named():
    with pytest.raises(ValueError, match=r"effective_batch_size=3, dp_size=2, grad_accum=2\) is invalid"):
        BatchRebalanceSampler([1] * 10, 3, 2, 2)


def _train(out_dir, dataset, **overrides):
    recorder = Recorder()
    trainer = Trainer(TokenTagger(dtype=torch.float64), make_args(out_dir, **overrides), train_dataset=dataset,
                      data_collator=recorder)
    return trainer, recorder


def test_trainer_trains_on_transformers_batches(out_dir, tmp_path):
    import transformers

    dataset = Indexed(44)
    trainer, recorder = _train(out_dir, dataset)
    trainer.train()
    # transformers' Trainer, same arguments: its sampler's batches, epoch by epoch (seed 42 in both: transformers'
    # sampler always uses 42, cadence data_seed or seed, as its other samplers)
    hf_args = make_args(str(tmp_path / "hf"), transformers)
    hf = transformers.Trainer(TokenTagger(), hf_args, train_dataset=dataset, data_collator=Recorder())
    sampler = hf._get_train_sampler()
    assert isinstance(sampler, HFBatchRebalanceSampler)
    expected = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        expected += list(sampler)
    assert recorder.batches == expected
    # 44 samples, 8 a step: 5 steps and a last one of 4 samples per epoch, 2 micro-batches each, of varied sizes
    assert len(expected) == 2 * 6 * 2 and len({len(b) for b in expected}) > 1
    assert trainer.state.global_step == 12
    steps = [h["step"] for h in trainer.state.log_history if "loss" in h]
    assert steps == list(range(1, 13))


def test_data_seed_changes_the_batches(out_dir):
    a, rec_a = _train(out_dir + "a", Indexed(44), max_steps=2)
    b, rec_b = _train(out_dir + "b", Indexed(44), max_steps=2, data_seed=3)
    a.train(), b.train()
    assert rec_a.batches != rec_b.batches
    assert sorted(sum(rec_a.batches, [])) != list(range(44))  # a part of the epoch only


def test_resumed_equals_unbroken(tmp_path):
    dataset = Indexed(44)
    unbroken, rec_u = _train(tmp_path / "u", dataset)
    unbroken.train()
    broken, _ = _train(tmp_path / "b", dataset, save_strategy="steps", save_steps=7, max_steps=7)
    broken.train()  # stopped inside epoch 2 (6 steps per epoch): resumes 1 step = 2 batches into it
    resumed, rec_r = _train(tmp_path / "b", dataset, save_strategy="steps", save_steps=7)
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-7"))
    assert rec_r.batches == rec_u.batches[14:]  # the batches after step 7, none loaded twice
    for (name, a), b in zip(unbroken.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed.state.log_history[-2]["loss"] == unbroken.state.log_history[-2]["loss"]


@pytest.mark.slow
def test_two_processes_train_on_transformers_batches(tmp_path):
    """torchrun, 2 processes: each trains on transformers' sampler's batches for its rank (seed 42), every sample of
    a step once over both; resumed inside epoch 2 it ends bit-identical to its unbroken run."""
    out = tmp_path / "out.pt"
    proc = dist_exit.launch("rebalance_worker.py", str(out), nproc=2, timeout=300)
    assert_finished(proc, 2)
    result = torch.load(out, weights_only=True)
    dataset = Indexed(44)
    lengths = [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
    for rank in range(2):
        expected = []
        sampler = HFBatchRebalanceSampler(lengths, 2 * 2 * 3, 2, 2, rank=rank, seed=42, drop_last=False)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            expected += list(sampler)
        assert result["batches"][rank] == expected
        assert result["resumed_batches"][rank] == expected[len(expected) - len(result["resumed_batches"][rank]):]
        assert len(result["resumed_batches"][rank]) == 2 * 2 * 4 - 2 * 5  # 2 epochs x 4 steps x 2, minus 5 steps
    for step in range(8):  # each optimizer step: both processes' 2 micro-batches hold the step's samples once
        rows = sum((result["batches"][r][2 * step + m] for r in range(2) for m in range(2)), [])
        assert len(rows) == len(set(rows)) == (8 if step % 4 == 3 else 12)  # 44 = 3 x 12 + 8 per epoch
    for name, value in result["unbroken"].items():
        assert torch.equal(result["resumed"][name], value), name


@pytest.mark.parametrize("strategy", ["batch_rebalance", "group_by_length"])
def test_stream_warns_that_the_strategy_is_ignored(out_dir, strategy, caplog):
    from tiny import Stream

    trainer = Trainer(TokenTagger(dtype=torch.float64), make_args(out_dir, train_sampling_strategy=strategy,
                                                                  max_steps=2, remove_unused_columns=True),
                      train_dataset=Stream(TokenDataset(16)), data_collator=pad_collate)
    with caplog.at_level("WARNING", logger="cadence.trainer"):
        trainer.train()
    assert f"train_sampling_strategy='{strategy}' is ignored: the train_dataset has no length" in caplog.text
    assert trainer.state.global_step == 2
