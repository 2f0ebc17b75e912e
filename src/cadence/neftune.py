"""NEFTune: uniform noise on the input embeddings while training (Jain et al., 2023, arXiv:2310.05914).

Each training forward adds ``U(-a, a)`` noise to the output of ``model.get_input_embeddings()``, with
``a = neftune_noise_alpha / sqrt(seq_len * hidden)`` (the paper's scale; ``seq_len`` is the padded
length, as in transformers). The noise is a forward hook that acts only while the embedding module is in
training mode, so evaluation inside ``train()`` is clean; the Trainer removes the hook when ``train()``
returns or fails, so the saved and later-evaluated model has no hook at all.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

logger = logging.getLogger(__name__)


def input_embeddings(model: nn.Module) -> nn.Module:
    """The module whose output NEFTune perturbs: ``model.get_input_embeddings()``.

    Raises:
        ValueError: when the model has no ``get_input_embeddings`` (naming the fix).
    """
    getter = getattr(model, "get_input_embeddings", None)
    embeddings = getter() if callable(getter) else None
    if not isinstance(embeddings, nn.Module):
        raise ValueError(
            f"neftune_noise_alpha needs the model's input embeddings, but {type(model).__name__} has no "
            "get_input_embeddings() returning a module: add that method (returning its nn.Embedding), or remove "
            "neftune_noise_alpha"
        )
    return embeddings


def activate(model: nn.Module, alpha: float) -> RemovableHandle:
    """Register the noise hook on the model's input embeddings; returns the handle that removes it.

    Args:
        model: the unwrapped model.
        alpha: ``neftune_noise_alpha``.

    Example:
        >>> handle = activate(model, 5.0)
        >>> ...  # train
        >>> handle.remove()
    """

    def add_noise(module: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
        if not module.training:
            return output
        bound = alpha / math.sqrt(output.size(1) * output.size(2))
        return output + torch.empty_like(output).uniform_(-bound, bound)

    return input_embeddings(model).register_forward_hook(add_noise)


def activate_neftune(model: nn.Module, neftune_noise_alpha: float, accelerator=None) -> RemovableHandle:
    """``activate`` with transformers' signature: unwraps the model through ``accelerator`` first when given.

    Returns:
        The hook's handle; ``handle.remove()`` (or ``deactivate_neftune``) switches the noise off.
    """
    if accelerator is not None:
        model = accelerator.unwrap_model(model)
    return activate(model, neftune_noise_alpha)


def deactivate_neftune(model: nn.Module, hook_handle: RemovableHandle, accelerator=None) -> None:
    """Remove the noise hook ``activate_neftune`` returned (transformers' signature)."""
    hook_handle.remove()
