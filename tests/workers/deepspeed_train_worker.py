"""Run by test_deepspeed_train.py: several DeepSpeed runs of a float32 tiny GPT-2 in one process (one launch pays
the imports and DeepSpeed's start once), on transformers or on cadence, each writing what the test compares.

    deepspeed_train_worker.py OUT RUNS_JSON

RUNS_JSON is a list of runs, each a dict: ``name`` (its folder under OUT), ``lib`` ("hf" or "cadence"),
``stage``, ``ga``, ``batch``, optional ``offload`` (ZeRO-Offload of the optimizer to the CPU), ``sections``
(a list of the config's own sections, "optimizer" and/or "scheduler", their values "auto"), ``gather``
(``stage3_gather_16bit_weights_on_model_save``), ``optim`` (the arguments' optimizer name), ``oom_after``
(``auto_find_batch_size=True``, and the model runs out of memory on batches above 2 rows after that many forward
passes: the run's error and cadence's warnings are recorded instead of its weights), ``resume`` (a checkpoint
folder under OUT to resume from). Every run trains to step 6 (44 rows, 4 a micro-batch over all processes, 2
micro-batches a step: the sixth step is the epoch's last, shorter window of one micro-batch) with a checkpoint at
step 3, then ``save_model(OUT/name/final)``; rank 0 writes ``OUT/name/result.pt``: the per-step losses, grad norms and learning rates, the final weights (gathered by the
engine), how far they moved from the initial ones, and whether ``from_pretrained`` reads save_model's
``model.safetensors`` as them.
"""

import json
import os
import sys
import time

import torch

if "WORLD_SIZE" not in os.environ:  # plain python: transformers' DeepSpeed needs a launcher's variables (else MPI)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(s.getsockname()[1]))

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from dist_exit import finish, say  # noqa: E402
from tiny import LMDataset, lm_collate, tiny_gpt2  # noqa: E402


def deepspeed_config(run):
    zero = {"stage": run["stage"]}
    if run.get("offload"):  # on a CPU only the code path: no CPU Adam build (zero_force_ds_cpu_optimizer false)
        zero["offload_optimizer"] = {"device": "cpu"}
    if run["stage"] == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = bool(run.get("gather"))
    config = {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"}
    if run.get("offload"):
        config["zero_force_ds_cpu_optimizer"] = False
    sections = run.get("sections", ())
    if "optimizer" in sections:  # DeepSpeed builds it: torch's AdamW, no compiled Adam on a CPU
        config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                           "weight_decay": "auto", "torch_adam": True}}
    if "scheduler" in sections:
        config["scheduler"] = {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}}
    return config


def final_weights(trainer, folder):
    """The trained weights as a full float32 state dict: the engine's consolidated ones, or (ZeRO-3 without the
    16-bit gather) DeepSpeed's own recovery from the checkpoint save_model wrote."""
    try:
        weights = trainer.accelerator.get_state_dict(trainer.model_wrapped)
    except ValueError:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        weights = get_fp32_state_dict_from_zero_checkpoint(folder) if trainer.is_world_process_zero() else {}
    return {k: v.detach().clone().float() for k, v in (weights or {}).items()}  # None off rank 0 (ZeRO-3)


def train(out, run):
    lib = __import__("transformers" if run["lib"] == "hf" else "cadence")
    folder = os.path.join(out, run["name"])
    args = lib.TrainingArguments(
        folder, per_device_train_batch_size=run["batch"], gradient_accumulation_steps=run["ga"], max_steps=6,
        learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=1, weight_decay=0.1, max_grad_norm=0.5,
        logging_steps=1, save_strategy="steps", save_steps=3, report_to="none", disable_tqdm=True, seed=7,
        deepspeed=deepspeed_config(run), **({"optim": run["optim"]} if "optim" in run else {}),
        auto_find_batch_size="oom_after" in run)
    model = tiny_gpt2(seed=3)
    if "oom_after" in run:
        return out_of_memory(run, folder, lib, args, model)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.loss_type = "ForCausalLM"  # transformers then counts the labels a causal LM predicts, as cadence does
    trainer = lib.Trainer(model=model, args=args, train_dataset=LMDataset(44), data_collator=lm_collate)
    resume = run.get("resume")
    trainer.train(resume_from_checkpoint=os.path.join(out, resume) if resume else None)
    trainer.save_model(os.path.join(folder, "final"))
    weights = final_weights(trainer, os.path.join(folder, "final"))
    logs = [h for h in trainer.state.log_history if "loss" in h]
    if trainer.is_world_process_zero():
        torch.save({"losses": [h["loss"] for h in logs], "steps": [h["step"] for h in logs],
                    "grad_norms": [float(h["grad_norm"]) for h in logs], "weights": weights,
                    "learning_rates": [h["learning_rate"] for h in logs],
                    "moved": max((v - start[k]).abs().max().item() for k, v in weights.items()),
                    "reloaded_equal": None}, os.path.join(folder, "result.pt"))
    say(f"DONE {run['name']}")


def out_of_memory(run, folder, lib, args, model):
    """Train until the model runs out of memory (injected, as a device would raise it, after ``oom_after``
    forward passes on batches above 2 rows); record the error, cadence's warnings and the steps logged before."""
    import logging

    calls = []

    def forward_pre_hook(module, positional, named):
        calls.append(1)
        rows = named["input_ids"].shape[0]
        if rows > 2 and len(calls) > run["oom_after"]:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: batch {rows} > 2)")

    model.register_forward_pre_hook(forward_pre_hook, with_kwargs=True)
    model.loss_type = "ForCausalLM"
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger(lib.__name__).addHandler(handler)
    try:
        trainer = lib.Trainer(model=model, args=args, train_dataset=LMDataset(44), data_collator=lm_collate)
        try:
            trainer.train()
            error = None
        except Exception as e:  # noqa: BLE001 - recorded for the test: which error, saying what
            error = f"{type(e).__name__}: {e}"
    finally:
        logging.getLogger(lib.__name__).removeHandler(handler)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    os.makedirs(folder, exist_ok=True)
    torch.save({"error": error, "warnings": warnings, "losses": [h["loss"] for h in logs], "forwards": len(calls)},
               os.path.join(folder, "result.pt"))
    say(f"DONE {run['name']}")


def reload_saved_models(out, runs):
    """On rank 0, once every run is done: whether ``from_pretrained`` reads each save_model's ``model.safetensors``
    as the run's final weights. transformers' ``from_pretrained`` partitions the model it builds (a collective)
    while a ZeRO-3 config is the last DeepSpeed config it saw, so that one is forgotten first."""
    from transformers import GPT2LMHeadModel
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    for run in runs:
        path = os.path.join(out, run["name"], "result.pt")
        final = os.path.join(out, run["name"], "final")
        if os.path.exists(os.path.join(final, "model.safetensors")):
            result = torch.load(path, weights_only=True)
            reloaded = GPT2LMHeadModel.from_pretrained(final).state_dict()
            result["reloaded_equal"] = all(torch.equal(reloaded[k], v) for k, v in result["weights"].items())
            torch.save(result, path)


def main():
    out, runs = sys.argv[1], json.loads(sys.argv[2])
    for run in runs:
        start = time.perf_counter()
        train(out, run)
        say(f"TIME {run['name']} {time.perf_counter() - start:.1f}")
    if int(os.environ.get("RANK", "0")) == 0:
        reload_saved_models(out, runs)
    finish()


if __name__ == "__main__":
    main()
