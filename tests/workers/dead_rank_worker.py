"""Run twice by test_dead_rank.py, as ranks 0 and 1 of one job (no torchrun agent to kill the survivor):
rank 1 dies abruptly (MODE die) or stops answering (MODE hang) when step STEP begins; rank 0 must stop
with an error naming itself and the step, not hang.
usage: dead_rank_worker.py OUT_DIR STEP TIMEOUT MODE"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from tiny import TokenDataset, TokenTagger, pad_collate  # noqa: E402

from cadence import Trainer, TrainerCallback, TrainingArguments  # noqa: E402


class Die(TrainerCallback):
    def __init__(self, step, mode):
        self.step, self.mode = step, mode

    def on_step_begin(self, args, state, control, **kwargs):
        if args.process_index == 1 and state.global_step + 1 == self.step:
            if self.mode == "hang":  # alive but silent (a stuck data loader, a deadlock)
                time.sleep(600)
            os._exit(17)  # no cleanup, no goodbye: as a killed or crashed process


def main(out: str, die: int, timeout: int, mode: str) -> None:
    torch.set_num_threads(1)
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=10, learning_rate=0.1,
                             optim="sgd", save_strategy="no", disable_tqdm=True, use_cpu=True, report_to="none",
                             ddp_timeout=timeout)
    Trainer(TokenTagger(), args, train_dataset=TokenDataset(80), data_collator=pad_collate, callbacks=[Die(die, mode)]).train()
    sys.stdout.write("FINISHED\n")  # one write per line: two workers' lines never run together
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
