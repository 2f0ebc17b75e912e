"""label_smoothing_factor: the loss equals a reference computation (with the causal shift) and transformers.Trainer."""

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny import LMDataset, TokenDataset, TokenTagger, args_with, lm_collate, pad_collate, tiny_gpt2

from cadence import Trainer

EPS = 0.1


make_args = args_with(use_cpu=True, label_smoothing_factor=EPS, train_sampling_strategy="sequential", max_steps=1,
                      logging_steps=1, per_device_train_batch_size=4)


def first_step_loss(trainer):
    trainer.train()
    return next(h["loss"] for h in trainer.state.log_history if "loss" in h)


def tagger_reference(model, ds):
    """torch's label-smoothed cross-entropy over every unmasked label of the 8 rows (no shift)."""
    batch = pad_collate([ds[i] for i in range(8)])
    with torch.no_grad():
        logits = model.logits(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, label_smoothing=EPS).item()


def test_causal_lm_loss_is_shifted_smoothed_cross_entropy(out_dir):
    model = tiny_gpt2(seed=2)
    ds = LMDataset(8)
    batch = lm_collate([ds[i] for i in range(4)])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    # reference: token t predicts label t+1; torch's own label smoothing; mean over unmasked labels
    reference = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100,
                                label_smoothing=EPS).item()
    unshifted = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100,
                                label_smoothing=EPS).item()
    plain = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100).item()
    assert abs(reference - unshifted) > 1e-3 and abs(reference - plain) > 1e-3  # the test can tell them apart
    trainer = Trainer(model, make_args(out_dir), train_dataset=ds, data_collator=lm_collate)
    assert first_step_loss(trainer) == pytest.approx(reference, rel=1e-6)


def test_unshifted_model_and_accumulation(out_dir):
    """A per-token tagger (no shift); GA=2 normalises over the items of both micro-batches."""
    model, ds = TokenTagger(seed=3), TokenDataset(8)
    reference = tagger_reference(model, ds)
    trainer = Trainer(model, make_args(out_dir, gradient_accumulation_steps=2), train_dataset=ds, data_collator=pad_collate)
    assert first_step_loss(trainer) == pytest.approx(reference, rel=1e-6)


def test_eval_loss_is_smoothed_too(out_dir):
    model, ds = TokenTagger(seed=3), TokenDataset(8)
    reference = tagger_reference(model, ds)
    metrics = Trainer(model, make_args(out_dir, per_device_eval_batch_size=3), data_collator=pad_collate).evaluate(ds)
    assert metrics["eval_loss"] == pytest.approx(reference, rel=1e-6)


def test_same_run_as_transformers(out_dir):
    transformers = pytest.importorskip("transformers")
    import cadence

    model = tiny_gpt2(seed=4)
    model.loss_type = "ForCausalLM"  # so transformers counts the shifted items right (see test_hf_parity)
    runs = {}
    for lib in (transformers, cadence):
        m = copy.deepcopy(model)
        args = lib.TrainingArguments(output_dir=f"{out_dir}/{lib.__name__}", label_smoothing_factor=EPS, max_steps=4,
                                     per_device_train_batch_size=4, gradient_accumulation_steps=2, logging_steps=1,
                                     learning_rate=3e-3, save_strategy="no", report_to="none", disable_tqdm=True,
                                     use_cpu=True, seed=11)
        trainer = lib.Trainer(model=m, args=args, train_dataset=LMDataset(32), data_collator=lm_collate)
        trainer.train()
        runs[lib.__name__] = [h["loss"] for h in trainer.state.log_history if "loss" in h], m.state_dict()
    (hf_losses, hf_w), (cd_losses, cd_w) = runs["transformers"], runs["cadence"]
    assert len(cd_losses) == 4
    assert cd_losses == pytest.approx(hf_losses, rel=1e-5)
    for name, value in hf_w.items():
        assert torch.allclose(cd_w[name], value, atol=1e-5, rtol=1e-4), name


def test_multi_label_classifier_disables_smoothing_as_transformers(out_dir):
    """transformers warns and trains without smoothing (a softmax cross-entropy cannot smooth the float
    targets of a multi-label model): same warning, same losses as transformers on the same seed."""
    import warnings

    import transformers
    from transformers import BertConfig, BertForSequenceClassification
    from tiny import make_args

    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(1, 30, (6,), generator=g),
             "labels": torch.randint(0, 2, (3,), generator=g).float()} for _ in range(16)]

    def run(lib):
        torch.manual_seed(0)
        config = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, num_labels=3, problem_type="multi_label_classification",
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        args = make_args(out_dir, lib, label_smoothing_factor=0.1, per_device_train_batch_size=4, max_steps=3,
                         logging_steps=1, learning_rate=0.1, seed=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = lib.Trainer(BertForSequenceClassification(config), args, train_dataset=rows)
        assert trainer.label_smoother is None
        assert any(issubclass(w.category, UserWarning) and "Label smoothing is not compatible with multi-label"
                   in str(w.message) for w in caught)
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    ours, theirs = run(__import__("cadence")), run(transformers)
    assert len(ours) == 3 and ours == pytest.approx(theirs, rel=1e-5)  # float32 across libraries
