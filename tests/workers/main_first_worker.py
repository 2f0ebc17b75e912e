"""Run under torchrun with 2 processes: each records when it enters and leaves a main_process_first block."""

import json
import os
import sys
import time

from cadence import TrainingArguments

folder = sys.argv[1]
args = TrainingArguments(os.path.join(folder, "out"), use_cpu=True, ddp_backend="gloo")
rank = args.process_index


def record(what, **extra):
    with open(os.path.join(folder, f"events_{rank}.jsonl"), "a") as f:
        f.write(json.dumps({"rank": rank, "what": what, "time": time.time(), **extra}) + "\n")


with args.main_process_first(desc="building the cache"):
    record("enter", saw_cache=os.path.exists(os.path.join(folder, "cache")))
    if rank == 0:  # the slow first pass the others must wait for (e.g. datasets.map writing its cache)
        time.sleep(1.5)
        with open(os.path.join(folder, "cache"), "w") as f:
            f.write("ready")
    record("leave")

# Trainer.end() at the very end of a script: the process group is destroyed
import torch  # noqa: E402

from cadence import Trainer  # noqa: E402

trainer = Trainer(model=torch.nn.Linear(1, 1), args=args)
was = torch.distributed.is_initialized()
trainer.end()
record("ended", initialized_before=was, initialized_after=torch.distributed.is_initialized())
