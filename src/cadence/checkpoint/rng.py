"""A process's RNG states (python, numpy, torch, the accelerator's) as a checkpoint keeps them."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..backend.devices import device_rng_state, set_device_rng_state
from .formats import RNG_STATE_NAME


def rng_state_name(process_index: int, world_size: int) -> str:
    """``rng_state.pth`` for one process, ``rng_state_{rank}.pth`` for each of several (HF's names)."""
    return RNG_STATE_NAME if world_size <= 1 else f"rng_state_{process_index}.pth"


def capture_rng_state(world_size: int = 1) -> dict[str, Any]:
    """python, numpy, torch CPU (and GPU) RNG states as tensors and plain lists/tuples.

    The layout is transformers' (so it loads them), but numpy's key is a list, not an array, so
    ``torch.load(weights_only=True)`` loads the file with nothing allowed beyond plain data.
    """
    kind, key, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, key.tolist(), int(pos), int(has_gauss), float(cached)),
        "cpu": torch.random.get_rng_state(),
    }
    state.update(device_rng_state(all_devices=world_size > 1))  # HF: all GPUs' with several processes
    return state


def restore_rng_state(state: dict[str, Any] | None) -> None:
    """Set every RNG from what :func:`capture_rng_state` (or transformers) stored; None: nothing."""
    if state is None:
        return
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    torch.random.set_rng_state(state["cpu"])
    set_device_rng_state(state)


def checkpoint_world_size(folder: str | os.PathLike) -> int | None:
    """How many processes wrote ``folder`` (from its RNG files), or None when it has none."""
    folder = Path(folder)
    if (folder / RNG_STATE_NAME).exists():
        return 1
    ranks = [p for p in folder.glob("rng_state_*.pth") if re.fullmatch(r"rng_state_\d+\.pth", p.name)]
    return len(ranks) or None


