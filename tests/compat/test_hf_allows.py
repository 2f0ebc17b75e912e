"""What transformers.Trainer allows, cadence allows too (issue 28, points 1-8): each case runs in both libraries
on the same tiny model and seed, and cadence's result is compared with transformers'.

Tolerances: both libraries run the same AdamW (torch's) over the same batches in the same order on a CPU; they differ
only in the order of float32 reductions (cadence sums a step's loss once over its items), so weights agree to ~1e-6;
1e-5 absolute leaves room for that and still fails on any change of the update rule (a flipped clip, a lost decay
moves the weights by > 1e-3 here).
"""

from __future__ import annotations

import logging
import math
import os
import shutil

import pytest
import torch
from tiny import RegressionDataset, RegressionModel, TokenDataset, TokenTagger, pad_collate

import cadence

transformers = pytest.importorskip("transformers")

COMMON = dict(per_device_train_batch_size=4, num_train_epochs=2, learning_rate=0.05, optim="adamw_torch",
              logging_steps=1, report_to="none", disable_tqdm=True, seed=7, use_cpu=True)


def fit(lib, out, train_dataset=None, eval_dataset=None, callbacks=None, resume=None, **kw):
    args = lib.TrainingArguments(output_dir=str(out), **{**COMMON, **kw})
    trainer = lib.Trainer(RegressionModel(), args, train_dataset=train_dataset or RegressionDataset(24),
                          eval_dataset=eval_dataset, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


# --- point 1: values transformers accepts ------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,same_as", [
    ("max_grad_norm", -1.0, 0.0),  # transformers clips only when max_grad_norm > 0
    ("weight_decay", -0.1, None),  # odd, but transformers trains (the decay groups carry it past torch's check)
])
def test_odd_optimizer_values_train_like_transformers(tmp_path, caplog, field, value, same_as):
    kw = {field: value, "save_strategy": "no"}
    with caplog.at_level(logging.WARNING, logger="cadence"):
        ours = weights(fit(cadence, tmp_path / "c", **kw))
    assert any(f"{field}={value!r}" in r.getMessage() for r in caplog.records), "the odd value is not warned"
    theirs = weights(fit(transformers, tmp_path / "h", **kw))
    for name in theirs:
        assert torch.allclose(ours[name], theirs[name], atol=1e-5, rtol=0), (name, ours[name], theirs[name])
    default = weights(fit(cadence, tmp_path / "d", save_strategy="no"))  # the value changed something
    assert max((ours[n] - default[n]).abs().max().item() for n in ours) > 1e-3
    if same_as is not None:  # bit-identical to the value it stands for
        same = weights(fit(cadence, tmp_path / "s", **{**kw, field: same_as}))
        assert all(torch.equal(ours[n], same[n]) for n in ours)


@pytest.mark.parametrize("limit", [0, -1])
def test_save_total_limit_zero_or_negative_keeps_every_checkpoint(tmp_path, limit):
    kw = dict(save_strategy="steps", save_steps=2, save_total_limit=limit)
    fit(cadence, tmp_path / "c", **kw)
    fit(transformers, tmp_path / "h", **kw)
    kept = sorted(os.listdir(tmp_path / "h"))
    assert kept == [f"checkpoint-{n}" for n in (10, 12, 2, 4, 6, 8)]  # 24 rows / 4 = 6 steps x 2 epochs, every 2nd
    assert sorted(n for n in os.listdir(tmp_path / "c") if n.startswith("checkpoint-")) == kept


# --- point 3: a callback's exception reaches the caller as itself ------------------------------------------------
class Quota(Exception):
    """The user's own exception type."""


class StopAtStep(cadence.TrainerCallback):
    def __init__(self, step, error):
        self.step, self.error = step, error

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise self.error


@pytest.mark.parametrize("error", [ValueError("budget spent"), Quota("quota")], ids=["ValueError", "own-type"])
def test_a_callbacks_exception_is_raised_as_itself(tmp_path, error):
    caught = {}
    for lib in (transformers, cadence):
        try:
            fit(lib, tmp_path / lib.__name__, callbacks=[StopAtStep(3, error)], save_strategy="no")
        except type(error) as exc:  # what `except ValueError:` around train() sees in transformers
            caught[lib.__name__] = exc
        error.__notes__ = []
    assert caught["transformers"] is error and caught["cadence"] is error
    assert "budget spent" in str(caught["cadence"]) or "quota" in str(caught["cadence"])


def test_the_note_names_the_callback_and_the_event(tmp_path):
    error = KeyError("missing")
    with pytest.raises(KeyError) as info:
        fit(cadence, tmp_path, callbacks=[StopAtStep(2, error)], save_strategy="no")
    assert info.value is error
    assert info.value.__notes__ == ["raised by callback StopAtStep in on_step_end"]


# --- point 6: transformers' wording for a checkpoint that is not there -------------------------------------------
@pytest.mark.parametrize("where", ["missing", "not-a-checkpoint", "true-without-checkpoint"])
def test_a_missing_checkpoint_is_named_in_transformers_wording(tmp_path, where):
    """Scripts and transformers' own tests match on its message: both libraries' errors contain it."""
    os.makedirs(tmp_path / "empty")
    resume = {"missing": str(tmp_path / "nowhere"), "not-a-checkpoint": str(tmp_path / "empty"),
              "true-without-checkpoint": True}[where]
    for lib in (transformers, cadence):
        out = tmp_path / lib.__name__
        with pytest.raises(ValueError) as info:
            fit(lib, out, resume=resume, save_strategy="no")
        wording = f"No valid checkpoint found in output directory ({out})" if resume is True else \
            f"Can't find a valid checkpoint at {resume}"
        assert wording in str(info.value), (lib.__name__, str(info.value))


# --- point 5: metric_for_best_model is looked up at the evaluation, not when the Trainer is built -----------------
def accuracy_trainer(lib):
    """A subclass whose evaluate adds the metric, without compute_metrics (transformers' own tests do this)."""
    class WithAccuracy(lib.Trainer):
        def evaluate(self, *a, **k):
            metrics = super().evaluate(*a, **k)
            # -loss as an "accuracy": the best one is the lowest loss, so both libraries pick the same step
            metrics["eval_accuracy"] = -metrics["eval_loss"]
            return metrics
    return WithAccuracy


BEST = dict(eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, metric_for_best_model="accuracy",
            load_best_model_at_end=True, greater_is_better=True)


def test_a_metric_added_by_a_subclass_can_pick_the_best_model(tmp_path):
    best = {}
    for lib in (transformers, cadence):
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), **{**COMMON, **BEST})
        trainer = accuracy_trainer(lib)(RegressionModel(), args, train_dataset=RegressionDataset(24),
                                        eval_dataset=RegressionDataset(8, seed=3))
        trainer.train()
        best[lib.__name__] = (trainer.state.best_global_step, trainer.state.best_metric)
    assert best["cadence"][0] == best["transformers"][0] and best["cadence"][0] > 0
    assert best["cadence"][1] == pytest.approx(best["transformers"][1], rel=1e-4)  # float32 eval loss, other order


def test_a_metric_nobody_adds_fails_at_the_first_evaluation(tmp_path):
    steps = {}
    for lib in (transformers, cadence):
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), **{**COMMON, **BEST})
        trainer = lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(24),
                              eval_dataset=RegressionDataset(8, seed=3))  # built: no error yet
        with pytest.raises(KeyError) as info:
            trainer.train()
        steps[lib.__name__] = trainer.state.global_step
        assert "accuracy" in str(info.value)
    assert steps["cadence"] == steps["transformers"] == 2  # at the first evaluation
    assert "eval_loss" in str(info.value)  # cadence's message names what the evaluation reported


# --- point 2: an eval set without items is evaluated, not refused -------------------------------------------------
def test_an_empty_eval_set_gives_metrics_without_a_loss(tmp_path):
    keys = {}
    for lib in (transformers, cadence):
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), **COMMON)
        trainer = lib.Trainer(RegressionModel(), args, eval_dataset=[])  # accepted when built, as in transformers
        metrics = trainer.evaluate(eval_dataset=[])
        keys[lib.__name__] = set(metrics) - {"eval_model_preparation_time"}  # transformers' own timer
        assert "eval_loss" not in metrics and metrics["eval_samples_per_second"] == 0.0
    assert keys["cadence"] == keys["transformers"]


class Masked(TokenDataset):
    """Every label -100: nothing to average."""

    def __getitem__(self, i):
        row = super().__getitem__(i)
        return {**row, "labels": torch.full_like(row["labels"], -100)}


def test_an_eval_set_whose_labels_are_all_masked_reports_nan(tmp_path, caplog):
    """transformers reports eval_loss=nan; so does cadence (warned once), and load_best_model_at_end goes on."""
    losses = {}
    for lib in (transformers, cadence):
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), **{
            **COMMON, "learning_rate": 1e-3, "eval_strategy": "steps", "eval_steps": 3, "save_steps": 3,
            "load_best_model_at_end": True})
        trainer = lib.Trainer(TokenTagger(), args, train_dataset=TokenDataset(24), eval_dataset=Masked(8),
                              data_collator=pad_collate)
        with caplog.at_level(logging.WARNING, logger="cadence"):
            trainer.train()
        losses[lib.__name__] = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    assert len(losses["cadence"]) == len(losses["transformers"]) == 4  # steps 3, 6, 9, 12
    assert all(math.isnan(v) for v in losses["cadence"] + losses["transformers"])
    assert sum("eval_loss is NaN" in r.getMessage() for r in caplog.records) == 1


# --- point 4: resuming into a dataset of another length ----------------------------------------------------------
class StopAt:
    def __new__(cls, lib, step):
        class Stop(lib.TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == step:
                    control.should_training_stop = True
        return Stop()


def test_a_checkpoint_resumes_into_a_dataset_of_another_length_as_in_transformers(tmp_path, caplog):
    """Stopped at step 4 of 24 rows (6 steps an epoch), resumed on 40 rows (10 steps an epoch) with other intervals:
    transformers continues by steps (epoch 4 // 10 = 0, 4 batches skipped) to step 20; cadence too, warned."""
    ends = {}
    for lib in (transformers, cadence):
        out = tmp_path / lib.__name__
        fit(lib, out, callbacks=[StopAt(lib, 4)], save_strategy="steps", save_steps=4)
        with caplog.at_level(logging.WARNING, logger="cadence"):
            trainer = fit(lib, out, train_dataset=RegressionDataset(40, seed=5), resume=True, save_strategy="steps",
                          save_steps=5, logging_steps=2)
        ends[lib.__name__] = (trainer.state.global_step, weights(trainer))
    assert ends["cadence"][0] == ends["transformers"][0] == 20
    for name, value in ends["transformers"][1].items():
        assert torch.allclose(ends["cadence"][1][name], value, atol=1e-5, rtol=0), name
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "\tlogging_steps: 2 (from args) != 1 (from trainer_state.json)" in messages  # transformers' lines
    assert "\tsave_steps: 5 (from args) != 4 (from trainer_state.json)" in messages
    assert "data position is approximate" in messages and "24 samples" in messages


def test_the_checkpoints_batch_size_is_compared_in_transformers_wording(tmp_path, caplog):
    fit(cadence, tmp_path, callbacks=[StopAt(cadence, 2)], save_strategy="steps", save_steps=2)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        fit(cadence, tmp_path, resume=True, save_strategy="steps", save_steps=2, per_device_train_batch_size=2)
    assert any("\n\tper_device_train_batch_size: 2 (from args) != 4 (from trainer_state.json)" in r.getMessage()
               for r in caplog.records)


# --- point 7: small surfaces transformers has -------------------------------------------------------------------
def test_the_trainer_module_has_transformers_constants():
    import transformers.trainer as theirs

    import cadence.trainer as ours
    for name in ("TRAINER_STATE_NAME", "TRAINING_ARGS_NAME", "OPTIMIZER_NAME", "SCHEDULER_NAME", "SCALER_NAME"):
        assert getattr(ours, name) == getattr(theirs, name), name


@pytest.mark.parametrize("report_to,disabled", [("none", False), ("tensorboard", False), ("none", True)])
def test_a_kubeflow_trainjob_adds_kubeflow_to_report_to(tmp_path, monkeypatch, report_to, disabled):
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://127.0.0.1:9/status")  # what the TrainJob sets
    if disabled:
        monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "TRUE")
    names = {lib.__name__: lib.TrainingArguments(output_dir=str(tmp_path), report_to=report_to).report_to
             for lib in (transformers, cadence)}
    assert names["cadence"] == names["transformers"]
    assert ("kubeflow" in names["cadence"]) is not disabled


def test_unwrap_model_unwraps_a_users_data_parallel(tmp_path):
    for lib in (transformers, cadence):
        model = RegressionModel()
        trainer = lib.Trainer(model, lib.TrainingArguments(output_dir=str(tmp_path), **COMMON))
        assert trainer.accelerator.unwrap_model(torch.nn.DataParallel(model)) is model, lib.__name__


class Seen(cadence.TrainerCallback):
    def __init__(self):
        self.seen = {}

    def note(self, key, loader):
        self.seen[key] = (loader.batch_size, loader.total_batch_size, len(loader.dataset))

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.note("train", train_dataloader)

    def on_evaluate(self, args, state, control, eval_dataloader=None, **kwargs):
        self.note("eval", eval_dataloader)


def test_the_dataloaders_have_accelerates_attributes(tmp_path):
    seen = {}
    for lib in (transformers, cadence):
        callback = type("Seen", (lib.TrainerCallback,), dict(vars(Seen)))()
        fit(lib, tmp_path / lib.__name__, eval_dataset=RegressionDataset(10), callbacks=[callback], max_steps=2,
            eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=3, save_strategy="no")
        seen[lib.__name__] = callback.seen
    # transformers' loaders (accelerate's, built over a batch sampler) say batch_size=None; cadence's the batch itself
    assert seen["transformers"] == {"train": (None, 4, 24), "eval": (None, 3, 10)}
    assert seen["cadence"] == {"train": (4, 4, 24), "eval": (3, 3, 10)}


def test_an_eval_dataloader_of_plain_batches_is_evaluated(tmp_path):
    """A subclass's get_eval_dataloader may return any iterable of batches (no .dataset), as transformers allows."""
    batches = [{"input_x": torch.linspace(-1, 1, 4) + i, "labels": 2 * torch.linspace(-1, 1, 4) + 3} for i in range(3)]
    losses = {}
    for lib in (transformers, cadence):
        class Plain(lib.Trainer):
            def get_eval_dataloader(self, eval_dataset=None):
                return list(batches)
        trainer = Plain(RegressionModel(a=1.0, b=0.5), lib.TrainingArguments(output_dir=str(tmp_path), **COMMON))
        losses[lib.__name__] = trainer.evaluate()["eval_loss"]
    # equal batches: the item-weighted mean and transformers' batch mean agree; float32 sums in another order
    assert losses["cadence"] == pytest.approx(losses["transformers"], rel=1e-6)


# --- point 8: the order of on_save -----------------------------------------------------------------------------
def record_events(lib, out, **kw):
    from test_events import EVENTS

    class Recorder(lib.TrainerCallback):
        def __init__(self):
            self.events = []

    for event in EVENTS:
        setattr(Recorder, event, lambda self, *a, _event=event, **k: self.events.append(_event))
    recorder = Recorder()
    fit(lib, out, eval_dataset=RegressionDataset(8, seed=3), callbacks=[recorder], **kw)
    return recorder.events


# 24 rows / 4: 6 steps an epoch; saves at each epoch's last step (6, 12) and at step 4, 8; evaluations every 3
ORDER = dict(save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=3, logging_steps=2)


def test_with_async_save_false_the_event_order_is_transformers(tmp_path):
    theirs = record_events(transformers, tmp_path / "h", **ORDER)
    ours = record_events(cadence, tmp_path / "c", async_save=False, **ORDER)
    assert ours == theirs
    assert "on_save" in ours and ours.count("on_epoch_end") == 2


def test_with_async_save_the_last_epochs_order_is_transformers(tmp_path, monkeypatch):
    """A background save fires on_save once its folder is complete: at the first step boundary after that (so, for a
    slow disk, after on_epoch_end of its epoch), except at the last epoch, whose end waits (train() waits anyway)."""
    from cadence.checkpoint import writer

    real = writer.write_manifest

    def slow(folder):  # a slow disk: every write is still in flight at the next step's boundary
        import threading
        import time
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.2)
        real(folder)

    monkeypatch.setattr(writer, "write_manifest", slow)
    theirs = record_events(transformers, tmp_path / "h", **ORDER)
    ours = record_events(cadence, tmp_path / "c", async_save=True, **ORDER)
    assert ours.count("on_save") == theirs.count("on_save") == 6

    def last_step(events):  # from the last step's on_step_begin: its save, on_epoch_end, the end of training
        return events[len(events) - 1 - events[::-1].index("on_step_begin"):]
    ours, theirs = last_step(ours), last_step(theirs)
    # the first on_save here is step 10's, late by one step on the slow disk (fired when step 12's save begins)
    assert ours.count("on_save") == 2 and theirs.count("on_save") == 1
    ours.remove("on_save")
    assert ours == theirs  # ..., on_evaluate, on_save (step 12), on_epoch_end, on_log, on_train_end


# --- a subclass's own sampler (TRL's RepeatSampler) resumes inside an epoch -------------------------------------
class ShuffledTwice(torch.utils.data.Sampler):
    """Each index twice in a seeded random order: a sampler cadence cannot tell to skip (no set_epoch(epoch, skip))."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return 2 * self.n

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(3)).tolist()
        return iter([i for i in order for _ in range(2)])


def own_sampler(lib):
    class OwnSampler(lib.Trainer):
        def _get_train_sampler(self, *args, **kwargs):
            return ShuffledTwice(len(self.train_dataset))
    return OwnSampler


def test_a_subclasss_sampler_resumes_inside_an_epoch_like_an_unbroken_run(tmp_path, caplog):
    """transformers resumes by reading the trained batches again and dropping them; cadence refused a sampler of
    its own making at resume. Now: the same, and the run ends bit-identical to the unbroken one."""
    def run(out, resume=None):
        args = cadence.TrainingArguments(output_dir=str(out), **{**COMMON, "max_steps": 12,
                                                                 "save_strategy": "steps", "save_steps": 3})
        trainer = own_sampler(cadence)(RegressionModel(), args, train_dataset=RegressionDataset(24))
        trainer.train(resume_from_checkpoint=resume)
        return weights(trainer)

    unbroken = run(tmp_path / "u")
    shutil.copytree(tmp_path / "u" / "checkpoint-3", tmp_path / "r" / "checkpoint-3")  # inside epoch 1 (12 batches)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        resumed = run(tmp_path / "r", resume=True)
    assert "reading and dropping the 3 batches" in caplog.text
    assert all(torch.equal(unbroken[n], resumed[n]) for n in unbroken)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "h"), **{**COMMON, "max_steps": 12,
                                                                            "save_strategy": "no"})
    theirs = own_sampler(transformers)(RegressionModel(), args, train_dataset=RegressionDataset(24))
    theirs.train()
    for name, w in weights(theirs).items():  # the same order of samples as transformers
        assert torch.allclose(unbroken[name], w, atol=1e-5, rtol=0), name


# --- save_steps=0 with save_strategy="steps": accepted, one save when training ends --------------------------------
@pytest.mark.parametrize("extra", [{}, {"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 4}],
                         ids=["plain", "best-model"])
def test_save_steps_zero_saves_only_at_the_end_as_in_transformers(tmp_path, extra):
    kw = dict(save_strategy="steps", save_steps=0, **extra)
    eval_dataset = RegressionDataset(8) if extra else None
    fit(transformers, tmp_path / "h", eval_dataset=eval_dataset, **kw)
    fit(cadence, tmp_path / "c", eval_dataset=eval_dataset, **kw)
    theirs = sorted(n for n in os.listdir(tmp_path / "h") if n.startswith("checkpoint-"))
    assert theirs == ["checkpoint-12"]  # 24 rows / 4 = 6 steps x 2 epochs: only the last step saves
    assert sorted(n for n in os.listdir(tmp_path / "c") if n.startswith("checkpoint-")) == theirs
