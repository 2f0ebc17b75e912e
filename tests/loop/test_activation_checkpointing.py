"""Activation checkpointing: same gradients, less activation memory, on a small GPT-2 and a plain module.

Memory is measured as the peak of the bytes held by live torch tensor storages produced during one
training step (``LiveTensorBytes`` of test_eval_memory: a ``TorchDispatchMode`` that tracks each op's
output storages until they are freed). This machine has no GPU, so this stands in for
``torch.cuda.max_memory_allocated`` (scripts/gpu_check.py measures that one on a GPU).
"""

import pytest
import torch
from test_eval_memory import LiveTensorBytes
from tiny import BlockDataset, FeatureDataset, args_with
from torch import nn

from cadence import Trainer, TrainerCallback


make_args = args_with(use_cpu=True, max_steps=1, per_device_train_batch_size=8, train_sampling_strategy="sequential",
                      optim="sgd", max_grad_norm=0.0)


class _Grads(TrainerCallback):
    """The gradients just before the optimizer step."""

    def __init__(self, model):
        self.model, self.grads = model, {}

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}


def small_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=64, n_embd=64, n_layer=4, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def one_step(model, out_dir, dataset, **kw):
    grads = _Grads(model)
    trainer = Trainer(model, make_args(out_dir, **kw), train_dataset=dataset, callbacks=[grads])
    with LiveTensorBytes() as memory:
        trainer.train()
    return grads.grads, memory.peak, trainer


def test_gpt2_same_gradients_less_memory(out_dir):
    pytest.importorskip("transformers")
    results = {}
    for on in (False, True):
        model = small_gpt2()
        calls = []
        model.transformer.h[0].mlp.register_forward_pre_hook(lambda *a: calls.append(1))
        grads, peak, _ = one_step(model, f"{out_dir}/{on}", BlockDataset(8), gradient_checkpointing=on,
                                  gradient_checkpointing_kwargs={"use_reentrant": False})
        results[on] = grads, peak, len(calls), model
    (g_off, peak_off, calls_off, _), (g_on, peak_on, calls_on, model_on) = results[False], results[True]
    assert model_on.is_activation_checkpointing and not results[False][3].is_activation_checkpointing
    assert (calls_off, calls_on) == (1, 2)  # the block's MLP ran again in backward
    assert g_on.keys() == g_off.keys() and len(g_on) > 10
    for name, g in g_off.items():
        torch.testing.assert_close(g_on[name], g, rtol=1e-5, atol=1e-7, msg=name)
    print(f"GPT-2 (4 layers, 64 wide, batch 8 x 64 tokens) peak live tensor bytes: {peak_off} without, "
          f"{peak_on} with checkpointing ({peak_on / peak_off:.2f}x)")
    assert peak_on < 0.7 * peak_off


class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(nn.Module):
    """A plain module that marks its blocks for checkpointing."""

    checkpoint_modules = ["Block"]

    def __init__(self, marks=None):
        super().__init__()
        torch.manual_seed(0)
        if marks is not None:
            self.checkpoint_modules = marks
        self.inp = nn.Linear(16, 64)
        self.blocks = nn.Sequential(*[Block() for _ in range(4)])
        self.head = nn.Linear(64, 1)

    def forward(self, x, labels=None):
        y = self.head(self.blocks(self.inp(x))).squeeze(-1)
        return {"loss": nn.functional.mse_loss(y, labels), "logits": y}


@pytest.mark.parametrize("marks", [["Block"], [Block], ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]])
def test_plain_module_blocks(out_dir, marks):
    g_off, peak_off, _ = one_step(Net(marks), f"{out_dir}/off", FeatureDataset(256, 16, seed=1), per_device_train_batch_size=256)
    model = Net(marks)
    keys = list(model.state_dict())
    g_on, peak_on, trainer = one_step(model, f"{out_dir}/on", FeatureDataset(256, 16, seed=1), per_device_train_batch_size=256,
                                      activation_checkpointing=True)
    assert [b.calls for b in model.blocks] == [2, 2, 2, 2]
    for name, g in g_off.items():
        torch.testing.assert_close(g_on[name], g, rtol=1e-6, atol=1e-8, msg=name)
    assert peak_on < 0.7 * peak_off
    assert list(model.state_dict()) == keys  # nothing renamed: checkpoints load into the plain model
    # evaluation (no_grad) runs each block once, with the same result
    plain = Net(marks)
    plain.load_state_dict(model.state_dict())
    rows = FeatureDataset(256, 16, seed=1)
    x, y = rows.x[:4], rows.y[:4]
    with torch.no_grad():
        before = [b.calls for b in model.blocks]
        out = model.eval()(x, y)["logits"]
        assert [b.calls for b in model.blocks] == [c + 1 for c in before]
        torch.testing.assert_close(out, plain.eval()(x, y)["logits"], rtol=0, atol=0)


def test_every_n_layers_and_enabling_twice(out_dir):
    model = Net()
    trainer = Trainer(model, make_args(out_dir, activation_checkpointing=True,
                                       activation_checkpointing_kwargs={"every_n_layers": 2}),
                      train_dataset=FeatureDataset(16, 16, seed=1))
    trainer.train()
    trainer.train()  # enabling again wraps nothing twice
    assert [b.calls for b in model.blocks] == [4, 2, 4, 2]  # 2 runs of 1 step; blocks 0 and 2 recompute


def test_unmarked_plain_module_is_a_clear_early_error(out_dir):
    with pytest.raises(ValueError, match=r"activation_checkpointing=True is invalid for Net.*checkpoint_modules = \['Block'\]"):
        Trainer(Net(marks=[]), make_args(out_dir, gradient_checkpointing=True), train_dataset=FeatureDataset(16, 16, seed=1))
    with pytest.raises(ValueError, match=r"checkpoint_modules=\['Nope'\] of Net matches no submodule"):
        Trainer(Net(marks=["Nope"]), make_args(out_dir, gradient_checkpointing=True), train_dataset=FeatureDataset(16, 16, seed=1))


class OldStyle(Net):
    """A model with only the older method (as sentence-transformers): it receives the kwargs."""

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.received = gradient_checkpointing_kwargs


def test_older_method_gets_the_kwargs(out_dir):
    model = OldStyle()
    Trainer(model, make_args(out_dir, gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True}),
            train_dataset=FeatureDataset(16, 16, seed=1)).train()
    assert model.received == {"use_reentrant": True}
    with pytest.raises(ValueError, match=r"activation_checkpointing_kwargs\['every_n_layers'\]=2 is invalid.*does not take"):
        Trainer(OldStyle(), make_args(out_dir, activation_checkpointing=True,
                                      activation_checkpointing_kwargs={"every_n_layers": 2}),
                train_dataset=FeatureDataset(16, 16, seed=1)).train()
