"""Resume cost does not grow with the step: time ``train(resume_from_checkpoint=...)`` for one new
step from checkpoints early and late in a long epoch, and count the dataset reads.

The late checkpoint is the early one with its position moved (``trainer_state.json`` and
``loop_state.json``), so the two differ only in how far into the epoch they are.

    .venv/bin/python benchmarks/bench_resume.py
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from tiny import RegressionDataset, RegressionModel  # noqa: E402

from cadence import Trainer, TrainingArguments  # noqa: E402


class Counting(RegressionDataset):
    reads = 0

    def __getitem__(self, i):
        Counting.reads += 1
        return super().__getitem__(i)


def main(samples: int = 400_000, late: int = 150_000) -> None:
    ds, out = Counting(samples), tempfile.mkdtemp()

    def args(max_steps):
        return TrainingArguments(output_dir=out, disable_tqdm=True, report_to="none", max_steps=max_steps,
                                 save_steps=1, per_device_train_batch_size=2, logging_steps=10**9)

    Trainer(RegressionModel(), args(1), train_dataset=ds).train()
    early = os.path.join(out, "checkpoint-1")
    moved = os.path.join(out, f"checkpoint-{late}")
    shutil.copytree(early, moved)
    for name, keys in (("trainer_state.json", ("global_step",)), ("loop_state.json", ("batches_in_epoch", "last_logged_step"))):
        path = os.path.join(moved, name)
        state = json.load(open(path))
        state.update({k: late for k in keys})
        json.dump(state, open(path, "w"))
    print(f"{samples:,} samples, batch 2: {samples // 2:,} batches an epoch")
    for step, folder in ((1, early), (late, moved)):
        trainer = Trainer(RegressionModel(), args(step + 1), train_dataset=ds)
        Counting.reads = 0
        start = time.perf_counter()
        trainer.train(resume_from_checkpoint=folder)
        print(f"resume at step {step:>8,}: {1000 * (time.perf_counter() - start):6.0f} ms for one new step, "
              f"{Counting.reads} dataset reads")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
