"""The Trainer methods scripts call around training give what transformers.Trainer gives on the same run:
metrics formatting and files, process checks, parameter and optimizer queries, the log lines tools grep for,
and a clear NotImplementedError (saying what to use) for what cadence does differently."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from tiny import LMDataset, pad_collate, tiny_gpt2

transformers = pytest.importorskip("transformers")

import cadence  # noqa: E402

METRICS = {"train_runtime": 3723.456, "train_loss": 1.23456789, "total_flos": 5.5e12, "train_samples": 62,
           "epoch": 2.0, "train_mem_cpu_alloc_delta": 3 << 20, "train_steps_per_second": 0.125}


def pair(tmp_path, **overrides):
    """The same model and arguments in both libraries."""
    model = tiny_gpt2(seed=1)
    model.loss_type = "ForCausalLM"  # transformers then counts the shifted labels, as cadence does
    options = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=3, weight_decay=0.1,
                   save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=1, **overrides)
    made = []
    for lib in (cadence, transformers):
        args = lib.TrainingArguments(str(tmp_path / lib.__name__), **options)
        made.append(lib.Trainer(model=copy.deepcopy(model), args=args, train_dataset=LMDataset(20), data_collator=pad_collate))
    return made


def test_metrics_format_and_log_metrics_print_what_transformers_prints(tmp_path, capsys):
    import transformers.trainer_pt_utils as hf_pt

    ours, theirs = pair(tmp_path)
    # transformers' Trainer.metrics_format lacks `self` (calling it on a trainer raises); its module function works
    assert ours.metrics_format(METRICS) == hf_pt.metrics_format(METRICS) == cadence.Trainer.metrics_format(METRICS)
    # a library's first-import message (deepspeed's "Setting accelerator to CPU", on stdout) comes once per process,
    # during the first of these calls when this test runs alone: call both once and drop what they printed
    theirs.log_metrics("train", METRICS)
    ours.log_metrics("train", METRICS)
    capsys.readouterr()
    theirs.log_metrics("train", METRICS)
    expected = capsys.readouterr().out
    ours.log_metrics("train", METRICS)
    assert capsys.readouterr().out == expected
    assert expected.splitlines()[0] == "***** train metrics *****" and "  train_runtime" in expected


def test_save_metrics_writes_transformers_files(tmp_path):
    ours, theirs = pair(tmp_path)
    for trainer in (ours, theirs):
        trainer.args.output_dir and __import__("os").makedirs(trainer.args.output_dir, exist_ok=True)
        trainer.save_metrics("train", METRICS)
        trainer.save_metrics("eval", {"eval_loss": 0.5, "epoch": 2.0})
        trainer.save_metrics("test", {"test_loss": 0.25}, combined=False)
    for name in ("train_results.json", "eval_results.json", "all_results.json", "test_results.json"):
        assert (tmp_path / "cadence" / name).read_text() == (tmp_path / "transformers" / name).read_text(), name


def test_save_metrics_writes_a_fresh_file_where_a_fifo_stands_without_opening_it(tmp_path, caplog):
    """A FIFO planted at all_results.json (or at {split}_results.json) blocked save_metrics forever: its open waits
    for a writer. It is never opened: named in a warning and replaced by a regular file with this call's metrics."""
    import json
    import os

    from test_checkpoint_files_rule import deadline

    out = tmp_path / "cadence"
    out.mkdir()
    ours = cadence.Trainer(model=tiny_gpt2(seed=1), args=cadence.TrainingArguments(str(out), report_to="none",
                                                                                   use_cpu=True))
    os.mkfifo(out / "all_results.json")
    os.mkfifo(out / "eval_results.json")
    with deadline(20), caplog.at_level(logging.WARNING, logger="cadence"):
        ours.save_metrics("eval", {"eval_loss": 0.5})
    for name in ("all_results.json", "eval_results.json"):
        assert (out / name).is_file() and json.loads((out / name).read_text()) == {"eval_loss": 0.5}
        assert any(f"{out / name} is a FIFO (named pipe), not a regular file: it was not opened" in r.getMessage()
                   for r in caplog.records), name
    ours.save_metrics("test", {"test_loss": 0.25})  # the fresh file is read and merged as before
    assert json.loads((out / "all_results.json").read_text()) == {"eval_loss": 0.5, "test_loss": 0.25}


def test_queries_match_transformers_before_and_after_training(tmp_path):
    ours, theirs = pair(tmp_path)
    ours.model.transformer.wpe.weight.requires_grad_(False)
    theirs.model.transformer.wpe.weight.requires_grad_(False)
    assert ours.is_world_process_zero() == theirs.is_world_process_zero() is True
    assert ours.is_local_process_zero() == theirs.is_local_process_zero() is True
    assert ours.get_num_trainable_parameters() == theirs.get_num_trainable_parameters()
    assert ours.get_decay_parameter_names(ours.model) == theirs.get_decay_parameter_names(theirs.model)
    assert ours.num_examples(ours.get_train_dataloader()) == theirs.num_examples(theirs.get_train_dataloader()) == 20
    assert ours.get_total_train_batch_size(ours.args) == theirs.get_total_train_batch_size(theirs.args) == 8
    assert (ours.get_sp_size(), ours.get_cp_size(), ours.get_tp_size()) == (theirs.get_sp_size(), theirs.get_cp_size(),
                                                                             theirs.get_tp_size())
    for trainer in (ours, theirs):
        with pytest.raises(ValueError, match="optimizer"):
            trainer.get_learning_rates()
    ours.train(), theirs.train()
    assert ours.get_learning_rates() == pytest.approx(theirs.get_learning_rates(), rel=1e-12)
    groups = ours.get_optimizer_group(), theirs.get_optimizer_group()
    assert [len(g) for g in groups[0]] == [len(g) for g in groups[1]]  # decayed, not decayed
    assert len(groups[0]) == 2 and all(groups[0])
    for name in ("transformer.h.0.attn.c_attn.weight", "transformer.h.0.ln_1.bias"):
        mine = ours.get_optimizer_group(dict(ours.model.named_parameters())[name])
        # transformers' own lookup compares tensors with == and raises for most parameters: find it by identity
        target = dict(theirs.model.named_parameters())[name]
        hers = next(g for g in theirs.optimizer.param_groups if any(p is target for p in g["params"]))
        assert mine["weight_decay"] == hers["weight_decay"] and len(mine["params"]) == len(hers["params"])
        assert ours.get_optimizer_group(name) is mine  # cadence also takes the parameter's name
    with pytest.raises(ValueError, match="no parameter of that name"):
        ours.get_optimizer_group("nope.weight")
    ours.store_flos(), theirs.store_flos()
    assert ours.state.total_flos == pytest.approx(theirs.state.total_flos, rel=1e-12)


def test_save_state_writes_trainer_state_json(tmp_path):
    ours, theirs = pair(tmp_path)
    ours.train(), theirs.train()
    ours.save_state(), theirs.save_state()
    import json

    a = json.loads((tmp_path / "cadence" / "trainer_state.json").read_text())
    b = json.loads((tmp_path / "transformers" / "trainer_state.json").read_text())
    assert set(a) == set(b) and a["global_step"] == b["global_step"] == 3
    losses = [[h["loss"] for h in state["log_history"] if "loss" in h] for state in (a, b)]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], rel=1e-4)


def test_training_and_evaluation_log_the_lines_transformers_logs(tmp_path, caplog):
    import transformers.utils.logging as hf_logging

    hf_logging.enable_propagation()
    hf_logging.set_verbosity_info()
    previous = logging.getLogger("cadence").level  # log_level="info" sets it: put it back for the other tests
    try:
        lines = {}
        for trainer in pair(tmp_path, log_level="info"):
            name = type(trainer).__module__.split(".")[0]
            caplog.clear()
            with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="cadence"):
                trainer.train()
                trainer.evaluate(LMDataset(6))
            lines[name] = [r.getMessage() for r in caplog.records if r.name.endswith("trainer") and
                           (r.getMessage().lstrip("\n").startswith("*****") or r.getMessage().startswith("  "))]
    finally:
        hf_logging.disable_propagation()
        hf_logging.set_verbosity_warning()
        logging.getLogger("cadence").setLevel(previous)
    # with propagation switched on, each transformers record reaches the capture twice: drop the repeats
    theirs = lines["transformers"]
    lines["transformers"] = [m for i, m in enumerate(theirs) if i == 0 or m != theirs[i - 1]]
    assert lines["cadence"] == lines["transformers"]
    assert lines["cadence"][:2] == ["***** Running training *****", "  Num examples = 20"]
    assert len(lines["cadence"]) == 9 + 3
    assert "\n***** Running Evaluation *****" in lines["cadence"]


@pytest.mark.parametrize("method, args", [("create_accelerator_and_postprocess", ()),
                                          ("get_batch_samples", (iter([]), 1, "cpu"))])
def test_what_cadence_does_differently_says_what_to_use(tmp_path, method, args):
    ours, _ = pair(tmp_path)
    with pytest.raises(NotImplementedError, match="cadence"):
        getattr(ours, method)(*args)


def test_every_public_transformers_trainer_method_is_decided():
    """Each public method of transformers.Trainer exists on cadence's (built, or raising NotImplementedError)."""
    theirs = {n for n in dir(transformers.Trainer) if not n.startswith("_") and callable(getattr(transformers.Trainer, n))}
    missing = sorted(theirs - set(dir(cadence.Trainer)))
    assert missing == []


def test_an_override_cadence_would_ignore_is_refused(tmp_path):
    class CountsItsOwnWay(cadence.Trainer):
        def get_batch_samples(self, epoch_iterator, num_batches, device):
            return [], None

    args = cadence.TrainingArguments(str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(TypeError, match="overrides get_batch_samples.*compute_loss_func"):
        CountsItsOwnWay(model=tiny_gpt2(), args=args)
