"""Start-up cost: import times and time to the first training step, each in a fresh process.

Commands are interleaved (torch, cadence, ..., torch, cadence, ...) ``--repeats`` times and the
wall time of each whole subprocess is taken; the table shows medians and the difference to
``import torch`` (cadence promises at most +0.3 s).

    .venv/bin/python benchmarks/bench_import.py
    .venv/bin/python benchmarks/bench_import.py --repeats 3 --skip-first-step
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

logger = logging.getLogger(__name__)

IMPORT_LIMIT_S = 0.3  # import cadence <= import torch + this (benchmarks/README.md, row (5))

IMPORTS = {
    "python (no imports)": "pass",
    "import torch": "import torch",
    "import cadence": "import cadence",
    "from cadence import Trainer": "from cadence import Trainer",
    "from transformers import Trainer": "from transformers import Trainer",
}

# a fresh process that imports, builds the tiny MLP trainer and trains one step
_FIRST_STEP = ("import sys, warnings; warnings.filterwarnings('ignore'); sys.path.insert(0, {here!r}); "
               "import common; common.first_step({runner!r})")
FIRST_STEPS = {f"first step: {r}": _FIRST_STEP.format(here=HERE, runner=r) for r in common.RUNNERS}


def time_command(code: str) -> float:
    """Wall seconds of ``python -c code`` in a fresh interpreter; raises if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed")
    return dt


def bench(commands: dict[str, str], repeats: int) -> dict[str, list[float]]:
    """Interleave the commands ``repeats`` times after one untimed warm-up pass (page cache).

    Returns:
        ``{label: [seconds, ...]}``; a command that fails maps to an empty list.
    """
    times: dict[str, list[float]] = {k: [] for k in commands}
    broken: set[str] = set()
    for rnd in range(repeats + 1):
        for label, code in commands.items():
            if label in broken:
                continue
            try:
                dt = time_command(code)
            except RuntimeError as e:
                print(f"[skip] {label}: {e}")
                broken.add(label)
                continue
            if rnd:  # round 0 warms the file cache
                times[label].append(dt)
    return times


def table(times: dict[str, list[float]], base: str) -> str:
    """Medians, difference to ``base``'s median, and noise."""
    b = common.median(times.get(base, []))
    rows = []
    for label, ts in times.items():
        if not ts:
            rows.append([label, "failed", "", "", ""])
            continue
        m = common.median(ts)
        check = ""
        if label in ("import cadence", "from cadence import Trainer"):
            check = "PASS" if m - b <= IMPORT_LIMIT_S else "MISS"
            check += f" (<= +{IMPORT_LIMIT_S:.1f})"
        rows.append([label, f"{m:.3f}", f"{m - b:+.3f}", f"{100 * common.spread(ts):.0f}", check])
    return common.format_table(["command (fresh process)", "median s", f"vs {base}", "spread %", "target"], rows)


def checks(times: dict[str, list[float]]) -> list[tuple[str, str, str, str]]:
    """The start-up promises, for ``run_all``'s summary.

    Returns:
        ``(row, promise, measured, "PASS"/"MISS")``: the imports within torch + 0.3 s, and cadence's
        import and first step faster than transformers'.
    """
    med = {k: common.median(v) for k, v in times.items() if v}
    out = []
    torch_s = med.get("import torch")
    for label in ("import cadence", "from cadence import Trainer"):
        if label in med and torch_s is not None:
            d = med[label] - torch_s
            out.append((label, f"<= import torch + {IMPORT_LIMIT_S:.1f} s", f"{d:+.3f} s",
                        "PASS" if d <= IMPORT_LIMIT_S else "MISS"))
    for ours, theirs in (("from cadence import Trainer", "from transformers import Trainer"),
                         ("first step: cadence", "first step: hf")):
        if ours in med and theirs in med:
            out.append((ours, "faster than HF", f"{med[ours]:.3f} vs {med[theirs]:.3f} s",
                        "PASS" if med[ours] < med[theirs] else "MISS"))
    return out


def main(argv: list[str] | None = None) -> dict:
    """Parse flags, run, print the tables. Returns the raw times."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-first-step", action="store_true", help="only the import timings")
    a = p.parse_args(argv)

    print(f"bench_import: {sys.executable}, {os.cpu_count()} CPUs, repeats {a.repeats}", flush=True)
    times = bench(IMPORTS, a.repeats)
    print(table(times, "import torch"))
    if not a.skip_first_step:
        print()
        first = bench(FIRST_STEPS, a.repeats)
        print(table(first, "first step: plain"))
        times.update(first)
    return times


if __name__ == "__main__":
    main()
