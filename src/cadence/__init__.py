"""cadence: a PyTorch training and evaluation loop with the API of ``transformers.Trainer``.

Public names are imported on first use, so ``import cadence`` costs almost nothing over ``import torch``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .version import __version__

_EXPORTS = {
    "Trainer": "trainer",
    "TrainingArguments": "training_args",
    "Seq2SeqTrainer": "trainer_seq2seq",
    "Seq2SeqTrainingArguments": "training_args_seq2seq",
    "OptimizerNames": "training_args",
    "TrainerCallback": "trainer_callback",
    "TrainerState": "trainer_callback",
    "TrainerControl": "trainer_callback",
    "CallbackHandler": "trainer_callback",
    "DefaultFlowCallback": "trainer_callback",
    "ProgressCallback": "trainer_callback",
    "PrinterCallback": "trainer_callback",
    "EarlyStoppingCallback": "trainer_callback",
    "EvalPrediction": "trainer_utils",
    "PredictionOutput": "trainer_utils",
    "TrainOutput": "trainer_utils",
    "EvalLoopOutput": "trainer_utils",
    "IntervalStrategy": "trainer_utils",
    "SaveStrategy": "trainer_utils",
    "SchedulerType": "trainer_utils",
    "set_seed": "trainer_utils",
    "get_last_checkpoint": "trainer_utils",
    "find_executable_batch_size": "trainer_utils",
    "default_data_collator": "data",
    "DefaultDataCollator": "data",
    "DataCollatorWithPadding": "data",
    "get_scheduler": "optimization",
    **{name: "optimization" for name in (  # every get_*_schedule* function transformers exports at its top level
        "get_constant_schedule", "get_constant_schedule_with_warmup", "get_cosine_schedule_with_warmup",
        "get_cosine_with_hard_restarts_schedule_with_warmup", "get_cosine_with_min_lr_schedule_with_warmup",
        "get_cosine_with_min_lr_schedule_with_warmup_lr_rate", "get_greedy_schedule", "get_inverse_sqrt_schedule",
        "get_linear_schedule_with_warmup", "get_polynomial_decay_schedule_with_warmup",
        "get_reduce_on_plateau_schedule", "get_wsd_schedule", "get_adafactor_schedule")},
    "Adafactor": "optimization",
    "patch_transformers": "patch",  # TRL / sentence-transformers on cadence: call before importing them
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cadence' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:  # for editors and type checkers only
    from .data import DataCollatorWithPadding, DefaultDataCollator, default_data_collator
    from .optimization import Adafactor, get_scheduler
    from .patch import patch_transformers
    from .trainer import Trainer
    from .trainer_seq2seq import Seq2SeqTrainer
    from .trainer_callback import (
        DefaultFlowCallback,
        EarlyStoppingCallback,
        TrainerCallback,
        TrainerControl,
        TrainerState,
    )
    from .trainer_utils import EvalPrediction, PredictionOutput, TrainOutput, set_seed
    from .training_args import TrainingArguments
    from .training_args_seq2seq import Seq2SeqTrainingArguments
