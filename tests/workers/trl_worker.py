"""One TRL trainer on a tiny model, on transformers' Trainer or (``--cadence``) on cadence's, in its own process.

    python tests/workers/trl_worker.py CASE OUT_DIR [--cadence] [--max-steps N] [--resume] [--batch B]
    python tests/workers/trl_worker.py --jobs JOBS.json [--cadence]

(or under torchrun: ``--batch`` is then the per-process batch). ``--jobs`` runs several trainings one after the other
in this one process, each job a list of the arguments above (``[CASE, OUT_DIR, "--max-steps", "3", ...]``): importing
transformers and trl takes ~9 of the ~10 seconds a one-case process runs, so the tests run every case one library
compares in a single process. A job that fails writes its traceback to ``OUT_DIR/error-rank{N}.txt`` and the next job
runs; each job seeds its model and its Trainer itself, so it trains as in a process of its own.

Writes ``OUT_DIR/result.pt``: ``{"losses": [(step, key, value), ...], "weights": {name: tensor}}`` (every number
the run logged, timings included; the test picks what to compare). With
``--cadence``, ``cadence.patch_transformers()`` runs before trl is imported, so every TRL class is built on cadence.
Everything is local: the library matrix's tiny word-level tokenizer and Llama models (scripts/libraries/tiny.py),
``datasets.Dataset.from_list`` data.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import sys
import traceback
import warnings


def _library_tiny():
    """scripts/libraries/tiny.py, the library matrix's tiny models and data, loaded by path (tests/tiny.py is the
    ``tiny`` of the tests)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts", "libraries", "tiny.py")
    spec = importlib.util.spec_from_file_location("library_tiny", path)
    module = sys.modules.setdefault("library_tiny", importlib.util.module_from_spec(spec))
    if not hasattr(module, "tokenizer"):
        spec.loader.exec_module(module)
    return module


tiny = _library_tiny()
sentence, toy_reward, model, saved = tiny.sentence, tiny.toy_reward, tiny.llama, tiny.saved_llama
KINDS = {"sft_text": "text", "sft_packing": "text", "sft_lora": "text", "sft_chat": "messages",
         "sft_completion": "completion", "kto": "unpaired", "reward": "implicit", "orpo": "preference",
         "cpo": "preference", "grpo": "prompt", "rloo": "prompt", "distillation": "prompt", "online_dpo": "prompt"}


def tokenizer():
    """The matrix's word-level tokenizer with the chat specials only (no BERT tokens)."""
    return tiny.tokenizer(specials=tiny.SPECIALS[:7])


def rows(case: str, n: int = 16) -> list[dict]:
    return tiny.rows("preference" if case.startswith("dpo") else KINDS[case], n)


COMMON = dict(per_device_train_batch_size=4, learning_rate=5e-3, logging_steps=1, report_to=[], save_strategy="no",
              seed=7, data_seed=7, lr_scheduler_type="linear", warmup_steps=1, disable_tqdm=True,
              dataloader_num_workers=0, use_cpu=True)


def build(case: str, out_dir: str, max_steps: int, save_steps: int | None, batch: int = 4):
    import trl
    from datasets import Dataset

    tok = tokenizer()
    common = dict(COMMON, output_dir=out_dir, max_steps=max_steps, per_device_train_batch_size=batch)
    dtype = None
    if case.endswith("_fp32"):  # TRL's configs default to bf16 where the device has it (CPUs do)
        case, common["bf16"] = case[: -len("_fp32")], False
    if case.endswith("_fp64"):  # float64: layouts compared to 1e-6 without float32's reduction-order noise
        import torch

        case, common["bf16"], dtype = case[: -len("_fp64")], False, torch.float64
    if save_steps:
        common.update(save_strategy="steps", save_steps=save_steps)
    data = Dataset.from_list(rows(case))
    if case.startswith("sft"):
        extra = {"packing": True, "max_length": 32} if case == "sft_packing" else {"max_length": 64}
        args = trl.SFTConfig(**common, **extra)
        policy = model(tok) if dtype is None else model(tok).to(dtype)
        if case == "sft_lora":  # a PEFT LoRA adapter: TRL wraps the model, checkpoints hold the adapter
            from peft import LoraConfig

            lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
            return trl.SFTTrainer(model=policy, args=args, train_dataset=data, processing_class=tok, peft_config=lora)
        return trl.SFTTrainer(model=policy, args=args, train_dataset=data, processing_class=tok)
    if case.startswith("dpo"):
        args = trl.DPOConfig(**common, max_length=64, beta=0.1)
        if case == "dpo_ref":
            return trl.DPOTrainer(model=model(tok), ref_model=model(tok, seed=1), args=args, train_dataset=data,
                                  processing_class=tok)
        # no reference model: DPO loads a second copy from the policy's folder
        return trl.DPOTrainer(model=saved(tok, out_dir), args=args, train_dataset=data, processing_class=tok)
    if case == "reward":
        args = trl.RewardConfig(**common, max_length=64)
        return trl.RewardTrainer(model=model(tok, "reward"), args=args, train_dataset=data, processing_class=tok)
    if case in ("grpo", "rloo"):
        config, trainer = (trl.GRPOConfig, trl.GRPOTrainer) if case == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
        args = config(**common, num_generations=2, max_completion_length=6, generation_batch_size=4)
        return trainer(model=saved(tok, out_dir), reward_funcs=toy_reward, args=args, train_dataset=data,
                       processing_class=tok)
    if case == "kto":
        args = trl.KTOConfig(**common, max_length=64)
        return trl.KTOTrainer(model=saved(tok, out_dir), args=args, train_dataset=data, processing_class=tok)
    if case == "distillation":
        args = trl.DistillationConfig(**common, max_completion_length=6)
        return trl.DistillationTrainer(model=model(tok), teacher_model=model(tok, seed=1), args=args,
                                       train_dataset=data, processing_class=tok)
    if case in ("orpo", "cpo"):  # they log through accelerate.logging before their Trainer exists
        from trl.experimental.cpo import CPOConfig, CPOTrainer
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        config, trainer = (ORPOConfig, ORPOTrainer) if case == "orpo" else (CPOConfig, CPOTrainer)
        args = config(**common, max_length=64)
        return trainer(model=model(tok), args=args, train_dataset=data, processing_class=tok)
    if case == "online_dpo":  # overrides _maybe_log_save_evaluate with transformers' signature; a function as reward
        from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

        args = OnlineDPOConfig(**common, max_new_tokens=6, max_length=64)
        return OnlineDPOTrainer(model=saved(tok, out_dir), reward_funcs=toy_reward, args=args, train_dataset=data,
                                processing_class=tok)
    raise ValueError(f"unknown case {case!r}")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", nargs="?")
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--jobs", help="a JSON file: a list of jobs, each a list of the arguments of one run")
    parser.add_argument("--cadence", action="store_true")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--save-steps", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--batch", type=int, default=4)
    return parser.parse_args(argv)


def run(opts: argparse.Namespace) -> None:
    """One training: ``OUT_DIR/result.pt`` written by the first process."""
    import torch

    trainer = build(opts.case, opts.out_dir, opts.max_steps, opts.save_steps, opts.batch)
    import cadence  # importing it patches nothing

    # the run must really be on cadence, and a reference run on transformers (the environment's mark must not reach it)
    assert isinstance(trainer, cadence.Trainer) == opts.cadence, type(trainer).__mro__
    trainer.train(resume_from_checkpoint=True if opts.resume else None)
    losses = [(h["step"], k, float(v)) for h in trainer.state.log_history for k, v in h.items()
              if isinstance(v, (int, float)) and k != "step"]
    weights = {k: v.detach().float().clone() for k, v in trainer.model.state_dict().items()}
    if trainer.is_world_process_zero():
        torch.save({"losses": losses, "weights": weights}, os.path.join(opts.out_dir, "result.pt"))


def main() -> None:
    opts = parse(sys.argv[1:])
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if opts.cadence:
        import cadence

        cadence.patch_transformers()
    if not opts.jobs:
        run(opts)
        return
    with open(opts.jobs) as f:
        jobs = [parse([*job, *(["--cadence"] if opts.cadence else [])]) for job in json.load(f)]
    for job in jobs:
        os.makedirs(job.out_dir, exist_ok=True)
        try:
            run(job)
        except Exception:  # the test names this job's error; the other jobs still run
            rank = os.environ.get("RANK", "0")
            with open(os.path.join(job.out_dir, f"error-rank{rank}.txt"), "w") as f:
                f.write(traceback.format_exc())
        gc.collect()  # the finished trainer's model and optimizer


if __name__ == "__main__":
    sys.exit(main())
