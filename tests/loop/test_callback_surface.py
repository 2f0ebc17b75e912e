"""The callback surface code written for transformers reads (issue 19, items 4 and 5): ``DEFAULT_CALLBACKS``,
the callbacks a Trainer starts with, the formatted warnings (duplicate callback, a checkpoint's callback this
run lacks), ``TrainerControl`` restored on resume, and ``cadence.trainer_jit_checkpoint`` as transformers 5.x
has it. Several tests are transformers' own (tests/trainer/test_trainer_callback.py,
test_trainer_jit_checkpoint.py), ported with the imports switched; where cadence differs on purpose the test
says so."""

from __future__ import annotations

import os
import signal
from unittest.mock import Mock, patch

import pytest

import cadence
from cadence import EarlyStoppingCallback, Trainer, TrainerCallback
from cadence.trainer_callback import PrinterCallback, ProgressCallback, TrainerState
from cadence.trainer_jit_checkpoint import CheckpointManager, JITCheckpointCallback
from tiny import RegressionDataset, RegressionModel, make_args

hf_trainer = pytest.importorskip("transformers.trainer")


def names(callbacks):
    return sorted(cb.__name__ if isinstance(cb, type) else type(cb).__name__ for cb in callbacks)


def trainer_for(out, lib=cadence, callbacks=None, **overrides):
    overrides.setdefault("disable_tqdm", False)
    args = make_args(out, lib, **overrides)
    return lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64),
                       eval_dataset=RegressionDataset(64), callbacks=callbacks)


class Recorder(TrainerCallback):
    pass


# ------------------------------------------------------------------------------ the callbacks a Trainer starts with


@pytest.mark.parametrize("disable_tqdm", [False, True])
def test_default_callbacks_as_transformers(tmp_path, disable_tqdm):
    from cadence.trainer import DEFAULT_CALLBACKS, DEFAULT_PROGRESS_CALLBACK

    assert names(DEFAULT_CALLBACKS) == names(hf_trainer.DEFAULT_CALLBACKS) == ["DefaultFlowCallback"]
    assert DEFAULT_PROGRESS_CALLBACK is ProgressCallback
    ours = trainer_for(tmp_path / "a", callbacks=[Recorder], disable_tqdm=disable_tqdm)
    import transformers

    theirs = trainer_for(tmp_path / "b", transformers, callbacks=[Recorder], disable_tqdm=disable_tqdm)
    bar = PrinterCallback if disable_tqdm else ProgressCallback
    assert names(ours.callback_handler.callbacks) == names(DEFAULT_CALLBACKS + [bar, Recorder])
    assert names(ours.callback_handler.callbacks) == names(theirs.callback_handler.callbacks)
    assert [type(cb).__name__ for cb in ours.callback_handler.callbacks] == [
        type(cb).__name__ for cb in theirs.callback_handler.callbacks]  # same order too


def test_duplicate_callback_warning_names_the_class(tmp_path):
    # transformers' test: the message handed to logger.warning is already formatted
    with patch("cadence.trainer_callback.logger.warning") as warn_mock:
        trainer_for(tmp_path, callbacks=[Recorder, Recorder])
    assert warn_mock.called
    assert "Recorder" in warn_mock.call_args[0][0] and "already one" in warn_mock.call_args[0][0]


# ------------------------------------------------------------------------------ stateful callbacks and the control


def run_to_checkpoint_2(out, callbacks=None, resume=None, **kw):
    trainer = trainer_for(out, callbacks=callbacks, load_best_model_at_end=True, save_strategy="steps",
                          eval_strategy="steps", save_steps=2, eval_steps=2, max_steps=2, **kw)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_missing_stateful_callback_warning_names_it(tmp_path):
    """transformers' test: resumed without the EarlyStoppingCallback the checkpoint holds, the Trainer's
    logger warns with the class name in the (formatted) message."""
    run_to_checkpoint_2(tmp_path, callbacks=[EarlyStoppingCallback()])
    resumed = trainer_for(tmp_path, save_strategy="steps", eval_strategy="steps", save_steps=2, eval_steps=2,
                          max_steps=2, restore_callback_states_from_checkpoint=True)
    with patch("cadence.trainer.logger.warning") as warn_mock:
        resumed.train(resume_from_checkpoint=os.path.join(tmp_path, "checkpoint-2"))
    messages = [c[0][0] for c in warn_mock.call_args_list]
    assert any("EarlyStoppingCallback" in m and "does not use" in m for m in messages), messages


def test_no_warning_when_restoring_is_off(tmp_path):
    run_to_checkpoint_2(tmp_path, callbacks=[EarlyStoppingCallback()])
    resumed = trainer_for(tmp_path, save_strategy="steps", eval_strategy="steps", save_steps=2, eval_steps=2,
                          max_steps=2)
    with patch("cadence.trainer.logger.warning") as warn_mock:
        resumed.train(resume_from_checkpoint=os.path.join(tmp_path, "checkpoint-2"))
    assert not any("EarlyStoppingCallback" in c[0][0] for c in warn_mock.call_args_list)


def test_stateful_callbacks_restored_in_order(tmp_path):
    """transformers' tests: EarlyStoppingCallback's arguments, and two of one class each its own."""
    run_to_checkpoint_2(tmp_path, callbacks=[Recorder(), EarlyStoppingCallback(5, 0.2), EarlyStoppingCallback(7, 0.5)])
    trainer = run_to_checkpoint_2(tmp_path, callbacks=[EarlyStoppingCallback(), Recorder(), EarlyStoppingCallback()],
                                  resume=os.path.join(tmp_path, "checkpoint-2"), restore_callback_states_from_checkpoint=True)
    restored = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, EarlyStoppingCallback)]
    assert [(cb.early_stopping_patience, cb.early_stopping_threshold) for cb in restored] == [(5, 0.2), (7, 0.5)]


class ArgsOnly(TrainerCallback):
    """A stateful callback whose ``state()`` holds ``args`` only (transformers' test callback does this)."""

    def __init__(self, tag="default"):
        self.tag = tag

    def state(self):
        return {"args": {"tag": self.tag}}


def restored_order(out, lib):
    """The callbacks (class name, tag or patience) after resuming with two stateful callbacks listed first."""
    import transformers

    exportable = type("ArgsOnly", (ArgsOnly, lib.trainer_callback.ExportableState if lib is transformers
                                   else cadence.trainer_callback.ExportableState), {})
    first = [exportable("first"), lib.EarlyStoppingCallback(5, 0.2)]
    kw = dict(load_best_model_at_end=True, save_strategy="steps", eval_strategy="steps", save_steps=2, eval_steps=2,
              max_steps=2)
    trainer_for(out, lib, callbacks=first, **kw).train()
    resumed = trainer_for(out, lib, callbacks=[lib.EarlyStoppingCallback(), exportable()],
                          restore_callback_states_from_checkpoint=True, **kw)
    resumed.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))
    return [(type(cb).__name__, getattr(cb, "tag", getattr(cb, "early_stopping_patience", None)))
            for cb in resumed.callback_handler.callbacks]


def test_restored_callbacks_as_transformers(tmp_path):
    """transformers' tests (test_stateful_mixed_callbacks, test_stateful_duplicate_callbacks): a callback whose
    ``state()`` has no ``attributes`` is restored, and the restored callbacks end the list, in transformers' order."""
    import transformers

    ours, theirs = restored_order(str(tmp_path / "a"), cadence), restored_order(str(tmp_path / "b"), transformers)
    assert ours == theirs
    assert ours[-2:] == [("ArgsOnly", "first"), ("EarlyStoppingCallback", 5)]


@pytest.mark.parametrize("lib_name", ["cadence", "transformers"])
def test_trainer_control_state_restored_as_transformers(tmp_path, lib_name):
    """transformers' test, run on both: the checkpoint of the last step holds should_training_stop=True, and
    ``_load_callback_state`` gives the Trainer that control."""
    import importlib

    lib = importlib.import_module(lib_name)
    trainer_for(tmp_path, lib, max_steps=2, save_strategy="steps", save_steps=2).train()
    trainer = trainer_for(tmp_path, lib, max_steps=2, restore_callback_states_from_checkpoint=True)
    assert not trainer.control.should_training_stop
    checkpoint = os.path.join(tmp_path, "checkpoint-2")
    trainer.state = lib.TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
    trainer._load_callback_state()
    assert trainer.control.should_training_stop


@pytest.mark.parametrize("lib_name", ["cadence", "transformers"])
def test_a_restored_stop_request_does_not_stop_the_resumed_run(tmp_path, lib_name):
    """The last step's checkpoint holds should_training_stop=True; restored, it is reset when training begins
    (as transformers' handler does), so a longer resumed run trains on."""
    import importlib

    lib = importlib.import_module(lib_name)
    trainer_for(tmp_path, lib, max_steps=2, save_strategy="steps", save_steps=2).train()
    resumed = trainer_for(tmp_path, lib, max_steps=4, save_strategy="no", restore_callback_states_from_checkpoint=True)
    assert resumed.train(resume_from_checkpoint=os.path.join(tmp_path, "checkpoint-2")).global_step == 4


# ------------------------------------------------------------------------------ cadence.trainer_jit_checkpoint


@pytest.fixture
def sigterm_kept():
    """Every test here gives SIGTERM's handler back as it found it."""
    before = signal.getsignal(signal.SIGTERM)
    yield before
    signal.signal(signal.SIGTERM, before)


def jit_trainer(out, enable_jit=True, **kw):
    args = make_args(out, enable_jit_checkpoint=enable_jit, per_device_train_batch_size=16, learning_rate=0.1,
                     logging_steps=1, max_steps=10, save_steps=10, **kw)
    return Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64))


def test_checkpoint_manager_attributes(tmp_path, sigterm_kept):
    trainer = jit_trainer(tmp_path)
    manager = CheckpointManager(trainer)
    assert manager.trainer is trainer and manager.kill_wait == 3 and not manager.is_checkpoint_requested
    assert CheckpointManager(trainer, kill_wait=5).kill_wait == 5
    manager.setup_signal_handler()
    assert signal.getsignal(signal.SIGTERM) == manager._sigterm_handler
    assert manager._original_sigterm_handler is not None


@patch("threading.Timer")
def test_sigterm_requests_a_checkpoint_after_kill_wait(mock_timer, tmp_path, sigterm_kept):
    manager = CheckpointManager(jit_trainer(tmp_path), kill_wait=2)
    manager._sigterm_handler(signal.SIGTERM, None)
    assert not manager.is_checkpoint_requested  # only after the wait
    mock_timer.assert_called_once_with(2, manager._enable_checkpoint)
    mock_timer.return_value.start.assert_called_once()
    manager._enable_checkpoint()
    assert manager.is_checkpoint_requested and manager.checkpoint_requested and manager.should_checkpoint_now()
    mock_timer.reset_mock()
    manager._sigterm_handler(signal.SIGTERM, None)  # a second SIGTERM: already requested
    mock_timer.assert_not_called()
    assert manager._toggle_checkpoint_flag == manager._enable_checkpoint  # the earlier 5.x spelling


def test_execute_jit_checkpoint_saves_through_save_checkpoint(tmp_path, sigterm_kept):
    trainer = jit_trainer(tmp_path)
    manager = CheckpointManager(trainer)
    trainer._save_checkpoint = Mock()
    trainer.state.global_step = 42
    manager.is_checkpoint_requested = True
    manager.execute_jit_checkpoint()
    trainer._save_checkpoint.assert_called_once_with(trainer.model, trial=None)
    assert not manager.is_checkpoint_requested
    assert not os.path.exists(os.path.join(tmp_path, "checkpoint-42"))  # the save was mocked: nothing half-made
    trainer._save_checkpoint = Mock(side_effect=Exception("Checkpoint failed"))
    manager.is_checkpoint_requested = True
    with pytest.raises(Exception, match="Checkpoint failed"):
        manager.execute_jit_checkpoint()
    assert not manager.is_checkpoint_requested  # reset before the save: no second attempt


def test_jit_callback_set_trainer(tmp_path, sigterm_kept):
    callback = JITCheckpointCallback()
    assert callback.trainer is None and callback.jit_manager is None
    trainer = jit_trainer(tmp_path / "on")
    with patch.object(CheckpointManager, "setup_signal_handler") as mock_setup:
        callback.set_trainer(trainer)
    assert callback.trainer is trainer and isinstance(callback.jit_manager, CheckpointManager)
    mock_setup.assert_called_once()
    off = JITCheckpointCallback()
    off.set_trainer(jit_trainer(tmp_path / "off", enable_jit=False))
    assert off.trainer is not None and off.jit_manager is None
    jit = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, JITCheckpointCallback)]
    assert len(jit) == 1 and jit[0].trainer is trainer and jit[0].jit_manager is not None  # the Trainer's own


def test_a_request_through_jit_manager_saves_at_the_step_end_and_stops(tmp_path, sigterm_kept):
    """Code that sets ``jit_manager.is_checkpoint_requested`` (as transformers' manager does kill_wait seconds
    after SIGTERM) gets a checkpoint of the step, written by the loop (so the resume is exact), and a stop;
    SIGTERM's handler is the one from before the Trainer afterwards."""

    class RequestAtStep3(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 2:  # step 3 begins
                jit.jit_manager.is_checkpoint_requested = True

    args = make_args(tmp_path, enable_jit_checkpoint=True, max_steps=10, save_strategy="no")
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64), callbacks=[RequestAtStep3()])
    jit = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, JITCheckpointCallback))
    assert signal.getsignal(signal.SIGTERM) == jit.jit_manager._sigterm_handler  # installed by set_trainer
    result = trainer.train()
    assert result.global_step == 3 and result.metrics["interrupted"] is True
    assert os.listdir(tmp_path) == ["checkpoint-3"] and not jit.jit_manager.is_checkpoint_requested
    assert signal.getsignal(signal.SIGTERM) == sigterm_kept
    resumed = Trainer(RegressionModel(), make_args(tmp_path, max_steps=10), train_dataset=RegressionDataset(64))
    assert resumed.train(resume_from_checkpoint=True).global_step == 10
    unbroken = Trainer(RegressionModel(), make_args(tmp_path / "unbroken", max_steps=10),
                       train_dataset=RegressionDataset(64))
    unbroken.train()
    assert [p.item() for p in resumed.model.parameters()] == [p.item() for p in unbroken.model.parameters()]


# ------------------------------------------------------------------------------ every event through call_event


def test_every_event_goes_through_call_event(tmp_path):
    """setfit replaces ``callback_handler.call_event`` on the instance; transformers routes every ``on_*`` event through
    it, so such an override sees the whole run: the same events in the same order as on transformers (train with a
    save and an evaluation, then evaluate and predict). Saves in the foreground: a background save's on_save fires
    once its folder is complete (a deliberate difference, tested in test_async_save.py)."""

    def events(lib):
        own = {"async_save": False} if lib is cadence else {}
        trainer = trainer_for(tmp_path / lib.__name__, lib, max_steps=4, per_device_train_batch_size=16,
                              gradient_accumulation_steps=2, logging_steps=2, eval_strategy="steps", eval_steps=3,
                              save_strategy="steps", save_steps=3, use_cpu=True, **own)
        seen = []
        handler = trainer.callback_handler
        original = handler.call_event

        def call_event(event, args, state, control, **kwargs):  # setfit's pattern: on the instance
            seen.append(event)
            return original(event, args, state, control, **kwargs)

        handler.call_event = call_event
        trainer.train()
        trainer.evaluate()
        trainer.predict(RegressionDataset(8))
        return seen

    ours, theirs = events(cadence), events(pytest.importorskip("transformers"))
    assert ours == theirs
    assert {"on_step_begin", "on_substep_end", "on_step_end", "on_log", "on_evaluate", "on_save", "on_predict",
            "on_prediction_step", "on_train_end"} <= set(ours)
