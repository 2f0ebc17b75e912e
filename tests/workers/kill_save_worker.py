"""Training script for test_kill_during_save.py: a save at every step, each one slow enough to be hit by a kill.

usage: kill_save_worker.py OUT [--slow WRITE_MS FSYNC_MS] [--resume]
       kill_save_worker.py --serve

``--slow`` sleeps WRITE_MS milliseconds before every ``torch.save`` and safetensors ``save_file`` and FSYNC_MS
before every ``os.fsync``, wherever the checkpoint writer calls them (on the training thread or on a background
thread): a save then lasts ~0.2 s and a kill can land before, between or inside its files. The wrappers are
installed before cadence is imported, so a ``from ... import`` binds them too; nothing of cadence is touched.
``--resume`` passes ``resume_from_checkpoint=True``.

Prints "LEFT a b ..." when training begins (the folders in OUT other than ``checkpoint-N``: what a killed save
left and the resume did not clear), "STEP n" at every step end; at the end writes OUT/final.pt (the weights) and
prints "DONE n".

``--serve`` is a fork server, because starting Python, torch and cadence costs ~3 s of CPU a run and the test
needs ~20 runs: it imports everything once, then for each JSON line {"argv": [...], "stdout": FIFO, "stderr":
FILE} on stdin forks a child that runs the script with that argv, its output into those files, and exits the
usual way (atexit handlers, non-daemon threads joined); the server prints "PID n", then "EXIT n CODE" (minus
the signal number when a signal ended it).
"""

import functools
import json
import os
import re
import sys
import time

import safetensors.torch
import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too

DELAY = {"write": 0.0, "fsync": 0.0}  # seconds; set per run by --slow


def slowed(function, kind):
    @functools.wraps(function)
    def slow(*args, **kwargs):
        if DELAY[kind]:
            time.sleep(DELAY[kind])  # before the call: a kill here finds the previous file complete, this one absent
        return function(*args, **kwargs)

    return slow


torch.save = slowed(torch.save, "write")
safetensors.torch.save_file = slowed(safetensors.torch.save_file, "write")
os.fsync = slowed(os.fsync, "fsync")

from test_resume import DropoutTagger, make_args  # noqa: E402
from tiny import TokenDataset, pad_collate  # noqa: E402

from cadence import Trainer, TrainerCallback  # noqa: E402


class Report(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):  # after a resume chose its checkpoint, before any save
        names = (n for n in os.listdir(args.output_dir) if os.path.isdir(os.path.join(args.output_dir, n)))
        print("LEFT", *sorted(n for n in names if not re.fullmatch(r"checkpoint-\d+", n)), flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        print(f"STEP {state.global_step}", flush=True)


def main(argv):
    out = argv[0]
    if "--slow" in argv:
        at = argv.index("--slow")
        DELAY["write"], DELAY["fsync"] = float(argv[at + 1]) / 1000, float(argv[at + 2]) / 1000
    # 22 rows, batch 2, GA 2: 18 steps over 3 epochs; AdamW, so optimizer.pt holds moments; dropout, so the RNG matters
    args = make_args(out, save_steps=1, save_total_limit=2)
    trainer = Trainer(DropoutTagger(), args, train_dataset=TokenDataset(22), data_collator=pad_collate,
                      callbacks=[Report()])
    result = trainer.train(resume_from_checkpoint=True if "--resume" in argv else None)
    torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, os.path.join(out, "final.pt"))
    print(f"DONE {result.global_step}", flush=True)


def serve():
    print("READY", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()  # nothing buffered may be written twice
        pid = os.fork()
        if pid == 0:  # the child: becomes the run, then exits the way a script does
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            os.dup2(os.open(request["stdout"], os.O_WRONLY), 1)  # a FIFO: opens once the test reads it
            main(request["argv"])
            sys.exit(0)
        print(f"PID {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"EXIT {pid} {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["--serve"] else main(sys.argv[1:])
