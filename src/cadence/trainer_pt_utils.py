"""Re-exports at the import path of ``transformers.trainer_pt_utils``, so users' imports keep working."""

from __future__ import annotations

import logging

from .data import (
    BatchRebalanceSampler,
    DistributedLengthGroupedSampler,
    DistributedSamplerWithLoop,
    IterableDatasetShard,
    LengthGroupedSampler,
    ShardSampler,
)
from .data import length_grouped_indices as get_length_grouped_indices
from .evaluation import EvalLoopContainer, nested_concat, numpy_pad_and_concatenate, torch_pad_and_concatenate
from .loss import LabelSmoother
from .optimization import get_parameter_names
from .training_args import AcceleratorConfig

logger = logging.getLogger(__name__)

# transformers defines these Trainer methods here as functions of `self`; they are the Trainer's own.
_TRAINER_METHODS = ("get_learning_rates", "get_num_trainable_parameters", "get_optimizer_group", "log_metrics",
                    "metrics_format", "save_metrics", "save_state")


def __getattr__(name: str):
    if name in _TRAINER_METHODS:  # read on first use: importing this module does not import the Trainer
        from .trainer import Trainer

        return getattr(Trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    *_TRAINER_METHODS,
    "AcceleratorConfig",
    "BatchRebalanceSampler",
    "DistributedLengthGroupedSampler",
    "DistributedSamplerWithLoop",
    "EvalLoopContainer",
    "IterableDatasetShard",
    "LabelSmoother",
    "LengthGroupedSampler",
    "ShardSampler",
    "get_length_grouped_indices",
    "get_parameter_names",
    "nested_concat",
    "numpy_pad_and_concatenate",
    "torch_pad_and_concatenate",
]
