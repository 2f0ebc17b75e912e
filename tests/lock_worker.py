"""Run by test_output_guard.py: take an output_dir's lock at a signal, say whether it got it, hold it until told.

usage: lock_worker.py OUT_DIR GO_FILE RELEASE_FILE [--no-fcntl]

Prints READY once imported, then GOT or REFUSED once GO_FILE exists (all workers at once), and keeps what it got
until RELEASE_FILE exists. --no-fcntl: the exclusive-create fallback (as where fcntl is missing)."""

import os
import sys
import time

from cadence import output_guard


def wait_for(path: str) -> None:
    deadline = time.time() + 120
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.0005)


def main(out: str, go: str, release: str) -> None:
    if "--no-fcntl" in sys.argv:
        output_guard.fcntl = None
    lock = output_guard.OutputDirLock(out)
    print("READY", flush=True)
    wait_for(go)
    try:
        lock.acquire()
        print("GOT", flush=True)
    except ValueError as e:
        print("REFUSED", e, flush=True)
    wait_for(release)
    lock.release(remove_created_dir=False)


if __name__ == "__main__":
    main(*sys.argv[1:4])
