"""DeepSpeed configs: "auto" filled from TrainingArguments as transformers fills them (checked against a hand
computation, and against transformers' own filler when deepspeed is installed), disagreements refused, and a
clear error before anything runs where DeepSpeed itself cannot run the config. The end-to-end ZeRO-1/2/3 runs on
the CPU are in test_deepspeed_train.py."""

import json
import types

import pytest

from cadence import Trainer, TrainingArguments
from cadence.backend import deepspeed_config

AUTO = {
    "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                      "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"},
}
ARGS = dict(per_device_train_batch_size=4, gradient_accumulation_steps=3, max_grad_norm=0.7, learning_rate=2e-4,
            weight_decay=0.05, adam_beta2=0.95, warmup_steps=0.1, report_to="none")
MODEL = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=32))

# by hand: batch 4 x 3 accumulation x 1 process; hidden 32 -> 32*32, 0.9*32*32, 10*32; 50 steps, 10% warmup -> 5
EXPECTED = {
    "train_micro_batch_size_per_gpu": 4, "train_batch_size": 12, "gradient_accumulation_steps": 3,
    "gradient_clipping": 0.7,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.05}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-4,
                                                      "warmup_num_steps": 5, "total_num_steps": 50}},
    "bf16": {"enabled": False}, "fp16": {"enabled": False},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 1024, "stage3_prefetch_bucket_size": 921,
                          "stage3_param_persistence_threshold": 320},
}


def test_auto_values_filled_as_transformers_fills_them(tmp_path):
    args = TrainingArguments(str(tmp_path), deepspeed=AUTO, **ARGS)
    assert deepspeed_config(args, MODEL, 50) == EXPECTED
    assert AUTO["train_batch_size"] == "auto"  # the user's dict is left as given
    # before the model and the schedule are known, those entries stay "auto"
    early = deepspeed_config(args)
    assert early["zero_optimization"]["reduce_bucket_size"] == "auto" and early["train_batch_size"] == 12
    path = tmp_path / "ds.json"  # a file path and a JSON string say the same
    path.write_text(json.dumps(AUTO))
    assert deepspeed_config(TrainingArguments(str(tmp_path), deepspeed=str(path), **ARGS), MODEL, 50) == EXPECTED
    assert deepspeed_config(TrainingArguments(str(tmp_path), deepspeed=json.dumps(AUTO), **ARGS), MODEL, 50) == EXPECTED
    bf16 = deepspeed_config(TrainingArguments(str(tmp_path), deepspeed=AUTO, use_cpu=True, bf16=True, **ARGS))
    assert bf16["bf16"] == {"enabled": True} and bf16["fp16"] == {"enabled": False}


def test_same_as_transformers_filler(tmp_path):
    pytest.importorskip("deepspeed")  # transformers' filler refuses to import without it
    from transformers import TrainingArguments as HFArgs
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(AUTO)))
    hf_args = HFArgs(str(tmp_path), **ARGS)
    hf.trainer_config_process(hf_args)
    hf.trainer_config_finalize(hf_args, MODEL, 50)
    assert deepspeed_config(TrainingArguments(str(tmp_path), deepspeed=AUTO, **ARGS), MODEL, 50) == hf.config


def test_set_values_that_disagree_are_refused(tmp_path):
    config = {**AUTO, "train_micro_batch_size_per_gpu": 16, "gradient_clipping": 0.7}
    with pytest.raises(ValueError, match=r"train_micro_batch_size_per_gpu=16 but TrainingArguments give 4"):
        deepspeed_config(TrainingArguments(str(tmp_path), deepspeed=config, **ARGS))
    with pytest.raises(ValueError, match="no config.hidden_size"):
        deepspeed_config(TrainingArguments(str(tmp_path), deepspeed=AUTO, **ARGS), types.SimpleNamespace(), 50)


def test_refused_only_where_deepspeed_cannot_run_it(tmp_path):
    """A CPU is no reason to refuse (DeepSpeed runs there); fp16 where DeepSpeed's accelerator has no fp16 is."""
    pytest.importorskip("deepspeed")
    from deepspeed.accelerator import get_accelerator
    from tiny import RegressionDataset, RegressionModel

    if get_accelerator().is_fp16_supported():
        pytest.skip(f"DeepSpeed's {get_accelerator().device_name()!r} accelerator has fp16 here")
    args = TrainingArguments(str(tmp_path), deepspeed={"zero_optimization": {"stage": 2}}, fp16=True, report_to="none")
    with pytest.raises(ValueError, match=r"fp16=True under deepspeed=\.\.\.: DeepSpeed's '\w+' accelerator reports no "
                                         r"fp16 support.*remove fp16=True"):
        Trainer(RegressionModel(), args, train_dataset=RegressionDataset())


def test_given_optimizers_that_deepspeed_replaces_are_named():
    """optimizers=(...) beside the config's own sections: DeepSpeed builds those instead (transformers drops the
    given ones silently); cadence warns, naming what goes unused and which sections replace it."""
    import torch

    from cadence.backend.deepspeed import unused_given_optimizers

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    both = {"optimizer": AUTO["optimizer"], "scheduler": AUTO["scheduler"]}
    assert unused_given_optimizers(both, optimizer, scheduler).startswith(
        "the Trainer's given optimizer and scheduler (optimizers=...) will not be used: the DeepSpeed config's "
        "optimizer/scheduler section(s)")
    assert "given scheduler " in unused_given_optimizers({"scheduler": AUTO["scheduler"]}, optimizer, scheduler)
    assert unused_given_optimizers({"scheduler": AUTO["scheduler"]}, optimizer, None) is None  # DeepSpeed schedules it
    assert unused_given_optimizers({"zero_optimization": {"stage": 2}}, optimizer, scheduler) is None
    assert unused_given_optimizers(both, None, None) is None
