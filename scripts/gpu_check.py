"""Device checks for a machine with a CUDA GPU (a few minutes; ``scripts/gpu_run.sh`` runs it).

    python scripts/gpu_check.py [--json PATH] [--only NAME,...]   # this checkout's src/ is put first on sys.path

Each check prints one line, PASS/FAIL/SKIP, its name and its numbers; ``--json`` also writes them (rewritten after
every check, so a run stopped by a timeout keeps what it measured). The exit status is the number of failures.
Without CUDA (a dry run on a CPU) every check reports SKIP: those that can run on a CPU still run (their code is
exercised, their numbers printed, no verdict); a check that raises is a FAIL there too, so the dry run finds the
script's own bugs before a GPU's minutes are spent on them.

Checks:
1. bf16: the loss of 20 steps tracks float32 (rel 2e-2), outputs are bfloat16 under autocast.
2. fp16: the loss tracks float32; a step with injected inf gradients is skipped (weights unchanged,
   the schedule does not advance, ``skipped_optimizer_steps`` logged) and the scale backs off.
3. torch_compile (inductor): one compilation for batches padded to 6 different lengths; same losses
   as eager (rel 1e-3); saved keys carry no ``_orig_mod.``.
4. activation checkpointing: same gradients, and ``torch.cuda.max_memory_allocated`` of one training
   step with and without (on a GPT-2 from transformers when installed, else a plain module marked
   with ``checkpoint_modules``).
5. tf32=True is accepted on capability >= 8; torch_empty_cache_steps calls torch.cuda.empty_cache.
6. async_save: pinned snapshot buffers; each checkpoint (every 5 steps) holds exactly its step's weights
   and AdamW moments, as recorded at ``on_step_end`` (a snapshot copy racing the next step would not).
7. DeepSpeed ZeRO-2 and ZeRO-3 (skipped, saying so, without the deepspeed package): 20 steps
   with GA 2 and clipping track the plain float32 run (rel 1e-3); checkpoint-10 holds DeepSpeed's
   global_step* folder, ZeRO-3 also a consolidated model.safetensors
   (stage3_gather_16bit_weights_on_model_save); a run resumed from it ends at the same loss (rel 1e-3), its
   DeepSpeed .pt files passing cadence's weights_only check; a payload planted in a copy's optimizer
   file is refused, naming the file, and never runs.
8. host syncs: 50 bf16 steps under ``torch.cuda.set_sync_debug_mode("warn")``, logging every 10,
   evaluating and saving every 25 (and 20 steps of gradient accumulation 2, logging every 10): every
   "synchronizing CUDA operation" warning counted per step (from one ``on_step_begin`` to the next, so a step's
   count covers its log, evaluation and save, and the next step's work before its ``on_step_begin``), with where
   it came from; PASS when only logging/evaluation/saving steps (and the set-up, and step 1) synchronise.
9. background-save timing: a 25M-parameter model saved every 10 steps, with ``async_save`` and without:
   the time training was blocked per save (the gap after a save step minus the median gap), how many steps the
   background write overlapped, the device time of the step after a save (the snapshot's copies share the
   stream); PASS when every checkpoint holds its step's state, the buffers are pinned and the steady blocked
   time is <= 0.10 x the synchronous save's.
10. memory metrics: ``skip_memory_metrics=False``'s ``init``/``train``/``eval`` ``_mem_gpu_`` numbers
   against ``torch.cuda.memory_allocated``/``max_memory_allocated`` read around the same calls (2 MiB).
11. Liger kernels on a tiny Llama with a 32k vocabulary (SKIP without CUDA or the liger_kernel
   package): ``use_liger_kernel=True`` through cadence, 20 bf16 steps track 20 without (rel 2e-2), Liger modules
   are in use and the training peak memory (``torch.cuda.max_memory_allocated``) is lower than without.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from cadence import Trainer as _Trainer  # noqa: E402
from cadence import TrainerCallback, TrainingArguments  # noqa: E402
from cadence import backend as backend_module  # noqa: E402
from cadence.trainer_callback import PrinterCallback  # noqa: E402


def Trainer(*args, **kwargs):  # noqa: N802 - cadence's Trainer without PrinterCallback: the log holds the checks' lines
    trainer = _Trainer(*args, **kwargs)
    trainer.remove_callback(PrinterCallback)
    return trainer

CUDA = torch.cuda.is_available()
# the models' sizes: on a CPU (the dry run) small, so that every check's code runs in seconds
LM = dict(vocab=256, dim=256, layers=4) if CUDA else dict(vocab=256, dim=32, layers=2)
BIG_LM = dict(vocab=8192, dim=512, layers=8) if CUDA else dict(vocab=512, dim=32, layers=2)  # 25M parameters on CUDA
FAILURES: list[str] = []
RESULTS: list[dict] = []  # one per check: name, status, detail, numbers, seconds
JSON_PATH: str | None = None
ENV: dict = {}  # versions and device (environment()), written with the results
OUT = tempfile.mkdtemp(prefix="gpu_check_")
_started = time.time()


def _write_json() -> None:
    if JSON_PATH:
        with open(JSON_PATH, "w") as f:
            json.dump({"cuda": CUDA, "environment": ENV, "checks": RESULTS, "failures": FAILURES}, f, indent=1,
                      default=str)


def _record(name: str, status: str, detail: str, numbers: dict | None) -> None:
    global _started
    print(f"{status:<5} {name:<34} {detail}", flush=True)
    RESULTS.append({"name": name, "status": status, "detail": detail, "numbers": numbers or {},
                    "seconds": round(time.time() - _started, 2)})
    _started = time.time()
    if status == "FAIL":
        FAILURES.append(name)
    _write_json()


def report(name: str, ok: bool, detail: str, numbers: dict | None = None) -> None:
    """PASS/FAIL on a GPU; on a CPU the check's code ran but its verdict needs CUDA: SKIP with the numbers."""
    if CUDA:
        _record(name, "PASS" if ok else "FAIL", detail, numbers)
    else:
        _record(name, "SKIP", f"(dry run on CPU: the check ran, its verdict needs CUDA) {detail}", numbers)


def skip(name: str, why: str) -> None:
    _record(name, "SKIP", why, None)


def fail(name: str, error: BaseException) -> None:
    """A check that raised: a FAIL on any machine (on a CPU it is a bug of the check or of cadence)."""
    where = traceback.extract_tb(error.__traceback__)[-1]
    _record(name, "FAIL", f"raised {type(error).__name__}: {error} (at {os.path.basename(where.filename)}:"
            f"{where.lineno})", None)


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

    def __init__(self, vocab=LM["vocab"], dim=LM["dim"], layers=LM["layers"], seed=0):
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
                per_device_train_batch_size=8, logging_steps=1, learning_rate=3e-3, seed=1,
                use_cpu=not torch.cuda.is_available())  # the dry run: bf16 on a CPU is asked for, as transformers wants
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
    """async_save on CUDA: the snapshot goes into pinned buffers by non-blocking copies and the writer waits
    on their event; each checkpoint must hold exactly the weights and optimizer state of its own step (a copy racing
    the next optimizer step would hold a later step's values)."""
    from safetensors.torch import load_file

    from cadence.checkpoint_io.formats import safe_load

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
    buffers = list(trainer.checkpointer.writer._buffers.values())
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
        return skip(f"deepspeed ZeRO-{stage}", "the deepspeed package is not installed (carry its wheel: "
                    "scripts/fetch_gpu_wheels.sh)")
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
    # the resume below goes through cadence's check of DeepSpeed's own .pt files (weights_only with
    # DeepSpeed's classes): the genuine files pass it, and a payload planted in a copy is refused and never runs
    import shutil

    from cadence.checkpoint_io.deepspeed_files import check_deepspeed_folder
    from pathlib import Path

    from cadence.checkpoint_io.formats import UnsafeCheckpointError
    from cadence.checkpoint.manifest import write_manifest

    checked = [os.path.relpath(p, ckpt) for p in check_deepspeed_folder(ckpt)]
    resumed = Trainer(TinyLM(), args(f"zero{stage}", **kw), train_dataset=Tokens(), data_collator=collate)
    resumed.train(resume_from_checkpoint=ckpt)
    rel_resume = max_rel(losses(resumed)[-1:], got[-1:])
    planted_copy = os.path.join(OUT, f"zero{stage}_planted", "checkpoint-10")
    shutil.copytree(ckpt, planted_copy)
    target = os.path.join(planted_copy, next(f for f in checked if f.endswith("_optim_states.pt")))
    marker = os.path.join(OUT, f"zero{stage}_payload_ran")
    state = torch.load(target, map_location="cpu", weights_only=False)  # our own file, just written
    state["payload"] = _Payload(marker)
    torch.save(state, target)
    write_manifest(Path(planted_copy))  # as a crafted checkpoint would: its checksums match, the payload must be caught
    try:
        Trainer(TinyLM(), args(f"zero{stage}_planted", **kw), train_dataset=Tokens(),
                data_collator=collate).train(resume_from_checkpoint=planted_copy)
        refused = "not refused"
    except UnsafeCheckpointError as error:
        refused = "refused" if os.path.basename(target) in str(error) and "builtins.exec" in str(error) else str(error)
    except Exception as error:  # noqa: BLE001 - another error is a FAIL with its words in the report
        refused = f"{type(error).__name__}: {error}"
    ran = os.path.exists(marker)
    ok = (rel < 1e-3 and has_ds and (has_weights or stage != 3) and rel_resume < 1e-3 and len(checked) >= 2
          and refused == "refused" and not ran)
    report(f"deepspeed ZeRO-{stage}", ok, f"loss rel {rel:.1e} vs plain, files {sorted(files)}, resumed last loss rel "
           f"{rel_resume:.1e} through the check of {checked}; planted payload: {refused[:200]}, ran: {ran}",
           {"loss_rel": rel, "resume_rel": rel_resume, "files": sorted(files), "checked": checked,
            "planted": refused[:200], "payload_ran": ran})


class _Payload:
    """Unpickled by plain pickle it writes ``marker``: a crafted DeepSpeed file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


SYNC_WARNING = "synchronizing CUDA operation"  # the text of torch.cuda.set_sync_debug_mode("warn")'s warnings


def check_host_syncs(ga: int = 1):
    """50 bf16 steps, a log every 10, an evaluation and a save every 25, under the sync debug mode: every warning is
    attributed to the step it came in (from that step's ``on_step_begin`` to the next one's, so a step's log,
    evaluation and save count as its own), with the line that synchronised and the cadence line above it."""
    steps, log_every, every = (50, 10, 25) if ga == 1 else (20, 10, 25)
    per_step: dict = {}
    current = ["setup"]

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            current[0] = state.global_step + 1

    def show(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING not in str(message):
            return
        stack = traceback.extract_stack()[:-1]
        ours = [f for f in stack if f"{os.sep}cadence{os.sep}" in f.filename]
        where = f"{os.path.basename(filename)}:{lineno}"
        if ours:
            where += f" via {os.path.basename(ours[-1].filename)}:{ours[-1].lineno} {ours[-1].name}"
        per_step.setdefault(current[0], Counter())[where] += 1

    kw = dict(max_steps=steps, logging_steps=log_every, eval_strategy="steps", eval_steps=every,
              save_strategy="steps", save_steps=every, bf16=True, per_device_eval_batch_size=8,
              per_device_train_batch_size=8 // ga, gradient_accumulation_steps=ga)
    trainer = Trainer(TinyLM(), args(f"syncs_ga{ga}", **kw), train_dataset=Tokens(), eval_dataset=Tokens(32, seed=1),
                      data_collator=collate, callbacks=[Clock()])
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show  # restored by catch_warnings
        if CUDA:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.train()
        finally:
            if CUDA:
                torch.cuda.set_sync_debug_mode("default")
    allowed = {"setup", 1} | {s for s in range(1, steps + 1) if s % log_every == 0 or s % every == 0}
    counts = {str(s): sum(c.values()) for s, c in per_step.items()}
    unexpected = {s: c for s, c in per_step.items() if s not in allowed}
    sample = "; ".join(f"step {s}: " + ", ".join(f"{n}x {w}" for w, n in c.most_common(3))
                       for s, c in sorted(unexpected.items())[:3])
    at_allowed = {s: dict(c.most_common(4)) for s, c in per_step.items() if s in allowed}
    total = sum(counts.values())
    report("host syncs (sync debug mode)" + (f", GA {ga}" if ga > 1 else ""), not unexpected,
           f"{total} sync warnings over {steps} steps, per step {counts or 'none'}; at steps not logging, evaluating "
           f"or saving: {len(unexpected)} steps{' (' + sample + ')' if sample else ''}",
           {"per_step": counts, "unexpected_steps": sorted(map(str, unexpected)),
            "where_unexpected": {str(s): dict(c) for s, c in unexpected.items()},
            "where_allowed": {str(s): c for s, c in at_allowed.items()}})


def check_save_timing():
    """Blocked time per save of a 25M-parameter model (300 MB checkpoints), async_save on and off, 40 steps, a save
    every 10. Before each save after the first the previous background write is awaited at the step before (outside
    the measured gaps), so a save's gap holds its own snapshot, not a wait for the save before it."""
    steps, every = 40, 10
    big = BIG_LM
    out = {}
    for mode in ("async", "sync"):
        holder = {}

        class Clock(TrainerCallback):
            def __init__(self):
                self.begin, self.end, self.events, self.overlapped, self.tail, self.seen = {}, {}, {}, Counter(), {}, {}
                self.last_save = None

            def on_step_begin(self, args, state, control, **kwargs):
                self.begin[state.global_step] = time.perf_counter()
                if CUDA:
                    self.events[state.global_step] = torch.cuda.Event(enable_timing=True)
                    self.events[state.global_step].record()

            def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
                s, writer = state.global_step, holder["trainer"].checkpointer.writer
                if self.last_save is not None and not writer.done():
                    self.overlapped[self.last_save] += 1  # this step ran while the write of that save went on
                if s % every == every - 1 and s > every:  # the previous write finishes here, outside the gaps
                    t = time.perf_counter()
                    while not writer.done():
                        time.sleep(0.0005)
                    self.tail[s + 1 - every] = time.perf_counter() - t
                if s % every == 0:
                    self.last_save = s
                    if mode == "async" and s < steps:
                        ordered = [p for group in optimizer.param_groups for p in group["params"]]
                        self.seen[s] = ({k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                                        [optimizer.state[p]["exp_avg"].cpu().clone() for p in ordered])
                self.end[s] = time.perf_counter()  # last: the callback's own work is outside the gap

        clock = Clock()
        trainer = holder["trainer"] = Trainer(
            TinyLM(**big), args(f"save_{mode}", max_steps=steps, save_strategy="steps", save_steps=every,
                                async_save=mode == "async", logging_steps=steps, bf16=True),
            train_dataset=Tokens(400, vocab=big["vocab"]), data_collator=collate, callbacks=[clock])
        trainer.train()
        gaps = {s: clock.begin[s] - t for s, t in clock.end.items() if s in clock.begin}
        normal = statistics.median(g for s, g in gaps.items() if s % every)
        blocked = {s: gaps[s] - normal for s in sorted(gaps) if s % every == 0}
        device_ms = {}
        if CUDA:
            torch.cuda.synchronize()
            windows = {s: clock.events[s - 1].elapsed_time(clock.events[s]) for s in clock.events if s - 1 in clock.events}
            usual = statistics.median(v for s, v in windows.items() if s % every)
            device_ms = {s: windows[s] - usual for s in windows if s % every == 0}  # the save's copies on the stream
        buffers = list(trainer.checkpointer.writer._buffers.values())
        wrong = []
        for s, (weights, moments) in clock.seen.items():
            from safetensors.torch import load_file

            from cadence.checkpoint_io.formats import safe_load

            folder = os.path.join(OUT, f"save_{mode}", f"checkpoint-{s}")
            saved = load_file(os.path.join(folder, "model.safetensors"))
            wrong += [f"{s}:{k}" for k, v in weights.items() if not torch.equal(saved[k], v)]
            state = safe_load(os.path.join(folder, "optimizer.pt"))["state"]
            wrong += [f"{s}:exp_avg[{i}]" for i, m in enumerate(moments) if not torch.equal(state[i]["exp_avg"], m)]
        out[mode] = dict(blocked=blocked, device_ms=device_ms, overlapped=dict(clock.overlapped), tail=clock.tail,
                         pinned=bool(buffers) and all(b.is_pinned() for b in buffers), wrong=wrong, saves=len(clock.seen),
                         normal_gap=normal)
    a, b = out["async"], out["sync"]
    steady = statistics.median(a["blocked"][s] for s in a["blocked"] if every < s < steps)
    sync = statistics.median(b["blocked"][s] for s in b["blocked"] if s < steps)
    overlapped = [a["overlapped"].get(s, 0) for s in a["blocked"] if s < steps]
    ok = (a["pinned"] and not a["wrong"] and a["saves"] == steps // every - 1 and steady <= 0.10 * sync
          and all(n >= 1 for n in overlapped))
    fmt = lambda d: ", ".join(f"{s}: {v * 1e3:.1f}" for s, v in d.items())  # noqa: E731
    report("background save timing", ok,
           f"blocked ms per save async {{{fmt(a['blocked'])}}} (steady median {steady * 1e3:.1f}) vs sync "
           f"{{{fmt(b['blocked'])}}} (median {sync * 1e3:.1f}): {steady / sync if sync else float('nan'):.3f}x "
           f"(target <= 0.10); steps each write overlapped {overlapped}; write tails awaited ms "
           f"{ {s: round(v * 1e3, 1) for s, v in a['tail'].items()} }; extra device ms of the save step "
           f"{ {s: round(v, 2) for s, v in a['device_ms'].items()} }; pinned {a['pinned']}; entries differing from "
           f"their step's state: {a['wrong'][:5] or 'none'}",
           {"async": a, "sync": b, "steady_async_blocked_s": steady, "sync_blocked_s": sync})


def check_memory_metrics():
    """skip_memory_metrics=False against torch's own counters read around the same calls; the model (25M parameters)
    moves to the GPU in ``Trainer.__init__``, AdamW's moments stay allocated after ``train()``."""
    tolerance = 2 * 2**20

    def allocated():
        if CUDA:
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        return 0

    def peak():
        return torch.cuda.max_memory_allocated() if CUDA else 0

    def reset():
        gc.collect()
        if CUDA:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    model = TinyLM(**BIG_LM)
    model_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    reset()
    before_init = allocated()
    trainer = Trainer(model, args("memory", max_steps=10, skip_memory_metrics=False),
                      train_dataset=Tokens(vocab=BIG_LM["vocab"]), eval_dataset=Tokens(64, vocab=BIG_LM["vocab"], seed=1),
                      data_collator=collate)
    init = allocated() - before_init
    reset()
    before = allocated()
    metrics = trainer.train().metrics
    train_peak, train_alloc = peak(), allocated() - before
    reset()
    before_eval = allocated()
    eval_metrics = trainer.evaluate()
    eval_peak, eval_alloc = peak(), allocated() - before_eval
    ours = {"init_alloc": metrics.get("init_mem_gpu_alloc_delta"), "train_alloc": metrics.get("train_mem_gpu_alloc_delta"),
            "train_peaked": metrics.get("train_mem_gpu_peaked_delta"), "eval_alloc": eval_metrics.get("eval_mem_gpu_alloc_delta"),
            "eval_peaked": eval_metrics.get("eval_mem_gpu_peaked_delta")}
    torchs = {"init_alloc": init, "train_alloc": train_alloc, "train_peak": train_peak - before,
              "eval_alloc": eval_alloc, "eval_peak": eval_peak - before_eval}
    if any(v is None for v in ours.values()):
        missing = sorted(k for k, v in ours.items() if v is None)
        cpu = {k: v for k, v in {**metrics, **eval_metrics}.items() if "_mem_" in k}
        return report("memory metrics vs torch.cuda", False, f"no GPU memory metrics {missing}; reported: {cpu}",
                      {"reported": cpu})
    pairs = {"init alloc": (ours["init_alloc"], init), "train alloc": (ours["train_alloc"], train_alloc),
             "train peak": (ours["train_alloc"] + ours["train_peaked"], train_peak - before),
             "eval alloc": (ours["eval_alloc"], eval_alloc),
             "eval peak": (ours["eval_alloc"] + ours["eval_peaked"], eval_peak - before_eval)}
    off = {k: a - b for k, (a, b) in pairs.items()}
    ok = all(abs(v) <= tolerance for v in off.values()) and abs(init - model_bytes) <= tolerance \
        and train_alloc >= 1.9 * model_bytes  # AdamW's two moments stay
    mib = lambda v: f"{v / 2**20:.1f}"  # noqa: E731
    report("memory metrics vs torch.cuda", ok,
           "MiB cadence/torch: " + ", ".join(f"{k} {mib(a)}/{mib(b)}" for k, (a, b) in pairs.items())
           + f"; model {mib(model_bytes)} MiB; tolerance {mib(tolerance)}", {"cadence": ours, "torch": torchs,
                                                                             "model_bytes": model_bytes})


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


def check_liger():
    """``use_liger_kernel=True`` through cadence on a tiny Llama with a 32k vocabulary (where Liger's fused linear
    cross-entropy matters): 20 bf16 steps track 20 without Liger (rel 2e-2: Liger's RMSNorm/RoPE/SwiGLU kernels
    round differently in bf16), Liger code runs in the model, and the training peak memory is lower."""
    name = "liger kernels on a tiny Llama"
    try:
        import liger_kernel  # noqa: F401
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as error:
        return skip(name, f"{error.name} is not installed (carry its wheel: scripts/fetch_gpu_wheels.sh)")
    vocab = 32000

    def make():
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512))

    def measured(tag, **kw):
        model = make().to("cuda")
        trainer = Trainer(model, args(tag, bf16=True, **kw), train_dataset=Tokens(vocab=vocab, lengths=(256, 257)),
                          data_collator=collate)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        trainer.train()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        return trainer, model, peak

    plain, _, plain_peak = measured("llama")
    del _
    gc.collect()
    torch.cuda.empty_cache()
    liger, model, liger_peak = measured("llama_liger", use_liger_kernel=True)
    used = sorted({type(m).__name__ for m in model.modules()
                   if "liger" in type(m).__module__ or "liger" in getattr(getattr(m.forward, "__func__", m.forward),
                                                                          "__module__", "")})
    forward = getattr(type(model).forward, "__module__", "")  # Liger swaps the causal-LM forward for its fused one
    rel = max_rel(losses(liger), losses(plain))
    mib = lambda v: f"{v / 2**20:.0f}"  # noqa: E731
    report(name, rel < 2e-2 and bool(used) and liger_peak < plain_peak,
           f"max rel loss diff {rel:.2e} over 20 bf16 steps (tolerance 2e-2); peak training memory {mib(liger_peak)} "
           f"MiB with Liger vs {mib(plain_peak)} MiB without; modules running Liger code: {used or 'none'}; "
           f"forward from {forward}",
           {"loss_rel": rel, "liger_modules": used, "peak_liger": liger_peak, "peak_plain": plain_peak,
            "forward_module": forward})


def environment() -> dict:
    """Versions and the device, for the JSON and the log's first line."""
    import importlib.metadata as md
    import platform

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name() if CUDA else "cpu",
           "capability": list(torch.cuda.get_device_capability()) if CUDA else None}
    for package in ("transformers", "accelerate", "deepspeed", "liger-kernel", "safetensors", "triton", "numpy"):
        try:
            env[package] = md.version(package)
        except md.PackageNotFoundError:
            env[package] = None
    return env


def main(argv: list[str] | None = None) -> int:
    global JSON_PATH, _started
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write every check's result here (rewritten after each check)")
    parser.add_argument("--only", help="comma-separated check names (the keys printed by --list)")
    parser.add_argument("--list", action="store_true", help="print the check names and exit")
    a = parser.parse_args(argv)
    JSON_PATH = a.json
    env = ENV.update(environment()) or ENV
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()), flush=True)
    if not CUDA:
        print("no CUDA device: a dry run (checks that need CUDA are skipped, the others run without a verdict)")
    start = time.time()
    cache: dict = {}

    def fp32_run():  # the float32 reference of the bf16/fp16/compile checks, run once when first needed
        if "fp32" not in cache:
            cache["fp32"] = run("fp32")[0]
        return cache["fp32"]

    def fp32_ga():  # the DeepSpeed runs use batch 4 x GA 2: their float32 reference has the same global batch (8)
        if "ga" not in cache:
            cache["ga"] = losses(run("fp32_ga", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                     max_grad_norm=1.0)[0])
        return cache["ga"]

    needs_cuda = "needs CUDA"
    checks = {  # name -> (the check, why it cannot run without CUDA, or None when it runs as a dry run)
        "bf16": (lambda: check_bf16(losses(fp32_run())), None),
        "fp16": (lambda: check_fp16(losses(fp32_run())), f"{needs_cuda} (fp16 loss scaling)"),
        "compile": (lambda: check_compile(fp32_run()), f"{needs_cuda} (inductor's GPU kernels)"),
        "checkpointing": (check_checkpointing, f"{needs_cuda} (torch.cuda.max_memory_allocated)"),
        "tf32/empty_cache": (check_tf32_and_cache, f"{needs_cuda} (tf32 and the CUDA cache)"),
        "async_save": (check_async_save, None),
        "syncs": (check_host_syncs, None),
        "syncs_ga2": (lambda: check_host_syncs(ga=2), None),  # the step's item count is summed before its first micro-batch
        "save_timing": (check_save_timing, None),
        "memory": (check_memory_metrics, None),
        "liger": (check_liger, f"{needs_cuda} (Liger's Triton kernels; cadence refuses use_liger_kernel on a CPU)"),
        "low-bit optimizers": (lambda: check_low_bit_optimizers(losses(fp32_run())), f"{needs_cuda} (galore_adamw_8bit calls CUDA)"),
        # last: they initialise torch.distributed
        "deepspeed ZeRO-2": (lambda: check_deepspeed(fp32_ga(), 2), f"{needs_cuda} (DeepSpeed)"),
        "deepspeed ZeRO-3": (lambda: check_deepspeed(fp32_ga(), 3), f"{needs_cuda} (DeepSpeed)"),
    }
    if a.list:
        print("\n".join(checks))
        return 0
    only = set(a.only.split(",")) if a.only else set(checks)
    unknown = only - set(checks)
    if unknown:
        parser.error(f"--only: unknown check(s) {sorted(unknown)}; known: {list(checks)}")
    if JSON_PATH:
        RESULTS.clear()
        _write_json()
    for name, (check, why_not) in checks.items():
        if name not in only:
            continue
        _started = time.time()
        if why_not and not CUDA:
            skip(name, why_not)
            continue
        try:
            check()
        except Exception as error:  # noqa: BLE001 - report every check, then fail
            fail(name, error)
    ENV["seconds"] = round(time.time() - start, 1)
    _write_json()
    print(f"{len(FAILURES)} failure(s) in {time.time() - start:.0f}s: {FAILURES}")
    return len(FAILURES)


if __name__ == "__main__":
    sys.exit(main())
