"""The cost of reporting: ``train()`` on the tiny MLP logging every step to TensorBoard + jsonl,
against the same run logging every step to nothing (``report_to="none"``).

Both runs log every step (so both read the loss back every step); the difference is only the
trackers: a TensorBoard event and a JSON line per log, kept by each tracker and written in batches (at
most every second, at saves, after evaluations and at the end).
The tiny MLP's steps take well under a millisecond, so this is the worst case for a tracker's
per-log cost. Runs are interleaved, a tracked and an untracked run each round; the verdict is the median
of the rounds' ratios (tracked / untracked of the same round: a slow stretch of the machine slows both),
with a 95% interval for it. When the interval holds the target, the machine's noise was larger than the
margin and the result says so.

    .venv/bin/python benchmarks/bench_tracking.py               # 41 rounds, about half a minute
    .venv/bin/python benchmarks/bench_tracking.py --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import math
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# numpy's OpenBLAS (not torch's BLAS: MKL) keeps a worker thread per core that nothing here uses; on the 2-core
# machine, without this line the untracked runs were 3-6% slower and the rounds' quartiles twice as wide
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import common  # noqa: E402

TARGET = 1.03  # the promise: at most +3% over logging to nothing
VARIANTS = {"none": "none", "tensorboard+jsonl": ["tensorboard", "jsonl"]}


def median_with_ci(values: list[float]) -> tuple[float, float, float]:
    """The median of ``values`` and a 95% interval for it, from order statistics (no assumption about the
    noise's shape): the true median lies below the k-th smallest value with probability P(Binomial(n, 1/2) < k).

    Example:
        >>> median_with_ci([1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07, 1.08])
        (1.04, 1.01, 1.07)
    """
    s, n = sorted(values), len(values)
    below = [math.comb(n, i) / 2**n for i in range(n + 1)]  # P(exactly i values below the median)
    k, covered = 0, below[0]
    while covered + below[k + 1] < 0.025:  # the largest k with P(fewer than k+1 below) under 2.5%
        k += 1
        covered += below[k]
    return statistics.median(s), s[k], s[n - 1 - k]


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


def time_in_trackers(wl: common.Workload, runs: int = 5) -> tuple[float, float]:
    """The trackers' share of tracked runs, measured inside them: every event of theirs is timed (the logs
    kept, the batches encoded and written, the start and the end). Unlike the whole-run ratio this barely
    moves with the machine's noise; it leaves out what a tracker costs the steps around it (caches).

    Returns:
        (median fraction of ``train()`` spent in the trackers, median microseconds per log)
    """
    from cadence.integrations.base import TrackerCallback

    spent = [0.0]

    def timed(method):
        def event(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0
        return event

    events = ("on_train_begin", "on_log", "on_save", "on_evaluate", "on_train_end")
    originals = {name: getattr(TrackerCallback, name) for name in events}
    fractions = []
    try:
        for name, method in originals.items():
            setattr(TrackerCallback, name, timed(method))
        for _ in range(runs):
            spent[0] = 0.0
            seconds = run_once(VARIANTS["tensorboard+jsonl"], wl)
            fractions.append((spent[0] / seconds, spent[0] / wl.steps * 1e6))
    finally:
        for name, method in originals.items():
            setattr(TrackerCallback, name, method)
    return statistics.median(f for f, _ in fractions), statistics.median(u for _, u in fractions)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=41)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the tiny MLP gains nothing from more, "
                   "and on a shared machine spinning threads only add noise)")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    if a.threads == 1 and hasattr(os, "sched_setaffinity"):  # one core: the run is not moved between cores mid-way
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # (on the 2-core machine: quartiles half as wide)
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
    ratio, low, high = median_with_ci([t / b for b, t in zip(*times.values())])
    share, per_log = time_in_trackers(wl)
    print(f"inside the trackers: {share * 100:.2f}% of a tracked run, {per_log:.1f} us per log (both trackers, "
          f"start and end included); one step logging to nothing: {base / a.steps * 1e6:.0f} us")
    result = "PASS" if ratio <= TARGET else "MISS"
    if low <= TARGET < high:  # the machine's noise is larger than the margin: this run cannot tell
        result += " (unsure: the 95% interval holds the target; rerun on a quieter machine)"
    print(common.format_table(
        ["workload", "log to nothing s", "tensorboard+jsonl s", "ratio (median of rounds)", "95% interval", "target",
         "result"],
        [[f"mlp, {a.steps} steps, logging_steps=1", f"{base:.3f}", f"{tracked:.3f}", f"{ratio:.3f}",
          f"{low:.3f} .. {high:.3f}", f"<= {TARGET:.2f}", result]]))
    return times


if __name__ == "__main__":
    main()
