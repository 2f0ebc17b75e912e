"""Run by test_tensor_parallel.py (under torchrun, or alone for the one-process reference): train the tiny Llama
saved in MODEL_DIR, loaded with its tensor-parallel plan (``tp_plan="auto"``) on several processes, or whole on one;
stop at or resume from a checkpoint; write the final (gathered) weights and the logged losses.

usage: tp_worker.py MODEL_DIR OUT_DIR --batch B [--layout JSON] [--fsdp WORDS] [--config JSON] [--stop N]
                    [--save-steps N] [--resume] [--whole]"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
import dist_exit  # noqa: E402  (faulthandler: an aborted worker prints its stacks)
from tiny import LMDataset, lm_collate, stop_at  # noqa: E402

from cadence import Trainer, TrainingArguments  # noqa: E402


def tiny_llama(folder: str) -> None:
    """Save a 2-layer Llama (hidden 64, 4 heads, 2 key/value heads) with random weights into ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder)


def load(folder: str, distributed: dict | None):
    from transformers import LlamaForCausalLM

    if distributed is None:  # one process: the model whole
        return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    from transformers.distributed import DistributedConfig

    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, distributed_config=DistributedConfig(**distributed))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--distributed", default=None, help="DistributedConfig keywords (JSON), e.g. {\"tp_size\": 2}")
    parser.add_argument("--layout", default=None, help="ParallelismConfig keywords (JSON)")
    parser.add_argument("--fsdp", default=None)
    parser.add_argument("--config", default=None)
    parser.add_argument("--stop", type=int, default=None)
    parser.add_argument("--save-steps", type=int, default=500)
    parser.add_argument("--resume", action="store_true")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    if opts.distributed is not None and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")  # the mesh transformers builds at load needs the group
    model = load(opts.model, json.loads(opts.distributed) if opts.distributed else None)
    layout = None
    if opts.layout:
        from accelerate import ParallelismConfig

        layout = ParallelismConfig(**json.loads(opts.layout))
    args = TrainingArguments(
        output_dir=opts.out, per_device_train_batch_size=opts.batch, gradient_accumulation_steps=2, max_steps=8,
        learning_rate=3e-3, weight_decay=0.1, max_grad_norm=0.5, optim="adamw_torch", lr_scheduler_type="linear",
        logging_steps=1, save_steps=opts.save_steps, disable_tqdm=True, seed=7, use_cpu=True, report_to="none",
        parallelism_config=layout, fsdp=opts.fsdp, fsdp_config=json.loads(opts.config) if opts.config else None,
    )
    trainer = Trainer(model, args, train_dataset=LMDataset(64), data_collator=lm_collate,
                      callbacks=[stop_at(opts.stop)] if opts.stop else [])
    trainer.train(resume_from_checkpoint=True if opts.resume else None)
    trainer.save_model(os.path.join(opts.out, "final"))
    predicted = trainer.predict(LMDataset(11, seed=5))  # 11 rows: the last batch of the data-parallel ranks is short
    if args.process_index == 0:
        history = trainer.state.log_history
        with open(os.path.join(opts.out, "final", "losses.json"), "w") as f:
            json.dump({"losses": [h["loss"] for h in history if "loss" in h],
                       "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
                       "step": trainer.state.global_step, "tp_size": trainer.get_tp_size(),
                       "data_parallel_size": trainer.backend.data_parallel_size,
                       "predict_loss": predicted.metrics["test_loss"], "predict_rows": len(predicted.predictions),
                       "predict_logits_sum": float(predicted.predictions.sum()),
                       "mesh": next((list(p.device_mesh.shape) for p in trainer.model.parameters()
                                     if hasattr(p, "device_mesh")), None)}, f)
    sys.stdout.write(f"STOPPED {args.process_index} {trainer.state.global_step}\n")
    sys.stdout.flush()
    del trainer
    dist_exit.finish()  # the worker started the process group (for from_pretrained's mesh): it ends it, not exit's teardown


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-model"]:
        tiny_llama(sys.argv[2])
    else:
        main()
