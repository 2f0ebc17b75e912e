"""The types of ``TrainingArguments``' fields: ``OptimizerNames``, ``ParallelMode``, ``AcceleratorConfig`` and the
log levels, with the ``metadata`` helper of a field's help text.

Below ``training_args.py`` (the field list) and the modules that parse and check the arguments
(``training_args_parsing.py``, ``training_args_checks.py``), which all read them; ``training_args`` re-exports them,
transformers' import path.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .trainer_utils import _StrEnum


class OptimizerNames(_StrEnum):
    """Names accepted by `TrainingArguments.optim` (same values as transformers).

    Membership is checked here; whether an optimizer's package is installed is checked when the
    optimizer is built.
    """

    ADAMW_TORCH = "adamw_torch"
    ADAMW_TORCH_FUSED = "adamw_torch_fused"
    ADAMW_TORCH_XLA = "adamw_torch_xla"
    ADAMW_TORCH_NPU_FUSED = "adamw_torch_npu_fused"
    ADAFACTOR = "adafactor"
    ADAMW_ANYPRECISION = "adamw_anyprecision"
    ADAMW_TORCH_4BIT = "adamw_torch_4bit"
    ADAMW_TORCH_8BIT = "adamw_torch_8bit"
    ADEMAMIX = "ademamix"
    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAMW_BNB = "adamw_bnb_8bit"
    ADAMW_8BIT = "adamw_8bit"  # same optimizer as adamw_bnb_8bit
    ADEMAMIX_8BIT = "ademamix_8bit"
    LION_8BIT = "lion_8bit"
    LION = "lion_32bit"
    PAGED_ADAMW = "paged_adamw_32bit"
    PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    PAGED_ADEMAMIX = "paged_ademamix_32bit"
    PAGED_ADEMAMIX_8BIT = "paged_ademamix_8bit"
    PAGED_LION = "paged_lion_32bit"
    PAGED_LION_8BIT = "paged_lion_8bit"
    RMSPROP = "rmsprop"
    RMSPROP_BNB = "rmsprop_bnb"
    RMSPROP_8BIT = "rmsprop_bnb_8bit"
    RMSPROP_32BIT = "rmsprop_bnb_32bit"
    GALORE_ADAMW = "galore_adamw"
    GALORE_ADAMW_8BIT = "galore_adamw_8bit"
    GALORE_ADAFACTOR = "galore_adafactor"
    GALORE_ADAMW_LAYERWISE = "galore_adamw_layerwise"
    GALORE_ADAMW_8BIT_LAYERWISE = "galore_adamw_8bit_layerwise"
    GALORE_ADAFACTOR_LAYERWISE = "galore_adafactor_layerwise"
    LOMO = "lomo"
    ADALOMO = "adalomo"
    GROKADAMW = "grokadamw"
    SCHEDULE_FREE_RADAM = "schedule_free_radam"
    SCHEDULE_FREE_ADAMW = "schedule_free_adamw"
    SCHEDULE_FREE_SGD = "schedule_free_sgd"
    APOLLO_ADAMW = "apollo_adamw"
    APOLLO_ADAMW_LAYERWISE = "apollo_adamw_layerwise"
    STABLE_ADAMW = "stable_adamw"


class ParallelMode(Enum):
    """How this run uses several devices (transformers' values; cadence runs one device per process)."""

    NOT_PARALLEL = "not_parallel"
    NOT_DISTRIBUTED = "not_distributed"
    DISTRIBUTED = "distributed"
    SAGEMAKER_MODEL_PARALLEL = "sagemaker_model_parallel"
    SAGEMAKER_DATA_PARALLEL = "sagemaker_data_parallel"
    TPU = "tpu"


# Level names accepted by log_level / log_level_replica; "passive" (-1) keeps the current level.
_LOG_LEVELS = {  # in transformers' order, which --help shows
    "detail": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "passive": -1,
}


def _help(text: str, **argparse_options: Any) -> dict[str, Any]:
    # Only argparse keywords may go in the metadata: HfArgumentParser passes it to add_argument.
    return {"help": text, **argparse_options}


@dataclass
class AcceleratorConfig:
    """``accelerator_config``'s options, transformers' ``AcceleratorConfig`` (same fields, defaults and methods).

    cadence builds its own data loading and accumulation, so each field is either honoured the way transformers'
    run behaves, or, where the value would break what cadence promises, refused before the first step naming why
    (``_ACCELERATOR_CONFIG_REFUSED``).

    Example:
        >>> TrainingArguments("out", accelerator_config={"non_blocking": True}).accelerator_config.non_blocking
        True
    """

    split_batches: bool = field(default=False, metadata=_help(
        "Split each dataloader batch over the processes (refused: cadence gives each process its own "
        "per_device_train_batch_size)."))
    dispatch_batches: bool | None = field(default=None, metadata=_help(
        "Iterate the dataloader on the main process only and send the batches (refused when True: each process "
        "reads its own shard)."))
    even_batches: bool = field(default=True, metadata=_help(
        "Repeat samples from the start so every process gets as many batches (False is refused)."))
    use_seedable_sampler: bool = field(default=True, metadata=_help(
        "A fully seedable random sampler (False is refused: cadence's order is seedable, for resume)."))
    non_blocking: bool = field(default=False, metadata=_help(
        "Move batches to the device with non_blocking copies (best with dataloader_pin_memory)."))
    gradient_accumulation_kwargs: dict | None = field(default=None, metadata=_help(
        "accelerate's GradientAccumulationPlugin options: num_steps (used as gradient_accumulation_steps when that "
        "is 1) and sync_each_batch (all-reduce the gradients of every micro-batch); adjust_scheduler and "
        "sync_with_dataloader are accepted and, as in transformers, have no effect."))
    use_configured_state: bool = field(default=False, metadata=_help(
        "Use the accelerate PartialState/AcceleratorState created before the arguments."))

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike) -> AcceleratorConfig:
        """The config in a JSON file; unknown keys are an error."""
        with open(json_file, encoding="utf-8") as f:
            config = json.load(f)
        unknown = sorted(k for k in config if k not in cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"accelerator_config={os.fspath(json_file)!r} is invalid: the file has unknown keys "
                             f"{unknown}; the keys are {sorted(cls.__dataclass_fields__)}")
        return cls(**config)

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def pop(self, key: str, default: Any = None) -> Any:
        return self.__dict__.pop(key, default)
