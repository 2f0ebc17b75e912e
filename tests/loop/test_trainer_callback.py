"""cadence.trainer_callback against transformers.trainer_callback (the reference)."""

from __future__ import annotations

import dataclasses
import json
import logging
from types import SimpleNamespace

import pytest

import cadence.trainer_callback as tc
from cadence.trainer_callback import (
    CallbackHandler,
    DefaultFlowCallback,
    EarlyStoppingCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)

hf = pytest.importorskip("transformers.trainer_callback")


# ------------------------------------------------------------------------------ TrainerState


def _filled_state(cls, callbacks=None):
    return cls(
        epoch=1.5, global_step=30, max_steps=40, logging_steps=5, eval_steps=10, save_steps=20,
        train_batch_size=8, num_train_epochs=2, num_input_tokens_seen=1234, total_flos=5.5e12,
        log_history=[{"loss": 0.5, "step": 5}, {"eval_loss": 0.25, "step": 10}],
        best_metric=0.25, best_global_step=10, best_model_checkpoint="out/checkpoint-10",
        is_hyper_param_search=False, trial_name="t0", trial_params={"lr": 0.1},
        stateful_callbacks=callbacks,
    )


def test_state_fields_and_defaults_equal_hf():
    ours = {f.name: f.default for f in dataclasses.fields(TrainerState)}
    theirs = {f.name: f.default for f in dataclasses.fields(hf.TrainerState)}
    assert ours == theirs
    assert dataclasses.asdict(TrainerState()) == dataclasses.asdict(hf.TrainerState())


def test_state_json_round_trip_and_same_bytes_as_hf(tmp_path):
    ours = _filled_state(TrainerState, [EarlyStoppingCallback(3, 0.1), TrainerControl(should_save=True)])
    theirs = _filled_state(hf.TrainerState, [hf.EarlyStoppingCallback(3, 0.1), hf.TrainerControl(should_save=True)])
    ours.save_to_json(tmp_path / "ours.json")
    theirs.save_to_json(tmp_path / "theirs.json")
    assert (tmp_path / "ours.json").read_bytes() == (tmp_path / "theirs.json").read_bytes()
    assert TrainerState.load_from_json(tmp_path / "ours.json") == ours


def test_state_files_load_across_libraries(tmp_path):
    _filled_state(TrainerState, [EarlyStoppingCallback(2)]).save_to_json(tmp_path / "ours.json")
    _filled_state(hf.TrainerState, [hf.EarlyStoppingCallback(2)]).save_to_json(tmp_path / "theirs.json")
    # HF reads a state as TrainerState(**json): any extra key written by cadence would fail here.
    hf_loaded = hf.TrainerState(**json.loads((tmp_path / "ours.json").read_text()))
    ours_loaded = TrainerState.load_from_json(tmp_path / "theirs.json")
    assert dataclasses.asdict(hf_loaded) == dataclasses.asdict(ours_loaded)
    assert ours_loaded.stateful_callbacks["EarlyStoppingCallback"]["args"]["early_stopping_patience"] == 2


def test_unknown_key_is_ignored_with_debug_log(tmp_path, caplog):
    data = dataclasses.asdict(_filled_state(TrainerState))
    data["from_the_future"] = 1
    (tmp_path / "s.json").write_text(json.dumps(data))
    with caplog.at_level(logging.DEBUG, logger="cadence.trainer_state"):  # the state's own module
        loaded = TrainerState.load_from_json(tmp_path / "s.json")
    assert loaded == _filled_state(TrainerState)
    assert "from_the_future" in caplog.text


def test_several_callbacks_of_one_class_are_stored_as_a_list():
    cbs = [EarlyStoppingCallback(1), EarlyStoppingCallback(2), EarlyStoppingCallback(3)]
    hf_cbs = [hf.EarlyStoppingCallback(1), hf.EarlyStoppingCallback(2), hf.EarlyStoppingCallback(3)]
    assert TrainerState(stateful_callbacks=cbs).stateful_callbacks == hf.TrainerState(
        stateful_callbacks=hf_cbs
    ).stateful_callbacks
    with pytest.raises(TypeError):
        TrainerState(stateful_callbacks=[object()])


@pytest.mark.parametrize(
    "steps, max_steps",
    [((500, 500, 500), 95), ((0.1, 0.25, 0.5), 95), ((0.33, None, 7), 10), ((1, 0.999, 0.01), 7)],
)
def test_compute_steps_equals_hf(steps, max_steps):
    args = SimpleNamespace(logging_steps=steps[0], eval_steps=steps[1], save_steps=steps[2])
    ours, theirs = TrainerState(eval_steps=17), hf.TrainerState(eval_steps=17)
    ours.compute_steps(args, max_steps)
    theirs.compute_steps(args, max_steps)
    assert (ours.logging_steps, ours.eval_steps, ours.save_steps) == (
        theirs.logging_steps, theirs.eval_steps, theirs.save_steps,
    )


def test_compute_steps_ratio_rounds_up():
    state = TrainerState()
    state.compute_steps(SimpleNamespace(logging_steps=0.1, eval_steps=None, save_steps=0.33), 95)
    assert (state.logging_steps, state.eval_steps, state.save_steps) == (10, 500, 32)


def test_init_training_references():
    trainer = SimpleNamespace(
        hp_name=lambda trial: f"run-{trial['lr']}", _trial={"lr": 0.5},
        is_local_process_zero=lambda: True, is_world_process_zero=lambda: False,
    )
    state = TrainerState()
    state.init_training_references(trainer, max_steps=12, num_train_epochs=3, trial={"lr": 0.5})
    assert (state.trial_name, state.trial_params, state.max_steps, state.num_train_epochs) == (
        "run-0.5", {"lr": 0.5}, 12, 3,
    )
    assert (state.is_local_process_zero, state.is_world_process_zero) == (True, False)


# ---------------------------------------------------------------------------- TrainerControl


def test_control_resets_and_state_round_trip():
    c = TrainerControl(True, True, True, True, True)
    assert TrainerControl.from_state(c.state()) == c
    assert c.state() == hf.TrainerControl(True, True, True, True, True).state()
    c._new_step()
    assert (c.should_save, c.should_evaluate, c.should_log) == (False, False, False)
    c._new_epoch()
    assert not c.should_epoch_stop and c.should_training_stop
    c._new_training()
    assert c == TrainerControl()


def test_callback_has_every_hf_event():
    hf_events = {n for n in dir(hf.TrainerCallback) if n.startswith("on_")}
    ours = {n for n in dir(TrainerCallback) if n.startswith("on_")}
    assert ours == hf_events
    cb, args, state, control = TrainerCallback(), SimpleNamespace(), TrainerState(), TrainerControl()
    assert all(getattr(cb, e)(args, state, control, metrics={}) is None for e in ours)


# ---------------------------------------------------------------------- DefaultFlowCallback


def _flow_args(**overrides):
    args = dict(
        logging_strategy="steps", logging_steps=5, logging_first_step=False,
        eval_strategy="no", eval_steps=None, eval_delay=0,
        save_strategy="no", save_steps=500, eval_on_start=False,
    )
    args.update(overrides)
    return SimpleNamespace(**args)


def _drive_flow(lib, args, max_steps, steps_per_epoch):
    """Run the control flow of a training loop (no model); record the switches after each event."""
    state, control = lib.TrainerState(), lib.TrainerControl()
    state.compute_steps(args, max_steps)
    state.max_steps = max_steps
    handler = lib.CallbackHandler([lib.DefaultFlowCallback], None, None, None, None)
    record = []

    def act(where):
        nonlocal control
        record.append((where, state.global_step, control.should_log, control.should_evaluate,
                       control.should_save, control.should_training_stop))
        if control.should_log:
            control = handler.on_log(args, state, control, logs={})
        if control.should_evaluate:
            control = handler.on_evaluate(args, state, control, metrics={})
        if control.should_save:
            control = handler.on_save(args, state, control)

    control = handler.on_train_begin(args, state, control)
    epoch = 0
    while not control.should_training_stop:
        control = handler.on_epoch_begin(args, state, control)
        for i in range(steps_per_epoch):
            control = handler.on_step_begin(args, state, control)
            state.global_step += 1
            state.epoch = epoch + (i + 1) / steps_per_epoch
            control = handler.on_step_end(args, state, control)
            act("step")
            if control.should_training_stop:
                break
        epoch += 1
        control = handler.on_epoch_end(args, state, control)
        act("epoch")
    return record


FLOW_CASES = {
    "log_steps_first": (_flow_args(logging_first_step=True), 20, 10),
    "eval_save_steps": (_flow_args(eval_strategy="steps", eval_steps=4, save_strategy="steps", save_steps=6), 20, 10),
    "eval_delay_uneven_end": (
        _flow_args(eval_strategy="steps", eval_steps=4, eval_delay=10, save_strategy="steps", save_steps=7), 19, 10,
    ),
    "epoch_strategies_delay": (
        _flow_args(logging_strategy="epoch", eval_strategy="epoch", eval_delay=2, save_strategy="epoch"), 15, 5,
    ),
    "ratios": (_flow_args(logging_steps=0.1, eval_strategy="steps", eval_steps=0.25, save_strategy="steps",
                          save_steps=0.5), 20, 7),
    "save_steps_zero_best": (_flow_args(logging_strategy="no", save_strategy="steps", save_steps=0), 9, 4),
    "save_best_no_eval": (_flow_args(logging_strategy="no", save_strategy="best"), 6, 3),
}


@pytest.mark.parametrize("case", sorted(FLOW_CASES))
def test_default_flow_equals_hf_step_by_step(case):
    args, max_steps, steps_per_epoch = FLOW_CASES[case]
    ours = _drive_flow(tc, args, max_steps, steps_per_epoch)
    theirs = _drive_flow(hf, args, max_steps, steps_per_epoch)
    assert ours == theirs


def _steps_where(record, column):
    return [r[1] for r in record if r[column]]


def test_default_flow_real_schedule():
    rec = _drive_flow(tc, *FLOW_CASES["log_steps_first"])
    assert _steps_where(rec, 2) == [1, 5, 10, 15, 20]  # logs
    rec = _drive_flow(tc, *FLOW_CASES["eval_delay_uneven_end"])
    assert _steps_where(rec, 3) == [12, 16, 19]  # evaluates after the delay, and at the end
    assert _steps_where(rec, 4) == [7, 14, 19]  # saves on the interval and at the end
    assert _steps_where(rec, 5) == [19, 19]  # stops at max_steps (step, then epoch end)
    rec = _drive_flow(tc, *FLOW_CASES["epoch_strategies_delay"])
    assert [r[0] for r in rec if r[3]] == ["epoch", "epoch"]  # epochs 2 and 3, not 1 (delay 2)


def test_default_flow_accepts_enum_strategies():
    import enum

    class Strategy(enum.Enum):  # a plain (non-str) enum still compares by value
        STEPS = "steps"
        NO = "no"

    args = _flow_args(logging_strategy=Strategy.STEPS, eval_strategy=Strategy.NO, save_strategy=Strategy.NO)
    state, control = TrainerState(global_step=5, max_steps=10, logging_steps=5), TrainerControl()
    DefaultFlowCallback().on_step_end(args, state, control)
    assert control.should_log and not control.should_evaluate


# -------------------------------------------------------------------------- CallbackHandler


class Recorder(TrainerCallback):
    def __init__(self, tag="r", calls=None):
        self.tag, self.calls = tag, calls if calls is not None else []

    def on_step_end(self, args, state, control, **kwargs):
        self.calls.append((self.tag, "on_step_end", sorted(kwargs)))

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.calls.append((self.tag, "on_log", logs))


class Other(TrainerCallback):
    pass


def _handler(callbacks):
    return CallbackHandler(callbacks, "model", "tok", "opt", "sched")


def test_handler_calls_in_order_with_kwargs():
    calls = []
    h = _handler([DefaultFlowCallback, Recorder("a", calls), Recorder("b", calls)])
    args, state, control = _flow_args(), TrainerState(global_step=5, max_steps=10, logging_steps=5), TrainerControl()
    control = h.on_step_end(args, state, control)
    assert control.should_log  # DefaultFlowCallback ran first
    control = h.on_log(args, state, control, logs={"loss": 1.0})
    assert not control.should_log  # the handler resets the switch it dispatches
    expected_kwargs = ["eval_dataloader", "lr_scheduler", "model", "optimizer", "processing_class", "train_dataloader"]
    assert calls == [
        ("a", "on_step_end", expected_kwargs), ("b", "on_step_end", expected_kwargs),
        ("a", "on_log", {"loss": 1.0}), ("b", "on_log", {"loss": 1.0}),
    ]


def test_call_event_and_duck_typed_callbacks():
    calls = []

    class Duck:  # not a TrainerCallback: events it lacks are skipped
        def on_log(self, args, state, control, logs=None, model=None, **kwargs):
            calls.append((logs, model))

    h = _handler([Duck()])
    control = TrainerControl()
    assert h.call_event("on_log", None, TrainerState(), control, logs={"a": 1}) is control
    assert h.call_event("on_step_end", None, TrainerState(), control) is control
    assert calls == [({"a": 1}, "model")]


def test_handler_passes_current_objects():
    seen = {}

    class Peek(TrainerCallback):
        def on_epoch_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
            seen.update(model=model, train_dataloader=train_dataloader)

    h = _handler([Peek()])
    h.model, h.train_dataloader = "new model", [1, 2]
    h.on_epoch_begin(None, TrainerState(), TrainerControl())
    assert seen == {"model": "new model", "train_dataloader": [1, 2]}
    assert h.model == "new model" and h.optimizer == "opt"


def test_handler_sees_callbacks_added_later_and_instance_overrides():
    calls = []
    h = _handler([DefaultFlowCallback])
    other = Other()
    h.on_log(None, TrainerState(), TrainerControl(), logs={})  # builds the dispatch cache
    other.on_log = lambda args, state, control, **kw: calls.append("instance")
    h.add_callback(other)
    h.callbacks.append(Recorder("late", calls))  # mutated in place, not via add_callback
    h.on_log(None, TrainerState(), TrainerControl(), logs={"x": 1})
    assert calls == ["instance", ("late", "on_log", {"x": 1})]


def test_handler_calls_events_served_by_getattribute():
    class Spy(TrainerCallback):  # answers every event through __getattribute__ (as tests/loop/test_events.py does)
        def __init__(self):
            self.seen = []

        def __getattribute__(self, name):
            if name.startswith("on_"):
                return lambda *a, **k: self.seen.append(name)
            return super().__getattribute__(name)

    spy = Spy()
    h = _handler([spy])
    h.on_step_begin(None, TrainerState(), TrainerControl())
    h.on_substep_end(None, TrainerState(), TrainerControl())
    assert spy.seen == ["on_step_begin", "on_substep_end"]


def test_add_pop_remove(caplog):
    a, b = Recorder("a"), Recorder("b")
    h = _handler([DefaultFlowCallback, a, Other])
    with caplog.at_level(logging.WARNING, logger="cadence.trainer_callback"):
        h.add_callback(b)
    assert "already one" in caplog.text
    assert h.callback_list == "DefaultFlowCallback\nRecorder\nOther\nRecorder"
    assert h.pop_callback(Recorder) is a  # by class: the first instance
    assert h.pop_callback(b) is b  # by instance
    assert h.pop_callback(Recorder) is None
    h.remove_callback(Other)
    h.remove_callback(Other)  # by class: absent is fine
    assert [type(c) for c in h.callbacks] == [DefaultFlowCallback]
    with pytest.raises(ValueError):
        h.remove_callback(a)  # by instance: absent is an error, as list.remove
    h.remove_callback(h.callbacks[0])
    assert h.callbacks == []


def test_warns_without_default_flow(caplog):
    with caplog.at_level(logging.WARNING, logger="cadence.trainer_callback"):
        _handler([Other])
    assert "DefaultFlowCallback" in caplog.text


def test_returned_control_replaces_control():
    replacement = TrainerControl(should_training_stop=True)
    received = []

    class Replace(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            return replacement

    class Check(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            received.append(control)  # returns None: keeps what it got

    original = TrainerControl()
    out = _handler([Replace(), Check()]).on_step_end(None, TrainerState(), original)
    assert out is replacement and received == [replacement]
    assert _handler([Check()]).on_step_end(None, TrainerState(), original) is original


def test_callback_error_names_callback_and_event():
    class MyCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise ValueError("boom")

    h = _handler([DefaultFlowCallback, MyCallback()])
    with pytest.raises(ValueError) as info:  # the callback's own exception, as transformers lets it through
        h.on_step_end(_flow_args(), TrainerState(global_step=1, max_steps=5), TrainerControl())
    assert str(info.value) == "boom"
    assert info.value.__notes__ == ["raised by callback MyCallback in on_step_end"]


# -------------------------------------------------------------------- EarlyStoppingCallback


def _es_args(**overrides):
    args = dict(metric_for_best_model="loss", greater_is_better=False, load_best_model_at_end=True,
                eval_strategy="steps")
    args.update(overrides)
    return SimpleNamespace(**args)


def _stop_index(lib, callback, args, values):
    """Index of the evaluation after which training stops (None if never)."""
    state, control = lib.TrainerState(), lib.TrainerControl()
    callback.on_train_begin(args, state, control)
    key = args.metric_for_best_model if args.metric_for_best_model.startswith("eval_") else (
        f"eval_{args.metric_for_best_model}")
    for i, value in enumerate(values):
        callback.on_evaluate(args, state, control, metrics={key: value})
        # The Trainer updates best_metric after on_evaluate (no threshold there).
        better = (lambda a, b: a > b) if args.greater_is_better else (lambda a, b: a < b)
        if state.best_metric is None or better(value, state.best_metric):
            state.best_metric = value
        if control.should_training_stop:
            return i
    return None


LOSSES = [1.0, 0.9, 0.95, 0.89, 0.91, 0.92, 0.93, 0.5]


@pytest.mark.parametrize(
    "patience, threshold, greater, values, expected",
    [
        (2, 0.0, False, LOSSES, 5),
        (2, 0.02, False, LOSSES, 3),
        (1, 0.0, False, LOSSES, 2),
        (4, 0.0, False, LOSSES, None),
        (1, 0.25, False, [1.0, 0.5, 0.25], 2),  # an improvement of exactly the threshold does not count
        (2, 0.0, True, [0.1, 0.2, 0.2, 0.3, 0.25, 0.3], 5),
    ],
)
def test_early_stopping_equals_hf(patience, threshold, greater, values, expected):
    args = _es_args(greater_is_better=greater, metric_for_best_model="eval_acc" if greater else "loss")
    ours = _stop_index(tc,
                       EarlyStoppingCallback(patience, threshold), args, values)
    theirs = _stop_index(hf, hf.EarlyStoppingCallback(patience, threshold), args, values)
    assert ours == theirs == expected


def test_early_stopping_patience_survives_state_round_trip(tmp_path):
    cb = EarlyStoppingCallback(3, 0.01)
    args, state, control = _es_args(), TrainerState(best_metric=0.5), TrainerControl()
    for value in (0.6, 0.7):
        cb.on_evaluate(args, state, control, metrics={"eval_loss": value})
    assert cb.early_stopping_patience_counter == 2
    TrainerState(stateful_callbacks=[cb]).save_to_json(tmp_path / "s.json")
    saved = TrainerState.load_from_json(tmp_path / "s.json").stateful_callbacks["EarlyStoppingCallback"]
    restored = EarlyStoppingCallback.from_state(saved)
    assert (restored.early_stopping_patience, restored.early_stopping_threshold,
            restored.early_stopping_patience_counter) == (3, 0.01, 2)
    restored.on_evaluate(args, state, control, metrics={"eval_loss": 0.8})
    assert control.should_training_stop  # the third miss in a row, counted across the "resume"


def test_early_stopping_missing_metric_is_not_counted(caplog):
    cb, control = EarlyStoppingCallback(1), TrainerControl()
    with caplog.at_level(logging.WARNING, logger="cadence.trainer_callback"):
        cb.on_evaluate(_es_args(), TrainerState(best_metric=0.1), control, metrics={"eval_other": 9.0})
    assert cb.early_stopping_patience_counter == 0 and not control.should_training_stop
    assert "eval_loss" in caplog.text


@pytest.mark.parametrize(
    "overrides, message",
    [({"metric_for_best_model": None}, "metric_for_best_model"), ({"eval_strategy": "no"}, "eval_strategy")],
)
def test_early_stopping_requirements(overrides, message):
    with pytest.raises(ValueError, match=message):
        EarlyStoppingCallback().on_train_begin(_es_args(**overrides), TrainerState(), TrainerControl())
    h = _handler([DefaultFlowCallback, EarlyStoppingCallback()])
    with pytest.raises(ValueError, match=message) as info:
        h.on_train_begin(_es_args(**overrides), TrainerState(), TrainerControl())
    assert info.value.__notes__ == ["raised by callback EarlyStoppingCallback in on_train_begin"]


# ------------------------------------------------------------------ Progress / Printer


LOGS = {"loss": 0.123456789, "learning_rate": 1e-05, "total_flos": 3.0e12, "note": "x" * 30, "step": 5}


def _fake_run(lib, callback, world_zero=True):
    args = SimpleNamespace(disable_tqdm=False)
    state, control = lib.TrainerState(max_steps=5, is_world_process_zero=world_zero), lib.TrainerControl()
    callback.on_train_begin(args, state, control)
    for step in range(1, 6):
        state.global_step = step
        callback.on_step_end(args, state, control)
        if step == 3:
            for _ in range(3):
                callback.on_prediction_step(args, state, control, eval_dataloader=[0, 1, 2])
            callback.on_log(args, state, control, logs={"eval_loss": 0.5})
            callback.on_evaluate(args, state, control, metrics={"eval_loss": 0.5})
    callback.on_log(args, state, control, logs=dict(LOGS))
    callback.on_train_end(args, state, control)
    return callback


def test_progress_callback_writes_logs_like_hf(capsys):
    cb = _fake_run(tc, ProgressCallback(max_str_len=10))
    ours = capsys.readouterr()
    _fake_run(hf, hf.ProgressCallback(max_str_len=10))
    theirs = capsys.readouterr()
    assert ours.out == theirs.out
    assert ours.out.splitlines()[0] == "{'eval_loss': '0.5'}"
    assert "'loss': '0.1235'" in ours.out and "total_flos" not in ours.out
    assert "String too long to display, length: 30 > 10" in ours.out
    assert "5/5" in ours.err  # the bar reached max_steps
    assert cb.training_bar is None and cb.prediction_bar is None


def test_progress_callback_silent_off_main_process(capsys):
    _fake_run(tc, ProgressCallback(), world_zero=False)
    assert capsys.readouterr() == ("", "")


def test_printer_callback_prints_like_hf(capsys):
    args, state, control = SimpleNamespace(), TrainerState(), TrainerControl()
    logs = dict(LOGS)
    PrinterCallback().on_log(args, state, control, logs=logs)
    ours = capsys.readouterr().out
    hf.PrinterCallback().on_log(args, hf.TrainerState(), hf.TrainerControl(), logs=dict(LOGS))
    assert ours == capsys.readouterr().out
    assert "'loss': '0.1235'" in ours and logs == LOGS  # the caller's dict is left intact
    PrinterCallback().on_log(args, TrainerState(is_local_process_zero=False), control, logs=dict(LOGS))
    assert capsys.readouterr().out == ""
