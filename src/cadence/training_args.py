"""`TrainingArguments`: every option of `transformers.TrainingArguments` (5.x), same names and defaults.

How to read this module:
- the fields, grouped as in HF, each with its help text on the field;
- the 4.x spellings users still write (`evaluation_strategy`, `warmup_ratio`, ...), accepted as
  aliases: resolved into their 5.x names in `__post_init__`, never in `to_dict()`;
- `__post_init__` runs short named steps in a fixed order: resolve input forms -> convert names to
  enums -> derive HF's defaults (`training_args_parsing.py`) -> validate values -> validate combinations ->
  refuse what cadence does not do yet (`training_args_checks.py`; `_NOT_YET_BUILT`, one line per feature:
  delete the line when the feature lands); the fields' types are in `training_args_types.py`;
- derived properties (`device`, `world_size`, `should_save`, ...) and serialisation (`to_dict`, ...).

Every ValueError names the field, the bad value and the fix. Nothing is silently ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import sys
import typing
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import torch

from .trainer_utils import HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType
# the fields' types, and the steps of __post_init__: parsing the input forms, then the checks (modules below this one)
from .training_args_types import _LOG_LEVELS, AcceleratorConfig, OptimizerNames, ParallelMode, _help
from .training_args_parsing import (  # noqa: F401 - CADENCE_ONLY, _LEGACY_ONLY, _TRUE_WORDS, ...: read by tests and cli
    _ATOMS, _FALSE_WORDS, _LEGACY_ONLY, _TRUE_WORDS, CADENCE_ONLY, _build_accelerator_config, _convert_enums,
    _default_dict, _derive_best_model_metric, _derive_eval_steps, _derive_simple_defaults, _derive_torch_compile,
    _dict_fields, _dtype_names, _normalise_report_to, _normalise_shorthands, _parse_json_dict_fields,
    _parse_text_values, _resolve_aliases, _resolve_checkpointing_names, _resolve_output_dir, _start_process_state,
    _token_fields,
)
from .training_args_checks import (  # noqa: F401 - _plain, _scalar_fields: read by tests
    _NOT_YET_BUILT, _REFUSED_BY_DESIGN, _check_best_model_strategies, _check_bf16_device, _check_choices, _check_debug,
    _check_finite, _check_one_precision, _check_positive_steps, _check_prefetch_needs_workers,
    _check_scheduler_needs_eval, _check_step_intervals, _check_value_rules, _plain, _refuse_from_table,
    _refuse_unbuilt_integrations, _scalar_fields, _warn_odd_values,
)

logger = logging.getLogger(__name__)


def _default_optim() -> str:
    # HF's rule: the fused AdamW kernel (CPU and CUDA) is the default from torch 2.8 on.
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return "adamw_torch_fused" if (major, minor) >= (2, 8) else "adamw_torch"


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
    verbosity, as transformers' Trainer sets it; under ``patch_transformers()`` only there, since cadence's loggers are
    then in transformers' tree). ``transformers.logging.set_verbosity_*()`` afterwards reaches
    cadence's loggers at the next Trainer, as it reaches transformers' (a later Trainer with ``log_level="passive"``
    keeps the level, as in transformers).

    Example:
        >>> set_process_log_level(TrainingArguments("out", log_level="error"))
        >>> logging.getLogger("cadence").level == logging.ERROR
        True
    """
    global _transformers_verbosity_seen
    level = args.get_process_log_level()
    ours = logging.getLogger("cadence")
    if ours.parent.name != "transformers":  # not under patch_transformers()
        ours.setLevel(level)
    # else cadence's loggers sit in transformers' tree with no level of their own: transformers' verbosity, set below
    # as transformers' Trainer sets it, is theirs, and a later set_verbosity_*() reaches them at once, as it does
    # transformers' Trainer
    hf = _transformers_logging()
    if hf is not None:
        named = _LOG_LEVELS[args.log_level if args.should_log else args.log_level_replica] != -1
        if named:
            hf.set_verbosity(level)
        _transformers_verbosity_seen = hf.get_verbosity()


# The help text's end for a field whose feature is in _NOT_YET_BUILT (a value other than the default is refused).
_NOT_BUILT = " Not built in cadence: setting it raises a ValueError."


def _help_4x(text: str, **argparse_options: Any) -> dict[str, Any]:
    # A transformers 4.x spelling: still accepted on a command line, but left out of --help, which lists the options
    # of transformers 5 as its own --help does. `text` says what the field does, for readers of this module.
    return {"help": argparse.SUPPRESS, **argparse_options}


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
        _resolve_aliases(self, TrainingArguments)
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


__all__ = ["OptimizerNames", "ParallelMode", "TrainingArguments"]
