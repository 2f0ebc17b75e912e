"""The ``Trainer``: ``transformers.Trainer``'s API over a small, exact loop.

The class reads top to bottom in the order of the flow: construction, data, optimizer; ``train`` ->
``_inner_training_loop`` (epoch -> optimizer step -> micro-batch) and its helpers in the order it calls
them -> ``training_step`` -> ``compute_loss``; then ``evaluate`` / ``predict`` -> ``evaluation_loop`` ->
``prediction_step``; saving and loading (each a call to the ``Checkpointer``, ``checkpoint/manager.py``), the Hub,
hyperparameter search, logging; last, transformers' remaining public helpers. Callbacks decide when to log, evaluate and save
(``DefaultFlowCallback``); the Trainer acts on their requests. Every per-run value lives in one
``LoopState`` (``loop_state.py``), which is also what a checkpoint's ``loop_state.json`` holds.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from . import activation_checkpointing, data, evaluation, liger, loss as loss_utils, neftune, optimization, overflow
from . import checks, output_guard, peft_support, script_metrics
from .backend import AcceleratorView, Backend, skip_first_batches
# checkpoints only through the Checkpointer; transformers' module constants (scripts import the checkpoint file names
# from transformers.trainer) come with it
from .checkpoint.manager import (OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME,  # noqa: F401
                                 TRAINING_ARGS_NAME, Checkpointer, ResumePoint)
from .checkpoint.signals import JITCheckpointCallback
from .integrations import base as trackers, registry as integrations
from .loop_state import BatchLayout, LoopState, data_identity, data_states, step_counts
from .memory_metrics import TrainerMemoryTracker
from .trainer_callback import (
    CallbackHandler,
    DefaultFlowCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)
from .trainer_utils import (
    PREFIX_CHECKPOINT_DIR,  # noqa: F401 - transformers.trainer has it
    EvalLoopOutput,
    _is_out_of_memory,
    PredictionOutput,
    TrainOutput,
    enable_full_determinism,
    has_length,
    set_seed,
    speed_metrics,
)
from .trainer_surface import TransformersSurface
from .training_args import TrainingArguments, set_process_log_level

logger = logging.getLogger(__name__)

# transformers' module-level names: the callbacks every Trainer starts with (then the trackers, the user's
# callbacks, a progress bar or, with disable_tqdm=True, a PrinterCallback, and with enable_jit_checkpoint the JIT one)
DEFAULT_CALLBACKS = [DefaultFlowCallback]
DEFAULT_PROGRESS_CALLBACK = ProgressCallback


def _accepts_tokenizer(init: Callable) -> Callable:
    """``Trainer(tokenizer=...)``, transformers 4.x's name for ``processing_class`` that 4.x-pinned libraries still pass:
    taken with the FutureWarning transformers 4.57 gives, and refused beside ``processing_class`` as 4.57 refuses it."""

    @functools.wraps(init)  # the signature stays transformers 5's (inspect follows __wrapped__)
    def __init__(self, *args, **kwargs):
        if "tokenizer" in kwargs:
            where = f"{type(self).__name__}.__init__"
            if "processing_class" in kwargs:
                raise ValueError(f"Both `tokenizer` and `processing_class` are set for `{where}`. Pass only "
                                 "`processing_class` (`tokenizer` is its deprecated name).")
            warnings.warn(f"`tokenizer` is deprecated and removed in transformers 5.0.0 for `{where}`. Use "
                          "`processing_class` instead.", FutureWarning, stacklevel=2)
            kwargs["processing_class"] = kwargs.pop("tokenizer")
        init(self, *args, **kwargs)

    return __init__


class Trainer(TransformersSurface):
    """Train, evaluate and predict with a PyTorch model; the API of ``transformers.Trainer``.

    Args:
        model: any ``nn.Module`` that returns its loss (first in a tuple, or ``"loss"`` in a dict /
            ``ModelOutput``) when given ``labels``; or None with ``model_init``.
        args: the ``TrainingArguments`` (default: ``TrainingArguments("trainer_output")``).
        data_collator: turns a list of samples into a batch (default: stacking, or padding when a
            ``processing_class`` with ``pad_token_id`` is given).
        train_dataset: a torch ``Dataset`` (of dicts, tuples or tensors), an ``IterableDataset``, or a
            Hugging Face ``datasets.Dataset``.
        eval_dataset: the same kinds, or a dict of them (each evaluated under its own metric prefix).
        processing_class: a tokenizer or processor, saved with the model.
        model_init: builds a fresh model for each ``train()``.
        compute_loss_func: ``f(outputs, labels, num_items_in_batch=...)`` returning the loss summed
            over items and divided by ``num_items_in_batch``.
        compute_metrics: ``f(EvalPrediction) -> dict`` for ``evaluate``/``predict``.
        callbacks: ``TrainerCallback`` classes or instances added after the default ones.
        optimizers: ``(optimizer, lr_scheduler)`` to use instead of creating them.
        optimizer_cls_and_kwargs: ``(optimizer_class, kwargs)`` used to create the optimizer.
        preprocess_logits_for_metrics: ``f(logits, labels)`` applied to each batch before it is kept.

    Example:
        >>> trainer = Trainer(model, TrainingArguments("out", max_steps=10), train_dataset=ds)
        >>> trainer.train().training_loss
    """

    # True/False: whether compute_loss divides by num_items_in_batch itself (HF's class attribute: a subclass sets it,
    # as TRL's GRPOTrainer does); None: decided per step from the model, compute_loss_func, label smoothing and
    # compute_loss's signature
    loss_is_scaled_for_ga: bool | None = None

    @_accepts_tokenizer
    def __init__(
        self,
        model: nn.Module | None = None,
        args: TrainingArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        model_init: Callable[..., nn.Module] | None = None,
        compute_loss_func: Callable | None = None,
        compute_metrics: Callable | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        optimizer_cls_and_kwargs: tuple | None = None,
        preprocess_logits_for_metrics: Callable | None = None,
    ):
        self.args = args = args if args is not None else TrainingArguments(output_dir="trainer_output")
        enable_full_determinism(args.seed) if args.full_determinism else set_seed(args.seed)
        self._set_log_level()
        if model is None:
            if model_init is None:
                raise ValueError("Trainer needs a model: pass model=... or model_init=... (a function returning one)")
            from .hyperparameter_search import call_model_init
            model = call_model_init(model_init, None)  # model_init(None) when it takes a trial, as transformers
        self.model_init = model_init
        self._signature_columns: list[str] | None = None  # the columns kept (_set_signature_columns_if_needed)
        self.backend = Backend(args, model)  # a model on a device mesh (tensor parallel) sets the layout
        # skip_memory_metrics=False: the memory of __init__, train(), evaluate(), predict() (transformers' keys)
        self._memory_tracker = TrainerMemoryTracker(args.skip_memory_metrics, self.backend.device)
        self._memory_tracker.start("init")
        self.model = model.to(self.backend.device)
        self.model_wrapped = self.model
        # what transformers' subclasses read: accelerate's methods over cadence's processes, and the engines in use
        self.accelerator = AcceleratorView(self.backend)
        self.is_fsdp_enabled = self.backend.sharding is not None
        self.is_deepspeed_enabled = self.backend.deepspeed is not None
        self.processing_class = processing_class
        self.data_collator = data_collator if data_collator is not None else self._default_collator(processing_class)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.compute_loss_func, self.compute_metrics = compute_loss_func, compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self._validate_setup()

        # what the model's loss does with labels, read once
        self.label_smoother = loss_utils.label_smoother_for(model, args.label_smoothing_factor)
        self.model_accepts_loss_kwargs = loss_utils.divides_by_items(model)
        self._shifts_labels = data.loss_shifts_labels(model)
        # transformers' find_labels and can_return_loss, read from the model's class (a PEFT model: its base model's)
        self.label_names = args.label_names if args.label_names is not None else data.label_names(model)
        self.can_return_loss = loss_utils.can_return_loss(model)
        self.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        params = inspect.signature(self.compute_loss).parameters  # a subclass's override may not take the count
        self._compute_loss_takes_items = "num_items_in_batch" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
        self.is_in_train = False  # True inside train(): evaluation then never casts the model (full_eval)
        self._loop: LoopState | None = None  # the latest train() call's loop state (log() reads its token count)
        self._created_lr_scheduler = False  # create_scheduler built it: the next train() builds a fresh one
        self._eval_dataloaders: dict = {}  # (dataset id, batch size) -> (dataset, loader), with persistent workers
        # every save and resume goes through it: the background writer and the save in flight, output_dir's lock, the
        # objects a checkpoint holds (this Trainer's, read at each save; a subclass's _save writes the model files)
        self.checkpointer = Checkpointer(self, None if type(self)._save is Trainer._save else self._save, data_states)

        report_to = integrations.get_reporting_integration_callbacks(args.report_to)  # missing package: ValueError here
        self.callback_handler = CallbackHandler([*DEFAULT_CALLBACKS, *report_to, *(callbacks or [])], self.model,
                                                processing_class, self.optimizer, self.lr_scheduler)
        self.add_callback(PrinterCallback if args.disable_tqdm else DEFAULT_PROGRESS_CALLBACK)
        if args.enable_jit_checkpoint:  # last (transformers: before the user's): a signal sent in any callback's
            jit_callback = JITCheckpointCallback()  # on_step_end is served at this step's end
            jit_callback.set_trainer(self)
            self.add_callback(jit_callback)
        trackers.check_args(args, self.callback_handler.callbacks)  # an unwritable logging_dir: refused now
        self.state = TrainerState(
            is_local_process_zero=args.local_process_index == 0, is_world_process_zero=args.process_index == 0
        )
        self.control = TrainerControl()
        self.hub_repo = None  # the Hub repository pushes go to (push_to_hub=True, or after a push_to_hub() call)
        self.hub_model_id = None  # its id, once created (transformers' attribute: TRL's model card reads it)
        if args.push_to_hub:  # created now: a missing token or an unreachable Hub shows before any training
            self._start_hub_pushes()
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)
        self._memory_tracker.stop_and_update_metrics("init")  # reported with the first stage after it

    # ------------------------------------------------------------------ construction

    def _set_log_level(self) -> None:
        set_process_log_level(self.args)  # cadence's loggers, and transformers' when loaded, as transformers does

    def _validate_setup(self) -> None:
        """Every check that can fail before the first step, with the fix in the message."""
        args = self.args
        data.check_dataset(self.train_dataset, "train_dataset")
        eval_sets = self.eval_dataset.values() if isinstance(self.eval_dataset, dict) else [self.eval_dataset]
        for ds in eval_sets:
            data.check_dataset(ds, "eval_dataset", allow_empty=True)
        if args.eval_strategy != "no" and self.eval_dataset is None:
            raise ValueError(
                f"eval_strategy={args.eval_strategy.value if hasattr(args.eval_strategy, 'value') else args.eval_strategy!r} "
                "needs an eval_dataset: pass eval_dataset=... to Trainer, or set eval_strategy='no'"
            )
        if self.train_dataset is not None and data.is_iterable_dataset(self.train_dataset) and args.max_steps <= 0:
            raise ValueError(
                "train_dataset has no length (an IterableDataset), so the number of steps is unknown: set max_steps"
            )
        if args.auto_find_batch_size and args.world_size > 1:
            raise ValueError(
                f"auto_find_batch_size=True with {args.world_size} processes: an out-of-memory error on one process "
                "would leave the others waiting at the gradient all-reduce; set auto_find_batch_size=False and choose "
                "per_device_train_batch_size yourself"
            )
        if self.optimizer is None and self.optimizer_cls_and_kwargs is None and not self.backend.optimizer_from_config:
            optimization.check_optimizer(str(getattr(args.optim, "value", args.optim)))
        checks.check_optimizers(self.model, self.optimizer, self.lr_scheduler)
        self.backend.warn_unused_optimizers(self.optimizer, self.lr_scheduler)
        checks.check_best_save_has_evaluations(args.save_strategy, args.eval_strategy)
        checks.check_best_metric_named(args)
        if args.neftune_noise_alpha:
            neftune.input_embeddings(self.model)
        if args.activation_checkpointing:
            activation_checkpointing.check(self.model)
        if args.use_liger_kernel:  # a CPU, a missing package or a misspelt kernel: refused here, not in step 1
            liger.check(self.backend.device.type, args.liger_kernel_config)
        peft_support.refuse_quantized_without_adapters(self.model)  # a quantized model needs adapters to train
        self._refuse_ignored_overrides()

    @staticmethod
    def _default_collator(processing_class: Any) -> Callable:
        """HF's choice: dynamic padding for a tokenizer (anything with ``pad_token_id``), else stacking."""
        if processing_class is not None and hasattr(processing_class, "pad_token_id"):
            return data.DataCollatorWithPadding(processing_class)
        return data.default_data_collator

    def add_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> TrainerCallback | None:
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        self.callback_handler.remove_callback(callback)

    # ------------------------------------------------------------------ data

    def _set_signature_columns_if_needed(self) -> None:
        """Fill ``self._signature_columns`` (if unset) with the input names the model accepts plus the label
        columns; left None when the model takes anything (``**kwargs`` only), so nothing is dropped.
        Subclasses override it to keep their own columns (TRL: ``["input_ids", "completion_mask", ...]``)."""
        if self._signature_columns is None:
            accepted = data.forward_arguments(self.backend.unwrap(self.model))
            if accepted is not None:
                self._signature_columns = sorted(accepted | set(self.label_names or ()))

    def _remove_unused_columns(self, dataset: Any, description: str | None = None) -> Any:
        """A ``datasets.Dataset`` without the columns the model does not accept (HF's method)."""
        return self._columns_for(dataset, description)[0]

    def _columns_for(self, dataset: Any, description: str | None = None) -> tuple[Any, Callable]:
        """The dataset and collator with the columns the model does not accept removed (logged once)."""
        if not self.args.remove_unused_columns:
            return dataset, self.data_collator
        self._set_signature_columns_if_needed()
        accepted = None if self._signature_columns is None else set(self._signature_columns)
        return data.drop_unused_columns(dataset, self.data_collator, accepted,
                                        type(self.model).__name__, description)

    def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler | None:
        """The training sampler: shuffled per epoch (``EpochSampler``), in order, or grouped by length."""
        names = getattr(self.processing_class, "model_input_names", None)
        return data.train_sampler(train_dataset if train_dataset is not None else self.train_dataset, self.args,
                                  names[0] if names else "input_ids", self._batch_layout(self.args).global_batch,
                                  self.backend.data_parallel_rank, self.backend.data_parallel_size)

    def _dataloader(self, dataset: Any, batch_size: int, description: str | None = None,
                    sampler: torch.utils.data.Sampler | None = None, evaluation: bool = False) -> DataLoader:
        """A DataLoader over ``dataset`` without its unused columns (``data.build_dataloader``)."""
        dataset, collate_fn = self._columns_for(dataset, description)
        return data.build_dataloader(dataset, collate_fn, batch_size, self.args, self.backend, description, sampler,
                                     evaluation, even_batches=lambda: self.accelerator.even_batches)

    def _get_eval_sampler(self, eval_dataset: Any) -> torch.utils.data.Sampler | None:
        """The evaluation sampler; None (transformers' choice on several processes) means cadence's evaluation
        order: dataset order, each process its share, the last batch's padding marked. A subclass returns its own
        sampler to change the order (TRL's GRPO repeats prompts)."""
        return None

    def _get_dataloader(self, dataset: Any, description: str, batch_size: int,
                        sampler_fn: Callable[[Any], torch.utils.data.Sampler | None] | None = None,
                        is_training: bool = False, dataloader_key: str | None = None) -> DataLoader:
        """A DataLoader over ``dataset`` (transformers' builder, which subclasses call): unused columns removed,
        ``sampler_fn(dataset)`` as its sampler (map-style datasets), kept in ``_eval_dataloaders[dataloader_key]``
        with ``dataloader_persistent_workers``.

        Example:
            >>> trainer._get_dataloader(ds, "training", 8, sampler_fn=trainer._get_train_sampler, is_training=True)
        """
        sampler = sampler_fn(dataset) if sampler_fn is not None and not data.is_iterable_dataset(dataset) else None
        loader = self._dataloader(dataset, batch_size, description, sampler, evaluation=not is_training)
        if dataloader_key is not None and self.args.dataloader_persistent_workers:
            self._eval_dataloaders[dataloader_key] = (dataset, loader)
        return loader

    def get_train_dataloader(self) -> DataLoader:
        """The training dataloader: shuffled per epoch with ``(data_seed or seed) + epoch``, sharded by process."""
        if self.train_dataset is None:
            raise ValueError("Trainer.train() needs a train_dataset: pass train_dataset=... to Trainer")
        strategy = self.args.train_sampling_strategy
        if data.is_iterable_dataset(self.train_dataset) and strategy in ("group_by_length", "batch_rebalance"):
            logger.warning("train_sampling_strategy=%r is ignored: the train_dataset has no length (an IterableDataset), "
                           "so its samples are trained in the stream's own order (as in transformers)", strategy)
        return self._get_dataloader(self.train_dataset, "training", self.args.train_batch_size,
                                    sampler_fn=self._get_train_sampler, is_training=True)

    def get_resumed_dataloader(self, dataloader: DataLoader, num_batches: int) -> DataLoader:
        """A dataloader that leaves out the first ``num_batches`` batches (transformers 5.25's method).

        cadence's own loop never calls this default: it resumes inside an epoch by starting its sampler past
        the trained batches (nothing is loaded to be thrown away), or from a stream's saved state. Override it
        for a dataloader that must skip its own way (a stateful or streaming one): a resume inside an epoch
        then calls the override with the epoch's un-skipped dataloader and the batches this process already
        trained in it, and iterates what it returns; cadence skips nothing itself.

        Args:
            dataloader: the training dataloader, set to the resumed epoch, nothing skipped.
            num_batches: batches (micro-batches) of this process to leave out.

        Returns:
            The dataloader to iterate; this default is accelerate's ``skip_first_batches``, as in transformers.

        Example:
            >>> class MyTrainer(Trainer):
            ...     def get_resumed_dataloader(self, dataloader, num_batches):
            ...         dataloader.dataset.seek(num_batches * self.args.train_batch_size)
            ...         return dataloader
        """
        return skip_first_batches(dataloader, num_batches)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        """The evaluation dataloader (in dataset order over processes). With ``dataloader_persistent_workers``
        it is built once per dataset and batch size and reused, so its workers live on between evaluations
        (transformers keeps ``_eval_dataloaders`` too)."""
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        eval_dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if eval_dataset is None:
            raise ValueError("evaluation needs an eval_dataset: pass it to Trainer or to evaluate()")
        persistent = self.args.dataloader_persistent_workers
        key = (id(eval_dataset), self.args.eval_batch_size)  # a smaller batch after out-of-memory: a new one
        cached = self._eval_dataloaders.get(key) if persistent else None
        if cached is not None and cached[0] is eval_dataset:  # the same object, not a new one at a reused id
            return cached[1]
        data.check_dataset(eval_dataset, "eval_dataset", allow_empty=True)
        loader = self._get_dataloader(eval_dataset, "evaluation", self.args.eval_batch_size,
                                      sampler_fn=self._get_eval_sampler)
        if persistent:
            self._eval_dataloaders[key] = (eval_dataset, loader)
        return loader

    def get_test_dataloader(self, test_dataset: Any) -> DataLoader:
        data.check_dataset(test_dataset, "test_dataset", allow_empty=True)
        return self._get_dataloader(test_dataset, "test", self.args.eval_batch_size, sampler_fn=self._get_eval_sampler)

    def num_examples(self, dataloader: DataLoader) -> int:
        """Samples behind ``dataloader``: its dataset's length, else batches x the per-device batch size."""
        dataset = getattr(dataloader, "dataset", None)
        if isinstance(dataset, data.IterableShard):
            dataset = dataset.dataset
        if has_length(dataset):
            return len(dataset)
        return len(dataloader) * self.args.per_device_train_batch_size

    # ------------------------------------------------------------------ optimizer and scheduler

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            model = model if model is not None else self.model  # transformers 5's optional argument
            self.optimizer = optimization.create_optimizer(model, self.args, self.optimizer_cls_and_kwargs)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if self.lr_scheduler is None:
            self.lr_scheduler = optimization.get_scheduler(
                self.args.lr_scheduler_type,
                optimizer if optimizer is not None else self.optimizer,
                num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
                num_training_steps=num_training_steps,
                scheduler_specific_kwargs=self.args.lr_scheduler_kwargs,
            )
            self._created_lr_scheduler = True  # so the next train() builds a fresh one (as transformers)
        return self.lr_scheduler

    def _new_scheduler(self, num_training_steps: int, optimizer: Any):
        """The arguments' schedule (``create_scheduler``, a subclass's included) on ``optimizer``, leaving the
        Trainer's own as it is (transformers' way of scheduling DeepSpeed's optimizer)."""
        kept, self.lr_scheduler = self.lr_scheduler, None
        try:
            return self.create_scheduler(num_training_steps, optimizer)
        finally:
            self.lr_scheduler = kept

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self.create_optimizer()
        self.create_scheduler(num_training_steps, self.optimizer)

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Names of the parameters weight decay applies to (not biases, not norm layers; transformers' rule)."""
        return optimization.get_decay_parameter_names(model)

    @staticmethod
    def get_optimizer_cls_and_kwargs(args: TrainingArguments, model: nn.Module | None = None) -> tuple[Any, dict[str, Any]]:
        """The optimizer class and its keyword arguments for ``args.optim`` (transformers' static method)."""
        return optimization.get_optimizer_cls_and_kwargs(args, model)

    def get_learning_rates(self) -> list[float]:
        """The current learning rate of each optimizer parameter group."""
        self._require_optimizer()
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_optimizer_group(self, param: str | nn.Parameter | None = None) -> dict[str, Any] | list[list[nn.Parameter]]:
        """The optimizer group holding ``param`` (a parameter or its name in the model); without one, every
        group's parameter list.

        Example:
            >>> trainer.create_optimizer(); trainer.get_optimizer_group("lin.bias")["weight_decay"]
            0.0
        """
        self._require_optimizer()
        return optimization.optimizer_group(self.optimizer, self.backend.unwrap(self.model), param)

    def _require_optimizer(self) -> None:
        if self.optimizer is None:
            raise ValueError("the Trainer has no optimizer yet: call trainer.create_optimizer() (or train()) first")

    # ------------------------------------------------------------------ training: train() and the loop

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None, ignore_keys_for_eval=None, **kwargs) -> TrainOutput:
        """Train the model; returns ``TrainOutput(global_step, training_loss, metrics)``.

        Args:
            resume_from_checkpoint: a ``checkpoint-N`` folder (of cadence or transformers), or True for
                the newest complete one in ``output_dir``. The run continues exactly where that
                checkpoint was written: weights, optimizer, scheduler, RNGs, data position (skipped in
                the sampler, nothing is loaded twice), logged-loss sums and ``TrainerState``. With another
                batch size or number of processes it continues after the samples already trained (not
                bit-identical, a warning says so); a PEFT model loads its adapter.
            trial: a hyperparameter-search trial (``hyperparameter_search`` passes it): the model comes from
                ``model_init(trial)``, ``trainer_state.json`` records its parameters, evaluations report to it.
            ignore_keys_for_eval: output keys to leave out of predictions during evaluation.

        Example:
            >>> out = trainer.train()
            >>> out.metrics["train_loss"]
        """
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {sorted(kwargs)}")
        self.checkpointer.poll(wait=True, reason="train() starts")  # a resume reads complete checkpoints only
        failed = True
        try:
            resume_from_checkpoint = self.checkpointer.claim_output_dir(resume_from_checkpoint)
            self._memory_tracker.start("train")  # a refused run measures nothing (stop() without start is a no-op)
            output = self._train_holding_lock(resume_from_checkpoint, trial, ignore_keys_for_eval)
            failed = False
            return output
        finally:
            if failed:  # the lock goes only once the save in flight is written (its error is logged: one is raising)
                self.checkpointer.abandon()
            self.checkpointer.release_output_dir(failed)  # a failed run leaves no empty output_dir behind
            self._memory_tracker.stop("train")  # after a failure: later evaluations are measured again

    def _train_holding_lock(self, resume_from_checkpoint, trial, ignore_keys_for_eval) -> TrainOutput:
        resume_from_checkpoint = self.checkpointer.resume_folder(resume_from_checkpoint)  # None: a fresh start
        self._trial = trial  # a hyperparameter-search trial (HF's attribute): each evaluation reports to it
        if self.model_init is not None:
            set_seed(self.args.seed)
            self.model = self.model_wrapped = self.call_model_init(trial).to(self.backend.device)
            self.optimizer = self.lr_scheduler = None
        if resume_from_checkpoint is not None:
            logger.info("resuming from %s", resume_from_checkpoint)
            self._load_from_checkpoint(str(resume_from_checkpoint))  # a str, as transformers passes (libraries join it)
        if self.args.use_liger_kernel:  # as transformers: patched by train(), after model_init made the model
            liger.apply(self.backend.unwrap(self.model), self.args.liger_kernel_config)
        if self.args.activation_checkpointing:  # as transformers: on from train() on (enabling twice is harmless)
            how = activation_checkpointing.enable(self.backend.unwrap(self.model), self.args.activation_checkpointing_kwargs)
            logger.info("activation checkpointing on, through %s", how)
        self.is_in_train = True
        hooks = self._attach_training_hooks()
        try:
            with self.backend.collectives_guard(lambda: self.state.global_step):  # a dead process: named error, no hang
                return self._inner_training_loop(args=self.args, resume_from_checkpoint=resume_from_checkpoint,
                                                 trial=trial, ignore_keys_for_eval=ignore_keys_for_eval)
        except BaseException:
            trackers.end_runs_on_error(self.callback_handler.callbacks)  # tracker runs end marked failed
            raise
        finally:  # removed even on an error: the saved and later-evaluated model is clean
            self.is_in_train = False
            for hook in hooks:
                hook.remove()

    def _attach_training_hooks(self) -> list:
        """Hooks that live only inside ``train()``: NEFTune noise, the underflow/overflow detector."""
        model, args = self.backend.unwrap(self.model), self.args
        hooks = []
        if args.neftune_noise_alpha:
            hooks.append(neftune.activate(model, args.neftune_noise_alpha))
        if "underflow_overflow" in args.debug:
            hooks.append(overflow.UnderflowOverflowDetector(model, lambda: self.state.global_step))
        return hooks

    def _inner_training_loop(self, batch_size=None, args=None, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None) -> TrainOutput:
        """The loop: epoch -> optimizer step -> micro-batch (transformers' signature, which subclasses call).

        Args:
            batch_size: unused: in transformers ``find_executable_batch_size`` passes the per-device batch to
                retry with; cadence's ``auto_find_batch_size`` splits each step's batches instead
                (``_shrink_train_batch``), so the batch always is ``args.per_device_train_batch_size``.
            args: the run's arguments (default ``self.args``).
            resume_from_checkpoint: the checkpoint folder to continue from (its weights already loaded), or None.
            trial: the hyperparameter-search trial, recorded in ``trainer_state.json``.
            ignore_keys_for_eval: output keys left out of predictions during evaluation.
        """
        args = args or self.args
        checks.check_trainable(self.model)
        train_dataloader = self.get_train_dataloader()
        layout = self._batch_layout(args)
        max_steps, num_train_epochs, batches_per_epoch = step_counts(
            args, layout, len(train_dataloader) if has_length(train_dataloader) else None, self.train_dataset)
        if self._created_lr_scheduler:  # a finished schedule would train at its last rate (often 0)
            self.lr_scheduler, self._created_lr_scheduler = None, False
        # the optimizer and schedule built (create_optimizer, create_scheduler) and the model prepared; under
        # DeepSpeed with optimizer/scheduler sections in its config, the engine builds its own instead of those
        model, self.optimizer, self.lr_scheduler = self.backend.prepare_training(
            self.model, self.create_optimizer, functools.partial(self.create_scheduler, max_steps), max_steps,
            functools.partial(self._new_scheduler, max_steps))
        self.model_wrapped = model

        self.state = TrainerState(
            is_local_process_zero=self.state.is_local_process_zero,
            is_world_process_zero=self.state.is_world_process_zero,
            max_steps=max_steps,
            num_train_epochs=num_train_epochs,
            train_batch_size=args.train_batch_size,
            stateful_callbacks=self.state.stateful_callbacks,
        )
        self.state.compute_steps(args, max_steps)
        if trial is not None:  # trainer_state.json records the trial, as transformers does
            from . import hyperparameter_search
            hyperparameter_search.record_trial(self, trial)
        tokens = data.TokenCounter(args.include_num_input_tokens_seen, getattr(self.model, "main_input_name", "input_ids"),
                                   getattr(self.processing_class, "pad_token_id", None))
        job = output_guard.job_identity()  # saved with the data's identity: a restarted torchrun job finds its own
        loop = LoopState(self.backend, args.logging_nan_inf_filter, tokens, layout, batches_per_epoch,
                         {**data_identity(self.train_dataset), **({"job": job} if job else {})})
        loop.count_items = loss_utils.counts_items(layout.gradient_accumulation_steps, layout.world_size,
                                                   self.compute_loss_func, self.model)
        resume = None
        if resume_from_checkpoint is not None:
            resume = self.checkpointer.load(resume_from_checkpoint, model, loop)
            if type(self)._load_optimizer_and_scheduler is not Trainer._load_optimizer_and_scheduler:
                self._load_optimizer_and_scheduler(resume_from_checkpoint)  # a subclass's own state (TRL's GRPO)
            self._load_callback_state()
        for handler_attr in ("model", "optimizer", "lr_scheduler"):
            setattr(self.callback_handler, handler_attr, getattr(self, handler_attr))
        self.callback_handler.train_dataloader = train_dataloader
        self._log_run_header(loop)
        loop.begin(self.state, list(model.parameters()))
        self._loop = loop  # log() reads the run's token count from it
        self.model.zero_grad(set_to_none=True)  # the module itself: an engine wrapping it (DeepSpeed) has its own signature
        model.train()
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start:
            self._evaluate(trial, ignore_keys_for_eval, skip_scheduler=True)
        # a subclass's _maybe_log_save_evaluate (transformers' signature) reads tr_loss: the step's losses folded in
        override_logs = type(self)._maybe_log_save_evaluate is not Trainer._maybe_log_save_evaluate

        first_epoch = 0 if resume is None else resume.epoch
        ga = layout.gradient_accumulation_steps
        for epoch in range(first_epoch, num_train_epochs):  # ---- epoch
            self.checkpointer.poll(wait=False)  # an epoch-end save already written: on_save before on_epoch_begin (HF)
            batches = self._begin_epoch(train_dataloader, epoch, resume if epoch == first_epoch else None, loop)
            while True:  # ---- optimizer step: the next `ga` batches
                window = [b for _, b in zip(range(ga), batches)]
                if not window:
                    break
                loop.batches_in_epoch += len(window)
                loop.items = (loss_utils.step_items(window, self._shifts_labels, self.backend)
                              if loop.count_items or loop.micro_batch_rows else None)
                self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                self._forward_backward(model, window, loop)  # ---- micro-batches
                # counted after the step, as transformers: a training_step that rewrites its batch in place (TRL's
                # GKD generates on-policy completions into it) counts the tokens it trained on
                loop.count(window, self.floating_point_ops)
                self._optimizer_step(loop)  # ---- clip, step, schedule
                self.state.global_step += 1
                if args.torch_empty_cache_steps and self.state.global_step % args.torch_empty_cache_steps == 0:
                    self.backend.empty_cache()
                self.state.epoch = epoch + loop.batches_in_epoch / batches_per_epoch if batches_per_epoch else None
                self.control = self.callback_handler.on_step_end(args, self.state, self.control)
                if override_logs:
                    loop.fold()
                self._maybe_log_save_evaluate(loop.sum, loop.grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                              loop.start_time, learning_rate=loop.learning_rate)
                if self.control.should_epoch_stop or self.control.should_training_stop:
                    break
            if batches_per_epoch is None and loop.batches_in_epoch == 0:
                logger.warning("the training dataset yielded no batch: stopping at step %d", self.state.global_step)
                self.control.should_training_stop = True
            # transformers fires a save's on_save before on_epoch_end: a background save of this epoch's last step
            # that is already written fires now; at the last epoch it is waited for (train() waits for it anyway)
            last = epoch == num_train_epochs - 1 or self.control.should_training_stop
            self.checkpointer.poll(wait=last, reason="the last epoch ends")
            self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
            loop.epoch, loop.batches_in_epoch = epoch + 1, 0
            if override_logs:
                loop.fold()
            self._maybe_log_save_evaluate(loop.sum, loop.grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                          loop.start_time, learning_rate=loop.learning_rate)
            if self.control.should_training_stop:
                break

        return self._finish_training(loop)

    # ------------------------------------------------------------------ the loop's helpers, in the order the loop calls them

    def _log_run_header(self, loop: LoopState) -> None:
        """transformers' header, line for line: log readers and tools grep for this wording."""
        args, batches_per_epoch, max_steps = self.args, loop.batches_per_epoch, self.state.max_steps
        ga = loop.layout.gradient_accumulation_steps
        examples = f"{len(self.train_dataset):,}" if has_length(self.train_dataset) else "Unknown"
        per_epoch = f"{loop.layout.steps_per_epoch(batches_per_epoch):,}" if batches_per_epoch else "Unknown"
        logger.info("***** Running training *****")
        logger.info(f"  Num examples = {examples}")
        logger.info(f"  Num Epochs = {self.state.num_train_epochs:,}")
        logger.info(f"  Num update steps per epoch = {per_epoch}")
        logger.info(f"  Instantaneous batch size per device = {args.per_device_train_batch_size:,}")
        logger.info(f"  Total train batch size (w. parallel, distributed & accumulation) = {self.get_total_train_batch_size(args):,}")
        logger.info(f"  Gradient Accumulation steps = {ga}")
        logger.info(f"  Total optimization steps = {max_steps:,}")
        logger.info(f"  Number of trainable parameters = {self.get_num_trainable_parameters():,}")

    def _begin_epoch(self, train_dataloader: DataLoader, epoch: int, resume: ResumePoint | None, loop: LoopState):
        """Order the epoch's data (after a resume: without the batches already trained), fire
        ``on_epoch_begin`` and return the batch iterator (``data.epoch_batches``); ``loop``'s position is set to
        the epoch's start."""
        # a subclass's get_resumed_dataloader (transformers 5.25) alone skips the trained batches, from the whole epoch
        own_skip = None
        if resume is not None and type(self).get_resumed_dataloader is not Trainer.get_resumed_dataloader:
            own_skip = self.get_resumed_dataloader
        loop.epoch = epoch
        loop.batches_in_epoch = 0 if resume is None else resume.trained_batches if own_skip else resume.skip_batches

        def begin_epoch() -> None:
            self.control = self.callback_handler.on_epoch_begin(self.args, self.state, self.control)

        # the RNGs each pending batch was drawn from, kept only where a checkpoint may be written and the main process
        # collates (a resume then draws it again from them)
        keep = (self.args.save_strategy != "no" or self.args.enable_jit_checkpoint) and not self.args.dataloader_num_workers
        capture = self.checkpointer.capture_rng if keep else None
        loop.batches = data.epoch_batches(train_dataloader, epoch, begin_epoch, self.args.train_batch_size, resume,
                                          own_skip, capture, self.checkpointer.restore_rng)
        return loop.batches

    def _forward_backward(self, model: nn.Module, window: list, loop: LoopState) -> None:
        """Forward and backward of a step's micro-batches, gradients synced on the last only.

        With ``auto_find_batch_size``, a step that runs out of memory is redone from zeroed gradients
        in smaller micro-batches (``loop.micro_batch_rows`` rows at most).
        """
        while True:
            micro_batches = data.split_batches(window, loop.micro_batch_rows)
            loop.micro_batches = self.current_gradient_accumulation_steps = len(micro_batches)
            try:
                step_losses = []
                for i, inputs in enumerate(micro_batches):
                    last = i == len(micro_batches) - 1
                    with contextlib.nullcontext() if last else self.backend.no_sync(model):
                        step_losses.append(self.training_step(model, inputs, loop.items))
                    if not last:
                        self.control = self.callback_handler.on_substep_end(self.args, self.state, self.control)
                break
            except Exception as error:  # noqa: BLE001 - anything but out-of-memory is re-raised
                self._shrink_train_batch(error, model, window, loop)
        loop.add(step_losses)

    def _shrink_train_batch(self, error: Exception, model: nn.Module, window: list, loop: LoopState) -> None:
        """After an out-of-memory error (with ``auto_find_batch_size``): drop the step's gradients, free memory,
        and cut each batch into micro-batches 10% smaller than before (transformers' and accelerate's rule:
        64 -> 57 -> 51 ...), so the per-device batch shrinks, the accumulation grows and the global batch
        stays the same; ``loop.items`` counted if not yet. Any other error, or one at a per-device batch
        of 1, is re-raised."""
        size = loop.micro_batch_rows or loop.layout.train_batch_size
        if not (self.args.auto_find_batch_size and _is_out_of_memory(error)) or size <= 1:
            raise error
        self.backend.free_memory(model, error)  # the failed attempt's partial gradients must not count
        loop.micro_batch_rows = self.state.train_batch_size = int(size * 0.9)
        per_batch = -(-loop.layout.train_batch_size // loop.micro_batch_rows)
        logger.warning(
            "out of memory at per-device train batch size %d: redoing step %d with micro-batches of %d "
            "(%d x %d accumulation, global batch unchanged)", size, self.state.global_step + 1, loop.micro_batch_rows,
            per_batch, loop.layout.gradient_accumulation_steps,
        )
        if loop.items is None:  # micro-batches of a batch differ in items: weigh them by their counts from now on
            items = loss_utils.window_items(window, self._shifts_labels)
            loop.items = None if items is None else items.to(self.backend.device)

    def _optimizer_step(self, loop: LoopState) -> None:
        """Clip, step (fp16 loss scaling may skip it), schedule, zero; notes the step's grad norm and learning rate."""
        params = loop.params
        if self.args.max_grad_norm is not None and self.args.max_grad_norm > 0:  # <= 0 or None: no clipping (HF)
            loop.grad_norm = self.backend.clip_grad_norm(params, self.args.max_grad_norm, self.optimizer)
        self.control = self.callback_handler.on_pre_optimizer_step(self.args, self.state, self.control)
        stepped = self.backend.optimizer_step(self.optimizer)  # False: loss scaling skipped it
        self.control = self.callback_handler.on_optimizer_step(self.args, self.state, self.control)
        loop.learning_rate = self.optimizer.param_groups[0]["lr"]
        loop.skipped += not stepped
        if stepped and not optimization.steps_on_metric(self.lr_scheduler):  # those step on eval metrics
            self.lr_scheduler.step()
        for p in params:  # model.zero_grad(set_to_none=True), without walking the module tree every step
            p.grad = None

    def _maybe_log_save_evaluate(self, tr_loss: torch.Tensor, grad_norm: torch.Tensor | float | None, model: nn.Module,
                                 trial: Any, epoch: int, ignore_keys_for_eval: list[str] | None, start_time: float,
                                 learning_rate: float | None = None) -> None:
        """Log, evaluate and save as ``self.control`` asks (after each optimizer step and each epoch's end).

        transformers' signature and arguments, for subclasses that override it (TRL's online DPO):

        Args:
            tr_loss: the sum of the step losses since the last log on this process (float64; cadence's own log
                reads the same sum). An override that logs itself resets it in place (``tr_loss -= tr_loss``) and
                moves ``self._globalstep_last_logged`` and ``self._total_loss_scalar``, as in transformers.
            grad_norm: the last step's gradient norm (None without clipping).
            model: the model being trained (wrapped).
            trial: the hyperparameter-search trial, or None.
            epoch: the index of the current epoch.
            ignore_keys_for_eval: output keys left out of predictions in evaluation.
            start_time: when this ``train()`` call started.
            learning_rate: the learning rate the last step used.
        """
        loop = self._loop
        self.checkpointer.poll(wait=False)  # a background save written since: on_save now (its error: raised now)
        if self.control.should_log or self.control.should_save:
            loop.store_counts(self.state)
        if self.control.should_log and self.state.global_step > loop.last_logged_step:
            logs = loop.interval_logs(self.state.global_step)  # the one host sync of a log
            if grad_norm is not None:
                logs["grad_norm"] = grad_norm.item() if torch.is_tensor(grad_norm) else grad_norm
            logs["learning_rate"] = learning_rate if learning_rate is not None else self._get_learning_rate()
            loop.last_logged_step = self.state.global_step
            self.log(logs, start_time)
        if self.control.should_evaluate:
            metrics = self._evaluate(trial, ignore_keys_for_eval)
            is_new_best = self._determine_best_metric(metrics, trial)
            if self.args.save_strategy == "best":  # save exactly when the evaluation improved
                self.control.should_save = is_new_best
        if self.control.should_save:
            self._save_checkpoint(model, trial)  # transformers' call: TRL overrides it as (model, trial)
            if not self.checkpointer.in_flight:  # written: on_save now
                self.control = self.callback_handler.on_save(self.args, self.state, self.control)
            else:  # on_save fires once the folder is complete (Checkpointer.poll); the request is served as at once
                self.control.should_save = False

    def _evaluate(self, trial: Any, ignore_keys_for_eval: list[str] | None, skip_scheduler: bool = False) -> dict[str, float]:
        """Evaluate during training, report to the hyperparameter search's ``trial`` (optuna may stop it here), and
        step a scheduler that steps on metrics (``ReduceLROnPlateau``, GreedyLR) unless ``skip_scheduler``
        (transformers' method; the model stays in eval mode until the next ``training_step``, as there)."""
        metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        if getattr(self, "_trial", None) is not None:  # a search's trial (the same object as ``trial``)
            from . import hyperparameter_search
            hyperparameter_search.report(self, metrics)
        if optimization.steps_on_metric(self.lr_scheduler) and not skip_scheduler:
            self.lr_scheduler.step(evaluation.best_metric_value(metrics, self.args.metric_for_best_model or "loss"))
        return metrics

    def _get_learning_rate(self) -> float:
        """The learning rate of the optimizer's first group now (transformers' method)."""
        return self.optimizer.param_groups[0]["lr"]

    # transformers' names for the loop's loss bookkeeping, read and moved by overrides of _maybe_log_save_evaluate:
    # views of the running train()'s LoopState, so cadence's logs and train_loss see what an override did
    _globalstep_last_logged = property(lambda self: self._running_loop().last_logged_step,
                                       lambda self, step: setattr(self._running_loop(), "last_logged_step", step))
    _total_loss_scalar = property(lambda self: self._running_loop().total,
                                  lambda self, value: setattr(self._running_loop(), "total", value))

    @property
    def _tr_loss(self) -> torch.Tensor:
        loop = self._running_loop()
        loop.fold()
        return loop.sum

    def _running_loop(self) -> LoopState:
        if self._loop is None:
            raise AttributeError("the loop's loss counters exist once train() has started")
        return self._loop

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any = None) -> bool:
        """Update ``state.best_metric`` / ``best_global_step`` from an evaluation; True on a new best."""
        if self.args.metric_for_best_model is None:
            return False
        # Checked here, not when the Trainer is built (as transformers): a subclass's evaluate or a callback may add it.
        value = evaluation.best_metric_value(metrics, self.args.metric_for_best_model)
        if not evaluation.is_improvement(value, self.state.best_metric, self.args.greater_is_better):
            return False
        self.state.best_metric = value
        if self.args.save_strategy in ("steps", "epoch", "best"):
            self.state.best_global_step = self.state.global_step
        return True

    def _finish_training(self, loop: LoopState) -> TrainOutput:
        self.checkpointer.poll(wait=True, reason="train() returns")  # every checkpoint complete, its on_save fired
        train_loss, metrics = loop.final_metrics(self.state, self.get_total_train_batch_size(self.args),
                                                 self.args.include_num_input_tokens_seen != "no", self.args.world_size)
        self._memory_tracker.stop_and_update_metrics("train", metrics)
        jit = next((cb for cb in self.callback_handler.callbacks if isinstance(cb, JITCheckpointCallback)), None)
        self.state.interrupted = bool(jit and jit.requested) and self.state.global_step < self.state.max_steps
        if self.state.interrupted:
            metrics["interrupted"] = True
            logger.warning(
                "training was interrupted by %s at step %d of %d: checkpoint-%d is saved and the model is only partly "
                "trained; exit with a non-zero status so the scheduler requeues the job, and resume with "
                "train(resume_from_checkpoint=True)", jit.requested, self.state.global_step, self.state.max_steps,
                self.state.global_step)
        self.log(metrics)
        optimization.set_optimizer_mode(self.optimizer, training=False)  # schedule-free: end on the averaged weights
        if self.args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            self._load_best_model()
        if not self.state.interrupted:  # an interrupted run keeps its newest checkpoint: it resumes from there
            self.checkpointer.finish()  # save_total_limit=1: the best only
        # the model stays in the mode its last step or evaluation left it in (training mode after a step), as in
        # transformers
        self.control = self.callback_handler.on_train_end(self.args, self.state, self.control)
        return TrainOutput(self.state.global_step, train_loss, metrics)

    # ------------------------------------------------------------------ one micro-batch: training_step -> compute_loss

    def training_step(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | None = None) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns its detached share of the step's loss.

        Args:
            model: the (possibly wrapped) model.
            inputs: the micro-batch.
            num_items_in_batch: items of the whole optimizer step over all processes (None when not counted).
        """
        model.train()  # every step, as transformers: a save or a callback in between may have left it in eval mode
        inputs = self._prepare_inputs(inputs)  # a subclass may build the batch here (TRL's GRPO generates)
        checks.check_batch(inputs)
        optimization.set_optimizer_mode(self.optimizer, training=True)  # schedule-free: back to its training point
        with self.compute_loss_context_manager():
            count = {"num_items_in_batch": num_items_in_batch} if self._compute_loss_takes_items else {}
            try:
                loss = self.compute_loss(model, inputs, **count)
            except RuntimeError as error:  # torch's dtype error for float labels, explained
                checks.explain_label_error(error, inputs)
                raise
        if not (torch.is_tensor(loss) and loss.dim() == 0 and loss.requires_grad):
            checks.check_loss(loss, self._loss_source(model))
        normalised = num_items_in_batch is not None and self._loss_is_normalised()
        weight = loss_utils.micro_batch_weight(inputs, normalised, num_items_in_batch,
                                               self.current_gradient_accumulation_steps, self._shifts_labels,
                                               self.backend.data_parallel_size)
        if torch.is_tensor(weight):
            loss = loss * weight.to(loss.dtype)  # the ratio in the loss's precision (float64 models stay exact)
        elif weight != 1.0:
            loss = loss * weight
        self.backend.backward(loss)
        return loss.detach()

    def _prepare_input(self, data: Any) -> Any:
        """Move one value (tensor, or dict/tuple/list of them, nested) to the device."""
        if isinstance(data, Mapping):
            return type(data)({k: self._prepare_input(v) for k, v in data.items()})
        if isinstance(data, (tuple, list)):
            return type(data)(self._prepare_input(v) for v in data)
        if torch.is_tensor(data) and data.device != self.backend.device:
            return data.to(self.backend.device, non_blocking=True)
        return data

    def _prepare_inputs(self, inputs: Any) -> Any:
        """The batch on the device (``_prepare_input``); subclasses override it and call ``super()``, so the
        recursion lives in ``_prepare_input`` and an override is entered once per batch."""
        inputs = self._prepare_input(inputs)
        if isinstance(inputs, Mapping) and len(inputs) == 0:
            raise ValueError(
                "the batch is empty: the collator returned no columns. The training data must hold columns the "
                f"model takes ({', '.join(self._signature_columns or ['its forward() arguments'])}); check the "
                "dataset's column names, or set remove_unused_columns=False")
        return inputs

    def compute_loss_context_manager(self):
        """The context ``compute_loss`` runs in (HF's name, for subclasses). With ``bf16``/``fp16`` the prepared model's
        forward autocasts itself and returns float32 outputs, as accelerate's does in transformers, so this is empty
        and a loss computed from the outputs is float32; under FSDP it autocasts forward and loss."""
        return self.backend.loss_context()

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch=None):
        """The loss of one batch: ``compute_loss_func`` > label smoothing > the model's own loss.

        Args:
            model: the model to run.
            inputs: the batch, as a dict of tensors.
            return_outputs: also return the model outputs.
            num_items_in_batch: the step's item count; given to ``compute_loss_func``, the label
                smoother, and models that accept it.

        Returns:
            the loss, or ``(loss, outputs)`` with ``return_outputs``.
        """
        labels = None
        if (self.compute_loss_func is not None or self.label_smoother is not None) and "labels" in inputs:
            inputs = dict(inputs)
            labels = inputs.pop("labels")
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None and isinstance(inputs, Mapping):
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
        outputs = model(**inputs) if isinstance(inputs, Mapping) else model(*inputs)
        if labels is not None and self.compute_loss_func is not None:
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        elif labels is not None:
            loss = self.label_smoother(outputs, labels, shift_labels=self._shifts_labels, num_items_in_batch=num_items_in_batch)
        else:
            loss = loss_utils.loss_from_outputs(outputs, inputs)
        normalised = loss_utils.returns_normalised(self.model_accepts_loss_kwargs, self.compute_loss_func,
                                                   self.label_smoother)
        loss = loss_utils.data_parallel_scale(loss, num_items_in_batch, normalised, model.training,
                                              self.backend.data_parallel_size)
        return (loss, outputs) if return_outputs else loss

    def _loss_source(self, model: nn.Module) -> str:
        """What produced the loss, for error messages."""
        if type(self).compute_loss is not Trainer.compute_loss:
            return f"{type(self).__name__}.compute_loss"
        if self.compute_loss_func is not None:
            return f"compute_loss_func ({getattr(self.compute_loss_func, '__name__', type(self.compute_loss_func).__name__)})"
        return f"the model's forward ({type(self.backend.unwrap(model)).__name__}, its loss output)"

    def _loss_is_normalised(self) -> bool:
        """Whether ``compute_loss`` returns the step-normalised sum (divided by ``num_items_in_batch``)
        rather than its batch's mean. An overridden ``compute_loss`` that has no ``num_items_in_batch``
        parameter cannot normalise, so its mean is weighted by the batch's share of the step's items."""
        if self.loss_is_scaled_for_ga is not None:
            return self.loss_is_scaled_for_ga
        return self._compute_loss_takes_items and loss_utils.returns_normalised(
            self.model_accepts_loss_kwargs, self.compute_loss_func, self.label_smoother)

    def floating_point_ops(self, inputs: dict[str, Any]) -> float:
        """Forward and backward FLOPs of one batch, counted as transformers counts them: 6 x parameters (embeddings
        excluded) x positions of the model's main input, or 0 (transformers' "unknown") for a model without
        ``num_parameters`` or a batch without the main input (sentence-transformers' ``anchor_input_ids``, ORPO's
        ``chosen_input_ids``), so ``total_flos`` is the number transformers logs. Override it for another count.

        Args:
            inputs: the batch.
        """
        model = self.model
        rate = self.__dict__.get("_flops_rate")
        if rate is None or rate[0] is not model:  # looked up once per model: this runs every micro-batch
            count = getattr(model, "num_parameters", None)
            per_token = 6.0 * count(exclude_embeddings=True) if callable(count) else 0.0
            rate = self._flops_rate = (model, getattr(model, "main_input_name", "input_ids"), per_token)
        _, main_input, per_token = rate
        ids = inputs.get(main_input) if isinstance(inputs, Mapping) else None
        return per_token * ids.numel() if torch.is_tensor(ids) else 0.0

    # ------------------------------------------------------------------ evaluation and prediction: evaluate/predict -> evaluation_loop -> prediction_step

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Run evaluation; returns metrics (``{prefix}_loss``, ``compute_metrics``' values, speed).

        Args:
            eval_dataset: overrides ``self.eval_dataset``; a dict evaluates each entry with prefix
                ``{metric_key_prefix}_{name}``.
            ignore_keys: output keys to leave out of the predictions.
            metric_key_prefix: the prefix of every metric name.

        Example:
            >>> trainer.evaluate()["eval_loss"]
        """
        eval_dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(eval_dataset, dict):
            metrics: dict[str, float] = {}
            for name, ds in eval_dataset.items():
                metrics.update(self.evaluate(ds, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        self._memory_tracker.start("eval")
        try:  # no metrics to compute: gather no predictions (else args.prediction_loss_only decides)
            output = self._timed_evaluation_loop(lambda: self.get_eval_dataloader(eval_dataset), "Evaluation",
                                                 True if self.compute_metrics is None else None, ignore_keys,
                                                 metric_key_prefix)
            self.log(output.metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=output.metrics)
            self._memory_tracker.stop_and_update_metrics("eval", output.metrics)  # returned, not logged (transformers)
        finally:
            self._memory_tracker.stop("eval")
        return output.metrics

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test") -> PredictionOutput:
        """Predictions, label ids and metrics on ``test_dataset``.

        Example:
            >>> out = trainer.predict(test_ds)
            >>> out.predictions.shape
        """
        self._memory_tracker.start("test")
        try:
            output = self._timed_evaluation_loop(lambda: self.get_test_dataloader(test_dataset), "Prediction", None,
                                                 ignore_keys, metric_key_prefix)
            self.control = self.callback_handler.on_predict(self.args, self.state, self.control, output.metrics)
            self._memory_tracker.stop_and_update_metrics("test", output.metrics)
        finally:
            self._memory_tracker.stop("test")
        return PredictionOutput(output.predictions, output.label_ids, output.metrics)

    def _timed_evaluation_loop(self, make_dataloader: Callable[[], DataLoader], description: str,
                               prediction_loss_only: bool | None, ignore_keys: list[str] | None,
                               metric_key_prefix: str) -> EvalLoopOutput:
        """``evaluation_loop`` over a fresh ``make_dataloader()``, retried with a 10% smaller eval batch after an
        out-of-memory error (``auto_find_batch_size``); its metrics gain the speed metrics of the whole call."""
        start = time.time()
        while True:
            try:
                output = self.evaluation_loop(make_dataloader(), description, prediction_loss_only, ignore_keys,
                                              metric_key_prefix)
                break
            except Exception as error:  # noqa: BLE001 - anything but out-of-memory is re-raised
                self._shrink_eval_batch(error)
        output.metrics.update(speed_metrics(metric_key_prefix, start, num_samples=output.num_samples,
                                            num_steps=math.ceil(output.num_samples / (self.args.eval_batch_size * self.args.world_size))))
        return output

    def _shrink_eval_batch(self, error: Exception) -> None:
        """After an out-of-memory error in evaluation (with ``auto_find_batch_size``): the eval batch 10% smaller."""
        size = self.args.per_device_eval_batch_size
        if not (self.args.auto_find_batch_size and _is_out_of_memory(error)) or size <= 1:
            raise error
        self.backend.free_memory()
        self.args.per_device_eval_batch_size = int(size * 0.9)  # as transformers shrinks the train batch
        logger.warning("out of memory at per-device eval batch size %d: evaluating again with %d", size,
                       self.args.per_device_eval_batch_size)

    def evaluation_loop(self, dataloader: DataLoader, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
        """Run ``prediction_step`` over ``dataloader``: gathered predictions, metrics, the exact item-mean loss.

        See ``evaluation``'s docstring for how the loss is computed and what stays in memory.
        """
        args = self.args
        if prediction_loss_only is None:
            prediction_loss_only = args.prediction_loss_only
        model = self.model_wrapped if self.model_wrapped is not self.model else self.backend.prepare_model(self.model)
        if not self.is_in_train:  # fp16/bf16_full_eval: cast in place, as transformers (never mid-training)
            model = self.backend.cast_for_eval(model)
        model.eval()
        optimization.set_optimizer_mode(self.optimizer, training=False)  # schedule-free: its averaged weights
        self.callback_handler.eval_dataloader = dataloader
        logger.info(f"\n***** Running {description} *****")  # transformers' wording, which tools grep for
        dataset = getattr(dataloader, "dataset", None)  # a subclass may return a plain iterable of batches
        logger.info(f"  Num examples = {self.num_examples(dataloader)}" if has_length(dataset) else "  Num examples: Unknown")
        logger.info(f"  Batch size = {args.eval_batch_size}")
        per_batch = args.batch_eval_metrics  # compute_metrics per batch; evaluation then keeps nothing
        keep = not per_batch or description == "Prediction"  # predict() returns the predictions regardless
        is_padding = evaluation.padding_marker(dataloader)
        gather = evaluation.Gatherer(self.backend, args.eval_use_gather_object)
        dataset_rows = len(dataset) if isinstance(getattr(dataloader, "batch_sampler", None), data.EvalBatchSampler) else None
        collected = evaluation.Collector(args.eval_accumulation_steps, args.eval_do_concat_batches, dataset_rows)
        loss_mean = evaluation.ItemMean(self.backend.device)
        metrics: dict[str, float] | None = None
        observed = 0
        for step, (inputs, is_last) in enumerate(evaluation.with_last(dataloader)):
            inputs = self._prepare_input(inputs)  # on the device; prediction_step calls _prepare_inputs, as in HF
            loss, logits, labels = self.prediction_step(model, inputs, prediction_loss_only, ignore_keys)
            rows = evaluation.batch_rows(inputs)
            real_rows = 0 if is_padding(step) else rows
            observed += real_rows
            if loss is not None and real_rows:
                loss_mean.add(loss, loss_utils.eval_items(inputs, rows, self._shifts_labels))
            if not prediction_loss_only:
                if self.preprocess_logits_for_metrics is not None and logits is not None:
                    logits = self.preprocess_logits_for_metrics(logits, labels)
                step_outputs = evaluation.metric_inputs(inputs, loss, logits, labels, rows, args.include_for_metrics,
                                                      getattr(self.model, "main_input_name", "input_ids"))
                outputs = gather(step_outputs, real_rows)
                if keep:
                    collected.add(outputs)
                if per_batch and self.compute_metrics is not None and logits is not None and labels is not None:
                    metrics = evaluation.call_compute_metrics(self.compute_metrics, outputs, compute_result=is_last)
            self.control = self.callback_handler.on_prediction_step(args, self.state, self.control)
        result = collected.result()
        predictions, label_ids = result.get("predictions"), result.get("label_ids")
        if not per_batch and self.compute_metrics is not None and predictions is not None and label_ids is not None:
            metrics = evaluation.call_compute_metrics(self.compute_metrics, result)
        metrics = metrics or {}
        mean = loss_mean.result(self.backend)
        if mean is not None:
            metrics["loss"] = mean
        metrics = evaluation.prefix_metrics(metrics, metric_key_prefix)
        num_samples = len(dataset) if has_length(dataset) else observed * self.backend.data_parallel_size
        return EvalLoopOutput(predictions=predictions, label_ids=label_ids, metrics=metrics, num_samples=num_samples)

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[torch.Tensor | None, Any, Any]:
        """One evaluation batch: ``(loss, logits, labels)``; logits and labels None when only the loss is wanted.

        Args:
            model: the model in eval mode.
            inputs: the batch on the device.
            prediction_loss_only: return only the loss.
            ignore_keys: output keys to drop from the logits.
        """
        mapping = isinstance(inputs, Mapping)
        has_labels = mapping and len(self.label_names) > 0 and all(inputs.get(k) is not None for k in self.label_names)
        # transformers: a model without label arguments is asked for its loss when it can return one (CLIP-like models;
        # sentence-transformers sets can_return_loss) or the batch says return_loss
        return_loss = inputs.get("return_loss") if mapping else None
        loss_without_labels = not self.label_names and (self.can_return_loss if return_loss is None else return_loss)
        inputs = self._prepare_inputs(inputs)  # a subclass's override (TRL's GRPO generates here), as in transformers
        checks.check_batch(inputs)
        if ignore_keys is None:  # HF's default: the config's list, else ["cache"]; no config, nothing
            config = getattr(self.model, "config", None)
            ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", ["cache"]) or []) if config is not None else []
        labels = None
        if has_labels or loss_without_labels:
            labels = tuple(inputs[k].detach() for k in self.label_names)  # () without label names, as transformers
            labels = labels[0] if len(labels) == 1 else labels
        with torch.no_grad(), self.compute_loss_context_manager():
            if has_labels or loss_without_labels:
                # the batch's items, as in training (a compute_loss_func divides by it); a subclass's own compute_loss
                # gets none, as in transformers (TRL's scale a loss given items by the number of processes)
                items = data.batch_items(inputs, self._shifts_labels)
                own = type(self).compute_loss is Trainer.compute_loss
                count = {"num_items_in_batch": items} if self._compute_loss_takes_items and own else {}
                loss, outputs = self.compute_loss(model, inputs, return_outputs=True, **count)
                loss = loss.detach().mean()
                skip = {"loss", *ignore_keys}
            else:
                outputs = model(**inputs) if isinstance(inputs, Mapping) else model(*inputs)
                loss, skip = None, set(ignore_keys)
        if prediction_loss_only:
            return loss, None, None
        logits = evaluation.outputs_to_logits(outputs, skip, has_labels or loss_without_labels)
        return loss, logits, labels

    # ------------------------------------------------------------------ saving and loading

    def _save_checkpoint(self, model: nn.Module, trial: Any = None, loop_state: LoopState | None = None) -> Path:
        """Write ``checkpoint-{global_step}`` atomically, then rotate (``Checkpointer.save``; every process calls it).

        Args:
            model: the model being trained (its unwrapped module is what is saved).
            trial: unused (transformers' signature).
            loop_state: the loop's state (data position, loss sums: ``loop_state.json``) for an exact resume;
                default: the running ``train()``'s, so an override with transformers' ``(model, trial)`` that calls
                ``super()`` saves it too.
        """
        if loop_state is None and self.is_in_train:
            loop_state = self._loop
        return self.checkpointer.save(model, loop_state)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """Load the weights of a checkpoint folder into ``model`` (default ``self.model``): safetensors or
        ``weights_only`` files, sharded, PEFT adapters (transformers' method; ``train()`` resumes through it)."""
        self.checkpointer.load_weights(model if model is not None else self.model, resume_from_checkpoint)

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Warn about the missing and unexpected keys of ``load_result`` (what ``load_state_dict`` returns); keys
        missing only because the model does not save them (``_keys_to_ignore_on_save``) re-tie its weights instead
        (transformers' method, which libraries' ``_load_from_checkpoint`` call)."""
        ignored = getattr(self.model, "_keys_to_ignore_on_save", None)
        if load_result.missing_keys:
            if ignored and set(load_result.missing_keys) == set(ignored):
                self.model.tie_weights()
            else:
                logger.warning(f"There were missing keys in the checkpoint model loaded: {load_result.missing_keys}.")
        if load_result.unexpected_keys:
            logger.warning(f"There were unexpected keys in the checkpoint model loaded: {load_result.unexpected_keys}.")

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Load the optimizer's and scheduler's states of a checkpoint folder (transformers' method). A resume
        restores them with everything else; a subclass's override is called after that, to load its own files."""
        if checkpoint is None:
            return
        self.checkpointer.load_optimizer_and_scheduler(checkpoint)

    def _get_output_dir(self, trial: Any = None) -> str:
        """The folder this run's checkpoints go to: ``args.output_dir`` (a hyperparameter-search trial's
        arguments already name its ``run-{id}`` folder)."""
        return self.args.output_dir

    @property
    def tokenizer(self) -> Any:
        """``processing_class`` under transformers 4.x's name, with 4.57's deprecation warning."""
        logger.warning("Trainer.tokenizer is now deprecated. You should use Trainer.processing_class instead.")
        return self.processing_class

    @tokenizer.setter
    def tokenizer(self, processing_class: Any) -> None:
        logger.warning("Trainer.tokenizer is now deprecated. You should use `Trainer.processing_class = "
                       "processing_class` instead.")
        self.processing_class = processing_class

    def _nested_gather(self, tensors: Any, name: str | None = None) -> Any:
        """transformers 4.x's gather (gone in 5.2, still called by 4.x-era subclasses: sentence-transformers' log,
        TRL's OnlineDPO): ``tensors`` (nested) concatenated over processes, a 0-d tensor as one row a process;
        unchanged on one process. ``name`` was for TPUs."""
        return None if tensors is None else self.backend.gather(tensors)

    @property
    def push_in_progress(self):
        """The Hub upload still running from the last push (``.is_done()``), or None (transformers' attribute)."""
        jobs = [job for job, _ in self.hub_repo.in_flight] if self.hub_repo is not None else []
        if not jobs:
            return None
        from . import hub
        return hub.PushInProgress(jobs)

    def _load_callback_state(self) -> None:
        """With ``restore_callback_states_from_checkpoint``: rebuild the stateful callbacks and the
        ``TrainerControl`` from ``self.state.stateful_callbacks`` (transformers' method); warn naming the
        checkpoint's callbacks this run does not have."""
        if not self.args.restore_callback_states_from_checkpoint:
            return
        missing = self.checkpointer.load_callback_states()  # self.control rebuilt too
        if missing:  # formatted here: code that patches logger.warning reads the names in the message
            logger.warning(f"the checkpoint holds the state of callbacks this run does not use, ignored: {', '.join(missing)}"
                           " (pass them in callbacks=[...] to restore them)")

    def _load_best_model(self) -> None:
        """Put the weights of ``state.best_model_checkpoint`` into the model (every process reads them)."""
        self.checkpointer.load_best_model()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model (``save_pretrained`` or safetensors) and the processing class to ``output_dir``."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        self.checkpointer.poll(wait=True, reason="save_model")
        with optimization.eval_weights(self.optimizer, restore=self.is_in_train):  # schedule-free: averaged weights
            weights = self.backend.model_state_dict(self.model, output_dir, full=True)  # every process (FSDP gathers)
            # every process, as transformers calls it: a state dict only where one was gathered (FSDP, DeepSpeed)
            self._save(output_dir) if weights is None else self._save(output_dir, state_dict=weights)
        self.backend.barrier()
        if self.args.push_to_hub and not _internal_call:  # transformers: a save is also a push
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """The model's files into ``output_dir`` (``save_pretrained``, else safetensors), the processing class and
        ``training_args.bin``, on the saving process (transformers' method). ``save_model()`` and every checkpoint
        write the model through it, so a subclass's override decides what a saved model is (an adapter folder, a
        wrapped encoder with its config); a checkpoint calls it with ``checkpoint-N`` (a ``str``) as transformers does:
        a link to the staging folder while it writes, renamed into place once complete.

        Args:
            output_dir: the folder (default ``args.output_dir``).
            state_dict: the weights to write instead of the model's own (gathered under FSDP or DeepSpeed).
        """
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if self.args.should_save:
            logger.info(f"Saving model checkpoint to {output_dir}")
            self.checkpointer.save_model(output_dir, self.backend.unwrap(self.model), self._saved_processor(), state_dict)

    def _saved_processor(self) -> Any:
        """What is saved beside the weights: ``processing_class``, else the data collator's ``tokenizer`` (a library
        that hands its tokenizer to the collator alone still gets it in each checkpoint, as transformers saves it)."""
        if self.processing_class is not None:
            return self.processing_class
        return getattr(self.data_collator, "tokenizer", None)

    def save_state(self) -> None:
        """Write ``TrainerState`` to ``{output_dir}/trainer_state.json`` (main process only)."""
        if not self.is_world_process_zero():
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        self.state.save_to_json(os.path.join(self.args.output_dir, TRAINER_STATE_NAME))

    def create_model_card(self, language: str | None = None, license: str | None = None, tags: str | list[str] | None = None,
                          model_name: str | None = None, finetuned_from: str | None = None, tasks: str | list[str] | None = None,
                          dataset_tags: str | list[str] | None = None, dataset: str | list[str] | None = None,
                          dataset_args: str | list[str] | None = None) -> None:
        """Write a draft model card, ``{output_dir}/README.md``, from the run's hyperparameters, evaluation
        results and ``log_history`` (main process only; nothing is downloaded).

        Args:
            language, license, tags: card metadata (``generated_from_trainer`` is always among the tags).
            model_name: the title (default: the name of ``output_dir``).
            finetuned_from: the base model (default: the model config's ``_name_or_path`` when it is a Hub name).
            tasks, dataset_tags, dataset, dataset_args: transformers' arguments; datasets are named in the text.
        """
        if not self.is_world_process_zero():
            return
        from .model_card import model_card

        text = model_card(self, language=language, license=license, tags=tags, model_name=model_name,
                          finetuned_from=finetuned_from, tasks=tasks, dataset_tags=dataset_tags, dataset=dataset,
                          dataset_args=dataset_args)
        os.makedirs(self.args.output_dir, exist_ok=True)
        Path(self.args.output_dir, "README.md").write_text(text, encoding="utf-8")

    # ------------------------------------------------------------------ the Hub

    def init_hf_repo(self, token: str | None = None):
        """Create the Hub repository (``hub_model_id``, or named after ``output_dir``) unless it exists; returns it."""
        from . import hub
        if self.args.should_save:
            self.hub_repo = hub.HubRepo(self.args, token)
            self.hub_model_id = self.hub_repo.repo_id
        return self.hub_repo

    def _start_hub_pushes(self) -> None:
        from . import hub
        if self.init_hf_repo() is not None:
            self.add_callback(hub.HubCallback(self.hub_repo))

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True, token: str | None = None,
                    revision: str | None = None, **kwargs):
        """Save the model, write its model card, and upload ``output_dir`` (without checkpoints) to the Hub.

        Args:
            commit_message: the commit's message.
            blocking: wait for the upload (else a ``Future`` is returned).
            token: overrides ``hub_token``.
            revision: the branch to push to (default ``hub_revision``, else the main branch).
            kwargs: for the model card (``model_name``, ``language``, ``license``, ``tags``, ``finetuned_from``, ...).

        Returns:
            the commit's ``CommitInfo`` (a ``Future`` of it when not blocking); None on other processes.

        Example:
            >>> trainer.push_to_hub("first version")
        """
        from . import hub
        return hub.push_to_hub(self, commit_message, blocking, token, revision, **kwargs)

    # ------------------------------------------------------------------ hyperparameter search

    def call_model_init(self, trial: Any = None) -> nn.Module:
        """A new model from ``model_init()``, or ``model_init(trial)`` when it takes one argument."""
        from . import hyperparameter_search
        return hyperparameter_search.call_model_init(self.model_init, trial)

    def hyperparameter_search(self, hp_space: Callable | None = None, compute_objective: Callable | None = None,
                              n_trials: int = 20, direction: str | list[str] = "minimize", backend: str | None = None,
                              hp_name: Callable | None = None, **kwargs):
        """Search hyperparameters with optuna or ray tune; each trial trains a fresh model from ``model_init``.

        Args:
            hp_space: ``f(trial) -> {TrainingArguments field: value}`` (default: the backend's, as transformers).
            compute_objective: ``f(eval metrics) -> float`` (default: the eval loss, or the sum of the
                other metrics when there are some).
            n_trials: trials to run.
            direction: ``"minimize"``/``"maximize"``, or a list of them (multi-objective optuna).
            backend: ``"optuna"`` or ``"ray"`` (default: the first installed).
            hp_name: ``f(trial) -> str``, the trial's folder under ``output_dir`` (default ``run-{trial id}``).
            kwargs: for the library (optuna: ``storage``, ``study_name``, ``load_if_exists``, ``pruner``,
                ``sampler``, ``timeout``, ``gc_after_trial``; ray: ``resources_per_trial``, ``scheduler``, ...).

        Returns:
            ``BestRun(run_id, objective, hyperparameters, run_summary)``; a list of them for several directions.

        Example:
            >>> best = trainer.hyperparameter_search(n_trials=10, backend="optuna")
            >>> best.hyperparameters["learning_rate"]
        """
        from . import hyperparameter_search
        return hyperparameter_search.hyperparameter_search(self, hp_space, compute_objective, n_trials, direction,
                                                           backend, hp_name, **kwargs)

    # ------------------------------------------------------------------ logging and metrics

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add ``epoch`` and ``step``, append to ``state.log_history``, and fire ``on_log``.

        Args:
            logs: the values to log.
            start_time: when training started; with ``include_num_input_tokens_seen``, the logs also get
                ``train_runtime`` and ``train_tokens_per_second`` over the tokens seen since this run began.
        """
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:  # HF adds the run's token throughput to the step logs
                before = self._loop.initial_num_input_tokens_seen if self._loop is not None else 0
                session = self.state.num_input_tokens_seen - before
                logs.update(speed_metrics("train", start_time, num_tokens=session))
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)

    # What scripts call around train()/evaluate(), with transformers' names, signatures and files.

    def is_world_process_zero(self) -> bool:
        """Whether this is the main process of the whole run (global rank 0)."""
        return self.args.process_index == 0

    def is_local_process_zero(self) -> bool:
        """Whether this is the main process of its node (local rank 0)."""
        return self.args.local_process_index == 0

    # the metrics scripts print and write (transformers defines these in trainer_pt_utils as functions of the Trainer)
    metrics_format = staticmethod(script_metrics.metrics_format)
    log_metrics = script_metrics.log_metrics
    save_metrics = script_metrics.save_metrics

    # ------------------------------------------------------------------ transformers' other public helpers

    def store_flos(self) -> None:
        """Add every process's FLOPs and input tokens so far to ``state.total_flos`` / ``num_input_tokens_seen``
        (every process calls it). cadence's loop does it at each log, save and at the end of ``train()``; an
        override of ``_maybe_log_save_evaluate`` that logs itself calls this, as in transformers."""
        if self.is_in_train and self._loop is not None:
            self._loop.store_counts(self.state)

    @property
    def _train_batch_size(self) -> int:
        """transformers' attribute (its ``get_train_dataloader``, which subclasses copy, reads it): the batch each
        process loads. ``auto_find_batch_size`` cuts that batch into smaller micro-batches rather than loading
        smaller ones, so it stays ``args.train_batch_size``; ``state.train_batch_size`` is the micro-batch."""
        return self.args.train_batch_size

    def get_total_train_batch_size(self, args: TrainingArguments) -> int:
        """Samples per optimizer step over all processes: per-device batch x accumulation x data-parallel ranks."""
        return self._batch_layout(args).global_batch

    def _batch_layout(self, args: TrainingArguments) -> BatchLayout:
        """The step's samples over the data-parallel ranks (a tensor-parallel group reads one batch)."""
        return BatchLayout(args.train_batch_size, args.gradient_accumulation_steps, self.backend.data_parallel_size)
