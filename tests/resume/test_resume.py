"""Stop-and-resume: a run stopped at any saved step and resumed ends bit-identical to one that never stopped.

"Stopping" is simulated in-process: a callback asks to stop after step k with a checkpoint at k, then a
new Trainer (fresh model, fresh process state) resumes from it. Checkpoints are written only at
optimizer-step boundaries (after ``optimizer.step``, ``scheduler.step`` and ``zero_grad``), never
inside an accumulation window, so "stopped inside a window" is not a save point: a run killed
there resumes from the previous step boundary (see test_crash.py).
"""

import json
import os

import pytest
import torch
from tiny import RegressionDataset, RegressionModel, Stream, TokenDataset, TokenTagger, args_with, pad_collate, stop_at
from torch import nn

from cadence import EarlyStoppingCallback, Trainer, TrainerCallback, TrainingArguments
from cadence.trainer_callback import ExportableState, TrainerState

VOLATILE = ("runtime", "per_second")  # wall-clock numbers differ between any two runs


class DropoutTagger(TokenTagger):
    """TokenTagger with dropout: its result depends on the torch RNG, so RNG restore matters."""

    def __init__(self):
        super().__init__(seed=0)
        self.drop = nn.Dropout(0.3)

    def logits(self, input_ids):
        return self.out(self.drop(torch.tanh(self.emb(input_ids))))


class CountingDataset(TokenDataset):
    """TokenDataset that counts ``__getitem__`` calls."""

    calls = 0
    seen = []

    def __getitem__(self, i):
        CountingDataset.calls += 1
        CountingDataset.seen.append(i)
        return super().__getitem__(i)


make_args = args_with(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=3,
                      learning_rate=0.05, logging_steps=4, save_strategy="steps", save_steps=500, seed=7)


def train(out_dir, stop=None, resume=None, dataset=None, callbacks=(), **kw):
    trainer = Trainer(DropoutTagger(), make_args(out_dir, **kw), train_dataset=dataset or TokenDataset(22),
                      eval_dataset=TokenDataset(6, seed=3), data_collator=pad_collate,
                      callbacks=[*callbacks, *([stop_at(stop)] if stop else [])])
    out = trainer.train(resume_from_checkpoint=resume)
    return trainer, out


def stable(history):
    return [{k: v for k, v in h.items() if not any(s in k for s in VOLATILE)} for h in history]


def assert_same_run(a, b):
    (ta, oa), (tb, ob) = a, b
    for (name, pa), (_, pb) in zip(ta.model.state_dict().items(), tb.model.state_dict().items()):
        assert torch.equal(pa, pb), name
    sa, sb = ta.optimizer.state_dict()["state"], tb.optimizer.state_dict()["state"]
    for k in sa:
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sa[k][name], sb[k][name])
    assert ta.lr_scheduler.state_dict()["last_epoch"] == tb.lr_scheduler.state_dict()["last_epoch"]
    assert stable(ta.state.log_history) == stable(tb.state.log_history)
    assert oa.global_step == ob.global_step and oa.training_loss == ob.training_loss


# 22 samples, batch 2 -> 11 batches an epoch; GA 2 -> 6 steps an epoch (the last one a single batch), 18 steps
@pytest.mark.parametrize("stop,kw", [
    (3, {}),                                     # middle of the first epoch
    (6, {}),                                     # last step of an epoch, saved before the epoch closes
    (7, {}),                                     # first step of the second epoch
    (18, {}),                                    # the last step of the run
    (6, {"save_strategy": "epoch"}),             # saved after the epoch closed (its evaluation ran)
    (5, {"gradient_accumulation_steps": 1}),     # no accumulation
    (13, {"max_grad_norm": 0.0, "lr_scheduler_type": "cosine", "warmup_steps": 3}),
    (5, {"fp16": True}),                         # the loss scale (scaler.pt) is restored too
    (4, {"group_by_length": True}),              # the length-grouped sampler skips in the sampler too
])
def test_resume_is_bit_identical(tmp_path, stop, kw):
    kw = {"eval_strategy": "epoch", **kw}
    if kw.get("save_strategy") != "epoch":
        kw["save_steps"] = stop
    full = train(str(tmp_path / "full"), **kw)
    train(str(tmp_path / "run"), stop=stop, **kw)
    assert os.path.isdir(tmp_path / "run" / f"checkpoint-{stop}")
    resumed = train(str(tmp_path / "run"), resume=True, **kw)
    assert_same_run(full, resumed)


class Augmented(TokenDataset):
    """Draws from the global torch RNG when read (a random augmentation): masks one more label at random."""

    def __getitem__(self, i):
        row = super().__getitem__(i)
        labels = row["labels"].clone()
        labels[torch.randint(len(labels), ())] = -100
        return {"input_ids": row["input_ids"], "labels": labels}


@pytest.mark.parametrize("stop", [4, 6])
def test_resume_with_random_augmentation_in_the_main_process(tmp_path, stop):
    """With num_workers=0 the data's own random draws continue exactly too: the RNGs are restored after
    the epoch's iterator exists and before the first batch after the checkpoint is read."""
    kw = dict(save_steps=stop, num_train_epochs=2, dataset=Augmented(22))
    full = train(str(tmp_path / "full"), **kw)
    train(str(tmp_path / "run"), stop=stop, **kw)
    assert_same_run(full, train(str(tmp_path / "run"), resume=True, **kw))


def test_resume_with_dataloader_workers(tmp_path):
    kw = dict(dataloader_num_workers=2, num_train_epochs=2, save_steps=4)
    full = train(str(tmp_path / "full"), **kw)
    train(str(tmp_path / "run"), stop=4, **kw)
    assert_same_run(full, train(str(tmp_path / "run"), resume=str(tmp_path / "run" / "checkpoint-4"), **kw))


def test_resume_twice_in_a_row(tmp_path):
    full = train(str(tmp_path / "full"), save_steps=5)
    out = str(tmp_path / "run")
    train(out, stop=5, save_steps=5)
    train(out, stop=10, resume=True, save_steps=5)
    assert_same_run(full, train(out, resume=True, save_steps=5))


def test_resume_reads_no_trained_sample(tmp_path):
    """Resuming costs the same at any step: the sampler starts after the trained samples, none is loaded."""
    args = dict(num_train_epochs=1, gradient_accumulation_steps=1, save_steps=1)
    ds = CountingDataset(22)
    train(str(tmp_path / "run"), stop=10, dataset=ds, **args)
    reads = {}
    for step in (1, 5, 10):
        CountingDataset.calls = 0
        train(str(tmp_path / "run"), resume=str(tmp_path / "run" / f"checkpoint-{step}"), dataset=ds,
              max_steps=step + 1, **args)  # one more step than was trained
        reads[step] = CountingDataset.calls
    # the 2 samples of the one new step, plus the 2 of the batch collated ahead (as transformers' dataloader does)
    # unless the epoch ends there (step 11 of 11), whatever the step; the dataset is never read early
    assert reads == {1: 4, 5: 4, 10: 2}


def test_epoch_sampler_skip_is_the_tail_of_the_epoch():
    from cadence.data import EpochSampler

    s = EpochSampler(11, shuffle=True, seed=3, rank=1, world_size=2)
    s.set_epoch(2)
    whole = list(s)
    s.set_epoch(2, skip=4)
    assert list(s) == whole[4:] and len(s) == len(whole) - 4
    s.set_epoch(3)
    assert len(list(s)) == len(whole)  # the next epoch is whole again


def test_ignore_data_skip_restarts_the_epoch(tmp_path):
    ds = CountingDataset(22)
    CountingDataset.seen = []
    train(str(tmp_path / "run"), stop=3, save_steps=3, num_train_epochs=1, dataset=ds)
    first_run = CountingDataset.seen[:12]  # the epoch's order: 3 steps of 4 (then the batch collated ahead)
    CountingDataset.seen = []
    trainer, out = train(str(tmp_path / "run"), resume=True, num_train_epochs=1, ignore_data_skip=True, dataset=ds,
                         save_steps=3)
    assert out.global_step == 6  # the step count continues: 3 more steps of 4 samples end the run
    assert CountingDataset.seen[:12] == first_run  # from the epoch's first sample again


def test_resume_true_takes_the_newest_complete_checkpoint(tmp_path):
    out = str(tmp_path / "run")
    train(out, stop=4, save_steps=2)
    os.makedirs(os.path.join(out, "tmp-checkpoint-6"))  # a save killed mid-way
    os.makedirs(os.path.join(out, "checkpoint-8"))  # not a checkpoint: no trainer_state.json
    trainer, _ = train(out, stop=5, resume=True, save_steps=2)
    assert trainer.state.log_history[0]["step"] == 4 and trainer.state.global_step == 5
    assert not os.path.exists(os.path.join(out, "tmp-checkpoint-6"))  # cleaned up on resume


def test_resume_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="no complete checkpoint-N"):
        train(str(tmp_path / "empty"), resume=True)
    os.makedirs(tmp_path / "notckpt")
    with pytest.raises(ValueError, match="not a complete checkpoint.*trainer_state.json"):
        train(str(tmp_path / "x"), resume=str(tmp_path / "notckpt"))
    with pytest.raises(ValueError, match="is not a folder"):
        train(str(tmp_path / "x"), resume=str(tmp_path / "missing"))
    out = str(tmp_path / "run")
    train(out, stop=2, save_steps=2)
    # another dataset resumes by steps, as in transformers, warned: test_resume_layout.py, test_hf_allows.py


def test_save_only_model_checkpoint_cannot_resume(tmp_path):
    out = str(tmp_path / "run")
    train(out, stop=2, save_steps=2, save_only_model=True)
    assert not os.path.exists(os.path.join(out, "checkpoint-2", "optimizer.pt"))
    with pytest.raises(ValueError, match="optimizer.pt.*save_only_model"):
        train(out, resume=True, save_only_model=True)


class StepCounter(TrainerCallback, ExportableState):
    """A stateful callback: counts the steps it saw."""

    def __init__(self, start=0):
        self.start, self.count = start, 0

    def on_step_end(self, args, state, control, **kwargs):
        self.count += 1

    def state(self):
        return {"args": {"start": self.start}, "attributes": {"count": self.count}}


def test_callback_states_survive_resume(tmp_path):
    """Stateful callbacks (early-stopping patience, ...) are saved in trainer_state.json and, with
    restore_callback_states_from_checkpoint (off by default, as in transformers), restored in place."""
    out = str(tmp_path / "run")
    patience = EarlyStoppingCallback(early_stopping_patience=100)
    patience.early_stopping_patience_counter = 2  # as after two evaluations without improvement
    kw = dict(save_steps=3, num_train_epochs=1, restore_callback_states_from_checkpoint=True, eval_strategy="steps", eval_steps=100,
              metric_for_best_model="loss")
    train(out, stop=3, callbacks=[StepCounter(), patience], **kw)
    saved = json.load(open(os.path.join(out, "checkpoint-3", "trainer_state.json")))["stateful_callbacks"]
    assert saved["EarlyStoppingCallback"]["attributes"] == {"early_stopping_patience_counter": 2}
    assert saved["StepCounter"] == {"args": {"start": 0}, "attributes": {"count": 3}} and "TrainerControl" in saved
    trainer, _ = train(out, callbacks=[StepCounter(start=9), EarlyStoppingCallback(100)], stop=5, resume=True, **kw)
    # restored callbacks go to the end of the list in the checkpoint's order, as in transformers (its order is
    # test_callback_surface.py's): picked here by type
    [counter] = [c for c in trainer.callback_handler.callbacks if isinstance(c, StepCounter)]
    [stopper] = [c for c in trainer.callback_handler.callbacks if isinstance(c, EarlyStoppingCallback)]
    assert (counter.start, counter.count) == (0, 5)  # 3 before the stop, 2 after: as one run
    assert stopper.early_stopping_patience_counter == 2  # no evaluation since
    fresh = StepCounter()
    train(out, callbacks=[fresh], resume=str(tmp_path / "run" / "checkpoint-3"),
          **{**kw, "restore_callback_states_from_checkpoint": False})
    assert fresh.count == 3  # not restored: this run's steps only


def test_resumed_state_keeps_history_and_this_runs_counts(tmp_path):
    out = str(tmp_path / "run")
    train(out, stop=4, save_steps=4, logging_steps=1)
    trainer, result = train(out, resume=True, save_steps=4, logging_steps=1, num_train_epochs=2)
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == list(range(1, 13))
    assert trainer.state.max_steps == 12 and trainer.state.num_train_epochs == 2
    assert result.metrics["train_steps_per_second"] > 0


def test_regression_resume_without_accumulation(tmp_path):
    """A model whose loss does not count items (no GA): the resumed weights equal the unbroken run's."""
    def run(out, stop=None, resume=None):
        args = TrainingArguments(output_dir=out, disable_tqdm=True, report_to="none", num_train_epochs=2,
                                 per_device_train_batch_size=4, save_steps=3, learning_rate=0.1)
        t = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(20),
                    callbacks=[stop_at(stop)] if stop else [])
        t.train(resume_from_checkpoint=resume)
        return t.model

    full = run(str(tmp_path / "full"))
    run(str(tmp_path / "run"), stop=6)
    resumed = run(str(tmp_path / "run"), resume=True)
    assert torch.equal(full.a, resumed.a) and torch.equal(full.b, resumed.b)


def test_trainer_state_json_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    out = str(tmp_path / "run")
    train(out, stop=2, save_steps=2, callbacks=[EarlyStoppingCallback(3)], eval_strategy="steps", eval_steps=2,
          metric_for_best_model="loss")
    path = os.path.join(out, "checkpoint-2", "trainer_state.json")
    theirs = transformers.TrainerState.load_from_json(path)
    ours = TrainerState.load_from_json(path)
    assert theirs.global_step == ours.global_step == 2 and theirs.log_history == ours.log_history


def test_demo_resumes_from_its_newest_checkpoint(tmp_path, capsys, caplog):
    from cadence.cli import main

    caplog.set_level("INFO", logger="cadence")
    out = str(tmp_path / "demo")
    with pytest.raises(ValueError, match="no complete checkpoint-N"):
        main(["demo", "--output-dir", out, "--max-steps", "2", "--resume"])
    assert main(["demo", "--output-dir", out, "--max-steps", "2"]) == 0
    assert os.path.isdir(os.path.join(out, "checkpoint-2"))  # the last step is always saved
    assert main(["demo", "--output-dir", out, "--max-steps", "3", "--resume"]) == 0
    state = json.load(open(os.path.join(out, "checkpoint-3", "trainer_state.json")))
    assert state["global_step"] == 3
    assert "cadence demo: 3 steps" in capsys.readouterr().out
    assert "resuming at step 2: epoch 0, 4 batches into it" in caplog.text  # 2 steps of 2 accumulated batches
    assert main(["demo", "--output-dir", out, "--max-steps", "1"]) == 0  # a second fresh demo replaces the first
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-1"]


class SeenX(RegressionModel):
    """RegressionModel that records the inputs it trains on."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, input_x, labels=None):
        self.seen.append(input_x.detach().clone())
        return super().forward(input_x, labels)


def test_iterable_dataset_resume_with_ignore_data_skip_restarts_the_stream(tmp_path):
    def run(out, **kw):
        args = TrainingArguments(output_dir=out, disable_tqdm=True, report_to="none", max_steps=6, save_steps=3,
                                 per_device_train_batch_size=4, **kw)
        trainer = Trainer(SeenX(), args, train_dataset=Stream(RegressionDataset(64)), callbacks=[stop_at(3)])
        return trainer, trainer.train(resume_from_checkpoint=os.path.join(out, "checkpoint-3") if kw else None)

    out = str(tmp_path / "run")
    first, _ = run(out)
    trainer, result = run(out, ignore_data_skip=True)  # (resuming without it: tests/resume/test_stream_resume.py)
    assert result.global_step == 6
    stream_x = RegressionDataset(64).x
    assert torch.equal(torch.cat(first.model.seen), stream_x[:12])  # steps 1-3: the stream's first 12 samples
    # steps 4-6 after the resume: the stream read again from its first sample, not continued at sample 12
    assert len(trainer.model.seen) == 3 and torch.equal(torch.cat(trainer.model.seen), stream_x[:12])


def test_weights_of_another_model_are_refused(tmp_path):
    out = str(tmp_path / "run")
    train(out, stop=2, save_steps=2)
    args = TrainingArguments(output_dir=out, disable_tqdm=True, report_to="none", max_steps=4)
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(8))
    with pytest.raises(ValueError, match="do not fit RegressionModel: missing \\['a', 'b'\\], unexpected \\['emb.weight'"):
        trainer.train(resume_from_checkpoint=True)
    os.remove(os.path.join(out, "checkpoint-2", "model.safetensors"))
    for name in ("checkpoint_manifest.json", "loop_state.json"):  # as transformers' (else: "model.safetensors is missing")
        os.remove(os.path.join(out, "checkpoint-2", name))
    with pytest.raises(FileNotFoundError, match="has no weights: none of model.safetensors"):
        train(out, resume=True)


def test_a_compatible_optimizer_resumes_and_another_is_refused_before_its_first_step(tmp_path):
    """adamw_torch_fused's checkpoint resumes with adamw_torch (the same torch.optim.AdamW state); with sgd the
    resume stops before any step, naming both optimizers, instead of torch's KeyError: 'momentum' after it."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    args = args_with(max_steps=2, per_device_train_batch_size=4, logging_steps=1, save_strategy="steps", save_steps=2)
    out = str(tmp_path / "run")
    Trainer(RegressionModel(), args(out, optim="adamw_torch_fused"), train_dataset=RegressionDataset(16)).train()
    resumed = Trainer(RegressionModel(), args(out, optim="adamw_torch", max_steps=4), train_dataset=RegressionDataset(16))
    assert resumed.train(resume_from_checkpoint=True).global_step == 4
    assert type(resumed.optimizer).__name__ == "AdamW"
    steps = []
    hook = register_optimizer_step_pre_hook(lambda optimizer, a, kw: steps.append(1))
    try:
        with pytest.raises(ValueError, match=r"checkpoint-4 holds the state of another optimizer.*"
                                             r"optim='adamw_torch'.*SGD \(optim='sgd'\).*'momentum'"):
            Trainer(RegressionModel(), args(out, optim="sgd", max_steps=6),
                    train_dataset=RegressionDataset(16)).train(resume_from_checkpoint=True)
    finally:
        hook.remove()
    assert not steps
