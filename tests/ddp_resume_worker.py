"""Run by test_ddp_resume.py under torchrun: train (optionally stopping at a step, or resuming) and
write the final weights. usage: ddp_resume_worker.py OUT_DIR [--stop N] [--resume] [--sigterm-rank0 N]

--sigterm-rank0 N: process 0 alone sends itself SIGTERM at step N (enable_jit_checkpoint on)."""

import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from dist_exit import finish, say  # noqa: E402
from test_resume import DropoutTagger, make_args  # noqa: E402
from tiny import stop_at  # noqa: E402
from tiny import TokenDataset, pad_collate  # noqa: E402

from cadence import Trainer, TrainerCallback  # noqa: E402


class SigtermRank0(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and args.process_index == 0:
            os.kill(os.getpid(), signal.SIGTERM)


def main(out: str) -> None:
    torch.set_num_threads(1)
    stop = int(sys.argv[sys.argv.index("--stop") + 1]) if "--stop" in sys.argv else None
    term = int(sys.argv[sys.argv.index("--sigterm-rank0") + 1]) if "--sigterm-rank0" in sys.argv else None
    args = make_args(out, save_steps=stop or 500, num_train_epochs=2, use_cpu=True, enable_jit_checkpoint=bool(term))
    callbacks = [stop_at(stop)] if stop else []
    callbacks += [SigtermRank0(term)] if term else []
    trainer = Trainer(DropoutTagger(), args, train_dataset=TokenDataset(22), data_collator=pad_collate,
                      callbacks=callbacks)
    trainer.train(resume_from_checkpoint=True if "--resume" in sys.argv else None)
    say(f"STOPPED {trainer.state.global_step}")
    if args.process_index == 0 and trainer.state.global_step == trainer.state.max_steps:
        torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
    finish()
