"""Run by test_ddp_resume.py under torchrun: train (optionally stopping at a step, or resuming) and
write the final weights. usage: ddp_resume_worker.py OUT_DIR [--stop N] [--resume] [--sigterm-rank0 N]
[--save-steps N] [--kill-rank1 N]

--sigterm-rank0 N: process 0 alone sends itself SIGTERM at step N (enable_jit_checkpoint on).
--kill-rank1 N: in torchrun's first attempt, process 1 SIGKILLs itself at step N (torchrun restarts the job).
Each attempt says ``ATTEMPT restart R rank K starts at step S``."""

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


class KillRank1(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if state.global_step == self.step and args.process_index == 1 and first_attempt:
            os.kill(os.getpid(), signal.SIGKILL)


class SayStart(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        say(f"ATTEMPT restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')} rank {args.process_index} starts at "
            f"step {state.global_step}")


def main(out: str) -> None:
    torch.set_num_threads(1)
    stop = int(sys.argv[sys.argv.index("--stop") + 1]) if "--stop" in sys.argv else None
    term = int(sys.argv[sys.argv.index("--sigterm-rank0") + 1]) if "--sigterm-rank0" in sys.argv else None
    kill = int(sys.argv[sys.argv.index("--kill-rank1") + 1]) if "--kill-rank1" in sys.argv else None
    save_steps = int(sys.argv[sys.argv.index("--save-steps") + 1]) if "--save-steps" in sys.argv else stop or 500
    extra = {"ddp_timeout": 20} if kill else {}  # a restarted attempt whose gloo connect hangs fails soon, is restarted
    args = make_args(out, save_steps=save_steps, **extra, num_train_epochs=2, use_cpu=True, enable_jit_checkpoint=bool(term))
    callbacks = [stop_at(stop)] if stop else []
    callbacks += [SigtermRank0(term)] if term else []
    callbacks += [KillRank1(kill), SayStart()] if kill else []
    trainer = Trainer(DropoutTagger(), args, train_dataset=TokenDataset(22), data_collator=pad_collate,
                      callbacks=callbacks)
    trainer.train(resume_from_checkpoint=True if "--resume" in sys.argv else None)
    say(f"STOPPED {trainer.state.global_step}")
    if args.process_index == 0 and trainer.state.global_step == trainer.state.max_steps:
        torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
    finish()
