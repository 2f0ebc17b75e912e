"""``scripts/gpu_run.sh`` runs end to end on a CPU (issue 31): the dry run of the GPU checks and benchmark.

A lent GPU machine gives a task 15 minutes; a script that breaks there wastes them. On a CPU the script must run
every check (those that need CUDA SKIP, saying so; the others run their code on small models and SKIP with their
numbers), run ``benchmarks/bench_gpu.py --tiny`` through all three runners eager and compiled, and leave exactly
one JSON and one log in ``$OUT``. A check or a runner that raises makes the script exit non-zero.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repo_paths import REPO

ROOT = Path(REPO)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script measures for minutes: it is the dry run")
def test_gpu_run_dry_run_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "GPU_RUN_WHEELS": str(tmp_path / "no_wheels"),
           "GPU_RUN_SITE": str(tmp_path / "site"), "CHECK_LIMIT": "900", "BENCH_LIMIT": "900",
           "GPU_RUN_BENCH_ARGS": "--steps 2 --warmup 1"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh")], env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert sorted(os.listdir(out)) == ["gpu_run.json", "gpu_run.log"]
    data = json.loads((out / "gpu_run.json").read_text())
    log = (out / "gpu_run.log").read_text()
    assert "=== checks: exit 0" in log and "=== bench: exit 0" in log

    checks = {c["name"]: c for c in data["checks"]["checks"]}
    # the 14 checks of ``gpu_check.py --list``: those that need CUDA are skipped under their table name, those that
    # run as a dry run report under their own name
    assert set(checks) == {"bf16 autocast tracks fp32", "fp16", "compile", "checkpointing", "tf32/empty_cache",
                           "async_save snapshot on CUDA", "host syncs (sync debug mode)",
                           "host syncs (sync debug mode), GA 2", "background save timing",
                           "memory metrics vs torch.cuda", "liger", "low-bit optimizers", "deepspeed ZeRO-2",
                           "deepspeed ZeRO-3"}
    assert len(checks) == 14 and {c["status"] for c in checks.values()} == {"SKIP"}
    assert checks["liger"]["detail"].startswith("needs CUDA")
    ran = {name for name, c in checks.items() if c["detail"].startswith("(dry run on CPU")}
    assert ran == {"bf16 autocast tracks fp32", "async_save snapshot on CUDA", "host syncs (sync debug mode)",
                   "host syncs (sync debug mode), GA 2", "background save timing", "memory metrics vs torch.cuda"}
    timing = checks["background save timing"]["numbers"]
    for mode in ("async", "sync"):  # the saves at 10, 20 and 30, each followed by a step, measured
        assert sorted(timing[mode]["blocked"], key=int) == ["10", "20", "30"]
    assert timing["async"]["wrong"] == [] and timing["async"]["saves"] == 3
    assert checks["host syncs (sync debug mode)"]["numbers"]["unexpected_steps"] == []

    bench = data["bench"]
    assert bench["errors"] == []
    rows = {(r["runner"], r["compiled"]): r for r in bench["rows"]}
    assert set(rows) == {(r, c) for r in ("plain", "hf", "cadence") for c in (False, True)}
    assert all(r["tokens_per_s"] > 0 and r["step_ms"] > 0 for r in rows.values())
    assert all(rows[(r, False)]["save_blocked_s"] is not None for r in ("plain", "hf", "cadence"))
    assert {(r["variant"], r["ratio"]) for r in bench["ratios"]} == {
        ("eager", "cadence/hf tokens/s"), ("eager", "cadence/plain tokens/s"), ("eager", "cadence/hf save blocked"),
        ("compiled", "cadence/hf tokens/s"), ("compiled", "cadence/plain tokens/s")}
    assert data["summary"]["failed_checks"] == [] and data["summary"]["check_counts"] == {"SKIP": 14}
