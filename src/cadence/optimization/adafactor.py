"""Adafactor (Shazeer & Stern, 2018), built in, and its schedule."""


from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


from .schedules import _constant_factor


# =============================================================================================
# Adafactor (Shazeer & Stern, 2018, arXiv:1804.04235)
# =============================================================================================


def _rms(tensor: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(tensor) / math.sqrt(tensor.numel())


class Adafactor(Optimizer):
    """Adafactor: Adam-like steps with a factored second moment, so a matrix costs O(rows + cols) memory.

    For parameters with 2 or more dims the running mean of ``grad**2`` is kept as a row vector and a
    column vector (their outer product, normalised, estimates the full matrix); 1-D parameters keep
    the full vector. The update ``grad / sqrt(v)`` is clipped to RMS ``clip_threshold``, scaled by the
    step size, optionally averaged with momentum ``beta1``, and subtracted. With ``relative_step`` the
    step size is ``min(1e-2, 1/sqrt(step))`` (or ``1e-6 * step`` with ``warmup_init``) and ``lr`` must be
    None; with ``scale_parameter`` it is also multiplied by ``max(eps[1], RMS(param))``. The state uses
    transformers' key names, so optimizer checkpoints cross over.

    Args:
        params: parameters or param-group dicts.
        lr: the external lr (None with ``relative_step``).
        eps: (added to ``grad**2``, floor of the parameter scale).
        clip_threshold: the largest RMS of an update.
        decay_rate: the second-moment decay is ``1 - step**decay_rate``.
        beta1: momentum of the update (None: no first moment, the memory-saving default).
        weight_decay: decoupled weight decay, scaled by the step size.
        scale_parameter: scale the step size by the parameter's RMS.
        relative_step: compute the step size from the step count instead of ``lr``.
        warmup_init: with ``relative_step``, grow the step size linearly from 0.

    Example:
        >>> layer = torch.nn.Linear(4, 3)
        >>> opt = Adafactor(layer.parameters(), lr=1e-3, scale_parameter=False, relative_step=False)
        >>> layer(torch.ones(2, 4)).sum().backward(); opt.step()
        >>> sorted(opt.state[layer.weight])
        ['RMS', 'exp_avg_sq_col', 'exp_avg_sq_row', 'step']
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: float | None = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = True,
        warmup_init: bool = False,
    ) -> None:
        if lr is not None and relative_step:
            raise ValueError("Adafactor: a manual `lr` cannot be combined with relative_step=True")
        if warmup_init and not relative_step:
            raise ValueError("Adafactor: warmup_init=True requires relative_step=True")
        defaults = {
            "lr": lr,
            "eps": eps,
            "clip_threshold": clip_threshold,
            "decay_rate": decay_rate,
            "beta1": beta1,
            "weight_decay": weight_decay,
            "scale_parameter": scale_parameter,
            "relative_step": relative_step,
            "warmup_init": warmup_init,
        }
        super().__init__(params, defaults)

    @staticmethod
    def _get_lr(group: dict[str, Any], state: dict[str, Any]) -> Any:
        """The step size of one parameter (transformers' name: AdafactorSchedule reads it)."""
        step_size = group["lr"]
        if group["relative_step"]:
            ceiling = 1e-6 * state["step"] if group["warmup_init"] else 1e-2
            step_size = min(ceiling, 1.0 / math.sqrt(state["step"]))
        if not group["scale_parameter"]:
            return step_size
        rms, floor = state["RMS"], group["eps"][1]
        # clamp, not max(): max() would read the tensor back to the host on every parameter.
        scale = rms.clamp(min=floor) if isinstance(rms, torch.Tensor) else max(floor, rms)
        return scale * step_size

    def _init_state(self, state: dict[str, Any], grad: torch.Tensor, factored: bool, momentum: bool) -> None:
        state["step"] = 0
        state["RMS"] = 0
        if momentum:
            state["exp_avg"] = torch.zeros_like(grad)
        if factored:
            state["exp_avg_sq_row"] = grad.new_zeros(grad.shape[:-1])
            state["exp_avg_sq_col"] = grad.new_zeros(grad.shape[:-2] + grad.shape[-1:])
        else:
            state["exp_avg_sq"] = torch.zeros_like(grad)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient.

        Args:
            closure: re-evaluates the model and returns the loss (optional).

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        if p.grad.is_sparse:
            raise RuntimeError("Adafactor does not support sparse gradients.")
        low_precision = p.dtype in (torch.float16, torch.bfloat16)
        # Low-precision parameters are updated in float32 and copied back.
        grad = p.grad.float() if p.grad.dtype in (torch.float16, torch.bfloat16) else p.grad
        param = p.float() if low_precision else p
        factored, momentum = grad.dim() >= 2, group["beta1"] is not None

        state = self.state[p]
        if not state:
            self._init_state(state, grad, factored, momentum)
        else:
            # A loaded state comes back in the parameter's dtype; the moments live in the grad's.
            for key in ("exp_avg", "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(grad)

        state["step"] += 1
        state["RMS"] = _rms(param)
        lr = self._get_lr(group, state)
        beta2 = 1.0 - math.pow(state["step"], group["decay_rate"])

        squared = grad.square().add_(group["eps"][0])
        if factored:
            row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
            row.mul_(beta2).add_(squared.mean(dim=-1), alpha=1.0 - beta2)
            col.mul_(beta2).add_(squared.mean(dim=-2), alpha=1.0 - beta2)
            # v ~= outer(row, col) / mean(row): the rank-1 estimate of the full second moment.
            row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
            update = row_factor * col.rsqrt().unsqueeze(-2) * grad
        else:
            v = state["exp_avg_sq"]
            v.mul_(beta2).add_(squared, alpha=1.0 - beta2)
            update = v.rsqrt() * grad

        update.div_((_rms(update) / group["clip_threshold"]).clamp_(min=1.0))
        update.mul_(lr)
        if momentum:
            update = state["exp_avg"].mul_(group["beta1"]).add_(update, alpha=1.0 - group["beta1"])
        if group["weight_decay"] != 0:
            param.add_(param * (-group["weight_decay"] * lr))
        param.sub_(update)
        if low_precision:
            p.copy_(param)


class AdafactorSchedule(LambdaLR):
    """A read-only schedule for ``Adafactor`` with ``relative_step``: reports the step size it computes.

    The Trainer logs ``scheduler.get_last_lr()``; Adafactor schedules itself, so this proxy reads the
    step size of each group's first parameter (``initial_lr`` before the first step).

    Args:
        optimizer: an ``Adafactor``.
        initial_lr: the lr reported before the first step.
    """

    def __init__(self, optimizer: Optimizer, initial_lr: float = 0.0) -> None:
        # LambdaLR takes its base lrs from "initial_lr"; Adafactor's lr is None, so lend one for init.
        for group in optimizer.param_groups:
            group["initial_lr"] = initial_lr
        super().__init__(optimizer, _constant_factor)
        for group in optimizer.param_groups:
            del group["initial_lr"]

    def get_lr(self) -> list[float]:
        opt = self.optimizer
        lrs = [
            float(opt._get_lr(group, opt.state[group["params"][0]]))
            for group in opt.param_groups
            if group["params"][0].grad is not None
        ]
        return lrs or list(self.base_lrs)


def get_adafactor_schedule(optimizer: Optimizer, initial_lr: float = 0.0) -> AdafactorSchedule:
    """An ``AdafactorSchedule`` proxy for ``optimizer``.

    Returns:
        An ``AdafactorSchedule``.
    """
    return AdafactorSchedule(optimizer, initial_lr)
