"""NEFTune: noise on the input embeddings in training forwards only, hook gone after train()."""

import math

import pytest
import torch
from tiny import LMDataset, RegressionDataset, RegressionModel, args_with, lm_collate, tiny_gpt2

from cadence import Trainer, TrainerCallback, TrainingArguments

ALPHA = 5.0


make_args = args_with(use_cpu=True, neftune_noise_alpha=ALPHA, max_steps=2, per_device_train_batch_size=4,
                      logging_steps=1)


class _Probe(TrainerCallback):
    """At the first step: hook count, and embedding outputs in train and eval mode."""

    def __init__(self, model, ids):
        self.model, self.ids, self.seen = model, ids, {}

    def on_step_begin(self, args, state, control, **kwargs):
        if self.seen:
            return
        emb = self.model.get_input_embeddings()
        self.seen["hooks"] = len(emb._forward_hooks)
        with torch.no_grad():
            self.model.train()
            self.seen["train"] = [emb(self.ids), emb(self.ids)]
            self.model.eval()
            self.seen["eval_logits"] = self.model(input_ids=self.ids).logits
            self.model.train()


def test_noise_only_while_training_and_hook_removed(out_dir):
    model = tiny_gpt2(seed=1)
    clean = tiny_gpt2(seed=1)  # the same weights with no hook: the reference for clean outputs
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    probe = _Probe(model, ids)
    emb = model.get_input_embeddings()
    assert len(emb._forward_hooks) == 0
    trainer = Trainer(model, make_args(out_dir, eval_strategy="steps", eval_steps=1), train_dataset=LMDataset(16),
                      eval_dataset=LMDataset(8, seed=5), data_collator=lm_collate, callbacks=[probe])
    trainer.train()
    assert probe.seen["hooks"] == 1
    assert len(emb._forward_hooks) == 0  # removed when train() returned
    # training forwards: uniform noise of scale alpha / sqrt(seq_len * hidden), different each call
    with torch.no_grad():
        plain = clean.get_input_embeddings()(ids)
    first, second = probe.seen["train"]
    bound = ALPHA / math.sqrt(10 * 32)
    noise = first - plain
    assert noise.abs().max() <= bound * (1 + 1e-6)
    assert noise.abs().max() > 0.9 * bound and noise.abs().mean() == pytest.approx(bound / 2, rel=0.1)
    assert not torch.equal(first, second)
    # eval forwards inside train() are clean
    with torch.no_grad():
        assert torch.equal(probe.seen["eval_logits"], clean.eval()(input_ids=ids).logits)
    # and after train(), evaluation equals that of a model with the same weights that never had the hook
    clean.load_state_dict(model.state_dict())
    ours = trainer.evaluate(LMDataset(8, seed=5))["eval_loss"]
    reference = Trainer(clean, make_args(out_dir, neftune_noise_alpha=None), data_collator=lm_collate).evaluate(LMDataset(8, seed=5))
    assert ours == reference["eval_loss"]


def test_hook_removed_when_training_fails(out_dir):
    model = tiny_gpt2(seed=1)

    class Boom(TrainerCallback):
        def on_step_end(self, *a, **k):
            raise RuntimeError("boom")

    trainer = Trainer(model, make_args(out_dir), train_dataset=LMDataset(16), data_collator=lm_collate, callbacks=[Boom()])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert len(model.get_input_embeddings()._forward_hooks) == 0


def test_noise_changes_training(out_dir):
    losses = {}
    for alpha in (None, ALPHA):
        trainer = Trainer(tiny_gpt2(seed=1), make_args(f"{out_dir}/{alpha}", neftune_noise_alpha=alpha),
                          train_dataset=LMDataset(16), data_collator=lm_collate)
        trainer.train()
        losses[alpha] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[None] != losses[ALPHA]


def test_model_without_input_embeddings_is_a_clear_error(out_dir):
    with pytest.raises(ValueError, match=r"neftune_noise_alpha needs .* RegressionModel has no get_input_embeddings"):
        Trainer(RegressionModel(), make_args(out_dir), train_dataset=RegressionDataset(8))


def test_negative_alpha_is_refused():
    with pytest.raises(ValueError, match=r"neftune_noise_alpha=-1.0 is invalid"):
        TrainingArguments(neftune_noise_alpha=-1.0)
