"""accelerator_config (issue 27): built as transformers builds it (dict, JSON string, JSON file, AcceleratorConfig,
transformers' own AcceleratorConfig), its to_dict() equal to transformers', gradient_accumulation_kwargs' num_steps
taken as gradient_accumulation_steps, and the values that would break cadence's exactness refused naming why."""

import json

import pytest
import torch
from tiny import RegressionDataset, RegressionModel

from cadence import Trainer, TrainingArguments
from cadence.trainer_pt_utils import AcceleratorConfig


def test_every_form_builds_the_same_config(tmp_path):
    wanted = {"non_blocking": True, "gradient_accumulation_kwargs": {"sync_each_batch": True}}
    path = tmp_path / "accelerator.json"
    path.write_text(json.dumps(wanted))
    forms = [wanted, json.dumps(wanted), str(path), AcceleratorConfig(**wanted)]
    transformers = pytest.importorskip("transformers")
    forms.append(transformers.trainer_pt_utils.AcceleratorConfig(**wanted))
    built = [TrainingArguments(str(tmp_path), accelerator_config=f).accelerator_config for f in forms]
    assert all(isinstance(c, AcceleratorConfig) and c == built[0] for c in built)
    assert built[0].non_blocking is True and built[0].gradient_accumulation_kwargs == {"sync_each_batch": True}


@pytest.mark.parametrize("given", [None, {"non_blocking": True}, {"use_configured_state": True},
                                   {"gradient_accumulation_kwargs": {"sync_each_batch": True}}])
def test_to_dict_matches_transformers(tmp_path, given):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.TrainingArguments(str(tmp_path), accelerator_config=given, use_cpu=True)
    ours = TrainingArguments(str(tmp_path), accelerator_config=given, use_cpu=True)  # the state transformers made
    assert ours.to_dict()["accelerator_config"] == theirs.to_dict()["accelerator_config"]
    assert TrainingArguments(**ours.to_dict()).accelerator_config == ours.accelerator_config  # round trip


def _train(tmp_path, name, **kwargs):
    args = TrainingArguments(str(tmp_path / name), per_device_train_batch_size=4, max_steps=4, learning_rate=0.1,
                             logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=3, **kwargs)
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64))
    trainer.train()
    return args, [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer.model.a.detach().clone()


def test_num_steps_is_gradient_accumulation_steps(tmp_path):
    """transformers: num_steps in gradient_accumulation_kwargs sets gradient_accumulation_steps when that is 1."""
    args, losses, a = _train(tmp_path, "kwargs", accelerator_config={"gradient_accumulation_kwargs": {"num_steps": 3}})
    assert args.gradient_accumulation_steps == 3
    _, plain_losses, plain_a = _train(tmp_path, "plain", gradient_accumulation_steps=3)
    assert losses == plain_losses and torch.equal(a, plain_a)
    with pytest.raises(ValueError, match="num_steps=3 and gradient_accumulation_steps=2 both set"):
        TrainingArguments(str(tmp_path), gradient_accumulation_steps=2,
                          accelerator_config={"gradient_accumulation_kwargs": {"num_steps": 3}})


@pytest.mark.parametrize("given, match", [
    ({"split_batches": True}, "split_batches=True is not supported by cadence: .*per_device_train_batch_size=B/N"),
    ({"dispatch_batches": True}, "dispatch_batches=True is not supported by cadence: every process reads its own"),
    ({"even_batches": False}, "even_batches=False is not supported by cadence: every process must take the same"),
    ({"use_seedable_sampler": False}, "use_seedable_sampler=False is not supported by cadence: .*resume"),
])
def test_values_that_break_exactness_are_refused(tmp_path, given, match):
    with pytest.raises(ValueError, match=match):
        TrainingArguments(str(tmp_path), accelerator_config=given)


@pytest.mark.parametrize("given, error, match", [
    ({"splitbatches": True}, TypeError, r"unknown keys \['splitbatches'\]"),
    ({"gradient_accumulation_kwargs": {"steps": 2}}, TypeError, "gradient_accumulation_kwargs=.*keys among"),
    ("missing.json", ValueError, "accelerator_config='missing.json' is invalid: .*no such file"),
    (AcceleratorConfig, TypeError, "it is a class; pass an instance"),
    (3, TypeError, "must be a dict, an AcceleratorConfig or a JSON file path, not int"),
])
def test_bad_values_name_the_field(tmp_path, given, error, match):
    with pytest.raises(error, match=match):
        TrainingArguments(str(tmp_path), accelerator_config=given)


def test_file_with_unknown_keys_is_refused(tmp_path):
    path = tmp_path / "accelerator.json"
    path.write_text('{"split_batch": true}')
    with pytest.raises(ValueError, match=r"unknown keys \['split_batch'\]"):
        TrainingArguments(str(tmp_path), accelerator_config=str(path))
