"""GPU throughput: a plain PyTorch loop, ``transformers.Trainer`` and cadence on a 125M GPT-2, one process.

A GPT-2 of 124M parameters built from a config (12 layers, d=768, 12 heads, vocabulary 50257, sequence 1024, random
weights, no dropout), bf16 autocast over float32 weights, fused AdamW, a linear schedule with warm-up, clipping to
1.0, the loss read back every 10 steps, batch 32 x 1024 tokens (``--batch``). Each runner trains ``--warmup`` steps
(5: kernels, allocator, a compilation) then ``--steps`` timed steps (50), eager and with ``torch_compile``
(``torch.compile(model)`` in the plain loop). The clock runs between two ``torch.cuda.synchronize()``: at the start
of the first timed step and at the end of the last (from the trainers' ``on_step_begin``/``on_step_end``).

Printed per run: tokens/s, MFU (model FLOPs per token ``6 N + 12 L d T``, N the parameters without the position
table, against the GPU's dense bf16 peak from ``cadence.backend.peak_flops``, or ``--peak-tflops``), the peak of
``torch.cuda.max_memory_allocated`` during training, and, in the eager runs, the time training was blocked by one
save of that model (the gap from the save step's ``on_step_end`` to the next ``on_step_begin`` minus the median gap
of the timed steps; cadence saves with ``async_save=True``, its fast path; the plain loop's "save" is
``safetensors.save_file`` of the weights plus ``torch.save`` of the optimizer, timed whole). Then the ratios, against
the targets: cadence >= 1.05 x transformers' tokens/s and >= 0.98 x the plain loop's; a save blocks
<= 0.10 x transformers'.

    python benchmarks/bench_gpu.py                  # on a CUDA GPU: 6 runs, about 3-4 minutes on an H200
    python benchmarks/bench_gpu.py --tiny           # a dry run anywhere (CPU included): tiny GPT-2, a few steps
    python benchmarks/bench_gpu.py --compile off --runners cadence,hf --batch 16 --json out.json

``--tiny`` compiles with the ``eager`` backend (dynamo only) so that the compiled code path runs in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "src"))  # this checkout's cadence, also where it is not installed

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, RandomSampler  # noqa: E402

import common  # noqa: E402

SHAPES = {
    "full": dict(vocab=50257, seq=1024, d=768, n_layer=12, n_head=12, batch=32, warmup=5, steps=50, logging=10),
    "tiny": dict(vocab=256, seq=64, d=64, n_layer=2, n_head=2, batch=4, warmup=2, steps=5, logging=2),
}
TARGETS = {"cadence/hf tokens/s": 1.05, "cadence/plain tokens/s": 0.98, "cadence/hf save blocked": 0.10}
RUNNERS = ("plain", "hf", "cadence")
LR, WEIGHT_DECAY, WARMUP_LR_STEPS, SEED = 3e-4, 0.01, 2, common.SEED


def make_model(shape: dict) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    return GPT2LMHeadModel(GPT2Config(vocab_size=shape["vocab"], n_positions=shape["seq"], n_embd=shape["d"],
                                      n_layer=shape["n_layer"], n_head=shape["n_head"], resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))


def flops_per_token(model: nn.Module, shape: dict) -> float:
    """Training FLOPs per token: 6 x the parameters that multiply (all but the position table; the tied embedding
    counted once, as the head) + 12 L d T for the attention scores and their use (PaLM's appendix B)."""
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    return 6 * n + 12 * shape["n_layer"] * shape["d"] * shape["seq"]


class Clock:
    """Step times of one run: the synchronised start of the first timed step and end of the last, and every
    step's host-side end and next begin (for a save's blocked time)."""

    def __init__(self, warmup: int, steps: int, cuda: bool):
        self.warmup, self.last, self.cuda = warmup, warmup + steps, cuda
        self.end, self.begin, self.t0, self.t1, self.first_step_s = {}, {}, None, None, None
        self.start = time.perf_counter()

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def step_begin(self, done: int) -> None:  # ``done`` steps finished so far
        self.begin[done] = time.perf_counter()
        if done == self.warmup:
            self._sync()
            self.t0 = time.perf_counter()

    def step_end(self, done: int) -> None:
        if done == 1:
            self._sync()
            self.first_step_s = time.perf_counter() - self.start
        if done == self.last:
            self._sync()
            self.t1 = time.perf_counter()
        self.end[done] = time.perf_counter()

    def blocked(self, step: int) -> float | None:
        """The gap after ``step`` minus the median gap after the timed steps."""
        if step not in self.end or step not in self.begin:
            return None
        usual = statistics.median(self.begin[s] - self.end[s] for s in range(self.warmup + 1, self.last)
                                  if s in self.begin and s in self.end)
        return self.begin[step] - self.end[step] - usual


def trainer_callback(lib: str, clock: Clock):
    if lib == "cadence":
        from cadence import TrainerCallback
    else:
        from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.step_begin(state.global_step)

        def on_step_end(self, args, state, control, **kwargs):
            clock.step_end(state.global_step)

    return Timer()


def run_trainer(lib: str, shape: dict, compiled: bool, backend: str, save_at: int | None, cuda: bool, out: str):
    Trainer, TrainingArguments = common.trainer_classes(lib)
    total = shape["warmup"] + shape["steps"] + (2 if save_at else 0)
    kw = dict(output_dir=out, max_steps=total, per_device_train_batch_size=shape["batch"], learning_rate=LR,
              weight_decay=WEIGHT_DECAY, warmup_steps=WARMUP_LR_STEPS, lr_scheduler_type="linear", max_grad_norm=1.0,
              logging_steps=shape["logging"], bf16=True, report_to="none", disable_tqdm=True, seed=SEED,
              data_seed=SEED, use_cpu=not cuda, save_strategy="steps" if save_at else "no",
              save_steps=save_at or 500, torch_compile=compiled)
    if compiled:
        kw["torch_compile_backend"] = backend
    if lib == "cadence" and save_at:
        kw["async_save"] = True
    clock = Clock(shape["warmup"], shape["steps"], cuda)
    model = make_model(shape)
    data = common.TokenData(shape["batch"] * total, shape["seq"], shape["vocab"])
    trainer = Trainer(model=model, args=TrainingArguments(**kw), train_dataset=data,
                      callbacks=[trainer_callback(lib, clock)])
    reset_peak(cuda)
    with contextlib.redirect_stdout(io.StringIO()):  # PrinterCallback prints each log
        result = trainer.train()
    info = {"loss": result.training_loss, "optimizer": type(trainer.optimizer).__name__,
            "fused": trainer.optimizer.defaults.get("fused")}
    return clock, info, model


def run_plain(shape: dict, compiled: bool, backend: str, save_at: int | None, cuda: bool, out: str):
    """The trainers' work by hand: seeded random order, pinned batches copied without blocking, bf16 autocast,
    fused AdamW over the trainers' weight-decay groups, linear warm-up schedule, clipping, the loss read every
    ``logging`` steps; the save (at ``save_at``) writes the weights and the optimizer state, synchronously."""
    device = torch.device("cuda" if cuda else "cpu")
    total = shape["warmup"] + shape["steps"] + (2 if save_at else 0)
    clock = Clock(shape["warmup"], shape["steps"], cuda)
    model = make_model(shape).to(device)
    data = common.TokenData(shape["batch"] * total, shape["seq"], shape["vocab"])
    reset_peak(cuda)
    torch.manual_seed(SEED)
    loader = DataLoader(data, batch_size=shape["batch"], pin_memory=cuda,
                        sampler=RandomSampler(data, generator=torch.Generator().manual_seed(SEED)))
    opt = torch.optim.AdamW(common.decay_groups(model, WEIGHT_DECAY), lr=LR, fused=common.FUSED_ADAMW or None)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, common.linear_warmup(WARMUP_LR_STEPS, total))
    step_fn = torch.compile(model, backend=backend) if compiled else model
    model.train()
    running, logged, step = torch.zeros((), device=device), [], 0
    for batch in loader:
        clock.step_begin(step)
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = step_fn(**batch)["loss"]
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        running += loss.detach()
        step += 1
        clock.step_end(step)
        if step % shape["logging"] == 0:
            logged.append(running.item() / shape["logging"])
            running.zero_()
        if step == save_at:
            from safetensors.torch import save_file

            folder = os.path.join(out, f"checkpoint-{step}")
            os.makedirs(folder)
            save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
                      os.path.join(folder, "model.safetensors"))
            torch.save(opt.state_dict(), os.path.join(folder, "optimizer.pt"))
        if step >= total:
            break
    return clock, {"loss": statistics.fmean(logged) if logged else math.nan, "optimizer": "AdamW",
                   "fused": common.FUSED_ADAMW or None}, model


def reset_peak(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def measure(runner: str, shape: dict, compiled: bool, backend: str, save: bool, cuda: bool, peak: float | None) -> dict:
    save_at = shape["warmup"] + shape["steps"] + 1 if save else None
    with tempfile.TemporaryDirectory() as out:
        if runner == "plain":
            clock, info, model = run_plain(shape, compiled, backend, save_at, cuda, out)
        else:
            clock, info, model = run_trainer(runner, shape, compiled, backend, save_at, cuda, out)
    seconds = clock.t1 - clock.t0
    tokens = shape["steps"] * shape["batch"] * shape["seq"]
    fpt = flops_per_token(model, shape)
    row = {"runner": runner, "compiled": compiled, "tokens_per_s": tokens / seconds, "timed_s": seconds,
           "step_ms": 1e3 * seconds / shape["steps"], "first_step_s": clock.first_step_s,
           "mfu": tokens * fpt / seconds / peak if peak else None,
           "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
           "save_blocked_s": clock.blocked(save_at) if save_at else None, **info}
    del model
    reset_peak(cuda)
    return row


def ratios(rows: list[dict]) -> list[dict]:
    """cadence against hf and plain for each variant: tokens/s and, eager, the save's blocked time."""
    out = []
    for compiled in sorted({r["compiled"] for r in rows}):
        by = {r["runner"]: r for r in rows if r["compiled"] == compiled}
        variant = "compiled" if compiled else "eager"
        c = by.get("cadence")
        if c is None:
            continue
        for other, key, name in (("hf", "tokens_per_s", "cadence/hf tokens/s"),
                                 ("plain", "tokens_per_s", "cadence/plain tokens/s"),
                                 ("hf", "save_blocked_s", "cadence/hf save blocked")):
            o = by.get(other)
            if o is None or c.get(key) is None or o.get(key) is None:
                continue
            value = c[key] / o[key] if o[key] else math.nan
            good = value <= TARGETS[name] if "blocked" in name else value >= TARGETS[name]
            out.append({"variant": variant, "ratio": name, "value": value, "target": TARGETS[name],
                        "result": "PASS" if good else "MISS"})
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny GPT-2, few steps: a dry run, on a CPU too")
    p.add_argument("--runners", default=",".join(RUNNERS), help="comma-separated, of plain,hf,cadence")
    p.add_argument("--compile", choices=("both", "off", "on"), default="both", help="eager, compiled or both")
    p.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; --tiny: eager)")
    p.add_argument("--batch", type=int, help="sequences per step (default 32; --tiny 4)")
    p.add_argument("--steps", type=int, help="timed steps (default 50; --tiny 5)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default 5; --tiny 2)")
    p.add_argument("--no-save", action="store_true", help="skip the save measured in the eager runs")
    p.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak for MFU (default: cadence's table)")
    p.add_argument("--json", help="write the results here (rewritten after every run)")
    a = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not a.tiny:
        p.error("no CUDA device: the 125M benchmark needs a GPU; --tiny runs the dry run on a CPU")
    shape = dict(SHAPES["tiny" if a.tiny else "full"])
    for key in ("batch", "steps", "warmup"):
        if getattr(a, key) is not None:
            shape[key] = getattr(a, key)
    if shape["steps"] < 2 or shape["warmup"] < 1:
        p.error("--steps must be >= 2 and --warmup >= 1")
    backend = a.compile_backend or ("eager" if a.tiny else "inductor")
    runners = [r for r in a.runners.split(",") if r]
    if set(runners) - set(RUNNERS):
        p.error(f"--runners: unknown {sorted(set(runners) - set(RUNNERS))}; known {list(RUNNERS)}")
    common.quiet_transformers()
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # every runner the same (the trainers leave it at torch's default)
    from cadence.backend import peak_flops

    device = torch.device("cuda" if cuda else "cpu")
    peak = a.peak_tflops * 1e12 if a.peak_tflops else peak_flops(device)
    n_params = sum(t.numel() for t in make_model(shape).parameters())
    head = (f"GPT-2 {n_params / 1e6:.1f}M parameters, bf16 autocast, batch {shape['batch']} x {shape['seq']} tokens, "
            f"{shape['warmup']} warm-up + {shape['steps']} timed steps; "
            f"{torch.cuda.get_device_name() if cuda else 'CPU (dry run)'}, torch {torch.__version__}, "
            f"peak {peak / 1e12 if peak else float('nan'):.1f} TFLOP/s; compile backend {backend}")
    print(head, flush=True)
    variants = {"both": (False, True), "off": (False,), "on": (True,)}[a.compile]
    result = {"header": head, "shape": shape, "device": torch.cuda.get_device_name() if cuda else "cpu",
              "torch": torch.__version__, "peak_flops": peak, "rows": [], "ratios": [], "errors": []}

    def dump():
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)

    for compiled in variants:
        for runner in runners:
            start = time.time()
            try:
                row = measure(runner, shape, compiled, backend, not compiled and not a.no_save, cuda, peak)
            except Exception as error:  # noqa: BLE001 - report it, measure the others
                result["errors"].append(f"{runner} compiled={compiled}: {type(error).__name__}: {error}")
                print(f"  {runner:<8} {'compiled' if compiled else 'eager':<8} FAILED: {result['errors'][-1]}",
                      flush=True)
                dump()
                continue
            row["wall_s"] = time.time() - start
            result["rows"].append(row)
            print(f"  {runner:<8} {'compiled' if compiled else 'eager':<8} {row['tokens_per_s']:>12,.0f} tokens/s  "
                  f"step {row['step_ms']:.1f} ms  first step {row['first_step_s']:.1f} s  loss {row['loss']:.4f}  "
                  f"({row['wall_s']:.0f} s)", flush=True)
            dump()
    result["ratios"] = ratios(result["rows"])
    dump()
    fmt = lambda v, f: "-" if v is None else f.format(v)  # noqa: E731
    print(common.format_table(
        ["runner", "variant", "tokens/s", "MFU", "peak GiB", "save blocked s", "first step s", "loss", "optimizer"],
        [[r["runner"], "compiled" if r["compiled"] else "eager", f"{r['tokens_per_s']:,.0f}", fmt(r["mfu"], "{:.3f}"),
          fmt(r["peak_mem_gib"], "{:.2f}"), fmt(r["save_blocked_s"], "{:.3f}"), f"{r['first_step_s']:.1f}",
          f"{r['loss']:.4f}", f"{r['optimizer']}(fused={r['fused']})"] for r in result["rows"]]))
    if result["ratios"]:
        print(common.format_table(["variant", "ratio", "measured", "target", "result"],
                                  [[r["variant"], r["ratio"], f"{r['value']:.3f}",
                                    ("<= " if "blocked" in r["ratio"] else ">= ") + f"{r['target']:.2f}", r["result"]]
                                   for r in result["ratios"]]))
    for error in result["errors"]:
        print(f"ERROR {error}")
    return result


if __name__ == "__main__":
    sys.exit(1 if main()["errors"] else 0)
