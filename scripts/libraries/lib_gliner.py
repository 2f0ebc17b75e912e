"""GLiNER's Trainer (``gliner.training.Trainer``: its own ``compute_loss``, ``training_step``, ``create_optimizer``,
``prediction_step``, ``_save`` and ``_load_from_checkpoint``) on a GLiNER built from a config over a tiny local
BERT, with GLiNER's own data collator; 16 tokenized sentences with entity spans."""

from __future__ import annotations

from tiny import saved_bert, sentence, tokenizer

CASES = {"gliner": "gliner.training.Trainer", "gliner_warmup_ratio": "gliner.training.Trainer (warmup_ratio)"}
NOTES = {"gliner_warmup_ratio": "GLiNER's own warmup spelling: warmup_ratio=0.25 (its TrainingArguments field), "
                                "warmup_steps=0"}
LABELS = ["animal", "colour"]


def version() -> str:
    import gliner

    return gliner.__version__


def rows(n: int, offset: int) -> list[dict]:
    out = []
    for i in range(offset, offset + n):
        words = sentence(i, 6).split()
        ner = [[k, k, "animal"] for k, w in enumerate(words) if w in ("cat", "dog", "bird", "fish")]
        ner += [[k, k, "colour"] for k, w in enumerate(words) if w in ("red", "blue")]
        out.append({"tokenized_text": words, "ner": ner})
    return out


def build(case: str, out_dir: str, common: dict):
    import torch
    from gliner import GLiNER, GLiNERConfig
    from gliner.training import Trainer, TrainingArguments

    folder = saved_bert(tokenizer(), out_dir)
    config = GLiNERConfig(model_name=folder, hidden_size=32, max_width=4, max_len=64, dropout=0.0)
    torch.manual_seed(0)
    model = GLiNER.from_config(config, backbone_from_pretrained=True)
    extra = dict(warmup_steps=0, warmup_ratio=0.25) if case == "gliner_warmup_ratio" else {}
    args = TrainingArguments(**dict(common, learning_rate=1e-3, **extra))
    return Trainer(model=model, args=args, train_dataset=rows(16, 0), eval_dataset=rows(8, 40),
                   data_collator=model._create_data_collator(),
                   processing_class=model.data_processor.transformer_tokenizer)
