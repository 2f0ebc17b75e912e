"""Run by test_fsdp.py (under torchrun, or alone for the one-process reference): train a float64 tiny GPT-2,
optionally with FSDP, stopping at or resuming from a checkpoint; save the final model with save_model.

usage: fsdp_worker.py OUT_DIR --batch B [--fsdp WORDS] [--config JSON] [--no-items] [--stop N] [--resume [DIR]]
                      [--sync-save] [--dcp-threads] [--fail-shards-at STEP]"""

import argparse
import json
import os
import sys
import threading

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from dist_exit import say  # noqa: E402
from tiny import LMDataset, lm_collate, stop_at, tiny_gpt2  # noqa: E402

from cadence import EarlyStoppingCallback, Trainer, TrainingArguments  # noqa: E402


class MeanLossGPT2(torch.nn.Module):
    """GPT-2 whose loss is the float64 mean over its own batch's shifted labels; it takes no
    num_items_in_batch (cadence reweights it). transformers' own loss runs in float32, which would hide
    a 1e-9 difference behind float32 rounding."""

    shifts_labels = True

    def __init__(self):
        super().__init__()
        self.gpt = tiny_gpt2(seed=3).double()

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.gpt(input_ids=input_ids, attention_mask=attention_mask).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return {"loss": loss, "logits": logits}


def record_dcp_threads() -> list:
    """The names of the threads in which DCP writes shard files, in order (a wrapper around its writer)."""
    from torch.distributed.checkpoint import FileSystemWriter

    names, write_data = [], FileSystemWriter.write_data

    def recording(self, *args, **kwargs):
        names.append(threading.current_thread().name)
        return write_data(self, *args, **kwargs)

    FileSystemWriter.write_data = recording
    return names


def fail_dcp_writes(folder: str) -> None:
    """DCP's shard writes into ``folder`` raise ``OSError`` (a full disk, say) in this process."""
    from torch.distributed.checkpoint import FileSystemWriter

    write_data = FileSystemWriter.write_data

    def failing(self, *args, **kwargs):
        if folder in str(self.path):
            raise OSError(28, "No space left on device (injected)")
        return write_data(self, *args, **kwargs)

    FileSystemWriter.write_data = failing


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--fsdp", default=None)
    parser.add_argument("--config", default=None)
    parser.add_argument("--no-items", action="store_true")
    parser.add_argument("--stop", type=int, default=None)
    parser.add_argument("--save-steps", type=int, default=500)
    parser.add_argument("--resume", nargs="?", const=True, default=None)
    parser.add_argument("--ignore-data-skip", action="store_true")
    parser.add_argument("--best", action="store_true", help="evaluate every 2 steps and load the best model at the end")
    parser.add_argument("--early-stop", action="store_true", help="with --best: stop after 1 evaluation without progress")
    parser.add_argument("--sync-save", action="store_true", help="async_save=False")
    parser.add_argument("--dcp-threads", action="store_true",
                        help="write OUT_DIR/dcp_threads_RANK.json: the threads that wrote DCP's shard files")
    parser.add_argument("--fail-shards-at", type=int, default=None,
                        help="process 1 fails to write its DCP shards (OSError) into checkpoint-STEP")
    opts = parser.parse_args()
    threads = record_dcp_threads() if opts.dcp_threads else None
    if opts.fail_shards_at is not None and os.environ.get("RANK") == "1":
        fail_dcp_writes(f"checkpoint-{opts.fail_shards_at}")
    torch.set_num_threads(1)
    model = MeanLossGPT2() if opts.no_items else tiny_gpt2(seed=3).double()
    args = TrainingArguments(
        output_dir=opts.out, per_device_train_batch_size=opts.batch, gradient_accumulation_steps=2,
        num_train_epochs=2, learning_rate=3e-3, weight_decay=0.1, max_grad_norm=0.5, optim="adamw_torch",
        lr_scheduler_type="linear", logging_steps=1, save_steps=opts.save_steps, disable_tqdm=True, seed=7,
        use_cpu=True, fsdp=opts.fsdp, fsdp_config=json.loads(opts.config) if opts.config else None,
        ignore_data_skip=opts.ignore_data_skip, report_to="none", async_save=not opts.sync_save,
        **(dict(eval_strategy="steps", eval_steps=2, load_best_model_at_end=True, metric_for_best_model="eval_loss",
                greater_is_better=True) if opts.best else {}),  # "greater" so that the best is not simply the last
    )
    trainer = Trainer(model, args, train_dataset=LMDataset(48), eval_dataset=LMDataset(19, seed=5), data_collator=lm_collate,
                      callbacks=[stop_at(opts.stop)] if opts.stop else [])
    if opts.early_stop:
        trainer.add_callback(EarlyStoppingCallback(early_stopping_patience=1))
    trainer.train(resume_from_checkpoint=opts.resume)
    say(f"STOPPED {args.process_index} {trainer.state.global_step}")  # the test reads each rank's own file
    trainer.save_model(os.path.join(opts.out, "final"))
    if threads is not None:
        with open(os.path.join(opts.out, f"dcp_threads_{args.process_index}.json"), "w") as f:
            json.dump(threads, f)
    if args.process_index == 0:
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
        from torch.distributed.fsdp import FSDPModule

        units = sum(isinstance(m, FSDPModule) for m in trainer.model.modules())  # sharded units (0: unwrapped)
        checkpointed = sum(isinstance(m, CheckpointWrapper) for m in trainer.model.modules())
        with open(os.path.join(opts.out, "final", "losses.json"), "w") as f:
            json.dump({"losses": losses, "grad_norms": norms, "step": trainer.state.global_step,
                       "best": trainer.state.best_model_checkpoint,
                       "eval_losses": [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h],
                       "fsdp_units": units, "checkpointed": checkpointed}, f)


if __name__ == "__main__":
    main()
