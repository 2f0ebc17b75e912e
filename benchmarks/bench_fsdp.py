"""FSDP vs DDP on 2 CPU processes (gloo): per-process memory of parameters + gradients + optimizer state,
and step time, for a GPT-2 of about 55M parameters trained by cadence with AdamW (float32).

    .venv/bin/python benchmarks/bench_fsdp.py            # about 2-4 minutes on 2 cores
    .venv/bin/python benchmarks/bench_fsdp.py --steps 3 --layers 16

Memory is counted from the tensors each process holds right after its optimizer step (the moment all
three exist): a DTensor's local shard for FSDP, whole tensors for DDP. The target is FSDP <= 0.6 x DDP
(0.5 x is the physical floor with 2 processes). The peak resident set size of each process is printed
beside it (it also holds activations, the unsharded layer being computed, and the Python runtime).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def local_bytes(tensor) -> int:
    tensor = getattr(tensor, "_local_tensor", tensor)  # a DTensor holds only its shard here
    return tensor.numel() * tensor.element_size()


def worker(mode: str, steps: int, layers: int, out: str) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from cadence import Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=8192, n_positions=64, n_embd=512, n_layer=layers, n_head=8,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())

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
                             logging_steps=steps, fsdp="full_shard auto_wrap" if mode == "fsdp" else None)
    trainer = Trainer(model, args, train_dataset=Rows(), callbacks=[Measure()])
    trainer.train()
    step_times = [e - s for s, e in zip(measured["starts"], measured["ends"])][1:]  # the first step warms up
    row = {"mode": mode, "rank": args.process_index, "model_params": n_params, "params": measured["params"],
           "grads": measured["grads"], "optimizer": measured["optimizer"],
           "step_s": sorted(step_times)[len(step_times) // 2],
           "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    print("ROW " + json.dumps(row), flush=True)


def launch(mode: str, steps: int, layers: int) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", __file__,
           "--worker", mode, "--steps", str(steps), "--layers", str(layers)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", default=None)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layers", type=int, default=16)
    opts = parser.parse_args()
    if opts.worker:
        import tempfile

        worker(opts.worker, opts.steps, opts.layers, tempfile.mkdtemp(prefix="bench_fsdp_"))
        return 0
    rows = {mode: launch(mode, opts.steps, opts.layers) for mode in ("ddp", "fsdp")}
    mb = 2**20
    print(f"GPT-2, {rows['ddp'][0]['model_params'] / 1e6:.1f}M parameters, float32, AdamW, 2 processes (gloo), "
          f"batch 2 x 32 tokens per process, median step of {opts.steps - 1}")
    print(f"{'':6} {'rank':>4} {'params MB':>10} {'grads MB':>9} {'optim MB':>9} {'total MB':>9} {'peak RSS MB':>12} {'step s':>7}")
    totals = {}
    for mode, ranks in rows.items():
        for r in sorted(ranks, key=lambda r: r["rank"]):
            total = r["params"] + r["grads"] + r["optimizer"]
            totals[mode] = max(totals.get(mode, 0), total)
            print(f"{mode:6} {r['rank']:>4} {r['params'] / mb:>10.1f} {r['grads'] / mb:>9.1f} {r['optimizer'] / mb:>9.1f} "
                  f"{total / mb:>9.1f} {r['max_rss'] / mb:>12.0f} {r['step_s']:>7.2f}")
    ratio = totals["fsdp"] / totals["ddp"]
    step = max(r["step_s"] for r in rows["fsdp"]) / max(r["step_s"] for r in rows["ddp"])
    verdict = "PASS" if ratio <= 0.6 else "MISS"
    print(f"FSDP / DDP per-process parameter+gradient+optimizer memory: {ratio:.3f} (target <= 0.6): {verdict}; "
          f"step time FSDP / DDP: {step:.2f}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
