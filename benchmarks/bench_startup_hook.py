"""What cadence's start-up hook (``cadence_patch.pth``) costs a Python process that did not ask for it.

Builds a throwaway venv (no pip, the running interpreter's packages reached through a plain path line), installs
this checkout into it as ``pip install -e .`` does, and times ``python -c pass`` in it with and without
``cadence_patch.pth`` (the file moved aside between runs), interleaved ``--repeats`` times; the table shows medians and
their ratio. With ``CADENCE_PATCH_TRANSFORMERS`` unset the hook is one line that reads the variable (``os`` is already
imported by ``site``); the third row is a process that asked for it (``cadence.patch`` imported, nothing of
transformers until a trainer module is imported).

    .venv/bin/python benchmarks/bench_startup_hook.py --repeats 30
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTH = "cadence_patch.pth"


def make_venv(folder: str, editable: bool = True) -> str:
    """A venv in ``folder`` with this checkout installed (``-e`` unless ``editable`` is False); returns its python.
    The running interpreter's site-packages (torch, setuptools, ...) are reached through a plain path line, whose
    folder's own .pth files Python does not run."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", folder], check=True)
    python = os.path.join(folder, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "zz_outer_site_packages.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                    "--no-build-isolation", *(["-e"] if editable else []), ROOT], check=True, capture_output=True)
    return python


def time_once(python: str, env: dict) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, from wait4: steadier than wall time on a shared machine)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "-c", "pass"], env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, proc.returncode
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    opts = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("CADENCE_PATCH_TRANSFORMERS", "PYTHONPATH")}
    with tempfile.TemporaryDirectory() as tmp:
        python = make_venv(os.path.join(tmp, "venv"))
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        pth, aside = os.path.join(site, PTH), os.path.join(tmp, PTH)
        assert os.path.exists(pth), f"{PTH} was not installed into {site}"
        labels = ["without cadence_patch.pth", "with cadence_patch.pth, variable unset",
                  "with cadence_patch.pth, CADENCE_PATCH_TRANSFORMERS=1"]
        rows: dict[str, list[tuple[float, float]]] = {label: [] for label in labels}
        for _ in range(2):  # warm the page cache
            time_once(python, env)
        order = random.Random(0)
        for _ in range(opts.repeats):
            for label in order.sample(labels, len(labels)):  # a new order each round: no position bias
                if label == labels[0]:
                    shutil.move(pth, aside)
                try:
                    rows[label].append(time_once(python, {**env, "CADENCE_PATCH_TRANSFORMERS": "1"}
                                                 if label == labels[2] else env))
                finally:
                    if label == labels[0]:
                        shutil.move(aside, pth)
        # the hook's own cost, without the noise of whole processes: site processing the one file, in-process
        direct = subprocess.run([python, "-c", f"import site, time, timeit; print(timeit.timeit(lambda: site.addpackage("
                                               f"{site!r}, {PTH!r}, set()), number=2000, timer=time.process_time)"
                                               " / 2000)"],
                                env=env, check=True, capture_output=True, text=True).stdout.strip()
    base = [statistics.median(t[i] for t in rows[labels[0]]) for i in (0, 1)]
    print(f"python -c pass, median of {opts.repeats} (interleaved, random order)      wall          cpu")
    for label, times in rows.items():
        wall, cpu = (statistics.median(t[i] for t in times) for i in (0, 1))
        print(f"  {label:<55} {wall * 1e3:6.1f} ms {wall / base[0]:.3f}x  {cpu * 1e3:6.1f} ms {cpu / base[1]:.3f}x")
    print(f"site.addpackage({PTH}) in-process, variable unset: {float(direct) * 1e6:.0f} us CPU "
          f"({float(direct) / base[1]:.1%} of a start-up's CPU time)")


if __name__ == "__main__":
    main()
