"""Run by test_ddp.py under torchrun: evaluate and predict, write what process 0 got."""

import sys

import numpy as np
import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from dist_exit import finish_at_exit  # noqa: E402
from tiny import TokenDataset, TokenTagger, pad_collate  # noqa: E402

from cadence import Trainer, TrainingArguments  # noqa: E402


def token_accuracy(p):
    keep = p.label_ids != -100
    return {"accuracy": float((p.predictions.argmax(-1)[keep] == p.label_ids[keep]).mean()),
            "rows": len(p.label_ids), "loss_rows": float(np.sum(p.losses))}


class PerBatch:
    def __init__(self):
        self.hits = self.total = 0
        self.flags = []

    def __call__(self, p, compute_result):
        self.flags.append(compute_result)
        keep = p.label_ids != -100
        self.hits += int((p.predictions.argmax(-1)[keep] == p.label_ids[keep]).sum())
        self.total += int(keep.sum())
        return {"accuracy": self.hits / self.total} if compute_result else {}


def main(out_file: str, batch: int) -> None:
    torch.set_num_threads(1)
    finish_at_exit()  # this worker leaves the process group to cadence's own teardown
    args = TrainingArguments(output_dir=out_file + ".d", per_device_eval_batch_size=batch, disable_tqdm=True,
                             use_cpu=True, report_to="none", include_for_metrics=["loss"])
    # the process group starts here, as in run_clm-style scripts (around datasets.map), before any Trainer:
    # cadence ends it at exit either way (the CI once aborted in teardown when only the Trainer's start did)
    with args.main_process_first(desc="dataset"):
        ds = TokenDataset(19)  # batches of 3: 7 batches, so with 2 processes the last step pads process 1
    trainer = Trainer(TokenTagger(dtype=torch.float64), args, data_collator=pad_collate, compute_metrics=token_accuracy)
    metrics = trainer.evaluate(ds)
    out = trainer.predict(ds)
    per_batch = PerBatch()
    trainer.args.batch_eval_metrics = True
    trainer.compute_metrics = per_batch
    batched = trainer.evaluate(ds)
    if args.process_index == 0:
        torch.save({"metrics": metrics, "predictions": torch.from_numpy(out.predictions),
                    "label_ids": torch.from_numpy(out.label_ids), "test_metrics": out.metrics,
                    "batched": batched, "flags": per_batch.flags}, out_file)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
