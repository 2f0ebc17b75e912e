"""Tiny models and datasets shared by the tests: they train in milliseconds on a CPU."""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset


class RegressionDataset(Dataset):
    """y = 2x + 3 + noise, as dicts {"input_x", "labels"}."""

    def __init__(self, length: int = 64, seed: int = 42):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(length, generator=g)
        self.y = 2.0 * self.x + 3.0 + 0.1 * torch.randn(length, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_x": self.x[i], "labels": self.y[i]}


class RegressionModel(nn.Module):
    """y = a*x + b with MSE loss."""

    def __init__(self, a: float = 0.0, b: float = 0.0):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a))
        self.b = nn.Parameter(torch.tensor(b))

    def forward(self, input_x, labels=None):
        y = self.a * input_x + self.b
        if labels is None:
            return (y,)
        return (nn.functional.mse_loss(y, labels), y)


class _RowsDataset(Dataset):
    """Rows kept as (input_ids, labels) pairs, served as dicts."""

    rows: list

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids, labels = self.rows[i]
        return {"input_ids": ids, "labels": labels}


class TokenDataset(_RowsDataset):
    """Sequences of varied length (3..12) over a 16-token vocabulary, labels = next token with some masked."""

    def __init__(self, length: int = 40, seed: int = 0, max_len: int = 12):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(length):
            n = int(torch.randint(3, max_len + 1, (1,), generator=g))
            ids = torch.randint(0, 16, (n,), generator=g)
            labels = (ids * 3 + 1) % 16
            labels[torch.rand(n, generator=g) < 0.3] = -100
            self.rows.append((ids, labels))


def pad_collate(features):
    """Pad input_ids with 0 and labels with -100 to the longest row."""
    n = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), n, dtype=torch.long)
    labels = torch.full((len(features), n), -100, dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = f["input_ids"]
        labels[i, : len(f["labels"])] = f["labels"]
    return {"input_ids": ids, "labels": labels}


class TokenTagger(nn.Module):
    """Per-token classifier whose loss is the mean over its own labels (does not take num_items_in_batch)."""

    def __init__(self, vocab: int = 16, dim: int = 8, dtype=torch.float32, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, dim, dtype=dtype)
        self.out = nn.Linear(dim, vocab, dtype=dtype)

    def logits(self, input_ids):
        return self.out(torch.tanh(self.emb(input_ids)))

    def forward(self, input_ids, labels=None):
        logits = self.logits(input_ids)
        if labels is None:
            return {"logits": logits}
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return {"loss": loss, "logits": logits}


class TokenTaggerWithItems(TokenTagger):
    """The same model, but it sums its loss and divides by num_items_in_batch when given (HF's contract)."""

    def forward(self, input_ids, labels=None, num_items_in_batch=None):
        if num_items_in_batch is None:
            return super().forward(input_ids, labels)
        logits = self.logits(input_ids)
        total = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        return {"loss": total / num_items_in_batch, "logits": logits}


def tiny_gpt2(seed: int = 0, vocab: int = 64):
    """A 2-layer GPT-2 from transformers with random weights and no dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


class LMDataset(_RowsDataset):
    """Causal-LM rows of varied length (5..16) over a 64-token vocabulary; ~35% of labels masked."""

    def __init__(self, length: int = 48, seed: int = 1, vocab: int = 64):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(length):
            n = int(torch.randint(5, 17, (1,), generator=g))
            ids = torch.randint(0, vocab, (n,), generator=g)
            labels = ids.clone()
            labels[torch.rand(n, generator=g) < 0.35] = -100
            self.rows.append((ids, labels))


class ClassDataset(Dataset):
    """Rows {"x": 4 features, "labels": one of 3 classes}."""

    def __init__(self, length: int = 10, seed: int = 3):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(length, 4, generator=g)
        self.y = torch.randint(0, 3, (length,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Classifier(nn.Module):
    """A linear 3-class classifier; returns a dict (loss, logits) like a transformers model."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.lin = nn.Linear(4, 3)

    def forward(self, x, labels=None):
        logits = self.lin(x)
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def lm_collate(features):
    """Pad input_ids with 0 (attention_mask marks real tokens) and labels with -100."""
    batch = pad_collate(features)
    batch["attention_mask"] = torch.zeros_like(batch["input_ids"])
    for i, f in enumerate(features):
        batch["attention_mask"][i, : len(f["input_ids"])] = 1
    return batch
def word_tokenizer(padding_side: str = "right"):
    """A transformers fast tokenizer over words "w0".."w29" built in memory (no download); [PAD] is id 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(30)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", padding_side=padding_side)


class ClassifierModel(nn.Module):
    """Mean-pooled embedding classifier taking input_ids, attention_mask and labels (HF-style names)."""

    def __init__(self, vocab: int = 32, classes: int = 3, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, 8)
        self.out = nn.Linear(8, classes)

    def forward(self, input_ids, attention_mask=None, labels=None):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        pooled = (self.emb(input_ids) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        logits = self.out(pooled)
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def stop_at(step: int):
    """A cadence callback that stops training after optimizer step ``step`` (a simulated interruption)."""
    from cadence import TrainerCallback

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                control.should_training_stop = True

    return StopAt()


class BlockDataset(Dataset):
    """Token blocks of one length whose labels are the inputs (a language-modeling script's grouped texts)."""

    def __init__(self, length: int, block: int = 64, vocab: int = 64, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (length, block), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class FeatureDataset(Dataset):
    """Rows {"x": ``features`` normal values, "labels": normal targets of shape ``label_shape``}."""

    def __init__(self, length: int, features: int, label_shape: tuple = (), seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(length, features, generator=g)
        self.y = torch.randn(length, *label_shape, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def make_args(output_dir, lib=None, /, **overrides):
    """``TrainingArguments`` for a test: no progress bar, no trackers, no checkpoints, unless overridden
    (``output_dir`` too).

    ``lib`` is ``cadence`` (the default) or ``transformers``, for runs compared across the two.
    """
    if lib is None:
        import cadence as lib

    base = dict(output_dir=str(output_dir), disable_tqdm=True, save_strategy="no", report_to="none")
    return lib.TrainingArguments(**{**base, **overrides})


def args_with(**defaults) -> Callable:
    """``make_args`` with a test file's own defaults, each still overridable per call."""
    return functools.partial(make_args, **defaults)


class Stream(IterableDataset):
    """A map-style dataset's rows as a stream: no ``__len__``, no ``state_dict`` (a resume skips by reading)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return (self.dataset[i] for i in range(len(self.dataset)))
