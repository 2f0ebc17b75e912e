"""Run by test_ddp_resume.py under torchrun: train (optionally stopping at a step, or resuming) and
write the final weights. usage: ddp_resume_worker.py OUT_DIR [--stop N] [--resume]"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_resume import DropoutTagger, StopAt, make_args  # noqa: E402
from tiny import TokenDataset, pad_collate  # noqa: E402

from cadence import Trainer  # noqa: E402


def main(out: str) -> None:
    torch.set_num_threads(1)
    stop = int(sys.argv[sys.argv.index("--stop") + 1]) if "--stop" in sys.argv else None
    args = make_args(out, save_steps=stop or 500, num_train_epochs=2, use_cpu=True)
    trainer = Trainer(DropoutTagger(), args, train_dataset=TokenDataset(22), data_collator=pad_collate,
                      callbacks=[StopAt(stop)] if stop else [])
    trainer.train(resume_from_checkpoint=True if "--resume" in sys.argv else None)
    if args.process_index == 0:
        torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
