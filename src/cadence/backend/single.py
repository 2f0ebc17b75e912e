"""One device: the model moved (and compiled) only, no wrapper; plain ``backward`` and torch's clipping."""


from __future__ import annotations

import torch

from .strategy import Strategy


class SingleDevice(Strategy):
    """One process on one device: no DDP module and no optimizer wrapper, so a step costs what a plain PyTorch
    loop's does. Collectives and checkpoints are the base's (one process)."""

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> torch.nn.Module:
        return self.place(model)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_grad_norm(self, parameters, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
