"""Run every benchmark and print its tables (``make bench``).

    .venv/bin/python benchmarks/run_all.py            # full: about 3-4 minutes on 2 cores
    .venv/bin/python benchmarks/run_all.py --quick    # about 1.5 minutes
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

import bench_import  # noqa: E402
import bench_loop  # noqa: E402

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    """Run the import benchmark in fresh processes, then the loop benchmark in this one."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    p.add_argument("--workloads", default="mlp,gpt2")
    a = p.parse_args(argv)

    t0 = time.perf_counter()
    print(f"# cadence benchmarks, {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.platform()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}\n")
    print("## start-up")
    # before the loop benchmark: this process must not hold the CPUs while the subprocesses run
    bench_import.main(["--repeats", "3" if a.quick else "5"])
    print("\n## train() loop")
    loop_args = ["--workloads", a.workloads] + (["--quick"] if a.quick else [])
    bench_loop.main(loop_args)
    print(f"\ntotal {time.perf_counter() - t0:.0f}s, load {os.getloadavg()[0]:.2f} "
          "(other jobs on a shared machine add noise; compare ratios within one run)")


if __name__ == "__main__":
    main()
