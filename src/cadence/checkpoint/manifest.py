"""The checksum manifest written into every checkpoint, and checking a checkpoint folder before it is read."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from ..trainer_state import TrainerState
from .rng import read_rng_state
from ..checkpoint_io.sharded import DCP_METADATA_NAME, check_dcp_folder
from ..checkpoint_io.formats import (LOOP_STATE_NAME, TRAINER_STATE_NAME, WEIGHTS_FILE_RE, CorruptCheckpointError,
                      UnsafeCheckpointError, _corrupt, _index_shards, checked_files, checked_path, confined, safe_load,
                      save_json, unsafe_globals, weights_files)

logger = logging.getLogger(__name__)

MANIFEST_NAME = "checkpoint_manifest.json"  # cadence only: size and sha256 of every other file


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """``checkpoint_manifest.json``: the size and sha256 of every file in ``folder`` (read back on resume)."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MANIFEST_NAME:
            files[path.relative_to(folder).as_posix()] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    save_json({"files": files}, folder / MANIFEST_NAME)

def verify_checkpoint(folder: str | os.PathLike) -> None:
    """Check that every file of ``folder`` is as it was written, before anything is loaded from it.

    With a manifest (cadence's checkpoints) each listed file's size and sha256 are compared, which
    catches truncation and flipped bytes. Without one (transformers' checkpoints) every JSON,
    safetensors and ``torch.save`` file is parsed (``weights_only``), which catches truncation; a
    cadence checkpoint (it has ``loop_state.json``) without its manifest is damaged. Weights a user
    re-sharded after the save (the manifest's weights files gone, another complete layout there) are
    parsed instead, with a warning. FSDP's sharded folders are read safely (:func:`check_dcp_folder`)
    and ``trainer_state.json``'s fields must have their types (:func:`read_trainer_state`).

    Raises:
        CorruptCheckpointError: naming the file and what is wrong with it.
        UnsafeCheckpointError: a file holds more than plain data (never unpickled).
    """
    folder = Path(folder)
    if confined(folder):  # a checkpoint-N folder: every file in it regular and inside it, before any is opened
        checked_files(folder)
    listed = _read_manifest(folder)
    if listed is None:
        for path in sorted(folder.iterdir()):
            if path.suffix in (".json", ".safetensors", ".pt", ".pth", ".bin"):  # the files read next: open only files
                checked_path(folder, path)
            _parse_check(folder, path)
    else:
        _check_listed(folder, listed)
    _check_dcp_folders(folder)  # a manifest rewritten with a planted file would match: read them safely too
    # the state files resume reads, field by field: damage there is found now, so resume=True falls back
    if (folder / TRAINER_STATE_NAME).is_file():
        read_trainer_state(folder)
    read_loop_state(folder)
    for path in sorted(folder.glob("rng_state*.pth")):
        read_rng_state(folder, path.name)


def _inner_name(name: Any) -> bool:
    """A relative path that stays inside the checkpoint folder."""
    return isinstance(name, str) and bool(name) and not os.path.isabs(name) and ".." not in Path(name).parts


def _read_manifest(folder: Path) -> dict | None:
    """The manifest's ``{file: {"bytes", "sha256"}}``, or None when there is none (a transformers checkpoint)."""
    manifest = folder / MANIFEST_NAME
    if not manifest.exists():
        if (folder / LOOP_STATE_NAME).exists():
            raise _corrupt(folder, MANIFEST_NAME, f"is missing, but {LOOP_STATE_NAME} shows cadence wrote this checkpoint, "
                           "and cadence writes a manifest into every one: its files cannot be checked for changed bytes")
        return None
    try:
        listed = json.loads(checked_path(folder, manifest).read_text())["files"]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as e:
        raise _corrupt(folder, MANIFEST_NAME, f"is not a valid manifest ({type(e).__name__}: {e})") from e
    if not isinstance(listed, dict):
        raise _corrupt(folder, MANIFEST_NAME, f"is not a valid manifest (its 'files' is a {type(listed).__name__}, not an object)")
    for name, entry in listed.items():
        if not (_inner_name(name) and isinstance(entry, dict) and type(entry.get("bytes")) is int
                and isinstance(entry.get("sha256"), str)):
            raise _corrupt(folder, MANIFEST_NAME, f"is not a valid manifest (the entry {name!r}: {str(entry)[:80]} is not "
                           '{"bytes": int, "sha256": str} for a file inside the checkpoint)')
    return listed


def _check_listed(folder: Path, listed: dict) -> None:
    """Every file the manifest lists has its size and sha256; weights re-sharded since are parsed instead."""
    missing = [name for name in listed if not os.path.lexists(folder / name)]
    if missing and all(WEIGHTS_FILE_RE.fullmatch(name) for name in missing):
        found = weights_files(folder)
        if found and not any(p.name in listed for p in found):  # a whole other layout, not a part of the listed one
            for path in found:
                _parse_check(folder, path)
            logger.warning("checkpoint %s: its weights are no longer the files it was written with (%s); the %s found "
                           "instead were checked by parsing them and are loaded", folder, ", ".join(missing[:3]),
                           ", ".join(p.name for p in found[:3]) + (" ..." if len(found) > 3 else ""))
            listed = {name: entry for name, entry in listed.items() if name not in missing}
            missing = []
    if missing:
        raise _corrupt(folder, missing[0], "is missing")
    for name, entry in listed.items():
        path = checked_path(folder, folder / name)  # a regular file (inside a checkpoint-N): hashing a FIFO hangs
        size = path.stat().st_size
        if size != entry["bytes"] or _sha256(path) != entry["sha256"]:
            if path.suffix in (".pt", ".pth", ".bin") and unsafe_globals(path):
                safe_load(path)  # a replaced file that would run code: UnsafeCheckpointError names what it calls
            if size != entry["bytes"]:
                raise _corrupt(folder, name, f"has {size} bytes but {entry['bytes']} were written (truncated or replaced)")
            raise _corrupt(folder, name, "has changed since it was written (its sha256 differs from the manifest's)")


def _parse_check(folder: Path, path: Path) -> None:
    """Read ``path`` as its kind (JSON, safetensors header, ``torch.save`` with ``weights_only``, a weights index and its
    shards' presence), which catches truncation; other files (``training_args.bin``, folders) are left to their loaders."""
    try:
        if path.name.endswith(".index.json") and WEIGHTS_FILE_RE.fullmatch(path.name):
            missing = [name for name in _index_shards(path) if not (folder / name).is_file()]
            if missing:
                raise _corrupt(folder, missing[0], f"is missing (listed in {path.name})")
        elif path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".safetensors":
            _check_safetensors(path)
        elif path.suffix in (".pt", ".pth") or (path.suffix == ".bin" and WEIGHTS_FILE_RE.fullmatch(path.name)):
            safe_load(path, allow_numpy_arrays=path.name.startswith("rng_state"))
    except (UnsafeCheckpointError, CorruptCheckpointError) as e:
        if isinstance(e, CorruptCheckpointError) or unsafe_globals(path):
            raise
        raise _corrupt(folder, path.name, "cannot be read (truncated or not a torch.save file)") from None
    except Exception as e:  # noqa: BLE001 - whatever the reader says, the file is unreadable
        raise _corrupt(folder, path.name, f"cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e


def _check_dcp_folders(folder: Path) -> None:
    """:func:`check_dcp_folder` on each DCP folder of the checkpoint (FSDP's sharded model and optimizer)."""
    for sub in sorted(folder.iterdir()):
        if sub.is_dir() and os.path.lexists(sub / DCP_METADATA_NAME):
            checked_path(folder, sub, directory=True)
            check_dcp_folder(sub)


def _check_safetensors(path: Path) -> None:
    """The header parses and the file is as long as the header says (no tensor is loaded)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        header = json.loads(f.read(int.from_bytes(head, "little")))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    expected = 8 + int.from_bytes(head, "little") + end
    if path.stat().st_size != expected:
        raise ValueError(f"{path.stat().st_size} bytes where its header describes {expected}")


_NUMBER, _INT, _NONE = (int, float), (int,), (type(None),)
# trainer_state.json's fields and the JSON types they may hold (what cadence and transformers write)
_STATE_TYPES = {
    "epoch": _NUMBER + _NONE, "global_step": _INT, "max_steps": _INT, "logging_steps": _NUMBER, "eval_steps": _NUMBER,
    "save_steps": _NUMBER, "train_batch_size": _INT + _NONE, "num_train_epochs": _NUMBER, "num_input_tokens_seen": _INT,
    "total_flos": _NUMBER, "log_history": (list,) + _NONE, "best_metric": _NUMBER + _NONE, "best_global_step": _INT + _NONE,
    "best_model_checkpoint": (str,) + _NONE, "is_local_process_zero": (bool,), "is_world_process_zero": (bool,),
    "is_hyper_param_search": (bool,), "trial_name": (str,) + _NONE, "trial_params": (dict,) + _NONE,
    "stateful_callbacks": (dict,) + _NONE,
}


# loop_state.json's fields (cadence's own file) and their JSON types; the first ones resume reads without a default
_LOOP_TYPES = {
    "epoch": _INT, "batches_in_epoch": _INT, "loss_sum": _NUMBER, "nonfinite": _INT, "total": _NUMBER,
    "last_logged_step": _INT, "first_step": _INT, "nonfinite_total": _INT, "batches_per_epoch": _INT + _NONE,
    "train_batch_size": _INT + _NONE, "gradient_accumulation_steps": _INT + _NONE, "world_size": _INT + _NONE,
    "num_samples": _INT + _NONE, "fingerprint": (str,) + _NONE, "job": (str,) + _NONE,
}
_LOOP_REQUIRED = ("epoch", "batches_in_epoch", "loss_sum", "nonfinite", "total", "last_logged_step", "first_step")


def _read_json_object(folder: Path, name: str) -> dict:
    """``folder/name`` parsed as a JSON object; any damage (unreadable, not JSON, nested too deep for the parser,
    not an object) a ``CorruptCheckpointError`` naming the file."""
    try:
        data = json.loads(checked_path(folder, folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise _corrupt(folder, name, f"cannot be read ({type(e).__name__}: {str(e)[:200]})") from e
    if not isinstance(data, dict):
        raise _corrupt(folder, name, f"holds a {type(data).__name__}, not an object of its fields")
    return data


def _check_fields(folder: Path, name: str, data: dict, types: dict, required: tuple = ()) -> None:
    """Each known field of ``data`` (read from ``folder/name``) has its JSON type (whole numbers >= 0 where an int
    is expected); a ``CorruptCheckpointError`` names the file, the field and its value."""
    for field in required:
        if field not in data:
            raise _corrupt(folder, name, f"has no {field}")
    for field, value in data.items():
        allowed = types.get(field)
        wrong = allowed is not None and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed))
        if field == "log_history" and not wrong:
            wrong = not all(isinstance(row, dict) for row in value or [])
        elif not wrong and allowed in (_INT, _INT + _NONE) and value is not None:
            wrong = value < 0
        if wrong:
            kinds = {int: "a whole number >= 0", list: "a list of objects", bool: "true or false", str: "a string",
                     dict: "an object", type(None): "null"}
            expected = "a number" if float in allowed else kinds[allowed[0]]
            expected += " or null" if type(None) in allowed and allowed[0] is not type(None) else ""
            raise _corrupt(folder, name, f"has {field}={value!r:.80}, which is not {expected}")


def read_loop_state(folder: str | os.PathLike) -> dict | None:
    """``loop_state.json`` of ``folder`` (cadence's data position and loss sums), each field checked for its type;
    None when there is none (a transformers checkpoint).

    Raises:
        CorruptCheckpointError: naming the file, the field and its value.
    """
    folder = Path(folder)
    if not os.path.lexists(folder / LOOP_STATE_NAME):
        return None
    data = _read_json_object(folder, LOOP_STATE_NAME)
    _check_fields(folder, LOOP_STATE_NAME, data, _LOOP_TYPES, _LOOP_REQUIRED)
    return data


def read_trainer_state(folder: str | os.PathLike) -> TrainerState:
    """``trainer_state.json`` of ``folder`` as a ``TrainerState``, each known field checked for its type first
    (a string step or a non-list history would otherwise fail only once training has run).

    Raises:
        CorruptCheckpointError: naming the file, the field and its value.
    """
    folder = Path(folder)
    data = _read_json_object(folder, TRAINER_STATE_NAME)
    _check_fields(folder, TRAINER_STATE_NAME, data, _STATE_TYPES)
    try:
        return TrainerState.load_from_json(str(folder / TRAINER_STATE_NAME))
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:  # a field the types above allow
        raise _corrupt(folder, TRAINER_STATE_NAME, f"cannot be read as TrainerState ({type(e).__name__}: {str(e)[:200]})") from e

