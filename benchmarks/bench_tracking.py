"""The cost of reporting: ``train()`` on the tiny MLP logging every step to TensorBoard + jsonl,
against the same run logging every step to nothing (``report_to="none"``).

Both runs log every step (so both read the loss back every step); the difference is only the
trackers: a TensorBoard event and a JSON line per log, kept by each tracker and written in batches (at
most every second, at saves, after evaluations and at the end).
The tiny MLP's steps take well under a millisecond, so this is the worst case for a tracker's
per-log cost. Runs are interleaved; the table shows medians and the ratio of medians (the verdict), and
the spread of the rounds' own ratios (tracked / untracked of the same round), which shows how much of
the result is the machine's noise.

    .venv/bin/python benchmarks/bench_tracking.py               # 15 rounds
    .venv/bin/python benchmarks/bench_tracking.py --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

TARGET = 1.03  # the promise: at most +3% over logging to nothing
VARIANTS = {"none": "none", "tensorboard+jsonl": ["tensorboard", "jsonl"]}


def run_once(report_to, wl: common.Workload) -> float:
    """Seconds of ``trainer.train()`` for one fresh run reporting to ``report_to``."""
    with tempfile.TemporaryDirectory() as out:
        base = common.build_trainer("cadence", wl, out)  # the benchmark's usual settings
        args = dataclasses.replace(base.args, report_to=report_to)
        trainer = type(base)(model=common.fresh_model(wl), args=args, train_dataset=wl.make_data())
        with contextlib.redirect_stdout(io.StringIO()):  # PrinterCallback prints every log
            t0 = time.perf_counter()
            trainer.train()
            return time.perf_counter() - t0


def per_log_cost(names: list[str], logs: int = 2000) -> dict[str, float]:
    """Microseconds one log costs each tracker (started, outside training; its ``on_train_end`` counted,
    where a batching tracker writes what is still pending): the part of the ratio that is the tracker's
    own, measured without the noise of whole training runs."""
    from cadence import TrainerControl, TrainerState, TrainingArguments
    from cadence.integrations.registry import get_reporting_integration_callbacks

    out = {}
    for name, cls in zip(names, get_reporting_integration_callbacks(names)):
        with tempfile.TemporaryDirectory() as folder:
            args = TrainingArguments(output_dir=folder, use_cpu=True)
            state, control, cb = TrainerState(), TrainerControl(), cls()
            cb.on_train_begin(args, state, control)
            t0 = time.perf_counter()
            for step in range(1, logs + 1):
                state.global_step = step
                cb.on_log(args, state, control, logs={"loss": 0.5 + 1 / step, "grad_norm": 1.25, "learning_rate": 1e-3,
                                                      "epoch": step / 100})
            cb.on_train_end(args, state, control)
            out[name] = (time.perf_counter() - t0) / logs * 1e6
    return out


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the tiny MLP gains nothing from more, "
                   "and on a shared machine spinning threads only add noise)")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    wl = dataclasses.replace(common.get_workload("mlp"), steps=a.steps, logging_steps=1)
    wl = dataclasses.replace(wl, make_data=lambda: common.RegressionData(32 * a.steps))
    for variant in VARIANTS.values():  # warm-up: imports (tensorboard), first-call costs
        run_once(variant, wl)
    times = {name: [] for name in VARIANTS}
    for i in range(a.repeats):
        for name in common.rotated(list(VARIANTS), i):
            times[name].append(run_once(VARIANTS[name], wl))
        print(f"  round {i + 1}/{a.repeats}: " + "  ".join(f"{n} {times[n][-1]:.3f}s" for n in VARIANTS), flush=True)
    base, tracked = (statistics.median(times[n]) for n in VARIANTS)
    ratio = tracked / base
    rounds = sorted(t / b for b, t in zip(*times.values()))
    q1, q3 = (rounds[int(q * (len(rounds) - 1))] for q in (0.25, 0.75))
    cost = per_log_cost(["tensorboard", "jsonl"])
    step_us = base / a.steps * 1e6
    print(f"per log: tensorboard {cost['tensorboard']:.1f} us, jsonl {cost['jsonl']:.1f} us; "
          f"one step logging to nothing: {step_us:.0f} us -> trackers alone add "
          f"{(cost['tensorboard'] + cost['jsonl']) / step_us * 100:.1f}% per step")
    print(common.format_table(
        ["workload", "log to nothing s", "tensorboard+jsonl s", "ratio", "rounds' ratios (quartiles)", "target",
         "result"],
        [[f"mlp, {a.steps} steps, logging_steps=1", f"{base:.3f}", f"{tracked:.3f}", f"{ratio:.3f}",
          f"{q1:.3f} .. {q3:.3f}", f"<= {TARGET:.2f}", "PASS" if ratio <= TARGET else "MISS"]]))
    return times


if __name__ == "__main__":
    main()
