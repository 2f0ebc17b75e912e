"""setfit's Trainer: its embedding phase is a sentence-transformers Trainer (``trainer.st_trainer``) that setfit
configures by assigning TrainingArguments fields after construction; the classifier head (scikit-learn's logistic
regression) is fitted afterwards on the trained body. Tiny BERT body, word-level tokenizer, 16 labelled rows."""

from __future__ import annotations

import functools

from tiny import saved_bert, sentence, tokenizer

CASES = {"setfit": "Trainer (embedding phase: SentenceTransformerTrainer)"}


def version() -> str:
    import setfit

    return setfit.__version__


def build(case: str, out_dir: str, common: dict):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer
    from setfit import SetFitModel, Trainer, TrainingArguments

    tok = tokenizer()
    body = SentenceTransformer(modules=[Transformer(saved_bert(tok, out_dir)), Pooling(32)])
    model = SetFitModel(model_body=body, model_head=None)
    if model.model_head is None:
        from sklearn.linear_model import LogisticRegression

        model.model_head = LogisticRegression()
    rows = lambda n, o: Dataset.from_dict({"text": [sentence(i, 5) for i in range(o, o + n)],  # noqa: E731
                                           "label": [i % 2 for i in range(o, o + n)]})
    args = TrainingArguments(output_dir=common["output_dir"], batch_size=common["per_device_train_batch_size"],
                             max_steps=common["max_steps"], eval_max_steps=1, num_iterations=2,
                             logging_steps=1, eval_strategy="steps", eval_steps=common["eval_steps"],
                             save_strategy="steps", save_steps=common["save_steps"],
                             save_total_limit=None, seed=common["seed"],
                             report_to="none", show_progress_bar=False)
    return Trainer(model=model, args=args, train_dataset=rows(16, 0), eval_dataset=rows(8, 40))


def hf_trainer(trainer):
    return trainer.st_trainer


def train(trainer, resume: bool):
    """setfit's ``train()`` takes no checkpoint: its sentence-transformers trainer is resumed instead."""
    if resume:
        trainer.st_trainer.train = functools.partial(trainer.st_trainer.train, resume_from_checkpoint=True)
    trainer.train()
    return trainer.st_trainer


def trained_model(trainer, inner):
    return trainer.model.model_body
