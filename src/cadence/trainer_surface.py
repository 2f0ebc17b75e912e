"""transformers' ``Trainer`` methods that cadence's loop does not use itself: the sizes of parallelism it does not
have, the process group's end, and the hooks of transformers' own loop, which an override would change nothing in
cadence's, so such an override is refused when the Trainer is built. ``Trainer`` inherits them; scripts and libraries
that call them get transformers' names, signatures and results.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from .backend import accelerator_kwargs
from .loop_state import transformers_step_counts
from .trainer_utils import has_length
from .training_args import TrainingArguments


def _summary(method: Callable) -> str:
    """The first paragraph of a method's docstring, on one line."""
    return " ".join(inspect.getdoc(method).split("\n\n")[0].split())


class TransformersSurface:
    """The methods of ``transformers.Trainer`` that cadence keeps for its callers, not for its own loop."""

    def get_num_trainable_parameters(self) -> int:
        """Elements of the parameters that require a gradient."""
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def get_sp_size(self) -> int:
        """Sequence-parallel size: 1 (cadence splits data only, never sequences)."""
        return 1

    def get_cp_size(self) -> int:
        """Context-parallel size: 1 (cadence has no context parallelism)."""
        return 1

    def get_tp_size(self) -> int:
        """Tensor-parallel size: the model's (``tp_plan``) or ``parallelism_config``'s, else 1."""
        return self.backend.layout.tp_size if self.backend.layout is not None else 1

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        """The mixed-precision context (the same as ``compute_loss_context_manager``)."""
        return self.compute_loss_context_manager()

    def end(self) -> None:
        """Destroy the process group at the very end of a script (after the last train/evaluate/save)."""
        self.backend.end()

    # transformers' loop calls these; cadence's does not, so an override would be silently ignored: refused
    _NOT_CALLED_BY_CADENCE = ("create_accelerator_and_postprocess", "set_initial_training_values", "get_batch_samples")

    def _refuse_ignored_overrides(self) -> None:
        for name in self._NOT_CALLED_BY_CADENCE:
            if getattr(type(self), name) is not getattr(TransformersSurface, name):
                raise TypeError(
                    f"{type(self).__name__} overrides {name}(), which cadence's training loop never calls, so the "
                    f"override would be silently ignored; move that logic elsewhere ({_summary(getattr(TransformersSurface, name))})"
                )

    def create_accelerator_and_postprocess(self) -> None:
        """cadence builds its Accelerator from TrainingArguments (ddp_* fields) in backend.Backend."""
        raise NotImplementedError(
            "cadence creates its Accelerator in backend.Backend (from TrainingArguments) when the Trainer is "
            "built; there is nothing to recreate. Set the ddp_* arguments instead"
        )

    def _build_accelerator_args(self, **kwargs: Any) -> dict[str, Any]:
        """The keyword arguments transformers' Trainer builds for accelerate's ``Accelerator`` from ``self.args``
        (``backend.accelerator_kwargs``: dataloader config, gradient accumulation plugin, DDP options, ...);
        ``kwargs`` replace computed entries, as in transformers."""
        return accelerator_kwargs(self.args, self.model, **kwargs)

    def set_initial_training_values(self, args: TrainingArguments, dataloader: DataLoader
                                    ) -> tuple[int, int, int, int, int, int | None, int]:
        """transformers' step counts of a run over ``dataloader``; read state.max_steps / num_train_epochs in
        on_train_begin.

        Returns:
            ``(num_train_epochs, num_update_steps_per_epoch, num_examples, num_train_samples, total_train_batch_size,
            steps_in_epoch, max_steps)`` with transformers' values: a dataloader without a length needs
            ``max_steps > 0`` and counts ``sys.maxsize`` epochs of ``max_steps`` steps.
        """
        batches = len(dataloader) if has_length(dataloader) else None
        return transformers_step_counts(args, self.get_total_train_batch_size(args), batches,
                                        lambda: self.num_examples(dataloader))

    def get_batch_samples(self, epoch_iterator, num_batches: int, device: torch.device):
        """cadence counts a step's items itself; to change the loss, override compute_loss or pass compute_loss_func."""
        raise NotImplementedError(
            "cadence's loop takes each optimizer step's batches and counts their items itself (loss.window_items, "
            "over all processes); to change the loss, override compute_loss or pass compute_loss_func"
        )
