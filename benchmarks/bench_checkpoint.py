"""How long training waits at a save step: cadence against ``transformers.Trainer``, in one process.

The same ~17M-parameter GPT-2 (4 layers, d=512, vocabulary 8192) with AdamW on random tokens, the same seed,
trained with a save every ``SAVE_EVERY`` steps (``--save-every``) by each library. A callback records
``time.perf_counter()`` at every ``on_step_end`` and ``on_step_begin``; the gap from a step's end to the next step's
begin holds that step's save (if any). Blocked time per save = the gap after a save step minus the median gap after the run's non-save
steps. Besides, the whole ``train()`` of cadence saving every ``SAVE_EVERY`` steps is timed against the same run
with ``save_strategy="no"``. The three runs alternate, their order rotated each round; the verdicts use medians
over every save of every round (blocked time) and over the rounds (whole-run ratio).

    .venv/bin/python benchmarks/bench_checkpoint.py             # 5 rounds, about 2.5 minutes on 2 shared cores
    .venv/bin/python benchmarks/bench_checkpoint.py --quick     # 2 rounds of 7 steps, about 1 minute
    .venv/bin/python benchmarks/bench_checkpoint.py --model 70m --repeats 2   # 70M GPT-2: 0.85 GB checkpoints
    .venv/bin/python benchmarks/bench_checkpoint.py --steps 120 --save-every 10 --repeats 2   # writes fit between saves
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

SAVE_EVERY = 3
BLOCKED_TARGET = 0.10  # cadence's blocked time per save <= 0.10 x transformers'
RUN_TARGET = 1.05  # a run saving every SAVE_EVERY steps <= 1.05 x the same run without saves
SHAPES = {  # --model: the 17M GPT-2 the targets are set on, and a larger one (checkpoint 0.9 GB) where memory and time allow
    "17m": dict(vocab=8192, seq_len=64, d=512, n_layer=4, n_head=8),
    "70m": dict(vocab=16384, seq_len=64, d=768, n_layer=8, n_head=12),
}
SHAPE = SHAPES["17m"]
BATCH = 4
RUNS = ("cadence", "hf", "cadence no saves")


def gpt2_17m(shape: dict = SHAPE):
    from transformers import GPT2Config, GPT2LMHeadModel

    s = shape
    cfg = GPT2Config(vocab_size=s["vocab"], n_positions=s["seq_len"], n_embd=s["d"], n_layer=s["n_layer"],
                     n_head=s["n_head"], bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def workload(steps: int, model: str = "17m") -> common.Workload:
    shape = SHAPES[model]
    return common.Workload(
        name=f"gpt2-{model}", make_model=lambda: gpt2_17m(shape),
        make_data=lambda: common.TokenData(BATCH * steps, shape["seq_len"], shape["vocab"]),  # one epoch
        steps=steps, batch_size=BATCH, tokens_per_sample=shape["seq_len"],
        logging_steps=10 * steps,  # no log inside the run: the gaps hold saves only
        warmup_steps=2)


def step_clock(lib: str):
    """A callback of ``lib`` recording when each step ends and the next begins, keyed by ``global_step``.

    Both libraries call ``on_step_end`` with the finished step's number, then save, then ``on_step_begin`` of the
    next step with the same number, so ``begin[s] - end[s]`` is the time between step ``s`` and step ``s + 1``.
    """
    if lib == "cadence":
        from cadence import TrainerCallback
    else:
        from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.end, self.begin = {}, {}

        def on_step_end(self, args, state, control, **kwargs):
            self.end[state.global_step] = time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin[state.global_step] = time.perf_counter()

        def gaps(self) -> dict[int, float]:
            return {s: self.begin[s] - t for s, t in self.end.items() if s in self.begin}

    return StepClock()


def run_once(run: str, wl: common.Workload, every: int = SAVE_EVERY) -> tuple[float, list[float]]:
    """One fresh ``train()``. Returns its seconds and the blocked time of each save followed by a step."""
    lib = run.split()[0]
    with tempfile.TemporaryDirectory() as out:
        base = common.build_trainer(lib, wl, out)  # the benchmarks' usual settings, save_strategy="no"
        saving = run != "cadence no saves"
        args = dataclasses.replace(base.args, save_strategy="steps" if saving else "no", save_steps=every)
        clock = step_clock(lib)
        trainer = type(base)(model=common.fresh_model(wl), args=args, train_dataset=wl.make_data(),
                             callbacks=[clock])
        with contextlib.redirect_stdout(io.StringIO()):
            t0 = time.perf_counter()
            trainer.train()
            seconds = time.perf_counter() - t0
    gaps = clock.gaps()
    normal = statistics.median(g for s, g in gaps.items() if s % every)
    blocked = [g - normal for s, g in gaps.items() if s % every == 0] if saving else []
    return seconds, blocked


def checks(r: dict) -> list[tuple[str, str, str, str]]:
    """``(benchmark, promise, measured, PASS/MISS)`` rows for ``run_all``'s summary."""
    ratio, run_ratio = r["cadence"] / r["hf"], r["run_ratio"]
    return [
        ("save blocked time", f"cadence <= {BLOCKED_TARGET:.2f}x HF",
         f"{r['cadence']:.3f} vs {r['hf']:.3f} s, {ratio:.2f}x", "PASS" if ratio <= BLOCKED_TARGET else "MISS"),
        (f"run, save every {r.get('every', SAVE_EVERY)}", f"<= {RUN_TARGET:.2f}x no saves", f"{run_ratio:.2f}x",
         "PASS" if run_ratio <= RUN_TARGET else "MISS"),
    ]


def main(argv: list[str] | None = None) -> dict:
    """Parse flags, run, print the table. Returns the medians (blocked s per save, run ratio)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=None, help="rounds of the three runs (default 5, --quick 2)")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 10: 3 saves followed by a step, "
                   "then transformers' final save; --quick 7)")
    p.add_argument("--model", choices=sorted(SHAPES), default="17m", help="GPT-2 size (default 17m, the targets' model)")
    p.add_argument("--save-every", type=int, default=SAVE_EVERY, help=f"steps between saves (default {SAVE_EVERY}, "
                   "the targets' interval; a longer one shows the run once each write fits between two saves)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: on a shared machine a second thread "
                   "made steps vary 0.6-4 s; it also leaves a core to a background save)")
    a = p.parse_args(argv)
    every = a.save_every
    if a.steps is not None and a.steps <= every:
        p.error(f"--steps {a.steps}: needs at least {every + 1} (a save step followed by another step)")
    import torch

    torch.set_num_threads(a.threads)
    common.quiet_transformers()
    repeats = a.repeats or (2 if a.quick else 5)
    wl = workload(a.steps or (7 if a.quick else 10), a.model)
    n_params = sum(t.numel() for t in common.fresh_model(wl).parameters())
    print(f"GPT-2 {n_params / 1e6:.1f}M parameters, AdamW, batch {BATCH} x {SHAPES[a.model]['seq_len']} tokens, {wl.steps} "
          f"steps, a save every {every}; torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    run_once("cadence", dataclasses.replace(wl, steps=every + 1), every)  # warm-up: imports, first-call costs
    run_once("hf", dataclasses.replace(wl, steps=every + 1), every)
    blocked = {run: [] for run in RUNS}
    seconds = {run: [] for run in RUNS}
    for i in range(repeats):
        for run in common.rotated(list(RUNS), i):
            s, b = run_once(run, wl, every)
            seconds[run].append(s)
            blocked[run] += b
        print(f"  round {i + 1}/{repeats}: " + "  ".join(f"{run} {seconds[run][-1]:.2f}s" for run in RUNS), flush=True)

    med = {lib: statistics.median(blocked[lib]) for lib in ("cadence", "hf")}
    run_ratio = statistics.median(s / n for s, n in zip(seconds["cadence"], seconds["cadence no saves"]))
    rows = [[run, f"{statistics.median(seconds[run]):.2f}",
             f"{med[run]:.3f}" if run in med else "-",
             f"{min(blocked[run]):.3f} .. {max(blocked[run]):.3f}" if blocked[run] else "-",
             str(len(blocked[run])) if blocked[run] else "-"] for run in RUNS]
    print(common.format_table(["run", "train() s", "blocked s per save (median)", "range", "saves"], rows))
    result = {**med, "run_ratio": run_ratio, "every": every}
    print(common.format_table(["benchmark", "promise", "measured (medians)", "result"],
                              [list(c) for c in checks(result)]))
    return result


if __name__ == "__main__":
    main()
