"""The numbers behind README's "Deliberate differences": where cadence and transformers.Trainer disagree on
the same weights and data, by how much, and that cadence's number is the exact one (a hand computation)."""

import copy
import math

import pytest
import torch
from tiny import BlockDataset, LMDataset, lm_collate

transformers = pytest.importorskip("transformers")

import cadence  # noqa: E402


def gpt2(vocab=256, positions=64, seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def token_mean_nll(model, batches):
    """The exact mean over predicted tokens: sum of -log p(next token) / number of predicted tokens."""
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits[:, :-1]
            labels = batch["labels"][:, 1:]
            total += torch.nn.functional.cross_entropy(logits.flatten(0, 1).double(), labels.flatten(),
                                                       ignore_index=-100, reduction="sum").item()
            count += int((labels != -100).sum())
    return total / count


def evaluate(lib, model, dataset, batch_size, out, collator=None):
    args = lib.TrainingArguments(str(out), per_device_eval_batch_size=batch_size, report_to="none", use_cpu=True,
                                 disable_tqdm=True)
    return lib.Trainer(model=model, args=args, data_collator=collator).evaluate(dataset)["eval_loss"]


def test_causal_lm_blocks_of_64_transformers_counts_64_labels_where_63_are_predicted(tmp_path):
    model = gpt2()  # loss_type unset, as for any GPT-2 built from a config: transformers counts every label
    data = BlockDataset(24, vocab=256, seed=1)  # blocks of 64 tokens, labels = inputs (grouped texts)
    exact = token_mean_nll(model, [{"input_ids": data.ids[i : i + 8], "labels": data.ids[i : i + 8]} for i in range(0, 24, 8)])
    ours = evaluate(cadence, model, data, 8, tmp_path / "c")
    theirs = evaluate(transformers, model, data, 8, tmp_path / "h")
    assert ours == pytest.approx(exact, rel=1e-6)  # float32 model vs a float64 sum of its logits
    assert theirs == pytest.approx(exact * 63 / 64, rel=1e-6)
    print(f"\nblocks of 64, same weights: eval_loss cadence {ours:.4f} (perplexity {math.exp(ours):.2f}), "
          f"transformers {theirs:.4f} (perplexity {math.exp(theirs):.2f}); ratio {theirs / ours:.6f} = 63/64")

    # training: the first logged loss (before any update) is the same 63/64 of the token mean
    first = {}
    for lib in (cadence, transformers):
        args = lib.TrainingArguments(str(tmp_path / lib.__name__), per_device_train_batch_size=8, max_steps=1,
                                     logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                                     disable_tqdm=True, learning_rate=0.0)
        trainer = lib.Trainer(model=copy.deepcopy(model), args=args, train_dataset=BlockDataset(8, vocab=256, seed=1))
        trainer.train()
        first[lib.__name__] = trainer.state.log_history[0]["loss"]
    assert first["transformers"] == pytest.approx(first["cadence"] * 63 / 64, rel=1e-5)
    print(f"first train loss: cadence {first['cadence']:.4f}, transformers {first['transformers']:.4f}")


def test_eval_loss_is_the_item_mean_whatever_the_batch_size(tmp_path):
    model = gpt2(vocab=64, positions=32, seed=3)
    model.loss_type = "ForCausalLM"  # transformers counts the shifted labels: only the batch weighting differs
    data = LMDataset(21, seed=5)  # rows of 5..16 tokens, ~35% of labels masked, padded per batch
    exact = token_mean_nll(model, [lm_collate([data[i]]) for i in range(len(data))])
    ours = {b: evaluate(cadence, model, data, b, tmp_path / f"c{b}", lm_collate) for b in (1, 4, 8)}
    theirs = {b: evaluate(transformers, model, data, b, tmp_path / f"h{b}", lm_collate) for b in (1, 4, 8)}
    for b in ours:
        assert ours[b] == pytest.approx(exact, rel=1e-6), b
    # transformers averages batch means weighted by rows: a batch size of 1 weighs each row, not each token
    assert abs(theirs[1] - exact) > 1e-3
    assert max(theirs.values()) - min(theirs.values()) > 1e-3
    print(f"\nvariable-length rows, same weights: token mean {exact:.4f}; cadence {[round(v, 4) for v in ours.values()]}, "
          f"transformers {[round(v, 4) for v in theirs.values()]} at eval batch sizes 1, 4, 8")
