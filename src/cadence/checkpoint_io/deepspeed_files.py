"""DeepSpeed's own checkpoint files, checked before DeepSpeed unpickles them.

Under DeepSpeed a checkpoint folder also holds ``latest`` (the tag: ``global_step10``) and the tag's folder:
``mp_rank_00_model_states.pt`` (ZeRO-0/1/2: the module; ZeRO-3: ``zero_pp_rank_*_mp_rank_*_model_states.pt``) and
``*_optim_states.pt`` per process (the partitioned optimizer). ``engine.load_checkpoint`` reads them with
``torch.load(weights_only=False)``: plain pickle, which runs whatever a crafted file names. So before the engine is
handed the folder, every ``.pt`` file under the tag is unpickled here with ``weights_only=True``, allowing besides
tensors and plain data only the few classes DeepSpeed itself pickles (``DEEPSPEED_GLOBALS``); ``mmap=True`` keeps
the check from reading the tensors' bytes, so it costs the pickles only. A file naming anything else is refused,
naming the file and the global, and nothing in it runs.

DeepSpeed reads its tag from ``latest``, or, with ``"checkpoint": {"load_universal": true}``, from
``latest_universal`` (then also the tag's ``zero/optimizer_state.pt`` and ``zero/<param>/*.pt``): every tag file
present is checked, and so is everything under each tag folder, symlinked sub-folders included. A checkpoint is read
only through regular files inside its folder (``formats.checked_path``): a tag, a tag folder or a sub-folder that
leads outside through a symlink is refused, and so is a FIFO or device.

The bottom layer of the checkpoint package: it imports only ``formats``.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from .formats import UnsafeCheckpointError, _corrupt, checked_files, checked_path, unsafe_globals

logger = logging.getLogger(__name__)

LATEST_NAME = "latest"  # DeepSpeed's file naming the tag folder of the newest save
# Every file DeepSpeed 0.19's engine.load_checkpoint reads a tag from: "latest", or, with "checkpoint":
# {"load_universal": true} in the config, "latest_universal" (whose tag folder's zero/<param>/*.pt and
# zero/optimizer_state.pt the universal loader unpickles too). Each present is checked, whatever the config says.
TAG_FILE_NAMES = (LATEST_NAME, "latest_universal")

# What DeepSpeed 0.19's saves pickle besides tensors, torch.Size, OrderedDict and plain values (read from
# engine._save_checkpoint / _save_zero_checkpoint and the ZeRO optimizers' state_dict): the loss scaler object
# (static, or dynamic under fp16), the ZeRO stage enum, each parameter's slice of a flat partition. Building them
# sets attributes (or looks up an enum member) and runs no other code. ds_config is the config dict, ds_version a str.
DEEPSPEED_GLOBALS = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


def _allowed_globals() -> list[Any]:
    """The classes of ``DEEPSPEED_GLOBALS`` this DeepSpeed has (a version without one cannot have pickled it)."""
    found = []
    for module, name in DEEPSPEED_GLOBALS:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return found


def tag_folders(folder: str | os.PathLike) -> list[Path]:
    """The folders DeepSpeed may read inside the checkpoint ``folder``: the one each of :data:`TAG_FILE_NAMES`
    present names, read as DeepSpeed reads it (``open(latest).read().strip()``); [] when none is there.

    Raises:
        CorruptCheckpointError: a tag file names something that is not a folder inside ``folder`` (``..``, a path).
        UnsafeCheckpointError: a tag file, or the folder it names, leads outside ``folder`` through a symlink.
    """
    folder = Path(folder)
    tags = []
    for name in TAG_FILE_NAMES:
        latest = folder / name
        if not os.path.lexists(latest):
            continue
        checked_path(folder, latest, confine=True)  # a regular file inside: a FIFO would hang DeepSpeed's open too
        tag = latest.read_text(encoding="utf-8", errors="replace").strip()
        # a tag with a separator or "..": DeepSpeed would read files outside the checkpoint
        if not tag or tag in (".", "..") or "/" in tag or "\0" in tag or os.sep in tag or (os.altsep and os.altsep in tag):
            raise _corrupt(folder, name, f"names {tag[:100]!r}, not a folder of this checkpoint (global_step<N>)")
        if not os.path.lexists(folder / tag):
            raise _corrupt(folder, name, f"names {tag!r}, and {folder / tag} is not there")
        tags.append(checked_path(folder, folder / tag, confine=True, directory=True))
    return tags


def has_tag_file(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a file DeepSpeed reads a tag from (it is DeepSpeed's checkpoint)."""
    return any(os.path.lexists(Path(folder) / name) for name in TAG_FILE_NAMES)


def check_deepspeed_folder(folder: str | os.PathLike) -> list[Path]:
    """Check every ``.pt`` file DeepSpeed could read from the checkpoint ``folder`` (the tag folders of ``latest`` and
    ``latest_universal``, sub-folders included, symlinked ones too) without running code or reading tensor data.

    Args:
        folder: a ``checkpoint-N`` folder written under DeepSpeed.

    Returns:
        The files checked, sorted (empty when ``folder`` has no tag file: DeepSpeed reads nothing there).

    Raises:
        UnsafeCheckpointError: a file names a global besides tensors, plain data and ``DEEPSPEED_GLOBALS``
            (the file and the global are named; nothing was run).
        CorruptCheckpointError: a tag file names no folder of ``folder``, or a file is not a readable torch file
            (or not a regular file: a FIFO, a device).
        UnsafeCheckpointError: also when a tag file, the tag folder or anything under it leads outside ``folder``
            through a symlink.

    Example:
        >>> check_deepspeed_folder("out/checkpoint-10")
        [PosixPath('out/checkpoint-10/global_step10/mp_rank_00_model_states.pt'), ...]
    """
    folder = Path(folder)
    # every file under every tag, following symlinked sub-folders (zero/ -> elsewhere is refused): regular files
    # inside the checkpoint only; DeepSpeed unpickles the .pt ones (the universal loader: any <key>.pt it lists)
    files = sorted({path for tag in tag_folders(folder) for path in checked_files(folder, tag, confine=True)
                    if path.name.endswith(".pt")})
    allowed = _allowed_globals()
    for path in files:
        where = path.relative_to(folder.parent)  # checkpoint-10/global_step10/mp_rank_00_model_states.pt
        with open(path, "rb") as f:
            is_zip = f.read(4) == b"PK\x03\x04"  # torch.save's format; mmap needs it (the legacy format is read whole)
        try:
            with torch.serialization.safe_globals(allowed):
                torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
        except pickle.UnpicklingError as error:
            with torch.serialization.safe_globals(allowed):
                names = unsafe_globals(path)  # what GLOBAL opcodes name beyond the allowed ones (read, not run)
            said = ", ".join(sorted(names)) or str(error).strip().splitlines()[0][:200]
            raise UnsafeCheckpointError(
                f"refusing to resume from {folder}: {where} names {said}, which is neither a tensor, plain data nor "
                f"one of DeepSpeed's checkpoint classes ({', '.join(m + '.' + n for m, n in DEEPSPEED_GLOBALS)}), so "
                "unpickling it could run code, and nothing in it was executed. DeepSpeed itself would unpickle it with "
                "weights_only=False; resume from another checkpoint, or replace the file with one DeepSpeed wrote"
            ) from None
        except Exception as error:  # noqa: BLE001 - truncated, not a torch file
            raise _corrupt(folder, str(path.relative_to(folder)), f"cannot be read ({type(error).__name__}: "
                                                                  f"{str(error).strip()[:300]})") from error
    logger.debug("checked %d DeepSpeed files in %s", len(files), folder)
    return files
