"""Devices and memory: the device, its cache and memory counters, device RNG states, peak FLOP/s."""


from __future__ import annotations

import gc
import logging
import os
import re
from typing import Any

import torch


logger = logging.getLogger(__name__)


# device type -> how to release its allocator's cache (a CPU has none to release)
_EMPTY_CACHE = {
    "cuda": lambda: torch.cuda.empty_cache(),
    "mps": lambda: torch.mps.empty_cache(),
    "xpu": lambda: torch.xpu.empty_cache(),
}


# ------------------------------------------------------------------ device verbs for code with no Backend at hand


def accelerator_available() -> bool:
    """Whether a CUDA GPU is visible: the device a process trains on unless ``use_cpu`` (see :func:`default_device`)."""
    return torch.cuda.is_available()


def bf16_gpu_available() -> bool:
    """Whether the GPU a process trains on without ``use_cpu`` computes in bfloat16 (transformers' test: a CUDA GPU
    whose torch says it supports bfloat16)."""
    return accelerator_available() and torch.cuda.is_bf16_supported()


def describe_devices() -> str:
    """The devices this process can see, in one line (``cadence env``'s report): the CPU's cores and torch's threads,
    each CUDA GPU with its memory (or why none is visible in a CUDA build), MPS."""
    found = [f"cpu ({os.cpu_count()} cores, torch uses {torch.get_num_threads()} threads)"]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            found.append(f"cuda:{index} {properties.name} ({properties.total_memory / 2**30:.0f} GiB)")
    elif torch.version.cuda:
        found.append(f"no CUDA device visible (torch is a CUDA {torch.version.cuda} build)")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        found.append("mps")
    return "; ".join(found)


def default_device(use_cpu: bool = False, local_process_index: int = 0) -> torch.device:
    """The device of one process (``TrainingArguments.device``; a single-process ``Backend`` runs on it, and
    accelerate picks the same one for each of several): ``cpu`` with ``use_cpu`` or without a GPU, else
    ``cuda:<local_process_index>``.

    Example:
        >>> default_device(use_cpu=True)
        device(type='cpu')
    """
    if use_cpu or not accelerator_available():
        return torch.device("cpu")
    return torch.device("cuda", local_process_index)


def empty_cache(device: torch.device) -> None:
    """Return ``device``'s cached free memory to its driver; nothing on a CPU."""
    release = _EMPTY_CACHE.get(device.type)
    if release is not None:
        release()


def free_memory(device: torch.device | None = None) -> None:
    """After an out-of-memory error: collect the failed attempt's tensors and return the device's cached memory
    to its driver, so that a retry with a smaller batch can use it. ``device`` None: :func:`default_device`."""
    gc.collect()
    empty_cache(device or default_device())


# device type -> (allocated bytes, peak allocated bytes since the last reset or None, reset the peak)
_MEMORY_STATS = {
    "cuda": (lambda d: torch.cuda.memory_allocated(d), lambda d: torch.cuda.max_memory_allocated(d),
             lambda d: torch.cuda.reset_peak_memory_stats(d)),
    "xpu": (lambda d: torch.xpu.memory_allocated(d), lambda d: torch.xpu.max_memory_allocated(d),
            lambda d: torch.xpu.reset_peak_memory_stats(d)),
    "mps": (lambda d: torch.mps.current_allocated_memory(), lambda d: None, lambda d: None),  # mps keeps no peak
}


def device_memory(device: torch.device) -> tuple[int, int | None] | None:
    """``(allocated, peak)`` bytes of the tensors on ``device`` (the peak since :func:`reset_device_peak_memory`,
    None where the device keeps none); None on a CPU, whose memory the process's resident size tells."""
    stats = _MEMORY_STATS.get(device.type)
    if stats is None:
        return None
    return stats[0](device), stats[1](device)


def reset_device_peak_memory(device: torch.device) -> None:
    """Start ``device``'s peak-memory count afresh (for :func:`device_memory`); nothing on a CPU."""
    stats = _MEMORY_STATS.get(device.type)
    if stats is not None:
        stats[2](device)


def copies_done_event() -> Any:
    """An event recorded on the current CUDA stream after non-blocking device-to-host copies (a checkpoint's
    snapshot): its ``synchronize()``, called by the writer's thread, returns once they have landed."""
    event = torch.cuda.Event()
    event.record()
    return event


def device_rng_state(all_devices: bool = False) -> dict[str, Any]:
    """The GPU entries of ``rng_state.pth``, under transformers' key: ``{"cuda": state}``, every visible GPU's
    states (a list) with ``all_devices`` (transformers' choice with several processes), else the current GPU's;
    ``{}`` without a GPU."""
    if not torch.cuda.is_available():
        return {}
    return {"cuda": torch.cuda.random.get_rng_state_all() if all_devices else torch.cuda.random.get_rng_state()}


def set_device_rng_state(state: dict[str, Any]) -> None:
    """Restore the GPU entry of an RNG state (from :func:`device_rng_state`, or transformers' file); nothing when
    it has none or this process has no GPU."""
    saved = state.get("cuda")
    if saved is None or not torch.cuda.is_available():
        return
    if isinstance(saved, (list, tuple)):
        torch.cuda.random.set_rng_state_all(saved)
    else:
        torch.cuda.random.set_rng_state(saved)


# Dense (no 2:4 sparsity) bf16 tensor-core peak FLOP/s per GPU, from NVIDIA's datasheets; fp16 where
# the GPU has no bf16 (V100, T4). Keys are matched as whole words against the lower-cased
# `torch.cuda.get_device_name()` with "-" read as " ", longest key first, so "h100 nvl" wins over "h100"
# and "a10g" never matches "a100". A bare "h100"/"h200"/"v100" is the SXM part.
_PEAK_DENSE_BF16_FLOPS: dict[str, float] = {
    "b200": 2250e12,
    "h200 nvl": 835.5e12,
    "h200": 989.4e12,
    "h100 nvl": 835.5e12,
    "h100 pcie": 756.5e12,
    "h100": 989.4e12,
    "h800": 989.4e12,
    "a100": 312e12,
    "a800": 312e12,
    "l40s": 362.05e12,
    "l40": 181.05e12,
    "l4": 121e12,
    "a40": 149.7e12,
    "rtx a6000": 154.8e12,
    "a10g": 70e12,  # AWS-only part with no NVIDIA datasheet; the figure commonly quoted for it
    "a10": 125e12,
    "rtx 4090": 165.2e12,  # with fp32 accumulation, as autocast uses
    "v100s": 130e12,
    "v100 pcie": 112e12,
    "v100": 125e12,
    "t4": 65e12,
}


def _peak_flops(device_name: str) -> float | None:
    """The table's peak for a CUDA device name, or None when no key matches."""
    name = device_name.lower().replace("-", " ")
    for key in sorted(_PEAK_DENSE_BF16_FLOPS, key=len, reverse=True):
        if re.search(rf"\b{re.escape(key)}\b", name):
            return _PEAK_DENSE_BF16_FLOPS[key]
    return None


def peak_flops(device: torch.device | str) -> float | None:
    """The dense bf16 peak FLOP/s of ``device`` (one GPU) from the table above; None on a CPU, on a CUDA device
    without a runtime behind it, or on a GPU the table does not know."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        name = torch.cuda.get_device_name(device)
    except (RuntimeError, AssertionError):  # no CUDA runtime behind a "cuda" device
        return None
    peak = _peak_flops(name)
    if peak is None:
        logger.debug("No peak FLOP/s known for %r; no MFU", name)
    return peak
