"""SpanMarker's Trainer (``span_marker.Trainer``, on transformers 4.x: it pins transformers <5) on a SpanMarkerModel
over a tiny local BERT; 16 sentences tagged with IOB entity labels.

SpanMarker's evaluation calls ``evaluate.load("seqeval")``, which reads ``./seqeval/seqeval.py`` from the working
directory before asking the Hub: the worker runs in ``metrics/``, where our own metric of that name (over the
``seqeval`` package) lies, so evaluating downloads nothing."""

from __future__ import annotations

import os

from tiny import saved_bert, sentence, tokenizer

METRICS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metrics")

CASES = {"span_marker": "span_marker.Trainer"}
# read by run.py's 2-process column: cadence's 2-process run is compared with transformers' 1-process run
TRANSFORMERS_TWO_PROCESSES = ("on 2 processes transformers 4.57 multiplies the loss by the process count for a model "
                              "whose forward takes **kwargs, and SpanMarkerModel averages its own loss: it logs and "
                              "steps on twice the loss")
LABELS = ["O", "B-animal", "I-animal", "B-colour", "I-colour"]


def version() -> str:
    import span_marker

    return span_marker.__version__


def rows(n: int, offset: int):
    from datasets import Dataset

    tokens, tags = [], []
    for i in range(offset, offset + n):
        words = sentence(i, 6).split()
        tokens.append(words)
        tags.append([1 if w in ("cat", "dog", "bird", "fish") else 3 if w in ("red", "blue") else 0 for w in words])
    return Dataset.from_dict({"tokens": tokens, "ner_tags": tags})


def build(case: str, out_dir: str, common: dict):
    import torch
    from span_marker import SpanMarkerModel, Trainer
    from transformers import TrainingArguments

    os.chdir(METRICS)  # evaluate.load("seqeval") -> metrics/seqeval/seqeval.py (the worker's paths are absolute)
    # no dropout: on 2 processes each draws its own masks, and the 2-process run is compared with one process's
    folder = saved_bert(tokenizer(), out_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = SpanMarkerModel.from_pretrained(folder, labels=LABELS, model_max_length=64, entity_max_length=4)
    args = TrainingArguments(**dict(common, learning_rate=1e-3))
    return Trainer(model=model, args=args, train_dataset=rows(16, 0), eval_dataset=rows(8, 40))
