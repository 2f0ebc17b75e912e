"""Run by test_output_guard.py: in each round, take that round's output_dir lock at a signal, say whether it got it,
hold it until told, release it.

usage: lock_worker.py BASE ROUNDS [--no-fcntl]

Round r uses BASE/round{r}/run, waits for BASE/round{r}/go, prints GOT or REFUSED, keeps what it got until
BASE/round{r}/release exists. Prints READY once imported. --no-fcntl: the exclusive-create fallback (as where fcntl
is missing)."""

import os
import sys
import time

from cadence import output_guard


def wait_for(path: str) -> None:
    deadline = time.time() + 120
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.0005)


def main(base: str, rounds: str) -> None:
    if "--no-fcntl" in sys.argv:
        output_guard.fcntl = None
    print("READY", flush=True)
    for r in range(int(rounds)):
        folder = os.path.join(base, f"round{r}")
        lock = output_guard.OutputDirLock(os.path.join(folder, "run"))
        wait_for(os.path.join(folder, "go"))
        try:
            lock.acquire()
            print("GOT", flush=True)
        except ValueError as e:
            print("REFUSED", e, flush=True)
        wait_for(os.path.join(folder, "release"))
        lock.release(remove_created_dir=False)


if __name__ == "__main__":
    main(*sys.argv[1:3])
