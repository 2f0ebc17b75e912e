"""Run by test_ddp_resume.py under ``torchrun --standalone --max-restarts 1``: cadence starts the process group
(``Backend``), the two processes all-reduce, and in the first attempt process 1 SIGKILLs itself. In the restarted
attempt process 1 starts its group DELAY seconds after process 0: process 0 reads torchrun's store (one for every
attempt) before process 1 has written its address there again. usage: restart_connect_worker.py OUT_DIR DELAY

Each attempt says ``ATTEMPT restart R rank K sum S`` once its all-reduce is done; a restarted one adds how many keys
the killed attempt had left in torchrun's store and whether its own group's setup left them all as they were."""

import os
import signal
import sys
import time
from datetime import timedelta

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from dist_exit import finish, say  # noqa: E402

from cadence import TrainingArguments  # noqa: E402
from cadence.backend import Backend  # noqa: E402


def main(out: str, delay: float) -> None:
    restart, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], int(os.environ["RANK"])
    store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                       timeout=timedelta(seconds=60))  # torchrun's own store, the one the group uses
    if restart != "0" and rank == 1:
        time.sleep(delay)
    left = {key: store.get(key) for key in store.list_keys()}  # what earlier attempts wrote
    args = TrainingArguments(out, use_cpu=True, ddp_timeout=60, report_to="none")
    Backend(args)
    total = torch.tensor([rank + 1.0])
    torch.distributed.all_reduce(total)
    untouched = all(store.get(key) == value for key, value in left.items())
    say(f"ATTEMPT restart {restart} rank {rank} sum {total.item():g} earlier keys {len(left)} untouched {untouched}")
    if restart == "0" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    torch.distributed.barrier()  # process 0 of the first attempt waits here until torchrun stops it


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
    finish()
