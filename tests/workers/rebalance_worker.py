"""Run by test_batch_rebalance.py under torchrun (2 processes): train with train_sampling_strategy="batch_rebalance",
noting each process's batches (sample indices); then stop at step 5 (inside epoch 2), resume from its checkpoint and
note the batches trained after it. Rank 0 writes every process's batches and both runs' final weights."""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from dist_exit import finish  # noqa: E402
from test_batch_rebalance import Indexed, Recorder  # noqa: E402
from tiny import TokenTagger  # noqa: E402

from cadence import Trainer, TrainingArguments  # noqa: E402


def run(out_dir, resume=None, **overrides):
    recorder = Recorder()
    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=3, gradient_accumulation_steps=2, num_train_epochs=2,
        learning_rate=0.1, optim="sgd", lr_scheduler_type="constant", logging_steps=1, disable_tqdm=True,
        report_to="none", seed=42, use_cpu=True, remove_unused_columns=False, train_sampling_strategy="batch_rebalance",
        **overrides)
    trainer = Trainer(TokenTagger(dtype=torch.float64), args, train_dataset=Indexed(44), data_collator=recorder)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, recorder.batches


def main(out_file):
    torch.set_num_threads(1)
    unbroken, batches = run(out_file + ".u", save_strategy="no")
    run(out_file + ".b", save_strategy="steps", save_steps=5, max_steps=5)
    resumed, resumed_batches = run(out_file + ".b", resume=out_file + ".b/checkpoint-5", save_strategy="no")
    everyone = [None, None]
    dist.all_gather_object(everyone, (batches, resumed_batches))
    if dist.get_rank() == 0:
        torch.save({"batches": [b for b, _ in everyone], "resumed_batches": [r for _, r in everyone],
                    "unbroken": unbroken.model.state_dict(), "resumed": resumed.model.state_dict()}, out_file)


if __name__ == "__main__":
    main(sys.argv[1])
    finish()
