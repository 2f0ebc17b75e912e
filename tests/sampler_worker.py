"""A Trainer subclass whose ``_get_train_sampler`` returns its own sampler (TRL's ``RepeatSampler`` shape), on
transformers' Trainer or (``--cadence``) cadence's, under torchrun.

    torchrun --nproc_per_node=2 tests/sampler_worker.py OUT_DIR [--cadence] [--resume]

Each rank writes ``OUT_DIR/rank{r}.pt``: the dataset indices it read, in order, the final epoch and step, and the
final weights (float64).
"""

import os
import sys

import torch

import dist_exit

out_dir, use_cadence, resume = sys.argv[1], "--cadence" in sys.argv, "--resume" in sys.argv
if use_cadence:
    import cadence as lib
else:
    import transformers as lib

from tiny import RegressionDataset, RegressionModel  # noqa: E402

SEEN = []


class Recorded(RegressionDataset):
    def __getitem__(self, i):
        SEEN.append(int(i))
        return super().__getitem__(i)


class RepeatEach(torch.utils.data.Sampler):
    """Each index ``repeat`` times in a row, the order shuffled per epoch from ``seed + epoch`` (RepeatSampler's
    shape: one prompt's generations together)."""

    def __init__(self, n, repeat=2, seed=11):
        self.n, self.repeat, self.seed, self.epoch = n, repeat, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n * self.repeat

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        return iter([i for i in order for _ in range(self.repeat)])


class OwnSampler(lib.Trainer):
    def _get_train_sampler(self, *args, **kwargs):
        return RepeatEach(len(self.train_dataset))


dist_exit.finish_at_exit() if use_cadence else None
args = lib.TrainingArguments(output_dir=out_dir, num_train_epochs=2, per_device_train_batch_size=3, learning_rate=0.05,
                             logging_steps=1, save_strategy="steps", save_steps=3, report_to="none", disable_tqdm=True,
                             seed=5, use_cpu=True, optim="sgd")
torch.manual_seed(0)
model = RegressionModel().double()
data = Recorded(13)
data.x, data.y = data.x.double(), data.y.double()
trainer = OwnSampler(model, args, train_dataset=data)
trainer.train(resume_from_checkpoint=True if resume else None)
rank = int(os.environ.get("RANK", "0"))
torch.save({"seen": SEEN, "epoch": trainer.state.epoch, "step": trainer.state.global_step,
            "weights": {k: v.detach().clone() for k, v in model.state_dict().items()}},
           os.path.join(out_dir, f"rank{rank}{'_resumed' if resume else ''}.pt"))
if not use_cadence:
    dist_exit.finish()
