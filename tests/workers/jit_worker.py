"""Training script for test_jit_signals.py: dataloader workers, enable_jit_checkpoint, one signal to the group.

usage: jit_worker.py OUT [--signal NAME STEP] [--resume] [--fail-at STEP]
At step STEP signal NAME goes to the script's whole process group (itself and its dataloader
workers), as SLURM and other schedulers send it: from another process (os.killpg in a child of its own
session, so it is not hit itself), since
torch's workers quietly exit on a SIGTERM from their own parent but die of one from anyone else. Prints one JSON line, writes OUT/final.pt after a full
run, and exits as the README says a requeued script should: 128 + the signal's number when interrupted.
"""

import json
import os
import signal
import subprocess
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too

from test_resume import DropoutTagger, make_args  # noqa: E402
from tiny import TokenDataset, pad_collate  # noqa: E402

from cadence import Trainer, TrainerCallback  # noqa: E402


class SignalGroup(TrainerCallback):
    def __init__(self, name, step):
        self.signum, self.step = getattr(signal, name), step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:  # returns once the signal is sent: the main process has it by then
            subprocess.run([sys.executable, "-c", "import os, sys; os.killpg(int(sys.argv[1]), int(sys.argv[2]))",
                            str(os.getpgid(0)), str(int(self.signum))], check=True, start_new_session=True)


class FailAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError(f"failing at step {self.step} on purpose")


def main():
    out = sys.argv[1]
    callbacks = []
    if "--signal" in sys.argv:
        i = sys.argv.index("--signal")
        callbacks.append(SignalGroup(sys.argv[i + 1], int(sys.argv[i + 2])))
    if "--fail-at" in sys.argv:
        callbacks.append(FailAt(int(sys.argv[sys.argv.index("--fail-at") + 1])))
    args = make_args(out, dataloader_num_workers=2, enable_jit_checkpoint=True, num_train_epochs=2)
    trainer = Trainer(DropoutTagger(), args, train_dataset=TokenDataset(22), data_collator=pad_collate,
                      callbacks=callbacks)
    result = trainer.train(resume_from_checkpoint=True if "--resume" in sys.argv else None)
    print(json.dumps({"global_step": result.global_step, "interrupted_metric": result.metrics.get("interrupted"),
                      "state_interrupted": trainer.state.interrupted, "listing": sorted(os.listdir(out))}), flush=True)
    if trainer.state.interrupted:  # a checkpoint was saved: skip the final save, let the scheduler requeue
        sys.exit(128 + callbacks[0].signum)
    torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, os.path.join(out, "final.pt"))


if __name__ == "__main__":
    main()
