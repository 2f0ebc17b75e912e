"""Evaluation of a large-output model: ``trainer.evaluate()`` of cadence and transformers against a
plain eval loop, time and peak memory, in one process.

The model is the small GPT-2 of ``bench_loop`` (vocabulary 8192). Every runner does the same job:
a forward pass over each batch without gradients, the mean loss, and a ``compute_metrics`` (next-token
accuracy) that receives the logits of the whole set at once, which is the trainers' contract. So
the predictions of the whole set (sequences x length x 8192 floats) must be held, and the peak
memory column shows how many copies of them each runner makes on the way.

    .venv/bin/python benchmarks/bench_eval.py
    .venv/bin/python benchmarks/bench_eval.py --quick --runners plain,cadence
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections import namedtuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import common  # noqa: E402

logger = logging.getLogger(__name__)

# (sequences, --quick sequences); length 64 keeps the full set's logits at 256 x 64 x 8192 x 4 B = 512 MiB
EVAL_SEQUENCES = (256, 128)
EVAL_SEQ_LEN = 64
EVAL_BATCH = 8

Prediction = namedtuple("Prediction", "predictions label_ids")  # what compute_metrics reads


def token_accuracy(p) -> dict[str, float]:
    """Next-token accuracy from the whole set's logits: the model at position t predicts token t+1."""
    preds = np.asarray(p.predictions)[:, :-1].argmax(-1)
    labels = np.asarray(p.label_ids)[:, 1:]
    return {"accuracy": float((preds == labels).mean())}


def eval_model() -> torch.nn.Module:
    """The GPT-2 of the loop benchmark, without its key/value cache (nothing to generate here)."""
    torch.manual_seed(common.SEED)
    model = common._gpt2_model()
    if hasattr(model, "config"):
        model.config.use_cache = False
    return model


def eval_data(n: int) -> common.TokenData:
    s = common.GPT2_SHAPE
    return common.TokenData(n, EVAL_SEQ_LEN, s["vocab"], seed=common.SEED + 1)


def plain_evaluate(model: torch.nn.Module, data, batch_size: int) -> dict[str, float]:
    """A hand-written eval loop doing the trainers' work: loss, all logits, then ``compute_metrics``."""
    loader = DataLoader(data, batch_size=batch_size)
    model.eval()
    losses, logits, labels = [], [], []
    with torch.no_grad():
        for batch in loader:
            out = model(**batch)
            rows = len(batch["labels"])
            losses.append(out["loss"] * rows)
            logits.append(out["logits"])
            labels.append(batch["labels"])
    pred = Prediction(torch.cat(logits).numpy(), torch.cat(labels).numpy())
    del logits, labels  # the per-batch copies are not needed once concatenated
    metrics = token_accuracy(pred)
    metrics["loss"] = torch.stack(losses).sum().item() / len(data)
    return metrics


def build_trainer(lib: str, data, output_dir: str):
    Trainer, TrainingArguments = common.trainer_classes(lib)
    args = TrainingArguments(output_dir=output_dir, per_device_eval_batch_size=EVAL_BATCH, report_to="none",
                             disable_tqdm=True, use_cpu=True, dataloader_pin_memory=False, seed=common.SEED)
    return Trainer(model=eval_model(), args=args, eval_dataset=data, compute_metrics=token_accuracy)


def run(runner: str, data) -> tuple[float, float, dict]:
    """One timed evaluation; building the model/trainer is not timed.

    Returns:
        ``(seconds, extra peak MiB over the resident memory before the call, metrics)``.
    """
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        if runner == "plain":
            model = eval_model()
            call = lambda: plain_evaluate(model, data, EVAL_BATCH)  # noqa: E731
        else:
            trainer = build_trainer(runner, data, out)
            call = lambda: trainer.evaluate()  # noqa: E731
        common.reset_peak_rss()
        before = common.current_rss_mb()
        t0 = time.perf_counter()
        metrics = call()
        dt = time.perf_counter() - t0
        extra = common.peak_rss_mb() - before
    short = {k.removeprefix("eval_"): v for k, v in metrics.items() if k.removeprefix("eval_") in ("loss", "accuracy")}
    return dt, extra, short


def bench(runners: list[str], n: int, repeats: int) -> dict[str, dict]:
    """Warm each runner up once, then ``repeats`` interleaved rounds.

    Returns:
        ``{runner: {"times": [...], "extra": [...], "metrics": {...}}}``.
    """
    data = eval_data(n)
    warm = eval_data(2 * EVAL_BATCH)
    for r in runners:
        run(r, warm)
    res = {r: {"times": [], "extra": [], "metrics": {}} for r in runners}
    for i in range(repeats):
        for r in common.rotated(runners, i):
            dt, extra, metrics = run(r, data)
            res[r]["times"].append(dt)
            res[r]["extra"].append(extra)
            res[r]["metrics"] = metrics
        print(f"  eval round {i + 1}/{repeats}: "
              + "  ".join(f"{r} {res[r]['times'][-1]:.3f}s" for r in runners), flush=True)
    return res


def summary(res: dict[str, dict], n: int) -> dict[str, float]:
    """Medians: seconds and extra peak MiB of each runner, keyed like ``cadence_s``, ``hf_mib``."""
    out = {}
    for r in common.RUNNERS:
        out[f"{r}_s"] = common.median(res[r]["times"]) if r in res else math.nan
        out[f"{r}_mib"] = common.median(res[r]["extra"]) if r in res else math.nan
    out["sequences"] = n
    return out


def table(res: dict[str, dict], n: int) -> str:
    s = summary(res, n)
    tokens = n * EVAL_SEQ_LEN
    fmt = lambda key, f: "/".join(f.format(s[f"{r}_{key}"]) if r in res else "-" for r in common.RUNNERS)  # noqa: E731
    row = [
        f"gpt2 eval, {n} seq", f"{s['plain_s']:.3f}", f"{s['cadence_s']:.3f}", f"{s['hf_s']:.3f}",
        f"{s['cadence_s'] / s['plain_s']:.3f}", f"{s['hf_s'] / s['plain_s']:.3f}",
        "/".join(f"{n / s[f'{r}_s']:.0f}" if r in res else "-" for r in common.RUNNERS),
        "/".join(f"{tokens / s[f'{r}_s']:.0f}" if r in res else "-" for r in common.RUNNERS),
        fmt("mib", "{:.0f}"),
        "/".join(f"{100 * common.spread(res[r]['times']):.0f}" if r in res else "-" for r in common.RUNNERS),
    ]
    header = ["workload", "plain s", "cadence s", "HF s", "cadence/plain", "HF/plain", "samples/s (p/c/h)",
              "tokens/s (p/c/h)", "extra peak RSS MiB (p/c/h)", "spread % (p/c/h)"]
    return common.format_table(header, [row])


def checks(s: dict[str, float]) -> list[tuple[str, str, str, str]]:
    """The evaluation promises, for ``run_all``'s summary: faster than HF, and no more peak memory.

    Args:
        s: ``summary()`` of a run.
    Returns:
        ``(row, promise, measured, "PASS"/"MISS")`` rows, where cadence and HF both ran.
    """
    if math.isnan(s["cadence_s"]) or math.isnan(s["hf_s"]):
        return []
    row = f"gpt2 eval, {s['sequences']} seq"
    return [
        (row, "cadence faster than HF Trainer", f"cadence/HF {s['cadence_s'] / s['hf_s']:.3f}",
         "PASS" if s["cadence_s"] < s["hf_s"] else "MISS"),
        (row, "cadence peak memory <= HF", f"{s['cadence_mib']:.0f} vs {s['hf_mib']:.0f} MiB",
         "PASS" if s["cadence_mib"] <= s["hf_mib"] else "MISS"),
    ]


def main(argv: list[str] | None = None) -> dict:
    """Parse flags, run, print the table. Returns ``summary()`` of the medians."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runners", default=",".join(common.RUNNERS))
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5, --quick 3)")
    p.add_argument("--quick", action="store_true", help=f"{EVAL_SEQUENCES[1]} sequences and 3 repeats")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    repeats = a.repeats or (3 if a.quick else 5)
    n = EVAL_SEQUENCES[1] if a.quick else EVAL_SEQUENCES[0]
    torch.set_num_threads(a.threads or torch.get_num_threads())
    warnings.filterwarnings("ignore")
    common.quiet_transformers()

    from bench_loop import available_runners
    runners = available_runners([r.strip() for r in a.runners.split(",") if r.strip()])
    vocab = common.GPT2_SHAPE["vocab"]
    print(f"bench_eval: {n} sequences of {EVAL_SEQ_LEN} tokens, vocabulary {vocab}, batch {EVAL_BATCH}: "
          f"{n * EVAL_SEQ_LEN * vocab * 4 / 2**20:.0f} MiB of logits; {torch.get_num_threads()} threads, "
          f"repeats {repeats}, runners {','.join(runners)}", flush=True)
    res = bench(runners, n, repeats)
    print("  sanity: " + "; ".join(f"{r}: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(v["metrics"].items()))
                                   for r, v in res.items()))
    print()
    print(table(res, n))
    print("extra peak RSS: the process's peak resident memory during the call minus its resident memory "
          "before it (the logits of the whole set alone are "
          f"{n * EVAL_SEQ_LEN * vocab * 4 / 2**20:.0f} MiB).")
    return summary(res, n)


if __name__ == "__main__":
    main()
