"""What a subclass sets is honoured (issue 27): the class attribute ``loss_is_scaled_for_ga`` (TRL's GRPOTrainer sets
it) and its own additions to ``state.num_input_tokens_seen`` (TRL counts its generated tokens there)."""

import copy

import pytest
import torch
from tiny import LMDataset, RegressionDataset, RegressionModel, args_with, pad_collate, tiny_gpt2

from cadence import Trainer

make_args = args_with(use_cpu=True)


class ScaledSumTrainer(Trainer):
    """Returns the squared error summed over the batch and divided by the step's item count: already scaled for
    gradient accumulation, which the class attribute says."""

    loss_is_scaled_for_ga = True

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        outputs = model(input_x=inputs["input_x"])
        pred = outputs[0] if isinstance(outputs, tuple) else outputs
        return ((pred - inputs["labels"]) ** 2).sum() / kwargs["num_items_in_batch"]


def test_class_attribute_loss_is_scaled_for_ga_is_honoured(out_dir):
    """The scaled sum over 2 micro-batches of 4 is the mean over the 8 rows: the same steps as one batch of 8 with
    the model's own mean loss (float rounding apart: 1e-6). Were the attribute hidden, cadence would weight the
    loss again by each micro-batch's share and take steps half as large."""
    runs = {}
    for name, cls, bs, ga in (("scaled", ScaledSumTrainer, 4, 2), ("plain", Trainer, 8, 1)):
        args = make_args(f"{out_dir}/{name}", per_device_train_batch_size=bs, gradient_accumulation_steps=ga,
                         max_steps=5, learning_rate=0.05, seed=1)
        trainer = cls(RegressionModel(), args, train_dataset=RegressionDataset(64))
        assert trainer.loss_is_scaled_for_ga is (cls is ScaledSumTrainer or None)
        trainer.train()
        runs[name] = (trainer.model.a.item(), trainer.model.b.item())
    assert runs["scaled"] == pytest.approx(runs["plain"], abs=1e-6)
    assert runs["plain"] != pytest.approx((0.0, 0.0), abs=1e-3)  # it trained


def _token_adding(base):
    class TokenAddingTrainer(base):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self.state.num_input_tokens_seen += 1000  # a subclass's own count, as TRL's GRPO keeps
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    return TokenAddingTrainer


def test_subclass_additions_to_num_input_tokens_seen_are_kept(out_dir):
    """The logged num_input_tokens_seen equals transformers' exactly (integers): its own count plus the subclass's."""
    transformers = pytest.importorskip("transformers")
    import cadence

    model = tiny_gpt2(seed=2)
    logged = {}
    for lib in (transformers, cadence):
        args = lib.TrainingArguments(
            output_dir=f"{out_dir}/{lib.__name__}", per_device_train_batch_size=4, gradient_accumulation_steps=2,
            max_steps=3, logging_steps=1, include_num_input_tokens_seen="all", save_strategy="no", report_to="none",
            disable_tqdm=True, use_cpu=True, seed=5)
        trainer = _token_adding(lib.Trainer)(model=copy.deepcopy(model), args=args, train_dataset=LMDataset(24),
                                             data_collator=pad_collate)
        trainer.train()
        logged[lib.__name__] = [h["num_input_tokens_seen"] for h in trainer.state.log_history if "loss" in h]
    assert len(logged["cadence"]) == 3 and logged["cadence"] == logged["transformers"]
    assert logged["cadence"][0] > 2000  # the subclass's 2 x 1000 of the first step are in


# ---------------------------------------------------------------------------------------------------------------------
# Trainer internals that libraries reach (issue 36): each compared with transformers.Trainer on the same seed.

def _dropout_gpt2(seed: int = 3):
    """tiny_gpt2 with dropout on, so a model left in eval mode trains differently."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.3,
                        embd_pdrop=0.3, attn_pdrop=0.3)
    return _named_loss(GPT2LMHeadModel(config))


def _named_loss(model):
    """transformers counts label position 0 for a GPT-2 whose loss_type is None; named, it counts as cadence does."""
    model.loss_type = "ForCausalLM"
    return model


def _both(run):
    """``run(lib)`` for transformers and cadence, as {name: result}."""
    transformers = pytest.importorskip("transformers")
    import cadence

    return {lib.__name__: run(lib) for lib in (transformers, cadence)}


def _lib_args(lib, out, **kw):
    return lib.TrainingArguments(**{"output_dir": str(out), "per_device_train_batch_size": 4, "max_steps": 6,
                                    "logging_steps": 1, "save_strategy": "no", "report_to": "none",
                                    "disable_tqdm": True, "use_cpu": True, "seed": 7,
                                    "train_sampling_strategy": "sequential", **kw})


def _step_losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_training_mode_is_set_in_every_training_step(out_dir):
    """A save that puts the model in eval mode (sentence-transformers' does) at step 2: transformers' next
    training_step puts it back in training mode, so dropout stays on. The same per-step losses (float32 on one CPU
    process, the same dropout draws: 1e-6); on a loop that sets the mode only at its start, steps 3-6 ran without
    dropout (their losses differ by > 1e-2)."""
    model = _dropout_gpt2()

    def run(lib):
        class EvalModeSave(lib.TrainerCallback):
            def on_save(self, args, state, control, model=None, **kwargs):
                model.eval()  # what a library's save does (sentence-transformers' save_pretrained)

        modes = []

        class Recording(lib.Trainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                modes.append(model.training)
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        args = _lib_args(lib, f"{out_dir}/{lib.__name__}", save_strategy="steps", save_steps=2)
        trainer = Recording(model=copy.deepcopy(model), args=args, train_dataset=LMDataset(24), data_collator=pad_collate,
                            callbacks=[EvalModeSave()])
        trainer.train()
        return _step_losses(trainer), modes

    runs = _both(run)
    (theirs, their_modes), (ours, our_modes) = runs["transformers"], runs["cadence"]
    assert their_modes == our_modes == [True] * 6
    assert ours == pytest.approx(theirs, abs=1e-6) and len(ours) == 6


@pytest.mark.parametrize("last", ["step", "evaluation"])
def test_mode_after_train_is_transformers(out_dir, last):
    """After train(), the model is in the mode its last step or evaluation left it in, as in transformers: training
    mode after a step, eval mode after a final evaluation."""

    def run(lib):
        kw = {"eval_strategy": "steps", "eval_steps": 3} if last == "evaluation" else {}
        trainer = lib.Trainer(model=_named_loss(tiny_gpt2()), args=_lib_args(lib, f"{out_dir}/{lib.__name__}", **kw),
                              train_dataset=LMDataset(24), eval_dataset=LMDataset(8), data_collator=pad_collate)
        trainer.train()
        return trainer.model.training

    runs = _both(run)
    assert runs["cadence"] == runs["transformers"] == (last == "step")


def test_compute_loss_gets_the_item_count_as_transformers(out_dir):
    """One process, gradient_accumulation_steps=1: a subclass's compute_loss gets the batch's label count (labels not
    -100, after the causal shift) where transformers passes it (the model takes loss kwargs), with the same value on
    the same device; losses dividing by it (TRL's GKD does) are transformers' (float32 sums: 1e-6)."""
    model = _named_loss(tiny_gpt2(seed=4))

    def run(lib):
        counts = []

        class SumOverItems(lib.Trainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                counts.append(None if num_items_in_batch is None else
                              (float(num_items_in_batch), str(num_items_in_batch.device)))
                logits = model(input_ids=inputs["input_ids"]).logits[:, :-1].flatten(0, 1)
                total = torch.nn.functional.cross_entropy(logits, inputs["labels"][:, 1:].flatten(), reduction="sum")
                return total / num_items_in_batch

        trainer = SumOverItems(model=copy.deepcopy(model), args=_lib_args(lib, f"{out_dir}/{lib.__name__}"),
                               train_dataset=LMDataset(24), data_collator=pad_collate)
        trainer.train()
        return counts, _step_losses(trainer)

    runs = _both(run)
    (their_counts, theirs), (our_counts, ours) = runs["transformers"], runs["cadence"]
    assert None not in their_counts and our_counts == their_counts and len(ours) == 6
    assert ours == pytest.approx(theirs, abs=1e-6)


def test_label_names_and_can_return_loss_as_transformers(out_dir):
    """A model whose forward takes no label argument but returns a loss by default (return_loss=True, CLIP-like;
    sentence-transformers sets can_return_loss itself): label_names [] and can_return_loss True as transformers'
    find_labels / can_return_loss, and evaluate() asks it for its loss (the same eval_loss, 1e-6)."""

    class ContrastiveModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, return_loss=True):
            y = self.lin(x)
            return {"loss": (y ** 2).mean(), "embeddings": y} if return_loss else {"embeddings": y}

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {"x": torch.arange(4.0) * (i + 1) / 8}

    def run(lib):
        trainer = lib.Trainer(model=ContrastiveModel(), args=_lib_args(lib, f"{out_dir}/{lib.__name__}"))
        metrics = trainer.evaluate(Rows())
        return trainer.label_names, trainer.can_return_loss, metrics["eval_loss"]

    runs = _both(run)
    assert runs["cadence"][:2] == runs["transformers"][:2] == ([], True)
    assert runs["cadence"][2] == pytest.approx(runs["transformers"][2], abs=1e-6)


def test_load_from_checkpoint_gets_a_str_and_warnings_after_load_exist(out_dir):
    """Resuming calls _load_from_checkpoint with a str (sentence-transformers joins and passes it on) and the
    one-argument override of a library works; _issue_warnings_after_load (GLiNER's resume calls it) warns about
    unexpected keys as transformers does."""
    import cadence

    seen = []

    class LibraryLoad(Trainer):
        def _load_from_checkpoint(self, checkpoint_path):  # sentence-transformers' signature
            seen.append(type(checkpoint_path))
            result = self.model.load_state_dict({**self.model.state_dict(), "extra": torch.zeros(1)}, strict=False)
            self._issue_warnings_after_load(result)

    args = make_args(out_dir, max_steps=4, save_strategy="steps", save_steps=2, per_device_train_batch_size=8)
    Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64)).train()
    trainer = LibraryLoad(RegressionModel(), args, train_dataset=RegressionDataset(64))
    import logging
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("cadence.trainer").addHandler(handler)
    try:
        trainer.train(resume_from_checkpoint=f"{out_dir}/checkpoint-2")
    finally:
        logging.getLogger("cadence.trainer").removeHandler(handler)
    assert seen == [str]
    assert any("unexpected keys in the checkpoint model loaded: ['extra']" in r.getMessage() for r in records)
    assert cadence.Trainer._issue_warnings_after_load.__doc__


def _recording_log_save_evaluate(base, calls):
    class Recording(base):
        def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                                     learning_rate=None):
            calls.append({"tr_loss": float(tr_loss), "grad_norm": None if grad_norm is None else float(grad_norm),
                          "epoch": epoch, "trial": trial, "ignore": ignore_keys_for_eval,
                          "learning_rate": learning_rate, "start_time": isinstance(start_time, float),
                          "model_is_wrapped": model is self.model_wrapped,
                          "last_logged": self._globalstep_last_logged, "total": self._total_loss_scalar})
            super()._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                             start_time, learning_rate)

    return Recording


def _logging_itself(base):
    """TRL's online DPO: logs by itself from tr_loss, never calling super() (its body, less its own stats)."""

    class LogsItself(base):
        def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                                     learning_rate=None):
            if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
                tr_loss_scalar = tr_loss.mean().item()
                tr_loss -= tr_loss
                logs = {"loss": tr_loss_scalar / (self.state.global_step - self._globalstep_last_logged),
                        "grad_norm": grad_norm.item() if torch.is_tensor(grad_norm) else grad_norm,
                        "learning_rate": learning_rate if learning_rate is not None else self._get_learning_rate()}
                self._total_loss_scalar += tr_loss_scalar
                self._globalstep_last_logged = self.state.global_step
                self.store_flos()
                self.log(logs, start_time)
            if self.control.should_evaluate:
                metrics = self._evaluate(trial, ignore_keys_for_eval)
                self._determine_best_metric(metrics=metrics, trial=trial)
            if self.control.should_save:
                self._save_checkpoint(model, trial)
                self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    return LogsItself


def test_maybe_log_save_evaluate_with_transformers_signature(out_dir):
    """An override with transformers' signature that calls super() sees transformers' arguments at every call
    (after each step and each epoch's end): tr_loss summed since the last log, grad_norm, the epoch index, the
    learning rate, _globalstep_last_logged and _total_loss_scalar; the logs are transformers' (float32 sums against
    cadence's float64: 1e-5)."""
    model = _named_loss(tiny_gpt2(seed=6))

    def run(lib):
        calls = []
        args = _lib_args(lib, f"{out_dir}/{lib.__name__}", logging_steps=2, num_train_epochs=2, max_steps=-1,
                         per_device_train_batch_size=8, gradient_accumulation_steps=2, eval_strategy="epoch",
                         max_grad_norm=1.0)
        trainer = _recording_log_save_evaluate(lib.Trainer, calls)(
            model=copy.deepcopy(model), args=args, train_dataset=LMDataset(40), eval_dataset=LMDataset(8),
            data_collator=pad_collate)
        out = trainer.train()
        return calls, trainer.state.log_history, out.training_loss

    runs = _both(run)
    (their_calls, their_logs, their_loss), (our_calls, our_logs, our_loss) = runs["transformers"], runs["cadence"]
    assert len(our_calls) == len(their_calls) == 6 + 2  # 3 steps an epoch (5 batches, GA 2), and 2 epoch ends
    for ours, theirs in zip(our_calls, their_calls):
        assert ours.keys() == theirs.keys()
        for key in ours:
            number = isinstance(theirs[key], float)
            assert ours[key] == (pytest.approx(theirs[key], rel=1e-5) if number else theirs[key]), key
    keys = ("loss", "grad_norm", "learning_rate", "eval_loss", "epoch", "step")
    pick = lambda logs: [{k: h[k] for k in keys if k in h} for h in logs if "loss" in h or "eval_loss" in h]
    for ours, theirs in zip(pick(our_logs), pick(their_logs), strict=True):
        assert ours.keys() == theirs.keys() and all(ours[k] == pytest.approx(theirs[k], rel=1e-5) for k in ours)
    assert our_loss == pytest.approx(their_loss, rel=1e-5)


def test_an_override_that_logs_itself_drives_the_logs_and_train_loss(out_dir):
    """TRL's online DPO pattern: the override reads tr_loss, resets it in place and moves _globalstep_last_logged and
    _total_loss_scalar; cadence's loop and train_loss follow it, so the logs, the checkpoints it saves and
    train_loss are transformers' (1e-5: float32 sums against float64)."""
    model = _named_loss(tiny_gpt2(seed=8))

    def run(lib):
        args = _lib_args(lib, f"{out_dir}/{lib.__name__}", logging_steps=2, max_steps=5, save_strategy="steps",
                         save_steps=3, eval_strategy="steps", eval_steps=4)
        trainer = _logging_itself(lib.Trainer)(model=copy.deepcopy(model), args=args, train_dataset=LMDataset(24),
                                               eval_dataset=LMDataset(8), data_collator=pad_collate)
        out = trainer.train()
        logs = [(h["step"], h.get("loss"), h.get("eval_loss")) for h in trainer.state.log_history
                if "loss" in h or "eval_loss" in h]
        import os
        return logs, out.training_loss, sorted(os.listdir(args.output_dir))

    runs = _both(run)
    (their_logs, their_loss, their_files), (our_logs, our_loss, our_files) = runs["transformers"], runs["cadence"]
    assert [s for s, _, _ in our_logs] == [s for s, _, _ in their_logs] == [2, 4, 4, 5]
    for (_, a, b), (_, c, d) in zip(our_logs, their_logs):
        assert (a is None) == (c is None) and (b is None) == (d is None)
        assert (a or 0) == pytest.approx(c or 0, rel=1e-5) and (b or 0) == pytest.approx(d or 0, rel=1e-5)
    assert our_loss == pytest.approx(their_loss, rel=1e-5)
    assert [f for f in our_files if f.startswith("checkpoint")] == ["checkpoint-3", "checkpoint-5"]
