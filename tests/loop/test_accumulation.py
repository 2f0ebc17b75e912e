"""Gradient accumulation is exact: GA=k x batch b trains like GA=1 x batch k*b."""

import pytest
import torch
from tiny import TokenDataset, TokenTagger, TokenTaggerWithItems, pad_collate

from cadence import Trainer, TrainingArguments


def train_params(model_cls, out_dir, batch, ga, length=40, **kw):
    model = model_cls(dtype=torch.float64)
    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=batch, gradient_accumulation_steps=ga,
        num_train_epochs=2, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant",
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=7, **kw,
    )
    trainer = Trainer(model, args, train_dataset=TokenDataset(length), data_collator=pad_collate)
    out = trainer.train()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, trainer, out


@pytest.mark.parametrize("model_cls", [TokenTagger, TokenTaggerWithItems])
@pytest.mark.parametrize("length", [40, 36])  # 36: the last window of each epoch is shorter
def test_ga4_b2_equals_ga1_b8(model_cls, length, tmp_path):
    big, t_big, out_big = train_params(model_cls, str(tmp_path / "a"), batch=8, ga=1, length=length)
    acc, t_acc, out_acc = train_params(model_cls, str(tmp_path / "b"), batch=2, ga=4, length=length)
    assert t_big.state.global_step == t_acc.state.global_step == 2 * -(-length // 8)
    for name in big:
        assert torch.allclose(big[name], acc[name], atol=1e-12, rtol=0), name
    # the logged losses are the same numbers too (mean over each step's items, not divided by GA twice)
    losses_big = [h["loss"] for h in t_big.state.log_history if "loss" in h]
    losses_acc = [h["loss"] for h in t_acc.state.log_history if "loss" in h]
    assert losses_big == pytest.approx(losses_acc, abs=1e-12)
    assert out_big.training_loss == pytest.approx(out_acc.training_loss, abs=1e-9)


def test_ga_differs_from_naive_mean_of_means(tmp_path):
    """Guard: with masked, varied-length labels a mean of micro-batch means would not match, so the test above can fail."""
    ds = TokenDataset(8)
    model = TokenTagger(dtype=torch.float64)
    full = pad_collate([ds[i] for i in range(8)])
    halves = [pad_collate([ds[i] for i in range(j, j + 2)]) for j in range(0, 8, 2)]
    true_mean = model(**full)["loss"]
    mean_of_means = torch.stack([model(**h)["loss"] for h in halves]).mean()
    assert abs(true_mean - mean_of_means) > 1e-3


class MeanLossTrainer(Trainer):
    """A subclass whose compute_loss returns its batch's mean, as many users write it."""

    def compute_loss(self, model, inputs, return_outputs=False):
        outputs = model(inputs["input_ids"])
        labels = inputs["labels"]
        loss = torch.nn.functional.cross_entropy(outputs["logits"].flatten(0, 1), labels.flatten(), ignore_index=-100)
        return (loss, outputs) if return_outputs else loss


class SumLossTrainer(Trainer):
    """A subclass that takes num_items_in_batch and divides by it (HF's contract)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(inputs["input_ids"])
        logits, labels = outputs["logits"].flatten(0, 1), inputs["labels"].flatten()
        if num_items_in_batch is None:
            loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)
        else:
            loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / num_items_in_batch
        return (loss, outputs) if return_outputs else loss


@pytest.mark.parametrize("trainer_cls", [MeanLossTrainer, SumLossTrainer])
def test_overridden_compute_loss_is_not_scaled_twice(trainer_cls, tmp_path):
    """A custom compute_loss (with or without num_items_in_batch) accumulates exactly too."""
    def run(batch, ga, out):
        model = TokenTaggerWithItems(dtype=torch.float64)  # its forward takes num_items_in_batch: the trap
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, gradient_accumulation_steps=ga,
                                 num_train_epochs=1, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant",
                                 save_strategy="no", disable_tqdm=True, seed=7)
        trainer_cls(model, args, train_dataset=TokenDataset(40), data_collator=pad_collate).train()
        return model.state_dict()

    big, acc = run(8, 1, str(tmp_path / "a")), run(2, 4, str(tmp_path / "b"))
    for name in big:
        assert torch.allclose(big[name], acc[name], atol=1e-12, rtol=0), name
