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
