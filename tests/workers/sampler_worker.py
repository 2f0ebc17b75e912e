"""A Trainer subclass whose ``_get_train_sampler`` returns its own sampler (TRL's ``RepeatSampler`` shape), on
transformers' Trainer or (``--cadence``) cadence's, under torchrun.

    torchrun --nproc_per_node=2 tests/workers/sampler_worker.py OUT_DIR [--cadence] [--resume]

Each rank writes ``OUT_DIR/rank{r}.pt``: the dataset indices it read, in order, the final epoch and step, and the
final weights (float64); under cadence also the files it wrote under OUT_DIR (checkpoints, then ``save_model`` into
``OUT_DIR/final``), and it says its number of batches an epoch before training (``BATCHES rank R N``).
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


WRITES = []  # under cadence: what this process opened for writing (or renamed) under OUT_DIR, from Python's audit events


def audit(event, details):
    if event == "open" and isinstance(details[0], str) and details[0].startswith(out_dir):
        mode, flags = details[1], details[2]
        if (mode is not None and any(c in mode for c in "wax+")) or (mode is None and flags & (os.O_WRONLY | os.O_RDWR)):
            WRITES.append(os.path.relpath(details[0], out_dir))
    elif event in ("os.rename", "os.replace", "os.mkdir") and str(details[0]).startswith(out_dir):
        WRITES.append(os.path.relpath(str(details[1] if event != "os.mkdir" else details[0]), out_dir))


if use_cadence:
    from cadence.checkpoint import save_load

    def recorded(name, real):  # cadence's own writers of the model files, as called (the weights go through
        def call(*args, **kwargs):  # Rust/C++ writers Python's audit events miss)
            folder = args[0] if name == "save_model" else args[1]
            WRITES.append(f"{name}:" + os.path.relpath(str(folder), out_dir))
            return real(*args, **kwargs)
        return call

    for name in ("save_model", "save_model_weights"):
        setattr(save_load, name, recorded(name, getattr(save_load, name)))
    dist_exit.finish_at_exit()
    sys.addaudithook(audit)
args = lib.TrainingArguments(output_dir=out_dir, num_train_epochs=2, per_device_train_batch_size=3, learning_rate=0.05,
                             logging_steps=1, save_strategy="steps", save_steps=3, report_to="none", disable_tqdm=True,
                             seed=5, use_cpu=True, optim="sgd", **({"ddp_timeout": 60} if use_cadence else {}))
torch.manual_seed(0)
model = RegressionModel().double()
data = Recorded(13)
data.x, data.y = data.x.double(), data.y.double()
trainer = OwnSampler(model, args, train_dataset=data)
rank = int(os.environ.get("RANK", "0"))
if use_cadence:  # said before training: with ranks dealt unequal batches the run would stall, not get to its end
    dist_exit.say(f"BATCHES rank {rank} {len(trainer.get_train_dataloader())}")
trainer.train(resume_from_checkpoint=True if resume else None)
if use_cadence and not resume:
    trainer.save_model(os.path.join(out_dir, "final"))  # every process calls it; only the main one writes
torch.save({"seen": SEEN, "epoch": trainer.state.epoch, "step": trainer.state.global_step, "writes": sorted(set(WRITES)),
            "weights": {k: v.detach().clone() for k, v in model.state_dict().items()}},
           os.path.join(out_dir, f"rank{rank}{'_resumed' if resume else ''}.pt"))
if not use_cadence:
    dist_exit.finish()
