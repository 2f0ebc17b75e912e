"""DeepSpeed's engine as a strategy: it steps, clips and zeroes inside ``backward`` at the window's end, and
writes and reads its own checkpoint files (checked before DeepSpeed unpickles them)."""


from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Callable

import torch

from ..checkpoint_io import formats
from ..checkpoint_io.deepspeed_files import check_deepspeed_folder, has_tag_file

from .ddp import DataParallel
from .deepspeed import deepspeed_config, deepspeed_optimizers, unused_given_optimizers

logger = logging.getLogger(__name__)


# why auto_find_batch_size cannot redo a training step under DeepSpeed, and the fix
_NO_SMALLER_STEPS = (
    "auto_find_batch_size=True under deepspeed=...: cadence cannot redo a training step that ran out of memory in "
    "smaller micro-batches there (DeepSpeed's engine keeps the gradients of the step's earlier micro-batches in "
    "buffers of its own, reduced into its partitions under ZeRO-2 and -3, and has no way to discard them), so an "
    "out-of-memory error stops the run; set a smaller per_device_train_batch_size with a larger "
    "gradient_accumulation_steps (the same global batch) instead")


class DeepSpeedEngine(DataParallel):
    """DeepSpeed (ZeRO) through accelerate, on one process or several, on whichever accelerator DeepSpeed picked.

    The engine is made by the first ``prepare`` with an optimizer; before that (an evaluation first) the model is
    placed as under DDP. The engine casts the model itself (its config's fp16/bf16), so no autocast runs beside it.

    Args:
        args: the ``TrainingArguments`` (the config's "auto" entries are filled from them).
        config: the DeepSpeed config, "auto" values filled from the arguments (``deepspeed_config``).
        accelerator: accelerate's ``Accelerator`` with DeepSpeed's plugin (``deepspeed_accelerator``).
        device: this process's device, when ``accelerator`` is None (a Backend given a config after it was built).
    """

    saves_in_background = False  # the engine writes its checkpoint with collectives of its own

    def __init__(self, args: Any, config: dict, accelerator: Any, device: torch.device | None = None):
        super().__init__(args, accelerator, device)
        self._args, self.deepspeed = args, config
        self.shards_parameters = str(config.get("zero_optimization", {}).get("stage")) == "3"  # ZeRO-3
        self.optimizer_from_config = "optimizer" in config
        if args.auto_find_batch_size:  # allowed, as transformers allows it, but it cannot redo a step here
            logger.warning(_NO_SMALLER_STEPS + "; this run trains as with auto_find_batch_size=False")

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> torch.nn.Module:
        """The engine (made once, stepping ``optimizer``: ZeRO partitions its state); without an optimizer, the
        model placed as under DDP."""
        if optimizer is None:
            return super().prepare(model)
        if self.engine is None:
            self.accelerator.state.deepspeed_plugin.deepspeed_config.update(deepspeed_config(self._args, model))
            self.engine, _ = self.accelerator.prepare(model, optimizer)
        return self.engine

    def create_optimizers(self, create_optimizer: Callable[[], Any],
                          create_scheduler: Callable[[Any], Any]) -> tuple[Any, Any]:
        """As transformers (``deepspeed_optim_sched``): none of the Trainer's where the config has an ``optimizer``
        section (an ``optim`` whose package is not installed trains, as there); only the Trainer's optimizer where
        it has a ``scheduler`` section; both otherwise."""
        if self.optimizer_from_config:
            return None, None  # DeepSpeed builds both: the section's, or the arguments' schedule on its optimizer
        if "scheduler" in self.deepspeed:
            return create_optimizer(), None
        return super().create_optimizers(create_optimizer, create_scheduler)

    def prepare_training(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, lr_scheduler: Any,
                         num_training_steps: int, scheduler_for: Callable[[Any], Any]) -> tuple[torch.nn.Module, Any, Any]:
        """The engine, with the optimizer and scheduler it steps: the given ones, or, where the config has an
        ``optimizer`` or ``scheduler`` section, the engine's, built as transformers has them built
        (``deepspeed_optimizers``). The engine steps those itself at the window's end inside ``backward``, so their
        ``step()`` does nothing in the loop, and the learning rate they report after the step is the next step's (as
        transformers logs it under DeepSpeed)."""
        if not {"optimizer", "scheduler"} & self.deepspeed.keys():
            return self.prepare(model, optimizer), optimizer, lr_scheduler
        if self.engine is None:
            config = deepspeed_config(self._args, model, num_training_steps)
            self.accelerator.state.deepspeed_plugin.deepspeed_config.update(config)
            engine_optimizer, engine_scheduler = deepspeed_optimizers(config, model, optimizer, scheduler_for)
            self.engine, *self._engine_optimizers = self.accelerator.prepare(model, engine_optimizer, engine_scheduler)
        return self.engine, *self._engine_optimizers

    def warn_unused_optimizers(self, optimizer: Any, lr_scheduler: Any) -> None:
        reason = unused_given_optimizers(self.deepspeed, optimizer, lr_scheduler)
        if reason is not None:
            logger.warning(reason)

    def drop_gradients(self, model: torch.nn.Module | None, error: BaseException | None) -> None:
        """The engine's partial gradients of a training step cannot be discarded (``_NO_SMALLER_STEPS``): the
        out-of-memory error is raised again, saying so."""
        if self.engine is None or model is None:  # no engine yet, or an evaluation: no gradients
            super().drop_gradients(model, error)
            return
        raise torch.OutOfMemoryError(f"{error}\n{_NO_SMALLER_STEPS}") from error

    def no_sync(self, model: torch.nn.Module):
        return super().no_sync(model) if self.engine is None else self._accumulating()

    @contextlib.contextmanager
    def _accumulating(self):
        """A micro-batch that is not the step's last is no accumulation boundary. accelerate's DeepSpeed
        ``backward`` marks the boundary and runs ``engine.step()`` (clip, update, zero) whenever its
        ``sync_gradients`` is true, which it is unless told otherwise (transformers sets it per micro-batch): the
        window's end, not the engine's own micro-step count, decides, so a shortened window (an epoch's last)
        steps where cadence's loop steps."""
        state = self.accelerator.gradient_state
        state._set_sync_gradients(False)
        try:
            yield
        finally:
            state._set_sync_gradients(True)

    def backward(self, loss: torch.Tensor) -> None:
        if self.engine is None:
            self.accelerator.backward(loss)
            return
        # one normalisation: the engine would divide each micro-batch's loss by gradient_accumulation_steps, but
        # the loop's micro-batch losses already sum to the step's loss over all its items (times the process
        # count, which the engine's gradient averaging divides back), so it must not (transformers passes the
        # same). The boundary (no_sync) decides whether this backward ends the step: then the engine clips,
        # steps and zeroes inside it
        self.accelerator.backward(loss, scale_wrt_gas=False)

    def clip_grad_norm(self, parameters, max_norm: float) -> torch.Tensor:
        if self.engine is None:
            return super().clip_grad_norm(parameters, max_norm)
        # clipped inside the engine's step (gradient_clipping = max_grad_norm): the norm it measured
        return torch.tensor(self.engine.get_global_grad_norm() or 0.0, device=self.device)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Any) -> bool:
        if self.engine is None:
            return super().optimizer_step(optimizer, precision)
        return bool(self.engine.was_step_applied())  # the engine stepped in backward at the window's end

    # ------------------------------------------------------------------------------------------------ checkpoints

    def model_state_dict(self, model: torch.nn.Module, folder: Path, full: bool, pending: list | None) -> dict | None:
        """The consolidated weights (ZeRO-3: only with ``stage3_gather_16bit_weights_on_model_save``), after the
        engine wrote its own checkpoint into ``folder`` (every process its partitions) unless ``full``."""
        if self.engine is None:
            return super().model_state_dict(model, folder, full, pending)
        if not full:  # DeepSpeed's own format (global_step*/, latest): every process its partitions
            self.engine.save_checkpoint(str(folder))
        try:  # ZeRO-3 consolidates only with stage3_gather_16bit_weights_on_model_save
            return self.accelerator.get_state_dict(self.engine)
        except ValueError:
            if full:  # save_model(): DeepSpeed's files instead, as transformers writes them
                logger.warning("ZeRO-3 without stage3_gather_16bit_weights_on_model_save: %s gets DeepSpeed's "
                               "checkpoint instead of model.safetensors; its zero_to_fp32.py recovers the weights",
                               folder)
                self.engine.save_checkpoint(str(folder))
            return {}

    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
                             pending: list | None) -> dict | None:
        if self.engine is None:
            return super().optimizer_state_dict(model, optimizer, folder, pending)
        return None  # inside DeepSpeed's checkpoint

    def load_model_weights(self, model: torch.nn.Module, folder: str | os.PathLike) -> None:
        """A folder with DeepSpeed's files (``latest``) is read by the engine once it exists; before that
        (``train(resume_from_checkpoint=...)`` loads the weights before the engine is made) from its
        ``model.safetensors`` if it has one, and else not at all: the engine's full load at the resume
        (``load_optimizer_state``) restores the weights with the optimizer (ZeRO-3 writes no consolidated
        weights without ``stage3_gather_16bit_weights_on_model_save``)."""
        deepspeed_files = has_tag_file(folder)  # latest, or latest_universal: read by an engine (checked first)
        if deepspeed_files and self.engine is not None:
            check_deepspeed_folder(folder)  # DeepSpeed unpickles its files with weights_only=False: checked first
            self.engine.load_checkpoint(str(folder), load_module_only=True)
        elif deepspeed_files and not formats.weights_files(folder):
            logger.debug("%s: no consolidated weights; DeepSpeed's engine loads them at the resume", folder)
        else:
            super().load_model_weights(model, folder)

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | os.PathLike) -> None:
        if self.engine is None:
            super().load_optimizer_state(model, optimizer, folder)
            return
        check_deepspeed_folder(folder)  # as in load_model_weights: no file of it may run code
        self.engine.load_checkpoint(str(folder))  # weights and partitioned optimizer state, DeepSpeed's format
