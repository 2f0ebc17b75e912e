"""Checkpoints in Hugging Face's layout, written atomically.

A checkpoint is written into ``tmp-checkpoint-N/``, every file flushed and fsynced, and only then
renamed to ``checkpoint-N/``: a folder with that name is always complete (``get_last_checkpoint``
also requires ``trainer_state.json``, written last). Rotation keeps the newest checkpoints and the
best one, and never deletes the one just written.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.bin"
TRAINING_ARGS_JSON = "training_args.json"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def save_model_weights(model: torch.nn.Module, folder: str | os.PathLike, processing_class: Any = None) -> None:
    """``model.save_pretrained`` (config.json etc.) when the model has it, else its state dict in safetensors.

    Shared (tied) tensors are stored once; ``processing_class.save_pretrained`` is called when present.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(folder, safe_serialization=True)
    else:
        from safetensors.torch import save_model

        save_model(model, str(folder / WEIGHTS_NAME))
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        processing_class.save_pretrained(folder)


def load_model_weights(model: torch.nn.Module, folder: str | os.PathLike) -> None:
    """Load ``folder/model.safetensors`` into ``model`` in place (safetensors: no code can run).

    A key may be missing only when its tensor is tied to a loaded one (tied weights are stored once).

    Raises:
        FileNotFoundError: when the folder has no ``model.safetensors``.
        ValueError: naming missing or unexpected keys.
    """
    from safetensors.torch import load_file

    path = Path(folder) / WEIGHTS_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {folder}: cannot load its weights")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    state = load_file(str(path), device=str(device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded_storage = {own[k].data_ptr() for k in state if k in own}
    missing = [k for k in missing if own[k].data_ptr() not in loaded_storage]
    if missing or unexpected:
        raise ValueError(f"{path} does not match {type(model).__name__}: missing {missing}, unexpected {unexpected}")


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(final: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_folder)``, fsync, then rename the folder to ``final``.

    On any error the temporary folder is removed and older checkpoints are untouched; the error
    says which folder could not be written.
    """
    final = Path(final)
    tmp = final.parent / f"tmp-{final.name}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        _fsync_tree(tmp)
        if final.exists():  # saving the same step twice: swap, so a complete folder always exists
            old = final.parent / f"old-{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"could not write checkpoint {final} ({e.strerror or e}); older checkpoints are intact") from e
    return final


def save_json(obj: Any, path: Path) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sorted_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """``checkpoint-N`` folders of ``output_dir`` (complete ones only), oldest first."""
    found = []
    for path in Path(output_dir).glob("checkpoint-*"):
        match = _CHECKPOINT_RE.match(path.name)
        if match and path.is_dir() and (path / TRAINER_STATE_NAME).exists():
            found.append((int(match.group(1)), path))
    return [p for _, p in sorted(found)]


def rotate_checkpoints(output_dir: str | os.PathLike, limit: int | None, best: str | None, just_written: Path) -> list[Path]:
    """Delete the oldest checkpoints beyond ``limit``, never the best one nor the one just written.

    Returns the deleted folders.
    """
    if not limit:
        return []
    keep = {Path(just_written).resolve()}
    if best:
        keep.add(Path(best).resolve())
    checkpoints = sorted_checkpoints(output_dir)
    # the best counts toward the limit; with limit=1 and a best that is not the newest, both stay
    budget = max(limit, len(keep))
    deletable = [c for c in checkpoints if c.resolve() not in keep]
    excess = len(checkpoints) - budget
    deleted = deletable[: max(excess, 0)]
    for path in deleted:
        logger.info("deleting older checkpoint %s (save_total_limit=%d)", path, limit)
        shutil.rmtree(path, ignore_errors=True)
    return deleted
