"""Mixed precision on the CPU: bf16 autocast tracks float32, fp16 loss scaling skips bad steps rightly,
full-precision-cast evaluation, TF32 and the hardware errors."""

import copy
import os

import pytest
import torch
from tiny import LMDataset, TokenDataset, TokenTagger, args_with, lm_collate, pad_collate, tiny_gpt2

from cadence import Trainer, TrainerCallback
from cadence import backend as backend_module


make_args = args_with(use_cpu=True)


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


class _OutputDtypes:
    """Records the dtype of the LM head's output in every training forward."""

    def __init__(self, module):
        self.seen = []
        module.register_forward_hook(lambda m, i, out: self.seen.append(out.dtype))


# bf16 keeps 8 bits of mantissa: the loss of a 2-layer GPT-2 (ln 64 ~ 4.16 at start) differs from float32 by
# a few 1e-3 per step; 1e-2 relative leaves room and still fails if autocast broke training (or was off: then
# the difference is exactly 0, checked too).
BF16_REL_TOL = 1e-2


def test_bf16_on_cpu_trains_and_tracks_fp32(out_dir):
    model = tiny_gpt2(seed=5)
    runs = {}
    for bf16 in (False, True):
        m = copy.deepcopy(model)
        dtypes = _OutputDtypes(m.lm_head)
        args = make_args(f"{out_dir}/{bf16}", bf16=bf16, max_steps=10, per_device_train_batch_size=4,
                         learning_rate=3e-3, logging_steps=1, seed=7)
        trainer = Trainer(m, args, train_dataset=LMDataset(40), data_collator=lm_collate)
        trainer.train()
        runs[bf16] = (_losses(trainer), set(dtypes.seen), m, trainer)
    fp32_losses, fp32_dtypes, fp32_model, _ = runs[False]
    bf16_losses, bf16_dtypes, bf16_model, trainer = runs[True]
    assert fp32_dtypes == {torch.float32} and bf16_dtypes == {torch.bfloat16}  # autocast on, only where asked
    assert all(p.dtype == torch.float32 for p in bf16_model.parameters())  # weights stay float32
    assert len(bf16_losses) == 10
    assert bf16_losses != fp32_losses  # really computed in a different precision
    for a, b in zip(bf16_losses, fp32_losses):
        assert a == pytest.approx(b, rel=BF16_REL_TOL)
    # both runs moved the weights the same way (random tokens: the loss itself barely falls in 10 steps)
    start, end32, end16 = model.state_dict(), fp32_model.state_dict(), bf16_model.state_dict()
    moved = torch.cat([(end32[n] - start[n]).flatten() for n in start]).norm()
    apart = torch.cat([(end16[n] - end32[n]).flatten() for n in start]).norm()
    print(f"bf16 vs fp32: weights apart {apart:.4g}, moved {moved:.4g}")
    assert apart < 0.25 * moved
    # evaluation runs under the same autocast: bf16 outputs, and the loss of the same weights evaluated in
    # float32 within bf16's rounding (BF16_REL_TOL), yet not equal to it (as it would be with autocast off)
    eval_set, probe = LMDataset(8, seed=9), _OutputDtypes(bf16_model.lm_head)
    metrics = trainer.evaluate(eval_set)
    assert set(probe.seen) == {torch.bfloat16}
    fp32_eval = Trainer(bf16_model, make_args(f"{out_dir}/fp32_eval"), data_collator=lm_collate).evaluate(eval_set)
    assert set(probe.seen[-1:]) == {torch.float32}
    assert metrics["eval_loss"] == pytest.approx(fp32_eval["eval_loss"], rel=BF16_REL_TOL)
    assert metrics["eval_loss"] != fp32_eval["eval_loss"]


class _InjectInf(TrainerCallback):
    """Makes every gradient of `param` inf in the optimizer step numbered `bad_step` (1-based); records
    the weights after each step."""

    def __init__(self, param, bad_step):
        self.bad_step, self.active, self.weights = bad_step, False, []
        param.register_hook(lambda g: g * float("inf") if self.active else g)
        self.param = param

    def on_step_begin(self, args, state, control, **kwargs):
        self.active = state.global_step + 1 == self.bad_step

    def on_step_end(self, args, state, control, **kwargs):
        self.weights.append(self.param.detach().clone())


def test_fp16_scaler_skips_inf_step_and_keeps_schedule_right(out_dir):
    model = TokenTagger(seed=1)
    spy = _InjectInf(model.out.weight, bad_step=3)
    args = make_args(out_dir, fp16=True, max_steps=6, per_device_train_batch_size=4, learning_rate=0.05,
                     lr_scheduler_type="linear", logging_steps=1, optim="adamw_torch", save_strategy="steps",
                     save_steps=6)
    trainer = Trainer(model, args, train_dataset=TokenDataset(40), data_collator=pad_collate, callbacks=[spy])
    out = trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h.get("skipped_optimizer_steps", 0) for h in logs] == [0, 0, 1, 0, 0, 0]
    assert out.metrics["train_skipped_optimizer_steps"] == 1
    assert out.global_step == 6  # a skipped step still counts as a step, as in transformers
    # the skipped step changed no weight; the others did
    assert torch.equal(spy.weights[2], spy.weights[1])
    assert not torch.equal(spy.weights[3], spy.weights[2])
    # the optimizer took 5 steps and the schedule advanced 5 times, not 6
    adam_steps = {int(s["step"]) for s in trainer.optimizer.state.values()}
    assert adam_steps == {5}
    assert trainer.lr_scheduler.last_epoch == 5
    lrs = [h["learning_rate"] for h in logs]
    peak = 0.05
    # linear decay over 6 steps: the learning rate of steps 3 (skipped) and 4 is the same
    assert lrs == pytest.approx([peak * (6 - k) / 6 for k in (0, 1, 2, 2, 3, 4)])
    # the loss scale backed off once (65536 -> 32768) and was saved with the checkpoint
    assert trainer.backend.scaler.get_scale() == 32768.0
    saved = torch.load(f"{out_dir}/checkpoint-6/scaler.pt", weights_only=True)
    assert saved["scale"] == 32768.0


def test_fp16_grad_norm_is_unscaled_before_clipping(out_dir):
    norms = {}
    for fp16 in (False, True):
        trainer = Trainer(TokenTagger(seed=2), make_args(f"{out_dir}/{fp16}", fp16=fp16, max_steps=2, logging_steps=1,
                                                           per_device_train_batch_size=4, max_grad_norm=0.1),
                          train_dataset=TokenDataset(16), data_collator=pad_collate)
        trainer.train()
        norms[fp16] = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    # scaled gradients would show a norm 65536 times larger; fp16 activations differ from float32 by ~1e-3
    assert norms[True] == pytest.approx(norms[False], rel=1e-2)
    assert norms[False][0] > 0.1  # so clipping did act on these steps


def test_no_scaler_without_fp16(out_dir):
    trainer = Trainer(TokenTagger(), make_args(out_dir, bf16=True, max_steps=1, save_strategy="steps", save_steps=1),
                      train_dataset=TokenDataset(8), data_collator=pad_collate)
    trainer.train()
    assert trainer.backend.scaler is None
    assert not os.path.exists(f"{out_dir}/checkpoint-1/scaler.pt")


@pytest.mark.parametrize("flag, dtype", [("bf16_full_eval", torch.bfloat16), ("fp16_full_eval", torch.float16)])
def test_full_eval_casts_the_model_outside_training(out_dir, flag, dtype):
    model = TokenTagger(seed=4)
    reference = Trainer(copy.deepcopy(model), make_args(out_dir), data_collator=pad_collate).evaluate(TokenDataset(16))
    trainer = Trainer(model, make_args(out_dir, **{flag: True}), data_collator=pad_collate)
    metrics = trainer.evaluate(TokenDataset(16))
    assert {p.dtype for p in model.parameters()} == {dtype}  # cast in place, as transformers does
    assert metrics["eval_loss"] != reference["eval_loss"]
    assert metrics["eval_loss"] == pytest.approx(reference["eval_loss"], rel=2e-2)


def test_full_eval_does_not_cast_during_training(out_dir):
    model = TokenTagger(seed=4)
    args = make_args(out_dir, bf16_full_eval=True, max_steps=2, eval_strategy="steps", eval_steps=1)
    trainer = Trainer(model, args, train_dataset=TokenDataset(16), eval_dataset=TokenDataset(8), data_collator=pad_collate)
    trainer.train()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert len([h for h in trainer.state.log_history if "eval_loss" in h]) == 2


def test_tf32_true_on_cpu_is_a_clear_error(out_dir):
    with pytest.raises(ValueError, match=r"tf32=True is invalid on device cpu.*compute capability >= 8"):
        Trainer(TokenTagger(), make_args(out_dir, tf32=True))
    Trainer(TokenTagger(), make_args(out_dir, tf32=False))  # nothing to turn off on a CPU: accepted


def test_fp16_without_cpu_scaler_is_a_clear_error(out_dir, monkeypatch):
    def no_cpu_scaler(device="cuda", *args, **kwargs):
        raise RuntimeError(f"GradScaler is not supported on {device}")

    monkeypatch.setattr(backend_module.torch.amp, "GradScaler", no_cpu_scaler)
    with pytest.raises(ValueError, match=r"fp16=True is invalid on the CPU.*no CPU grad scaler.*bf16=True"):
        Trainer(TokenTagger(), make_args(out_dir, fp16=True))


def test_no_autocast_device_is_a_clear_error(out_dir, monkeypatch):
    monkeypatch.setattr(backend_module.torch.amp.autocast_mode, "is_autocast_available", lambda device: False)
    with pytest.raises(ValueError, match=r"bf16=True is invalid on device cpu: torch has no autocast"):
        Trainer(TokenTagger(), make_args(out_dir, bf16=True))


@pytest.mark.parametrize("precision, rel", [("bf16", 1e-6), ("fp16", 1e-4)])
def test_same_run_as_transformers(out_dir, precision, rel):
    """The same script in transformers.Trainer (accelerate's CPU autocast and scaler) and cadence.

    bf16 matches to float rounding; fp16's scaled gradients round in float16, and the two libraries
    apply the scale at different points, hence the looser 1e-4 (measured: about 1e-5).
    """
    transformers = pytest.importorskip("transformers")
    import cadence

    model = tiny_gpt2(seed=3)
    model.loss_type = "ForCausalLM"  # so transformers counts the shifted items right (see test_hf_parity)
    runs = {}
    for lib in (transformers, cadence):
        args = lib.TrainingArguments(
            output_dir=f"{out_dir}/{lib.__name__}", **{precision: True}, per_device_train_batch_size=4,
            gradient_accumulation_steps=2, max_steps=6, learning_rate=3e-3, warmup_steps=2, lr_scheduler_type="cosine",
            weight_decay=0.1, max_grad_norm=0.5, logging_steps=1, save_strategy="no", report_to="none",
            disable_tqdm=True, seed=123, use_cpu=True,
        )
        trainer = lib.Trainer(model=copy.deepcopy(model), args=args, train_dataset=LMDataset(44), data_collator=pad_collate)
        trainer.train()
        runs[lib.__name__] = [h for h in trainer.state.log_history if "loss" in h]
    hf, ours = runs["transformers"], runs["cadence"]
    assert len(ours) == len(hf) == 6
    for h, c in zip(hf, ours):
        assert c["loss"] == pytest.approx(h["loss"], rel=rel)
        assert c["grad_norm"] == pytest.approx(h["grad_norm"], rel=rel * 10)
        assert c["learning_rate"] == pytest.approx(h["learning_rate"], rel=1e-9)


def test_fp16_resume_restores_the_loss_scale(tmp_path):
    """A checkpoint after a skipped step holds the backed-off scale; the resumed run continues with it."""

    class StopAt4(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 4 or control.should_training_stop

    def run(out, stop, resume=None):
        model = TokenTagger(seed=1)
        callbacks = [_InjectInf(model.out.weight, bad_step=3)] + ([StopAt4()] if stop else [])
        args = make_args(str(tmp_path / out), fp16=True, max_steps=6, per_device_train_batch_size=4, learning_rate=0.05,
                         logging_steps=1, optim="adamw_torch", save_strategy="steps", save_steps=4)
        trainer = Trainer(model, args, train_dataset=TokenDataset(40), data_collator=pad_collate, callbacks=callbacks)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run("full", stop=False)
    run("cut", stop=True)
    resumed = run("cut", stop=False, resume=True)
    assert resumed.state.global_step == 6 and resumed.state.log_history[0]["step"] == 1
    assert resumed.backend.scaler.get_scale() == full.backend.scaler.get_scale() == 32768.0
    for name, value in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name


def _pairwise_trainer(base):
    """A subclass computing its own loss from the model's outputs, as TRL's RewardTrainer does (a pairwise
    log-sigmoid of two scores); records the dtype of the logits it is handed."""

    class PairwiseTrainer(base):
        seen: set

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(input_ids=inputs["input_ids"])
            self.seen.add(outputs.logits.dtype)
            scores = outputs.logits[:, -1, :2]
            loss = -torch.nn.functional.logsigmoid(scores[:, 0] - scores[:, 1]).mean()
            return (loss, outputs) if return_outputs else loss

    return PairwiseTrainer


def test_bf16_loss_computed_from_outputs_is_float32_as_in_transformers(out_dir):
    """Under bf16, accelerate autocasts only the model's forward and converts its outputs to float32, so a loss a
    subclass computes from the outputs is float32 in transformers; cadence does the same. Both then run the same
    arithmetic in the same order: 1e-6 relative is float rounding (measured 0.0 on this machine), while a loss
    computed in bfloat16 (cadence before: autocast around all of compute_loss) differs by ~1e-3."""
    transformers = pytest.importorskip("transformers")
    import cadence

    model = tiny_gpt2(seed=4)
    runs = {}
    for lib in (transformers, cadence):
        args = lib.TrainingArguments(
            output_dir=f"{out_dir}/{lib.__name__}", bf16=True, per_device_train_batch_size=4, max_steps=6,
            learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, seed=11,
            use_cpu=True)
        trainer = _pairwise_trainer(lib.Trainer)(model=copy.deepcopy(model), args=args, train_dataset=LMDataset(24),
                                                 data_collator=pad_collate)
        trainer.seen = set()
        trainer.train()
        runs[lib.__name__] = (_losses(trainer), trainer.seen, trainer.model.state_dict())
    (hf, hf_seen, hf_w), (ours, our_seen, our_w) = runs["transformers"], runs["cadence"]
    assert hf_seen == our_seen == {torch.float32}
    assert len(ours) == len(hf) == 6
    for h, c in zip(hf, ours):
        assert c == pytest.approx(h, rel=1e-6)
    for name, w in hf_w.items():
        assert torch.allclose(our_w[name], w, rtol=0, atol=1e-6), name


def test_bf16_forward_wrapper_follows_each_run(out_dir):
    """The forward's autocast is put on the model once per precision: a deepcopy (a reference model) keeps its own
    forward, and a float32 run after a bf16 one on the same model computes in float32."""
    model = tiny_gpt2(seed=5)
    dtypes = _OutputDtypes(model.lm_head)
    bf16 = Trainer(model, make_args(f"{out_dir}/a", bf16=True, max_steps=1), train_dataset=LMDataset(8),
                   data_collator=lm_collate)
    bf16.train()
    twin = copy.deepcopy(model)
    batch = lm_collate([LMDataset(2)[i] for i in range(2)])
    assert twin(**batch).logits.dtype == torch.float32  # outputs converted, computed by the copy itself
    assert twin.forward.__self__ is twin
    dtypes.seen.clear()
    Trainer(model, make_args(f"{out_dir}/b", max_steps=1), train_dataset=LMDataset(8), data_collator=lm_collate).train()
    assert set(dtypes.seen) == {torch.float32}
