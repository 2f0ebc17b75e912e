"""sentence-transformers' trainers (SentenceTransformer, CrossEncoder, SparseEncoder, MultiVectorEncoder) on a tiny
BERT saved to a folder with a word-level tokenizer built here."""

from __future__ import annotations

from tiny import WORDS, saved_bert, tokenizer

CASES = {"sentence_transformer": "SentenceTransformerTrainer", "cross_encoder": "CrossEncoderTrainer",
         "sparse_encoder": "SparseEncoderTrainer", "multi_vector_encoder": "MultiVectorEncoderTrainer"}
LR = 1e-3
NOTES = {"cross_encoder": "ddp_find_unused_parameters=False, as a user must set it on either base: with "
                          "transformers' default for a model that is not a transformers model (True), its 2-process run "
                          "fails on transformers and on cadence alike (DDP: the classifier's bias 'marked as ready "
                          "twice')"}


def version() -> str:
    import sentence_transformers

    return sentence_transformers.__version__


def trainers() -> list[str]:
    """The ``*Trainer`` classes the installed sentence-transformers exports, per model kind."""
    names = set()
    for module in ("", ".cross_encoder", ".sparse_encoder", ".multi_vector_encoder"):
        try:
            pkg = __import__(f"sentence_transformers{module}", fromlist=["_"])
        except ImportError:
            continue
        names |= {n for n in dir(pkg) if n.endswith("Trainer") and isinstance(getattr(pkg, n), type)}
    return sorted(names)


def texts(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(6)) for _ in range(n)]


def build(case: str, out_dir: str, common: dict):
    from datasets import Dataset

    tok = tokenizer()
    args = dict(common, learning_rate=LR)
    pairs = Dataset.from_dict({"anchor": texts(16, 1), "positive": texts(16, 2)})
    eval_pairs = Dataset.from_dict({"anchor": texts(8, 3), "positive": texts(8, 4)})
    if case == "sentence_transformer":
        from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                           SentenceTransformerTrainingArguments)
        from sentence_transformers.losses import MultipleNegativesRankingLoss
        from sentence_transformers.models import Pooling, Transformer

        model = SentenceTransformer(modules=[Transformer(saved_bert(tok, out_dir)), Pooling(32)])
        return SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(**args),
                                          train_dataset=pairs, eval_dataset=eval_pairs,
                                          loss=MultipleNegativesRankingLoss(model))
    if case == "cross_encoder":
        from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
        from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

        model = CrossEncoder(saved_bert(tok, out_dir, "BertForSequenceClassification", num_labels=1), num_labels=1)
        args["ddp_find_unused_parameters"] = False  # see NOTES; nothing to find on one process
        labelled = lambda n, s: Dataset.from_dict({"sentence1": texts(n, s), "sentence2": texts(n, s + 1),  # noqa: E731
                                                   "label": [float(i % 2) for i in range(n)]})
        return CrossEncoderTrainer(model=model, args=CrossEncoderTrainingArguments(**args),
                                   train_dataset=labelled(16, 1), eval_dataset=labelled(8, 3),
                                   loss=BinaryCrossEntropyLoss(model))
    if case == "sparse_encoder":
        from sentence_transformers.sparse_encoder import (SparseEncoder, SparseEncoderTrainer,
                                                          SparseEncoderTrainingArguments)
        from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
        from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

        model = SparseEncoder(modules=[MLMTransformer(saved_bert(tok, out_dir, "BertForMaskedLM")),
                                       SpladePooling("max")])
        loss = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model), query_regularizer_weight=5e-5,
                          document_regularizer_weight=3e-5)
        return SparseEncoderTrainer(model=model, args=SparseEncoderTrainingArguments(**args), train_dataset=pairs,
                                    eval_dataset=eval_pairs, loss=loss)
    if case == "multi_vector_encoder":
        import torch
        from sentence_transformers.multi_vector_encoder import (MultiVectorEncoder, MultiVectorEncoderTrainer,
                                                                MultiVectorEncoderTrainingArguments)
        from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss

        folder = saved_bert(tok, out_dir)
        torch.manual_seed(1)  # the projection MultiVectorEncoder adds
        model = MultiVectorEncoder(folder)
        return MultiVectorEncoderTrainer(model=model, args=MultiVectorEncoderTrainingArguments(**args),
                                         train_dataset=pairs, eval_dataset=eval_pairs,
                                         loss=MultiVectorMultipleNegativesRankingLoss(model))
    raise ValueError(f"unknown case {case!r}")
