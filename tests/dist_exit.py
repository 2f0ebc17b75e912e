"""The ending every multi-process test worker shares (end the process group, then say so), the tests' check of
it, and how the tests launch a worker (torchrun, or plain python for one process)."""

import atexit
import faulthandler
import gc
import os
import re
import subprocess
import sys
import tempfile

import torch
from repo_paths import script_path

faulthandler.enable()  # a worker that aborts (SIGABRT) prints every thread's Python stack: where it was


SAID = "CADENCE_TEST_SAID"  # a folder where each process also writes what it says, one file a rank


def say(line: str) -> None:
    """Print a line, and write it to this rank's own file when :func:`launch` started the process. Tests read
    the files (``proc.said``), never the merged stdout: under load, two processes writing into torchrun's one pipe
    have lost or merged lines (another process's unterminated text before a line)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    folder = os.environ.get(SAID)
    if folder:
        with open(os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.txt"), "a") as f:
            f.write(line + "\n")


def finish() -> None:
    """End the process group before exit (cadence does too, at exit) and print ``FINISHED rank R``, which
    the tests count: a worker that aborts in its teardown never prints it."""
    rank = 0
    if torch.distributed.is_initialized():
        rank = torch.distributed.get_rank()
        gc.collect()  # the finished Trainer (reference cycles) and its DDP wrapper let go of the group first
        torch.distributed.destroy_process_group()
    say(f"FINISHED rank {rank}")


def finish_at_exit() -> None:
    """Leave ending the process group to cadence, and check at exit that it did: this hook is registered
    before the Trainer registers its own, and atexit runs the last registered first."""

    def check() -> None:
        if torch.distributed.is_initialized():
            say("PROCESS GROUP LEFT OPEN")
        else:
            say(f"FINISHED rank {os.environ.get('RANK', '0')}")

    atexit.register(check)


def assert_finished(proc, nproc):
    """Every worker ended its process group and got to its last line, and the launcher exited 0 (a worker
    aborting in its teardown after writing its results is a failure too, not a pass on the results alone)."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert_ranks_finished(proc, nproc)
    assert "terminate called" not in proc.stderr, proc.stderr[-3000:]


def assert_ranks_finished(proc, nproc):
    """Every rank got to its last line (printed FINISHED). Alone, the check of a reference run on transformers, whose
    teardown is not under test: under load, a library thread of transformers' stack has aborted a rank (SIGABRT)
    after it printed FINISHED and wrote its results; cadence's own runs are held to :func:`assert_finished`."""
    text = "\n".join(proc.said) if hasattr(proc, "said") else proc.stdout  # each rank's own file where there is one
    assert sorted(re.findall(r"FINISHED rank \d+", text)) == [f"FINISHED rank {r}" for r in range(nproc)], (
        proc.stdout[-2000:] + proc.stderr[-4000:])


HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def worker_env(env=None):
    """The environment of a worker: this checkout's cadence first on the path (even beside another install), with
    tests/ for the shared helpers, one thread per process (the suite's machines are shared), and ``env``. Without
    cadence's mark (``CADENCE_PATCH_TRANSFORMERS``, set by ``cadence run``/``patch_transformers()``) unless ``env``
    sets it: a reference run on transformers must stay on transformers."""
    base = {k: v for k, v in os.environ.items() if k != "CADENCE_PATCH_TRANSFORMERS"}
    return {**base, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([HERE, SRC]), **(env or {})}


def launch(script, *args, nproc=2, env=None, torchrun=(), timeout=300, **run_kwargs):
    """Run tests/workers/``script`` with ``args`` on ``nproc`` processes: ``torchrun --standalone`` with the extra flags
    ``torchrun``, or plain python for one (and no flags); waits, capturing its text output; returns the CompletedProcess
    with ``said``: the lines the processes said (``run_kwargs``, e.g. ``cwd``, go to subprocess.run)."""
    cmd = [sys.executable, script_path(script), *map(str, args)]
    if nproc > 1 or torchrun:
        cmd[1:1] = ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone", *torchrun]
    with tempfile.TemporaryDirectory(prefix="said-") as said:
        proc = subprocess.run(cmd, env=worker_env({SAID: said, **(env or {})}), capture_output=True, text=True,
                              timeout=timeout, **run_kwargs)
        proc.said = said_lines(said)
    return proc


def said_lines(folder) -> list[str]:
    """The lines every rank said (:func:`say`), rank 0's first, each rank's in its order."""
    names = sorted(os.listdir(folder), key=lambda n: int(n[4:-4]))
    return [line for n in names for line in open(os.path.join(folder, n)).read().splitlines()]
