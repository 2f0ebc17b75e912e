"""Device checks of issue 6 for a machine with a CUDA GPU (runs in well under 3 minutes).

    python scripts/gpu_check.py            # PYTHONPATH is set to this checkout's src/ by the script

Checks, each printed as one line with its numbers, and the exit status is the number of failures:
1. bf16: the loss of 20 steps tracks float32 (rel 2e-2), outputs are bfloat16 under autocast.
2. fp16: the loss tracks float32; a step with injected inf gradients is skipped (weights unchanged,
   the schedule does not advance, ``skipped_optimizer_steps`` logged) and the scale backs off.
3. torch_compile (inductor): one compilation for batches padded to 6 different lengths; same losses
   as eager (rel 1e-3); saved keys carry no ``_orig_mod.``.
4. activation checkpointing: same gradients, and ``torch.cuda.max_memory_allocated`` of one training
   step with and without (on a GPT-2 from transformers when installed, else a plain module marked
   with ``checkpoint_modules``).
5. tf32=True is accepted on capability >= 8; torch_empty_cache_steps calls torch.cuda.empty_cache.
6. async_save (issue 21): pinned snapshot buffers; each checkpoint (every 5 steps) holds exactly its step's weights
   and AdamW moments, as recorded at ``on_step_end`` (a snapshot copy racing the next step would not).
7. DeepSpeed ZeRO-2 and ZeRO-3 (issue 13; skipped, saying so, without the deepspeed package): 20 steps
   with GA 2 and clipping track the plain float32 run (rel 1e-3); checkpoint-10 holds DeepSpeed's
   global_step* folder, ZeRO-3 also a consolidated model.safetensors
   (stage3_gather_16bit_weights_on_model_save); a run resumed from it ends at the same loss (rel 1e-3).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from cadence import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from cadence import backend as backend_module  # noqa: E402

FAILURES: list[str] = []
OUT = tempfile.mkdtemp(prefix="gpu_check_")


def report(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name:<34} {detail}", flush=True)
    if not ok:
        FAILURES.append(name)


class Tokens(torch.utils.data.Dataset):
    """Random token rows of varied length (8..64) over 256 tokens; labels = input ids."""

    def __init__(self, n=160, vocab=256, seed=0, lengths=(8, 64)):
        g = torch.Generator().manual_seed(seed)
        self.rows = [torch.randint(0, vocab, (int(torch.randint(*lengths, (1,), generator=g)),), generator=g)
                     for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def collate(rows, multiple=None):
    n = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    labels = torch.full((len(rows), n), -100)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = r["input_ids"]
        labels[i, : len(r["labels"])] = r["labels"]
    return {"input_ids": ids, "labels": labels}


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """Embedding -> MLP blocks -> head; per-token loss. Blocks are marked for checkpointing."""

    checkpoint_modules = ["Block"]

    def __init__(self, vocab=256, dim=256, layers=4, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, labels=None):
        logits = self.head(self.blocks(self.emb(input_ids)))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return out


def args(name, **kw):
    base = dict(output_dir=f"{OUT}/{name}", disable_tqdm=True, save_strategy="no", report_to="none", max_steps=20,
                per_device_train_batch_size=8, logging_steps=1, learning_rate=3e-3, seed=1)
    base.update(kw)
    return TrainingArguments(**base)


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def run(name, model=None, **kw):
    model = model if model is not None else TinyLM()
    trainer = Trainer(model, args(name, **kw), train_dataset=Tokens(), data_collator=collate)
    trainer.train()
    return trainer, model


def max_rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def check_bf16(fp32):
    dtypes = set()
    model = TinyLM()
    model.head.register_forward_hook(lambda m, i, o: dtypes.add(o.dtype))
    trainer, _ = run("bf16", model, bf16=True)
    rel = max_rel(losses(trainer), fp32)
    report("bf16 autocast tracks fp32", rel < 2e-2 and dtypes == {torch.bfloat16},
           f"max rel loss diff {rel:.2e} over 20 steps; head output dtypes {sorted(map(str, dtypes))}")


class InjectInf(TrainerCallback):
    def __init__(self, param, bad_step):
        self.bad_step, self.active, self.weights = bad_step, False, []
        self.param = param
        param.register_hook(lambda g: g * float("inf") if self.active else g)

    def on_step_begin(self, args, state, control, **kwargs):
        self.active = state.global_step + 1 == self.bad_step

    def on_step_end(self, args, state, control, **kwargs):
        self.weights.append(self.param.detach().clone())


def check_fp16(fp32):
    trainer, _ = run("fp16", fp16=True)
    rel = max_rel(losses(trainer), fp32)
    natural = sum(h.get("skipped_optimizer_steps", 0) for h in trainer.state.log_history)
    report("fp16 autocast tracks fp32", rel < 2e-2, f"max rel loss diff {rel:.2e}; steps skipped by overflow: {natural}")
    model = TinyLM()
    spy = InjectInf(model.head.weight, bad_step=natural + 3)
    trainer = Trainer(model, args("fp16_inf", fp16=True, max_steps=natural + 5, lr_scheduler_type="linear"),
                      train_dataset=Tokens(), data_collator=collate, callbacks=[spy])
    scale0 = trainer.backend.scaler.get_scale()
    trainer.train()
    skipped = sum(h.get("skipped_optimizer_steps", 0) for h in trainer.state.log_history)
    k = natural + 2
    ok = (skipped == natural + 1 and torch.equal(spy.weights[k], spy.weights[k - 1])
          and trainer.lr_scheduler.last_epoch == trainer.state.global_step - skipped)
    report("fp16 scaler skips an inf step", ok,
           f"skipped {skipped} (expected {natural + 1}); scheduler steps {trainer.lr_scheduler.last_epoch} of "
           f"{trainer.state.global_step}; scale {scale0:g} -> {trainer.backend.scaler.get_scale():g}")


def check_compile(fp32_trainer):
    import torch._dynamo
    from safetensors.torch import load_file
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    start = time.time()
    trainer, model = run("compile", torch_compile=True, save_strategy="steps", save_steps=20)
    seconds = time.time() - start
    keys = sorted(load_file(f"{OUT}/compile/checkpoint-20/model.safetensors"))
    rel = max_rel(losses(trainer), losses(fp32_trainer))
    frames = counters["frames"]["ok"]
    ok = frames == 1 and rel < 1e-3 and keys == sorted(TinyLM().state_dict()) and not any("_orig_mod" in k for k in keys)
    lengths = {collate([trainer.train_dataset[i] for i in range(j, j + 8)])["input_ids"].shape[1] for j in range(0, 160, 8)}
    report("torch_compile inductor", ok, f"compiled frames {frames} (data pads to {len(lengths)} lengths in order); max rel loss "
           f"diff vs eager {rel:.2e}; clean keys {keys == sorted(TinyLM().state_dict())}; {seconds:.1f}s")


def peak_step(model, **kw):
    grads = {}

    class Grab(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})

    ds = Tokens(16, vocab=256, lengths=(512, 513))
    trainer = Trainer(model, args("ckpt", max_steps=1, optim="sgd", max_grad_norm=0.0, **kw), train_dataset=ds,
                      data_collator=collate, callbacks=[Grab()])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    trainer.train()
    torch.cuda.synchronize()
    return grads, torch.cuda.max_memory_allocated() - base


def check_checkpointing():
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        def make():
            torch.manual_seed(0)
            return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=512, n_embd=256, n_layer=6, n_head=4,
                                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        what = "GPT-2 6x256, batch 8 x 512 tokens"
    except ImportError:
        def make():
            return TinyLM(layers=6)
        what = "TinyLM 6x256 (checkpoint_modules), batch 8 x 512 tokens"
    g_off, peak_off = peak_step(make())
    g_on, peak_on = peak_step(make(), gradient_checkpointing=True)
    worst = max((g_on[n] - g).abs().max().item() / max(g.abs().max().item(), 1e-12) for n, g in g_off.items())
    ok = worst < 1e-3 and peak_on < peak_off
    report("activation checkpointing memory", ok, f"{what}: peak {peak_off / 2**20:.1f} MiB without, "
           f"{peak_on / 2**20:.1f} MiB with ({peak_on / peak_off:.2f}x); max rel grad diff {worst:.1e}")


def check_tf32_and_cache():
    calls = []
    real = backend_module._EMPTY_CACHE["cuda"]
    backend_module._EMPTY_CACHE["cuda"] = lambda: (calls.append(1), real())
    try:
        capable = torch.cuda.get_device_capability()[0] >= 8
        try:
            run("tf32", tf32=True, max_steps=4, torch_empty_cache_steps=2)
            ok = capable and torch.backends.cuda.matmul.allow_tf32 and len(calls) == 2
            detail = f"tf32 on: {torch.backends.cuda.matmul.allow_tf32}; empty_cache calls {len(calls)} (expected 2)"
        except ValueError as error:
            ok, detail = not capable, f"refused on capability < 8: {error}"
    finally:
        backend_module._EMPTY_CACHE["cuda"] = real
    report("tf32 and torch_empty_cache_steps", ok, detail)


def check_async_save():
    """async_save on CUDA (issue 21): the snapshot goes into pinned buffers by non-blocking copies and the writer waits
    on their event; each checkpoint must hold exactly the weights and optimizer state of its own step (a copy racing
    the next optimizer step would hold a later step's values)."""
    from safetensors.torch import load_file

    from cadence.checkpoint.formats import safe_load

    seen = {}

    class Record(TrainerCallback):  # on_step_end comes before the save of the same step
        def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
            if state.global_step % 5 == 0:
                weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
                ordered = [p for group in optimizer.param_groups for p in group["params"]]  # optimizer.pt's numbers
                moments = [optimizer.state[p]["exp_avg"].cpu().clone() for p in ordered]
                seen[state.global_step] = (weights, moments)

    trainer = Trainer(TinyLM(), args("async_save", save_strategy="steps", save_steps=5, async_save=True),
                      train_dataset=Tokens(), data_collator=collate, callbacks=[Record()])
    trainer.train()
    buffers = list(trainer._checkpoint_writer._buffers.values())
    pinned = bool(buffers) and all(b.is_pinned() for b in buffers)
    wrong = []
    for step, (weights, moments) in seen.items():
        folder = os.path.join(OUT, "async_save", f"checkpoint-{step}")
        saved = load_file(os.path.join(folder, "model.safetensors"))
        wrong += [f"{step}:{k}" for k, v in weights.items() if not torch.equal(saved[k], v)]
        state = safe_load(os.path.join(folder, "optimizer.pt"))["state"]
        wrong += [f"{step}:exp_avg[{i}]" for i, m in enumerate(moments) if not torch.equal(state[i]["exp_avg"], m)]
    ok = pinned and len(seen) == 4 and not wrong
    report("async_save snapshot on CUDA", ok, f"{len(seen)} checkpoints, {len(buffers)} buffers pinned: {pinned}; "
           f"entries differing from their step's live state: {wrong[:5] or 'none'}")


def check_deepspeed(fp32, stage):
    """ZeRO `stage` on this one GPU, through accelerate's DeepSpeedPlugin (run last: it initialises torch.distributed)."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        print(f"SKIP  deepspeed ZeRO-{stage}: the deepspeed package is not installed (pip install deepspeed)")
        return
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29517")):
        os.environ.setdefault(name, value)
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "gradient_clipping": "auto", "train_batch_size": "auto",
              "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": stage == 3}}
    kw = dict(deepspeed=config, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_grad_norm=1.0,
              save_strategy="steps", save_steps=10)
    trainer, _ = run(f"zero{stage}", **kw)
    got = losses(trainer)
    ckpt = os.path.join(OUT, f"zero{stage}", "checkpoint-10")
    files = os.listdir(ckpt)
    has_ds = any(f.startswith("global_step") for f in files)
    has_weights = "model.safetensors" in files
    rel = max_rel(got, fp32)
    resumed = Trainer(TinyLM(), args(f"zero{stage}", **kw), train_dataset=Tokens(), data_collator=collate)
    resumed.train(resume_from_checkpoint=ckpt)
    rel_resume = max_rel(losses(resumed)[-1:], got[-1:])
    ok = rel < 1e-3 and has_ds and (has_weights or stage != 3) and rel_resume < 1e-3
    report(f"deepspeed ZeRO-{stage}", ok, f"loss rel {rel:.1e} vs plain, files {sorted(files)}, resumed last loss rel {rel_resume:.1e}")


def check_low_bit_optimizers(fp32):
    """galore_adamw_8bit (its package calls CUDA, so CPUs cannot test it) against galore_adamw, and torchao's 8-bit
    AdamW against the float32 run (adamw_torch): 8-bit moments change the losses a little, so the last loss must be
    within 5% of its 32-bit twin's (a wrong update, e.g. projectors lost, moves it by far more in 20 steps)."""
    galore = dict(optim_target_modules=["up", "down"], optim_args="rank=32,update_proj_gap=10")
    full = losses(run("galore32", optim="galore_adamw", **galore)[0])
    eight = losses(run("galore8", optim="galore_adamw_8bit", **galore)[0])
    torchao = losses(run("torchao8", optim="adamw_torch_8bit")[0])
    rel_galore, rel_torchao = max_rel(eight[-1:], full[-1:]), max_rel(torchao[-1:], fp32[-1:])
    report("galore 8-bit / torchao 8-bit", rel_galore < 5e-2 and rel_torchao < 5e-2,
           f"last loss rel {rel_galore:.1e} vs galore_adamw, {rel_torchao:.1e} vs adamw_torch")


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    print(f"{torch.cuda.get_device_name()} (capability {torch.cuda.get_device_capability()}), torch {torch.__version__}")
    start = time.time()
    fp32_trainer, _ = run("fp32")
    fp32 = losses(fp32_trainer)
    checks = {"bf16": lambda: check_bf16(fp32), "fp16": lambda: check_fp16(fp32),
              "compile": lambda: check_compile(fp32_trainer), "checkpointing": check_checkpointing,
              "tf32/empty_cache": check_tf32_and_cache, "async_save": check_async_save,
              "deepspeed ZeRO-2": lambda: check_deepspeed(fp32_ga, 2), "deepspeed ZeRO-3": lambda: check_deepspeed(fp32_ga, 3),
              "low-bit optimizers": lambda: check_low_bit_optimizers(fp32)}
    # the DeepSpeed runs use batch 4 x GA 2: their plain float32 reference has the same global batch (8)
    fp32_ga = losses(run("fp32_ga", per_device_train_batch_size=4, gradient_accumulation_steps=2, max_grad_norm=1.0)[0])
    for name, check in checks.items():
        try:
            check()
        except Exception as error:  # noqa: BLE001 - report every check, then fail
            report(name, False, f"raised {type(error).__name__}: {error}")
    print(f"{len(FAILURES)} failure(s) in {time.time() - start:.0f}s: {FAILURES}")
    return len(FAILURES)


if __name__ == "__main__":
    sys.exit(main())
