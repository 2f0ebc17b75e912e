"""TRL on both bases: ``train()`` time of SFTTrainer and DPOTrainer on transformers' Trainer and on cadence's
(``cadence.patch_transformers()`` before ``import trl``), each run in a fresh process (a patch cannot be undone).

The work is ``tests/workers/trl_worker.py``'s: a tiny Llama from a config, a word-level tokenizer, local data, float32
(``*_fp32``), ``--steps`` optimizer steps. Rounds are interleaved (transformers, cadence, transformers, ...); the
time is the ``train_runtime`` each run logs (``train()`` only: not the imports, not TRL's dataset preparation);
the verdict is the median over rounds of cadence / transformers (cadence promises <= 1.0x).

    .venv/bin/python benchmarks/bench_libraries.py               # 5 rounds, about 4 minutes on 2 idle cores
    .venv/bin/python benchmarks/bench_libraries.py --repeats 2 --steps 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import common  # noqa: E402

TARGET = 1.0  # cadence's train() time <= transformers'
CASES = {"SFT": "sft_text_fp32", "DPO": "dpo_ref_fp32"}


def train_runtime(case: str, cadence: bool, steps: int) -> float:
    import torch

    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "tests"), os.path.join(ROOT, "src")])}
        cmd = [sys.executable, os.path.join(ROOT, "tests", "workers", "trl_worker.py"), case, out, "--max-steps", str(steps)]
        proc = subprocess.run(cmd + (["--cadence"] if cadence else []), env=env, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{case} on {'cadence' if cadence else 'transformers'} failed:\n{proc.stderr[-3000:]}")
        result = torch.load(os.path.join(out, "result.pt"))
    return next(v for _, k, v in result["losses"] if k == "train_runtime")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args(argv)
    times: dict = {name: {"hf": [], "cadence": []} for name in CASES}
    for _ in range(a.repeats):
        for name, case in CASES.items():
            times[name]["hf"].append(train_runtime(case, False, a.steps))
            times[name]["cadence"].append(train_runtime(case, True, a.steps))
    rows = []
    for name, t in times.items():
        ratios = [c / h for c, h in zip(t["cadence"], t["hf"])]
        rows.append([name, f"{statistics.median(t['hf']):.3f}", f"{statistics.median(t['cadence']):.3f}",
                     f"{statistics.median(ratios):.3f}x"])
    print(common.format_table(["trainer", "transformers train() s", "cadence train() s", "cadence / transformers"],
                              rows))
    return times


def checks(times: dict) -> list[list[str]]:
    """``[benchmark, promise, measured, verdict]`` per trainer, for run_all's summary."""
    out = []
    for name, t in times.items():
        ratio = statistics.median(c / h for c, h in zip(t["cadence"], t["hf"]))
        out.append([f"TRL {name}", f"cadence <= {TARGET:.1f}x transformers", f"{ratio:.3f}x",
                    "PASS" if ratio <= TARGET else "MISS"])
    return out


if __name__ == "__main__":
    main()
