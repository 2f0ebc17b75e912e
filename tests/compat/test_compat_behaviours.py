"""Small behaviours scripts written for transformers rely on (issue 19, item 10), each run on both libraries:
the eval dataloader kept with persistent workers, save_strategy="best" without a metric, and
logging_nan_inf_filter=False logging the non-finite loss as it is."""

from __future__ import annotations

import copy
import dataclasses
import math
import os

import pytest
import torch
from torch import nn

import cadence
from tiny import RegressionDataset, RegressionModel, make_args

transformers = pytest.importorskip("transformers")
LIBS = [cadence, transformers]


# ------------------------------------------------------------------------------ persistent eval workers


class PidDataset(RegressionDataset):
    """Each row carries the id of the process that loaded it (a dataloader worker, with workers)."""

    def __getitem__(self, i):
        return {**super().__getitem__(i), "pid": torch.tensor(os.getpid())}


class PidModel(RegressionModel):
    """Notes the loading processes of the batches it evaluates."""

    def __init__(self):
        super().__init__()
        self.eval_pids = set()

    def forward(self, input_x, labels=None, pid=None):
        if not self.training and pid is not None:
            self.eval_pids.update(pid.tolist())
        return super().forward(input_x, labels)


@pytest.mark.parametrize("lib", LIBS, ids=lambda m: m.__name__)
def test_persistent_workers_keep_the_eval_dataloader_and_its_workers(tmp_path, lib):
    model = PidModel()
    args = make_args(tmp_path, lib, dataloader_num_workers=2, dataloader_persistent_workers=True,
                     per_device_eval_batch_size=4, remove_unused_columns=False)
    trainer = lib.Trainer(model, args, eval_dataset=PidDataset(16))
    loader = trainer.get_eval_dataloader()
    assert trainer.get_eval_dataloader() is loader  # built once (transformers: same object)
    first = trainer.evaluate()
    pids = set(model.eval_pids)
    model.eval_pids.clear()
    second = trainer.evaluate()
    assert len(pids) == 2 and os.getpid() not in pids  # loaded by the two workers...
    assert model.eval_pids == pids  # ... the same two processes the second time: not restarted
    assert first["eval_loss"] == second["eval_loss"]


def test_without_persistent_workers_each_evaluation_builds_its_loader(tmp_path):
    trainer = cadence.Trainer(RegressionModel(), make_args(tmp_path), eval_dataset=RegressionDataset(8))
    assert trainer.get_eval_dataloader() is not trainer.get_eval_dataloader()


def test_persistent_eval_dataloaders_are_per_dataset(tmp_path):
    sets = {"a": RegressionDataset(8, seed=1), "b": RegressionDataset(12, seed=2)}
    args = make_args(tmp_path, dataloader_persistent_workers=True)
    trainer = cadence.Trainer(RegressionModel(), args, eval_dataset=sets)
    a, b = trainer.get_eval_dataloader("a"), trainer.get_eval_dataloader("b")
    assert a is not b and len(a.dataset) == 8 and len(b.dataset) == 12
    assert trainer.get_eval_dataloader("a") is a and trainer.get_eval_dataloader(sets["b"]) is b
    metrics = trainer.evaluate()
    assert set(metrics) >= {"eval_a_loss", "eval_b_loss"} and metrics["eval_a_loss"] != metrics["eval_b_loss"]


# ------------------------------------------------------------------------------ save_strategy="best" needs a metric


@pytest.mark.parametrize("lib", LIBS, ids=lambda m: m.__name__)
def test_metric_for_best_model_behavior_as_transformers(tmp_path, lib):
    """transformers' test: save_strategy="best" without metric_for_best_model is refused by the Trainer;
    load_best_model_at_end alone compares the loss."""
    args = make_args(tmp_path, lib, eval_strategy="epoch", save_strategy="best")
    assert args.metric_for_best_model is None
    with pytest.raises(ValueError, match="`args.metric_for_best_model` must be provided"):
        lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(16), eval_dataset=RegressionDataset(8))
    args = make_args(tmp_path, lib, eval_strategy="steps", save_strategy="steps", load_best_model_at_end=True)
    trainer = lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(16), eval_dataset=RegressionDataset(8))
    assert trainer.args.metric_for_best_model == "loss" and trainer.args.greater_is_better is False


def test_save_best_with_a_metric_saves_on_improvement(tmp_path):
    args = make_args(tmp_path, eval_strategy="epoch", save_strategy="best", metric_for_best_model="loss",
                     num_train_epochs=3, per_device_train_batch_size=8, learning_rate=0.1)
    trainer = cadence.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(16), eval_dataset=RegressionDataset(8))
    trainer.train()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]  # the loss fell each epoch


# ------------------------------------------------------------------------------ logging_nan_inf_filter=False


class RepeatDataset(torch.utils.data.Dataset):
    def __init__(self, x, length=64):
        self.x, self.length = x, length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return {"input_ids": self.x, "labels": self.x}


@pytest.mark.parametrize("lib", LIBS, ids=lambda m: m.__name__)
def test_logging_inf_nan_unfiltered_as_transformers(tmp_path, lib):
    """transformers' test: a learning rate of 1e9 makes the loss non-finite; with logging_nan_inf_filter=False
    the logged losses show it as it is (never replaced by a finite number)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=128, n_embd=32, n_layer=3, n_head=4))
    x = torch.randint(0, 100, (128,))
    args = make_args(tmp_path, lib, learning_rate=1e9, logging_steps=5, logging_nan_inf_filter=False)
    trainer = lib.Trainer(model, args, train_dataset=RepeatDataset(x))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(math.isnan(v) or math.isinf(v) for v in losses[1:])
    assert not any("nonfinite_losses" in h for h in trainer.state.log_history)


def test_an_unfiltered_spike_is_logged_and_the_next_interval_is_clean(tmp_path):
    """One step's loss is +inf (its gradient finite): unfiltered, that step's log is inf and the next log is
    the next step's own finite loss (transformers' running sum stays inf - inf = NaN from there on)."""

    class Spike(RegressionModel):
        calls = 0

        def forward(self, input_x, labels=None):
            out = super().forward(input_x, labels)
            if labels is not None and self.training:
                Spike.calls += 1
                if Spike.calls == 2:
                    return (out[0] + float("inf"), out[1])
            return out

    args = make_args(tmp_path, max_steps=4, logging_steps=1, per_device_train_batch_size=8,
                     logging_nan_inf_filter=False)
    trainer = cadence.Trainer(Spike(), args, train_dataset=RegressionDataset(64))
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert math.isinf(losses[1]) and all(math.isfinite(v) for v in losses[:1] + losses[2:])
    assert math.isinf(result.training_loss)


# ------------------------------------------------------------------------------ bf16 without a GPU
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is about machines without a GPU")
@pytest.mark.parametrize("flag", ["bf16", "bf16_full_eval"])
def test_bf16_without_a_gpu_needs_use_cpu_as_in_transformers(tmp_path, flag):
    """TRL's configs default to bf16=True: on a machine without a GPU transformers refuses the arguments and asks for
    use_cpu; cadence refuses the same arguments (it trained in bfloat16 on the CPU unasked) and names both fixes.
    With use_cpu=True both accept and train in bfloat16 on the CPU (the same losses:
    test_precision.test_same_run_as_transformers)."""
    with pytest.raises(ValueError, match="use_cpu"):
        make_args(tmp_path, transformers, **{flag: True})
    with pytest.raises(ValueError) as ours:
        make_args(tmp_path, cadence, **{flag: True})
    message = str(ours.value)
    assert message.startswith(f"{flag}=True is invalid") and "no GPU" in message
    assert "use_cpu=True" in message and f"{flag}=False" in message
    for lib in LIBS:
        assert getattr(make_args(tmp_path, lib, use_cpu=True, **{flag: True}), flag) is True
    assert getattr(make_args(tmp_path, cadence, no_cuda=True, **{flag: True}), flag) is True  # 4.x name of use_cpu


# ------------------------------------------------------------------------------ the arguments back from a checkpoint
def test_the_arguments_come_back_from_a_checkpoint(tmp_path):
    """transformers' training_args.bin unpickles to its TrainingArguments object (weights_only=False: code can run);
    cadence's holds the plain to_dict(), and TrainingArguments.from_checkpoint builds the object back, equal to
    the run's own arguments and, field by field, to what transformers' file gives back."""
    options = dict(max_steps=2, save_strategy="steps", save_steps=2, learning_rate=3e-3, warmup_steps=0.25,
                   lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 0.25}, weight_decay=0.01,
                   eval_strategy="steps", eval_steps=1, per_device_train_batch_size=4, logging_steps=1, use_cpu=True,
                   accelerator_config={"non_blocking": True}, label_names=["labels"], seed=11, hub_token="secret")
    restored = {}
    for lib in LIBS:
        args = make_args(tmp_path / lib.__name__, lib, **options)
        lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(8), eval_dataset=RegressionDataset(4)).train()
        folder = tmp_path / lib.__name__ / "checkpoint-2"
        if lib is cadence:
            assert isinstance(torch.load(folder / "training_args.bin", weights_only=True), dict)  # safe to read
            restored[lib] = cadence.TrainingArguments.from_checkpoint(folder)
            assert restored[lib] == dataclasses.replace(args, hub_token=None)  # the run's own arguments
            assert restored[lib].hub_token is None  # never written
        else:
            restored[lib] = torch.load(folder / "training_args.bin", weights_only=False)
            with pytest.raises(ValueError, match="pickled object"):
                cadence.TrainingArguments.from_checkpoint(folder)  # never unpickled
    ours, theirs = restored[cadence].to_dict(), restored[transformers].to_dict()
    differ = {k: (ours[k], theirs[k]) for k in theirs if k in ours and ours[k] != theirs[k] and k != "output_dir"}
    assert differ == {}, differ


# ------------------------------------------------------------------------------ what transformers' own Trainer tests read
@pytest.mark.parametrize("rows, batch, ga, max_steps, epochs, drop_last", [
    (24, 4, 1, -1, 2, False),     # whole batches, whole epochs
    (25, 4, 3, -1, 1.5, False),   # a short last batch, a short last window, a fractional epoch count
    (10, 4, 2, 7, 3, False),      # max_steps over several epochs
    (7, 8, 4, -1, 3, False),      # fewer batches than one window
    (30, 4, 2, 5, 1, True),       # max_steps inside the first epoch, the short batch dropped
])
def test_set_initial_training_values_matches_transformers(tmp_path, rows, batch, ga, max_steps, epochs, drop_last):
    """transformers' Trainer tests (and subclasses) read the step counts from set_initial_training_values(args,
    dataloader): (num_train_epochs, num_update_steps_per_epoch, num_examples, num_train_samples,
    total_train_batch_size, steps_in_epoch, max_steps). Exact integers (and the float sample count of a
    fractional epoch count), so compared with ==."""
    values = {}
    for lib in LIBS:
        args = make_args(tmp_path / lib.__name__, lib, use_cpu=True, per_device_train_batch_size=batch,
                         gradient_accumulation_steps=ga, max_steps=max_steps, num_train_epochs=epochs,
                         dataloader_drop_last=drop_last)
        trainer = lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(rows))
        values[lib] = trainer.set_initial_training_values(args, trainer.get_train_dataloader())
    assert values[cadence] == values[transformers]


def test_set_initial_training_values_of_a_stream_matches_transformers(tmp_path):
    """A dataloader without a length: max_steps steps per 'epoch' and sys.maxsize epochs; without max_steps, the
    same ValueError."""
    from tiny import Stream

    for lib in LIBS:
        args = make_args(tmp_path / lib.__name__, lib, use_cpu=True, per_device_train_batch_size=4,
                         gradient_accumulation_steps=2, max_steps=5)
        trainer = lib.Trainer(RegressionModel(), args, train_dataset=Stream(RegressionDataset(24)))
        loader = trainer.get_train_dataloader()
        assert trainer.set_initial_training_values(args, loader) == (2**63 - 1, 5, 40, 40, 8, 10, 5)
        unset = make_args(tmp_path / lib.__name__, lib, use_cpu=True)
        with pytest.raises(ValueError, match="args.max_steps must be set to a positive value if dataloader does not "
                                             "have a length, was -1"):
            trainer.set_initial_training_values(unset, loader)


class _Recorded(transformers.Trainer):
    """transformers' Trainer, keeping the keyword arguments its create_accelerator_and_postprocess passes on."""

    def _build_accelerator_args(self, **kwargs):
        self.recorded = super()._build_accelerator_args(**kwargs)
        return self.recorded


@pytest.mark.parametrize("options", [
    {},
    {"ddp_find_unused_parameters": False, "ddp_bucket_cap_mb": 25, "ddp_broadcast_buffers": False,
     "ddp_static_graph": True},
    {"accelerator_config": {"non_blocking": True, "gradient_accumulation_kwargs": {"sync_each_batch": True}},
     "data_seed": 5},
    {"accelerator_config": {"gradient_accumulation_kwargs": {"num_steps": 3}}},
    {"bf16": True},
    {"torch_compile_mode": "reduce-overhead"},
    {"activation_checkpointing": True, "gpt2": True},
    {"gpt2": True},
], ids=["default", "ddp", "loader", "num_steps", "bf16", "compile", "gpt2-checkpointing", "gpt2"])
def test_build_accelerator_args_matches_transformers(tmp_path, options):
    """The keyword arguments for accelerate's Accelerator, as transformers builds them from the arguments: mixed
    precision, the dataloader configuration and the gradient accumulation plugin (from accelerator_config),
    DDP's options (find_unused_parameters from the model), the dynamo plugin. accelerate's dataclasses compare
    field by field."""
    from tiny import tiny_gpt2

    options = dict(options)
    gpt2 = options.pop("gpt2", False)
    built = {}
    for lib, trainer_cls in ((cadence, cadence.Trainer), (transformers, _Recorded)):
        args = make_args(tmp_path / lib.__name__, lib, use_cpu=True, **copy.deepcopy(options))  # transformers
        trainer = trainer_cls(tiny_gpt2() if gpt2 else RegressionModel(), args)  # writes into accelerator_config
        built[lib] = trainer._build_accelerator_args() if lib is cadence else trainer.recorded
        if "num_steps" in str(options):
            assert trainer.args.gradient_accumulation_steps == 3
    ours, theirs = built[cadence], built[transformers]
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert ours[key] == theirs[key], key
    extra = cadence.Trainer(RegressionModel(), make_args(tmp_path / "x", cadence, use_cpu=True))
    assert extra._build_accelerator_args(mixed_precision="fp16")["mixed_precision"] == "fp16"  # kwargs replace


def test_the_unused_columns_are_logged_as_transformers_logs_them(tmp_path, caplog):
    """One INFO record whose message is the whole formatted string (no %-arguments), in transformers' words."""
    import logging

    datasets = pytest.importorskip("datasets")
    from transformers.utils import logging as hf_logging

    rows = datasets.Dataset.from_list([{"input_x": float(i), "labels": 2.0 * i, "idx": i} for i in range(8)])
    records = {}
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    hf_root, previous = logging.getLogger("transformers"), hf_logging.get_verbosity()
    hf_root.addHandler(handler)
    hf_logging.set_verbosity_info()
    try:
        trainer = transformers.Trainer(RegressionModel(), make_args(tmp_path / "h", transformers, use_cpu=True),
                                       train_dataset=rows)
        seen.clear()
        trainer.get_train_dataloader()
        records[transformers] = [r for r in seen if "corresponding argument" in r.getMessage()]
    finally:
        hf_root.removeHandler(handler)
        hf_logging.set_verbosity(previous)
    trainer = cadence.Trainer(RegressionModel(), make_args(tmp_path / "c", cadence, use_cpu=True), train_dataset=rows)
    with caplog.at_level(logging.INFO, logger="cadence"):
        trainer.get_train_dataloader()
    records[cadence] = [r for r in caplog.records if "corresponding argument" in r.getMessage()
                        and r.name.startswith("cadence")]  # transformers' own may propagate here too
    assert len(records[cadence]) == len(records[transformers]) == 1, {k.__name__: [r.name for r in v] for k, v in records.items()}
    (ours,), (theirs,) = records[cadence], records[transformers]
    assert ours.levelno == theirs.levelno == logging.INFO
    assert ours.getMessage() == theirs.getMessage() == (
        "The following columns in the Training set don't have a corresponding argument in `RegressionModel.forward` "
        "and have been ignored: idx. If idx are not expected by `RegressionModel.forward`,  you can safely ignore "
        "this message.")
    assert ours.msg == ours.getMessage() and not ours.args  # one formatted string, as transformers logs it


# ------------------------------------------------------------------------------ log_level of one Trainer, and the next
def test_a_trainers_log_level_and_a_verbosity_reset_act_as_in_transformers(tmp_path, monkeypatch):
    """transformers' Trainer sets transformers' verbosity from log_level: a later Trainer with the default "passive"
    keeps it (measured: ERROR stays ERROR), and transformers.logging.set_verbosity_info() makes the next Trainer log
    again. cadence's loggers follow the same steps (they stayed at ERROR past the reset). Each library's header line
    is counted at each step, from a handler on its own logger tree."""
    import logging

    from transformers.utils import logging as hf_logging

    from cadence import training_args

    monkeypatch.setattr(training_args, "_transformers_verbosity_seen", training_args._transformers_verbosity_seen)
    previous = hf_logging.get_verbosity(), logging.getLogger("cadence").level
    seen = {lib: [] for lib in LIBS}
    handlers = {}
    for lib in LIBS:
        handlers[lib] = logging.Handler()
        handlers[lib].emit = seen[lib].append
        logging.getLogger(lib.__name__).addHandler(handlers[lib])

    def headers(lib, step, **options):
        seen[lib].clear()
        args = make_args(tmp_path / f"{lib.__name__}{step}", lib, use_cpu=True, max_steps=1, **options)
        lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(8)).train()
        return sum(r.getMessage() == "***** Running training *****" for r in seen[lib])

    try:
        counts = {}
        for lib in LIBS:
            hf_logging.set_verbosity_info()
            counts[lib] = [headers(lib, 0, log_level="error"), headers(lib, 1)]  # ERROR, then "passive" keeps it
            hf_logging.set_verbosity_info()  # the reset
            counts[lib] += [headers(lib, 2), headers(lib, 3, log_level="info")]
            hf_logging.set_verbosity_warning()
            counts[lib].append(headers(lib, 4, log_level="error"))
        assert counts[transformers] == [0, 0, 1, 1, 0]
        assert counts[cadence] == counts[transformers]
    finally:
        for lib in LIBS:
            logging.getLogger(lib.__name__).removeHandler(handlers[lib])
        hf_logging.set_verbosity(previous[0])
        logging.getLogger("cadence").setLevel(previous[1])
