"""TRL's trainers on cadence (issue 27): ``cadence.patch_transformers()`` before ``import trl`` makes every TRL trainer
a subclass of cadence's Trainer; each one then logs transformers' losses and ends on transformers' weights.

Each comparison runs ``tests/workers/trl_worker.py`` in two processes (transformers' Trainer, then cadence's; a
patch cannot be undone inside one process), on a tiny Llama built from a config, a word-level tokenizer built here
and ``datasets.Dataset.from_list`` data: no Hub. Importing transformers and trl is ~9 of a worker's ~10 seconds, so
one worker process per library (and per process count) runs every case the selected tests compare, one after the
other (:func:`runs`); each case seeds its model and Trainer itself, and trains to the same bits as in a process of its
own (measured on every case). Both runs do the same float32 arithmetic in the same order, so
1e-5 (absolute) is far above what they differ by (0.0 on this machine) and far below any real difference: the bugs
these guard (columns dropped, the batch collated twice, a recursion, a different loss scaling) move losses by 1e-3
and more. The bf16 runs compare the same way: cadence autocasts only the forward and hands float32 outputs to compute_loss, as
accelerate does for transformers, so both do the same bfloat16 forward and float32 loss (measured equal).
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
from repo_paths import TESTS

HERE = TESTS
TOL = 1e-5
# logged numbers that measure time; num_tokens (TRL adds to state.num_input_tokens_seen itself) is compared for GRPO
# in test_grpo_num_tokens_matches_transformers
NOT_COMPARED = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second", "num_tokens"}

# a job: (case, on cadence?, processes, the worker's extra flags); its folder and its result (or its error's text)
Job = tuple
_dirs: dict = {}
_runs: dict = {}
SAVE, RESUME, BATCH2 = ("--save-steps", "2"), ("--save-steps", "2", "--resume"), ("--batch", "2")


def job_dir(job: Job) -> str:
    return _dirs[job]


def wanted(item) -> list[Job]:
    """The worker jobs a collected test of this module reads, so that one process runs those of all selected tests."""
    name = getattr(item, "originalname", item.name)
    case = item.callspec.params.get("case") if hasattr(item, "callspec") else None
    if name in ("test_trl_trainer_matches_transformers", "test_trl_bf16_loss_from_outputs_matches_transformers"):
        return [(case, False, 1, ()), (case, True, 1, ())]
    if name == "test_grpo_num_tokens_matches_transformers":
        return [("grpo", False, 1, ()), ("grpo", True, 1, ())]
    if name == "test_resumed_equals_unbroken":
        return [(case, True, 1, SAVE), (case, True, 1, RESUME)]
    if name == "test_sft_on_two_processes_trains_like_one":
        return [("sft_text_fp32", True, 1, ()), ("sft_text_fp32", True, 2, BATCH2), ("sft_text_fp64", True, 1, ()),
                ("sft_text_fp64", True, 2, BATCH2), ("sft_text_fp32", False, 2, BATCH2)]
    if name == "test_repeat_sampler_trainers_on_two_processes_match_transformers":
        return [(f"{case}_fp64", True, 2, BATCH2), (f"{case}_fp64", False, 2, BATCH2)]
    return []


def runs(request, tmp_path_factory, *jobs: Job) -> list[dict]:
    """The results of ``jobs``. A job not run yet runs in one worker process together with every job of the same
    library, process count and phase (a resume, or not) that the selected tests of this module want; a resumed job
    starts from a copy of its unbroken run's checkpoint-2."""
    for job in jobs:
        if job in _runs:
            continue
        resume = "--resume" in job[3]
        same = lambda j: j[1:3] == job[1:3] and ("--resume" in j[3]) == resume  # noqa: E731
        group = [j for item in request.session.items
                 if getattr(getattr(item, "module", None), "__name__", None) == __name__ for j in wanted(item)
                 if same(j) and j not in _runs]
        group = list(dict.fromkeys([*group, job]))
        if resume:  # the unbroken runs first; each resumed run starts from a copy of its checkpoint-2
            runs(request, tmp_path_factory, *[(j[0], j[1], j[2], SAVE) for j in group])
        for j in group:
            _dirs[j] = str(tmp_path_factory.mktemp(f"{j[0]}_{'cadence' if j[1] else 'hf'}_{j[2]}"))
            if resume:
                shutil.copytree(os.path.join(job_dir((j[0], j[1], j[2], SAVE)), "checkpoint-2"),
                                os.path.join(_dirs[j], "checkpoint-2"))
        jobs_file = str(tmp_path_factory.mktemp("jobs") / "jobs.json")
        with open(jobs_file, "w") as f:
            json.dump([[j[0], _dirs[j], *j[3]] for j in group], f)
        proc = dist_exit.launch("trl_worker.py", "--jobs", jobs_file, *(["--cadence"] if job[1] else []), nproc=job[2],
                                timeout=1200)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        for j in group:
            errors = sorted(n for n in os.listdir(_dirs[j]) if n.startswith("error-rank"))
            _runs[j] = ("".join(open(os.path.join(_dirs[j], n)).read() for n in errors) or
                        torch.load(os.path.join(_dirs[j], "result.pt")))
    for job in jobs:
        assert isinstance(_runs[job], dict), f"{job} failed in the worker:\n{_runs[job]}"
    return [_runs[job] for job in jobs]


def compare(reference: dict, ours: dict, skip: set = frozenset(), tol: float = TOL) -> None:
    theirs = {(s, k): v for s, k, v in reference["losses"] if k not in NOT_COMPARED | skip}
    mine = {(s, k): v for s, k, v in ours["losses"] if k not in NOT_COMPARED | skip}
    assert sorted(mine) == sorted(theirs), "cadence logged other keys or steps than transformers"
    assert any(k == "loss" for _, k in theirs)
    worst = max(theirs, key=lambda k: abs(theirs[k] - mine[k]))
    assert abs(theirs[worst] - mine[worst]) <= tol, (worst, theirs[worst], mine[worst])
    assert reference["weights"].keys() == ours["weights"].keys()
    for name, w in reference["weights"].items():
        diff = (w - ours["weights"][name]).abs().max().item()
        assert diff <= tol, (name, diff)
    assert len([k for _, k in theirs if k == "loss"]) >= 4  # every step logged


CASES = [
    "sft_text",        # SFT on plain text
    "sft_chat",        # SFT on chat messages (the tokenizer's hand-set chat template)
    "sft_packing",     # packing: seq_lengths kept by TRL's _set_signature_columns_if_needed
    "sft_completion",  # prompt-completion: completion-only loss
    "dpo",             # no reference model: DPO loads one from the policy's folder
    "dpo_ref",         # an explicit reference model
    "reward_fp32",     # RewardTrainer with bf16 off (bf16: test_trl_bf16_loss_from_outputs_matches_transformers)
    "grpo",            # generation with sampling, a toy reward function, no vLLM
    "rloo",
    "kto",
    "distillation_fp32",
    "orpo",            # ORPO and CPO log through accelerate.logging before their Trainer: the arguments' PartialState
    "cpo",
    "online_dpo",      # generation, a function as reward; its _maybe_log_save_evaluate has transformers' signature
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_trl_trainer_matches_transformers(case, request, tmp_path_factory):
    compare(*runs(request, tmp_path_factory, (case, False, 1, ()), (case, True, 1, ())))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["reward", "distillation"])
def test_trl_bf16_loss_from_outputs_matches_transformers(case, request, tmp_path_factory):
    compare(*runs(request, tmp_path_factory, (case, False, 1, ()), (case, True, 1, ())))


@pytest.mark.slow
def test_grpo_num_tokens_matches_transformers(request, tmp_path_factory):
    ref, ours = runs(request, tmp_path_factory, ("grpo", False, 1, ()), ("grpo", True, 1, ()))
    pick = lambda r: [v for _, k, v in r["losses"] if k == "num_tokens"]  # noqa: E731
    assert pick(ref) and pick(ours) == pick(ref)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["sft_text", "sft_lora", "dpo", "grpo", "orpo", "cpo", "online_dpo"])
def test_resumed_equals_unbroken(case, request, tmp_path_factory):
    """On cadence, a TRL trainer stopped after step 2 and resumed from checkpoint-2 ends bit-identical to the
    unbroken run (which itself equals transformers': test_trl_trainer_matches_transformers). DPO resumes with the
    reference model it loads again from the policy's folder; GRPO's sampled generations continue from the
    checkpoint's RNG states; SFT with a LoRA adapter saves the adapter (not the base weights) and resumes it."""
    unbroken, resumed = runs(request, tmp_path_factory, (case, True, 1, SAVE), (case, True, 1, RESUME))
    if case == "sft_lora":
        from safetensors.torch import load_file

        checkpoint = os.path.join(job_dir((case, True, 1, SAVE)), "checkpoint-2")
        saved = load_file(os.path.join(checkpoint, "adapter_model.safetensors"))
        assert saved and all("lora_" in name for name in saved)
        assert not os.path.exists(os.path.join(checkpoint, "model.safetensors"))
    for name, w in unbroken["weights"].items():
        assert torch.equal(w, resumed["weights"][name]), name
    after = lambda r: [(s, k, v) for s, k, v in r["losses"] if s > 2 and k not in NOT_COMPARED  # noqa: E731
                       and not k.startswith("train_")]
    assert after(resumed) == after(unbroken) and after(unbroken)


@pytest.mark.slow
def test_sft_on_two_processes_trains_like_one(request, tmp_path_factory):
    """SFT on cadence on 2 processes with 2 rows each trains like 1 process with 4 (the same global batches: the
    distributed sampler deals the shuffled order out), and like transformers on the same 2 processes. Tolerance: the
    item count is summed over the processes before the loss is divided, so only float32 reduction order differs.
    (total_flos counts padded tokens: batches of 2 rows pad less than batches of 4, in both libraries.) And in
    float64, where reduction order leaves ~1e-15, 2 processes equal 1 within 1e-6 (float32 differs by ~2.5e-6 in
    the losses: the order of the sums)."""
    # float32: bf16 rounds batches of other shapes otherwise
    one, two, one64, two64, theirs = runs(
        request, tmp_path_factory, ("sft_text_fp32", True, 1, ()), ("sft_text_fp32", True, 2, BATCH2),
        ("sft_text_fp64", True, 1, ()), ("sft_text_fp64", True, 2, BATCH2), ("sft_text_fp32", False, 2, BATCH2))
    compare(one, two, skip={"total_flos"})
    compare(one64, two64, skip={"total_flos"}, tol=1e-6)
    compare(theirs, two)


# ---------------------------------------------------------------- the patch itself (each in a fresh process)


def python(code: str, *args: str, cwd: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dist_exit.worker_env(None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.mark.slow  # fresh processes importing transformers (and trl): over 20 s on the shared CPUs
def test_patch_points_transformers_names_at_cadence(tmp_path):
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
        str(tmp_path / "out"), cwd=str(tmp_path))
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-4000:]


@pytest.mark.slow  # fresh processes importing transformers (and trl): over 20 s on the shared CPUs
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


@pytest.mark.slow  # fresh processes importing transformers (and trl): over 20 s on the shared CPUs
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


# ---------------------------------------------------------------- the Trainer surface TRL reaches for (in this process,
# on cadence directly: no patch)


def tiny_args(out, **kw):
    from cadence import TrainingArguments

    return TrainingArguments(str(out), **{**dict(max_steps=4, per_device_train_batch_size=4, learning_rate=0.1,
                                                 report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True,
                                                 logging_steps=1), **kw})


def test_config_subclass_extends_valid_dict_fields(tmp_path):
    """TRL's configs extend ``_VALID_DICT_FIELDS``; their dict fields arrive from the command line as JSON strings
    and are parsed as transformers parses them (strings "true"/"3" typed)."""
    import dataclasses

    import transformers

    import cadence

    parsed = {}
    for base in (transformers.TrainingArguments, cadence.TrainingArguments):
        @dataclasses.dataclass
        class Config(base):
            _VALID_DICT_FIELDS = base._VALID_DICT_FIELDS + ["model_init_kwargs"]
            model_init_kwargs: dict | str | None = None

        args = Config(str(tmp_path / base.__module__), model_init_kwargs='{"dtype": "float32", "flag": "true", "n": "3"}',
                      lr_scheduler_kwargs='{"power": "2.5"}', report_to=[])
        parsed[base.__module__] = (args.model_init_kwargs, args.lr_scheduler_kwargs)
    assert parsed["cadence.training_args"] == parsed["transformers.training_args"] == (
        {"dtype": "float32", "flag": True, "n": 3}, {"power": 2.5})
    assert cadence.TrainingArguments._VALID_DICT_FIELDS == transformers.TrainingArguments._VALID_DICT_FIELDS


def test_prepare_inputs_override_calling_super_is_entered_once_per_batch(tmp_path):
    from tiny import RegressionDataset, RegressionModel

    import cadence

    class Counting(cadence.Trainer):
        calls = 0

        def _prepare_inputs(self, inputs):
            Counting.calls += 1
            return super()._prepare_inputs(inputs)  # TRL's pattern: the recursion must not come back here

    Counting(RegressionModel(), tiny_args(tmp_path), train_dataset=RegressionDataset(16)).train()
    assert Counting.calls == 4


def test_prepare_inputs_may_collate_the_batch(tmp_path):
    """GRPO's pattern: an identity collator hands ``_prepare_inputs`` a list of rows, which it turns into the batch;
    the batch is checked after ``_prepare_inputs``, so the list is not refused."""
    from tiny import RegressionDataset, RegressionModel

    import cadence
    from cadence.data import default_data_collator

    class Collating(cadence.Trainer):
        def _prepare_inputs(self, rows):
            assert isinstance(rows, list) and isinstance(rows[0], dict)
            return super()._prepare_inputs(default_data_collator(rows))

    trainer = Collating(RegressionModel(), tiny_args(tmp_path, remove_unused_columns=False),
                        train_dataset=RegressionDataset(16), data_collator=lambda rows: rows)
    reference = cadence.Trainer(RegressionModel(), tiny_args(tmp_path / "ref"), train_dataset=RegressionDataset(16))
    assert trainer.train().training_loss == reference.train().training_loss


def test_set_signature_columns_override_keeps_its_columns(tmp_path):
    """TRL's SFT/DPO/Reward keep columns the model's forward does not name (``seq_lengths``, ``chosen_ids``) by
    overriding ``_set_signature_columns_if_needed``: cadence removes only the columns outside that list."""
    import datasets
    from tiny import RegressionModel

    import cadence

    rows = [{"input_x": float(i), "labels": 2.0 * i + 3, "weight": 1.0, "junk": "x"} for i in range(8)]
    seen = []

    class KeepsWeight(cadence.Trainer):
        def _set_signature_columns_if_needed(self):
            if self._signature_columns is None:
                self._signature_columns = ["input_x", "labels", "weight"]

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            seen.append(sorted(inputs))
            inputs = dict(inputs)
            weight = inputs.pop("weight")
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return loss * weight.mean()

    KeepsWeight(RegressionModel(), tiny_args(tmp_path), train_dataset=datasets.Dataset.from_list(rows)).train()
    assert seen and all(keys == ["input_x", "labels", "weight"] for keys in seen)


def test_accelerator_surface_on_one_process(tmp_path):
    import accelerate
    import accelerate.utils
    from tiny import RegressionDataset, RegressionModel

    import cadence

    trainer = cadence.Trainer(RegressionModel(), tiny_args(tmp_path), train_dataset=RegressionDataset(16))
    accelerate.utils.set_seed(5, device_specific=True)  # TRL's call: needs an initialised AcceleratorState
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))  # one process: process index 0 added to the seed
    accelerator = trainer.accelerator
    assert accelerator.state.deepspeed_plugin is None and accelerator.parallelism_config is None
    assert trainer.args.distributed_state.num_processes == 1 and trainer.args.deepspeed_plugin is None
    reference = RegressionModel()
    assert accelerator.prepare_model(reference, evaluation_mode=True) is reference
    assert accelerator.prepare(reference) is reference
    accelerator.even_batches = False
    assert accelerator.even_batches is False
    accelerator.dataloader_config.dispatch_batches = False  # GRPO sets it
    assert trainer._get_output_dir(trial=None) == trainer.args.output_dir and trainer.push_in_progress is None


def test_two_argument_save_checkpoint_and_optimizer_load_overrides_are_honoured(tmp_path):
    """TRL overrides ``_save_checkpoint(model, trial)`` (transformers' two arguments) and GRPO
    ``_load_optimizer_and_scheduler(checkpoint)``; both are called, and a resume through them stays exact."""
    import shutil as _shutil

    from tiny import RegressionDataset, RegressionModel

    import cadence

    calls = []

    class TrlStyle(cadence.Trainer):
        def _save_checkpoint(self, model, trial):
            calls.append(("save", self.state.global_step))
            super()._save_checkpoint(model, trial)

        def _load_optimizer_and_scheduler(self, checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)
            calls.append(("load", os.path.basename(checkpoint)))

    def run(out, resume=None):
        trainer = TrlStyle(RegressionModel(), tiny_args(out, save_strategy="steps", save_steps=2, max_steps=4,
                                                        async_save=False),
                           train_dataset=RegressionDataset(32))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    unbroken = run(tmp_path / "a")
    assert calls == [("save", 2), ("save", 4)]
    (tmp_path / "b").mkdir()
    _shutil.copytree(tmp_path / "a" / "checkpoint-2", tmp_path / "b" / "checkpoint-2")
    calls.clear()
    resumed = run(tmp_path / "b", resume=True)
    assert calls == [("load", "checkpoint-2"), ("save", 4)]
    for (name, a), b in zip(unbroken.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.slow
@pytest.mark.parametrize("case", ["rloo", "grpo"])
def test_repeat_sampler_trainers_on_two_processes_match_transformers(case, request, tmp_path_factory):
    """RLOO and GRPO deal prompts with TRL's RepeatSampler, their own _get_train_sampler. cadence handed it to the
    DataLoader unsharded: on 2 processes every rank trained on every prompt and the run ended at half its epochs.
    Now each rank gets the batches accelerate deals it, as on transformers. float64, so that only reduction order
    (~1e-15) can differ; 1e-5 is the issue's bound."""
    ours, theirs = runs(request, tmp_path_factory, (f"{case}_fp64", True, 2, BATCH2), (f"{case}_fp64", False, 2, BATCH2))
    compare(theirs, ours, tol=1e-5)
    epochs = lambda r: [v for _, k, v in r["losses"] if k == "epoch"]  # noqa: E731
    assert epochs(ours) == pytest.approx(epochs(theirs)) and epochs(ours)
