"""A summarization fine-tuning script in the style of Hugging Face's summarization example, written here.

It runs on either library: ``SEQ2SEQ_EXAMPLE_LIB=transformers`` (default ``cadence``) picks where ``Seq2SeqTrainer``,
``Seq2SeqTrainingArguments`` and the helpers come from, and nothing else changes. Documents and summaries are
read from JSON-lines files with ``datasets``, tokenized as bytes (no download), and a tiny BART built from a
config learns to summarize; evaluation generates (``--predict_with_generate``) and scores the generated text.

    python summarization_example.py --train_file train.jsonl --validation_file valid.jsonl --output_dir out \
        --do_train --do_eval --do_predict --predict_with_generate --generation_num_beams 2
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import BartConfig, BartForConditionalGeneration, HfArgumentParser

logger = logging.getLogger("summarization_example")

BOS, PAD, EOS = 0, 1, 2  # byte values that never occur in the text
SPECIAL = (BOS, PAD, EOS)


@dataclass
class ModelArguments:
    d_model: int = field(default=16, metadata={"help": "Hidden size of the BART trained from scratch."})
    layers: int = field(default=1, metadata={"help": "Encoder and decoder layers."})


@dataclass
class DataArguments:
    train_file: str | None = field(default=None, metadata={"help": "JSON lines with 'document' and 'summary'."})
    validation_file: str | None = field(default=None, metadata={"help": "JSON lines for evaluation and prediction."})
    max_source_length: int = field(default=64, metadata={"help": "Document bytes kept."})
    max_target_length: int = field(default=16, metadata={"help": "Summary bytes kept (before eos)."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where datasets keeps its cache."})


def tiny_bart(d_model: int = 16, layers: int = 1, vocab: int = 256) -> BartForConditionalGeneration:
    config = BartConfig(vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=2 * d_model,
                        decoder_ffn_dim=2 * d_model, max_position_embeddings=128, dropout=0.0, attention_dropout=0.0,
                        activation_dropout=0.0, bos_token_id=BOS, pad_token_id=PAD, eos_token_id=EOS,
                        decoder_start_token_id=EOS, forced_eos_token_id=EOS)
    model = BartForConditionalGeneration(config)
    # BART's forward takes **kwargs but averages its own loss: transformers would then count each of a step's
    # micro-batch means whole (GA times the gradient; README "Deliberate differences"). Saying so makes
    # transformers divide by the accumulation steps, which with these equal-length summaries is exact.
    model.accepts_loss_kwargs = False
    return model


def collate(features: list[dict]) -> dict[str, torch.Tensor]:
    """Pad documents with PAD (attention mask 0) and summaries with -100 (not counted in the loss)."""
    n = max(len(f["input_ids"]) for f in features)
    m = max(len(f["labels"]) for f in features)
    ids = torch.full((len(features), n), PAD)
    mask = torch.zeros((len(features), n), dtype=torch.long)
    labels = torch.full((len(features), m), -100)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, : len(f["input_ids"])] = 1
        labels[i, : len(f["labels"])] = torch.tensor(f["labels"])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def decode(ids) -> str:
    return bytes(int(t) for t in ids if 0 <= int(t) < 256 and int(t) not in SPECIAL).decode("utf-8", "replace")


def compute_metrics(prediction) -> dict[str, float]:
    """Exact match, unigram F1 (ROUGE-1-like) and the mean generated length, on decoded text."""
    preds, labels = prediction.predictions, prediction.label_ids
    preds = np.where(preds != -100, preds, PAD)
    labels = np.where(labels != -100, labels, PAD)
    exact, f1 = [], []
    for p, l in zip(preds, labels):
        guess, gold = decode(p), decode(l)
        exact.append(float(guess == gold))
        common = sum(min(guess.count(c), gold.count(c)) for c in set(gold))
        f1.append(0.0 if common == 0 else 2 * common / (len(guess) + len(gold)))
    gen_len = np.mean([np.count_nonzero(~np.isin(p, SPECIAL)) for p in preds])
    return {"exact_match": 100 * float(np.mean(exact)), "rouge1": 100 * float(np.mean(f1)), "gen_len": float(gen_len)}


def parse(lib, argv: list[str]):
    parser = HfArgumentParser((ModelArguments, DataArguments, lib.Seq2SeqTrainingArguments))
    return parser.parse_args_into_dataclasses(argv)


def main(argv: list[str] | None = None):
    lib = importlib.import_module(os.environ.get("SEQ2SEQ_EXAMPLE_LIB", "cadence"))
    model_args, data_args, training_args = parse(lib, sys.argv[1:] if argv is None else argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    logger.setLevel(training_args.get_process_log_level())

    last_checkpoint = None
    if training_args.do_train and os.path.isdir(training_args.output_dir) and training_args.resume_from_checkpoint is None:
        last_checkpoint = importlib.import_module(f"{lib.__name__}.trainer_utils").get_last_checkpoint(training_args.output_dir)
    lib.set_seed(training_args.seed)

    from datasets import load_dataset

    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    raw = load_dataset("json", data_files={k: v for k, v in files.items() if v}, cache_dir=data_args.cache_dir)

    def preprocess(batch):
        return {"input_ids": [list(d.encode())[: data_args.max_source_length] for d in batch["document"]],
                "labels": [list(s.encode())[: data_args.max_target_length] + [EOS] for s in batch["summary"]]}

    with training_args.main_process_first(desc="tokenizing"):
        tokenized = raw.map(preprocess, batched=True, remove_columns=["document", "summary"])

    torch.manual_seed(training_args.seed)
    model = tiny_bart(model_args.d_model, model_args.layers)
    trainer = lib.Seq2SeqTrainer(
        model=model, args=training_args, data_collator=collate,
        train_dataset=tokenized["train"] if training_args.do_train else None,
        eval_dataset=tokenized["validation"] if training_args.do_eval else None,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
    )

    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint or last_checkpoint)
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(tokenized["train"])
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    max_length = training_args.generation_max_length or data_args.max_target_length + 2
    num_beams = training_args.generation_num_beams
    if training_args.do_eval:
        metrics = trainer.evaluate(max_length=max_length, num_beams=num_beams, metric_key_prefix="eval")
        metrics["eval_samples"] = len(tokenized["validation"])
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    if training_args.do_predict:
        results = trainer.predict(tokenized["validation"], metric_key_prefix="predict", max_length=max_length,
                                  num_beams=num_beams)
        trainer.log_metrics("predict", results.metrics)
        trainer.save_metrics("predict", results.metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            preds = np.where(results.predictions != -100, results.predictions, PAD)
            with open(os.path.join(training_args.output_dir, "generated_predictions.txt"), "w") as f:
                f.write("\n".join(decode(p) for p in preds))
            np.save(os.path.join(training_args.output_dir, "predicted_ids.npy"), results.predictions)
    return trainer


if __name__ == "__main__":
    main()
