"""torch_compile: compiled once in place (however batches are padded), same run, clean checkpoint keys.

Compilations are counted with ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (graphs dynamo built):
not ``counters["frames"]["ok"]``, which also counts frames dynamo looked at and left alone (filelock 3.x's
``_audit_fork_safety``, called while a graph is cached, is one).
The fast tests use the "eager"/"aot_eager" backends (dynamo's tracing and guards, no code generation);
inductor on a CPU is slow to compile, so that test is marked slow.
"""

import pytest
import torch
import torch._dynamo
from safetensors.torch import load_file
from tiny import TokenDataset, TokenTagger, args_with, pad_collate
from torch._dynamo.utils import counters

from cadence import Trainer, TrainingArguments


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


make_args = args_with(use_cpu=True, max_steps=8, per_device_train_batch_size=4, logging_steps=1, learning_rate=0.05)


def graphs():
    return counters["stats"]["unique_graphs"]


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_args_resolve_like_transformers():
    args = TrainingArguments(torch_compile_mode="max-autotune")
    assert args.torch_compile is True and args.torch_compile_backend == "inductor"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_one_compilation_for_varied_padding(out_dir, backend):
    ds = TokenDataset(40)  # rows of 3..12 tokens, padded to each batch's longest: 8 different batch shapes
    plain = Trainer(TokenTagger(seed=1), make_args(f"{out_dir}/plain"), train_dataset=ds, data_collator=pad_collate)
    plain.train()
    model = TokenTagger(seed=1)
    trainer = Trainer(model, make_args(out_dir, torch_compile_backend=backend), train_dataset=ds, data_collator=pad_collate)
    trainer.train()
    assert graphs() == 1  # one compilation for the whole run
    assert losses(trainer) == pytest.approx(losses(plain), rel=1e-6)
    # evaluation: model.eval() under no_grad is another graph, compiled once for every padding
    trainer.evaluate(TokenDataset(12, seed=3))
    after_first_eval = graphs()
    assert after_first_eval == 2
    trainer.evaluate(TokenDataset(20, seed=4))
    assert graphs() == after_first_eval


def test_padded_lengths_really_vary(out_dir):
    ds = TokenDataset(40)
    loader = Trainer(TokenTagger(), make_args(out_dir), train_dataset=ds, data_collator=pad_collate).get_train_dataloader()
    assert len({b["input_ids"].shape[1] for b in loader}) >= 4


def test_checkpoint_keys_are_clean(out_dir):
    model = TokenTagger(seed=1)
    trainer = Trainer(model, make_args(out_dir, torch_compile_backend="eager", max_steps=2, save_strategy="steps",
                                       save_steps=2), train_dataset=TokenDataset(16), data_collator=pad_collate)
    trainer.train()
    saved = load_file(f"{out_dir}/checkpoint-2/model.safetensors")
    assert sorted(saved) == sorted(TokenTagger().state_dict()) == ["emb.weight", "out.bias", "out.weight"]
    trainer.save_model(f"{out_dir}/final")
    assert sorted(load_file(f"{out_dir}/final/model.safetensors")) == sorted(saved)
    for name, value in model.state_dict().items():
        assert torch.equal(saved[name], value)


def test_a_model_compiled_by_the_user_saves_clean_keys(out_dir):
    compiled = torch.compile(TokenTagger(seed=1), backend="eager")
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    trainer = Trainer(compiled, make_args(out_dir, max_steps=2), train_dataset=TokenDataset(16), data_collator=pad_collate)
    trainer.train()
    trainer.save_model(f"{out_dir}/final")
    assert sorted(load_file(f"{out_dir}/final/model.safetensors")) == ["emb.weight", "out.bias", "out.weight"]


@pytest.mark.slow
def test_inductor_trains_like_eager(out_dir):
    ds = TokenDataset(24)
    plain = Trainer(TokenTagger(seed=1), make_args(f"{out_dir}/plain", max_steps=4), train_dataset=ds, data_collator=pad_collate)
    plain.train()
    trainer = Trainer(TokenTagger(seed=1), make_args(out_dir, torch_compile=True, max_steps=4), train_dataset=ds,
                      data_collator=pad_collate)
    trainer.train()
    assert graphs() == 1
    assert losses(trainer) == pytest.approx(losses(plain), rel=1e-4)
