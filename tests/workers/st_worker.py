"""One sentence-transformers training run, on transformers' Trainer or (``--cadence``) on cadence's: the logged losses
and final weights go to OUT/result.pt. Usage: st_worker.py CASE OUT [--cadence]. Tiny BERT from a config, a word-level
tokenizer built here, local data: no Hub."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too

case, out = sys.argv[1], sys.argv[2]
if "--cadence" in sys.argv:
    import cadence

    cadence.patch_transformers()

from datasets import Dataset  # noqa: E402
from tiny import word_tokenizer  # noqa: E402
from transformers import BertConfig, BertModel, BertForSequenceClassification, TrainerCallback  # noqa: E402

WORDS = [f"w{i}" for i in range(30)]  # tiny.word_tokenizer's vocabulary


def texts(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[i] for i in torch.randint(len(WORDS), (6,), generator=g).tolist()) for _ in range(n)]


tokenizer = word_tokenizer()
config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
torch.manual_seed(0)


class Record(TrainerCallback):
    losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.losses += [(state.global_step, k, float(v)) for k, v in (logs or {}).items()
                        if isinstance(v, (int, float))]


common = dict(output_dir=out, per_device_train_batch_size=4, max_steps=4, logging_steps=1, learning_rate=1e-3,
              save_strategy="no", report_to="none", use_cpu=True, seed=7, disable_tqdm=True)
pairs = Dataset.from_dict({"anchor": texts(16, 1), "positive": texts(16, 2)})

if case in ("sentence_transformer", "sentence_transformer_whole"):
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from sentence_transformers.models import Pooling, Transformer

    model_dir = os.path.join(out, "bert")
    BertModel(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    model = SentenceTransformer(modules=[Transformer(model_dir), Pooling(32)])
    whole = {"eval_strategy": "steps", "eval_steps": 2, "save_strategy": "steps", "save_steps": 2}  # evaluate, save
    args = SentenceTransformerTrainingArguments(**{**common, **(whole if case.endswith("_whole") else {})})
    evaluation = {"eval_dataset": Dataset.from_dict({"anchor": texts(8, 3), "positive": texts(8, 4)})}
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs,
                                         loss=MultipleNegativesRankingLoss(model), callbacks=[Record()],
                                         **(evaluation if case.endswith("_whole") else {}))
elif case == "cross_encoder":
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    model_dir = os.path.join(out, "bert")
    BertForSequenceClassification(BertConfig(**config.to_dict(), num_labels=1)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    model = CrossEncoder(model_dir, num_labels=1)
    labelled = Dataset.from_dict({"sentence1": texts(16, 1), "sentence2": texts(16, 2),
                                  "label": [float(i % 2) for i in range(16)]})
    args = CrossEncoderTrainingArguments(**common)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=labelled, loss=BinaryCrossEntropyLoss(model),
                                  callbacks=[Record()])
elif case == "sparse_encoder":
    from sentence_transformers.sparse_encoder import SparseEncoder, SparseEncoderTrainer, SparseEncoderTrainingArguments
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling
    from transformers import BertForMaskedLM

    model_dir = os.path.join(out, "bert")
    BertForMaskedLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    model = SparseEncoder(modules=[MLMTransformer(model_dir), SpladePooling("max")])
    loss = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model), query_regularizer_weight=5e-5,
                      document_regularizer_weight=3e-5)
    args = SparseEncoderTrainingArguments(**common)
    trainer = SparseEncoderTrainer(model=model, args=args, train_dataset=pairs, loss=loss, callbacks=[Record()])
elif case == "multi_vector_encoder":
    from sentence_transformers.multi_vector_encoder import (MultiVectorEncoder, MultiVectorEncoderTrainer,
                                                            MultiVectorEncoderTrainingArguments)
    from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss

    model_dir = os.path.join(out, "bert")
    BertModel(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    torch.manual_seed(1)  # the projection MultiVectorEncoder adds
    model = MultiVectorEncoder(model_dir)
    args = MultiVectorEncoderTrainingArguments(**common)
    trainer = MultiVectorEncoderTrainer(model=model, args=args, train_dataset=pairs,
                                        loss=MultiVectorMultipleNegativesRankingLoss(model), callbacks=[Record()])
else:
    raise SystemExit(f"unknown case {case}")

import cadence  # noqa: E402  (importing it patches nothing)

# each run proves its base: a reference run is transformers' (the environment's mark must not reach it)
assert isinstance(trainer, cadence.Trainer) == ("--cadence" in sys.argv), type(trainer).__mro__
trainer.train()
if case.endswith("_whole"):  # evaluate() after training, as scripts do; the model stays as training left it
    Record.losses += [(-1, k, float(v)) for k, v in trainer.evaluate().items() if k.endswith("_loss")]
    Record.losses += [(-1, "training_mode", float(model.training))]
torch.save({"losses": Record.losses, "weights": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}},
           os.path.join(out, "result.pt"))
