"""A causal-LM fine-tuning script in the style of Hugging Face's language-modeling example, written here.

It runs on either library: ``CLM_EXAMPLE_LIB=transformers`` (default ``cadence``) picks where ``Trainer``,
``TrainingArguments`` and the helpers come from, and nothing else changes. Arguments come from the command
line, or from one JSON or YAML file, through ``transformers.HfArgumentParser``. Text is read from local
files with ``datasets``, tokenized as bytes (vocabulary 256, no download) and cut into blocks.

    python clm_example.py --train_file train.txt --validation_file valid.txt --output_dir out --do_train --do_eval
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import sys
from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser

logger = logging.getLogger("clm_example")


@dataclass
class ModelArguments:
    n_embd: int = field(default=32, metadata={"help": "Hidden size of the GPT-2 trained from scratch."})
    n_layer: int = field(default=2, metadata={"help": "Transformer blocks."})
    n_head: int = field(default=2, metadata={"help": "Attention heads."})


@dataclass
class DataArguments:
    train_file: str | None = field(default=None, metadata={"help": "A text file, one example per line."})
    validation_file: str | None = field(default=None, metadata={"help": "A text file for evaluation."})
    block_size: int = field(default=64, metadata={"help": "Tokens per training block."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where datasets keeps its cache."})


def parse(lib, argv: list[str]):
    parser = HfArgumentParser((ModelArguments, DataArguments, lib.TrainingArguments))
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(os.path.abspath(argv[0]))
    if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
        return parser.parse_yaml_file(os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(argv)


def main(argv: list[str] | None = None):
    lib = importlib.import_module(os.environ.get("CLM_EXAMPLE_LIB", "cadence"))
    model_args, data_args, training_args = parse(lib, sys.argv[1:] if argv is None else argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    logger.setLevel(training_args.get_process_log_level())
    logger.info("process %d of %d, device %s, parallel mode %s", training_args.process_index,
                training_args.world_size, training_args.device, training_args.parallel_mode.value)

    last_checkpoint = None
    if training_args.do_train and os.path.isdir(training_args.output_dir) and training_args.resume_from_checkpoint is None:
        last_checkpoint = importlib.import_module(f"{lib.__name__}.trainer_utils").get_last_checkpoint(training_args.output_dir)
    lib.set_seed(training_args.seed)

    from datasets import load_dataset

    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    raw = load_dataset("text", data_files={k: v for k, v in files.items() if v}, cache_dir=data_args.cache_dir)

    def tokenize(batch):
        return {"input_ids": [list((line + "\n").encode("utf-8")) for line in batch["text"]]}

    block = data_args.block_size

    def group_texts(batch):
        ids = [t for row in batch["input_ids"] for t in row]
        ids = ids[: len(ids) // block * block]  # the tail that does not fill a block is dropped
        blocks = [ids[i : i + block] for i in range(0, len(ids), block)]
        return {"input_ids": blocks, "labels": [list(b) for b in blocks]}

    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized = raw.map(tokenize, batched=True, remove_columns=["text"])
    with training_args.main_process_first(desc="grouping texts together"):
        lm_datasets = tokenized.map(group_texts, batched=True)

    torch.manual_seed(training_args.seed)
    config = GPT2Config(vocab_size=256, n_positions=block, n_embd=model_args.n_embd, n_layer=model_args.n_layer,
                        n_head=model_args.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # so transformers counts the labels the loss predicts (see README)

    train_dataset = lm_datasets["train"] if training_args.do_train else None
    eval_dataset = lm_datasets["validation"] if training_args.do_eval else None
    trainer = lib.Trainer(model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                          data_collator=lib.default_data_collator)

    if training_args.do_train:
        resume = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=resume)
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        try:
            metrics["perplexity"] = math.exp(metrics["eval_loss"])
        except OverflowError:
            metrics["perplexity"] = float("inf")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    trainer.create_model_card(tasks="text-generation", dataset="local text files")
    return trainer


if __name__ == "__main__":
    main()
