"""Training runs of one library's trainers, on transformers' Trainer or (``--cadence``) on cadence's:
``cadence.patch_transformers()`` runs before the library is imported, so its trainer classes are built on cadence.
The library's module here (``lib_<name>.py``) builds each case's tiny model, data and trainer.

    python scripts/libraries/worker.py LIB OUT_DIR CASE [CASE ...] [--cadence] [--resume] [--batch B] [--eval-batch E]

(or under torchrun, ``--batch`` being the per-process batch). Every run trains 4 steps, evaluating and saving every
2. The cases run one after the other in this process: importing a library costs far more than its tiny run (35 s
against 2 s on a loaded 2-core machine), and each case builds its own trainer, which seeds everything. With
``--resume``, each case is trained again from its run's ``checkpoint-2`` (copied into a fresh folder; a new trainer,
as after a restart), to compare with the unbroken run. Per case, rank 0 writes ``OUT_DIR/CASE/run.pt`` (and
``resumed.pt``): ``{"logs": [(step, key, value), ...], "weights": {name: tensor}, "bf16": bool, "versions": {...},
"base": the trainer's base class's module}``, or ``run.err`` / ``resumed.err`` with the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_STEPS, EVERY = 4, 2


def common_args(out_dir: str, batch: int, eval_batch: int) -> dict:
    """The TrainingArguments every row shares: evaluate and save mid-run, log every step. The eval set (8 rows) is
    one batch a process: cadence's eval loss is weighted by items where transformers' weights batch means by rows
    (a deliberate difference, in the README), and over one batch the two are the same number."""
    return dict(output_dir=out_dir, max_steps=MAX_STEPS, per_device_train_batch_size=batch,
                per_device_eval_batch_size=eval_batch, logging_steps=1, eval_strategy="steps", eval_steps=EVERY,
                save_strategy="steps", save_steps=EVERY, seed=7, data_seed=7, report_to="none", use_cpu=True,
                disable_tqdm=True, dataloader_num_workers=0, lr_scheduler_type="linear", warmup_steps=1)


def logged(history) -> list:
    return [(h.get("step"), k, float(v)) for h in history for k, v in h.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"]


def one_run(lib, case: str, out_dir: str, batch: int, eval_batch: int, cadence: bool, resume: bool) -> dict:
    import transformers

    trainer = lib.build(case, out_dir, common_args(out_dir, batch, eval_batch))
    inner = getattr(lib, "hf_trainer", lambda t: t)(trainer)  # the transformers-style Trainer doing the work
    if cadence:  # the run must really be on cadence
        import cadence as cadence_pkg

        assert isinstance(inner, cadence_pkg.Trainer), type(inner).__mro__
    if hasattr(lib, "train"):
        inner = lib.train(trainer, resume) or inner
    else:
        trainer.train(resume_from_checkpoint=True if resume else None)
    model = getattr(lib, "trained_model", lambda t, i: i.model)(trainer, inner)
    return {"logs": logged(inner.state.log_history),
            "weights": {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()},
            "bf16": bool(getattr(inner.args, "bf16", False)),
            "versions": {"library": lib.version(), "transformers": transformers.__version__},
            "base": next(c.__module__ for c in type(inner).__mro__ if c.__name__ == "Trainer"),
            "main": inner.is_world_process_zero()}


def attempt(lib, case: str, folder: str, name: str, **kw) -> bool:
    import torch

    os.makedirs(folder, exist_ok=True)
    try:
        result = one_run(lib, case, folder, **kw)
    except Exception:
        rank = int(os.environ.get("RANK", "0"))  # another rank's error beside the first's: why a collective failed
        with open(os.path.join(os.path.dirname(folder), f"{name}.err" if rank == 0 else f"{name}.rank{rank}.err"),
                  "w") as f:
            f.write(traceback.format_exc())
        traceback.print_exc()
        return False
    if result.pop("main"):
        torch.save(result, os.path.join(os.path.dirname(folder), f"{name}.pt"))
    return True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("lib")
    p.add_argument("out_dir")
    p.add_argument("cases", nargs="+")
    p.add_argument("--cadence", action="store_true")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--eval-batch", type=int, default=8)
    opts = p.parse_args()
    opts.out_dir = os.path.abspath(opts.out_dir)  # a library's build may change the working directory
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if opts.cadence:
        import cadence

        cadence.patch_transformers()
    sys.path.insert(0, HERE)
    lib = importlib.import_module(f"lib_{opts.lib}")
    for case in opts.cases:
        base = os.path.join(opts.out_dir, case)
        shutil.rmtree(base, ignore_errors=True)
        kw = dict(batch=opts.batch, eval_batch=opts.eval_batch, cadence=opts.cadence)
        if attempt(lib, case, os.path.join(base, "run"), "run", resume=False, **kw) and opts.resume:
            resumed, checkpoint = os.path.join(base, "resumed"), os.path.join(base, "run", f"checkpoint-{EVERY}")
            if os.path.isdir(checkpoint):
                shutil.copytree(checkpoint, os.path.join(resumed, f"checkpoint-{EVERY}"))
                attempt(lib, case, resumed, "resumed", resume=True, **kw)
            elif int(os.environ.get("RANK", "0")) == 0:
                with open(os.path.join(base, "resumed.err"), "w") as f:
                    f.write(f"the run saved no checkpoint-{EVERY}: {sorted(os.listdir(os.path.dirname(checkpoint)))}\n")
        print(f"done {case}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
