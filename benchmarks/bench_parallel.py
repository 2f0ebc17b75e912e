"""DDP, FSDP, TP=2 and FSDP x TP (2 x 2) on CPU processes (gloo): per-process memory of parameters + gradients +
optimizer state, and step time, for one Llama (about 12M parameters, float32, AdamW) trained by cadence, in one run.

    .venv/bin/python benchmarks/bench_parallel.py            # a few minutes on 2 cores (FSDP x TP runs 4 processes)
    .venv/bin/python benchmarks/bench_parallel.py --steps 3 --layers 4

The TP and FSDP x TP models are loaded with ``from_pretrained(..., tp_plan="auto")`` / ``distributed_config=
DistributedConfig(tp_size=2, fsdp_size=2)``, the same weights as the DDP/FSDP runs. Memory is counted from the
tensors each process holds right after its optimizer step: a DTensor's local shard, whole tensors otherwise. The
target is TP=2 <= 0.6 x DDP (0.5 x is the floor with 2 processes; the norms stay replicated). Step times on a
shared 2-core CPU only compare layouts with each other, and the 4-process run shares the same 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
# mode -> (processes, DistributedConfig keywords for from_pretrained or None, fsdp words or None)
MODES = {
    "ddp": (2, None, None),
    "fsdp": (2, None, "full_shard auto_wrap"),
    "tp": (2, {"tp_size": 2}, None),
    "fsdp_tp": (4, {"tp_size": 2, "fsdp_size": 2}, "full_shard"),
}


def local_bytes(tensor) -> int:
    tensor = getattr(tensor, "_local_tensor", tensor)  # a DTensor holds only its shard here
    return tensor.numel() * tensor.element_size()


def make_model(folder: str, layers: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder)


def worker(mode: str, folder: str, steps: int, out: str) -> None:
    import torch
    from transformers import LlamaForCausalLM

    from cadence import Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    _, distributed, fsdp = MODES[mode]
    if distributed is None:
        model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    else:
        from transformers.distributed import DistributedConfig

        torch.distributed.init_process_group("gloo")
        model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 distributed_config=DistributedConfig(**distributed))
    n_params = sum(p.numel() for p in model.parameters())  # a DTensor's numel is its global size

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.randint(0, 8192, (32,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    measured: dict = {}

    class Measure(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            measured.setdefault("starts", []).append(time.perf_counter())

        def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            params = list(trainer.model_wrapped.parameters())
            measured["params"] = sum(local_bytes(p) for p in params)
            measured["grads"] = sum(local_bytes(p.grad) for p in params if p.grad is not None)
            measured["optimizer"] = sum(local_bytes(v) for s in trainer.optimizer.state.values() for v in s.values()
                                        if torch.is_tensor(v) and v.dim() > 0)

        def on_step_end(self, args, state, control, **kwargs):
            measured.setdefault("ends", []).append(time.perf_counter())

    args = TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=steps, learning_rate=1e-4,
                             optim="adamw_torch", save_strategy="no", disable_tqdm=True, use_cpu=True, report_to="none",
                             logging_steps=steps, fsdp=fsdp)
    trainer = Trainer(model, args, train_dataset=Rows(), callbacks=[Measure()])
    trainer.train()
    step_times = [e - s for s, e in zip(measured["starts"], measured["ends"])][1:]  # the first step warms up
    row = {"mode": mode, "rank": args.process_index, "model_params": n_params, "params": measured["params"],
           "grads": measured["grads"], "optimizer": measured["optimizer"],
           "step_s": sorted(step_times)[len(step_times) // 2],
           "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    print("ROW " + json.dumps(row), flush=True)


def launch(mode: str, folder: str, steps: int) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(MODES[mode][0]), "--standalone",
           __file__, "--worker", mode, "--model", folder, "--steps", str(steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    opts = parser.parse_args()
    if opts.worker:
        worker(opts.worker, opts.model, opts.steps, tempfile.mkdtemp(prefix="bench_parallel_"))
        return 0
    folder = tempfile.mkdtemp(prefix="bench_parallel_llama_")
    make_model(folder, opts.layers)
    rows = {mode: launch(mode, folder, opts.steps) for mode in MODES}
    mb = 2**20
    print(f"Llama, {rows['ddp'][0]['model_params'] / 1e6:.1f}M parameters, float32, AdamW, gloo, batch 2 x 32 tokens "
          f"per process, median step of {opts.steps - 1}")
    print(f"{'':8} {'rank':>4} {'params MB':>10} {'grads MB':>9} {'optim MB':>9} {'total MB':>9} {'peak RSS MB':>12} {'step s':>7}")
    totals = {}
    for mode, ranks in rows.items():
        for r in sorted(ranks, key=lambda r: r["rank"]):
            total = r["params"] + r["grads"] + r["optimizer"]
            totals[mode] = max(totals.get(mode, 0), total)
            print(f"{mode:8} {r['rank']:>4} {r['params'] / mb:>10.1f} {r['grads'] / mb:>9.1f} {r['optimizer'] / mb:>9.1f} "
                  f"{total / mb:>9.1f} {r['max_rss'] / mb:>12.0f} {r['step_s']:>7.2f}")
    step = {mode: max(r["step_s"] for r in ranks) for mode, ranks in rows.items()}
    ratios = ", ".join(f"{mode} {totals[mode] / totals['ddp']:.3f}" for mode in MODES if mode != "ddp")
    verdict = "PASS" if totals["tp"] / totals["ddp"] <= 0.6 else "MISS"
    print(f"per-process parameter+gradient+optimizer memory / DDP's: {ratios}; TP=2 target <= 0.6: {verdict}")
    print("step time / DDP's: " + ", ".join(f"{mode} {step[mode] / step['ddp']:.2f}" for mode in MODES if mode != "ddp"))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
