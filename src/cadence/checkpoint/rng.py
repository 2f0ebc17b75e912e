"""A process's RNG states (python, numpy, torch, the accelerator's) as a checkpoint keeps them."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..runtime.devices import device_rng_state, set_device_rng_state
from ..checkpoint_io.formats import RNG_STATE_NAME, _corrupt, safe_load


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


def _rng_problem(state: Any) -> str | None:
    """What is wrong with an RNG state for :func:`restore_rng_state` (``"python"``, ``"numpy"``, ``"cpu"``, a GPU's,
    ``"look_ahead"``), as ``field=value, which is not ...``; None when it restores."""
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a dict of RNG states"
    seq = (list, tuple)
    python, numpy, cpu = state.get("python"), state.get("numpy"), state.get("cpu")
    if not (isinstance(python, seq) and len(python) == 3 and type(python[0]) is int and isinstance(python[1], seq)
            and all(type(x) is int for x in python[1]) and (python[2] is None or type(python[2]) is float)):
        return f"has python={python!r:.80}, which is not random.getstate()'s (version, ints, gauss)"
    if not (isinstance(numpy, seq) and len(numpy) == 5 and isinstance(numpy[0], str)
            and isinstance(numpy[1], (list, np.ndarray)) and all(isinstance(x, (int, float, np.number)) for x in numpy[2:])):
        return f"has numpy={numpy!r:.80}, which is not numpy's (kind, keys, pos, has_gauss, cached)"
    if not (isinstance(cpu, torch.Tensor) and cpu.dtype == torch.uint8 and cpu.dim() == 1):
        return f"has cpu={cpu!r:.80}, which is not torch's CPU RNG state (a uint8 tensor)"
    cuda = state.get("cuda")
    if not (cuda is None or isinstance(cuda, torch.Tensor)
            or isinstance(cuda, seq) and all(isinstance(t, torch.Tensor) for t in cuda)):
        return f"has cuda={cuda!r:.80}, which is not a GPU RNG state (a tensor, or one per GPU)"
    if "look_ahead" in state and state["look_ahead"] is not None:
        inner = _rng_problem(state["look_ahead"])
        if inner is not None:
            return "has look_ahead that " + inner.replace("has ", "has its ", 1) if inner.startswith("has ") else \
                f"has look_ahead={state['look_ahead']!r:.80}, which is not a dict of RNG states"
    return None


def read_rng_state(folder: str | os.PathLike, name: str) -> dict[str, Any]:
    """The RNG states in ``folder/name`` (``weights_only``, numpy's array allowed as transformers writes it), each
    field checked so that :func:`restore_rng_state` cannot fail on it mid-resume.

    Raises:
        CorruptCheckpointError: naming the file and the field.
        UnsafeCheckpointError: the file names code (never run).
    """
    state = safe_load(Path(folder) / name, allow_numpy_arrays=True)
    problem = _rng_problem(state)
    if problem is not None:
        raise _corrupt(Path(folder), name, problem)
    return state
