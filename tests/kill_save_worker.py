"""Training script for test_kill_during_save.py: a save at every step, each one slow enough to be hit by a kill.

usage: kill_save_worker.py OUT [--slow WRITE_MS FSYNC_MS] [--resume]

``--slow`` sleeps WRITE_MS milliseconds before every ``torch.save`` and safetensors ``save_file`` and FSYNC_MS
before every ``os.fsync``, wherever the checkpoint writer calls them (the training thread today, a background thread once saves are
asynchronous): a save then takes tens of milliseconds, and a kill can land before, between or inside its files.
The wrappers are installed before cadence is imported, so even a ``from ... import`` binds the slow versions;
nothing of cadence's internals is touched. ``--resume`` passes ``resume_from_checkpoint=True``.
Prints "LEFT a b ..." at the start of training: the folders in OUT other than ``checkpoint-N`` (what a killed
save left and a resume did not clear), "STEP n" at every step end; at the end writes OUT/final.pt (the weights) and prints "DONE n".
"""

import functools
import os
import re
import sys
import time

import safetensors.torch
import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def slowed(function, seconds):
    @functools.wraps(function)
    def slow(*args, **kwargs):
        time.sleep(seconds)  # before the call: a kill here finds the previous file complete and this one absent
        return function(*args, **kwargs)

    return slow


def slow_down(write_ms: float, fsync_ms: float) -> None:
    torch.save = slowed(torch.save, write_ms / 1000)
    safetensors.torch.save_file = slowed(safetensors.torch.save_file, write_ms / 1000)
    os.fsync = slowed(os.fsync, fsync_ms / 1000)


if "--slow" in sys.argv:
    at = sys.argv.index("--slow")
    slow_down(float(sys.argv[at + 1]), float(sys.argv[at + 2]))

from test_resume import DropoutTagger, make_args  # noqa: E402
from tiny import TokenDataset, pad_collate  # noqa: E402

from cadence import Trainer, TrainerCallback  # noqa: E402


class Report(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):  # after a resume chose its checkpoint, before any save
        names = (n for n in os.listdir(args.output_dir) if os.path.isdir(os.path.join(args.output_dir, n)))
        print("LEFT", *sorted(n for n in names if not re.fullmatch(r"checkpoint-\d+", n)), flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        print(f"STEP {state.global_step}", flush=True)


def main():
    out = sys.argv[1]
    # 22 rows, batch 2, GA 2: 18 steps over 3 epochs; AdamW, so optimizer.pt holds moments; dropout, so the RNG matters
    args = make_args(out, save_steps=1, save_total_limit=2)
    trainer = Trainer(DropoutTagger(), args, train_dataset=TokenDataset(22), data_collator=pad_collate,
                      callbacks=[Report()])
    result = trainer.train(resume_from_checkpoint=True if "--resume" in sys.argv else None)
    torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, os.path.join(out, "final.pt"))
    print(f"DONE {result.global_step}", flush=True)


if __name__ == "__main__":
    main()
