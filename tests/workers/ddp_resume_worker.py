"""Run by test_ddp_resume.py under torchrun: train (optionally stopping at a step, or resuming) and
write the final weights. usage: ddp_resume_worker.py OUT_DIR [--stop N] [--resume] [--sigterm-rank0 N]
[--save-steps N] [--kill-rank1 N]

--sigterm-rank0 N: process 0 alone sends itself SIGTERM at step N (enable_jit_checkpoint on).
--kill-rank1 N: in torchrun's first attempt, process 1 SIGKILLs itself at step N (torchrun restarts the job).
--pause-rank0 N: in the first attempt, process 0 sleeps at the end of step N (outside any collective) until its
  torchrun agent stops it: on two nodes, the agent of a healthy node restarts it without counting a restart.
--save-on-each-node: save_on_each_node=True, for "nodes" whose output_dir is each their own (NODE_DISK below).
--drop-on-rank1 NAME: in a restarted attempt, process 1 deletes checkpoint NAME of its output_dir first (complete or
  not), as if it had never reached that node's disk.
The environment's NODE_DISK (the tests set one per torchrun "node"), when set, puts output_dir in OUT_DIR/NODE_DISK: a
disk of that node's own. The first attempt is told apart by files in OUT_DIR's folder (on two nodes each torchrun
agent counts its own restarts, and ranks may move between nodes).
--hf-data: the rows as a ``datasets.Dataset`` (its fingerprint and a sample of its rows go into loop_state.json).
--other-data-rank1: with --hf-data, process 1's rows are other ones (another seed, the same length, so the samplers
  agree); each process says ``EPOCH END rank K step S`` at each epoch's end.
Each attempt says ``ATTEMPT restart R rank K starts at step S``."""

import os
import shutil
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
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


def first_time(mark: str) -> bool:
    """True the first time any attempt of the job asks with this ``mark`` (a file beside OUT_DIR, atomic create)."""
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


class KillRank1(TrainerCallback):
    def __init__(self, step, mark):
        self.step, self.mark = step, mark

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and args.process_index == 1 and first_time(self.mark):
            os.kill(os.getpid(), signal.SIGKILL)


class PauseRank0(TrainerCallback):
    def __init__(self, step, mark):
        self.step, self.mark = step, mark

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and args.process_index == 0 and first_time(self.mark):
            say(f"PAUSED rank 0 at step {self.step}")
            time.sleep(120)  # torchrun's agent stops this process long before


class SayStart(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        say(f"ATTEMPT restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')} rank {args.process_index} starts at "
            f"step {state.global_step}")


class SayEpochEnd(TrainerCallback):
    def on_epoch_end(self, args, state, control, **kwargs):
        say(f"EPOCH END rank {args.process_index} step {state.global_step}")


def hf_rows(seed: int):
    """TokenDataset(22, seed)'s rows as a datasets.Dataset of torch tensors."""
    import datasets

    rows = TokenDataset(22, seed=seed).rows
    return datasets.Dataset.from_dict({"input_ids": [ids.tolist() for ids, _ in rows],
                                       "labels": [labels.tolist() for _, labels in rows]}).with_format("torch")


def main(out: str) -> None:
    torch.set_num_threads(1)
    marks = os.path.abspath(out).rstrip(os.sep)  # the job's marks beside OUT_DIR, shared by every "node"
    if os.environ.get("NODE_DISK"):
        out = os.path.join(out, os.environ["NODE_DISK"])
    pause = int(sys.argv[sys.argv.index("--pause-rank0") + 1]) if "--pause-rank0" in sys.argv else None
    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" or os.path.exists(marks + ".killed")
    if "--drop-on-rank1" in sys.argv and os.environ.get("RANK") == "1" and restarted:
        name = sys.argv[sys.argv.index("--drop-on-rank1") + 1]
        for folder in (os.path.join(out, name), os.path.join(out, "tmp-" + name)):  # complete, or killed mid-save
            shutil.rmtree(folder, ignore_errors=True)
        say(f"DROPPED {name} on rank 1")
    stop = int(sys.argv[sys.argv.index("--stop") + 1]) if "--stop" in sys.argv else None
    term = int(sys.argv[sys.argv.index("--sigterm-rank0") + 1]) if "--sigterm-rank0" in sys.argv else None
    kill = int(sys.argv[sys.argv.index("--kill-rank1") + 1]) if "--kill-rank1" in sys.argv else None
    save_steps = int(sys.argv[sys.argv.index("--save-steps") + 1]) if "--save-steps" in sys.argv else stop or 500
    extra = {"ddp_timeout": 20} if kill else {}  # a restarted attempt whose gloo connect hangs fails soon, is restarted
    args = make_args(out, save_steps=save_steps, **extra, num_train_epochs=2, use_cpu=True, enable_jit_checkpoint=bool(term),
                     save_on_each_node="--save-on-each-node" in sys.argv)
    callbacks = [stop_at(stop)] if stop else []
    callbacks += [SigtermRank0(term)] if term else []
    callbacks += [KillRank1(kill, marks + ".killed"), SayStart()] if kill else []
    callbacks += [PauseRank0(pause, marks + ".paused")] if pause else []
    other = "--other-data-rank1" in sys.argv
    callbacks += [SayEpochEnd()] if other else []
    rows = TokenDataset(22)
    if "--hf-data" in sys.argv:
        rows = hf_rows(seed=1 if other and os.environ.get("RANK") == "1" else 0)
    trainer = Trainer(DropoutTagger(), args, train_dataset=rows, data_collator=pad_collate,
                      callbacks=callbacks)
    trainer.train(resume_from_checkpoint=True if "--resume" in sys.argv else None)
    say(f"STOPPED {trainer.state.global_step}")
    if args.process_index == 0 and trainer.state.global_step == trainer.state.max_steps:
        torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
    finish()
