"""Every bad input, one row each: the error type, the culprit named in the message, raised before the first
optimizer step, and the output_dir left exactly as it was.

A row builds what a user would write and runs it (constructing TrainingArguments, the Trainer, and
calling train()). "Before the first optimizer step" is watched with torch's global optimizer-step
hook; "untouched" compares every file's size and mtime in output_dir (which already holds a user's
file, and, for the checkpoint rows, a run's checkpoints) before and after.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest
import torch

from tiny import ClassDataset, Classifier, RegressionDataset, RegressionModel, Stream, args_with
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from cadence import Trainer, TrainerCallback
from cadence.checkpoint_io.formats import CorruptCheckpointError, UnsafeCheckpointError
from cadence.checkpoint.manifest import write_manifest
from cadence.output_guard import LOCK_NAME


args = args_with(max_steps=2, per_device_train_batch_size=4, logging_steps=1)


def fit(out, model=None, train_dataset=None, resume=None, args_kw=None, **trainer_kw):
    """Trainer(...).train(...) on the tiny regression task, with the row's changes."""
    trainer = Trainer(model if model is not None else RegressionModel(), args(out, **(args_kw or {})),
                      train_dataset=RegressionDataset(16) if train_dataset is None else train_dataset, **trainer_kw)
    return trainer.train(resume_from_checkpoint=resume)


# ------------------------------------------------------------------ bad models, datasets, collators, metrics


class NoGradLoss(RegressionModel):
    def forward(self, input_x, labels=None):
        loss, y = super().forward(input_x, labels)
        return (loss.detach(), y)


class RowLoss(RegressionModel):
    def forward(self, input_x, labels=None):
        y = self.a * input_x + self.b
        return {"loss": (y - labels) ** 2, "logits": y}  # one loss per row


class TupleRowLoss(RegressionModel):
    def forward(self, input_x, labels=None):
        y = self.a * input_x + self.b
        return ((y - labels) ** 2, y)  # first in a tuple: no scalar there, so no loss found


class NoLoss(RegressionModel):
    def forward(self, input_x, labels=None):
        return (self.a * input_x + self.b,)


class FloatLabels(ClassDataset):
    def __getitem__(self, i):
        row = super().__getitem__(i)
        return {"x": row["x"], "labels": row["labels"].float()}


def frozen():
    model = RegressionModel()
    model.requires_grad_(False)
    return model


class NeedsArgs(TrainerCallback):
    def __init__(self, when):
        self.when = when


def other_optimizer():
    return torch.optim.SGD(RegressionModel().parameters(), lr=0.1)


def scheduler_of(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def metrics_returning(value):
    return lambda prediction: value


EVAL = dict(eval_dataset=RegressionDataset(8), args_kw=dict(eval_strategy="steps", eval_steps=1, eval_on_start=True))


# ------------------------------------------------------------------ checkpoint set-ups (before the snapshot)


def with_checkpoint(change: Callable[[str], None] | None = None):
    """output_dir with checkpoint-2 of a finished tiny run (copied from one made per module), then ``change``."""

    def setup(out, base):
        shutil.rmtree(out)
        shutil.copytree(base, out)
        if change is not None:
            change(os.path.join(out, "checkpoint-2"))

    return setup


def truncate(name):
    def change(folder):
        path = os.path.join(folder, name)
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])

    return change


def rewrite_json(name, text):
    def change(folder):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)

    return change


def weights_only_checkpoint(folder):
    """What save_only_model=True writes (here without a manifest, as transformers writes it)."""
    for name in ("optimizer.pt", "scheduler.pt", "checkpoint_manifest.json", "loop_state.json"):
        os.remove(os.path.join(folder, name))


def removed(*names):
    def change(folder):
        for name in names:
            os.remove(os.path.join(folder, name))

    return change


def state_field(key, value):
    """trainer_state.json with one field changed, the manifest written again to match (an edit by hand, or a bug)."""

    def change(folder):
        path = os.path.join(folder, "trainer_state.json")
        with open(path) as f:
            state = json.load(f)
        state[key] = value
        with open(path, "w") as f:
            json.dump(state, f)
        write_manifest(__import__("pathlib").Path(folder))

    return change


def evil_bin_weights(folder):
    """A transformers-4.x-style checkpoint whose pytorch_model.bin is a crafted pickle."""
    removed("model.safetensors", "checkpoint_manifest.json", "loop_state.json")(folder)
    torch.save({"a": Evil()}, os.path.join(folder, "pytorch_model.bin"))


class Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def evil(name):
    def change(folder):
        torch.save({"state": Evil()}, os.path.join(folder, name))

    return change


_HELD = []  # lock files held open (flock'ed) by ``locked``, as a live run holds its lock


def locked(out, base):
    """A live run's lock: the file names a live process of this host, and its OS lock is held."""
    path = os.path.join(out, LOCK_NAME)
    with open(path, "w") as f:  # the pytest process's parent: alive, on this host
        json.dump({"pid": os.getppid(), "host": __import__("socket").gethostname()}, f)
    fcntl = pytest.importorskip("fcntl")
    while _HELD:  # the previous call's
        os.close(_HELD.pop())
    _HELD.append(os.open(path, os.O_RDONLY))
    fcntl.flock(_HELD[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)


def blocked(out, base):
    with open(os.path.join(out, "file"), "w") as f:
        f.write("a file where a folder is needed")


# ------------------------------------------------------------------ cadence train's files (made once per session)


CLI_FILES = {
    "train.txt": "the cat sat on the mat\nthe dog ran under the log\n" * 4,
    "empty.csv": "",
    "header.csv": "text,label\n",
    "bad.csv": 'text\n"a quote that never closes\n',
    "bad.jsonl": '{"text": "a"\n',
    "blank.txt": "\n   \n\n",
    "none-cell.csv": 'text\n""\nhello\n',
    "list.yaml": "- model\n- train_file\n",
    "empty.yaml": "",
    "bad.yaml": "model: [unclosed\n",
    "bad.json": '{"model": ',
    "no-model.yaml": "train_file: train.txt\n",
}


@functools.cache
def cli_folder() -> str:
    """A from-scratch GPT-2 config (64 positions) with a word-level tokenizer, and the files above."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, PreTrainedTokenizerFast

    folder = tempfile.mkdtemp(prefix="cadence-cli-rows-")
    atexit.register(shutil.rmtree, folder, True)
    for name, text in CLI_FILES.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    core = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.train_from_iterator([CLI_FILES["train.txt"]], trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]")
    tokenizer.save_pretrained(os.path.join(folder, "model"))
    GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2).save_pretrained(
        os.path.join(folder, "model"))
    return folder


def cadence_train(*flags):
    """``cadence train`` with ``flags`` ({dir} is cli_folder()) into the row's output_dir; train.txt unless named."""

    def run(out):
        pytest.importorskip("transformers")
        pytest.importorskip("datasets")
        from cadence.cli_train import run_train

        folder = cli_folder()
        argv = [flag.format(dir=folder) for flag in flags]
        if argv and argv[0].endswith((".yaml", ".json")):
            return run_train(argv)
        if "--train_file" not in argv:
            argv += ["--train_file", os.path.join(folder, "train.txt")]
        return run_train(["--model", os.path.join(folder, "model"), "--output_dir", out, "--max_steps", "2",
                          "--use_cpu", "--disable_tqdm", "true", *argv])

    return run


def search(hp_space):
    """A one-trial optuna search over ``hp_space`` (a model_init Trainer, so that a trial could train)."""

    def run(out):
        pytest.importorskip("optuna")
        trainer = Trainer(args=args(out, eval_strategy="steps", eval_steps=1), model_init=lambda: RegressionModel(),
                          train_dataset=RegressionDataset(16), eval_dataset=RegressionDataset(8))
        return trainer.hyperparameter_search(hp_space=hp_space, n_trials=1, backend="optuna")

    return run


def plot_row(id, text, flags, *culprits):
    """``cadence plot`` of a run folder holding a trainer_state.json with ``text`` (written by the row's setup)."""

    def setup(out, base):
        with open(os.path.join(out, "trainer_state.json"), "w") as f:
            f.write(text)

    def run(out):
        pytest.importorskip("matplotlib")
        from cadence.plot import plot_run

        return plot_run(out, *[flag.format(out=out) for flag in flags])

    return Row(f"plot-{id}", run, ValueError, culprits, setup=setup)


def cli_row(id, flags, *culprits):
    return Row(f"cadence-train-{id}", cadence_train(*flags), ValueError, culprits)


# ------------------------------------------------------------------ the table


@dataclass
class Row:
    id: str
    run: Callable[[str], Any]  # given output_dir; raises
    error: type
    culprits: tuple[str, ...]
    setup: Callable[[str, str], None] | None = field(default=None)


def arg_row(name, value, *culprits, **extra):
    kw = {name: value, **extra}
    return Row(f"args-{name}={value!r}"[:60], lambda out: args(out, **kw), ValueError, (name, *culprits))


ROWS = [
    # --- TrainingArguments: single values
    arg_row("learning_rate", -1.0, "-1.0"),
    arg_row("adam_beta1", 1.5, "1.5"),
    arg_row("adam_beta2", -0.1, "-0.1"),
    arg_row("adam_epsilon", -1e-8, "-1e-08"),
    arg_row("label_smoothing_factor", 1.0, "1.0"),
    arg_row("gradient_accumulation_steps", 0, "=0"),
    arg_row("gradient_accumulation_steps", 1.5, "1.5"),
    arg_row("per_device_train_batch_size", 0, "=0"),
    arg_row("per_device_eval_batch_size", -1, "-1"),
    arg_row("num_train_epochs", -1, "-1"),
    arg_row("num_train_epochs", math.inf, "inf", "max_steps"),
    arg_row("num_train_epochs", math.nan, "nan"),
    arg_row("max_steps", 0, "=0"),
    arg_row("max_steps", 2.5, "2.5"),
    arg_row("warmup_steps", -1, "-1"),
    arg_row("warmup_steps", 2.5, "2.5"),
    arg_row("save_total_limit", 2.5, "2.5"),  # 0 and -1 keep every checkpoint, as in transformers (test_hf_allows.py)
    arg_row("eval_accumulation_steps", 0, "=0"),
    arg_row("dataloader_num_workers", -1, "-1"),
    arg_row("seed", -1, "-1"),
    arg_row("data_seed", 2**32, str(2**32)),
    arg_row("torch_empty_cache_steps", 0, "=0"),
    arg_row("neftune_noise_alpha", -1.0, "-1.0"),
    arg_row("logging_steps", 0, "=0", logging_strategy="steps"),
    arg_row("save_steps", 1.5, "1.5", save_strategy="steps"),
    arg_row("eval_steps", 2.5, "2.5", eval_strategy="steps"),  # a negative one runs as in transformers (test_compat_pins)
    # --- TrainingArguments: text where a bool or a number is due (a JSON/YAML config, an environment variable)
    arg_row("overwrite_output_dir", "maybe", "'maybe'", "True or False"),
    arg_row("bf16", "on", "'on'", "True or False"),
    arg_row("use_cpu", 2, "=2", "True or False"),
    arg_row("learning_rate", "fast", "'fast'", "a number"),
    arg_row("seed", "1.5", "'1.5'", "an integer"),
    # overwrite_output_dir="false" keeping the earlier run's checkpoints: test_output_guard.py (a re-run is not an error)
    # --- TrainingArguments: non-finite floats (the run would "succeed" with NaN weights)
    arg_row("learning_rate", math.inf, "inf", "finite"),
    arg_row("learning_rate", math.nan, "nan", "finite"),
    arg_row("weight_decay", math.inf, "inf", "finite"),
    arg_row("adam_epsilon", math.nan, "nan", "finite"),
    arg_row("max_grad_norm", math.nan, "nan", "finite"),
    arg_row("warmup_steps", math.inf, "inf", "finite"),
    # --- TrainingArguments: names and combinations
    arg_row("eval_strategy", "sometimes", "'sometimes'", "'epoch'"),
    arg_row("lr_scheduler_type", "zigzag", "'zigzag'", "'cosine'"),
    arg_row("optim", "sgdd", "'sgdd'", "'adamw_torch'"),
    arg_row("log_level", "loud", "'loud'"),
    arg_row("train_sampling_strategy", "shuffle", "'shuffle'"),
    arg_row("debug", "nonsense", "nonsense"),
    arg_row("report_to", "nope", "'nope'"),
    arg_row("output_dir", "", "''", "trainer_output"),
    arg_row("lr_scheduler_kwargs", "{not json", "{not json"),
    arg_row("save_safetensors", False, "False"),
    arg_row("dataloader_prefetch_factor", 2, "dataloader_num_workers=0"),
    arg_row("bf16", True, "fp16=True", fp16=True),
    # bf16 on a machine without a GPU: refused as transformers refuses it, naming both fixes (test_compat_behaviours)
    *([] if torch.cuda.is_available() else [
        Row(f"args-{flag}=True-without-a-gpu", lambda out, flag=flag: args(out, **{flag: True}), ValueError,
            (flag, "use_cpu=True", f"{flag}=False")) for flag in ("bf16", "bf16_full_eval")]),
    arg_row("evaluation_strategy", "steps", "eval_strategy='epoch'", eval_strategy="epoch"),
    arg_row("lr_scheduler_type", "reduce_lr_on_plateau", "eval_strategy='no'"),
    arg_row("load_best_model_at_end", True, "save_strategy='no'", eval_strategy="steps"),
    arg_row("save_steps", 3, "eval_steps=2", load_best_model_at_end=True, eval_strategy="steps", eval_steps=2,
            save_strategy="steps"),
    Row("args-fsdp='sideways'", lambda out: fit(out, args_kw=dict(fsdp="sideways")), ValueError, ("fsdp", "sideways")),
    arg_row("hub_strategy", "sometimes", "'sometimes'"),
    # --- the Trainer's own arguments
    Row("trainer-no-model", lambda out: Trainer(None, args(out)), ValueError, ("model=", "model_init=")),
    Row("trainer-dataset-int", lambda out: fit(out, train_dataset=42), ValueError, ("train_dataset", "int")),
    Row("trainer-dataset-empty", lambda out: fit(out, train_dataset=[]), ValueError, ("train_dataset", "empty")),
    # an empty eval_dataset: accepted, evaluated to metrics without a loss, as in transformers (test_hf_allows.py)
    Row("trainer-eval-without-dataset", lambda out: fit(out, args_kw=dict(eval_strategy="steps", eval_steps=1)),
        ValueError, ("eval_strategy='steps'", "eval_dataset")),
    Row("trainer-stream-without-max-steps", lambda out: fit(out, train_dataset=Stream(RegressionDataset(8)), args_kw=dict(max_steps=-1)),
        ValueError, ("train_dataset", "max_steps")),
    Row("trainer-no-batch", lambda out: fit(out, train_dataset=RegressionDataset(3),
                                            args_kw=dict(dataloader_drop_last=True)),
        ValueError, ("per_device_train_batch_size=4", "dataloader_drop_last")),
    Row("optimizers-scheduler-without-optimizer", lambda out: fit(out, optimizers=(None, scheduler_of(other_optimizer()))),
        ValueError, ("optimizers=(None, LambdaLR)", "scheduler was passed without its optimizer")),
    Row("optimizers-other-models-parameters", lambda out: fit(out, optimizers=(other_optimizer(), None)),
        ValueError, ("optimizers=(SGD", "none of the optimizer's 2 parameters", "RegressionModel")),
    Row("optimizers-not-an-optimizer", lambda out: fit(out, optimizers=("adam", None)),
        TypeError, ("optimizers=(str", "torch.optim.Optimizer")),
    Row("optimizers-scheduler-of-another-optimizer",
        lambda out: (lambda m: fit(out, model=m, optimizers=(torch.optim.SGD(m.parameters(), lr=0.1),
                                                             scheduler_of(other_optimizer())))
                     )(RegressionModel()),
        ValueError, ("optimizers=(SGD, LambdaLR)", "another optimizer")),
    Row("callbacks-object", lambda out: fit(out, callbacks=[object()]), TypeError, ("callbacks", "object")),
    Row("trackers-logging_dir-under-a-file",  # the user's notes.txt stands where TensorBoard's folder would go
        lambda out: fit(out, args_kw=dict(report_to="tensorboard", logging_dir=os.path.join(out, "notes.txt", "tb"))),
        ValueError, ("logging_dir=", "notes.txt is not a folder")),
    Row("callbacks-class-needing-arguments", lambda out: fit(out, callbacks=[NeedsArgs]),
        TypeError, ("callbacks", "NeedsArgs", "instance")),
    # metric_for_best_model without compute_metrics: accepted, a KeyError at the first evaluation (test_hf_allows.py)
    Row("save-best-without-evaluation", lambda out: fit(out, args_kw=dict(save_strategy="best")),
        ValueError, ("save_strategy='best'", "eval_strategy='no'")),
    Row("train-unknown-keyword", lambda out: Trainer(RegressionModel(), args(out), train_dataset=RegressionDataset(8))
        .train(model_path="x"), TypeError, ("model_path",)),
    Row("neftune-without-embeddings", lambda out: fit(out, args_kw=dict(neftune_noise_alpha=5.0)),
        ValueError, ("neftune_noise_alpha", "RegressionModel")),
    # --- models and losses (found on the first batch, before the optimizer steps)
    Row("model-frozen", lambda out: fit(out, model=frozen()), ValueError, ("RegressionModel", "requires_grad=True")),
    Row("model-loss-without-grad", lambda out: fit(out, model=NoGradLoss()), ValueError,
        ("NoGradLoss", "does not require a gradient")),
    Row("model-loss-not-scalar", lambda out: fit(out, model=RowLoss()), ValueError, ("RowLoss", "shape (4,)", "mean")),
    Row("model-tuple-loss-not-scalar", lambda out: fit(out, model=TupleRowLoss()), ValueError,
        ("did not return a loss", "tuple")),
    Row("model-without-loss", lambda out: fit(out, model=NoLoss()), ValueError, ("did not return a loss", "labels")),
    Row("compute-loss-func-python-float", lambda out: fit(out, compute_loss_func=lambda o, labels, num_items_in_batch=None: 1.5),
        TypeError, ("compute_loss_func", "float", "1.5")),
    Row("labels-float-for-classification", lambda out: fit(out, model=Classifier(), train_dataset=FloatLabels(8)),
        ValueError, ("labels have dtype torch.float32", "class indices")),
    # --- collators
    Row("collator-returns-none", lambda out: fit(out, data_collator=lambda rows: None), TypeError,
        ("data_collator returned None",)),
    Row("collator-returns-samples", lambda out: fit(out, data_collator=lambda rows: rows), TypeError,
        ("data_collator returned a list of 4 dict",)),
    Row("collator-returns-tensor", lambda out: fit(out, data_collator=lambda rows: torch.zeros(4, 3)), TypeError,
        ("data_collator returned a bare tensor of shape (4, 3)",)),
    Row("collator-returns-string", lambda out: fit(out, data_collator=lambda rows: "batch"), TypeError,
        ("data_collator returned a str",)),
    Row("eval-collator-returns-none", lambda out: fit(out, data_collator=lambda rows: None, **EVAL), TypeError,
        ("data_collator returned None",)),
    # --- metrics (evaluated on start, before the first step)
    Row("metrics-not-a-dict", lambda out: fit(out, compute_metrics=metrics_returning([0.5]), **EVAL), TypeError,
        ("compute_metrics", "returned list", "not a dict")),
    Row("metrics-string-value", lambda out: fit(out, compute_metrics=metrics_returning({"label": "good"}), **EVAL),
        TypeError, ("compute_metrics", "label='good'", "str")),
    Row("metrics-vector-tensor", lambda out: fit(out, compute_metrics=metrics_returning({"acc": torch.ones(3)}), **EVAL),
        TypeError, ("compute_metrics", "acc=", "Tensor")),
    Row("metrics-array", lambda out: fit(out, compute_metrics=metrics_returning({"acc": np.ones(2)}), **EVAL),
        TypeError, ("compute_metrics", "acc=", "ndarray")),
    Row("metrics-none-value", lambda out: fit(out, compute_metrics=metrics_returning({"acc": None}), **EVAL),
        TypeError, ("compute_metrics", "acc=", "NoneType")),
    # --- output_dir
    Row("output-dir-unwritable", lambda out: fit(os.path.join(out, "file", "run")), ValueError,
        ("output_dir=", "file/run", "cannot be written"), setup=blocked),
    Row("output-dir-in-use", lambda out: fit(out), ValueError, ("output_dir=", "in use by another run", LOCK_NAME),
        setup=locked),
    # --- checkpoints
    Row("resume-true-without-checkpoint", lambda out: fit(out, resume=True), ValueError,
        ("resume_from_checkpoint=True", "no complete checkpoint-N")),
    Row("resume-missing-folder", lambda out: fit(out, resume=os.path.join(out, "nowhere")), ValueError,
        ("resume_from_checkpoint=", "nowhere", "is not a folder")),
    Row("resume-not-a-checkpoint", lambda out: fit(out, resume=out), ValueError,
        ("resume_from_checkpoint=", "trainer_state.json")),
    Row("resume-truncated-weights", lambda out: fit(out, resume=os.path.join(out, "checkpoint-2")), CorruptCheckpointError,
        ("checkpoint-2", "model.safetensors", "bytes"), setup=with_checkpoint(truncate("model.safetensors"))),
    Row("resume-true-only-checkpoint-truncated", lambda out: fit(out, resume=True), CorruptCheckpointError,
        ("every checkpoint", "checkpoint-2", "optimizer.pt"), setup=with_checkpoint(truncate("optimizer.pt"))),
    Row("resume-invalid-state-json", lambda out: fit(out, resume=os.path.join(out, "checkpoint-2")),
        CorruptCheckpointError, ("checkpoint-2", "trainer_state.json"), setup=with_checkpoint(rewrite_json("trainer_state.json", "{"))),
    Row("resume-truncated-rng-state", lambda out: fit(out, resume=os.path.join(out, "checkpoint-2")),
        CorruptCheckpointError, ("checkpoint-2", "rng_state.pth"), setup=with_checkpoint(truncate("rng_state.pth"))),
    Row("resume-crafted-pickle", lambda out: fit(out, resume=os.path.join(out, "checkpoint-2")), UnsafeCheckpointError,
        ("optimizer.pt", "builtins.print", "nothing in it was executed"), setup=with_checkpoint(evil("optimizer.pt"))),
    Row("resume-manifest-a-list", lambda out: fit(out, resume=os.path.join(out, "checkpoint-2")), CorruptCheckpointError,
        ("checkpoint-2", "checkpoint_manifest.json", "not a valid manifest"),
        setup=with_checkpoint(rewrite_json("checkpoint_manifest.json", '[{"files": {}}]'))),
    Row("resume-manifest-entry-wrong-type", lambda out: fit(out, resume=True), CorruptCheckpointError,
        ("checkpoint-2", "checkpoint_manifest.json", "'model.safetensors'"),
        setup=with_checkpoint(rewrite_json("checkpoint_manifest.json", '{"files": {"model.safetensors": [1, "x"]}}'))),
    Row("resume-cadence-checkpoint-without-manifest", lambda out: fit(out, resume=os.path.join(out, "checkpoint-2")),
        CorruptCheckpointError, ("checkpoint-2", "checkpoint_manifest.json is missing", "loop_state.json"),
        setup=with_checkpoint(removed("checkpoint_manifest.json"))),
    Row("resume-state-step-a-string", lambda out: fit(out, resume=os.path.join(out, "checkpoint-2")),
        CorruptCheckpointError, ("checkpoint-2", "trainer_state.json", "global_step='2'"),
        setup=with_checkpoint(state_field("global_step", "2"))),
    Row("resume-state-history-not-a-list", lambda out: fit(out, resume=True), CorruptCheckpointError,
        ("checkpoint-2", "trainer_state.json", "log_history={'loss': 1.0}", "a list of objects"),
        setup=with_checkpoint(state_field("log_history", {"loss": 1.0}))),
    Row("resume-crafted-pytorch-model-bin", lambda out: fit(out, resume=os.path.join(out, "checkpoint-2")),
        UnsafeCheckpointError, ("pytorch_model.bin", "builtins.print", "nothing in it was executed"),
        setup=with_checkpoint(evil_bin_weights)),
    Row("resume-weights-only-checkpoint", lambda out: fit(out, resume=True), ValueError,
        ("checkpoint-2", "optimizer.pt", "save_only_model"), setup=with_checkpoint(weights_only_checkpoint)),
    # --- values deeper inside options: hp_space, fsdp_config, lr_scheduler_kwargs, optim_args (issue 20, item 12)
    Row("hp-space-returns-a-string", search(lambda trial: "abc"), TypeError, ("hp_space returned 'abc'", "not a dict")),
    Row("hp-space-returns-none", search(lambda trial: None), TypeError, ("hp_space returned 'None'", "not a dict")),
    Row("hp-space-value-not-a-number", search(lambda trial: {"learning_rate": "abc"}), ValueError,
        ("learning_rate='abc'", "a number")),
    Row("fsdp-config-min-num-params-text", lambda out: fit(out, args_kw=dict(fsdp="full_shard",
                                                                            fsdp_config={"min_num_params": "many"})),
        ValueError, ("fsdp_config min_num_params='many'", "whole number")),
    Row("fsdp-config-min-num-params-negative", lambda out: fit(out, args_kw=dict(fsdp="full_shard",
                                                                                fsdp_config={"min_num_params": -5})),
        ValueError, ("fsdp_config min_num_params=-5", "whole number >= 0")),
    Row("fsdp-config-version-text", lambda out: fit(out, args_kw=dict(fsdp="full_shard", fsdp_config={"version": "two"})),
        ValueError, ("fsdp_config version='two'", "whole number")),
    Row("polynomial-power-text", lambda out: fit(out, args_kw=dict(lr_scheduler_type="polynomial",
                                                                  lr_scheduler_kwargs={"power": "abc"})),
        ValueError, ("lr_scheduler_kwargs power='abc'", "'polynomial'", "finite number")),
    Row("polynomial-power-nan", lambda out: fit(out, args_kw=dict(lr_scheduler_type="polynomial",
                                                                 lr_scheduler_kwargs={"power": math.nan})),
        ValueError, ("lr_scheduler_kwargs power=nan", "finite number")),
    Row("cosine-num-cycles-inf", lambda out: fit(out, args_kw=dict(lr_scheduler_type="cosine",
                                                                  lr_scheduler_kwargs={"num_cycles": math.inf})),
        ValueError, ("lr_scheduler_kwargs num_cycles=inf", "'cosine'")),
    Row("optim-args-value-not-a-number", lambda out: fit(out, args_kw=dict(optim="sgd", optim_args="momentum=fast")),
        ValueError, ("optim_args momentum='fast'", "optim='sgd'", "a finite number")),
    Row("optim-args-bool-not-a-bool", lambda out: fit(out, args_kw=dict(optim="sgd", optim_args="nesterov=maybe")),
        ValueError, ("optim_args nesterov='maybe'", "True or False")),
    Row("optim-args-nan", lambda out: fit(out, args_kw=dict(optim="rmsprop", optim_args="alpha=nan")),
        ValueError, ("optim_args alpha=nan", "optim='rmsprop'")),
    Row("optim-args-entry-without-equals", lambda out: fit(out, args_kw=dict(optim="sgd", optim_args="momentum")),
        ValueError, ("optim_args='momentum'", "key=value")),
    # --- cadence plot (issue 20, item 11): what it cannot draw is named, and it writes nothing
    plot_row("log-history-not-a-list", '{"log_history": {"loss": 1.0}}', [], "trainer_state.json", "log_history is dict"),
    plot_row("trainer-state-not-an-object", "[1, 2]", [], "trainer_state.json", "not a readable"),
    plot_row("out-unknown-extension", '{"log_history": [{"loss": 1.0, "step": 1}]}', ["{out}/curves.txt"],
             "--out=", "curves.txt", "cannot write '.txt'"),
    # --- cadence train: data files, flags, config files (issue 20, item 10)
    cli_row("empty-file", ["--train_file", "{dir}/empty.csv"], "--train_file=", "empty.csv", "is empty"),
    cli_row("header-only-csv", ["--train_file", "{dir}/header.csv"], "--train_file=", "header.csv", "no rows"),
    cli_row("malformed-csv", ["--train_file", "{dir}/bad.csv"], "--train_file=", "bad.csv", "could not be read as a .csv"),
    cli_row("malformed-jsonl", ["--train_file", "{dir}/bad.jsonl"], "--train_file=", "bad.jsonl",
            "could not be read as a .jsonl"),
    cli_row("malformed-validation-file", ["--validation_file", "{dir}/bad.csv"], "--validation_file=", "bad.csv"),
    cli_row("blank-only-text", ["--train_file", "{dir}/blank.txt"], "--train_file=", "blank.txt", "only blank texts"),
    cli_row("none-text", ["--train_file", "{dir}/none-cell.csv"], "--text_column='text'", "none-cell.csv",
            "row 0 holds None"),
    cli_row("block-size-negative", ["--block_size", "-5"], "--block_size=-5", ">= 1"),
    cli_row("block-size-zero", ["--block_size", "0"], "--block_size=0", ">= 1"),
    cli_row("block-size-beyond-positions", ["--block_size", "128"], "--block_size=128", "n_positions=64"),
    cli_row("config-overrides-without-equals", ["--config_overrides", "n_layer"], "--config_overrides='n_layer'",
            "key=value"),
    cli_row("config-overrides-unknown-key", ["--config_overrides", "n_layr=2"], "--config_overrides='n_layr=2'",
            "n_layr"),
    cli_row("config-file-list", ["{dir}/list.yaml"], "list.yaml", "holds a list"),
    cli_row("config-file-empty-yaml", ["{dir}/empty.yaml"], "empty.yaml", "holds nothing"),
    cli_row("config-file-malformed-yaml", ["{dir}/bad.yaml"], "bad.yaml", "not valid YAML"),
    cli_row("config-file-malformed-json", ["{dir}/bad.json"], "bad.json", "not valid JSON"),
    cli_row("config-file-without-model", ["{dir}/no-model.yaml"], "no-model.yaml", "'model'"),
    # --- issue 28 (14): rows that are None or text, named by dataset and row
    Row("train-rows-none", lambda out: fit(out, train_dataset=[None] * 16), ValueError,
        ("train_dataset row 0 is None", "a dict of inputs")),
    Row("train-one-none-row", lambda out: fit(out, train_dataset=[RegressionDataset(16)[i] if i != 2 else None
                                                                  for i in range(16)],
                                              args_kw=dict(train_sampling_strategy="sequential", max_steps=4)),
        ValueError, ("train_dataset row 2 is None",)),
    Row("train-rows-text", lambda out: fit(out, train_dataset=["y = 2x + 3"] * 16), ValueError,
        ("train_dataset row 0 is a str", "tokenize")),
    Row("eval-one-none-row", lambda out: fit(out, eval_dataset=[RegressionDataset(8)[i] if i != 6 else None
                                                                for i in range(8)],
                                             args_kw=dict(eval_strategy="steps", eval_steps=1, eval_on_start=True)),
        ValueError, ("eval_dataset row 6 is None",)),
    # --- issue 28 (12): a checkpoint of another optimizer is refused before the first resumed step
    Row("resume-adamw-checkpoint-with-sgd", lambda out: fit(out, resume=True, args_kw=dict(optim="sgd", max_steps=4)),
        ValueError, ("checkpoint-2", "optim='adamw_torch", "SGD", "optim='sgd'", "momentum"), setup=with_checkpoint()),
    Row("resume-adamw-checkpoint-with-adafactor",
        lambda out: fit(out, resume=True, args_kw=dict(optim="adafactor", max_steps=4)),
        ValueError, ("checkpoint-2", "optim='adamw_torch", "Adafactor", "optim='adafactor'"), setup=with_checkpoint()),
    Row("resume-transformers-style-adamw-checkpoint-with-sgd",  # no training_args.bin to read: the optimizer's keys
        lambda out: fit(out, resume=True, args_kw=dict(optim="sgd", max_steps=4)),
        ValueError, ("checkpoint-2", "betas", "SGD", "optim='sgd'"),
        setup=with_checkpoint(removed("training_args.bin", "training_args.json", "checkpoint_manifest.json", "loop_state.json"))),
    Row("resume-weights-of-another-model", lambda out: fit(out, model=Classifier(), train_dataset=ClassDataset(8),
                                                            resume=True),
        ValueError, ("do not fit Classifier", "missing"), setup=with_checkpoint()),
]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A finished run's output_dir with checkpoint-2 (the checkpoint rows copy it)."""
    out = str(tmp_path_factory.mktemp("base") / "run")
    Trainer(RegressionModel(), args(out, save_strategy="steps", save_steps=2),
            train_dataset=RegressionDataset(16)).train()
    assert sorted(os.listdir(out)) == ["checkpoint-2"]
    return out


def snapshot(folder):
    return {os.path.relpath(os.path.join(root, name), folder): (os.path.getsize(os.path.join(root, name)),
                                                                os.stat(os.path.join(root, name)).st_mtime_ns)
            for root, _, names in os.walk(folder) for name in names}


def test_the_table_is_large_enough():
    assert len(ROWS) >= 60 and len({row.id for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_bad_input_is_refused_before_the_first_step(tmp_path, base_run, row):
    out = str(tmp_path / "out")
    os.makedirs(out)
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("the user's own file")
    if row.setup is not None:
        row.setup(out, base_run)
    before = snapshot(out)
    steps = []
    hook = register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: steps.append(1))
    try:
        with pytest.raises(row.error) as info:
            row.run(out)
    finally:
        hook.remove()
    message = str(info.value)
    for culprit in row.culprits:
        assert culprit in message, f"{culprit!r} not named in: {message}"
    assert not steps, "an optimizer step ran before the error"
    assert snapshot(out) == before


def test_scalar_metrics_are_converted_and_the_checkpoint_is_kept(tmp_path):
    """0-d and one-element tensors and numpy scalars become Python numbers: logged, saved, comparable."""
    out = str(tmp_path / "out")
    metrics = {"t": torch.tensor(0.5), "n": np.float32(0.25), "i": np.int64(3), "one": torch.tensor([2.0])}
    trainer = Trainer(RegressionModel(), args(out, eval_strategy="steps", eval_steps=1, save_strategy="steps",
                                              save_steps=1, metric_for_best_model="t"),
                      train_dataset=RegressionDataset(16), eval_dataset=RegressionDataset(8),
                      compute_metrics=metrics_returning(metrics))
    trainer.train()
    logged = next(h for h in trainer.state.log_history if "eval_t" in h)
    assert [(logged[f"eval_{k}"], type(logged[f"eval_{k}"])) for k in metrics] == [
        (0.5, float), (0.25, float), (3, int), (2.0, float)]
    with open(os.path.join(out, "checkpoint-2", "trainer_state.json")) as f:
        assert json.load(f)["best_metric"] == 0.5
