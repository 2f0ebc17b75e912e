"""The main job: train a small causal language model on text that ships with Python.

The text is the help-topic pages of the standard library (``pydoc_data.topics``: Python's own
documentation, under the PSF licence), read as bytes, so the vocabulary is the 256 byte values and
nothing is downloaded. The model is a small GPT written here with random weights.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

logger = logging.getLogger(__name__)


def embedded_text() -> bytes:
    """The help-topic texts of the standard library, joined (about 0.5-1 MB of English)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")


class ByteBlocks(Dataset):
    """Consecutive blocks of ``block_size`` bytes as ``{"input_ids", "labels"}`` (labels = inputs; the model shifts)."""

    def __init__(self, data: bytes, block_size: int):
        tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        n = len(tokens) // block_size
        self.blocks = tokens[: n * block_size].view(n, block_size)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


class TinyGPT(nn.Module):
    """A decoder-only transformer: token + position embeddings, pre-norm blocks, tied output layer.

    ``forward(input_ids, labels=None)`` returns ``{"loss", "logits"}``; the loss compares position i
    with label i+1 (``shifts_labels = True``), the mean over labels that are not -100.
    """

    shifts_labels = True

    def __init__(self, vocab_size: int = 256, block_size: int = 128, dim: int = 128, layers: int = 4, heads: int = 4, dropout: float = 0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(block_size, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout, activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied: the checkpoint stores it once
        for emb in (self.tok, self.pos):
            nn.init.normal_(emb.weight, std=0.02)  # small logits at the start: loss begins near ln(256)
        mask = torch.full((block_size, block_size), float("-inf")).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        t = input_ids.shape[1]
        x = self.tok(input_ids) + self.pos(torch.arange(t, device=input_ids.device))
        x = self.blocks(x, mask=self.causal_mask[:t, :t], is_causal=True)
        logits = self.head(self.norm(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return out


def demo_logging_steps(max_steps: int) -> int:
    """Every 25 steps, or more often in a short demo: at least 5 logged losses whenever there are 5 steps, so the
    summary's first and last losses come from different logs (one log made them the same number)."""
    return max(1, min(25, max_steps // 5))


def run_demo(output_dir: str = "cadence_output", max_steps: int = 300, block_size: int = 128, seed: int = 42,
             resume: bool = False) -> dict:
    """Train TinyGPT on the embedded text; print a summary; return the train metrics.

    With ``resume``, continue from the newest checkpoint in ``output_dir`` (written every 100 steps
    and at the end), exactly where it stopped; without it, start again (the previous demo's
    checkpoints in ``output_dir`` are replaced, so ``make demo`` can be run twice).
    """
    from .backend import accelerator_available
    from .trainer import Trainer
    from .training_args import TrainingArguments

    text = embedded_text()
    split = int(len(text) * 0.95)
    train, held_out = ByteBlocks(text[:split], block_size), ByteBlocks(text[split:], block_size)
    torch.manual_seed(seed)
    model = TinyGPT(block_size=block_size)
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=32,
        gradient_accumulation_steps=2,
        learning_rate=2e-3,
        warmup_steps=0.05,
        lr_scheduler_type="cosine",
        weight_decay=0.1,
        logging_steps=demo_logging_steps(max_steps),
        eval_strategy="steps",
        eval_steps=min(100, max(1, max_steps // 3)),  # a short demo evaluates while it trains too
        save_steps=100,
        save_total_limit=2,
        overwrite_output_dir=not resume,  # the demo's own folder: a fresh demo replaces the last one's checkpoints
        seed=seed,
        use_cpu=not accelerator_available(),
    )
    trainer = Trainer(model, args, train_dataset=train, eval_dataset=held_out)
    start = time.time()
    result = trainer.train(resume_from_checkpoint=True if resume else None)
    elapsed = time.time() - start
    # the last step's evaluation, or one now (a run shorter than eval_steps; with transformers < 5.4 installed, a last
    # step off the interval is not evaluated: cadence.versions)
    final = trainer.state.global_step
    metrics = next((h for h in reversed(trainer.state.log_history) if "eval_loss" in h and h.get("step") == final),
                   None) or trainer.evaluate()
    trainer.save_model(output_dir)
    trainer.state.save_to_json(str(Path(output_dir) / "trainer_state.json"))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h] or [result.training_loss]
    summary = {
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "eval_loss": metrics["eval_loss"],
        "perplexity": math.exp(metrics["eval_loss"]),
        "tokens_per_second": result.metrics["train_samples_per_second"] * block_size,  # this call's steps only
        "output_dir": str(Path(output_dir).resolve()),
    }
    print(
        f"\ncadence demo: {result.global_step} steps on {len(train)} blocks of {block_size} bytes of Python's help texts\n"
        f"  train loss  {summary['first_loss']:.3f} -> {summary['last_loss']:.3f} (nats/byte)\n"
        f"  held-out    loss {summary['eval_loss']:.3f}, perplexity {summary['perplexity']:.2f}\n"
        f"  speed       {summary['tokens_per_second']:,.0f} tokens/s ({elapsed:.1f} s)\n"
        f"  files       {summary['output_dir']} (model.safetensors, checkpoint-*/, trainer_state.json)\n"
        f"  curves      cadence plot {output_dir}{_plot_needs()}"
    )
    return summary


def _plot_needs() -> str:
    """What ``cadence plot`` still needs here (matplotlib is not a core dependency), or nothing."""
    import importlib.util

    return "" if importlib.util.find_spec("matplotlib") else "   (after: pip install matplotlib)"
