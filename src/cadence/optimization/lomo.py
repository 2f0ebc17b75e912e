"""LOMO and AdaLomo: optimizers that update inside backward."""


from __future__ import annotations

import contextlib
import logging
from functools import cache as functools_cache
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer


from .requirements import _require_package

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _cuda_calls_stay_put():
    """lomo-optim 0.1.1's AdaLomo creates its second moments with ``.cuda()`` whatever the model's device (an error
    where torch has no CUDA, a device mismatch for a CPU model beside a GPU): inside the block ``.cuda()`` leaves a
    tensor where it is, and the caller moves the state to each parameter's device."""
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


_ADALOMO_STATES = ("exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col")


@functools_cache
def _resumable_adalomo() -> type[Optimizer]:
    """lomo-optim's AdaLomo, with its state on the parameters' devices and a state dict that resumes.

    AdaLomo keeps its factored second moments in dicts keyed by parameter name and its step count (which sets the
    moments' decay) in an attribute, outside torch's ``state``: its own state dict holds neither, so a resumed run
    starts from fresh moments at step 0 (what transformers' checkpoints of it do). Here they are saved under
    ``"adalomo"`` (names -> tensors, and an int: loads with ``weights_only``) and copied back into the live tensors;
    a checkpoint without them (transformers') loads as transformers resumes it, from fresh moments, warned.
    """
    from lomo_optim import AdaLomo

    class ResumableAdaLomo(AdaLomo):
        def __init__(self, model: nn.Module, **kwargs: Any):
            with _cuda_calls_stay_put():
                super().__init__(model, **kwargs)
            devices = {name: p.device for name, p in model.named_parameters()}
            for states in (getattr(self, key) for key in _ADALOMO_STATES):
                for name, tensor in states.items():
                    states[name] = tensor.to(devices[name])

        def state_dict(self) -> dict[str, Any]:
            saved = super().state_dict()
            saved["adalomo"] = {"step_num": self.step_num, **{key: dict(getattr(self, key)) for key in _ADALOMO_STATES}}
            return saved

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            state_dict = dict(state_dict)
            saved = state_dict.pop("adalomo", None)
            super().load_state_dict(state_dict)
            if saved is None:
                logger.warning("this optimizer.pt holds no AdaLomo second moments (a transformers checkpoint): they "
                               "start again from zero at step 0, as transformers resumes them")
                return
            for key in _ADALOMO_STATES:
                live, stored = getattr(self, key), saved[key]
                if set(live) != set(stored):
                    raise ValueError(f"the AdaLomo checkpoint's {key} holds the parameters {sorted(stored)}, this model "
                                     f"{sorted(live)}: it was saved for another model; resume with the same model")
                for name, tensor in stored.items():
                    live[name].copy_(tensor)
            self.step_num = int(saved["step_num"])

    ResumableAdaLomo.__name__ = ResumableAdaLomo.__qualname__ = "AdaLomo"
    return ResumableAdaLomo


def _check_fused(name: str, args: Any, model: nn.Module | None) -> None:
    """What cannot work with an update fused into backward, refused before step 1 (transformers refuses no model only)."""
    if model is None:
        raise ValueError(f"optim={name!r} needs the model (it updates the weights from gradient hooks on its "
                         "parameters): call create_optimizer() with the model, as the Trainer does")
    if getattr(args, "deepspeed", None):
        raise ValueError(f"optim={name!r} with deepspeed={args.deepspeed!r}: DeepSpeed's engine runs its own backward "
                         "and step, so the fused update never happens; train without deepspeed, or choose another optim")
    if getattr(args, "world_size", 1) > 1:
        raise ValueError(f"optim={name!r} with world_size={args.world_size}: its hooks update each process's weights "
                         "from that process's gradients alone (no all-reduce outside DeepSpeed ZeRO-3), so the "
                         "processes would drift apart; run one process, or choose another optim")
    if getattr(args, "fp16", False):
        raise ValueError(f"optim={name!r} with fp16=True: fp16 loss scaling runs a plain backward that never hands the "
                         "scheduler's lr to fused_backward; use bf16=True or float32")
    if getattr(args, "auto_find_batch_size", False):
        raise ValueError(f"optim={name!r} with auto_find_batch_size=True: a micro-batch that runs out of memory inside "
                         "backward has already updated part of the weights, so the step cannot be redone in smaller "
                         "batches; set auto_find_batch_size=False and choose per_device_train_batch_size yourself")
    odd = {n: tuple(p.shape) for n, p in model.named_parameters() if p.dim() not in (1, 2)}
    if name == "adalomo" and odd:  # the package indexes shape[0] and shape[1] (an IndexError, or a shape mismatch)
        listed = ", ".join(f"{n} {shape}" for n, shape in list(odd.items())[:5]) + (" ..." if len(odd) > 5 else "")
        raise ValueError(f"optim='adalomo' keeps second moments for 1-D and 2-D parameters only (lomo-optim's AdaLomo), "
                         f"and {len(odd)} parameter(s) have another shape: {listed}; use optim='lomo', or reshape "
                         "them into 1-D/2-D parameters")


def _lomo(name: str, args: Any, model: nn.Module | None = None) -> tuple[type[Optimizer], dict[str, Any]]:
    """LOMO / AdaLomo: built from the model (transformers' ``model`` kwarg) with the Trainer's lr. The backend's
    backward verb calls ``fused_backward(loss, lr)`` with the scheduler's current lr, and its step does nothing.
    ``max_grad_norm > 0`` becomes the package's ``clip_grad_norm`` (a norm pass before each fused backward: the
    gradients are used up inside backward, so clipping after it has nothing left to clip)."""
    _require_package(name)
    _check_fused(name, args, model)
    from lomo_optim import Lomo

    if getattr(args, "weight_decay", 0.0):
        logger.warning("optim=%r: weight_decay=%s is not applied (transformers builds LOMO with the lr only; the "
                       "package's own weight_decay would decay every parameter, norms and biases too)",
                       name, args.weight_decay)
    if getattr(args, "gradient_accumulation_steps", 1) > 1:
        logger.warning("optim=%r with gradient_accumulation_steps=%d: each micro-batch updates the weights with its "
                       "share of the step's loss (nothing accumulates), as in transformers", name,
                       args.gradient_accumulation_steps)
    clip = args.max_grad_norm if args.max_grad_norm is not None and args.max_grad_norm > 0 else None
    cls = Lomo if name == "lomo" else _resumable_adalomo()
    return cls, {"model": model, "lr": args.learning_rate, **({"clip_grad_norm": clip} if clip else {})}
