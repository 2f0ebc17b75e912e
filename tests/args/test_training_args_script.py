"""What scripts do with TrainingArguments besides passing it to the Trainer: parse it with HfArgumentParser
(argv, JSON, YAML, --help, bool flags), the fluent setters, the process properties, main_process_first.
Every check is against transformers' own TrainingArguments given the same input."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys

import pytest
from dist_exit import launch

from cadence.training_args import ParallelMode, TrainingArguments

transformers = pytest.importorskip("transformers")

# Fields whose to_dict() differs by design: logging_dir is a 4.x field transformers 5 no longer has.
DIFFERENT_BY_DESIGN = {"logging_dir"}

ARGV = [
    "--output_dir", "out", "--do_train", "--do_eval", "--learning_rate", "1e-4", "--num_train_epochs", "2.5",
    "--max_steps", "40", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
    "--eval_strategy", "steps", "--eval_steps", "5", "--save_strategy", "epoch", "--logging_strategy", "steps",
    "--logging_steps", "0.1", "--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs", '{"num_cycles": 0.4}',
    "--warmup_steps", "0.05", "--weight_decay", "0.01", "--optim", "adamw_torch", "--optim_args", "foo=1",
    "--bf16", "false", "--fp16", "no", "--no_dataloader_pin_memory", "--no_remove_unused_columns",
    "--logging_nan_inf_filter", "False", "--gradient_checkpointing", "--gradient_checkpointing_kwargs",
    '{"use_reentrant": false}', "--label_names", "labels", "start_positions", "--report_to", "none",
    "--include_for_metrics", "inputs", "--seed", "3", "--data_seed", "5", "--dataloader_num_workers", "0",
    "--metric_for_best_model", "loss", "--greater_is_better", "false", "--load_best_model_at_end", "false",
    "--log_level", "info", "--disable_tqdm", "true", "--save_total_limit", "2", "--use_cpu",
    "--train_sampling_strategy", "sequential", "--run_name", "run-1", "--debug", "underflow_overflow",
]


def parse(cls, argv):
    (args,) = transformers.HfArgumentParser(cls).parse_args_into_dataclasses(argv)
    return args


def same_as_transformers(ours, theirs):
    a, b = ours.to_dict(), theirs.to_dict()
    assert set(b) - set(a) == set()
    return {k: (a[k], b[k]) for k in b if k not in DIFFERENT_BY_DESIGN and a[k] != b[k]}


def test_command_line_parses_like_transformers():
    ours, theirs = parse(TrainingArguments, ARGV), parse(transformers.TrainingArguments, ARGV)
    assert same_as_transformers(ours, theirs) == {}
    assert ours.learning_rate == 1e-4 and ours.lr_scheduler_kwargs == {"num_cycles": 0.4}
    assert ours.dataloader_pin_memory is False and ours.remove_unused_columns is False
    assert ours.gradient_checkpointing is True and ours.label_names == ["labels", "start_positions"]
    assert ours.do_train and ours.bf16 is False and ours.logging_nan_inf_filter is False


@pytest.mark.parametrize("argv, field, value", [
    (["--bf16"], "bf16", True),  # a bare flag is True
    (["--bf16", "true"], "bf16", True),
    (["--bf16", "False"], "bf16", False),
    (["--no_dataloader_pin_memory"], "dataloader_pin_memory", False),  # --no_* for fields defaulting to True
    (["--dataloader_pin_memory", "false"], "dataloader_pin_memory", False),
    (["--no-log-on-each-node"], "log_on_each_node", False),
    (["--gradient_checkpointing"], "gradient_checkpointing", True),  # an optional bool: bare flag is True
    (["--gradient_checkpointing", "false"], "gradient_checkpointing", False),
    (["--eval_do_concat_batches", "no"], "eval_do_concat_batches", False),
])
def test_bool_flags_behave_like_transformers(argv, field, value):
    argv = ["--output_dir", "o", "--use_cpu", *argv]
    ours, theirs = parse(TrainingArguments, argv), parse(transformers.TrainingArguments, argv)
    assert getattr(ours, field) == getattr(theirs, field) == value


def test_every_field_has_a_flag_and_help_renders():
    parser = transformers.HfArgumentParser(TrainingArguments)
    flags = {action.dest for action in parser._actions}
    fields = [f.name for f in dataclasses.fields(TrainingArguments) if f.init]
    assert [f for f in fields if f not in flags] == []
    text = parser.format_help()
    assert "--output_dir" in text and "--no_dataloader_pin_memory" in text and "Peak learning rate" in text
    out = subprocess.run([sys.executable, "-c", "import sys, transformers, cadence; "
                          "transformers.HfArgumentParser(cadence.TrainingArguments).parse_args(['--help'])"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--per_device_train_batch_size" in out.stdout


def _options(parser):
    """dest -> (option strings, choices) of the options --help shows."""
    return {a.dest: (a.option_strings, list(a.choices) if a.choices is not None else None)
            for a in parser._actions if a.help != argparse.SUPPRESS}


def test_help_lists_transformers_options_with_their_choices():
    """--help shows transformers 5's options with the same flags and choices (plus cadence's own async_save); the
    4.x spellings are accepted but hidden, as transformers 5 has no such options."""
    ours = _options(transformers.HfArgumentParser(TrainingArguments))
    theirs = _options(transformers.HfArgumentParser(transformers.TrainingArguments))
    assert set(ours) - set(theirs) == {"async_save"} and set(theirs) - set(ours) == set()
    assert {dest: ours[dest] for dest in theirs} == theirs
    for dest in ("log_level", "log_level_replica", "dataloader_multiprocessing_context", "ddp_backend"):
        assert ours[dest][1] == theirs[dest][1] and theirs[dest][1]
    help_text = transformers.HfArgumentParser(TrainingArguments).format_help()
    assert "--warmup_ratio" not in help_text and "--evaluation_strategy" not in help_text
    parsed = parse(TrainingArguments, ["--output_dir", "o", "--use_cpu", "--warmup_ratio", "0.1",
                                       "--evaluation_strategy", "epoch", "--no_cuda"])  # still accepted
    assert (parsed.warmup_steps, parsed.eval_strategy, parsed.use_cpu) == (0.1, "epoch", True)


@pytest.mark.parametrize("flag, value", [("--log_level", "loud"), ("--log_level_replica", "eror"),
                                         ("--dataloader_multiprocessing_context", "fork_server"),
                                         ("--ddp_backend", "ncll")])
def test_a_misspelt_choice_fails_at_parse_time_as_in_transformers(flag, value, capsys):
    errors = []
    for cls in (TrainingArguments, transformers.TrainingArguments):
        with pytest.raises(SystemExit) as info:
            parse(cls, ["--output_dir", "o", "--use_cpu", flag, value])
        assert info.value.code == 2
        errors.append(capsys.readouterr().err.splitlines()[-1])
    assert errors[0] == errors[1] and f"invalid choice: '{value}'" in errors[0]


def test_json_and_yaml_files_parse_like_the_command_line(tmp_path):
    yaml = pytest.importorskip("yaml")
    config = {"output_dir": "out", "learning_rate": 1e-4, "eval_strategy": "steps", "eval_steps": 5,
              "gradient_checkpointing": True, "dataloader_pin_memory": False, "lr_scheduler_type": "cosine",
              "lr_scheduler_kwargs": {"num_cycles": 0.4}, "label_names": ["labels"], "report_to": "none",
              "use_cpu": True, "warmup_steps": 0.05, "bf16": False}
    (tmp_path / "a.json").write_text(json.dumps(config))
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(config))
    for name in ("a.json", "a.yaml"):
        read = "parse_json_file" if name.endswith("json") else "parse_yaml_file"
        (ours,) = getattr(transformers.HfArgumentParser(TrainingArguments), read)(str(tmp_path / name))
        (theirs,) = getattr(transformers.HfArgumentParser(transformers.TrainingArguments), read)(str(tmp_path / name))
        assert same_as_transformers(ours, theirs) == {}, name
        assert ours.eval_steps == 5 and ours.lr_scheduler_kwargs == {"num_cycles": 0.4}


SETTERS = [
    ("set_training", dict(learning_rate=1e-3, batch_size=16, weight_decay=0.1, num_epochs=2, max_steps=30,
                          gradient_accumulation_steps=4, seed=9, gradient_checkpointing=True)),
    ("set_evaluate", dict(strategy="steps", steps=50, batch_size=32, accumulation_steps=3, delay=10, loss_only=True)),
    ("set_testing", dict(batch_size=64, loss_only=True)),
    ("set_save", dict(strategy="steps", steps=100, total_limit=3, on_each_node=True)),
    ("set_logging", dict(strategy="steps", steps=25, report_to="none", level="info", first_step=True,
                         nan_inf_filter=False, on_each_node=False, replica_level="error")),
    ("set_optimizer", dict(name="adamw_torch", learning_rate=2e-4, weight_decay=0.05, beta1=0.8, beta2=0.99,
                           epsilon=1e-6, args="a=1")),
    ("set_lr_scheduler", dict(name="cosine", num_epochs=4.0, max_steps=80, warmup_steps=0.05)),
    ("set_dataloader", dict(train_batch_size=16, eval_batch_size=64, drop_last=True, num_workers=2,
                            pin_memory=False, persistent_workers=True, prefetch_factor=4, in_order=False,
                            auto_find_batch_size=True, ignore_data_skip=True, sampler_seed=11)),
]


@pytest.mark.parametrize("setter, kwargs", SETTERS, ids=[s for s, _ in SETTERS])
def test_fluent_setters_set_what_transformers_sets(setter, kwargs, tmp_path):
    ours = getattr(TrainingArguments(str(tmp_path), use_cpu=True), setter)(**kwargs)
    theirs = getattr(transformers.TrainingArguments(str(tmp_path), use_cpu=True), setter)(**kwargs)
    assert isinstance(ours, TrainingArguments)  # returns self, for chaining
    if theirs.report_to == "none":  # transformers' setter stores the raw "none"; its constructor (and cadence) []
        theirs.report_to = []
    assert same_as_transformers(ours, theirs) == {}


def test_setters_chain_and_check_like_the_constructor(tmp_path):
    args = TrainingArguments(str(tmp_path)).set_training(learning_rate=1e-3).set_evaluate("steps", steps=10)
    assert args.do_train and args.do_eval and args.learning_rate == 1e-3 and args.eval_steps == 10
    assert TrainingArguments(str(tmp_path)).set_evaluate().eval_delay == 0  # delay=None: no delay
    with pytest.raises(ValueError, match="learning_rate=-1"):
        TrainingArguments(str(tmp_path)).set_training(learning_rate=-1)
    with pytest.raises(ValueError, match="steps > 0"):
        TrainingArguments(str(tmp_path)).set_save(strategy="steps", steps=0)
    with pytest.raises(ValueError, match="'nope'"):
        TrainingArguments(str(tmp_path)).set_optimizer(name="nope")


def test_process_properties_match_transformers(monkeypatch, tmp_path):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    ours, theirs = TrainingArguments(str(tmp_path), use_cpu=True), transformers.TrainingArguments(str(tmp_path), use_cpu=True)
    for name in ("world_size", "process_index", "local_process_index", "n_gpu", "device", "should_log", "should_save"):
        assert getattr(ours, name) == getattr(theirs, name), name
    for level in ("debug", "info", "error"):  # "passive" reads each library's own logger, so only named levels
        options = dict(output_dir=str(tmp_path), use_cpu=True, log_level=level, log_level_replica="critical")
        assert TrainingArguments(**options).get_process_log_level() == \
            transformers.TrainingArguments(**options).get_process_log_level()
    assert ours.parallel_mode is ParallelMode.NOT_PARALLEL
    assert ours.parallel_mode.value == theirs.parallel_mode.value == "not_parallel"
    assert {m.value for m in ParallelMode} == {m.value for m in type(theirs.parallel_mode)}
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert TrainingArguments(str(tmp_path)).parallel_mode.value == "distributed"


def test_serialisation_matches_transformers(tmp_path):
    ours, theirs = parse(TrainingArguments, ARGV), parse(transformers.TrainingArguments, ARGV)
    assert json.loads(ours.to_json_string()) == ours.to_dict()
    a, b = ours.to_sanitized_dict(), theirs.to_sanitized_dict()
    assert {k: (a[k], b[k]) for k in b if k not in DIFFERENT_BY_DESIGN and a[k] != b[k]} == {}


def test_main_process_first_runs_the_block_with_one_process(tmp_path):
    ran = []
    with TrainingArguments(str(tmp_path), use_cpu=True).main_process_first(desc="tokenizing"):
        ran.append(True)
    assert ran == [True]


@pytest.mark.slow
def test_main_process_first_is_a_barrier_under_two_processes_and_end_closes_the_group(tmp_path):
    proc = launch("main_first_worker.py", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for rank in (0, 1) for line in (tmp_path / f"events_{rank}.jsonl").read_text().splitlines()]
    # rank 0 enters and leaves its block before rank 1 enters: rank 1 waited at the barrier
    order = [(e["rank"], e["what"]) for e in sorted(events, key=lambda e: e["time"]) if e["what"] != "ended"]
    assert order[:2] == [(0, "enter"), (0, "leave")] and order[2] == (1, "enter"), order
    assert all(e["saw_cache"] for e in events if e["rank"] == 1 and e["what"] == "enter")
    ended = [e for e in events if e["what"] == "ended"]
    assert len(ended) == 2 and all(e["initialized_before"] and not e["initialized_after"] for e in ended)  # Trainer.end()


def _as_flag_value(value):
    value = getattr(value, "value", value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_every_field_parses_its_value_from_the_command_line_like_transformers(tmp_path):
    """Each field given on the command line (its default written as text) reads back as transformers reads it."""
    defaults = TrainingArguments(str(tmp_path), use_cpu=True)
    checked = 0
    for f in dataclasses.fields(transformers.TrainingArguments):
        value = getattr(defaults, f.name, None)
        if f.name in ("output_dir", "use_cpu") or value is None or isinstance(value, (list, dict)) or dataclasses.is_dataclass(value):
            continue
        argv = ["--output_dir", str(tmp_path), "--use_cpu", f"--{f.name}", _as_flag_value(value)]
        ours, theirs = parse(TrainingArguments, argv), parse(transformers.TrainingArguments, argv)
        a, b = getattr(ours, f.name), getattr(theirs, f.name)
        assert getattr(a, "value", a) == getattr(b, "value", b), f.name
        checked += 1
    assert checked > 60
