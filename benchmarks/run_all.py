"""Run every benchmark, print its tables and a PASS/MISS summary of the promises (``make bench``).

    .venv/bin/python benchmarks/run_all.py            # full: about 8 minutes on 2 idle cores
    .venv/bin/python benchmarks/run_all.py --quick    # about 3-4 minutes

Rows: (1) tiny MLP and (2) small GPT-2 training, (3) a pretrained MiniLM fine-tuned on real text
(skipped, saying why, when the model package is not installed: see README.md), (4) evaluation of a
large-output GPT-2, (5) import time and time to the first step, (6) checkpoints: how long training waits at a
save (cadence vs transformers) and a run saving every 3 steps vs none, (7) TRL's SFT and DPO trained through
transformers' Trainer and through cadence's.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_checkpoint  # noqa: E402
import bench_eval  # noqa: E402
import bench_import  # noqa: E402
import bench_libraries  # noqa: E402
import bench_loop  # noqa: E402
import common  # noqa: E402

logger = logging.getLogger(__name__)

# each benchmark's number, as its section heading and the summary's rows print it
ROW_NUMBER = {"mlp": "(1)", "gpt2": "(2)", "minilm": "(3)", "eval": "(4)", "startup": "(5)", "checkpoint": "(6)",
              "libraries": "(7)"}


def summary(loop: dict, eval_checks: list, import_checks: list, checkpoint_checks: list,
            library_checks: list = ()) -> str:
    """One line per promise and row: what is promised, what was measured, PASS/MISS (or skipped)."""
    rows = [[ROW_NUMBER.get(name, ""), name, promise, measured, verdict]
            for name, promise, measured, verdict in bench_loop.checks(loop["results"])]
    rows += [[ROW_NUMBER.get(name, ""), name, "-", f"skipped: {why}", "SKIP"]
             for name, why in loop["skipped"].items()]
    rows.sort(key=lambda r: r[0])
    rows += [[ROW_NUMBER["eval"], *c] for c in eval_checks]
    rows += [[ROW_NUMBER["startup"], *c] for c in import_checks]
    rows += [[ROW_NUMBER["checkpoint"], *c] for c in checkpoint_checks]
    rows += [[ROW_NUMBER["libraries"], *c] for c in library_checks]
    return common.format_table(["row", "benchmark", "promise", "measured (medians)", "result"], rows)


def main(argv: list[str] | None = None) -> None:
    """Run the import benchmark in fresh processes, then the loop and eval benchmarks in this one."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    p.add_argument("--workloads", default=",".join(common.WORKLOADS))
    p.add_argument("--no-eval", action="store_true", help="skip the evaluation benchmark (4)")
    a = p.parse_args(argv)

    t0 = time.perf_counter()
    print(f"# cadence benchmarks, {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.platform()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}\n")
    print("## (5) start-up")
    # before the others: this process must not hold the CPUs while the subprocesses run
    times = bench_import.main(["--repeats", "3" if a.quick else "5"])
    print("\n## (1)-(3) train() loop")
    loop = bench_loop.main(["--workloads", a.workloads] + (["--quick"] if a.quick else []))
    eval_checks = []
    if not a.no_eval:
        print("\n## (4) evaluation of a large-output model")
        eval_checks = bench_eval.checks(bench_eval.main(["--quick"] if a.quick else []))
    print("\n## (6) time training waits at a save")
    checkpoint_checks = bench_checkpoint.checks(bench_checkpoint.main(["--quick"] if a.quick else []))
    print("\n## (7) TRL's SFT and DPO on transformers' Trainer and on cadence")
    library_checks = bench_libraries.checks(bench_libraries.main(["--repeats", "2" if a.quick else "5"]))
    print("\n## summary")
    print(summary(loop, eval_checks, bench_import.checks(times), checkpoint_checks, library_checks))
    print(f"\ntotal {time.perf_counter() - t0:.0f}s, load {os.getloadavg()[0]:.2f} "
          "(other jobs on a shared machine add noise; compare ratios within one run)")


if __name__ == "__main__":
    main()
