"""Run by test_launch.py under a launcher: train 2 steps with the ddp_* options given as JSON and print
what the DDP wrapper and the process group were built with. A third argument ``unused`` trains a model with a
parameter the loss never reaches (a pooler under a token-level head)."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from dist_exit import say  # noqa: E402
from tiny import TokenDataset, TokenTagger, pad_collate  # noqa: E402


class TaggerWithUnusedPooler(TokenTagger):
    def __init__(self):
        super().__init__()
        self.pooler = torch.nn.Linear(8, 8)  # never in the loss, as BERT's pooler under SpanMarker's span head

from cadence import Trainer, TrainingArguments  # noqa: E402


def main(out: str, options: str, model: str = "tagger") -> None:
    torch.set_num_threads(1)
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=2, save_strategy="no",
                             disable_tqdm=True, use_cpu=True, report_to="none", **json.loads(options))
    trainer = Trainer(TaggerWithUnusedPooler() if model == "unused" else TokenTagger(), args, train_dataset=TokenDataset(40), data_collator=pad_collate)
    trainer.train()
    ddp = trainer.model_wrapped
    import torch.distributed as dist

    seen = {"wrapper": type(ddp).__name__, "find_unused_parameters": getattr(ddp, "find_unused_parameters", None),
            "broadcast_buffers": getattr(ddp, "broadcast_buffers", None),
            "bucket_bytes_cap": getattr(ddp, "bucket_bytes_cap", None), "backend": dist.get_backend(),
            "world_size": dist.get_world_size(), "rank": dist.get_rank(), "step": trainer.state.global_step}
    say("SEEN " + json.dumps(seen))  # into this rank's own file too: the test reads those


if __name__ == "__main__":
    main(*sys.argv[1:])
