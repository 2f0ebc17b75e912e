"""Training script for test_crash.py: resumes from the newest checkpoint in OUT if there is one.

usage: crash_worker.py OUT [--kill-in-save STEP] [--jit]
Prints "STEP n" after every step; at the end writes OUT/final.pt (the weights) and prints "DONE n".
"""

import os
import signal
import sys
import time

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too

from test_resume import DropoutTagger, make_args  # noqa: E402
from tiny import TokenDataset, pad_collate  # noqa: E402

from cadence import Trainer, TrainerCallback, get_last_checkpoint  # noqa: E402
from cadence.checkpoint import save_load  # noqa: E402


class Report(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print(f"STEP {state.global_step}", flush=True)
        time.sleep(0.02)  # widen the window for a kill to land anywhere in a step or a save


def main():
    out = sys.argv[1]
    kill_at = int(sys.argv[sys.argv.index("--kill-in-save") + 1]) if "--kill-in-save" in sys.argv else None
    args = make_args(out, save_steps=1, save_total_limit=3, enable_jit_checkpoint="--jit" in sys.argv)
    trainer = Trainer(DropoutTagger(), args, train_dataset=TokenDataset(22), data_collator=pad_collate,
                      callbacks=[Report()])
    if kill_at is not None:  # die half-way through writing checkpoint-{kill_at}: after the optimizer, before the state
        real = save_load.save_json

        def dying_save_json(obj, path):
            real(obj, path)
            # the folder being written (whatever its staging name), not trainer.state: with async_save the
            # background thread writes checkpoint-N while the training thread is steps further
            if os.path.basename(os.path.dirname(path)).endswith(f"checkpoint-{kill_at}"):
                os.kill(os.getpid(), signal.SIGKILL)

        save_load.save_json = dying_save_json
    resume = os.path.isdir(out) and get_last_checkpoint(out) is not None
    result = trainer.train(resume_from_checkpoint=True if resume else None)
    if trainer.state.global_step == trainer.state.max_steps:
        torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, os.path.join(out, "final.pt"))
    print(f"DONE {result.global_step}", flush=True)


if __name__ == "__main__":
    main()
