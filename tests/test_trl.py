"""TRL's trainers on cadence (issue 27): ``cadence.patch_transformers()`` before ``import trl`` makes every TRL trainer
a subclass of cadence's Trainer; each one then logs transformers' losses and ends on transformers' weights.

Each comparison runs ``tests/trl_worker.py`` twice in fresh processes (transformers' Trainer, then cadence's; a
patch cannot be undone inside one process), on a tiny Llama built from a config, a word-level tokenizer built here
and ``datasets.Dataset.from_list`` data: no Hub. Both runs do the same float32 arithmetic in the same order, so
1e-5 (absolute) is far above what they differ by (0.0 on this machine) and far below any real difference: the bugs
these guard (columns dropped, the batch collated twice, a recursion, a different loss scaling) move losses by 1e-3
and more. The bf16 runs differ until mixed precision follows accelerate (autocast the forward, outputs to float32,
the sentence-transformers half of issue 27): those two are marked xfail(strict), so they fail loudly once it lands.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import dist_exit

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-5
# logged numbers that measure time, or that cadence does not take from a subclass yet (num_tokens: TRL adds to
# state.num_input_tokens_seen itself; cadence's log overwrites it — the sentence-transformers half of issue 27)
NOT_COMPARED = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second", "num_tokens"}

_results: dict = {}


def run_worker(case: str, cadence: bool, out: str, *extra: str) -> dict:
    proc = dist_exit.launch("trl_worker.py", case, out, *(["--cadence"] if cadence else []), *extra, nproc=1,
                            timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(os.path.join(out, "result.pt"))


def result(case: str, cadence: bool, tmp_path_factory) -> dict:
    key = (case, cadence)
    if key not in _results:
        out = str(tmp_path_factory.mktemp(f"{case}_{'cadence' if cadence else 'hf'}"))
        _results[key] = run_worker(case, cadence, out)
    return _results[key]


def compare(reference: dict, ours: dict) -> None:
    theirs = {(s, k): v for s, k, v in reference["losses"] if k not in NOT_COMPARED}
    mine = {(s, k): v for s, k, v in ours["losses"] if k not in NOT_COMPARED}
    assert sorted(mine) == sorted(theirs), "cadence logged other keys or steps than transformers"
    assert any(k == "loss" for _, k in theirs)
    worst = max(theirs, key=lambda k: abs(theirs[k] - mine[k]))
    assert abs(theirs[worst] - mine[worst]) <= TOL, (worst, theirs[worst], mine[worst])
    assert reference["weights"].keys() == ours["weights"].keys()
    for name, w in reference["weights"].items():
        diff = (w - ours["weights"][name]).abs().max().item()
        assert diff <= TOL, (name, diff)
    assert len([k for _, k in theirs if k == "loss"]) >= 4  # every step logged


CASES = [
    "sft_text",        # SFT on plain text
    "sft_chat",        # SFT on chat messages (the tokenizer's hand-set chat template)
    "sft_packing",     # packing: seq_lengths kept by TRL's _set_signature_columns_if_needed
    "sft_completion",  # prompt-completion: completion-only loss
    "dpo",             # no reference model: DPO loads one from the policy's folder
    "dpo_ref",         # an explicit reference model
    "reward_fp32",     # RewardTrainer (bf16 off: its loss is computed from outputs, see the xfail below)
    "grpo",            # generation with sampling, a toy reward function, no vLLM
    "rloo",
    "kto",
    "distillation_fp32",
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_trl_trainer_matches_transformers(case, tmp_path_factory):
    compare(result(case, False, tmp_path_factory), result(case, True, tmp_path_factory))


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="issue 27 (sentence-transformers half): under bf16 transformers autocasts only "
                                       "the forward and hands float32 outputs to compute_loss; cadence autocasts all "
                                       "of compute_loss, so RewardTrainer's loss is computed in bfloat16")
@pytest.mark.parametrize("case", ["reward", "distillation"])
def test_trl_bf16_loss_from_outputs_matches_transformers(case, tmp_path_factory):
    compare(result(case, False, tmp_path_factory), result(case, True, tmp_path_factory))


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="issue 27 (sentence-transformers half): a subclass's own additions to "
                                       "state.num_input_tokens_seen are overwritten at each log")
def test_grpo_num_tokens_matches_transformers(tmp_path_factory):
    ref, ours = result("grpo", False, tmp_path_factory), result("grpo", True, tmp_path_factory)
    pick = lambda r: [v for _, k, v in r["losses"] if k == "num_tokens"]  # noqa: E731
    assert pick(ref) and pick(ours) == pick(ref)


@pytest.mark.slow
def test_sft_resumed_equals_unbroken(tmp_path):
    """On cadence, SFT stopped after step 2 and resumed from checkpoint-2 ends bit-identical to the unbroken run
    (which itself equals transformers': test_trl_trainer_matches_transformers[sft_text])."""
    unbroken = run_worker("sft_text", True, str(tmp_path / "unbroken"), "--save-steps", "2")
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(tmp_path / "unbroken" / "checkpoint-2", resumed_dir / "checkpoint-2")
    resumed = run_worker("sft_text", True, str(resumed_dir), "--save-steps", "2", "--resume")
    for name, w in unbroken["weights"].items():
        assert torch.equal(w, resumed["weights"][name]), name
    after = lambda r: [(s, k, v) for s, k, v in r["losses"] if s > 2 and k not in NOT_COMPARED  # noqa: E731
                       and not k.startswith("train_")]
    assert after(resumed) == after(unbroken) and after(unbroken)


# ---------------------------------------------------------------- the patch itself (each in a fresh process)


def python(code: str, *args: str, cwd: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dist_exit.worker_env(None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def test_patch_points_transformers_names_at_cadence():
    proc = python("""
        import transformers.trainer_callback as early_module  # transformers' classes, imported before the patch
        from transformers import EarlyStoppingCallback as TheirEarlyStopping
        import cadence, cadence.trainer_utils, cadence.trainer_callback
        cadence.patch_transformers()
        cadence.patch_transformers()  # a second call changes nothing
        import transformers, transformers.trainer, transformers.training_args, transformers.trainer_utils
        import transformers.trainer_seq2seq, transformers.training_args_seq2seq, transformers.trainer_pt_utils
        assert transformers.Trainer is transformers.trainer.Trainer is cadence.Trainer
        assert transformers.TrainingArguments is transformers.training_args.TrainingArguments is cadence.TrainingArguments
        assert transformers.Seq2SeqTrainer is transformers.trainer_seq2seq.Seq2SeqTrainer is cadence.Seq2SeqTrainer
        assert transformers.training_args_seq2seq.Seq2SeqTrainingArguments is cadence.Seq2SeqTrainingArguments
        assert transformers.TrainerCallback is early_module.TrainerCallback is cadence.TrainerCallback
        assert transformers.TrainerState is cadence.TrainerState and transformers.TrainerControl is cadence.TrainerControl
        assert transformers.EarlyStoppingCallback is cadence.EarlyStoppingCallback
        assert transformers.trainer.TrainerState is cadence.TrainerState  # the names transformers.trainer imported too
        assert transformers.set_seed is transformers.trainer_utils.set_seed is cadence.set_seed
        assert transformers.trainer_utils.EvalPrediction is cadence.EvalPrediction
        assert transformers.trainer_utils.get_last_checkpoint is cadence.trainer_utils.get_last_checkpoint
        assert transformers.trainer_pt_utils.LengthGroupedSampler is cadence.trainer_pt_utils.LengthGroupedSampler

        class Mine(transformers.Trainer):  # a class defined afterwards is built on cadence
            pass
        assert issubclass(Mine, cadence.Trainer)

        # transformers' own EarlyStoppingCallback, imported before the patch, still stops a cadence run: a learning
        # rate of 0 keeps eval_loss flat, so with patience 2 the evaluations at steps 2 and 3 do not improve on step 1's
        import torch, tiny
        args = cadence.TrainingArguments(sys.argv[1], max_steps=10, eval_strategy="steps", eval_steps=1,
                                         save_strategy="steps", save_steps=1, learning_rate=0.0, report_to=[],
                                         load_best_model_at_end=True, metric_for_best_model="eval_loss",
                                         disable_tqdm=True, use_cpu=True)
        trainer = cadence.Trainer(tiny.RegressionModel(), args, train_dataset=tiny.RegressionDataset(16),
                                  eval_dataset=tiny.RegressionDataset(8), callbacks=[TheirEarlyStopping(2)])
        trainer.train()
        assert trainer.state.global_step == 3, trainer.state.global_step
        print("OK")
    """.replace("import torch, tiny", f"import sys, torch; sys.path.insert(0, {HERE!r}); import tiny"),
        "out", cwd=None)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-4000:]


def test_patch_after_trl_import_names_the_modules():
    proc = python("""
        import trl.trainer.sft_trainer  # built on transformers' Trainer before the patch
        import cadence
        try:
            cadence.patch_transformers()
        except RuntimeError as error:
            print("ERROR", error)
    """)
    assert proc.returncode == 0, proc.stderr[-4000:]
    message = proc.stdout.split("ERROR", 1)[1]
    for module in ("trl.trainer.sft_trainer", "trl.trainer.sft_config", "trl.trainer.base_trainer"):
        assert module in message
    assert "before importing" in message and "cadence run" in message


def test_cadence_run_gives_the_script_its_argv(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import json, sys, transformers, cadence
        json.dump({"argv": sys.argv, "name": __name__, "patched": transformers.Trainer is cadence.Trainer,
                   "path0": sys.path[0]}, open(sys.argv[-1], "w"))
    """))
    (tmp_path / "mod_train.py").write_text(script.read_text())
    env = dist_exit.worker_env(None)
    for command, argv0 in (([str(script)], str(script)), (["-m", "mod_train"], str(tmp_path / "mod_train.py"))):
        out = tmp_path / "seen.json"
        proc = subprocess.run([sys.executable, "-m", "cadence", "run", *command, "--flag", "1", str(out)], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen = json.loads(out.read_text())
        assert seen["argv"] == [argv0, "--flag", "1", str(out)] and seen["name"] == "__main__" and seen["patched"]
    proc = subprocess.run([sys.executable, "-m", "cadence", "run"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: cadence run" in proc.stderr


@pytest.mark.slow
def test_cadence_run_trl_sft_script_writes_transformers_files(tmp_path):
    """``cadence run -m trl.scripts.sft`` on a local model folder and a local jsonl file trains on cadence and writes
    the files ``python -m trl.scripts.sft`` (on transformers) writes, with the same final loss."""
    sys.path.insert(0, HERE)
    import trl_worker

    model_dir = trl_worker.saved(trl_worker.tokenizer(), str(tmp_path))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with open(data_dir / "train.jsonl", "w") as f:
        for row in trl_worker.rows("sft_text"):
            f.write(json.dumps(row) + "\n")
    env = dist_exit.worker_env({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    outputs = {}
    for name, launcher in (("hf", []), ("cadence", ["-m", "cadence", "run"])):
        out = tmp_path / name
        flags = ["--model_name_or_path", model_dir, "--dataset_name", str(data_dir), "--output_dir", str(out),
                 "--max_steps", "3", "--per_device_train_batch_size", "4", "--logging_steps", "1", "--report_to",
                 "none", "--save_strategy", "no", "--use_cpu", "--bf16", "false", "--seed", "7", "--max_length", "64"]
        proc = subprocess.run([sys.executable, *launcher, "-m", "trl.scripts.sft", *flags], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
        outputs[name] = out
    hf_files = sorted(p.name for p in outputs["hf"].iterdir())
    assert "model.safetensors" in hf_files and "config.json" in hf_files
    assert sorted(p.name for p in outputs["cadence"].iterdir()) == hf_files
    from safetensors.torch import load_file

    theirs, ours = load_file(outputs["hf"] / "model.safetensors"), load_file(outputs["cadence"] / "model.safetensors")
    assert max((theirs[k] - ours[k]).abs().max().item() for k in theirs) <= TOL
