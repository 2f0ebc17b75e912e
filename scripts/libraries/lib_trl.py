"""TRL's trainers on a tiny Llama (a word-level tokenizer with a hand-set chat template, data from lists).

``CASES``: case -> the trainer it runs. ``NOT_RUN``: TRL trainers this matrix cannot run on a CPU without a server,
with the reason. ``trainers()`` lists the trainers the installed TRL ships (stable and ``trl.experimental``), so a
new trainer shows up in the table as uncovered.
"""

from __future__ import annotations

import importlib
import pkgutil

from tiny import byte_level_tokenizer, llama, rows, saved_llama, tokenizer, toy_reward

CASES = {
    "sft": "SFTTrainer", "dpo": "DPOTrainer", "reward": "RewardTrainer", "grpo": "GRPOTrainer",
    "rloo": "RLOOTrainer", "kto": "KTOTrainer", "distillation": "DistillationTrainer",
    "cpo": "experimental.CPOTrainer", "orpo": "experimental.ORPOTrainer", "gkd": "experimental.GKDTrainer",
    "gmpo": "experimental.GMPOTrainer", "a2po": "experimental.A2POTrainer",
    "online_dpo": "experimental.OnlineDPOTrainer",
    "tpo": "experimental.TPOTrainer", "bema_dpo": "experimental.bema_for_ref_model.DPOTrainer",
    "gold": "experimental.GOLDTrainer", "iw_opd": "experimental.IWOPDTrainer", "sdft": "experimental.SDFTTrainer",
    "sdpo": "experimental.SDPOTrainer",
}
NOT_RUN = {
    "experimental.AsyncGRPOTrainer": "generation runs in a vLLM server (rollout worker); no CPU path",
    "experimental.AsyncDistillationTrainer": "rollouts come from a vLLM server (rollout worker); no CPU path",
    "experimental.ServerDistillationTrainer": "the teacher's logits come from a vLLM/HTTP server",
    "experimental.DistillationTrainer": "deprecated alias of trl.DistillationTrainer (that row covers it)",
    "experimental.KTOTrainer": "deprecated alias of trl.KTOTrainer (that row covers it)",
}
NOTES = {"online_dpo": "no mid-run evaluation: TRL's OnlineDPOTrainer evaluates prompt-only rows with a plain "
                        "forward, which fails on transformers' Trainer too (input_ids missing)"}
# cases whose numbers transformers 4.x computes otherwise than 5.x, which cadence follows; at 4.x ("trl@4.57") they are
# held to transformers 5's run of the main pins (the same seed, data and model; every other row is equal on both)
TRANSFORMERS_4X = {
    "sft": "transformers 4.x counts label position 0 in num_items_in_batch though causal LM losses shift it away "
           "(fixed in 5.0), so its step losses are ~12% low",
    "distillation": "transformers 4.x runs the whole compute_loss (teacher forward, divergence) under CPU bf16 "
                    "autocast; 5.x and cadence autocast the model's forward only",
}
LR = 5e-3


def version() -> str:
    import trl

    return trl.__version__


def trainers() -> list[str]:
    """Every ``*Trainer`` class the installed TRL exports: ``trl.X`` and ``trl.experimental.<pkg>.X``."""
    import trl
    import trl.experimental

    names = {n for n in dir(trl) if n.endswith("Trainer") and n != "Trainer"}
    for info in pkgutil.iter_modules(trl.experimental.__path__):
        try:
            module = importlib.import_module(f"trl.experimental.{info.name}")
        except Exception as error:  # it needs what this venv lacks: listed by its package name, with why
            names.add(f"experimental.{info.name}: import failed ({type(error).__name__}: {error})"[:200])
            continue
        for n in getattr(module, "__all__", dir(module)):
            obj = getattr(module, n, None)
            if n.endswith("Trainer") and isinstance(obj, type) and obj.__module__.startswith("trl.experimental"):
                names.add(f"experimental.{n}" if n != "DPOTrainer" else f"experimental.{info.name}.{n}")
    return sorted(names)


DATA = {"sft": "text", "dpo": "preference", "reward": "implicit", "grpo": "prompt", "rloo": "prompt",
        "kto": "unpaired", "distillation": "prompt", "cpo": "preference", "orpo": "preference", "gkd": "messages",
        "gmpo": "prompt", "a2po": "prompt", "online_dpo": "prompt", "tpo": "triple", "bema_dpo": "preference",
        "gold": "messages", "iw_opd": "messages", "sdft": "privileged", "sdpo": "prompt"}
GENERATION = dict(max_completion_length=6)


def build(case: str, out_dir: str, common: dict):
    import trl
    from datasets import Dataset

    tok = tokenizer()
    args = dict(common, learning_rate=LR)
    train, evals = Dataset.from_list(rows(DATA[case], 16)), Dataset.from_list(rows(DATA[case], 8, offset=40))
    data = dict(train_dataset=train, eval_dataset=evals, processing_class=tok)
    if case == "sft":
        return trl.SFTTrainer(model=llama(tok), args=trl.SFTConfig(**args, max_length=64), **data)
    if case == "dpo":  # no reference model: DPO loads one from the policy's folder
        return trl.DPOTrainer(model=saved_llama(tok, out_dir), args=trl.DPOConfig(**args, max_length=64), **data)
    if case == "reward":
        return trl.RewardTrainer(model=llama(tok, "reward"), args=trl.RewardConfig(**args, max_length=64), **data)
    if case in ("grpo", "rloo"):
        config, trainer = (trl.GRPOConfig, trl.GRPOTrainer) if case == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
        args = config(**args, num_generations=2, generation_batch_size=common["per_device_train_batch_size"],
                      num_generations_eval=2, **GENERATION)
        return trainer(model=saved_llama(tok, out_dir), reward_funcs=toy_reward, args=args, **data)
    if case == "kto":
        return trl.KTOTrainer(model=saved_llama(tok, out_dir), args=trl.KTOConfig(**args, max_length=64), **data)
    if case == "distillation":
        return trl.DistillationTrainer(model=llama(tok), teacher_model=llama(tok, seed=1),
                                       args=trl.DistillationConfig(**args, **GENERATION), **data)
    from trl import experimental

    if case in ("cpo", "orpo"):
        pkg = importlib.import_module(f"trl.experimental.{case}")
        config, trainer = getattr(pkg, f"{case.upper()}Config"), getattr(pkg, f"{case.upper()}Trainer")
        return trainer(model=llama(tok), args=config(**args, max_length=64), **data)
    if case == "bema_dpo":
        from trl.experimental.bema_for_ref_model import DPOTrainer

        return DPOTrainer(model=saved_llama(tok, out_dir), args=trl.DPOConfig(**args, max_length=64), **data)
    if case == "tpo":
        from trl.experimental.tpo import TPOConfig, TPOTrainer

        return TPOTrainer(model=saved_llama(tok, out_dir), args=TPOConfig(**args, max_length=64), **data)
    if case == "gkd":
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        return GKDTrainer(model=llama(tok), teacher_model=llama(tok, seed=1),
                          args=GKDConfig(**args, max_length=64, max_new_tokens=6), **data)
    if case == "gold":  # GOLD tokenizes with byte offsets: it needs a ByteLevel BPE tokenizer
        from trl.experimental.gold import GOLDConfig, GOLDTrainer

        tok = byte_level_tokenizer()
        data["processing_class"] = tok
        return GOLDTrainer(model=llama(tok), teacher_model=llama(tok, seed=1),
                           args=GOLDConfig(**args, max_length=64, **GENERATION), **data)
    if case == "iw_opd":  # the teacher's tokenizer is loaded from the teacher's folder
        from trl.experimental.iw_opd import IWOPDConfig, IWOPDTrainer

        return IWOPDTrainer(model=saved_llama(tok, out_dir), teacher_model=saved_llama(tok, out_dir, 1, "teacher"),
                            args=IWOPDConfig(**args, max_length=64, **GENERATION), **data)
    if case in ("gmpo", "sdpo"):
        name = {"gmpo": "GMPO", "sdpo": "SDPO"}[case]
        pkg = importlib.import_module(f"trl.experimental.{case}")
        config, trainer = getattr(pkg, f"{name}Config"), getattr(pkg, f"{name}Trainer")
        args = config(**args, num_generations=2, generation_batch_size=common["per_device_train_batch_size"],
                      **GENERATION)
        return trainer(model=saved_llama(tok, out_dir), reward_funcs=toy_reward, args=args, **data)
    if case == "a2po":
        from trl.experimental.a2po import A2POConfig, A2POTrainer

        return A2POTrainer(model=saved_llama(tok, out_dir), reward_funcs=toy_reward,
                           args=A2POConfig(**args, num_value_samples=2, **GENERATION), **data)
    if case == "online_dpo":
        from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

        data.pop("eval_dataset")  # see NOTES
        args = OnlineDPOConfig(**dict(args, eval_strategy="no"), max_new_tokens=6)
        return OnlineDPOTrainer(model=llama(tok), ref_model=llama(tok), reward_funcs=toy_reward, args=args, **data)
    if case == "sdft":
        from trl.experimental.sdft import SDFTConfig, SDFTTrainer

        args = SDFTConfig(**args, num_generations=2, distillation_topk=8, **GENERATION)  # top-k within the vocabulary
        return SDFTTrainer(model=saved_llama(tok, out_dir), args=args, **data)
    raise ValueError(f"unknown case {case!r}")
