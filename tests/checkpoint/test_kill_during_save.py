"""SIGKILL while a checkpoint is being written, at many random moments: every ``checkpoint-N`` folder left on
disk is complete, the newest complete one is what ``get_last_checkpoint`` finds, resuming from it ends with
weights ``torch.equal`` to a run never killed, and the resumed run clears the killed save's leftovers.

Judged only by files on disk and by resuming real training processes (tests/workers/kill_save_worker.py, forked from a
server that imported torch and cadence once), never by the writer's internals, so it holds for synchronous saves
and for saves written by a background thread alike.
The worker saves at every step and sleeps a little before each fsync / ``torch.save`` / safetensors write, so a
save lasts ~0.2 s and most kills land inside one: before, between or inside its files, or in the rotation.
"""

import concurrent.futures
import contextlib
import importlib
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field

import pytest
import torch

from cadence import get_last_checkpoint
from repo_paths import TESTS, WORKERS

HERE = TESTS
CHECKPOINT = re.compile(r"checkpoint-(\d+)")
# milliseconds before each file write (5 a save) and each fsync (~11 a save): a save lasts ~0.2 s on this CPU,
# most of it with some of its files written and the rest not
SLOW_MS = ("25", "5")
KILLS = 12
SEED = 21


def verifier():
    """cadence's checkpoint verifier, wherever the checkpoint package keeps it (it is being split into layers)."""
    for module in ("cadence.checkpoint.manifest", "cadence.checkpoint"):
        try:
            return getattr(importlib.import_module(module), "verify_checkpoint")
        except (ImportError, AttributeError):
            continue
    raise AssertionError("no verify_checkpoint in cadence.checkpoint(.manifest)")


class Server:
    """A ``kill_save_worker.py --serve`` process: each run is a process forked from it, with Python, torch and
    cadence already imported (~3 s of CPU saved a run)."""

    def __init__(self, tmp_path, name):
        src = os.path.join(os.path.dirname(HERE), "src")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([HERE, src])}
        self.tmp_path, self.log = tmp_path, tmp_path / f"{name}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, os.path.join(WORKERS, "kill_save_worker.py"), "--serve"],
                                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.proc.stdout.readline() == "READY\n", self.log.read_text()[-3000:]

    @contextlib.contextmanager
    def run(self, name, *argv):
        """A training run ``kill_save_worker.py *argv``: yields it (``pid``, ``lines``: its output, line by line);
        its exit code (minus the signal number) is in ``returncode`` afterwards."""
        fifo, log = self.tmp_path / f"{name}.out", self.tmp_path / f"{name}.log"
        os.mkfifo(fifo)
        request = {"argv": [str(a) for a in argv], "stdout": str(fifo), "stderr": str(log)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        run = types.SimpleNamespace(pid=int(self.proc.stdout.readline().split()[1]), log=log)
        try:
            with open(fifo) as run.lines:  # opens once the child has opened its end
                yield run
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.kill(run.pid, signal.SIGKILL)  # a test failing half-way leaves no run behind
            raise
        finally:
            pid, run.returncode = map(int, self.proc.stdout.readline().split()[1:])  # "EXIT pid code"
            assert pid == run.pid

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def steps(run, left=None):
    """The run's step numbers as it reports them (``STEP n``), until ``DONE``. ``left`` gets the leftover
    folders it found when training began (``LEFT ...``)."""
    for line in run.lines:
        if line.startswith("STEP "):
            yield int(line.split()[1])
        elif line.startswith("LEFT") and left is not None:
            left.extend(line.split()[1:])


def complete_checkpoints(out):
    """{step: folder} of the ``checkpoint-N`` folders in ``out``, asserting that each one is complete and intact."""
    verify = verifier()
    found = {}
    for name in os.listdir(out):
        match = CHECKPOINT.fullmatch(name)
        if match:
            folder = os.path.join(out, name)
            marker = os.path.join(folder, "trainer_state.json")
            assert os.path.isfile(marker), f"{name} is incomplete: {os.listdir(folder)}"
            verify(folder)  # every file as the manifest says: no truncated or missing file under a final name
            found[int(match.group(1))] = folder
    return found


def leftovers(out):
    """Folders that are not ``checkpoint-N`` (a killed save's staging folder, a killed rotation's ``deleting-``)."""
    return sorted(n for n in os.listdir(out) if os.path.isdir(os.path.join(out, n)) and not CHECKPOINT.fullmatch(n))


def final_weights(out):
    return torch.load(os.path.join(out, "final.pt"), weights_only=True)


@dataclass
class Kill:
    index: int
    step: int  # killed after the worker reported the end of this step
    delay: float  # seconds after that report
    out: str = ""
    newest: int = 0  # the newest complete checkpoint left
    left: dict = field(default_factory=dict)  # leftover folder -> how many files it held, right after the kill
    files: dict = field(default_factory=dict)  # checkpoint step -> its file names, right after the kill


def kill_once(kill, servers, tmp_path):
    kill.out = str(tmp_path / f"killed-{kill.index}")
    with servers.use() as server, server.run(f"killed-{kill.index}", kill.out, "--slow", *SLOW_MS) as run:
        for step in steps(run):
            if step == kill.step:
                time.sleep(kill.delay)
                os.kill(run.pid, signal.SIGKILL)
                break
    assert run.returncode == -signal.SIGKILL, run.log.read_text()[-3000:]
    kill.left = {n: len(os.listdir(os.path.join(kill.out, n))) for n in leftovers(kill.out)}
    checkpoints = complete_checkpoints(kill.out)
    newest = get_last_checkpoint(kill.out)
    assert newest == checkpoints[max(checkpoints)], (newest, sorted(checkpoints))
    kill.newest = max(checkpoints)
    kill.files = {step: sorted(os.listdir(folder)) for step, folder in checkpoints.items()}
    # the save of step k-1 may still be in flight when step k ends (asynchronous saves); the one before is done
    assert kill.newest >= kill.step - 2, (kill, sorted(checkpoints))
    return kill


def resume(kill, servers):
    """Resume the killed run in its own output_dir (full speed): the first step it trained, the leftovers it
    still saw when training began, its final weights."""
    left = []
    with servers.use() as server, server.run(f"resumed-{kill.index}", kill.out, "--resume") as run:
        trained = list(steps(run, left))
    assert run.returncode == 0, run.log.read_text()[-3000:]
    return trained[0], left, final_weights(kill.out)


def run_unbroken(servers, tmp_path):
    out = tmp_path / "unbroken"
    with servers.use() as server, server.run("unbroken", out) as run:
        assert list(steps(run)) == list(range(1, 19))
    assert run.returncode == 0, run.log.read_text()[-3000:]
    return (final_weights(out), sorted(n for n in os.listdir(out) if not CHECKPOINT.fullmatch(n)),
            sorted(os.listdir(out / "checkpoint-18")))


class Servers:
    """Two fork servers, one per run in flight: two runs at a time on a 2-core machine."""

    def __init__(self, tmp_path, count=2):
        self.free = queue.Queue()
        for i in range(count):
            self.free.put(Server(tmp_path, f"server-{i}"))

    @contextlib.contextmanager
    def use(self):
        server = self.free.get()
        try:
            yield server
        finally:
            self.free.put(server)

    def close(self):
        while not self.free.empty():
            self.free.get().close()


@pytest.mark.slow
def test_kills_during_checkpoint_writes_leave_the_newest_complete_checkpoint_resumable(tmp_path):
    rng = random.Random(SEED)
    # steps 3..12 of 18 (saves with and without a rotation, across the epoch ends at 6 and 12); the delay spans a
    # whole save (~0.2 s) from the step's end, when the save of that step begins
    kills = [Kill(i, rng.randint(3, 12), rng.uniform(0.0, 0.2)) for i in range(KILLS)]
    servers = Servers(tmp_path)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            unbroken = pool.submit(run_unbroken, servers, tmp_path)
            kills = list(pool.map(lambda k: kill_once(k, servers, tmp_path), kills))
            expected, run_files, checkpoint_files = unbroken.result()
            # resume once per distinct newest checkpoint (the same files give the same run), preferring a run with
            # leftovers so that their clean-up is seen
            chosen = {}
            for kill in sorted(kills, key=lambda k: not k.left):
                chosen.setdefault(kill.newest, kill)
            resumed = list(zip(chosen.values(), pool.map(lambda k: resume(k, servers), chosen.values())))
    finally:
        servers.close()

    in_write = [k for k in kills if any(not n.startswith("deleting-") for n in k.left)]
    in_rotation = [k for k in kills if any(n.startswith("deleting-") for n in k.left)]
    print(f"\n{len(kills)} kills: {len(in_write)} left a checkpoint being written, {len(in_rotation)} a rotation "
          f"being deleted; (step, delay ms, newest complete, leftover: files) "
          f"{[(k.step, round(k.delay * 1000), k.newest, k.left) for k in kills]}; {len(resumed)} resumed")
    assert len(in_write) >= KILLS // 2  # the point is to hit the writes
    for kill in kills:  # a complete checkpoint holds every file an unbroken run's does, not just the marker
        assert all(files == checkpoint_files for files in kill.files.values()), (kill, checkpoint_files)
    assert any(k.left for k, _ in resumed)

    for kill, (first_step, left, weights) in resumed:
        assert first_step == kill.newest + 1  # resumed from the newest complete checkpoint
        # cleared when the run resumed, not only when a save of the same step happens to reuse the folder's name
        assert left == [], (kill, left)
        for name, value in expected.items():
            assert torch.equal(weights[name], value), (kill, name)
        complete_checkpoints(kill.out)
        assert leftovers(kill.out) == [] and sorted(
            n for n in os.listdir(kill.out) if not CHECKPOINT.fullmatch(n)) == run_files
