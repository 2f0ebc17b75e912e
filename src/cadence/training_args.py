"""`TrainingArguments`: every option of `transformers.TrainingArguments` (5.x), same names and defaults.

How to read this module:
- the fields, grouped as in HF, each with its help text on the field;
- the 4.x spellings users still write (`evaluation_strategy`, `warmup_ratio`, ...), accepted as
  aliases: resolved into their 5.x names in `__post_init__`, never in `to_dict()`;
- `__post_init__` runs short named steps in a fixed order: resolve input forms -> convert names to
  enums -> derive HF's defaults -> validate values -> validate combinations -> refuse what cadence
  does not do yet (`_NOT_YET_BUILT`, one line per feature: delete the line when the feature lands);
- derived properties (`device`, `world_size`, `should_save`, ...) and serialisation (`to_dict`, ...).

Every ValueError names the field, the bad value and the fix. Nothing is silently ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import json
import logging
import math
import os
import sys
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from typing import Any, Literal

import numpy as np
import torch

from .trainer_utils import HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType, _StrEnum

logger = logging.getLogger(__name__)


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


def _default_optim() -> str:
    # HF's rule: the fused AdamW kernel (CPU and CUDA) is the default from torch 2.8 on.
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return "adamw_torch_fused" if (major, minor) >= (2, 8) else "adamw_torch"


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


# transformers' verbosity as cadence last saw it (its default, then what a Trainer's log_level set or "passive"
# followed). A change since, by transformers.logging.set_verbosity_*(), is the current level "passive" keeps: a
# script's transformers verbosity reaches cadence's loggers as it reaches transformers' Trainer.
_transformers_verbosity_seen = logging.WARNING


def _transformers_logging():
    return sys.modules.get("transformers.utils.logging")  # only when the user loaded it: no import here


def _current_log_level() -> int:
    """The level "passive" keeps: the ``cadence`` logger's, or transformers' verbosity where a script changed it."""
    own = logging.getLogger("cadence").getEffectiveLevel()
    hf = _transformers_logging()
    if hf is None or hf.get_verbosity() == _transformers_verbosity_seen:
        return own
    return hf.get_verbosity()


def set_process_log_level(args: TrainingArguments) -> None:
    """What transformers' Trainer does with ``log_level`` when it is built: this process's level
    (``args.get_process_log_level()``) on cadence's logger tree, and on transformers' when transformers is loaded (its
    verbosity, as transformers' Trainer sets it). ``transformers.logging.set_verbosity_*()`` afterwards reaches
    cadence's loggers at the next Trainer, as it reaches transformers' (a later Trainer with ``log_level="passive"``
    keeps the level, as in transformers).

    Example:
        >>> set_process_log_level(TrainingArguments("out", log_level="error"))
        >>> logging.getLogger("cadence").level == logging.ERROR
        True
    """
    global _transformers_verbosity_seen
    level = args.get_process_log_level()
    logging.getLogger("cadence").setLevel(level)
    hf = _transformers_logging()
    if hf is not None:
        named = _LOG_LEVELS[args.log_level if args.should_log else args.log_level_replica] != -1
        if named:
            hf.set_verbosity(level)
        _transformers_verbosity_seen = hf.get_verbosity()


# The help text's end for a field whose feature is in _NOT_YET_BUILT (a value other than the default is refused).
_NOT_BUILT = " Not built in cadence: setting it raises a ValueError."


def _help(text: str, **argparse_options: Any) -> dict[str, Any]:
    # Only argparse keywords may go in the metadata: HfArgumentParser passes it to add_argument.
    return {"help": text, **argparse_options}


def _help_4x(text: str, **argparse_options: Any) -> dict[str, Any]:
    # A transformers 4.x spelling: still accepted on a command line, but left out of --help, which lists the options
    # of transformers 5 as its own --help does. `text` says what the field does, for readers of this module.
    return {"help": argparse.SUPPRESS, **argparse_options}


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


@dataclass
class TrainingArguments:
    """Every option of a training run, with the names and defaults of `transformers.TrainingArguments`.

    Example:
        >>> args = TrainingArguments("out", learning_rate=1e-4, eval_strategy="steps", eval_steps=50)
        >>> args.eval_strategy == "steps", args.train_batch_size
        (True, 8)
    """

    # Fields that may arrive as a JSON object string (from a command line); a subclass extends the list, as TRL's
    # configs do (`_VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + ["model_init_kwargs"]`).
    _VALID_DICT_FIELDS = [
        "accelerator_config",
        "fsdp_config",
        "deepspeed",
        "activation_checkpointing_kwargs",
        "gradient_checkpointing_kwargs",
        "lr_scheduler_kwargs",
    ]

    # --- Output ---
    output_dir: str | None = field(
        default=None,
        metadata=_help("Folder for checkpoints and final outputs. None means 'trainer_output'."),
    )

    # --- Training length and learning-rate schedule ---
    per_device_train_batch_size: int = field(default=8, metadata=_help("Training examples per batch on each process."))
    num_train_epochs: float = field(
        default=3.0, metadata=_help("Passes over the training data; a fraction stops part-way through the last one.")
    )
    max_steps: int = field(
        default=-1,
        metadata=_help("Total optimizer steps. A positive value overrides num_train_epochs; -1 means unset."),
    )
    learning_rate: float = field(default=5e-5, metadata=_help("Peak learning rate (reached after warmup)."))
    lr_scheduler_type: SchedulerType | str = field(
        default="linear", metadata=_help("Learning-rate schedule name; see SchedulerType for the choices.")
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default=None,
        metadata=_help("Extra keyword arguments for the schedule, as a dict or a JSON object string."),
    )
    warmup_steps: float = field(
        default=0,
        metadata=_help(
            "Linear warmup from 0 to learning_rate: a whole number of steps, or a fraction in [0, 1) of the "
            "total steps."
        ),
    )

    # --- Optimizer ---
    optim: OptimizerNames | str = field(
        default=_default_optim(),
        metadata=_help("Optimizer name; see OptimizerNames. Default: adamw_torch_fused on torch>=2.8."),
    )
    optim_args: str | None = field(
        default=None, metadata=_help("Extra optimizer options as 'key=value,key2=value2'.")
    )
    weight_decay: float = field(
        default=0.0, metadata=_help("Decoupled weight decay; biases and normalisation weights never decay.")
    )
    adam_beta1: float = field(default=0.9, metadata=_help("Adam's decay rate of the first-moment average."))
    adam_beta2: float = field(default=0.999, metadata=_help("Adam's decay rate of the second-moment average."))
    adam_epsilon: float = field(default=1e-8, metadata=_help("Adam's denominator term that avoids dividing by 0."))
    optim_target_modules: None | str | list[str] = field(
        default=None,
        metadata=_help("The nn.Linear modules whose weights GaLore/APOLLO optimizers project: a regex string, a list "
                       "of names, substrings or regexes, or 'all-linear'."),
    )

    # --- Gradients ---
    gradient_accumulation_steps: int = field(
        default=1,
        metadata=_help(
            "Batches whose gradients add up before each optimizer step. Effective batch = per-device batch x "
            "processes x this."
        ),
    )
    average_tokens_across_devices: bool = field(
        default=True,
        metadata=_help(
            "Normalise the loss by the item count of all processes. Always on in cadence (False is refused): "
            "it is what makes N processes train like one."
        ),
    )
    max_grad_norm: float = field(
        default=1.0, metadata=_help("Clip the global gradient norm to this value; 0 or None disables clipping.")
    )
    label_smoothing_factor: float = field(
        default=0.0, metadata=_help("Label smoothing epsilon in [0, 1); 0 disables it.")
    )

    # --- Precision ---
    bf16: bool = field(
        default=False,
        metadata=_help("Run forward and loss under bfloat16 autocast (weights stay float32); CPU or Ampere+ GPU."),
    )
    fp16: bool = field(
        default=False,
        metadata=_help(
            "Run forward and loss under float16 autocast with loss scaling; steps with inf/NaN gradients are "
            "skipped (the schedule does not advance) and logged as skipped_optimizer_steps."
        ),
    )
    bf16_full_eval: bool = field(
        default=False,
        metadata=_help("Evaluate outside train() with the model cast, in place, to bfloat16 (less memory)."),
    )
    fp16_full_eval: bool = field(
        default=False,
        metadata=_help("Evaluate outside train() with the model cast, in place, to float16 (less memory)."),
    )
    tf32: bool | None = field(
        default=None,
        metadata=_help(
            "Turn TF32 matmuls on (True; needs a CUDA GPU of capability >= 8, else an error) or off (False; "
            "nothing to do on a CPU). None leaves torch's setting."
        ),
    )

    # --- Activation checkpointing ---
    activation_checkpointing: bool | None = field(
        default=None,
        metadata=_help(
            "Recompute activations in backward to save memory: through the model's activation_checkpointing_enable"
            "/gradient_checkpointing_enable, or the blocks a plain module lists in its checkpoint_modules attribute.",
            nargs="?",
            const=True,
        ),
    )
    activation_checkpointing_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Options for activation checkpointing, as a dict or JSON object string.")
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata=_help(
            "Older name of activation_checkpointing (used when that is unset, then mirrors it).",
            nargs="?",
            const=True,
        ),
    )
    gradient_checkpointing_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata=_help("Older name of activation_checkpointing_kwargs.")
    )

    # --- Compilation and kernels ---
    torch_compile: bool = field(
        default=False,
        metadata=_help(
            "Compile the model in place (nn.Module.compile, dynamic shapes: one compilation however batches are "
            "padded); state-dict keys and checkpoints stay those of the plain model."
        ),
    )
    torch_compile_backend: str | None = field(
        default=None, metadata=_help("torch.compile backend (default inductor); setting it implies torch_compile.")
    )
    torch_compile_mode: str | None = field(
        default=None, metadata=_help("torch.compile mode (e.g. 'reduce-overhead'); setting it implies torch_compile.")
    )
    use_liger_kernel: bool = field(
        default=False,
        metadata=_help(
            "Patch the model with liger-kernel's Triton kernels at the start of train() (RMSNorm, RoPE, SwiGLU, fused "
            "linear cross-entropy, ... for the model types liger supports); needs a GPU and pip install liger-kernel."
        ),
    )
    liger_kernel_config: dict[str, bool] | None = field(
        default=None,
        metadata=_help(
            "Which Liger kernels to apply, e.g. {'rms_norm': False}; passed to liger's patch function for the model "
            "type (None: liger's defaults). Only read with use_liger_kernel."
        ),
    )

    # --- Other model-side options ---
    use_cache: bool = field(
        default=False, metadata=_help("Keep the model's key/value cache on during training (rarely needed).")
    )
    neftune_noise_alpha: float | None = field(
        default=None,
        metadata=_help(
            "NEFTune: add uniform noise of scale alpha/sqrt(seq_len*hidden) to the input embeddings in training "
            "forwards only (needs model.get_input_embeddings()); removed when train() ends."
        ),
    )
    torch_empty_cache_steps: int | None = field(
        default=None,
        metadata=_help("Call the device's empty_cache() every this many steps (lower peak memory, slower)."),
    )
    auto_find_batch_size: bool = field(
        default=False,
        metadata=_help(
            "After an out-of-memory error, cut each batch into micro-batches a tenth smaller (64 -> 57 -> 51 ..., as "
            "transformers shrinks the batch; the global batch stays the same) and redo the step; in evaluation, "
            "make the eval batch 10% smaller. One process only."
        ),
    )

    # --- Logging ---
    logging_strategy: IntervalStrategy | str = field(
        default="steps", metadata=_help("When to log: 'no', 'steps' (every logging_steps) or 'epoch'.")
    )
    logging_steps: float = field(
        default=500,
        metadata=_help("Log every this many optimizer steps; a fraction in (0, 1) is a share of the total steps."),
    )
    logging_first_step: bool = field(default=False, metadata=_help("Also log after the very first optimizer step."))
    log_on_each_node: bool = field(
        default=True, metadata=_help("In multi-node runs, log from the first process of every node, not only node 0.")
    )
    logging_nan_inf_filter: bool = field(
        default=True,
        metadata=_help("Leave NaN/inf step losses out of the logged average (they are still counted and reported)."),
    )
    include_num_input_tokens_seen: str | bool = field(
        default="no",
        metadata=_help(
            "Count input tokens into state.num_input_tokens_seen and train_tokens_per_second: 'no', 'all' or "
            "'non_padding' (True means 'all')."
        ),
    )
    log_level: str = field(
        default="passive",
        metadata=_help(
            "Log level of the main process: debug, info, warning, error, critical, or passive (leave as set).",
            choices=list(_LOG_LEVELS),
        ),
    )
    log_level_replica: str = field(
        default="warning",
        metadata=_help("Log level of the other processes; same names as log_level.", choices=list(_LOG_LEVELS)),
    )
    disable_tqdm: bool | None = field(
        default=None, metadata=_help("Hide progress bars. None: hide them when cadence's log level is above warning.")
    )

    # --- Experiment tracking ---
    report_to: None | str | list[str] = field(
        default="none",
        metadata=_help("Reporting integrations: 'none', 'all' installed ones, or a list of names."),
    )
    run_name: str | None = field(default=None, metadata=_help("A name for the run, shown by reporting tools."))
    project: str = field(default="huggingface", metadata=_help("Project name for Trackio reporting."))
    trackio_space_id: str | None = field(
        default=None, metadata=_help("Hugging Face Space that hosts a live Trackio dashboard; only used by Trackio.")
    )
    trackio_bucket_id: str | None = field(
        default=None, metadata=_help("Hugging Face Bucket for Trackio data; only used by Trackio.")
    )
    trackio_static_space_id: str | None | Literal[False] = field(
        default=None, metadata=_help("Read-only Trackio Space for stable links (False: none); only used by Trackio.")
    )

    # --- Evaluation ---
    eval_strategy: IntervalStrategy | str = field(
        default="no", metadata=_help("When to evaluate: 'no', 'steps' (every eval_steps) or 'epoch'.")
    )
    eval_steps: float | None = field(
        default=None,
        metadata=_help(
            "Evaluate every this many steps with eval_strategy='steps'; a fraction in (0, 1) is a share of the "
            "total steps. None: use logging_steps."
        ),
    )
    eval_delay: float = field(
        default=0, metadata=_help("Epochs or steps (per eval_strategy) to wait before the first evaluation.")
    )
    per_device_eval_batch_size: int = field(default=8, metadata=_help("Evaluation examples per batch on each process."))
    prediction_loss_only: bool = field(
        default=False, metadata=_help("During evaluation and prediction, compute the loss only.")
    )
    eval_on_start: bool = field(default=False, metadata=_help("Evaluate once before the first training step."))
    eval_do_concat_batches: bool = field(
        default=True,
        metadata=_help("Concatenate predictions across batches (False: a list with one entry per batch)."),
    )
    eval_use_gather_object: bool = field(
        default=False,
        metadata=_help(
            "Gather every output from all processes as Python objects (pickled), tensors too; non-tensor outputs "
            "(a list of strings per batch, ...) are gathered so whether or not this is set."
        ),
    )
    eval_accumulation_steps: int | None = field(
        default=None,
        metadata=_help("Move predictions off the device every this many eval batches (None: keep all on device)."),
    )
    include_for_metrics: list[str] = field(
        default_factory=list,
        metadata=_help("Extra data for compute_metrics: 'inputs' (EvalPrediction.inputs) and/or 'loss' (.losses)."),
    )
    batch_eval_metrics: bool = field(
        default=False, metadata=_help("Call compute_metrics on every batch (compute_result=True on the last) instead of once at the end.")
    )

    # --- Checkpoints ---
    save_only_model: bool = field(
        default=False,
        metadata=_help(
            "Save the model weights only (no optimizer, scheduler or RNG state): such checkpoints cannot resume "
            "training."
        ),
    )
    save_strategy: SaveStrategy | str = field(
        default="steps",
        metadata=_help("When to save: 'no', 'steps' (every save_steps), 'epoch' or 'best' (when an evaluation improves)."),
    )
    save_steps: float = field(
        default=500,
        metadata=_help("Save every this many steps with save_strategy='steps'; a fraction in (0, 1) is a share; 0 saves "
                       "only when training ends."),
    )
    save_on_each_node: bool = field(
        default=False,
        metadata=_help("In multi-node runs, save from every node (for nodes that do not share a filesystem)."),
    )
    save_total_limit: int | None = field(
        default=None,
        metadata=_help(
            "Keep at most this many checkpoints (the newest and the best are always kept). None: all. The disk needs "
            "room for one more: the oldest is deleted only after the new checkpoint is complete."
        ),
    )
    enable_jit_checkpoint: bool = field(
        default=False,
        metadata=_help(
            "On SIGTERM or SIGUSR1 (SLURM's warning signal), save a checkpoint at the next step end and stop training "
            "(train() returns). Off by default, as in transformers."
        ),
    )

    # --- Hugging Face Hub (only read when push_to_hub=True) ---
    push_to_hub: bool = field(default=False, metadata=_help("Upload the model to the Hub on save (see hub_strategy)."))
    hub_token: str | None = field(default=None, metadata=_help("Hub access token; masked in to_dict()."))
    hub_private_repo: bool | None = field(default=None, metadata=_help("Create the Hub repository as private."))
    hub_model_id: str | None = field(
        default=None, metadata=_help("Hub repository to push to (default: named after output_dir).")
    )
    hub_strategy: HubStrategy | str = field(
        default="every_save", metadata=_help("What to push and when: end, every_save, checkpoint or all_checkpoints.")
    )
    hub_always_push: bool = field(default=False, metadata=_help("Push even while a previous push is still running."))
    hub_revision: str | None = field(default=None, metadata=_help("Hub branch or revision to push to."))

    # --- Best model ---
    load_best_model_at_end: bool = field(
        default=False,
        metadata=_help("Reload the best checkpoint (by metric_for_best_model) when training ends."),
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata=_help("Metric that picks the best checkpoint ('eval_' prefix optional). Default 'loss' when needed."),
    )
    greater_is_better: bool | None = field(
        default=None,
        metadata=_help("Whether a larger metric is better. None: False for names ending in 'loss', else True."),
    )

    # --- Resuming ---
    ignore_data_skip: bool = field(
        default=False,
        metadata=_help("On resume, restart the checkpoint's epoch from its first batch instead of skipping the trained ones."),
    )
    restore_callback_states_from_checkpoint: bool = field(
        default=False, metadata=_help("On resume, restore the saved state of stateful callbacks (e.g. early-stopping patience).")
    )

    # --- Reproducibility ---
    full_determinism: bool = field(
        default=False,
        metadata=_help("Seed everything and use deterministic torch kernels (bitwise repeatable, slower)."),
    )
    seed: int = field(default=42, metadata=_help("Seed set at the start of training (python, numpy, torch)."))
    data_seed: int | None = field(default=None, metadata=_help("Seed of the data sampler. None: use seed."))

    # --- Devices and distribution ---
    use_cpu: bool = field(default=False, metadata=_help("Run on the CPU even when a GPU is available."))
    accelerator_config: dict | str | AcceleratorConfig | None = field(
        default=None,
        metadata=_help("accelerate's Accelerator options: a dict, JSON string, JSON file path or AcceleratorConfig "
                       "(split_batches, dispatch_batches, even_batches, use_seedable_sampler, non_blocking, "
                       "gradient_accumulation_kwargs, use_configured_state); made an AcceleratorConfig."),
    )
    parallelism_config: Any | None = field(
        default=None, metadata=_help("accelerate ParallelismConfig: dp_replicate_size x dp_shard_size x tp_size "
                                     "(TP, FSDP x TP, HSDP); a model loaded with tp_plan sets tp_size itself.")
    )

    # --- Data loading ---
    dataloader_drop_last: bool = field(
        default=False, metadata=_help("Drop the last training batch when it is smaller than the batch size.")
    )
    dataloader_num_workers: int = field(
        default=0, metadata=_help("Worker processes that load data; 0 loads in the main process.")
    )
    dataloader_pin_memory: bool = field(
        default=True, metadata=_help("Load batches into pinned memory for faster copies to the GPU.")
    )
    dataloader_persistent_workers: bool = field(
        default=False, metadata=_help("Keep data workers alive between epochs (faster, uses more memory).")
    )
    dataloader_prefetch_factor: int | None = field(
        default=None, metadata=_help("Batches each worker loads ahead; needs dataloader_num_workers > 0.")
    )
    dataloader_multiprocessing_context: str | None = field(
        default=None,
        metadata=_help("Start method of data workers: 'fork', 'spawn' or 'forkserver'. None: default.",
                       choices=["fork", "spawn", "forkserver"]),
    )
    dataloader_in_order: bool = field(
        default=True, metadata=_help("Yield batches in sampler order (False: as soon as any worker has one).")
    )
    remove_unused_columns: bool = field(
        default=True, metadata=_help("Drop dataset columns that the model's forward() does not accept.")
    )
    label_names: list[str] | None = field(
        default=None, metadata=_help("Input keys that hold labels. None: 'labels' and the like, from the model.")
    )
    train_sampling_strategy: str = field(
        default="random",
        metadata=_help(
            "Training sampler: 'random', 'sequential', 'group_by_length' (samples of similar length batched "
            "together) or 'batch_rebalance' (micro-batches of balanced padded-token cost across processes and "
            "accumulation steps: transformers' BatchRebalanceSampler, seeded by data_seed or seed).",
            choices=["random", "sequential", "group_by_length", "batch_rebalance"],
        ),
    )
    length_column_name: str = field(
        default="length", metadata=_help("Column of precomputed lengths, read by the length-grouped samplers.")
    )

    # --- DistributedDataParallel ---
    ddp_find_unused_parameters: bool | None = field(
        default=None, metadata=_help("DDP's find_unused_parameters. None: decided from the model.")
    )
    ddp_bucket_cap_mb: int | None = field(default=None, metadata=_help("DDP's gradient bucket size in MB."))
    ddp_broadcast_buffers: bool | None = field(
        default=None, metadata=_help("DDP's broadcast_buffers. None: decided from the model.")
    )
    ddp_static_graph: bool | None = field(default=None, metadata=_help("DDP's static_graph option."))
    ddp_backend: str | None = field(
        default=None,
        metadata=_help("torch.distributed backend, e.g. 'nccl' or 'gloo'. None: the device's default.",
                       choices=["nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl"]),  # transformers' list
    )
    ddp_timeout: int = field(default=1800, metadata=_help("Seconds before a collective operation times out."))

    # --- FSDP / DeepSpeed ---
    fsdp: str | None = field(
        default=None,
        metadata=_help(
            "FSDP2 (torch's fully_shard) with several processes, space-separated: one of 'full_shard', "
            "'shard_grad_op', 'hybrid_shard', 'hybrid_shard_zero2', plus 'offload' (parameters on the CPU) and "
            "'auto_wrap' (shard each transformer layer separately)."
        ),
    )
    fsdp_config: dict[str, Any] | str | None = field(
        default=None,
        metadata=_help(
            "FSDP options (dict, JSON string or file): version (2), transformer_layer_cls_to_wrap (default: the "
            "model's _no_split_modules), min_num_params, reshard_after_forward, cpu_offload, activation_checkpointing, "
            "state_dict_type ('FULL_STATE_DICT': model.safetensors on the main process; 'SHARDED_STATE_DICT': "
            "one shard per process), cpu_ram_efficient_loading."
        ),
    )
    deepspeed: dict | str | None = field(
        default=None,
        metadata=_help(
            "DeepSpeed configuration (dict, JSON string or file; ZeRO stage 1/2/3), run wherever DeepSpeed runs "
            "(tested on the CPU: its CPU accelerator, gloo); "
            "'auto' values are filled from these arguments as transformers fills them."
        ),
    )

    # --- Debugging ---
    debug: str | list[str] = field(
        default="",
        metadata=_help(
            "Debug features, space-separated: 'underflow_overflow' stops training at the first module whose "
            "forward produces inf/NaN and names it ('tpu_metrics_debug' is not built: cadence has no TPU support)."
        ),
    )
    skip_memory_metrics: bool = field(
        default=True, metadata=_help("Do not add memory-usage numbers to the metrics (measuring them is slow).")
    )

    # --- Script switches (read by user scripts, not by the Trainer) ---
    do_train: bool = field(default=False, metadata=_help("For your script: whether to train."))
    do_eval: bool = field(
        default=False, metadata=_help("For your script: whether to evaluate. Set True when eval_strategy is not 'no'.")
    )
    do_predict: bool = field(default=False, metadata=_help("For your script: whether to predict."))
    resume_from_checkpoint: str | None = field(
        default=None, metadata=_help("For your script: a checkpoint to pass to trainer.train().")
    )
    local_rank: int = field(
        default=-1, metadata=_help("Set by old launchers; read local_process_index instead.")
    )

    # --- transformers 4.x spellings: resolved into their 5.x names, absent from to_dict() and from --help ---
    evaluation_strategy: IntervalStrategy | str | None = field(
        default=None, metadata=_help_4x("4.x name of eval_strategy.")
    )
    warmup_ratio: float | None = field(
        default=None, metadata=_help_4x("4.x spelling: a fraction in [0, 1) of the total steps, stored in warmup_steps.")
    )
    group_by_length: bool | None = field(
        default=None,
        metadata=_help_4x("4.x spelling of train_sampling_strategy='group_by_length'.", nargs="?", const=True),
    )
    no_cuda: bool | None = field(default=None, metadata=_help_4x("4.x name of use_cpu.", nargs="?", const=True))
    include_inputs_for_metrics: bool | None = field(
        default=None,
        metadata=_help_4x("4.x spelling of include_for_metrics=['inputs'].", nargs="?", const=True),
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata=_help_4x(
            "4.x option (HF 5 dropped it): a new run (no resume_from_checkpoint) into an output_dir holding an "
            "earlier run's checkpoint-N folders keeps them (warned; this run's rotation leaves them alone) unless "
            "this is True, which deletes them and the earlier run's trainer_state.json/log_history.jsonl first."
        ),
    )
    save_safetensors: bool | None = field(
        default=True,
        metadata=_help_4x("4.x option: True is accepted; False is refused because cadence always writes safetensors."),
    )
    # --- transformers 4.x field kept as a real field (in to_dict; hidden from --help too) ---
    logging_dir: str | None = field(
        default=None,
        metadata=_help_4x(
            "Folder for TensorBoard event files. None: the TensorBoard callback picks $TENSORBOARD_LOGGING_DIR or "
            "output_dir/runs/<time>_<host> when it starts."
        ),
    )
    # --- cadence only (after transformers' fields: positional use stays the same) ---
    async_save: bool = field(
        default=True,
        metadata=_help(
            "Write checkpoints in the background: at a save step training waits only while the state "
            "is copied to CPU memory; one thread writes, hashes, fsyncs and renames the folder while training goes "
            "on (one save in flight; train()'s end, the best-model load, save_model, a resume and the process exit "
            "wait for it; its errors are raised at the next step). False: synchronous saves, as before."
        ),
    )

    def __post_init__(self):
        # 1. Resolve input forms: text for bools and numbers, 4.x aliases, None/str/bool shorthands, JSON strings.
        _parse_text_values(self)
        _resolve_aliases(self)
        _resolve_output_dir(self)
        _parse_json_dict_fields(self)
        _resolve_checkpointing_names(self)
        _normalise_shorthands(self)
        _normalise_report_to(self)
        # 2. Names -> enums (unknown names are reported with the valid ones).
        _convert_enums(self)
        # 3. HF's derived defaults.
        _derive_eval_steps(self)
        _derive_best_model_metric(self)
        _derive_simple_defaults(self)
        _derive_torch_compile(self)
        # 4. Single values.
        _check_finite(self)
        _check_value_rules(self)
        _warn_odd_values(self)
        _check_choices(self)
        _check_step_intervals(self)
        # 5. Combinations.
        _check_one_precision(self)
        _check_bf16_device(self)
        _check_debug(self)
        _check_best_model_strategies(self)
        _check_scheduler_needs_eval(self)
        _check_prefetch_needs_workers(self)
        _build_accelerator_config(self)
        # 6. What cadence does not do (yet): refused, never silently ignored.
        _refuse_from_table(self, _NOT_YET_BUILT, "is not built in cadence yet")
        _refuse_from_table(self, _REFUSED_BY_DESIGN, "is not supported by cadence")
        _refuse_unbuilt_integrations(self)
        # 7. Under a launcher: accelerate's process state, set up now as transformers' arguments set it up.
        _start_process_state(self)

    # ---------------------------------------------------------------------------------------
    # Derived properties
    # ---------------------------------------------------------------------------------------
    @property
    def train_batch_size(self) -> int:
        """Training batch size of one process (cadence never splits a batch over GPUs in one process)."""
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        """Evaluation batch size of one process."""
        return self.per_device_eval_batch_size

    @property
    def world_size(self) -> int:
        """Number of processes, from the launcher's WORLD_SIZE (1 when not launched distributed)."""
        return int(os.environ.get("WORLD_SIZE", 1))

    @property
    def process_index(self) -> int:
        """This process's global rank, from RANK (0 when not launched distributed)."""
        return int(os.environ.get("RANK", 0))

    @property
    def local_process_index(self) -> int:
        """This process's rank on its node, from LOCAL_RANK (0 when not launched distributed)."""
        return int(os.environ.get("LOCAL_RANK", 0))

    @functools.cached_property
    def device(self) -> torch.device:
        """`cpu` with use_cpu or without a GPU, else GPU `local_process_index` (`backend.default_device`). Computed once."""
        from .backend import default_device  # on first use: this module stays light to import

        return default_device(self.use_cpu, self.local_process_index)

    @functools.cached_property
    def distributed_state(self):
        """accelerate's ``PartialState`` of this process, with the run's ``ddp_backend``/``ddp_timeout`` (what
        transformers keeps here; TRL reads it). Created on first use."""
        from .backend import process_state  # on first use: this module stays light to import

        return process_state(self)

    @property
    def deepspeed_plugin(self):
        """accelerate's ``DeepSpeedPlugin`` for ``deepspeed`` (None without DeepSpeed), as transformers sets it."""
        if not self.deepspeed:
            return None
        if "_deepspeed_plugin" not in self.__dict__:
            from .backend import deepspeed_plugin

            self.__dict__["_deepspeed_plugin"] = deepspeed_plugin(self)
        return self.__dict__["_deepspeed_plugin"]

    @property
    def n_gpu(self) -> int:
        """GPUs used by this process: 0 on CPU, else 1 (one device per process, no DataParallel)."""
        return 0 if self.device.type == "cpu" else 1

    @property
    def parallel_mode(self) -> ParallelMode:
        """`DISTRIBUTED` with several processes (one device each), else `NOT_PARALLEL` (cadence never uses
        `nn.DataParallel`, so `NOT_DISTRIBUTED` does not occur)."""
        return ParallelMode.DISTRIBUTED if self.world_size > 1 else ParallelMode.NOT_PARALLEL

    @property
    def should_log(self) -> bool:
        """Whether this process logs: the first of each node with log_on_each_node, else global rank 0."""
        return (self.local_process_index if self.log_on_each_node else self.process_index) == 0

    @property
    def should_save(self) -> bool:
        """Whether this process writes files: the first of each node with save_on_each_node, else rank 0."""
        return (self.local_process_index if self.save_on_each_node else self.process_index) == 0

    @property
    def ddp_timeout_delta(self) -> timedelta:
        """`ddp_timeout` as the timedelta the process group expects."""
        return timedelta(seconds=self.ddp_timeout)

    def get_process_log_level(self) -> int:
        """The logging level for this process: log_level where should_log, else log_level_replica.

        Returns:
            A `logging` level number; "passive" gives the current level: the `cadence` logger's effective level
            (WARNING unless the application changed it), or transformers' verbosity when
            `transformers.logging.set_verbosity_*()` changed it since cadence last set or read it.
        """
        level = _LOG_LEVELS[self.log_level if self.should_log else self.log_level_replica]
        return _current_log_level() if level == -1 else level

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup length in optimizer steps.

        Args:
            num_training_steps: total optimizer steps of the run.

        Returns:
            `int(warmup_steps)` when warmup_steps >= 1, else `ceil(warmup_steps * num_training_steps)`.

        Example:
            >>> TrainingArguments(warmup_steps=0.1).get_warmup_steps(95)
            10
        """
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil(num_training_steps * self.warmup_steps)

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work"):
        """Run the block on the main process first, then on the others (e.g. `datasets.map`, whose cache
        the others then read). A real barrier across processes when there are several.

        Args:
            local: the first process of each node goes first (no shared filesystem); False: only global rank 0.
            desc: what the block does, for the debug log.

        Example:
            >>> with args.main_process_first(desc="tokenizing"):
            ...     dataset = dataset.map(tokenize, batched=True)
        """
        if self.world_size <= 1:
            yield
            return
        from .backend import main_process_first

        logger.debug("process %d: %s with the %s going first", self.process_index, desc,
                     "main process of each node" if local else "main process")
        with main_process_first(self, local):
            yield

    # ---------------------------------------------------------------------------------------
    # Fluent setters (transformers' names and defaults): each sets a group of fields, checks the
    # result as the constructor does, and returns self.
    # ---------------------------------------------------------------------------------------
    def _set(self, **fields: Any) -> TrainingArguments:
        for name, value in fields.items():
            setattr(self, name, value)
        self.__post_init__()  # the same checks and derived defaults as TrainingArguments(...)
        return self

    def set_training(self, learning_rate: float = 5e-5, batch_size: int = 8, weight_decay: float = 0,
                     num_epochs: float = 3, max_steps: int = -1, gradient_accumulation_steps: int = 1,
                     seed: int = 42, activation_checkpointing: bool = False,
                     gradient_checkpointing: bool | None = None) -> TrainingArguments:
        """The basic training options; sets `do_train=True`.

        Example:
            >>> TrainingArguments("out").set_training(learning_rate=1e-4, batch_size=32).per_device_train_batch_size
            32
        """
        checkpointing = activation_checkpointing if gradient_checkpointing is None else gradient_checkpointing
        return self._set(do_train=True, learning_rate=learning_rate, per_device_train_batch_size=batch_size,
                         weight_decay=weight_decay, num_train_epochs=num_epochs, max_steps=max_steps,
                         gradient_accumulation_steps=gradient_accumulation_steps, seed=seed,
                         activation_checkpointing=checkpointing, gradient_checkpointing=checkpointing)

    def set_evaluate(self, strategy: str | IntervalStrategy = "no", steps: int = 500, batch_size: int = 8,
                     accumulation_steps: int | None = None, delay: float | None = None,
                     loss_only: bool = False) -> TrainingArguments:
        """The evaluation options; `do_eval` follows the strategy. `delay=None` means no delay.

        Example:
            >>> TrainingArguments("out").set_evaluate(strategy="steps", steps=100).eval_steps
            100
        """
        _check_positive_steps(strategy, steps, "set_evaluate")
        return self._set(eval_strategy=strategy, do_eval=str(strategy) != "no", eval_steps=steps,
                         per_device_eval_batch_size=batch_size, eval_accumulation_steps=accumulation_steps,
                         eval_delay=0 if delay is None else delay, prediction_loss_only=loss_only)

    def set_testing(self, batch_size: int = 8, loss_only: bool = False) -> TrainingArguments:
        """The prediction options; sets `do_predict=True`."""
        return self._set(do_predict=True, per_device_eval_batch_size=batch_size, prediction_loss_only=loss_only)

    def set_save(self, strategy: str | IntervalStrategy = "steps", steps: int = 500, total_limit: int | None = None,
                 on_each_node: bool = False) -> TrainingArguments:
        """The checkpoint options.

        Example:
            >>> TrainingArguments("out").set_save(strategy="steps", steps=100).save_steps
            100
        """
        _check_positive_steps(strategy, steps, "set_save")
        return self._set(save_strategy=strategy, save_steps=steps, save_total_limit=total_limit,
                         save_on_each_node=on_each_node)

    def set_logging(self, strategy: str | IntervalStrategy = "steps", steps: int = 500, report_to: str | list[str] = "none",
                    level: str = "passive", first_step: bool = False, nan_inf_filter: bool = False,
                    on_each_node: bool = False, replica_level: str = "passive") -> TrainingArguments:
        """The logging options (transformers' setter defaults, e.g. `nan_inf_filter=False`).

        Example:
            >>> TrainingArguments("out").set_logging(strategy="steps", steps=100).logging_steps
            100
        """
        _check_positive_steps(strategy, steps, "set_logging")
        return self._set(logging_strategy=strategy, logging_steps=steps, report_to=report_to, log_level=level,
                         logging_first_step=first_step, logging_nan_inf_filter=nan_inf_filter,
                         log_on_each_node=on_each_node, log_level_replica=replica_level)

    def set_push_to_hub(self, model_id: str, strategy: str | HubStrategy = "every_save", token: str | None = None,
                        private_repo: bool | None = None, always_push: bool = False,
                        revision: str | None = None) -> TrainingArguments:
        """The Hub options; sets `push_to_hub=True`."""
        return self._set(push_to_hub=True, hub_model_id=model_id, hub_strategy=strategy, hub_token=token,
                         hub_private_repo=private_repo, hub_always_push=always_push, hub_revision=revision)

    def set_optimizer(self, name: str | OptimizerNames = "adamw_torch", learning_rate: float = 5e-5,
                      weight_decay: float = 0, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                      args: str | None = None) -> TrainingArguments:
        """The optimizer and its hyperparameters.

        Example:
            >>> TrainingArguments("out").set_optimizer(name="adamw_torch", beta1=0.8).adam_beta1
            0.8
        """
        return self._set(optim=name, learning_rate=learning_rate, weight_decay=weight_decay, adam_beta1=beta1,
                         adam_beta2=beta2, adam_epsilon=epsilon, optim_args=args)

    def set_lr_scheduler(self, name: str | SchedulerType = "linear", num_epochs: float = 3.0, max_steps: int = -1,
                         warmup_steps: float = 0) -> TrainingArguments:
        """The learning-rate schedule and the run length.

        Example:
            >>> TrainingArguments("out").set_lr_scheduler(name="cosine", warmup_steps=0.05).warmup_steps
            0.05
        """
        return self._set(lr_scheduler_type=name, num_train_epochs=num_epochs, max_steps=max_steps,
                         warmup_steps=warmup_steps)

    def set_dataloader(self, train_batch_size: int = 8, eval_batch_size: int = 8, drop_last: bool = False,
                       num_workers: int = 0, pin_memory: bool = True, persistent_workers: bool = False,
                       prefetch_factor: int | None = None, multiprocessing_context: str | None = None,
                       in_order: bool = True, auto_find_batch_size: bool = False, ignore_data_skip: bool = False,
                       sampler_seed: int | None = None) -> TrainingArguments:
        """The dataloader options.

        Example:
            >>> TrainingArguments("out").set_dataloader(train_batch_size=16, eval_batch_size=64).per_device_eval_batch_size
            64
        """
        return self._set(per_device_train_batch_size=train_batch_size, per_device_eval_batch_size=eval_batch_size,
                         dataloader_drop_last=drop_last, dataloader_num_workers=num_workers,
                         dataloader_pin_memory=pin_memory, dataloader_persistent_workers=persistent_workers,
                         dataloader_prefetch_factor=prefetch_factor,
                         dataloader_multiprocessing_context=multiprocessing_context, dataloader_in_order=in_order,
                         auto_find_batch_size=auto_find_batch_size, ignore_data_skip=ignore_data_skip,
                         data_seed=sampler_seed)

    # ---------------------------------------------------------------------------------------
    # Serialisation
    # ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The options as plain JSON-friendly values (enums as their names), tokens masked.

        4.x aliases are left out: they were resolved into their 5.x fields. Feeding the result back,
        `TrainingArguments(**args.to_dict())`, gives equal arguments.
        """
        d = {}
        for name in _dict_fields(type(self)):
            value = getattr(self, name)
            if name == "parallelism_config" and value is not None:  # accelerate's dataclass, as transformers writes it
                value = value.to_json() if hasattr(value, "to_json") else value
            elif isinstance(value, AcceleratorConfig):
                value = value.to_dict()
            elif type(value) not in _ATOMS:  # most are; the rest (enums, lists, dicts, dtypes) made plain
                value = _dtype_names(_plain(value))
            d[name] = value
        for name in _token_fields(type(self)):  # masked even when unset, as HF does: a dump never shows
            d[name] = f"<{name.upper()}>"  # whether a token exists
        return d

    @classmethod
    def from_checkpoint(cls, checkpoint: str | os.PathLike) -> TrainingArguments:
        """The arguments a checkpoint (or a ``save_model`` folder) was written with, as an object of this class.

        transformers pickles its ``TrainingArguments`` object into ``training_args.bin``, and
        ``torch.load(path, weights_only=False)`` gives it back, running whatever code a crafted file holds. cadence
        writes the plain ``to_dict()`` there instead (and in ``training_args.json``): ``torch.load`` of it gives a
        dict, safe to read; this method builds the object from it, checked as the constructor checks it.
        Access tokens are never written (``to_dict()`` masks them), so they come back as None.

        Args:
            checkpoint: a ``checkpoint-N`` folder, or any folder holding cadence's ``training_args.bin`` or
                ``training_args.json``.

        Returns:
            The arguments, equal to those of the run that wrote the folder (tokens aside). Call it on a subclass
            (e.g. ``Seq2SeqTrainingArguments`` or a TRL config) for its own fields.

        Raises:
            ValueError: the folder holds no arguments cadence can read (none, or transformers' pickled object,
                which cadence never unpickles).

        Example:
            >>> args = TrainingArguments.from_checkpoint("out/checkpoint-500")
            >>> args.learning_rate
            5e-05
        """
        from .checkpoint_io.formats import load_training_args  # only here: reading files is not this module's job

        saved = load_training_args(checkpoint)
        if saved is None:
            raise ValueError(
                f"checkpoint={os.fspath(checkpoint)!r} holds no arguments cadence can read: it needs cadence's "
                f"training_args.bin or training_args.json (a transformers checkpoint's training_args.bin is a pickled "
                f"object, never unpickled here; only if you trust the file, torch.load(path, weights_only=False) "
                f"reads it)"
            )
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(saved) - fields)
        if unknown:  # written by another class or version: its own options cannot be set here
            logger.warning("%s: options %s are not fields of %s; left out", os.fspath(checkpoint), unknown, cls.__name__)
        for name in _token_fields(cls):
            if saved.get(name) == f"<{name.upper()}>":
                saved[name] = None  # masked when written
        return cls(**{k: v for k, v in saved.items() if k in fields})

    def to_json_string(self) -> str:
        """`to_dict()` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """`to_dict()` plus the batch sizes, with anything not bool/int/float/str turned into a string
        (the form TensorBoard's hparams accept)."""
        d = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        return {k: v if type(v) in (bool, int, float, str, torch.Tensor) else str(v) for k, v in d.items()}

    def __str__(self) -> str:
        lines = "".join(f"  {k}={v!r},\n" for k, v in self.to_dict().items())
        return f"{type(self).__name__}(\n{lines})"

    def __repr__(self) -> str:
        # Only what differs from a default instance: 114 lines of defaults hide the interesting ones.
        defaults = _default_dict(type(self))
        changed = {k: v for k, v in self.to_dict().items() if k not in defaults or defaults[k] != v}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


# =============================================================================================
# The tables: aliases, value rules, refusals. Edit these, not the functions below.
# =============================================================================================
def _keep(name: str, value: Any) -> Any:
    return value


def _when_true(new_value: Any) -> Callable[[str, Any], Any]:
    # A 4.x boolean switch: True means new_value (a fresh copy: lists must not be shared between
    # instances); False was the 4.x default and says nothing.
    return lambda name, on: copy.deepcopy(new_value) if on else None


def _warmup_ratio_as_steps(name: str, ratio: Any) -> float:
    if not (_is_number(ratio) and 0 <= ratio < 1):
        raise _invalid(
            name, ratio, "a fraction in [0, 1)", "for warmup over the whole run pass warmup_steps=<total steps>"
        )
    return float(ratio)  # HF 5 reads a warmup_steps value below 1 as a ratio of the total steps


# 4.x name -> (5.x name, converter(name, value) -> 5.x value or None for "no opinion").
_ALIASES: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "evaluation_strategy": ("eval_strategy", _keep),
    "warmup_ratio": ("warmup_steps", _warmup_ratio_as_steps),
    "group_by_length": ("train_sampling_strategy", _when_true("group_by_length")),
    "no_cuda": ("use_cpu", _when_true(True)),
    "include_inputs_for_metrics": ("include_for_metrics", _when_true(["inputs"])),
}
# The 4.x names transformers deprecated before removing them, and how it said so (4.57 for no_cuda and
# include_inputs_for_metrics, 4.45 for evaluation_strategy): a FutureWarning, or a logged warning. warmup_ratio and
# group_by_length are plain options of 4.57, so they pass silently.
_DEPRECATED: dict[str, type[Warning] | None] = {
    "evaluation_strategy": FutureWarning, "no_cuda": FutureWarning, "include_inputs_for_metrics": None,
}
# Accepted, kept on the object, but not options of HF 5: left out of to_dict().
_LEGACY_ONLY = frozenset(_ALIASES) | {"overwrite_output_dir", "save_safetensors"}
# cadence's own options, which transformers.TrainingArguments does not have (in to_dict(), so saved with a checkpoint)
CADENCE_ONLY = frozenset({"async_save"})

_ENUM_FIELDS: dict[str, type[Enum]] = {
    "eval_strategy": IntervalStrategy,
    "logging_strategy": IntervalStrategy,
    "save_strategy": SaveStrategy,
    "hub_strategy": HubStrategy,
    "lr_scheduler_type": SchedulerType,
    "optim": OptimizerNames,
}



def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _at_least(low: float, integer: bool = False, optional: bool = False) -> Callable[[Any], bool]:
    is_kind = _is_int if integer else _is_number
    return lambda v: (optional and v is None) or (is_kind(v) and v >= low)


def _in_unit_interval(v: Any) -> bool:
    return _is_number(v) and 0 <= v < 1


def _is_warmup(v: Any) -> bool:
    # Whole steps (integral when >= 1, so 2.5 is not silently truncated) or a ratio below 1.
    return _is_number(v) and v >= 0 and (v < 1 or float(v).is_integer())


def _is_max_steps(v: Any) -> bool:
    return _is_int(v) and (v == -1 or v >= 1)


def _is_seed(v: Any) -> bool:
    return _is_int(v) and 0 <= v < 2**32  # numpy refuses seeds outside [0, 2**32)


# field -> (is_valid, what it must be, how to fix it)
_VALUE_RULES: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "learning_rate": (_at_least(0), ">= 0", "pass a positive learning rate such as 5e-5"),
    "weight_decay": (_is_number, "a number", "pass 0.0 for no decay or a small value such as 0.01"),
    "adam_beta1": (_in_unit_interval, "in [0, 1)", "the usual value is 0.9"),
    "adam_beta2": (_in_unit_interval, "in [0, 1)", "the usual value is 0.999"),
    "adam_epsilon": (_at_least(0), ">= 0", "the usual value is 1e-8"),
    "max_grad_norm": (lambda v: v is None or _is_number(v), "a number (<= 0 or None: no clipping)",
                      "pass 1.0, or 0 to disable"),
    "label_smoothing_factor": (_in_unit_interval, "in [0, 1)", "pass 0.0 to disable or a small value such as 0.1"),
    "gradient_accumulation_steps": (_at_least(1, integer=True), "an integer >= 1", "pass 1 for no accumulation"),
    "per_device_train_batch_size": (_at_least(1, integer=True), "an integer >= 1", "pass a batch size such as 8"),
    "per_device_eval_batch_size": (_at_least(1, integer=True), "an integer >= 1", "pass a batch size such as 8"),
    "num_train_epochs": (
        lambda v: _at_least(0)(v) and math.isfinite(v),
        "a finite number >= 0",
        "pass the number of passes over the data, such as 3 (for an open-ended run set max_steps instead)",
    ),
    "max_steps": (_is_max_steps, "an integer >= 1, or -1 for unset", "pass -1 to train for num_train_epochs"),
    "warmup_steps": (
        _is_warmup,
        "a whole number of steps >= 0 or a fraction in [0, 1) of the total steps",
        "pass e.g. warmup_steps=100 or warmup_steps=0.1",
    ),
    "eval_delay": (_at_least(0), ">= 0", "pass 0 to allow evaluation from the start"),
    "save_total_limit": (lambda v: v is None or _is_int(v), "None or an integer (<= 0: no limit)",
                         "pass None to keep every checkpoint"),
    "neftune_noise_alpha": (_at_least(0, optional=True), "None or >= 0", "pass None to add no noise, or e.g. 5.0"),
    "torch_empty_cache_steps": (_at_least(1, True, True), "None or an integer >= 1", "pass None to never empty it"),
    "eval_accumulation_steps": (_at_least(1, True, True), "None or an integer >= 1", "pass None to keep all"),
    "dataloader_num_workers": (_at_least(0, integer=True), "an integer >= 0", "pass 0 to load in the main process"),
    "dataloader_prefetch_factor": (_at_least(1, True, True), "None or an integer >= 1", "pass None or e.g. 2"),
    "seed": (_is_seed, "an integer in [0, 2**32)", "pass a seed such as 42"),
    "data_seed": (lambda v: v is None or _is_seed(v), "None or an integer in [0, 2**32)", "pass None to use seed"),
    "liger_kernel_config": (
        lambda v: v is None or (isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, bool) for k, x in v.items())),
        "None or a dict of Liger kernel names to True/False", "pass e.g. {'rms_norm': False, 'swiglu': True}",
    ),
}

# field -> (is it odd?, what cadence does with it): values transformers accepts that usually are a slip; warned.
_ODD_VALUES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "weight_decay": (lambda v: v < 0, "weights grow instead of decaying (transformers accepts it too)"),
    "max_grad_norm": (lambda v: v is not None and v < 0, "gradients are not clipped, as with 0"),
    "save_total_limit": (lambda v: v is not None and v <= 0, "every checkpoint is kept, as with None"),
}

# field -> the accepted values (fields that are plain strings, not enums, in HF).
_CHOICES: dict[str, tuple[str, ...]] = {
    "log_level": tuple(_LOG_LEVELS),
    "log_level_replica": tuple(_LOG_LEVELS),
    "train_sampling_strategy": ("random", "sequential", "group_by_length", "batch_rebalance"),
    "include_num_input_tokens_seen": ("no", "all", "non_padding"),
}

# (strategy field, its interval field): the interval is checked when the strategy is "steps".
_STEP_INTERVALS = (
    ("logging_strategy", "logging_steps"),
    ("eval_strategy", "eval_steps"),
    ("save_strategy", "save_steps"),
)

# Features cadence does not have yet. "field" is refused when set to a truthy value other than its
# default; "field=value" when it equals that value. When a feature lands, delete its line(s).
_NOT_YET_BUILT: dict[str, str] = {}  # empty since issue 29 built Liger kernels and batch_rebalance

# Settings cadence refuses on purpose, with the reason.
_REFUSED_BY_DESIGN: dict[str, str] = {
    "average_tokens_across_devices=False": (
        "cadence always divides the summed loss by the item count of all processes, so N processes train "
        "exactly like one; a per-process average would weight processes with fewer items more"
    ),
    "save_safetensors=False": (
        "cadence always writes weights as safetensors, whose loading cannot run code"
    ),
}

# =============================================================================================
# __post_init__ steps, in the order they run.
# =============================================================================================
def _invalid(name: str, value: Any, rule: str, fix: str) -> ValueError:
    return ValueError(f"{name}={value!r} is invalid: it must be {rule}; {fix}")


def _plain(value: Any) -> Any:
    """Enums as their values, recursively through lists."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _dtype_names(value: Any) -> Any:
    # torch.dtype values inside option dicts (e.g. a subclass's model kwargs) become "float32" etc. for JSON.
    if isinstance(value, dict):
        return {k: _dtype_names(v) for k, v in value.items()}
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return value


_ATOMS = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _dict_fields(cls: type) -> tuple[str, ...]:
    """The fields ``to_dict`` writes, in order (4.x-only aliases left out)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init and f.name not in _LEGACY_ONLY)


@functools.cache
def _token_fields(cls: type) -> tuple[str, ...]:
    return tuple(name for name in _dict_fields(cls) if name.endswith("_token"))


@functools.cache
def _field_defaults(cls: type) -> dict[str, Any]:
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
    }


@functools.cache
def _default_dict(cls: type) -> dict[str, Any]:
    try:
        return cls().to_dict()
    except Exception:  # noqa: BLE001 - a subclass with required fields: show every field instead
        return {}


# The words HfArgumentParser's string_to_bool reads as True / False (any case).
_TRUE_WORDS = ("yes", "true", "t", "y", "1")
_FALSE_WORDS = ("no", "false", "f", "n", "0")


def _annotation_names(annotation: Any) -> set[str]:
    """``"bool | None"`` (or ``Optional[bool]``, or the type objects) -> ``{"bool", "None"}``."""
    if isinstance(annotation, str):
        text = annotation.strip()
        if text.startswith("Optional[") and text.endswith("]"):
            text = text[len("Optional["):-1] + " | None"
        return {part.strip() for part in text.split("|")}
    members = typing.get_args(annotation) or (annotation,)
    return {"None" if m is type(None) else getattr(m, "__name__", str(m)) for m in members}


@functools.cache
def _scalar_fields(cls: type) -> dict[str, str]:
    """field -> "bool", "int" or "float": the fields of exactly that type (or it or None)."""
    kinds = {}
    for f in dataclasses.fields(cls):
        names = _annotation_names(f.type) - {"None"}
        if len(names) == 1 and (kind := names.pop()) in ("bool", "int", "float"):
            kinds[f.name] = kind
    return kinds


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
        return value.strip().lower() in _TRUE_WORDS
    raise _invalid(name, value, "True or False (as text: one of " + "/".join(_TRUE_WORDS) + " or "
                   + "/".join(_FALSE_WORDS) + ", any case)", f"pass {name}=True or {name}=False")


def _parse_text_values(args: TrainingArguments) -> None:
    """Bool, int and float fields given as text (a JSON or YAML config, an environment variable) become what
    HfArgumentParser makes of the same text on a command line: "false" is False (a non-empty string is truthy,
    so taken as it is it would switch the option on), "1e-3" is 0.001. Other values of a bool field are refused."""
    for name, kind in _scalar_fields(type(args)).items():
        value = getattr(args, name)
        if value is None:
            continue  # None of a plain bool field is falsy, as in transformers
        if kind == "bool":
            setattr(args, name, _as_bool(name, value))
        elif isinstance(value, str):
            try:
                setattr(args, name, int(value) if kind == "int" else float(value))
            except ValueError:
                default = _field_defaults(type(args))[name]
                raise _invalid(name, value, "an integer" if kind == "int" else "a number",
                               f"pass a number such as {name}={default!r}") from None


def _declared_by_a_subclass(cls: type, name: str) -> bool:
    """Whether a subclass of cadence's arguments declares field ``name`` itself (GLiNER's arguments declare
    ``warmup_ratio: float = 0.0`` and read it in their own ``get_warmup_steps``): transformers 5 has no such field
    and leaves it to the subclass, so cadence does not read it as the 4.x spelling either."""
    return any(name in vars(k).get("__annotations__", {}) for k in cls.__mro__
               if k is not TrainingArguments and issubclass(k, TrainingArguments) and not k.__module__.startswith("cadence."))


def _resolve_aliases(args: TrainingArguments) -> None:
    """Move each 4.x spelling into its 5.x field; the two disagreeing is an error."""
    defaults = _field_defaults(type(args))
    for old, (new, convert) in _ALIASES.items():
        old_value = getattr(args, old)
        if old_value is None or _declared_by_a_subclass(type(args), old):
            continue
        if old in _DEPRECATED and old_value:
            _warn_deprecated(old, new, _DEPRECATED[old])
        value = convert(old, old_value)
        setattr(args, old, None)  # consumed, so a dataclasses.replace() copy does not apply it again
        current = getattr(args, new)
        if value is None or _plain(current) == _plain(value):
            continue
        if _plain(current) != _plain(defaults[new]):
            raise ValueError(
                f"{old}={old_value!r} conflicts with {new}={_plain(current)!r}: {old} is the transformers 4.x "
                f"spelling of {new}; pass only {new}"
            )
        setattr(args, new, value)


def _warn_deprecated(old: str, new: str, category: type[Warning] | None) -> None:
    message = f"`{old}` is deprecated (transformers 4.x's name, gone in 5.0): pass `{new}` instead"
    if category is None:
        logger.warning(message)
    else:
        warnings.warn(message, category, stacklevel=5)  # the caller of TrainingArguments(...)


def _resolve_output_dir(args: TrainingArguments) -> None:
    if args.output_dir is None:
        logger.info("No output_dir given: using 'trainer_output'")
        args.output_dir = "trainer_output"
    args.output_dir = os.path.expanduser(os.fspath(args.output_dir))
    if not args.output_dir.strip():
        raise _invalid("output_dir", args.output_dir, "a folder name", "pass e.g. output_dir='out', or None for 'trainer_output'")


# accelerator_config values cadence refuses, with why: each would make processes read different data or a different
# order than cadence's sharded, seedable, resumable loaders (exact and bit-identical on resume).
_ACCELERATOR_CONFIG_REFUSED = {
    ("split_batches", True): "cadence gives every process its own batch of per_device_train_batch_size; to split "
                             "a batch of B over N processes set per_device_train_batch_size=B/N",
    ("dispatch_batches", True): "every process reads its own shard of the data in cadence (batches are never "
                                "sent from the main process); remove it",
    ("even_batches", False): "every process must take the same number of steps for the summed loss to be exact, "
                             "and evaluation already drops the repeated samples; remove it",
    ("use_seedable_sampler", False): "cadence's sampler is always seeded from seed/data_seed, which is what makes "
                                     "resume bit-identical; remove it",
}
_GRADIENT_ACCUMULATION_KEYS = ("num_steps", "adjust_scheduler", "sync_with_dataloader", "sync_each_batch")


def _build_accelerator_config(args: TrainingArguments) -> None:
    """``accelerator_config`` as an ``AcceleratorConfig``, from a dict, a JSON file path or a config object
    (transformers' own ``AcceleratorConfig`` too), checked; ``gradient_accumulation_kwargs["num_steps"]`` applied
    as transformers does."""
    value = args.accelerator_config
    if isinstance(value, type):
        raise TypeError(f"accelerator_config={value!r} is invalid: it is a class; pass an instance, e.g. "
                        f"{value.__name__}(), or a dict")
    if value is None:
        config = AcceleratorConfig()
    elif isinstance(value, dict):
        unknown = sorted(k for k in value if k not in AcceleratorConfig.__dataclass_fields__)
        if unknown:
            raise TypeError(f"accelerator_config={value!r} is invalid: unknown keys {unknown}; the keys are "
                            f"{sorted(AcceleratorConfig.__dataclass_fields__)}")
        config = AcceleratorConfig(**value)
    elif isinstance(value, (str, os.PathLike)):
        if not os.path.isfile(value):
            raise _invalid("accelerator_config", value, "a dict, an AcceleratorConfig or the path of a JSON file",
                           "no such file: give the file's path")
        config = AcceleratorConfig.from_json_file(value)
    elif dataclasses.is_dataclass(value):  # cadence's, or transformers' AcceleratorConfig
        config = AcceleratorConfig(**{k: v for k, v in vars(value).items() if k in AcceleratorConfig.__dataclass_fields__})
    else:
        raise TypeError(f"accelerator_config={value!r} is invalid: it must be a dict, an AcceleratorConfig or a JSON "
                        f"file path, not {type(value).__name__}")
    for (name, bad), why in _ACCELERATOR_CONFIG_REFUSED.items():
        if getattr(config, name) is bad:
            raise ValueError(f"accelerator_config {name}={bad} is not supported by cadence: {why}")
    kwargs = config.gradient_accumulation_kwargs
    if kwargs is not None:
        if not isinstance(kwargs, dict) or any(k not in _GRADIENT_ACCUMULATION_KEYS for k in kwargs):
            raise TypeError(f"accelerator_config gradient_accumulation_kwargs={kwargs!r} is invalid: it must be a dict "
                            f"with keys among {list(_GRADIENT_ACCUMULATION_KEYS)}")
        if "num_steps" in kwargs:
            if args.gradient_accumulation_steps > 1:
                raise ValueError(
                    f"accelerator_config gradient_accumulation_kwargs num_steps={kwargs['num_steps']!r} and "
                    f"gradient_accumulation_steps={args.gradient_accumulation_steps} both set the accumulation: "
                    "set only one of them")
            args.gradient_accumulation_steps = kwargs["num_steps"]
            _check_value_rules(args)  # num_steps obeys gradient_accumulation_steps's rule
    if config.pop("use_configured_state", False):  # popped, as transformers does (to_dict() leaves it out)
        from .backend import require_configured_state  # only then: a plain run does not import accelerate

        require_configured_state(args)
    args.accelerator_config = config


def _start_process_state(args: TrainingArguments) -> None:
    """accelerate's ``PartialState`` with the run's settings exists once the arguments do (as in transformers).
    On several processes, a library's own bare ``PartialState()`` (TRL's dataset preparation makes one) then reuses it
    instead of creating one without them (on a machine without a GPU: no distributed state, each process training
    alone). On one process, libraries log through ``accelerate.logging`` between their arguments and their Trainer
    (TRL's ORPO and CPO), which needs the state; it is created when accelerate is imported already (every library
    that uses it imported it), so a plain run never imports accelerate (0.2 s). DeepSpeed's state is left to the
    Trainer's accelerator, which sets it up for DeepSpeed."""
    from .runtime.slurm import apply_slurm_environment  # light: SLURM's srun as a launcher

    apply_slurm_environment()  # before anything reads RANK/WORLD_SIZE: a job srun started sets them from SLURM's
    if args.deepspeed:
        return
    if args.world_size > 1 or "accelerate" in sys.modules:
        args.distributed_state  # noqa: B018 - the cached property creates the state


def _parse_json_dict_fields(args: TrainingArguments) -> None:
    for name in type(args)._VALID_DICT_FIELDS:  # the class's list: a subclass's own dict fields are parsed too
        value = getattr(args, name)
        if isinstance(value, str) and value.lstrip().startswith("{"):  # other strings are file paths
            try:
                setattr(args, name, _typed_strings(json.loads(value)))
            except json.JSONDecodeError as error:
                raise _invalid(name, value, "a dict or a JSON object string", f"fix the JSON ({error})") from None


def _typed_strings(value: dict) -> dict:
    """``"true"``/``"false"``/``"3"``/``"0.5"`` inside a JSON dict as bool/int/float, as transformers reads them."""
    for key, item in value.items():
        if isinstance(item, dict):
            value[key] = _typed_strings(item)
        elif isinstance(item, str) and item.lower() in ("true", "false"):
            value[key] = item.lower() == "true"
        elif isinstance(item, str) and item.isdigit():
            value[key] = int(item)
        elif isinstance(item, str) and item.replace(".", "", 1).isdigit():
            value[key] = float(item)
    return value


def _resolve_checkpointing_names(args: TrainingArguments) -> None:
    # HF 5's rule: the old name is read only when the new one is unset; afterwards they mirror.
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if getattr(args, new) is None:
            setattr(args, new, getattr(args, old))
        setattr(args, old, getattr(args, new))
    if args.activation_checkpointing is None:
        args.activation_checkpointing = args.gradient_checkpointing = False


def _normalise_shorthands(args: TrainingArguments) -> None:
    if isinstance(args.include_num_input_tokens_seen, bool):
        args.include_num_input_tokens_seen = "all" if args.include_num_input_tokens_seen else "no"
    if args.debug is None or isinstance(args.debug, str):
        args.debug = (args.debug or "").split()  # HF takes space-separated names


def _normalise_report_to(args: TrainingArguments) -> None:
    """report_to becomes a list of names; "none" is the empty list, "all" the installed trackers."""
    names = args.report_to
    if names is None or isinstance(names, str):
        names = [] if names is None else [names]
    names = list(names)
    if names in (["none"], []):
        args.report_to = []
    elif names == ["all"]:
        from .integrations.registry import available_integrations

        args.report_to = available_integrations()
        logger.info("report_to='all': reporting to %s", args.report_to)
    else:
        args.report_to = names
    if os.getenv("KUBEFLOW_TRAINER_SERVER_URL") is not None and "kubeflow" not in args.report_to:
        from .integrations.registry import is_installed

        if is_installed("kubeflow"):  # inside a Kubeflow TrainJob progress is reported, as in transformers 5.x
            args.report_to = [*args.report_to, "kubeflow"]


def _convert_enums(args: TrainingArguments) -> None:
    for name, enum_cls in _ENUM_FIELDS.items():
        value = getattr(args, name)
        try:
            setattr(args, name, enum_cls(_plain(value)))
        except ValueError:
            valid = ", ".join(repr(m.value) for m in enum_cls)
            raise _invalid(name, value, f"one of {valid}", f"pick one of those {enum_cls.__name__} names") from None


def _derive_eval_steps(args: TrainingArguments) -> None:
    # HF's rule: evaluating "every steps" without eval_steps (or with 0) evaluates as often as it logs.
    if args.eval_strategy == IntervalStrategy.STEPS and not args.eval_steps:
        if _is_number(args.logging_steps) and args.logging_steps <= 0:  # transformers refuses it here too
            raise _invalid("eval_steps", args.eval_steps, "set when logging_steps is not above 0 (eval_steps falls "
                           f"back to logging_steps={args.logging_steps!r})", "pass e.g. eval_steps=500")
        logger.info("eval_steps not set: using logging_steps=%s", args.logging_steps)
        args.eval_steps = args.logging_steps


def _derive_best_model_metric(args: TrainingArguments) -> None:
    # What compares evaluations needs a metric: HF defaults it to the loss, except for save_strategy="best",
    # where the Trainer asks for it (checks.check_best_metric_named)
    needs_metric = (
        args.load_best_model_at_end
        or args.lr_scheduler_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY)
    )
    if needs_metric and args.metric_for_best_model is None:
        args.metric_for_best_model = "loss"
    if args.greater_is_better is None and args.metric_for_best_model is not None:
        args.greater_is_better = not args.metric_for_best_model.endswith("loss")  # losses go down


def _derive_simple_defaults(args: TrainingArguments) -> None:
    if args.eval_strategy != IntervalStrategy.NO:
        args.do_eval = True  # HF: evaluating during training implies do_eval for the user's script
    if args.disable_tqdm is None:
        args.disable_tqdm = logging.getLogger("cadence").getEffectiveLevel() > logging.WARNING
    if args.use_cpu:
        args.dataloader_pin_memory = False  # pinning only speeds up copies to a GPU


def _derive_torch_compile(args: TrainingArguments) -> None:
    # HF's rule: naming a backend or mode turns compilation on; the backend defaults to inductor.
    if args.torch_compile_backend is not None or args.torch_compile_mode is not None:
        args.torch_compile = True
    if args.torch_compile and args.torch_compile_backend is None:
        args.torch_compile_backend = "inductor"


def _check_finite(args: TrainingArguments) -> None:
    # inf or NaN in a learning rate, a decay or a beta trains to NaN weights while the run "succeeds".
    for name, kind in _scalar_fields(type(args)).items():
        value = getattr(args, name)
        if kind == "float" and isinstance(value, float) and not math.isfinite(value):
            fix = _VALUE_RULES[name][2] if name in _VALUE_RULES else f"pass a finite {name}"
            raise _invalid(name, value, "a finite number", fix)


def _check_value_rules(args: TrainingArguments) -> None:
    for name, (is_valid, rule, fix) in _VALUE_RULES.items():
        value = getattr(args, name)
        if not is_valid(value):
            raise _invalid(name, value, rule, fix)


def _warn_odd_values(args: TrainingArguments) -> None:
    for name, (is_odd, effect) in _ODD_VALUES.items():
        value = getattr(args, name)
        if is_odd(value):
            logger.warning("%s=%r: %s", name, value, effect)


def _check_choices(args: TrainingArguments) -> None:
    for name, choices in _CHOICES.items():
        value = getattr(args, name)
        if value not in choices:
            raise _invalid(name, value, f"one of {', '.join(map(repr, choices))}", "pick one of those")
    for name in args.report_to:
        if not isinstance(name, str):
            raise _invalid("report_to", args.report_to, "'none', 'all' or a list of names", "pass names as strings")


# A negative interval: transformers takes it (no rule refuses it) and its state turns it into ceil(max_steps * value),
# a negative number of steps; `step % n == 0` then holds at the multiples of |n|, and `save_steps > 0` never.
_NEGATIVE_INTERVAL = ("%s=%r is negative: accepted as transformers accepts it, and run as transformers runs it (the "
                      "interval becomes ceil(max_steps * value) steps): %s. Pass a whole number of steps >= 1 or a "
                      "fraction in (0, 1) of the run for a regular interval, e.g. %s=500 or %s=0.1")
_NEGATIVE_EFFECT = {
    "logging_steps": "training logs every |ceil(max_steps * value)| steps, so at most once at the end for a value <= -1",
    "eval_steps": "evaluations every |ceil(max_steps * value)| steps, so at most once at the end for a value <= -1",
    "save_steps": "no checkpoint during training, one when training ends",
}


def _check_step_intervals(args: TrainingArguments) -> None:
    """With a "steps" strategy the interval is a whole number of steps >= 1 or a ratio in (0, 1); save_steps=0 is
    accepted too, as in transformers, and a negative interval with a warning (transformers accepts it)."""
    for strategy, name in _STEP_INTERVALS:
        if getattr(args, strategy) != IntervalStrategy.STEPS:
            continue
        value = getattr(args, name)
        if name == "save_steps" and _is_number(value) and value == 0:
            continue  # transformers accepts it: no save during training, one when training ends
        if _is_number(value) and value < 0:  # transformers accepts it: warned, with what its arithmetic makes of it
            logger.warning(_NEGATIVE_INTERVAL, name, value, _NEGATIVE_EFFECT[name], name, name)
            continue
        if not (_is_number(value) and value > 0 and (value < 1 or float(value).is_integer())):
            raise _invalid(
                name,
                value,
                f"a whole number of steps >= 1 or a fraction in (0, 1) of the total steps when {strategy}='steps'",
                f"pass e.g. {name}=500 or {name}=0.1, or another {strategy}",
            )
        if value >= 1:
            setattr(args, name, int(value))


def _check_one_precision(args: TrainingArguments) -> None:
    for a, b in (("fp16", "bf16"), ("fp16_full_eval", "bf16_full_eval")):
        if getattr(args, a) and getattr(args, b):
            raise ValueError(
                f"{a}=True together with {b}=True is invalid: only one half-precision type can be used; keep one"
            )


def _check_bf16_device(args: TrainingArguments) -> None:
    """transformers' rule: bf16 without use_cpu needs a GPU that computes in bfloat16. Without one it would run
    bfloat16 autocast on the CPU unasked (TRL's configs default to bf16=True), so it is refused before training."""
    name = "bf16" if args.bf16 else "bf16_full_eval" if args.bf16_full_eval else None
    if name is None or args.use_cpu:
        return
    from .backend import accelerator_available, bf16_gpu_available  # only then: this module stays light to import

    if bf16_gpu_available():
        return
    where = ("this GPU does not compute in bfloat16 (it needs an Ampere or newer GPU)" if accelerator_available()
             else "this machine has no GPU")
    raise ValueError(
        f"{name}=True is invalid without use_cpu=True here: {where}, and bfloat16 on the CPU is used only when asked "
        f"for (as in transformers); pass use_cpu=True to train in bfloat16 on the CPU, or {name}=False for float32 "
        f"(TRL's configs default to bf16=True)"
    )


def _check_debug(args: TrainingArguments) -> None:
    for name in args.debug:
        if name == "tpu_metrics_debug":
            raise ValueError(f"debug={args.debug!r}: 'tpu_metrics_debug' is not built in cadence yet (no TPU support); "
                             "remove it")
        if name != "underflow_overflow":
            raise _invalid("debug", args.debug, "'underflow_overflow' (space-separated names)", f"remove {name!r}")


def _check_best_model_strategies(args: TrainingArguments) -> None:
    """load_best_model_at_end reloads a saved evaluation point: saves must land on evaluations."""
    if not args.load_best_model_at_end or args.save_strategy == SaveStrategy.BEST:
        return
    if args.eval_strategy != args.save_strategy:
        raise ValueError(
            f"save_strategy={args.save_strategy.value!r} is invalid with load_best_model_at_end=True and "
            f"eval_strategy={args.eval_strategy.value!r}: the two strategies must match so that every evaluated "
            f"model is saved; set save_strategy={args.eval_strategy.value!r} (or 'best')"
        )
    if args.eval_strategy == IntervalStrategy.STEPS and not _is_multiple(args.save_steps, args.eval_steps):
        raise ValueError(
            f"save_steps={args.save_steps!r} is invalid with load_best_model_at_end=True: it must be a multiple "
            f"of eval_steps={args.eval_steps!r} (both whole steps or both ratios); set save_steps={args.eval_steps!r}"
        )


def _is_multiple(save_steps: float, eval_steps: float) -> bool:
    if save_steps == 0:
        return True  # saves only at the end, which evaluates too (transformers: 0 % eval_steps == 0)
    if (save_steps < 1) != (eval_steps < 1):
        return False  # a ratio and a step count: no multiple can be guaranteed
    # Ratios compared in millionths, so that 0.3 counts as a multiple of 0.1 despite float error.
    return round(save_steps * 1_000_000) % round(eval_steps * 1_000_000) == 0


def _check_scheduler_needs_eval(args: TrainingArguments) -> None:
    if args.lr_scheduler_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY):
        if args.eval_strategy == IntervalStrategy.NO:
            raise ValueError(
                f"lr_scheduler_type={args.lr_scheduler_type.value!r} is invalid with eval_strategy='no': this "
                f"schedule reacts to evaluation metrics; set eval_strategy='steps' or 'epoch'"
            )


def _check_prefetch_needs_workers(args: TrainingArguments) -> None:
    if args.dataloader_prefetch_factor is not None and args.dataloader_num_workers == 0:
        raise ValueError(
            f"dataloader_prefetch_factor={args.dataloader_prefetch_factor!r} is invalid with "
            f"dataloader_num_workers=0: only worker processes prefetch; set dataloader_num_workers > 0 or "
            f"leave dataloader_prefetch_factor=None"
        )


def _refuse_from_table(args: TrainingArguments, table: dict[str, str], verdict: str) -> None:
    defaults = _field_defaults(type(args))
    for key, what in table.items():
        name, _, refused_value = key.partition("=")
        value = getattr(args, name)
        if refused_value:
            refused = str(_plain(value)) == refused_value
        else:
            refused = bool(value) and _plain(value) != _plain(defaults[name])
        if refused:
            raise ValueError(
                f"{name}={_plain(value)!r} {verdict} ({what}); remove it or pass {name}={_plain(defaults[name])!r}. "
                f"cadence refuses rather than silently ignoring a setting."
            )


def _check_positive_steps(strategy: Any, steps: Any, setter: str) -> None:
    if str(_plain(strategy)) == "steps" and not steps:
        raise ValueError(f"{setter}(strategy='steps', steps={steps!r}) is invalid: 'steps' needs steps > 0; pass e.g. steps=500")


def _refuse_unbuilt_integrations(args: TrainingArguments) -> None:
    from .integrations.registry import check_names  # names only: no tracker package is imported here

    check_names(args.report_to)


__all__ = ["OptimizerNames", "ParallelMode", "TrainingArguments"]
