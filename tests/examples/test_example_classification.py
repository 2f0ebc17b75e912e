"""Sequence- and token-classification scripts in the style of Hugging Face's run_glue and run_ner, written
here, run once on transformers and once on cadence with only the import changed (``lib.Trainer``,
``lib.TrainingArguments``), then compared: logged train losses, eval loss, final weights, predictions and
the files written.

Everything is local: the word-level tokenizer of tests/tiny.py (words "w0".."w29", [PAD] = 0), generated
sentences in a ``datasets.Dataset`` tokenized with ``.map``, a 2-layer BERT built from a config, and
transformers' own collators (``DataCollatorWithPadding``, ``DataCollatorForTokenClassification``), which
return a ``BatchEncoding`` rather than a dict.
"""

from __future__ import annotations

import contextlib
import importlib
import io

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
from safetensors.torch import load_file  # noqa: E402

from test_example_script import SPEED, read  # noqa: E402
from tiny import args_with, word_tokenizer  # noqa: E402

# Two libraries, the same float32 model and batches: the same sums, at most in another order (fused AdamW,
# loss reductions), so values agree to a few float32 ulps amplified over 12 optimizer steps. 1e-5 relative
# (and 1e-6 absolute for weights near zero) is far below any real difference: one row counted twice in a
# batch of 8 moves its loss by ~10%, one optimizer step more or less moves the weights by ~lr = 1e-3.
REL = 1e-5
ATOL = 1e-6
N_TRAIN, N_EVAL = 48, 20


def sentences(n: int, seed: int):
    """n sentences of 3..10 words over "w0".."w29"; the sentence label is whether most words are "high"
    (index >= 15), the tag of each word its index modulo 3."""
    g = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        words = g.integers(0, 30, size=int(g.integers(3, 11))).tolist()
        rows.append({"text": " ".join(f"w{w}" for w in words), "label": int(sum(w >= 15 for w in words) * 2 > len(words)),
                     "tags": [w % 3 for w in words]})
    return datasets.Dataset.from_list(rows)


make_args = args_with(do_train=True, do_eval=True, per_device_train_batch_size=4, per_device_eval_batch_size=8,
                      gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=1e-3, warmup_steps=2,
                      logging_steps=2, eval_strategy="steps", eval_steps=4, use_cpu=True, seed=7)


def tiny_bert(task: str, num_labels: int):
    from transformers import BertConfig, BertForSequenceClassification, BertForTokenClassification

    config = BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, num_labels=num_labels, pad_token_id=0)
    cls = BertForSequenceClassification if task == "seq" else BertForTokenClassification
    return cls(config)


def accuracy(eval_pred):
    logits, labels = eval_pred
    preds = np.argmax(logits, axis=-1)
    keep = labels != -100
    return {"accuracy": float((preds[keep] == labels[keep]).mean())}


def run_glue(lib_name: str, out, **extra):
    """run_glue, reduced: tokenize with .map, pad per batch with DataCollatorWithPadding."""
    from transformers import DataCollatorWithPadding

    lib = importlib.import_module(lib_name)
    training_args = make_args(out, lib, **extra)
    lib.set_seed(training_args.seed)
    tokenizer = word_tokenizer()
    raw = {"train": sentences(N_TRAIN, 0), "validation": sentences(N_EVAL, 1)}

    def preprocess(batch):
        return tokenizer(batch["text"], truncation=True, max_length=32)

    with training_args.main_process_first(desc="dataset map pre-processing"):
        tokenized = {k: v.map(preprocess, batched=True, remove_columns=["text", "tags"]) for k, v in raw.items()}
    torch.manual_seed(training_args.seed)
    model = tiny_bert("seq", 2)
    trainer = lib.Trainer(model=model, args=training_args, train_dataset=tokenized["train"],
                          eval_dataset=tokenized["validation"], processing_class=tokenizer,
                          data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
    return finish(trainer, tokenized)


def run_ner(lib_name: str, out, **extra):
    """run_ner, reduced: words pre-split, labels aligned to word_ids (-100 off words), padded with
    DataCollatorForTokenClassification."""
    from transformers import DataCollatorForTokenClassification

    lib = importlib.import_module(lib_name)
    training_args = make_args(out, lib, **extra)
    lib.set_seed(training_args.seed)
    tokenizer = word_tokenizer()
    raw = {"train": sentences(N_TRAIN, 2), "validation": sentences(N_EVAL, 3)}

    def tokenize_and_align_labels(batch):
        enc = tokenizer([t.split() for t in batch["text"]], truncation=True, max_length=32, is_split_into_words=True)
        enc["labels"] = [[-100 if w is None else tags[w] for w in enc.word_ids(i)] for i, tags in enumerate(batch["tags"])]
        return enc

    with training_args.main_process_first(desc="dataset map pre-processing"):
        tokenized = {k: v.map(tokenize_and_align_labels, batched=True, remove_columns=["text", "tags", "label"])
                     for k, v in raw.items()}
    torch.manual_seed(training_args.seed)
    model = tiny_bert("tok", 3)
    trainer = lib.Trainer(model=model, args=training_args, train_dataset=tokenized["train"],
                          eval_dataset=tokenized["validation"], processing_class=tokenizer,
                          data_collator=DataCollatorForTokenClassification(tokenizer), compute_metrics=accuracy)
    return finish(trainer, tokenized)


def finish(trainer, tokenized):
    """The tail both example scripts share: train, save, metrics, evaluate, predict."""
    train_result = trainer.train()
    trainer.save_model()
    metrics = train_result.metrics
    metrics["train_samples"] = len(tokenized["train"])
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    metrics = trainer.evaluate()
    metrics["eval_samples"] = len(tokenized["validation"])
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    prediction = trainer.predict(tokenized["validation"], metric_key_prefix="predict")
    trainer.log_metrics("predict", prediction.metrics)
    trainer.save_metrics("predict", prediction.metrics)
    return trainer, prediction


def run_both(script, root):
    """The script on both libraries, without accumulation: with GA > 1 transformers multiplies these heads' loss
    (test_accumulation_matches_one_big_batch), so the libraries are compared where both are exact."""
    result = {}
    for lib in ("transformers", "cadence"):
        out = root / lib / "out"
        with contextlib.redirect_stdout(io.StringIO()):
            trainer, prediction = script(lib, out, gradient_accumulation_steps=1, per_device_train_batch_size=8)
        result[lib] = out, trainer, prediction
    return result


def max_rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def compare_common(runs):
    """What both tasks share: the files, the logged train losses, the weights, the predictions."""
    (cd, cd_trainer, cd_pred), (hf, hf_trainer, hf_pred) = runs["cadence"], runs["transformers"]
    expected = {"all_results.json", "train_results.json", "eval_results.json", "predict_results.json",
                "trainer_state.json", "model.safetensors", "config.json", "training_args.bin", "tokenizer.json"}
    for out in (cd, hf):
        assert expected <= {p.name for p in out.iterdir()}, out
    for name in ("train_results.json", "eval_results.json", "predict_results.json", "all_results.json"):
        # with progress bars off transformers' printer callback deletes total_flos from the train metrics it
        # is handed; cadence keeps it (README, "Deliberate differences")
        assert set(read(cd, name)) - {"total_flos"} == set(read(hf, name)) - {"total_flos"}, name
    assert "total_flos" in read(cd, "train_results.json") and "total_flos" not in read(hf, "train_results.json")
    ours, theirs = read(cd, "trainer_state.json"), read(hf, "trainer_state.json")
    assert set(ours) == set(theirs)
    for key in ("global_step", "max_steps", "num_train_epochs", "logging_steps", "eval_steps", "train_batch_size", "epoch"):
        assert ours[key] == theirs[key], key
    assert ours["global_step"] == 12  # 48 rows / (4 x GA 2) x 2 epochs
    assert [sorted(h) for h in ours["log_history"]] == [sorted(h) for h in theirs["log_history"]]
    losses = [h["loss"] for h in ours["log_history"] if "loss" in h]
    hf_losses = [h["loss"] for h in theirs["log_history"] if "loss" in h]
    assert len(losses) == 6 and losses == pytest.approx(hf_losses, rel=REL)
    train_loss = read(cd, "train_results.json")["train_loss"]
    assert train_loss == pytest.approx(read(hf, "train_results.json")["train_loss"], rel=REL)
    accs = [h["eval_accuracy"] for h in ours["log_history"] if "eval_accuracy" in h]
    assert accs == [h["eval_accuracy"] for h in theirs["log_history"] if "eval_accuracy" in h]
    a, b = load_file(cd / "model.safetensors"), load_file(hf / "model.safetensors")
    assert set(a) == set(b)
    weight_diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=REL, atol=ATOL), k
    assert np.array_equal(cd_pred.predictions.argmax(-1), hf_pred.predictions.argmax(-1))
    assert np.array_equal(cd_pred.label_ids, hf_pred.label_ids)
    logits_diff = float(np.abs(cd_pred.predictions - hf_pred.predictions).max())
    assert np.allclose(cd_pred.predictions, hf_pred.predictions, rtol=REL, atol=1e-5)
    assert read(cd, "predict_results.json")["predict_accuracy"] == read(hf, "predict_results.json")["predict_accuracy"]
    print(f"\n  max rel diff logged train losses {max_rel(losses, hf_losses):.2e}; max abs diff weights "
          f"{weight_diff:.2e}, logits {logits_diff:.2e}; first/last loss {losses[0]:.4f}/{losses[-1]:.4f}")
    return ours, theirs


def test_run_glue_sequence_classification(tmp_path):
    runs = run_both(run_glue, tmp_path)
    ours, theirs = compare_common(runs)
    cd, hf = runs["cadence"][0], runs["transformers"][0]
    # one label a row: transformers' row-weighted batch means and cadence's item-weighted mean are one number
    evals = [h["eval_loss"] for h in ours["log_history"] if "eval_loss" in h]
    hf_evals = [h["eval_loss"] for h in theirs["log_history"] if "eval_loss" in h]
    assert len(evals) == 3 and evals == pytest.approx(hf_evals, rel=REL)
    for name in ("eval_results.json", "predict_results.json"):
        mine, hers = read(cd, name), read(hf, name)
        for key, value in hers.items():
            if not key.endswith(SPEED):
                assert mine[key] == pytest.approx(value, rel=REL), (name, key)
    _, _, prediction = runs["cadence"]
    assert prediction.predictions.shape == (N_EVAL, 2)
    logits = torch.from_numpy(prediction.predictions)
    by_hand = float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(prediction.label_ids)))
    assert read(cd, "eval_results.json")["eval_loss"] == pytest.approx(by_hand, rel=REL)
    print(f"  eval_loss cadence {evals[-1]:.6f} transformers {hf_evals[-1]:.6f} by hand {by_hand:.6f}")


def test_run_ner_token_classification(tmp_path):
    runs = run_both(run_ner, tmp_path)
    ours, theirs = compare_common(runs)
    cd, hf = runs["cadence"][0], runs["transformers"][0]
    # eval loss: cadence weights by labelled tokens, transformers by rows (README, "Deliberate differences");
    # cadence's must be the token mean over the whole eval set, computed here from the predicted logits
    _, _, prediction = runs["cadence"]
    logits = torch.from_numpy(prediction.predictions).flatten(0, 1)
    labels = torch.from_numpy(prediction.label_ids).flatten()
    by_hand = float(torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100))
    eval_loss, hf_eval_loss = read(cd, "eval_results.json")["eval_loss"], read(hf, "eval_results.json")["eval_loss"]
    assert eval_loss == pytest.approx(by_hand, rel=REL)
    assert read(cd, "predict_results.json")["predict_loss"] == pytest.approx(by_hand, rel=REL)
    # transformers' number is the row-weighted mean of the per-batch token means (batches of 8, 8, 4 rows)
    per_batch = []
    for start in range(0, N_EVAL, 8):
        rows = slice(start, min(start + 8, N_EVAL))
        batch_logits = torch.from_numpy(prediction.predictions[rows]).flatten(0, 1)
        batch_labels = torch.from_numpy(prediction.label_ids[rows]).flatten()
        loss = torch.nn.functional.cross_entropy(batch_logits, batch_labels, ignore_index=-100)
        per_batch.append((float(loss), rows.stop - rows.start))
    row_weighted = sum(l * n for l, n in per_batch) / N_EVAL
    assert hf_eval_loss == pytest.approx(row_weighted, rel=1e-4)
    assert read(cd, "eval_results.json")["eval_accuracy"] == read(hf, "eval_results.json")["eval_accuracy"]
    print(f"  eval_loss cadence {eval_loss:.6f} (token mean by hand {by_hand:.6f}); "
          f"transformers {hf_eval_loss:.6f} (row-weighted batch means by hand {row_weighted:.6f})")


@pytest.mark.parametrize("script", [run_glue, run_ner], ids=["glue", "ner"])
def test_accumulation_matches_one_big_batch(script, tmp_path):
    """README's 'Exact accumulation': GA 2 x batch 4 trains like GA 1 x batch 8 (same optimizer steps, same
    samples in each), so the logged train losses agree. These BERT heads take **kwargs but average their own
    loss (they ignore num_items_in_batch): transformers' rule (any **kwargs) counts each micro-batch mean
    whole and logs GA times the loss; cadence reads forward's code and weights each mean by its items."""
    logged = {}
    for ga, batch in ((2, 4), (1, 8)):
        with contextlib.redirect_stdout(io.StringIO()):
            trainer, _ = script("cadence", tmp_path / f"ga{ga}", gradient_accumulation_steps=ga,
                                per_device_train_batch_size=batch)
        logged[ga] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print(f"\n  {script.__name__}: first logged loss GA 2 x 4 {logged[2][0]:.4f}, GA 1 x 8 {logged[1][0]:.4f} "
          f"(ratio {logged[2][0] / logged[1][0]:.4f})")
    assert logged[2] == pytest.approx(logged[1], rel=1e-4)
