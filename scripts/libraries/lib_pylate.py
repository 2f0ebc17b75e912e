"""PyLate's ColBERT training: a sentence-transformers ``SentenceTransformerTrainer`` (PyLate pins
sentence-transformers 5.3) with PyLate's ColBERT model over a tiny local BERT, its contrastive loss and its
collator; 16 (query, positive, negative) triples."""

from __future__ import annotations

from tiny import saved_bert, sentence, tokenizer

CASES = {"colbert": "SentenceTransformerTrainer + pylate.models.ColBERT"}


def version() -> str:
    import pylate

    return getattr(pylate, "__version__", None) or __import__("importlib.metadata").metadata.version("pylate")


def build(case: str, out_dir: str, common: dict):
    import torch
    from datasets import Dataset
    from pylate import losses, models, utils
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    folder = saved_bert(tokenizer(), out_dir)
    torch.manual_seed(1)  # the projection ColBERT adds
    # documents padded to 32 tokens (ColBERT's default, 180, is past the tiny BERT's 128 positions)
    model = models.ColBERT(model_name_or_path=folder, embedding_size=16, query_length=16, document_length=32,
                           device="cpu")
    triples = lambda n, o: Dataset.from_dict({"query": [sentence(i, 3) for i in range(o, o + n)],  # noqa: E731
                                              "positive": [sentence(i + 1, 5) for i in range(o, o + n)],
                                              "negative": [sentence(i + 7, 5) for i in range(o, o + n)]})
    args = SentenceTransformerTrainingArguments(**dict(common, learning_rate=1e-3))
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=triples(16, 0),
                                      eval_dataset=triples(8, 40), loss=losses.Contrastive(model=model),
                                      data_collator=utils.ColBERTCollator(model.tokenize))
