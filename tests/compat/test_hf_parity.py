"""The same script gives the same run in cadence and in transformers.Trainer."""

import copy

import pytest
import torch
from tiny import LMDataset, pad_collate, tiny_gpt2

transformers = pytest.importorskip("transformers")

import cadence  # noqa: E402

COMMON = dict(
    per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=3e-3,
    warmup_steps=2, lr_scheduler_type="cosine", weight_decay=0.1, max_grad_norm=0.5, logging_steps=1,
    save_strategy="no", report_to="none", disable_tqdm=True, seed=123, use_cpu=True,
)


def run(lib, model, out_dir):
    args = lib.TrainingArguments(output_dir=out_dir, **COMMON)
    trainer = lib.Trainer(model=model, args=args, train_dataset=LMDataset(44), data_collator=pad_collate)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return logs, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_same_losses_and_weights_as_transformers(tmp_path):
    model = tiny_gpt2(seed=3)
    # transformers 5.24 counts label position 0 for GPT2LMHeadModel (its loss_type is None, so it does not know
    # the loss shifts); cadence does not. Naming the loss type makes transformers count right too.
    model.loss_type = "ForCausalLM"
    hf_logs, hf_weights = run(transformers, copy.deepcopy(model), str(tmp_path / "hf"))
    cd_logs, cd_weights = run(cadence, copy.deepcopy(model), str(tmp_path / "cd"))
    assert len(hf_logs) == len(cd_logs) == 12  # 11 batches of 4 -> 6 steps per epoch (last window short)
    for h, c in zip(hf_logs, cd_logs):
        assert c["step"] == h["step"]
        assert c["loss"] == pytest.approx(h["loss"], rel=1e-5, abs=1e-6)
        assert c["learning_rate"] == pytest.approx(h["learning_rate"], rel=1e-9)
        assert c["grad_norm"] == pytest.approx(h["grad_norm"], rel=1e-4)
        assert c["epoch"] == pytest.approx(h["epoch"])
    for name, value in hf_weights.items():
        assert torch.allclose(cd_weights[name], value, atol=1e-5, rtol=1e-4), name
    # and training moved the weights, so the comparison is not of two untouched models
    start = model.state_dict()
    assert max((start[n] - hf_weights[n]).abs().max().item() for n in start) > 1e-3


@pytest.mark.parametrize("scheduler,kwargs", [("reduce_lr_on_plateau", {"patience": 0, "factor": 0.5}), ("greedy", {"patience": 1, "factor": 0.8})])
def test_metric_schedulers_step_on_eval_like_transformers(tmp_path, scheduler, kwargs):
    from tiny import RegressionDataset, RegressionModel

    def lrs(lib, out):
        args = lib.TrainingArguments(output_dir=out, max_steps=12, per_device_train_batch_size=8, learning_rate=0.5,
                                     lr_scheduler_type=scheduler, lr_scheduler_kwargs=kwargs, eval_strategy="steps",
                                     eval_steps=1, logging_steps=1, save_strategy="no", report_to="none",
                                     disable_tqdm=True, seed=5, use_cpu=True, optim="sgd")
        trainer = lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64),
                              eval_dataset=RegressionDataset(16, seed=9))
        trainer.train()
        return [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]

    ours, theirs = lrs(cadence, str(tmp_path / "c")), lrs(transformers, str(tmp_path / "h"))
    assert ours == pytest.approx(theirs, rel=1e-9)
    assert len(set(ours)) > 1  # the metric moved the learning rate
