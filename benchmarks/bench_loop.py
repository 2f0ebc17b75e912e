"""Time ``train()`` of cadence and transformers against a plain PyTorch loop, in one process.

Runs are interleaved (plain, cadence, hf, then cadence, hf, plain, then hf, plain, cadence, ...) so
that drift in machine load hits every runner alike; the table shows medians and ratios to the plain loop.

    .venv/bin/python benchmarks/bench_loop.py                  # all workloads, 5 repeats
    .venv/bin/python benchmarks/bench_loop.py --quick          # shorter runs, 3 repeats
    .venv/bin/python benchmarks/bench_loop.py --workloads mlp --runners plain,cadence
    .venv/bin/python benchmarks/bench_loop.py --threads 1 --clock cpu   # on a machine other jobs share
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

logger = logging.getLogger(__name__)

# ratio to the plain loop that cadence promises (benchmarks/README.md, rows (1)-(3)); the MiniLM
# fine-tune is compute-bound, so it gets the compute-bound promise
TARGETS = {"mlp": 1.10, "gpt2": 1.02, "minilm": 1.02}
NOISY_SPREAD = 0.25  # (max - min) / median above this for any runner marks a verdict as unreliable


def available_runners(wanted: list[str]) -> list[str]:
    """Drop a runner whose library cannot be imported, saying why."""
    out = []
    for r in wanted:
        if r != "plain":
            try:
                common.trainer_classes(r)
            except Exception as e:  # a broken import is a result to report, not a crash
                print(f"[skip] {r}: cannot import its Trainer ({type(e).__name__}: {e})")
                continue
        out.append(r)
    return out


def bench_workload(wl: common.Workload, runners: list[str], repeats: int) -> dict[str, dict]:
    """Warm each runner up once, then time ``repeats`` interleaved rounds.

    Returns:
        ``{runner: {"times": [...], "rss": [...], "info": {...}}}``.
    """
    warm = common.warmup_variant(wl)
    for r in runners:  # first-call costs (lazy imports, kernel set-up) are not what we measure
        common.run(r, warm)
    res = {r: {"times": [], "rss": [], "info": {}} for r in runners}
    for i in range(repeats):
        for r in common.rotated(runners, i):
            common.reset_peak_rss()
            dt, info = common.run(r, wl)
            res[r]["times"].append(dt)
            res[r]["rss"].append(common.peak_rss_mb())
            res[r]["info"] = info
        print(f"  {wl.name} round {i + 1}/{repeats}: "
              + "  ".join(f"{r} {res[r]['times'][-1]:.3f}s" for r in runners), flush=True)
    return res


def table(results: dict[str, dict[str, dict]], workloads: dict[str, common.Workload],
          skipped: dict[str, str] | None = None) -> str:
    """The summary table: medians, ratios to plain, targets, throughput, memory and noise.

    Args:
        results: ``bench_workload`` output per workload name.
        workloads: the ``Workload`` of each name.
        skipped: ``{name: why}`` of workloads that could not run; each gets a row saying so.
    """
    header = ["workload", "plain s", "cadence s", "HF s", "cadence/plain", "HF/plain", "target",
              "result", "c/p, h/p of mins", "samples/s (p/c/h)", "tokens/s (p/c/h)", "peak RSS MiB (p/c/h)",
              "spread % (p/c/h)"]
    rows = []
    for name, res in results.items():
        wl = workloads[name]
        med = {r: common.median(res[r]["times"]) if r in res else math.nan for r in common.RUNNERS}
        ratio = {r: med[r] / med["plain"] for r in ("cadence", "hf")}
        target = TARGETS.get(name, math.nan)
        verdict = "n/a" if math.isnan(ratio["cadence"]) else (
            "PASS" if ratio["cadence"] <= target else "MISS")
        if any(common.spread(v["times"]) > NOISY_SPREAD for v in res.values()):
            verdict += " (noisy)"  # other jobs took the CPUs during some rounds: rerun
        low = {r: min(res[r]["times"]) if r in res else math.nan for r in common.RUNNERS}
        samples = wl.steps * wl.batch_size
        thr = lambda per: "/".join(f"{per / med[r]:.0f}" if r in res else "-"  # noqa: E731
                                   for r in common.RUNNERS)
        rows.append([
            name, f"{med['plain']:.3f}", f"{med['cadence']:.3f}", f"{med['hf']:.3f}",
            f"{ratio['cadence']:.3f}", f"{ratio['hf']:.3f}", f"<= {target:.2f}", verdict,
            f"{low['cadence'] / low['plain']:.3f}, {low['hf'] / low['plain']:.3f}",
            thr(samples), thr(samples * wl.tokens_per_sample) if wl.tokens_per_sample else "-",
            "/".join(f"{max(res[r]['rss']):.0f}" if r in res else "-" for r in common.RUNNERS),
            "/".join(f"{100 * common.spread(res[r]['times']):.0f}" if r in res else "-"
                     for r in common.RUNNERS),
        ])
    for name, why in (skipped or {}).items():
        rows.append([name, f"skipped: {why}"] + [""] * (len(header) - 2))
    return common.format_table(header, rows)


def checks(results: dict[str, dict[str, dict]]) -> list[tuple[str, str, str, str]]:
    """The promises this benchmark checks, for ``run_all``'s summary.

    Returns:
        ``(workload, promise, measured, "PASS"/"MISS")`` rows: cadence/plain within its target, and
        cadence faster than transformers' Trainer (by medians) where both ran; " (noisy)" is added
        when a runner's rounds spread more than ``NOISY_SPREAD``.
    """
    out = []
    for name, res in results.items():
        med = {r: common.median(res[r]["times"]) for r in res}
        noisy = " (noisy)" if any(common.spread(v["times"]) > NOISY_SPREAD for v in res.values()) else ""
        if "cadence" in med and "plain" in med and name in TARGETS:
            ratio = med["cadence"] / med["plain"]
            out.append((name, f"cadence/plain <= {TARGETS[name]:.2f}", f"{ratio:.3f}",
                        ("PASS" if ratio <= TARGETS[name] else "MISS") + noisy))
        if "cadence" in med and "hf" in med:
            ratio = med["cadence"] / med["hf"]
            out.append((name, "cadence faster than HF Trainer", f"cadence/HF {ratio:.3f}",
                        ("PASS" if ratio < 1 else "MISS") + noisy))
    return out


def main(argv: list[str] | None = None) -> dict:
    """Parse flags, run the workloads, print per-run lines and the table.

    Returns:
        ``{"results": per-workload raw results, "skipped": {name: why}}``.
    """
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(common.WORKLOADS), help="comma list of: " + ",".join(common.WORKLOADS))
    p.add_argument("--runners", default=",".join(common.RUNNERS), help="comma list of plain,cadence,hf")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5, --quick 3)")
    p.add_argument("--quick", action="store_true", help="shorter runs and 3 repeats, for iterating")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for every runner (default: torch's default)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="time train() by wall time, or by this process's CPU time (steadier on a shared machine)")
    a = p.parse_args(argv)
    common.CLOCK = time.process_time if a.clock == "cpu" else time.perf_counter
    repeats = a.repeats or (3 if a.quick else 5)

    # the same thread count for every runner; set explicitly so no library changes it between runs
    torch.set_num_threads(a.threads or torch.get_num_threads())
    warnings.filterwarnings("ignore")
    common.quiet_transformers()

    load = os.getloadavg()[0]
    if load > 0.75 * (os.cpu_count() or 1):  # the 1-minute average lags; ours adds up to 1
        print(f"[warn] load average {load:.2f} before starting: other jobs share the CPUs and threads "
              "may oversubscribe them (slowdowns of 10x seen); rerun when idle or with --threads 1")
    runners = available_runners([r.strip() for r in a.runners.split(",") if r.strip()])
    names = [w.strip() for w in a.workloads.split(",") if w.strip()]
    workloads, skipped = {}, {}
    for n in names:
        try:
            workloads[n] = common.get_workload(n, quick=a.quick)
        except common.WorkloadUnavailable as e:  # e.g. no local pretrained model: a row that says so
            skipped[n] = str(e)
            print(f"[skip] {n}: {e}" + (f"; to run it: {e.hint}" if e.hint else ""))
    print(f"bench_loop: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs, repeats {repeats}, runners {','.join(runners)}"
          f"{', quick' if a.quick else ''}")
    results = {}
    for n, wl in workloads.items():
        print(f"{n}: {wl.notes}; {wl.steps} steps, logging every {wl.logging_steps}", flush=True)
        t0 = time.perf_counter()
        results[n] = bench_workload(wl, runners, repeats)
        info = "; ".join(f"{r}: loss {v['info']['loss']:.4f}, {v['info']['optimizer']}"
                         for r, v in results[n].items())
        print(f"  sanity ({time.perf_counter() - t0:.0f}s total): {info}")
    print()
    print(table(results, workloads, skipped))
    print(f"ratios are of medians of train() {a.clock} time (and of the fastest rounds, less hurt by other "
          "jobs); the target applies to cadence/plain; '(noisy)': a runner's rounds spread over "
          f"{100 * NOISY_SPREAD:.0f}%.")
    return {"results": results, "skipped": skipped}


if __name__ == "__main__":
    main()
