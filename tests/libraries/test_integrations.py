"""report_to trackers, each read back offline by its own library: TensorBoard's EventAccumulator, MLflow's
client over a local SQLite store, W&B's offline run file (decoded with W&B's own protobuf records),
Trackio's local store; and cadence's log_history.jsonl. No tracker is mocked.

Every run logs each step; the reference for the logged numbers is ``trainer.state.log_history``.
TensorBoard stores float32 (rel. 1e-6); the others keep float64 (exact)."""

import glob
import importlib.util
import json
import logging
import os
import struct
import sys
import time
import types

import pytest

from cadence import Trainer, TrainerCallback, TrainingArguments
from cadence.integrations import registry
from cadence.integrations.jsonl import read_log_history
from tiny import RegressionDataset, RegressionModel, stop_at

STEPS, SAVE = 8, 4


def make_trainer(out_dir, report_to, max_steps=STEPS, callbacks=None, **kw):
    args = TrainingArguments(output_dir=out_dir, report_to=report_to, logging_steps=1, max_steps=max_steps,
                             save_steps=SAVE, per_device_train_batch_size=8, learning_rate=0.05, disable_tqdm=True,
                             use_cpu=True, eval_strategy="steps", eval_steps=SAVE, **kw)
    return Trainer(RegressionModel(), args, train_dataset=RegressionDataset(), eval_dataset=RegressionDataset(16, seed=1),
                   callbacks=callbacks)


def losses(log_history):
    """{step: training loss} of the per-step logs."""
    return {h["step"]: h["loss"] for h in log_history if "loss" in h}


def interrupted_then_resumed(out_dir, report_to, stop=6, **kw):
    """A run stopped at step ``stop`` (after its checkpoint at SAVE), then resumed from checkpoint-SAVE in a
    new Trainer; returns (first trainer, resumed trainer)."""
    first = make_trainer(out_dir, report_to, callbacks=[stop_at(stop)], **kw)
    first.train()
    resumed = make_trainer(out_dir, report_to, **kw)
    resumed.train(resume_from_checkpoint=os.path.join(out_dir, f"checkpoint-{SAVE}"))
    return first, resumed


def needs(package):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")


def hostile_logs():
    """One log of what trackers have stumbled on: numpy scalars and a one-element tensor (numbers), an int beyond
    float64, an object JSON cannot write, a key that is not a string, a name MLflow refuses, a text."""
    import numpy as np
    import torch

    return {"np_float": np.float32(0.5), "np_int": np.int64(3), "tensor": torch.tensor([1.5]), "huge": 10**400,
            "obj": object(), 5: 1.0, "name//x": 2.0, "note": "text"}


HOSTILE_STEPS = (2, 3)  # logged twice: each skipped key is warned about once
# what a tracker that keeps floats, texts and any name (W&B, Trackio) holds for them
HOSTILE_AS_NUMBERS = {"np_float": 0.5, "np_int": 3, "tensor": 1.5, "huge": float("inf"), "name//x": 2.0, "note": "text"}


def hostile_run(out_dir, report_to, caplog, **kw):
    """A run that logs ``hostile_logs()`` through ``Trainer.log`` at HOSTILE_STEPS; returns (trainer, {tracker:
    [keys warned about, in order]}) after checking that no tracker failed (no error logged)."""

    class LogHostile(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in HOSTILE_STEPS:
                trainer.log(hostile_logs())

    # no checkpoints: trainer_state.json (json.dumps of state.log_history) cannot hold these values either
    trainer = make_trainer(out_dir, report_to, callbacks=[LogHostile()], save_strategy="no", **kw)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        trainer.train()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("cadence")]
    assert errors == []  # no tracker switched off
    warned = {}
    for record in caplog.records:
        if "cannot take the logged" in record.getMessage():
            warned.setdefault(record.args[0], []).append(record.args[1])
    return trainer, warned


# ----------------------------------------------------------------------------------------- registry


def test_all_means_every_installed_tracker(monkeypatch):
    monkeypatch.delenv("DISABLE_MLFLOW_INTEGRATION", raising=False)
    expected = [n for n in ("tensorboard", "mlflow", "wandb", "trackio") if importlib.util.find_spec(n)] + ["jsonl"]
    assert [n for n in TrainingArguments(report_to="all").report_to if n in expected] == expected  # (more: test_trackers_more)
    monkeypatch.setenv("DISABLE_MLFLOW_INTEGRATION", "TRUE")  # transformers' switch
    assert "mlflow" not in TrainingArguments(report_to="all").report_to


@pytest.mark.parametrize("report_to, words", [
    ("bogus", ["'bogus'", "not a tracker name", "'tensorboard'"]),
    ("neptune", ["'neptune'", "cadence does not yet"]),
    (["none", "jsonl"], ["'none'", "stand alone"]),
])
def test_unknown_name_is_refused_with_the_valid_ones(report_to, words):
    with pytest.raises(ValueError) as error:
        TrainingArguments(report_to=report_to)
    for word in words:
        assert word in str(error.value)


def test_all_leaves_out_a_tracker_that_is_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "trackio", None)  # as if trackio were not installed
    assert "trackio" not in TrainingArguments(report_to="all").report_to


def test_missing_package_is_an_error_at_trainer_creation(out_dir, monkeypatch):
    args = TrainingArguments(output_dir=out_dir, report_to=["jsonl", "wandb"], use_cpu=True)
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    with pytest.raises(ValueError, match=r"'wandb'.*`wandb` package: pip install wandb"):
        Trainer(RegressionModel(), args, train_dataset=RegressionDataset())


# ----------------------------------------------------------------------------------------- jsonl


def test_jsonl_rows_are_the_log_history(out_dir):
    trainer = make_trainer(out_dir, "jsonl")
    trainer.train()
    trainer.evaluate()  # after training: appended to the same file
    path = os.path.join(out_dir, "log_history.jsonl")
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    assert rows == trainer.state.log_history  # every key and number (JSON keeps float64 exactly)
    assert read_log_history(path) == rows


@needs("tensorboard")
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="open files are listed from Linux's /proc")
def test_trackers_close_their_files_when_training_ends(out_dir):
    def open_here():
        fds = os.listdir("/proc/self/fd")
        paths = {os.path.realpath(os.path.join("/proc/self/fd", fd)) for fd in fds if os.path.exists(f"/proc/self/fd/{fd}")}
        return sorted(p for p in paths if p.startswith(os.path.realpath(out_dir)))

    trainer = make_trainer(out_dir, ["jsonl", "tensorboard"])
    trainer.train()
    written = glob.glob(os.path.join(out_dir, "runs", "*", "events.out.tfevents.*")) + glob.glob(f"{out_dir}/*.jsonl")
    assert len(written) == 2
    assert open_here() == []
    trainer.evaluate()  # after training: the trackers reopen their run for the log, and close it again
    assert open_here() == []
    trainer.log({"note_after": 1.0})
    assert open_here() == []
    (folder,) = glob.glob(os.path.join(out_dir, "runs", "*"))  # the same run
    assert read_scalars(folder)[1]["eval/loss"][STEPS] == pytest.approx(trainer.state.log_history[-2]["eval_loss"])
    assert read_log_history(os.path.join(out_dir, "log_history.jsonl")) == trainer.state.log_history


@needs("tensorboard")
def test_an_evaluate_before_training_belongs_to_the_training_run(out_dir):
    trainer = make_trainer(out_dir, ["jsonl", "tensorboard"])
    trainer.evaluate()  # step 0: opens the run, writes, closes it
    trainer.train()  # continues that run: one folder, the step-0 evaluation in it
    (folder,) = glob.glob(os.path.join(out_dir, "runs", "*"))
    _, _, steps = read_scalars(folder)
    assert steps["eval/loss"] == [0, SAVE, STEPS] and steps["train/loss"] == list(range(1, STEPS + 1))
    history = read_log_history(os.path.join(out_dir, "log_history.jsonl"))
    assert history[1:] == trainer.state.log_history  # train() starts a new state.log_history; the file keeps both
    assert history[0]["step"] == 0 and "eval_loss" in history[0]


def test_jsonl_lines_are_json_dumps_of_each_row():
    """A batch is encoded with one json.dumps and split between rows; the lines are each row's json.dumps,
    also when a value holds the split mark (texts, lists of dicts), and they read back as the rows."""
    import math

    from cadence.integrations.jsonl import json_lines

    batches = [
        [{"loss": 1 / 3, "learning_rate": 5e-05, "epoch": 0.01, "step": n} for n in range(1, 50)],
        [{"loss": math.nan, "step": 1}, {"eval_loss": math.inf, "note": "a}, {b", "step": 2}],
        [{"per_class": [{"f1": 0.5}, {"f1": 0.25}], "step": 3}, {"tag": "é\n\"}", "step": 3}],
        [{"step": 4}],
        [],
    ]
    for rows in batches:
        text = json_lines(rows)
        assert text == "".join(json.dumps(row) + "\n" for row in rows)
        assert [json.loads(line) for line in text.splitlines()] == json.loads(json.dumps(rows))


def test_jsonl_rows_reach_the_file_in_batches(out_dir, monkeypatch):
    """The first log at once; the next ones together, once flush_secs have passed, at a save, after an
    evaluation and at the end; after training each at once (a clock that moves only when the test says)."""
    from cadence import TrainerControl, TrainerState
    from cadence.integrations import base
    from cadence.integrations.jsonl import JsonlCallback

    now = [1000.0]
    monkeypatch.setattr(base, "time", types.SimpleNamespace(time=time.time, monotonic=lambda: now[0]))
    args, state, control, tracker = TrainingArguments(out_dir, use_cpu=True), TrainerState(), TrainerControl(), JsonlCallback()
    path = os.path.join(out_dir, "log_history.jsonl")

    def log(step):
        state.global_step = step
        tracker.on_log(args, state, control, logs={"loss": 1 / step})

    def on_disk():
        return [r["step"] for r in read_log_history(path)]

    tracker.on_train_begin(args, state, control)
    log(1)
    assert on_disk() == [1]
    log(2), log(3)
    now[0] += tracker.flush_secs * 0.99
    log(4)
    assert on_disk() == [1]  # kept: less than flush_secs since the last write
    now[0] += tracker.flush_secs * 0.02
    log(5)
    assert on_disk() == [1, 2, 3, 4, 5]
    log(6)
    tracker.on_save(args, state, control)
    assert on_disk() == [1, 2, 3, 4, 5, 6]
    log(7)
    tracker.on_evaluate(args, state, control)
    assert on_disk() == [1, 2, 3, 4, 5, 6, 7]
    log(8)
    tracker.on_train_end(args, state, control)
    assert on_disk() == [1, 2, 3, 4, 5, 6, 7, 8]
    log(9)  # after train(): a log is written at once, the clock notwithstanding
    assert [r["loss"] for r in read_log_history(path)] == [1 / s for s in range(1, 10)]


def test_jsonl_holds_a_just_in_time_checkpoints_logs(out_dir):
    """A script's own CheckpointManager writes a checkpoint mid-run: the logs kept for the next batch are
    written with it, so the file holds every row of the checkpoint's log history (the process may be
    killed right after)."""
    from cadence.trainer_jit_checkpoint import CheckpointManager

    seen = {}

    class JitAtStep3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:  # before the scheduled checkpoint-4
                folder = CheckpointManager(trainer).execute_jit_checkpoint()
                with open(os.path.join(folder, "trainer_state.json")) as f:
                    seen["checkpoint"] = [h["step"] for h in json.load(f)["log_history"]]
                seen["file"] = [r["step"] for r in read_log_history(os.path.join(out_dir, "log_history.jsonl"))]

    trainer = make_trainer(out_dir, "jsonl", max_steps=5, callbacks=[JitAtStep3()])
    trainer.train()
    assert seen["checkpoint"] == [1, 2]  # step 3 is logged after on_step_end
    assert seen["file"] == seen["checkpoint"]


def test_jsonl_resumed_run_appends_and_reads_as_one_run(out_dir, tmp_path):
    unbroken = make_trainer(str(tmp_path / "unbroken"), "none")
    unbroken.train()
    first, resumed = interrupted_then_resumed(out_dir, "jsonl")
    path = os.path.join(out_dir, "log_history.jsonl")
    with open(path) as f:
        raw = [json.loads(line) for line in f]
    # the interrupted run's rows up to checkpoint-4 stay, its rows of steps 5 and 6 are cut, the resumed run's follow
    assert [r["step"] for r in first.state.log_history if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert raw[:5] == first.state.log_history[:5]  # steps 1-4 and the evaluation at 4
    assert [r["step"] for r in raw if "loss" in r] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert raw == resumed.state.log_history
    history = read_log_history(path)
    assert history == resumed.state.log_history  # the checkpoint's history plus the resumed steps
    assert losses(history) == losses(unbroken.state.log_history)  # exact resume: bit-identical losses


class CrashAt(TrainerCallback):
    """Raises at the end of optimizer step ``step`` (before that step's log): the run crashes with step - 1 logged."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError("power cut")


def test_jsonl_after_a_crash_and_resume_holds_each_step_once(out_dir, tmp_path):
    """Crashed with step 5 logged (and a row cut short, as a kill mid-write leaves it), resumed from
    checkpoint-4: the file holds each step once, the resumed run's, as does read_log_history (cadence plot)."""
    unbroken = make_trainer(str(tmp_path / "unbroken"), "none")
    unbroken.train()
    with pytest.raises(Exception, match="power cut"):
        make_trainer(out_dir, "jsonl", callbacks=[CrashAt(SAVE + 2)]).train()
    path = os.path.join(out_dir, "log_history.jsonl")
    assert [r["step"] for r in read_log_history(path) if "loss" in r] == [1, 2, 3, 4, 5]
    with open(path, "ab") as f:
        f.write(b'{"loss": 9.5, "grad_n')
    resumed = make_trainer(out_dir, "jsonl")
    resumed.train(resume_from_checkpoint=os.path.join(out_dir, f"checkpoint-{SAVE}"))
    with open(path) as f:
        raw = [json.loads(line) for line in f]
    assert raw == resumed.state.log_history
    history = read_log_history(path)
    assert [r["step"] for r in history if "loss" in r] == list(range(1, STEPS + 1))
    assert losses(history) == losses(unbroken.state.log_history)


def test_jsonl_drop_rows_after_reads_the_tail_block_by_block(tmp_path):
    """drop_rows_after reads the file backwards a block at a time; the reference reads it whole and walks its
    lines from the end. Random files (rows at random steps, a last line cut short or not, empty lines at the
    end), random steps, blocks from 1 byte up."""
    import math
    import random

    from cadence.integrations.jsonl import drop_rows_after

    def reference(data, step):
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()  # a final newline ends the last line
        starts = [sum(len(line) + 1 for line in lines[:i]) for i in range(len(lines))]
        cut, cut_lines = len(data), 0
        for start, line in zip(reversed(starts), reversed(lines)):
            try:
                row_step = json.loads(line)["step"]
            except (ValueError, KeyError):
                row_step = math.inf
            if row_step <= step:
                break
            cut, cut_lines = start, cut_lines + 1
        return data[:cut], cut_lines

    rng, path = random.Random(0), tmp_path / "log_history.jsonl"
    for _ in range(500):
        rows = [json.dumps({"loss": rng.random(), "step": rng.randint(0, 9), "t": "x" * rng.randint(0, 30)}).encode()
                for _ in range(rng.randint(0, 8))]
        data = b"\n".join(rows) + (b"\n" if rows and rng.random() < 0.7 else b"")
        data += rng.choice([b"", b"", b'{"loss": 1.0, "st', b"\n\n"])
        path.write_bytes(data)
        step, block = rng.randint(0, 9), rng.choice([1, 2, 3, 7, 16, 1 << 16])
        expected, cut_lines = reference(data, step)
        assert drop_rows_after(path, step, block=block) == cut_lines
        assert path.read_bytes() == expected, (data, step, block)


def test_jsonl_writes_numbers_and_leaves_out_what_json_cannot_write(out_dir, caplog):
    trainer, warned = hostile_run(out_dir, "jsonl", caplog)
    assert warned == {"jsonl": ["obj"]}  # once, though logged twice
    path = os.path.join(out_dir, "log_history.jsonl")
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    expected = []
    for row in trainer.state.log_history:  # every row kept; the odd ones as JSON has them
        if "obj" in row:
            row = {**{k: v for k, v in row.items() if k != "obj" and k != 5}, "np_float": 0.5, "np_int": 3,
                   "tensor": 1.5, "5": 1.0}
        expected.append(row)
    assert rows == expected
    hostile = [r for r in rows if "note" in r]
    assert [r["step"] for r in hostile] == list(HOSTILE_STEPS) and hostile[0]["huge"] == 10**400  # JSON keeps the int


# ----------------------------------------------------------------------------------------- tensorboard


def read_scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    steps = {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return acc, scalars, steps


@needs("tensorboard")
def test_tensorboard_scalars_and_arguments(out_dir):
    trainer = make_trainer(out_dir, "tensorboard")
    trainer.train()
    (folder,) = glob.glob(os.path.join(out_dir, "runs", "*"))  # output_dir/runs/<time>_<host>
    acc, scalars, _ = read_scalars(folder)
    for name in ("loss", "grad_norm", "learning_rate"):
        expected = {h["step"]: h[name] for h in trainer.state.log_history if name in h}
        assert scalars[f"train/{name}"] == pytest.approx(expected, rel=1e-6)  # TensorBoard keeps float32
    evals = {h["step"]: h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h}
    assert scalars["eval/loss"] == pytest.approx(evals, rel=1e-6) and sorted(evals) == [4, 8]
    assert scalars["train/train_loss"] == pytest.approx({STEPS: trainer.state.log_history[-1]["train_loss"]}, rel=1e-6)
    text = acc.Tensors("args/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads(text) == json.loads(trainer.args.to_json_string())


@needs("tensorboard")
def test_tensorboard_logging_dir_and_resume_into_the_same_run(out_dir, tmp_path):
    unbroken = make_trainer(str(tmp_path / "unbroken"), "none")
    unbroken.train()
    logging_dir = str(tmp_path / "tb")
    interrupted_then_resumed(out_dir, "tensorboard", logging_dir=logging_dir)
    _, scalars, steps = read_scalars(logging_dir)
    # purge_step dropped the interrupted run's steps 5 and 6: each step once, the resumed values
    assert steps["train/loss"] == list(range(1, STEPS + 1))
    assert scalars["train/loss"] == pytest.approx(losses(unbroken.state.log_history), rel=1e-6)
    assert not os.path.exists(os.path.join(out_dir, "runs"))


@needs("tensorboard")
@pytest.mark.parametrize("restore", [False, True])  # True: the callback itself is rebuilt from its saved state
def test_tensorboard_default_folder_is_kept_across_a_resume(out_dir, restore):
    interrupted_then_resumed(out_dir, "tensorboard", restore_callback_states_from_checkpoint=restore)
    (folder,) = glob.glob(os.path.join(out_dir, "runs", "*"))  # one run folder: the resumed run reopened it
    _, _, steps = read_scalars(folder)
    assert steps["train/loss"] == list(range(1, STEPS + 1))


@needs("tensorboard")
def test_tensorboard_file_holds_every_log_up_to_each_checkpoint(out_dir):
    """Logs are encoded in batches (at most every FLUSH_SECS), but a checkpoint's logs are in the file when it is
    saved: a reader (here at on_save, after the tracker's) sees every step up to the checkpoint's."""
    seen = {}

    class ReadAtSave(TrainerCallback):  # user callbacks run after the report_to trackers
        def on_save(self, args, state, control, **kwargs):
            (folder,) = glob.glob(os.path.join(out_dir, "runs", "*"))
            seen[state.global_step] = read_scalars(folder)[2]["train/loss"]

    make_trainer(out_dir, "tensorboard", callbacks=[ReadAtSave()]).train()
    assert sorted(seen) == [SAVE, STEPS] and seen[STEPS] == list(range(1, STEPS + 1))
    # async_save: on_save fires once checkpoint-SAVE is written, maybe some steps later: the file has those steps too
    assert seen[SAVE][:SAVE] == list(range(1, SAVE + 1)) and seen[SAVE] == list(range(1, len(seen[SAVE]) + 1))


@needs("tensorboard")
@pytest.mark.parametrize("step", [0, 1, 127, 128, 16384, 2**40])
def test_tensorboard_scalar_events_are_the_bytes_protobuf_writes(step):
    """cadence builds a log's scalar event itself (a third of protobuf's time); protobuf, serializing the same
    Event, is the reference, byte for byte: float32 rounding, overflow to infinity, NaN, ints and bools,
    numpy scalars (which transformers drops), non-ASCII and long tags, varint lengths and steps, step 0 left out;
    the fast path (one struct.pack) and the value-by-value one (an overflow). A text or a non-number raises."""
    import math

    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    from cadence.integrations.base import metric_name
    from cadence.integrations.tensorboard import scalars_event

    import numpy as np

    values = [0.0, -0.0, 1e-3, 1 / 3, -2.5, 3.4028235e38, 3.5e38, -1e39, 1e300, math.inf, -math.inf, math.nan, True,
              7, -3, 2**40, 1e-46, 5e-324, np.float32(0.1), np.int64(-4), np.float64(1e39)]
    for value in values + [2**1100, -(2**1100)]:  # ints beyond float64 too: infinity (protobuf cannot take them)
        for logs in ({"loss": value, "eval_précision": 0.5, "a" * 200: 2}, {"loss": value}):
            expected = Event(wall_time=1733050000.123456, step=step, summary=Summary(value=[
                Summary.Value(tag=metric_name(k), simple_value=(math.inf if v > 0 else -math.inf) if type(v) is int and abs(v) > 2**1024 else float(v))
                for k, v in logs.items()]))
            assert scalars_event(1733050000.123456, step, logs) == expected.SerializeToString(), value
    for bad in ({"loss": 1.0, "note": "a text is an event of its own"}, {"loss": None}, {5: 1.0}):
        with pytest.raises(Exception):  # not a number, not a name: the callback sorts the log out (a warning)
            scalars_event(1733050000.123456, step, bad)


@needs("tensorboard")
def test_tensorboard_writes_numbers_and_texts_and_leaves_out_the_rest(out_dir, caplog):
    trainer, warned = hostile_run(out_dir, "tensorboard", caplog)
    assert warned == {"tensorboard": ["obj", 5]}
    (folder,) = glob.glob(os.path.join(out_dir, "runs", "*"))
    acc, scalars, _ = read_scalars(folder)
    assert scalars["train/loss"] == pytest.approx(losses(trainer.state.log_history), rel=1e-6)  # no row lost
    at = dict.fromkeys(HOSTILE_STEPS)
    assert scalars["train/np_float"] == {s: 0.5 for s in at} and scalars["train/np_int"] == {s: 3.0 for s in at}
    assert scalars["train/tensor"] == {s: 1.5 for s in at} and scalars["train/name//x"] == {s: 2.0 for s in at}
    assert scalars["train/huge"] == {s: float("inf") for s in at}  # beyond float32: infinity, as protobuf has it
    notes = acc.Tensors("train/note/text_summary")
    assert [(e.step, e.tensor_proto.string_val[0]) for e in notes] == [(s, b"text") for s in at]


@needs("tensorboard")
def test_unwritable_logging_dir_is_refused_when_the_trainer_is_built(out_dir, tmp_path, monkeypatch):
    """As transformers (whose SummaryWriter raises at on_train_begin), but before anything is written and naming
    the folder: a folder under a file, a read-only folder, $TENSORBOARD_LOGGING_DIR."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=rf"logging_dir='{blocker}/tb' cannot be written \({blocker} is not a folder"):
        make_trainer(out_dir, "tensorboard", logging_dir=str(blocker / "tb"))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(blocker / "tb2"))
    with pytest.raises(ValueError, match=r"\$TENSORBOARD_LOGGING_DIR=.*tb2' cannot be written"):
        make_trainer(out_dir, "tensorboard")
    make_trainer(out_dir, "jsonl")  # a run without TensorBoard does not care
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR")
    if os.geteuid() != 0:  # root writes into read-only folders
        read_only = tmp_path / "read_only"
        read_only.mkdir(mode=0o500)
        with pytest.raises(ValueError, match=rf"{read_only} is not writable"):
            make_trainer(out_dir, "tensorboard", logging_dir=str(read_only / "runs"))
    assert not os.path.exists(out_dir)  # nothing written


@needs("tensorboard")
@pytest.mark.slow  # importing transformers' Trainer
def test_transformers_refuses_an_unwritable_tensorboard_folder_too(tmp_path, monkeypatch):
    """The reference for the test above: transformers 5 (whose folder is $TENSORBOARD_LOGGING_DIR) raises when
    training starts, before a step, as its SummaryWriter cannot make the folder."""
    import transformers

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(blocker / "tb"))
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="tensorboard", max_steps=2,
                                             use_cpu=True, disable_tqdm=True)
    hf = transformers.Trainer(RegressionModel(), hf_args, train_dataset=RegressionDataset())
    with pytest.raises(OSError):
        hf.train()
    assert hf.state.global_step == 0


@needs("tensorboard")
def test_tensorboard_events_carry_the_time_of_their_log(out_dir):
    """Written in batches, each event still has its own log's wall time: a 0.3 s pause before step 3's
    log shows between steps 2 and 3, not spread over the batch."""

    class Pause(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                time.sleep(0.3)

    make_trainer(out_dir, "tensorboard", callbacks=[Pause()]).train()
    (folder,) = glob.glob(os.path.join(out_dir, "runs", "*"))
    walls = [e.wall_time for e in read_scalars(folder)[0].Scalars("train/loss")]
    gaps = [b - a for a, b in zip(walls, walls[1:])]
    assert gaps[1] >= 0.3 and max(gaps[:1] + gaps[2:]) < 0.3


@needs("tensorboard")
def test_tensorboard_checksum_and_a_users_writer(out_dir, tmp_path):
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference
    from torch.utils.tensorboard import SummaryWriter

    from cadence.integrations.tensorboard import TensorBoardCallback, masked_crc32c

    for data in (b"", b"x", bytes(range(256)) * 3):
        assert masked_crc32c()(data) == reference(data)  # tensorboard's own (pure Python) checksum
    writer = SummaryWriter(str(tmp_path / "mine"))
    trainer = make_trainer(out_dir, "none", callbacks=[TensorBoardCallback(tb_writer=writer)])
    trainer.train()
    _, scalars, _ = read_scalars(str(tmp_path / "mine"))
    assert scalars["train/loss"] == pytest.approx(losses(trainer.state.log_history), rel=1e-6)


# ----------------------------------------------------------------------------------------- failures


def test_failing_tracker_is_switched_off_and_training_finishes(out_dir, caplog):
    class CloseTheFile(TrainerCallback):  # the disk goes away under the jsonl tracker after checkpoint-4
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == SAVE + 1:  # its file descriptor now refuses writes (EBADF), as a lost disk would
                jsonl = next(cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ == "JsonlCallback")
                read_only = os.open(os.devnull, os.O_RDONLY)
                os.dup2(read_only, jsonl._file.fileno())
                os.close(read_only)

    # async_save=False: the tracker flushes at on_save, which a background save fires a step or more later, maybe
    # after the file is gone (then the error names on_save); this test is about the tracker, not the save
    trainer = make_trainer(out_dir, "jsonl", callbacks=[CloseTheFile()], async_save=False)
    with caplog.at_level(logging.ERROR, logger="cadence"):
        result = trainer.train()
    assert result.global_step == STEPS
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    # one error, at the first batch written after the loss (step 8's evaluation), then switched off
    assert len(errors) == 1 and "'jsonl' failed in on_evaluate" in errors[0].getMessage()
    assert "switched off" in errors[0].getMessage()
    # what was written before stays: the rows through checkpoint-4 and its evaluation
    assert [r["step"] for r in read_log_history(os.path.join(out_dir, "log_history.jsonl"))] == [1, 2, 3, 4, SAVE]


@needs("tensorboard")
def test_tracker_that_cannot_start_leaves_the_others_running(out_dir, tmp_path, caplog):
    blocker = tmp_path / "a_file"
    trainer = make_trainer(out_dir, ["tensorboard", "jsonl"], logging_dir=str(blocker / "tb"))
    blocker.write_text("not a folder")  # after the Trainer checked the folder: TensorBoard fails when it starts
    with caplog.at_level(logging.ERROR, logger="cadence"):
        trainer.train()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "'tensorboard' failed in on_train_begin" in errors[0]
    assert read_log_history(os.path.join(out_dir, "log_history.jsonl")) == trainer.state.log_history


def test_only_the_main_process_reports(out_dir):
    trainer = make_trainer(out_dir, "jsonl")
    trainer.state.is_world_process_zero = False  # what every process but rank 0 has
    trainer.train()
    assert not os.path.exists(os.path.join(out_dir, "log_history.jsonl"))


# ----------------------------------------------------------------------------------------- mlflow


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    """One local SQLite tracking store for the module (MLflow 3 deprecates file stores; creating one takes seconds)."""
    pytest.importorskip("mlflow")
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def mlflow_store(mlflow_uri, request, monkeypatch):
    """MLFLOW_TRACKING_URI and an experiment of this test's own; yields the client."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", request.node.name)
    mlflow.set_tracking_uri(mlflow_uri)
    yield mlflow.MlflowClient(mlflow_uri)
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


def only_run(client):
    experiment = client.get_experiment_by_name(os.environ["MLFLOW_EXPERIMENT_NAME"])
    (run,) = client.search_runs([experiment.experiment_id])
    return run


@needs("mlflow")
@pytest.mark.slow
def test_mlflow_params_metrics_and_status(out_dir, mlflow_store):
    trainer = make_trainer(out_dir, "mlflow", run_name="r1", lr_scheduler_type="polynomial",
                           lr_scheduler_kwargs={"power": 2.0},
                           hub_model_id="x" * 7000)
    trainer.train()
    run = only_run(mlflow_store)
    assert run.info.status == "FINISHED" and run.info.run_name == "r1"
    assert run.data.params["learning_rate"] == "0.05" and run.data.params["max_steps"] == str(STEPS)
    assert run.data.params["lr_scheduler_kwargs/power"] == "2.0"  # flattened
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    assert run.data.params["hub_model_id"] == "x" * (MAX_PARAM_VAL_LENGTH - 3) + "..."  # cut to MLflow's limit
    history = {m.step: m.value for m in mlflow_store.get_metric_history(run.info.run_id, "loss")}
    assert history == losses(trainer.state.log_history)  # float64, exact
    evals = mlflow_store.get_metric_history(run.info.run_id, "eval_loss")
    assert sorted(m.step for m in evals) == [4, 8]


@needs("mlflow")
@pytest.mark.slow
def test_mlflow_run_is_failed_on_an_error_and_resumed_with_each_step_once(out_dir, mlflow_store, tmp_path):
    """Crashed with step 5 logged, resumed from checkpoint-4: the run goes on in a copy up to step 4 (same name,
    parameters, tags, metrics), the crashed run is deleted (restorable); each step once, the resumed run's values."""
    unbroken = make_trainer(str(tmp_path / "unbroken"), "none")
    unbroken.train()
    with pytest.raises(Exception, match="power cut"):
        make_trainer(out_dir, "mlflow", run_name="r1", callbacks=[CrashAt(SAVE + 2)]).train()
    crashed = only_run(mlflow_store)
    assert crashed.info.status == "FAILED"  # ended, not left running
    assert [m.step for m in mlflow_store.get_metric_history(crashed.info.run_id, "loss")] == [1, 2, 3, 4, 5]
    resumed = make_trainer(out_dir, "mlflow", run_name="r1")
    resumed.train(resume_from_checkpoint=True)  # checkpoint-4
    run = only_run(mlflow_store)  # one run
    assert run.info.status == "FINISHED" and run.info.run_name == "r1"
    assert run.data.tags["cadence.resumed_from_run_id"] == crashed.info.run_id
    assert run.data.params == crashed.data.params
    history = mlflow_store.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == list(range(1, STEPS + 1))
    assert {m.step: m.value for m in history} == losses(unbroken.state.log_history)  # exact resume, float64
    evals = mlflow_store.get_metric_history(run.info.run_id, "eval_loss")
    assert [m.step for m in evals] == [SAVE, STEPS]
    assert mlflow_store.get_run(crashed.info.run_id).info.lifecycle_stage == "deleted"
    # a run stopped at its checkpoint holds nothing after it: resuming reopens that very run
    again = make_trainer(str(tmp_path / "again"), "mlflow", callbacks=[stop_at(SAVE)])
    again.train()
    first_id = next(cb.run_id for cb in again.callback_handler.callbacks if type(cb).__name__ == "MLflowCallback")
    make_trainer(str(tmp_path / "again"), "mlflow").train(resume_from_checkpoint=True)
    ids = {r.info.run_id for r in mlflow_store.search_runs([run.info.experiment_id])}
    assert first_id in ids and len(ids) == 2


@needs("mlflow")
@pytest.mark.slow
def test_mlflow_logs_numbers_and_leaves_out_what_it_cannot_take(out_dir, mlflow_store, caplog):
    trainer, warned = hostile_run(out_dir, "mlflow", caplog)
    assert warned == {"mlflow": ["obj", 5, "name//x", "note"]}  # each once, though logged twice
    run = only_run(mlflow_store)
    assert run.info.status == "FINISHED"  # not switched off, not FAILED

    def history(key):
        return {m.step: m.value for m in mlflow_store.get_metric_history(run.info.run_id, key)}

    assert history("loss") == losses(trainer.state.log_history)  # no row lost
    at = dict.fromkeys(HOSTILE_STEPS)
    assert history("np_float") == {s: 0.5 for s in at} and history("np_int") == {s: 3.0 for s in at}
    assert history("tensor") == {s: 1.5 for s in at}
    assert history("huge") == {s: sys.float_info.max for s in at}  # infinity, as MLflow's SQL store keeps it


@needs("mlflow")
@pytest.mark.slow
def test_mlflow_search_trial_is_a_nested_run(out_dir, mlflow_store):
    import mlflow

    from cadence import TrainerState
    from cadence.integrations.mlflow import MLflowCallback

    args = TrainingArguments(output_dir=out_dir, use_cpu=True)
    state = TrainerState(is_hyper_param_search=True, trial_name="trial-0", trial_params={"learning_rate": 0.1})
    mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
    with mlflow.start_run(run_name="search") as parent:
        cb = MLflowCallback()
        cb.on_train_begin(args, state, None)
        cb.on_log(args, state, None, logs={"loss": 1.5})
        cb.on_train_end(args, state, None)
        assert mlflow.active_run().info.run_id == parent.info.run_id  # the parent stays open
    child = mlflow_store.get_run(cb.run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.info.run_name == "trial-0" and child.data.params["learning_rate"] == "0.1"


@needs("mlflow")
@needs("optuna")
@pytest.mark.slow
def test_mlflow_runs_of_a_real_search_are_nested_under_the_search_run(out_dir, mlflow_store):
    """Trainer.hyperparameter_search with report_to="mlflow": each trial is its own finished child run of the
    run around the search, named after its folder, holding its own sampled learning rate and its own losses."""
    import mlflow

    rates = [0.01, 0.1]
    args = TrainingArguments(output_dir=out_dir, report_to="mlflow", logging_steps=1, max_steps=4,
                             per_device_train_batch_size=8, disable_tqdm=True, use_cpu=True, eval_strategy="steps",
                             eval_steps=4, save_strategy="no")
    trainer = Trainer(args=args, model_init=lambda trial=None: RegressionModel(), train_dataset=RegressionDataset(),
                      eval_dataset=RegressionDataset(16, seed=1))
    mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
    with mlflow.start_run(run_name="search") as parent:
        best = trainer.hyperparameter_search(
            hp_space=lambda trial: {"learning_rate": trial.suggest_float("learning_rate", *[rates[trial.number]] * 2)},
            n_trials=2, backend="optuna")
    experiment = mlflow_store.get_experiment_by_name(os.environ["MLFLOW_EXPERIMENT_NAME"])
    children = [r for r in mlflow_store.search_runs([experiment.experiment_id])
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == ["run-0", "run-1"]
    assert all(r.info.status == "FINISHED" for r in children)
    by_name = {r.info.run_name: r for r in children}
    assert [float(by_name[f"run-{i}"].data.params["learning_rate"]) for i in (0, 1)] == rates
    final = {name: run.data.metrics["eval_loss"] for name, run in by_name.items()}
    assert best.objective == pytest.approx(min(final.values()), rel=1e-6)  # mlflow stores the trials' eval losses


# ----------------------------------------------------------------------------------------- wandb


def wandb_records(path):
    """Decode a W&B offline run file (``run-<id>.wandb``) into its protobuf ``Record`` messages.

    The file is W&B's record log: a 7-byte header (":W&B", magic, version) and then LevelDB-log framing,
    32 KiB blocks of chunks (crc32, length, type: full/first/middle/last); each record a serialized
    ``wandb_internal_pb2.Record``, decoded here with W&B's own message class.
    """
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos: pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(paths):
    """(run ids, {train/global_step: {key: value}}, config keys, artifacts) over the run files."""
    ids, rows, config, artifacts = set(), {}, set(), []
    for path in paths:
        deadline = time.time() + 60  # W&B's service process may still be writing the file out after finish()
        while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path)) and time.time() < deadline:
            time.sleep(0.2)
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add((record.run.run_id, record.run.project, record.run.display_name))
                config |= {item.key for item in record.run.config.update}
            elif kind == "config":
                config |= {item.key for item in record.config.update}
            elif kind == "history":  # a key with "/" is stored as its parts
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                rows.setdefault(row["train/global_step"], {}).update(row)
            elif kind == "artifact":
                artifacts.append((record.artifact.type, record.artifact.name))
    return ids, rows, config, artifacts


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    wandb.teardown()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "cadence-test")
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield tmp_path
    import wandb

    wandb.teardown()  # W&B keeps the settings (WANDB_DIR) of its first run per process until torn down


@needs("wandb")
@pytest.mark.slow
def test_wandb_offline_run_file(out_dir, wandb_offline, monkeypatch):
    monkeypatch.setenv("WANDB_LOG_MODEL", "checkpoint")
    trainer = make_trainer(out_dir, "wandb", run_name="r1")
    trainer.train()
    (path,) = glob.glob(str(wandb_offline / "wandb" / "offline-run-*" / "run-*.wandb"))
    ids, rows, config, artifacts = wandb_history([path])
    (run_id, project, name), = ids
    assert project == "cadence-test" and name == "r1"
    assert {"learning_rate", "max_steps", "output_dir"} <= config
    assert {s: r["train/loss"] for s, r in rows.items() if "train/loss" in r} == losses(trainer.state.log_history)
    assert {s: r["eval/loss"] for s, r in rows.items() if "eval/loss" in r} == {
        h["step"]: h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h}
    assert all("train/train_runtime" not in r for r in rows.values())  # end-of-run numbers go to the summary
    assert artifacts == [("model", f"model-{run_id}")] * 2  # checkpoint-4 and checkpoint-8


@needs("wandb")
@pytest.mark.slow
def test_wandb_logs_numbers_and_leaves_out_what_it_cannot_take(out_dir, wandb_offline, caplog):
    trainer, warned = hostile_run(out_dir, "wandb", caplog)
    assert warned == {"wandb": ["obj", 5]}
    (path,) = glob.glob(str(wandb_offline / "wandb" / "offline-run-*" / "run-*.wandb"))
    _, rows, _, _ = wandb_history([path])
    assert {s: r["train/loss"] for s, r in rows.items() if "train/loss" in r} == losses(trainer.state.log_history)
    for step in HOSTILE_STEPS:
        got = {k: rows[step][f"train/{k}"] for k in ("np_float", "np_int", "tensor", "huge", "name//x", "note")}
        assert got == HOSTILE_AS_NUMBERS


@needs("wandb")
@pytest.mark.slow
def test_wandb_resume_continues_the_same_run(out_dir, wandb_offline):
    interrupted_then_resumed(out_dir, "wandb")
    paths = sorted(glob.glob(str(wandb_offline / "wandb" / "offline-run-*" / "run-*.wandb")))
    ids, rows, _, _ = wandb_history(paths)
    assert len(paths) == 2 and len({run_id for run_id, _, _ in ids}) == 1  # two sessions of one run
    assert sorted(s for s, r in rows.items() if "train/loss" in r) == list(range(1, STEPS + 1))


# ----------------------------------------------------------------------------------------- trackio


@pytest.fixture
def trackio_store(tmp_path, monkeypatch):
    trackio = pytest.importorskip("trackio")
    monkeypatch.setattr(trackio.sqlite_storage, "TRACKIO_DIR", tmp_path, raising=False)
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path))
    return trackio.SQLiteStorage


@needs("trackio")
@pytest.mark.slow
def test_trackio_local_store_and_resume(out_dir, trackio_store, tmp_path):
    unbroken = make_trainer(str(tmp_path / "unbroken"), "none")
    unbroken.train()
    first, resumed = interrupted_then_resumed(out_dir, "trackio", project="cadence-test", run_name="r1")
    assert trackio_store.get_runs("cadence-test") == ["r1"]  # the resumed run continued it
    logs = trackio_store.get_logs("cadence-test", "r1")
    loss = {}
    for row in logs:
        if "train/loss" in row:
            loss[row["step"]] = row["train/loss"]  # the resumed run's value is the later row
    assert loss == losses(unbroken.state.log_history)


@needs("trackio")
@pytest.mark.slow
def test_trackio_logs_numbers_and_leaves_out_what_it_cannot_take(out_dir, trackio_store, caplog):
    trainer, warned = hostile_run(out_dir, "trackio", caplog, project="cadence-test", run_name="r1")
    assert warned == {"trackio": ["obj", 5]}
    logs = trackio_store.get_logs("cadence-test", "r1")
    assert {r["step"]: r["train/loss"] for r in logs if "train/loss" in r} == losses(trainer.state.log_history)
    hostile = [r for r in logs if "train/note" in r]
    assert [r["step"] for r in hostile] == list(HOSTILE_STEPS)
    for row in hostile:  # Trackio itself drops tensors and ints beyond 64 bits
        got = {k: row[f"train/{k}"] for k in ("np_float", "np_int", "tensor", "huge", "name//x", "note")}
        assert got == HOSTILE_AS_NUMBERS


# ----------------------------------------------------------------------------------------- integration_utils


INTEGRATION_UTILS_NAMES = [
    "TensorBoardCallback", "MLflowCallback", "WandbCallback", "TrackioCallback", "INTEGRATION_TO_CALLBACK",
    "get_reporting_integration_callbacks", "get_available_reporting_integrations", "rewrite_logs", "default_logdir",
] + [f"is_{n}_available" for n in ("tensorboard", "mlflow", "wandb", "trackio", "comet", "clearml", "codecarbon",
                                   "dvclive", "swanlab", "kubeflow", "azureml", "dagshub", "neptune", "flytekit")]


def test_integration_utils_reexports_the_trackers():
    """``cadence.integrations.integration_utils`` re-exports the trackers under transformers' names; importing it,
    and naming a callback, imports no tracker package (a fresh interpreter shows it)."""
    import subprocess

    from cadence.integrations import integration_utils as ours
    from cadence.integrations.mlflow import MLflowCallback
    from cadence.integrations.tensorboard import TensorBoardCallback

    for name in INTEGRATION_UTILS_NAMES:
        assert hasattr(ours, name), name
    assert ours.TensorBoardCallback is TensorBoardCallback and ours.MLflowCallback is MLflowCallback
    assert ours.INTEGRATION_TO_CALLBACK["tensorboard"] is TensorBoardCallback
    assert ours.get_reporting_integration_callbacks(["jsonl", "tensorboard"])[1] is TensorBoardCallback
    assert ours.get_available_reporting_integrations() == registry.available_integrations()
    assert ours.is_tensorboard_available() is (importlib.util.find_spec("tensorboard") is not None)
    assert ours.is_neptune_available() is False  # a tracker cadence does not have is never available here
    with pytest.raises(AttributeError):
        ours.NoSuchCallback
    code = ("import sys; from cadence.integrations.integration_utils import MLflowCallback, WandbCallback, "
            "TensorBoardCallback, TrackioCallback, is_mlflow_available; is_mlflow_available(); "
            "print(sorted(m for m in ('mlflow', 'wandb', 'tensorboard', 'trackio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == "[]"


@pytest.mark.slow  # importing transformers' integrations
def test_integration_utils_names_are_transformers_names():
    import transformers.integrations.integration_utils as hf

    from cadence.integrations import integration_utils as ours

    for name in INTEGRATION_UTILS_NAMES:
        assert hasattr(hf, name), name
    assert ours.rewrite_logs({"eval_loss": 1.0, "loss": 2.0}) == hf.rewrite_logs({"eval_loss": 1.0, "loss": 2.0})


def test_checkpoints_keep_a_log_json_cannot_write_as_it_is(out_dir):
    """trainer_state.json holds a log with numpy scalars, a tensor, an object and an int key (transformers' json.dumps
    raises at the next checkpoint): numbers as numbers, the rest as text, and resume reads it back."""
    from pathlib import Path

    import numpy as np
    import torch

    from cadence import TrainerState

    class LogOdd(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                trainer.log({"np_float": np.float32(0.5), "tensor": torch.tensor([1.5]), "obj": object(), 5: 1.0})

    trainer = make_trainer(out_dir, "none", callbacks=[LogOdd()], save_strategy="steps")
    trainer.train()
    state_file = Path(out_dir, f"checkpoint-{SAVE}", "trainer_state.json")
    saved = json.loads(state_file.read_text())
    row = next(r for r in saved["log_history"] if "np_float" in r)
    assert row["np_float"] == 0.5 and row["tensor"] == 1.5 and row["5"] == 1.0
    assert row["obj"].startswith("<object object at")
    assert TrainerState.load_from_json(str(state_file)).global_step == SAVE


@needs("wandb")
@pytest.mark.slow
def test_wandb_uploads_no_final_model_when_training_was_interrupted(out_dir, wandb_offline, monkeypatch):
    import signal

    from test_crash import Signal

    monkeypatch.setenv("WANDB_LOG_MODEL", "end")
    trainer = make_trainer(out_dir, "wandb", callbacks=[Signal(2, signal.SIGUSR1)], save_strategy="no",
                           enable_jit_checkpoint=True)
    trainer.train()
    assert trainer.state.interrupted and trainer.state.global_step == 2
    (path,) = glob.glob(str(wandb_offline / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert wandb_history([path])[3] == []  # the finished run below does upload: the reader sees artifacts
    wandb_offline_dir = wandb_offline / "wandb"
    for run in wandb_offline_dir.glob("offline-run-*"):
        run.rename(run.with_name("done-" + run.name))
    make_trainer(out_dir + "-full", "wandb", save_strategy="no").train()
    (path,) = glob.glob(str(wandb_offline_dir / "offline-run-*" / "run-*.wandb"))
    assert [kind for kind, _ in wandb_history([path])[3]] == ["model"]
