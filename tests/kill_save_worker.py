"""Training script for test_kill_during_save.py: a save at every step, each one slow enough to be hit by a kill.

usage: kill_save_worker.py OUT [--slow MS] [--resume]

``--slow MS`` sleeps MS milliseconds before every ``os.fsync``, ``torch.save`` and safetensors ``save_file``,
wherever the checkpoint writer calls them (the training thread today, a background thread once saves are
asynchronous): a save then takes tens of milliseconds, and a kill can land before, between or inside its files.
The wrappers are installed before cadence is imported, so even a ``from ... import`` binds the slow versions;
nothing of cadence's internals is touched. ``--resume`` passes ``resume_from_checkpoint=True``.
Prints "STEP n" at every step end; at the end writes OUT/final.pt (the weights) and prints "DONE n".
"""

import functools
import os
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


def slow_down(milliseconds: float) -> None:
    seconds = milliseconds / 1000
    os.fsync = slowed(os.fsync, seconds)
    torch.save = slowed(torch.save, seconds)
    safetensors.torch.save_file = slowed(safetensors.torch.save_file, seconds)


if "--slow" in sys.argv:
    slow_down(float(sys.argv[sys.argv.index("--slow") + 1]))

from test_resume import DropoutTagger, make_args  # noqa: E402
from tiny import TokenDataset, pad_collate  # noqa: E402

from cadence import Trainer, TrainerCallback  # noqa: E402


class Report(TrainerCallback):
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
