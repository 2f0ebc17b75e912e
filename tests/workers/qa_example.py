"""An extractive question-answering script in the style of Hugging Face's question-answering example, written here.

As there, a ``Trainer`` subclass overrides ``evaluate``/``predict`` around ``evaluation_loop``: the loop gathers
start/end logits with metrics switched off, then the subclass maps them to answer text (``post_process_function``)
and scores it. The subclass also overrides ``compute_loss`` and calls ``self.accelerator.gather`` and
``self.accelerator.unwrap_model`` there, as libraries built on transformers do. It runs on either library:
``QA_EXAMPLE_LIB=transformers`` (default ``cadence``) picks where the Trainer and helpers come from, nothing else
changes. Text is tokenized as bytes (no download); a tiny BERT built from a config learns to point at answers.

    python qa_example.py --train_file train.jsonl --validation_file valid.jsonl --output_dir out --do_train --do_eval
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import BertConfig, BertForQuestionAnswering, HfArgumentParser

logger = logging.getLogger("qa_example")

PAD, CLS, SEP = 0, 1, 2  # byte values that never occur in the text


@dataclass
class DataArguments:
    train_file: str | None = field(default=None, metadata={"help": "JSON lines: id, question, context, answer."})
    validation_file: str | None = field(default=None, metadata={"help": "JSON lines for evaluation and prediction."})
    max_answer_length: int = field(default=12, metadata={"help": "Longest answer, in bytes."})
    hidden_size: int = field(default=32, metadata={"help": "Hidden size of the BERT trained from scratch."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where datasets keeps its cache."})


def make_trainer_class(lib):
    """The subclass, on whichever library's ``Trainer`` (the script's only library-dependent class)."""
    utils = importlib.import_module(f"{lib.__name__}.trainer_utils")

    class QuestionAnsweringTrainer(lib.Trainer):
        def __init__(self, *args, eval_examples=None, post_process_function=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.eval_examples = eval_examples
            self.post_process_function = post_process_function
            self.answer_bytes_seen = 0  # over all processes (gathered in compute_loss)
            self.unwrapped_classes = set()

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            if model.training:  # a statistic over every process's batch: a collective each training micro-batch
                spans = self.accelerator.gather(inputs["end_positions"] - inputs["start_positions"] + 1)
                self.answer_bytes_seen += int(spans.sum())
            self.unwrapped_classes.add(type(self.accelerator.unwrap_model(model)).__name__)
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs[0]
            return (loss, outputs) if return_outputs else loss

        def qa_loop(self, dataloader, description, metric_key_prefix, ignore_keys):
            compute_metrics, self.compute_metrics = self.compute_metrics, None  # scored after post-processing
            start = time.time()
            try:
                output = self.evaluation_loop(dataloader, description=description,
                                              prediction_loss_only=True if compute_metrics is None else None,
                                              ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
            finally:
                self.compute_metrics = compute_metrics
            total_batch_size = self.args.eval_batch_size * self.args.world_size
            output.metrics.update(utils.speed_metrics(metric_key_prefix, start, num_samples=output.num_samples,
                                                num_steps=math.ceil(output.num_samples / total_batch_size)))
            return output

        def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys=None, metric_key_prefix="eval"):
            eval_dataset = self.eval_dataset if eval_dataset is None else eval_dataset
            eval_examples = self.eval_examples if eval_examples is None else eval_examples
            output = self.qa_loop(self.get_eval_dataloader(eval_dataset), "Evaluation", metric_key_prefix, ignore_keys)
            if self.post_process_function is not None and self.compute_metrics is not None:
                predictions = self.post_process_function(eval_examples, eval_dataset, output.predictions)
                metrics = {f"{metric_key_prefix}_{k}": v for k, v in self.compute_metrics(predictions).items()}
                metrics.update(output.metrics)
            else:
                metrics = output.metrics
            if self.args.should_log:
                self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

        def predict(self, predict_dataset, predict_examples, ignore_keys=None, metric_key_prefix="test"):
            output = self.qa_loop(self.get_test_dataloader(predict_dataset), "Prediction", metric_key_prefix, ignore_keys)
            predictions = self.post_process_function(predict_examples, predict_dataset, output.predictions)
            metrics = {f"{metric_key_prefix}_{k}": v for k, v in self.compute_metrics(predictions).items()}
            metrics.update(output.metrics)
            self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
            return utils.PredictionOutput(predictions=predictions.predictions, label_ids=predictions.label_ids,
                                        metrics=metrics)

    return QuestionAnsweringTrainer


def tiny_bert(hidden: int = 32) -> BertForQuestionAnswering:
    config = BertConfig(vocab_size=256, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=128, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, pad_token_id=PAD)
    return BertForQuestionAnswering(config)


MAX_LENGTH = 96  # every batch padded to it (the example's pad_to_max_length): the span softmax spans the padding too,
# so a batch-dependent length would make a row's loss depend on its batch-mates


def collate(features: list[dict]) -> dict[str, torch.Tensor]:
    n = MAX_LENGTH
    batch = {"input_ids": torch.full((len(features), n), PAD), "token_type_ids": torch.zeros((len(features), n), dtype=torch.long),
             "attention_mask": torch.zeros((len(features), n), dtype=torch.long)}
    for i, f in enumerate(features):
        k = len(f["input_ids"])
        batch["input_ids"][i, :k] = torch.tensor(f["input_ids"])
        batch["token_type_ids"][i, :k] = torch.tensor(f["token_type_ids"])
        batch["attention_mask"][i, :k] = 1
    for name in ("start_positions", "end_positions"):
        if name in features[0]:
            batch[name] = torch.tensor([f[name] for f in features])
    return batch


def features(batch):
    """[CLS] question [SEP] context [SEP], as bytes; the answer's first and last byte as positions."""
    out = {"input_ids": [], "token_type_ids": [], "start_positions": [], "end_positions": [], "offset": [], "example_id": []}
    for qid, question, context, answer in zip(batch["id"], batch["question"], batch["context"], batch["answer"]):
        q, c = list(question.encode()), list(context.encode())
        offset = len(q) + 2
        out["input_ids"].append([CLS, *q, SEP, *c, SEP])
        out["token_type_ids"].append([0] * offset + [1] * (len(c) + 1))
        start = context.index(answer)
        out["start_positions"].append(offset + start)
        out["end_positions"].append(offset + start + len(answer) - 1)
        out["offset"].append(offset)
        out["example_id"].append(qid)
    return out


def main(argv: list[str] | None = None):
    lib = importlib.import_module(os.environ.get("QA_EXAMPLE_LIB", "cadence"))
    parser = HfArgumentParser((DataArguments, lib.TrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    lib.set_seed(training_args.seed)

    from datasets import load_dataset

    raw = load_dataset("json", data_files={"train": data_args.train_file, "validation": data_args.validation_file},
                       cache_dir=data_args.cache_dir)
    with training_args.main_process_first(desc="tokenizing"):
        train_features = raw["train"].map(features, batched=True, remove_columns=raw["train"].column_names)
        eval_features = raw["validation"].map(features, batched=True, remove_columns=raw["validation"].column_names)

    def post_process(examples, feats, predictions, stage="eval"):
        """The best span inside the context (start <= end, at most max_answer_length bytes) of each feature."""
        start_logits, end_logits = predictions
        answers = []
        for i, (example, feature) in enumerate(zip(examples, feats)):
            offset, length = feature["offset"], len(example["context"].encode())
            s = start_logits[i, offset : offset + length]
            e = end_logits[i, offset : offset + length]
            scores = s[:, None] + e[None, :]
            allowed = np.triu(np.ones_like(scores, dtype=bool)) & ~np.triu(np.ones_like(scores, dtype=bool), data_args.max_answer_length)
            best = np.unravel_index(np.where(allowed, scores, -np.inf).argmax(), scores.shape)
            answers.append({"id": example["id"], "prediction_text": example["context"][best[0] : best[1] + 1]})
        references = [{"id": ex["id"], "answer": ex["answer"]} for ex in examples]
        return importlib.import_module(f"{lib.__name__}.trainer_utils").EvalPrediction(predictions=answers, label_ids=references)

    def compute_metrics(prediction):
        exact, f1 = [], []
        for guess, ref in zip(prediction.predictions, prediction.label_ids):
            g, t = guess["prediction_text"], ref["answer"]
            exact.append(float(g == t))
            common = sum(min(g.count(c), t.count(c)) for c in set(t))
            f1.append(0.0 if common == 0 else 2 * common / (len(g) + len(t)))
        return {"exact_match": 100 * float(np.mean(exact)), "f1": 100 * float(np.mean(f1))}

    torch.manual_seed(training_args.seed)
    trainer = make_trainer_class(lib)(
        model=tiny_bert(data_args.hidden_size), args=training_args, train_dataset=train_features,
        eval_dataset=eval_features, eval_examples=raw["validation"], post_process_function=post_process,
        data_collator=collate, compute_metrics=compute_metrics,
    )
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
    if training_args.do_eval:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    if training_args.do_predict:
        output = trainer.predict(eval_features, raw["validation"])
        trainer.save_metrics("predict", output.metrics)
        if trainer.is_world_process_zero():
            stats = {"answers": output.predictions, "answer_bytes_seen": trainer.answer_bytes_seen,
                     "unwrapped_classes": sorted(trainer.unwrapped_classes)}
            with open(os.path.join(training_args.output_dir, "qa_predictions.json"), "w") as f:
                json.dump(stats, f, indent=1)
    return trainer


if __name__ == "__main__":
    main()
