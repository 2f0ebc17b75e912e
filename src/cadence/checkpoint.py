"""Checkpoints in Hugging Face's layout: written atomically, read safely, resumed exactly.

The Trainer calls one pair: :func:`save` ``(folder, objects, backend, args)`` writes named objects
(model, optimizer, scheduler, scaler, loop state, stream state, ``TrainerState`` and the callbacks'
states) and rotates; :func:`load` ``(folder, objects, backend, args)`` restores them in place and
returns the :class:`ResumePoint` whose ``start_epoch`` continues the data and the RNGs. Only the
weights are loaded apart (``Backend.load_model_weights``, before the optimizer exists), and the best
model at the end of training.

A checkpoint is written into ``tmp-checkpoint-N/``, every file flushed and fsynced, and only then
renamed to ``checkpoint-N/``: a folder with that name is always complete (``get_last_checkpoint``
also requires ``trainer_state.json``, written last). Rotation keeps the newest checkpoints and the
best one, and never deletes the one just written.

Reading never runs code: weights come through safetensors, every other file through JSON or
``torch.load(weights_only=True)`` (for ``rng_state.pth`` with numpy's array type allowed, as
transformers writes numpy's RNG state as an array; cadence writes it as plain lists). A file that
``weights_only`` refuses raises :class:`UnsafeCheckpointError` and nothing in it is executed. FSDP's
sharded folders (torch.distributed.checkpoint) are read the same way: ``.metadata`` through an
unpickler that knows only DCP's records, every ``.distcp`` value with ``weights_only``.

Files (the names transformers uses, so either library resumes the other's checkpoints)::

    model.safetensors      weights (or the model's own save_pretrained files: a PEFT model's adapter only,
                           adapter_model.safetensors + adapter_config.json); above MAX_SHARD_SIZE
                           model-0000k-of-0000n.safetensors + model.safetensors.index.json. Read also:
                           pytorch_model.bin and its sharded index (transformers 4.x), with weights_only
    optimizer.pt           optimizer.state_dict()
    scheduler.pt           lr_scheduler.state_dict()
    rng_state.pth          python/numpy/torch(/GPU) RNG states; rng_state_{rank}.pth per process
    trainer_state.json     TrainerState, written last (the completeness marker)
    training_args.bin/json the arguments, as plain data
    loop_state.json        cadence only: the data position and the loss summed since the last log
    checkpoint_manifest.json  cadence only: size and sha256 of every other file, checked before resuming

Resume (``Trainer.train(resume_from_checkpoint=...)``) and its decisions:

- Checkpoints are written only at optimizer-step ends and epoch ends, never inside an accumulation
  window; a run killed mid-window resumes from the step before it.
- The data position is ``(epoch, batches into it)``; the sampler starts after the trained batches,
  so none is read again. The RNGs are restored where the saving run was: before the epoch's events
  for a save between epochs, after the epoch's iterator exists for a save inside it. Randomness
  drawn inside dataloader *workers* is not replayed by a mid-epoch resume (the workers restart);
  the main process's draws (dropout, collators, ``num_workers=0`` datasets) are.
- A cadence checkpoint also restores the loss summed since the last log, so the resumed run logs
  and reports ``train_loss`` exactly as an unbroken run. A transformers checkpoint lacks it, so, as
  transformers does, the first log averages the steps since the resume and ``train_loss`` this
  call's steps. Logging/eval/save intervals come from this run's arguments.
- A checkpoint written by another number of processes, per-device batch size or accumulation is
  resumed as transformers allows: the position is recomputed from the samples the saving run had
  trained in its epoch (its batches x its per-device batch x its processes), rounded down to a whole
  batch of this run, with a warning that the run is no longer bit-identical to an unbroken one. Only
  another dataset (its length, or a ``datasets`` fingerprint, differs from the saved one) is refused,
  unless ``ignore_data_skip=True`` restarts the checkpoint's epoch.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import inspect
import io
import json
import logging
import os
import pickle
import re
import random
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from . import backend, output_guard
from .background_save import BackgroundWriter
from .loop_state import BatchLayout
from .trainer_callback import ExportableState, TrainerCallback, TrainerState
from .trainer_utils import CHECKPOINT_DIR_RE, has_length, sorted_checkpoints

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.bin"
TRAINING_ARGS_JSON = "training_args.json"
RNG_STATE_NAME = "rng_state.pth"
LOOP_STATE_NAME = "loop_state.json"
STREAM_STATE_NAME = "stream_state.pt"  # an iterable dataset's own state_dict(), when it has one
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"  # sharded weights, as save_pretrained writes them
PT_WEIGHTS_NAME = "pytorch_model.bin"  # transformers 4.x / save_safetensors=False (read with weights_only)
PT_WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
# every file name a weights layout uses: single files, indexes, shards (model-00001-of-00002.safetensors)
WEIGHTS_FILE_RE = re.compile(r"(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?")
MODEL_SHARDS_NAME = "pytorch_model_fsdp_0"  # FSDP's sharded state (torch.distributed.checkpoint), accelerate's names
OPTIMIZER_SHARDS_NAME = "optimizer_0"


# Weights larger than this are split into model-0000k-of-0000n.safetensors + model.safetensors.index.json, as
# transformers' save_pretrained does with its default max_shard_size (an int in bytes, or "5GB", "500MiB", ...).
MAX_SHARD_SIZE: int | str = "50GB"


def save_model_weights(model: torch.nn.Module, folder: str | os.PathLike, processing_class: Any = None,
                       state_dict: dict | None = None) -> None:
    """``model.save_pretrained`` (config.json etc.) when the model has it, else its state dict in safetensors.

    Shared (tied) tensors are stored once; ``processing_class.save_pretrained`` is called when present.
    ``state_dict`` (from ``Backend.model_state_dict``) replaces the model's own; ``{}`` means the weights
    are already in the folder as shards, so only the model's config is written. Weights larger than
    :data:`MAX_SHARD_SIZE` are sharded as ``save_pretrained`` shards them.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if state_dict is not None and not state_dict:
        if hasattr(getattr(model, "config", None), "save_pretrained"):
            model.config.save_pretrained(folder)
    elif hasattr(model, "save_pretrained"):
        extra = {} if state_dict is None else {"state_dict": state_dict}
        if _takes_keyword(model.save_pretrained, "max_shard_size"):  # transformers' models; a user's may not
            extra["max_shard_size"] = MAX_SHARD_SIZE
        model.save_pretrained(folder, safe_serialization=True, **extra)
    else:
        save_safetensors_sharded(model.state_dict() if state_dict is None else state_dict, folder)
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        processing_class.save_pretrained(folder)


def _takes_keyword(function: Callable, name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


def shard_size_bytes(size: int | str) -> int:
    """``MAX_SHARD_SIZE`` in bytes: an int, or digits and a unit as transformers reads them (KB = 1000 bytes,
    KiB = 1024)."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"(\d+)\s*([KMGT]i?B)", str(size).strip(), re.IGNORECASE)
    if not match:
        raise ValueError(f"max shard size {size!r} is not an int or digits with a unit such as '5GB' or '500MiB'")
    unit = match.group(2)
    power = "KMGT".index(unit[0].upper()) + 1
    if "i" in unit.lower():
        return int(match.group(1)) * 1024 ** power
    return int(match.group(1)) * 1000 ** power // (8 if unit.endswith("b") else 1)  # "Gb": bits, as transformers reads it


def save_safetensors_sharded(state_dict: dict, folder: Path) -> list[str]:
    """``model.safetensors``, or shards of at most :data:`MAX_SHARD_SIZE` bytes (a larger tensor alone in one)
    with ``model.safetensors.index.json`` (``{"metadata": {"total_parameters", "total_size"}, "weight_map"}``),
    as ``save_pretrained`` writes them; weights files of another layout left in ``folder`` are removed.
    Returns the weights files written."""
    from safetensors.torch import save_file

    tensors = _untied(state_dict)
    limit = shard_size_bytes(MAX_SHARD_SIZE)
    shards: list[dict] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:  # this tensor would overflow the shard: start the next
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    n = len(shards)
    names = [WEIGHTS_NAME] if n == 1 else [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    for stale in folder.iterdir():  # a save_model into a folder holding another layout: only the new one stays
        if WEIGHTS_FILE_RE.fullmatch(stale.name) and stale.name not in names and stale.is_file():
            stale.unlink()
    for name, shard in zip(names, shards):
        save_file(shard, str(folder / name), metadata={"format": "pt"})
    if n > 1:
        index = {"metadata": {"total_parameters": sum(t.numel() for t in tensors.values()),
                              "total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                 "weight_map": {key: name for name, shard in zip(names, shards) for key in shard}}
        save_json(index, folder / SAFE_WEIGHTS_INDEX_NAME)
        names.append(SAFE_WEIGHTS_INDEX_NAME)
    return names


def _untied(state_dict: dict) -> dict:
    """Contiguous tensors, each storage once (safetensors refuses shared ones; loading re-ties them)."""
    seen, out = set(), {}
    for name, tensor in state_dict.items():
        if tensor.data_ptr() not in seen or not tensor.numel():  # empty tensors share address 0, not storage
            seen.add(tensor.data_ptr())
            out[name] = tensor.contiguous()
    return out


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


def staging_folder(final: str | os.PathLike) -> Path:
    """Where ``final`` is written before it is renamed into place (never chosen for resume)."""
    final = Path(final)
    return final.parent / f"tmp-{final.name}"


def write_atomically(final: str | os.PathLike, write: Callable[[Path], None], fresh: bool = True) -> Path:
    """Run ``write(tmp_folder)``, add the checksum manifest, fsync, then rename the folder to ``final``.

    Args:
        final: the checkpoint folder to create (replaced if it exists, never left missing).
        write: writes the files into the folder it is given.
        fresh: start from an empty staging folder; False keeps files other processes put there.

    On any error the temporary folder is removed, older checkpoints are untouched, and an
    ``OSError`` names the folder, the file being written, the cause (disk full, permission
    denied, ...) and, for a full disk, the space a checkpoint needs and the space free.
    """
    final = Path(final)
    tmp = staging_folder(final)
    try:
        if fresh:
            shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=not fresh)
        write(tmp)
        write_manifest(tmp)
        _fsync_tree(tmp)
        if final.exists():  # saving the same step twice: swap, so a complete folder always exists
            old = final.parent / f"old-{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(final.parent)  # the rename itself survives a power cut
    except BaseException as e:
        error = _write_error(final, tmp, e) if isinstance(e, (OSError, RuntimeError)) else None
        shutil.rmtree(tmp, ignore_errors=True)
        if error is not None:  # torch.save reports a full disk as RuntimeError
            raise error from e
        raise
    return final


def _write_error(final: Path, tmp: Path, error: BaseException) -> OSError:
    """An ``OSError`` naming the checkpoint, the file being written (the newest in the staging folder),
    the cause, the size a checkpoint takes and the free space (read before the staging folder goes)."""
    cause = getattr(error, "strerror", None) or str(error).splitlines()[0]
    files = [p for p in tmp.rglob("*") if p.is_file()] if tmp.is_dir() else []
    culprit = getattr(error, "filename", None)
    if culprit is None and files:
        culprit = max(files, key=lambda p: p.stat().st_mtime_ns)  # the one being written when it failed
    culprit = Path(culprit).name if culprit is not None else "its first file"
    written = sum(p.stat().st_size for p in files)
    try:
        previous = sorted_checkpoints(final.parent)
        free = shutil.disk_usage(final.parent).free
    except OSError:
        previous, free = [], None
    if previous:
        needed = sum(p.stat().st_size for p in previous[-1].rglob("*") if p.is_file())
        size = f"a checkpoint here takes about {_human_bytes(needed)} (the size of {previous[-1].name})"
    else:
        needed = written
        size = f"a checkpoint here takes more than the {_human_bytes(written)} written before the failure"
    code = getattr(error, "errno", None)
    if code is None and free is not None and free < needed:  # torch.save hides the errno of a full disk
        code, cause = errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}; torch said: {cause}"
    room = f" and {_human_bytes(free)} is free there" if free is not None else ""
    message = (
        f"could not write checkpoint {final}: writing {culprit} failed ({cause}); {size}{room}. Nothing of this "
        "checkpoint was kept and older checkpoints are intact. Free disk space or lower save_total_limit: "
        "save_total_limit=N needs room for N+1 checkpoints (the oldest is deleted only after the new one is complete)"
    )
    return OSError(code, message) if code is not None else OSError(message)


def _human_bytes(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---------------------------------------------------------------- checksum manifest

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


class CorruptCheckpointError(ValueError):
    """A checkpoint file is missing, truncated, changed on disk, or unreadable."""


def _corrupt(folder: Path, name: str, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"checkpoint {folder} is damaged: {name} {why}")


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
    listed = _read_manifest(folder)
    if listed is None:
        for path in sorted(folder.iterdir()):
            _parse_check(folder, path)
    else:
        _check_listed(folder, listed)
    _check_dcp_folders(folder)  # a manifest rewritten with a planted file would match: read them safely too
    if (folder / TRAINER_STATE_NAME).is_file():
        read_trainer_state(folder)


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
        listed = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError, IndexError) as e:
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
    missing = [name for name in listed if not (folder / name).is_file()]
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
        path = folder / name
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
        if sub.is_dir() and (sub / DCP_METADATA_NAME).is_file():
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


def prepare_staging(final: str | os.PathLike) -> Path:
    """An empty staging folder for ``final`` (the main process, before the others put files in it)."""
    tmp = staging_folder(final)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    except OSError as e:
        raise _write_error(Path(final), tmp, e) from e
    return tmp


def save_rng_state(final: str | os.PathLike, process_index: int, world_size: int) -> None:
    """This process's RNG states into the staging folder of ``final`` (``rng_state[_{rank}].pth``)."""
    tmp = staging_folder(final)
    try:
        tmp.mkdir(parents=True, exist_ok=True)  # a node that does not share the main process's disk
        torch.save(capture_rng_state(world_size), tmp / rng_state_name(process_index, world_size))
    except (OSError, RuntimeError) as e:
        error = _write_error(Path(final), tmp, e)
        shutil.rmtree(tmp, ignore_errors=True)
        raise error from e


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


DELETING_PREFIX = "deleting-"  # a rotated-away checkpoint between its rename and the end of its deletion


def remove_incomplete(output_dir: str | os.PathLike) -> list[Path]:
    """Delete ``tmp-checkpoint-*`` folders a killed save left behind and ``deleting-checkpoint-*`` ones a killed
    rotation left; put back an ``old-checkpoint-N`` whose replacement was interrupted. Returns the deleted folders."""
    output_dir = Path(output_dir)
    deleted = []
    for old in output_dir.glob("old-checkpoint-*"):
        final = output_dir / old.name[len("old-"):]
        if CHECKPOINT_DIR_RE.match(final.name) and not final.exists():
            os.replace(old, final)
        else:
            shutil.rmtree(old, ignore_errors=True)
            deleted.append(old)
    for doomed in output_dir.glob(DELETING_PREFIX + "checkpoint-*"):  # a rotation killed mid-delete
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(doomed)
    for tmp in output_dir.glob("tmp-checkpoint-*"):
        if CHECKPOINT_DIR_RE.match(tmp.name[len("tmp-"):]) and tmp.is_dir():
            logger.info("removing incomplete checkpoint %s (a save was interrupted)", tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            deleted.append(tmp)
    return deleted


def save_json(obj: Any, path: Path) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def rotate_checkpoints(output_dir: str | os.PathLike, limit: int | None, best: str | None, just_written: Path,
                       earlier: set[Path] = frozenset()) -> list[Path]:
    """Delete the oldest checkpoints beyond ``limit``, never the best one nor the one just written; the
    ``earlier`` run's checkpoints (``output_guard.earlier_checkpoints``) neither count nor go.

    Returns the deleted folders.
    """
    if not limit:
        return []
    earlier = {Path(p).resolve() for p in earlier}
    own = [c for c in sorted_checkpoints(output_dir) if c.resolve() not in earlier]
    return delete_oldest(own, limit, {just_written, best})


def delete_oldest(ordered: list[Path], limit: int, keep: set) -> list[Path]:
    """Delete from the front of ``ordered`` (oldest first) until ``limit`` are left, never one in ``keep``;
    the kept ones count toward the limit (with ``limit=1`` and a best that is not the newest, both stay).

    Returns the deleted folders.
    """
    keep = {Path(k).resolve() for k in keep if k is not None}
    budget = max(limit, len(keep))
    deletable = [c for c in ordered if Path(c).resolve() not in keep]
    deleted = deletable[: max(len(ordered) - budget, 0)]
    for path in deleted:
        logger.info("deleting older checkpoint %s (save_total_limit=%d)", path, limit)
        # renamed first (atomic), then deleted: a kill mid-delete leaves a deleting-checkpoint-N, never a partial checkpoint-N
        doomed = Path(path).with_name(DELETING_PREFIX + Path(path).name)
        os.replace(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return deleted


# ---------------------------------------------------------------- reading, safely


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file holds more than tensors and plain data; it was not unpickled."""


def _numpy_array_globals() -> list:
    """What a pickled numpy array needs (transformers' rng_state.pth holds one): array data, no code."""
    core = np._core if hasattr(np, "_core") else np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def safe_load(path: str | os.PathLike, allow_numpy_arrays: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU; a refused file raises ``UnsafeCheckpointError``.

    Args:
        path: a ``.pt``/``.pth``/``.bin`` file.
        allow_numpy_arrays: also accept numpy arrays (for RNG states written by transformers).

    Returns:
        The loaded tensors and plain data.
    """
    allowed = _numpy_array_globals() if allow_numpy_arrays else []
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it names {', '.join(unsafe_globals(path)) or 'objects'} besides tensors and "
            "plain data, so unpickling it could run code, and nothing in it was executed. cadence loads checkpoint "
            "files only with torch.load(weights_only=True); replace the file with one written by cadence or "
            "transformers, or resume from another checkpoint"
        ) from e


def unsafe_globals(path: str | os.PathLike) -> list[str]:
    """The classes and functions a pickle names that ``weights_only`` does not allow (read, not run)."""
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # not a torch zip file at all: nothing more to say
        return []


# ---------------------------------------------------------------- FSDP's sharded state (torch.distributed.checkpoint)
#
# A DCP folder (``pytorch_model_fsdp_0/``, ``optimizer_0/``) holds ``.metadata``, which torch's reader unpickles
# with plain pickle, and ``__{rank}_0.distcp`` files: a ``torch.save`` blob per tensor (torch loads them with
# ``weights_only``) or per non-tensor value (the optimizer's lr, betas, ...: torch's planner loads those with
# ``weights_only=False``). cadence reads ``.metadata`` with an unpickler that knows only DCP's record classes and
# every blob with ``weights_only=True``, so no file of a sharded checkpoint can run code.

DCP_METADATA_NAME = ".metadata"


class _ForbiddenGlobal(pickle.UnpicklingError):
    """A pickle names something outside the allowed records."""


@functools.cache
def _dcp_metadata_globals() -> dict[tuple[str, str], Any]:
    """What DCP's ``.metadata`` may name: its dataclasses (built field by field), dtypes and layouts, ``torch.Size``,
    paths (its ``checkpoint_id``). Calling any of them builds a record and runs nothing else."""
    import pathlib

    from torch.distributed.checkpoint import filesystem, metadata

    records = ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
               "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
    allowed = {("torch.distributed.checkpoint.metadata", n): getattr(metadata, n) for n in records}
    allowed[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = filesystem._StorageInfo
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout  # a name -> torch.strided etc.
    for name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"):
        allowed[("pathlib", name)] = getattr(pathlib, name)
    for name, value in vars(torch).items():
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            allowed[("torch", name)] = value
    return allowed


class _DcpMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _dcp_metadata_globals()[(module, name)]
        except KeyError:
            raise _ForbiddenGlobal(f"{module}.{name}") from None


def _dcp_file(path: Path) -> str:
    """``checkpoint-N/optimizer_0/.metadata``: a DCP file named with its checkpoint, as errors name it."""
    return "/".join(path.parts[-3:])


def read_dcp_metadata(folder: str | os.PathLike) -> Any:
    """The ``Metadata`` of the DCP folder ``folder``, unpickled with only DCP's records allowed, and checked:
    every storage entry points at a ``.distcp`` file inside ``folder``, within its size.

    Raises:
        UnsafeCheckpointError: ``.metadata`` names anything else (nothing was run).
        CorruptCheckpointError: it is unreadable or describes data that is not there.
    """
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata

    folder = Path(folder)
    path = folder / DCP_METADATA_NAME
    try:
        with open(path, "rb") as f:
            meta = _DcpMetadataUnpickler(f).load()
    except _ForbiddenGlobal as e:
        raise UnsafeCheckpointError(
            f"refusing to load {_dcp_file(path)}: it names {e}, which is not part of torch.distributed.checkpoint's "
            "metadata, so unpickling it could run code, and nothing in it was executed; resume from another "
            "checkpoint") from None
    except Exception as e:  # noqa: BLE001 - truncated, not a pickle, a record built with wrong arguments
        raise _corrupt(folder.parent, f"{folder.name}/{DCP_METADATA_NAME}", f"cannot be read ({type(e).__name__}: {e})") from e
    if not (isinstance(meta, Metadata) and isinstance(meta.state_dict_metadata, dict) and isinstance(meta.storage_data, dict)
            and all(isinstance(v, (TensorStorageMetadata, BytesStorageMetadata)) for v in meta.state_dict_metadata.values())):
        raise _corrupt(folder.parent, f"{folder.name}/{DCP_METADATA_NAME}", "is not torch.distributed.checkpoint metadata")
    sizes: dict[str, int] = {}
    for index, info in meta.storage_data.items():
        name, offset, length = getattr(info, "relative_path", None), getattr(info, "offset", None), getattr(info, "length", None)
        descriptors = getattr(info, "transform_descriptors", None) or ()
        where = f"{folder.name}/{DCP_METADATA_NAME}"
        if not (isinstance(name, str) and re.fullmatch(r"[\w.-]+\.distcp", name)):  # no path: a file of this folder
            raise _corrupt(folder.parent, where, f"points {getattr(index, 'fqn', index)!r} at {name!r}, not a .distcp file of this folder")
        if name not in sizes:
            if not (folder / name).is_file():
                raise _corrupt(folder.parent, f"{folder.name}/{name}", "is missing")
            sizes[name] = (folder / name).stat().st_size
        if not (type(offset) is int and type(length) is int and 0 <= offset and 0 <= length
                and offset + length <= sizes[name] and all(isinstance(d, str) for d in descriptors)):
            raise _corrupt(folder.parent, f"{folder.name}/{name}",
                           f"is shorter than its metadata says ({getattr(index, 'fqn', index)!r} at {offset}+{length}, "
                           f"{sizes[name]} bytes) (truncated?)")
    return meta


def check_dcp_folder(folder: str | os.PathLike) -> None:
    """Check every file of the DCP folder ``folder`` without loading a tensor: ``.metadata`` through
    :func:`read_dcp_metadata`, and every blob of the ``.distcp`` files: a non-tensor value is loaded with
    ``weights_only``, a tensor's pickle is scanned for names ``weights_only`` refuses.

    Raises:
        UnsafeCheckpointError: a file names code (the file is named; nothing was run).
        CorruptCheckpointError: a file is unreadable.
    """
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    folder = Path(folder)
    meta = read_dcp_metadata(folder)
    for index, info in meta.storage_data.items():
        path = folder / info.relative_path
        is_bytes = isinstance(meta.state_dict_metadata.get(getattr(index, "fqn", None)), BytesStorageMetadata)
        with open(path, "rb") as f:
            blob = _FileSlice(f, info.offset, info.length)
            is_zip = blob.read(4) == b"PK\x03\x04"  # torch.save's format: its pickle can be scanned without loading
            blob.seek(0)
            names = unsafe_globals(blob) if is_zip else []
            if names or is_bytes or not is_zip:
                try:
                    blob.seek(0)
                    torch.load(io.BytesIO(blob.read()), map_location="cpu", weights_only=True)  # small values only
                except pickle.UnpicklingError as e:
                    raise UnsafeCheckpointError(
                        f"refusing to load {_dcp_file(path)}: its entry {index.fqn!r} names {', '.join(names) or 'objects'} "
                        "besides tensors and plain data, so unpickling it could run code, and nothing in it was executed; "
                        "resume from another checkpoint") from e
                except Exception as e:  # noqa: BLE001
                    raise _corrupt(folder.parent, f"{folder.name}/{info.relative_path}",
                                   f"cannot be read at {index.fqn!r} ({type(e).__name__}: {e})") from e


class _FileSlice(io.RawIOBase):
    """``length`` bytes of an open file from ``offset``, as a seekable file of their own (one DCP blob)."""

    def __init__(self, file: Any, offset: int, length: int):
        super().__init__()
        self.file, self.offset, self.length, self.pos = file, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        self.pos = max(0, min(self.length, (0, self.pos, self.length)[whence] + pos))
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: Any) -> int:
        self.file.seek(self.offset + self.pos)
        data = self.file.read(min(len(buffer), self.length - self.pos))
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


@functools.cache
def _safe_dcp_classes() -> tuple[type, type]:
    """torch's file reader and load planner, with the two reads that unpickle replaced by safe ones."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes uses
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            meta = read_dcp_metadata(Path(self.path))
            meta.storage_meta = meta.storage_meta if isinstance(meta.storage_meta, StorageMeta) else StorageMeta()
            meta.storage_meta.load_id = self.load_id
            return meta

    class SafePlanner(DefaultLoadPlanner):
        def __init__(self, folder: Path):
            super().__init__()
            self.folder = folder

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                loaded = torch.load(value, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as e:
                path = self.folder / self.metadata.storage_data[read_item.storage_index].relative_path
                raise UnsafeCheckpointError(
                    f"refusing to load {_dcp_file(path)}: its entry {read_item.dest_index.fqn!r} holds more than "
                    "tensors and plain data, so unpickling it could run code, and nothing in it was executed; resume "
                    "from another checkpoint") from e
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafeReader, SafePlanner


def load_dcp(state: dict, folder: str | os.PathLike) -> None:
    """``torch.distributed.checkpoint.load(state, checkpoint_id=folder)`` (every process), reading every file
    without running code: checked first (:func:`check_dcp_folder`), then read by torch's reader and planner with
    their two unpickling reads replaced (``.metadata`` restricted, non-tensor values ``weights_only``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    check_dcp_folder(folder)  # its errors here, naming the file: inside dcp.load they lose the name or the type
    reader, planner = _safe_dcp_classes()
    try:
        dcp.load(state, storage_reader=reader(folder), planner=planner(Path(folder)))
    except CheckpointException as e:  # a BaseException holding each process's error: raise ours as it was
        errors = [error for error, _ in e.failures.values()]
        for error in errors:
            if isinstance(error, (UnsafeCheckpointError, CorruptCheckpointError)):
                raise error from None
        if any(isinstance(error, pickle.UnpicklingError) for error in errors):
            raise UnsafeCheckpointError(
                f"refusing to load {folder}: a file in it holds more than tensors and plain data, so unpickling it "
                "could run code, and nothing in it was executed; resume from another checkpoint") from None
        raise


_HF_ARGS_PACKAGES = ("transformers", "accelerate")  # what transformers' pickled TrainingArguments names


def load_training_args(folder: str | os.PathLike) -> dict | None:
    """The arguments a checkpoint was written with, as a dict, or None when it has none readable.

    cadence stores a plain dict in ``training_args.bin`` (and ``training_args.json``);
    transformers pickles its ``TrainingArguments`` object there, which is never unpickled: a file
    whose every non-plain name lives in ``transformers`` or ``accelerate`` is taken for that and
    skipped (not needed to resume); any other is refused.
    """
    folder = Path(folder)
    path = folder / TRAINING_ARGS_NAME
    if path.exists():
        try:
            loaded = safe_load(path)
            return dict(loaded) if isinstance(loaded, dict) else None
        except UnsafeCheckpointError:
            names = unsafe_globals(path)
            if not names or not all(n.split(".")[0] in _HF_ARGS_PACKAGES for n in names):
                raise
            logger.info("%s holds transformers' TrainingArguments object: not unpickled (not needed to resume)", path)
    json_path = folder / TRAINING_ARGS_JSON
    return json.loads(json_path.read_text()) if json_path.exists() else None


def load_model_weights(model: torch.nn.Module, folder: str | os.PathLike) -> None:
    """Load ``model.safetensors`` (or its sharded index) of ``folder`` into ``model``.

    Tied weights stored once (as ``save_pretrained`` and safetensors do) are accepted; any other
    missing or unexpected key is an error naming the keys. A model with PEFT adapters loads its
    adapters (what its ``save_pretrained`` wrote), not the frozen base.
    """
    from . import peft_support

    if peft_support.has_adapters(model):
        return peft_support.load_adapter_weights(model, folder)
    folder = Path(folder)
    state = read_model_weights(folder, next((p.device for p in model.parameters()), torch.device("cpu")))
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded_storage = {own[k].data_ptr() for k in state if k in own}
    missing = [k for k in missing if own[k].data_ptr() not in loaded_storage]  # tied to a loaded tensor: fine
    if missing or unexpected:
        raise ValueError(
            f"the weights in {folder} do not fit {type(model).__name__}: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; resume with the same model the checkpoint was written from"
        )


def weights_files(folder: str | os.PathLike) -> list[Path]:
    """The files that hold the weights in ``folder``: the first layout present of ``model.safetensors``, its index
    and shards, ``pytorch_model.bin``, its index and shards (transformers' order of preference); [] when none.

    Raises:
        CorruptCheckpointError: an index that is not ``{"weight_map": {name: shard file}}``.
    """
    folder = Path(folder)
    for name in (WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, PT_WEIGHTS_NAME, PT_WEIGHTS_INDEX_NAME):
        path = folder / name
        if path.is_file():
            return [path, *(folder / shard for shard in _index_shards(path))] if name.endswith(".json") else [path]
    return []


def _index_shards(index: Path) -> list[str]:
    """The shard files a weights index names (each once, sorted)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise _corrupt(index.parent, index.name, f"is not a weights index ({type(e).__name__}: {e})") from e
    bad = [s for s in shards if not (isinstance(s, str) and WEIGHTS_FILE_RE.fullmatch(s))]
    if bad or not shards:
        raise _corrupt(index.parent, index.name, f"is not a weights index (its weight_map names {bad[:1] or 'no file'})")
    return shards


def read_model_weights(folder: str | os.PathLike, device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors of the weights in ``folder`` (:func:`weights_files`: safetensors, or ``pytorch_model.bin``
    through ``torch.load(weights_only=True)``, single or sharded), on ``device``."""
    from safetensors.torch import load_file

    folder = Path(folder)
    files = [p for p in weights_files(folder) if not p.name.endswith(".json")]
    if not files:
        raise FileNotFoundError(
            f"checkpoint {folder} has no weights: none of {WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, {PT_WEIGHTS_NAME}, "
            f"{PT_WEIGHTS_INDEX_NAME}; pass a checkpoint folder written by cadence or transformers"
        )
    state = {}
    for path in files:
        if path.suffix == ".safetensors":
            state.update(load_file(str(path), device=str(device)))
        else:  # a pickle: loaded with weights_only, so it cannot run code
            loaded = safe_load(path)
            if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
                raise _corrupt(folder, path.name, "does not hold a state dict of tensors")
            state.update({k: v.to(device) for k, v in loaded.items()})
    return state


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


def read_trainer_state(folder: str | os.PathLike) -> TrainerState:
    """``trainer_state.json`` of ``folder`` as a ``TrainerState``, each known field checked for its type first
    (a string step or a non-list history would otherwise fail only once training has run).

    Raises:
        CorruptCheckpointError: naming the file, the field and its value.
    """
    path = Path(folder) / TRAINER_STATE_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise _corrupt(Path(folder), TRAINER_STATE_NAME, f"cannot be read ({type(e).__name__}: {e})") from e
    if not isinstance(data, dict):
        raise _corrupt(Path(folder), TRAINER_STATE_NAME, f"holds a {type(data).__name__}, not an object of TrainerState's fields")
    for name, value in data.items():
        types = _STATE_TYPES.get(name)
        wrong = types is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types))
        if name == "log_history" and not wrong:
            wrong = not all(isinstance(row, dict) for row in value or [])
        elif not wrong and types in (_INT, _INT + _NONE) and value is not None:
            wrong = value < 0
        if wrong:
            kinds = {int: "a whole number >= 0", list: "a list of objects", bool: "true or false", str: "a string",
                     dict: "an object", type(None): "null"}
            expected = "a number" if float in types else kinds[types[0]]
            expected += " or null" if type(None) in types and types[0] is not type(None) else ""
            raise _corrupt(Path(folder), TRAINER_STATE_NAME, f"has {name}={value!r:.80}, which is not {expected}")
    return TrainerState.load_from_json(str(path))


def resolve_checkpoint(resume_from_checkpoint: str | os.PathLike | bool, output_dir: str | os.PathLike) -> Path:
    """``True`` -> the newest complete ``checkpoint-N`` of ``output_dir`` whose files are intact; a path ->
    that folder, checked.

    A damaged newest checkpoint (a truncated or changed file, see :func:`verify_checkpoint`) is
    skipped with a warning naming the file, and the next older one is tried.

    Raises:
        ValueError: no complete checkpoint exists, or the path is not a checkpoint folder.
        CorruptCheckpointError: the given folder, or every checkpoint of ``output_dir``, is damaged.
    """
    if resume_from_checkpoint is True:
        found = sorted_checkpoints(output_dir) if os.path.isdir(output_dir) else []
        if not found:
            raise ValueError(
                f"resume_from_checkpoint=True, but output_dir={str(output_dir)!r} has no complete checkpoint-N "
                f"folder (one with {TRAINER_STATE_NAME}): train without resume_from_checkpoint, or pass a checkpoint path"
            )
        errors = []
        for folder in reversed(found):
            try:
                verify_checkpoint(folder)
                return folder
            except CorruptCheckpointError as e:
                logger.warning("%s; resuming from an older checkpoint instead", e)
                errors.append(str(e))
        raise CorruptCheckpointError(
            f"resume_from_checkpoint=True, but every checkpoint in output_dir={str(output_dir)!r} is damaged: "
            + "; ".join(errors) + ". Start a new run (overwrite_output_dir=True deletes them)"
        )
    path = Path(resume_from_checkpoint)
    if not path.is_dir():
        raise ValueError(
            f"resume_from_checkpoint={str(resume_from_checkpoint)!r} is not a folder: pass a checkpoint-N folder, "
            "or True for the newest checkpoint in output_dir"
        )
    if not (path / TRAINER_STATE_NAME).is_file():
        raise ValueError(
            f"resume_from_checkpoint={str(resume_from_checkpoint)!r} is not a complete checkpoint: it has no "
            f"{TRAINER_STATE_NAME} (written last, so either its save was interrupted or it is not a checkpoint "
            "folder); pass a checkpoint-N folder, or True for the newest complete one"
        )
    try:
        verify_checkpoint(path)
    except CorruptCheckpointError as e:
        raise CorruptCheckpointError(
            f"resume_from_checkpoint={str(resume_from_checkpoint)!r}: {e}; pass an older checkpoint-N folder, or "
            "True for the newest intact one"
        ) from e
    return path


# ---------------------------------------------------------------- RNG states


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
    state.update(backend.device_rng_state(all_devices=world_size > 1))  # HF: all GPUs' with several processes
    return state


def restore_rng_state(state: dict[str, Any] | None) -> None:
    """Set every RNG from what :func:`capture_rng_state` (or transformers) stored; None: nothing."""
    if state is None:
        return
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    torch.random.set_rng_state(state["cpu"])
    backend.set_device_rng_state(state)


def checkpoint_world_size(folder: str | os.PathLike) -> int | None:
    """How many processes wrote ``folder`` (from its RNG files), or None when it has none."""
    folder = Path(folder)
    if (folder / RNG_STATE_NAME).exists():
        return 1
    ranks = [p for p in folder.glob("rng_state_*.pth") if re.fullmatch(r"rng_state_\d+\.pth", p.name)]
    return len(ranks) or None


# ---------------------------------------------------------------- where to resume


@dataclass
class ResumePoint:
    """Where a resumed run continues, and what it restores when it gets there.

    Attributes:
        folder: the checkpoint.
        epoch: the epoch the run continues in.
        skip_batches: batches of that epoch already trained; the sampler starts after them.
        rng: the RNG states to set once that epoch's data iterator exists (``skip_batches > 0``:
            the saving run had already created it) or just before it is created (``== 0``).
        loop: cadence's ``loop_state.json`` (loss summed since the last log, ...), None for
            checkpoints written by transformers.
        stream_state: an iterable dataset's saved ``state_dict()``; when set, the stream continues
            from it and ``skip_batches`` is 0.
    """

    folder: Path
    epoch: int
    skip_batches: int
    rng: dict | None
    loop: dict | None
    stream_state: dict | None = None

    def start_epoch(self, dataloader: Any, begin_epoch: Callable[[], None]) -> Iterator:
        """The resumed epoch's batch iterator (its sampler already set past the trained batches), with
        ``begin_epoch()`` (the epoch's events) called in between, and the RNGs set where the saving run was.

        A save between epochs had not yet fired the epoch's events nor drawn its iterator's seeds: the RNGs
        are restored before both. A save inside the epoch came after them: restored once the iterator exists.
        A stream continues from its saved state, or, without ``state_dict()``, reads its trained batches again.
        """
        from . import data

        if self.stream_state is not None:
            data.stateful_stream(dataloader).load_state_dict(self.stream_state)
        if not self.skip_batches:
            restore_rng_state(self.rng)
        begin_epoch()
        batches = iter(dataloader)
        if self.skip_batches:
            if not has_length(dataloader):
                data.skip_stream(batches, self.skip_batches)
            restore_rng_state(self.rng)
        return batches


def _epoch_batches(num_samples: int, batch: int, world: int, drop_last: bool) -> int:
    """Batches of one process in an epoch (the sampler pads the epoch to equal shares)."""
    share = -(-num_samples // world)
    return share // batch if drop_last else -(-share // batch)


def _check_same_data(folder: Path, loop: dict, identity: dict, expected_batches: int | None) -> None:
    """Refuse a checkpoint written on other data: its saved length/fingerprint (or, for checkpoints that
    predate them, its batches per epoch: ``expected_batches`` for this data in its layout) must match."""
    saved_n, saved_fp = loop.get("num_samples"), loop.get("fingerprint")
    n, fp = identity.get("num_samples"), identity.get("fingerprint")
    if saved_n is None and loop.get("batches_per_epoch") not in (None, expected_batches):
        saved_n = f"data giving {loop['batches_per_epoch']} batches per epoch"
    other_fp = bool(saved_fp and fp and saved_fp != fp)
    if other_fp and saved_n == n and loop.get("sample") and loop.get("sample") == identity.get("sample"):
        # datasets gives a .map() whose function it cannot hash a random fingerprint: the length and rows decide
        logger.warning("checkpoint %s was written with train_dataset fingerprint %s, this run's is %s, but the "
                       "length (%s) and a sample of the rows agree: resuming (datasets gives a .map() whose function "
                       "it cannot hash a random fingerprint)", folder, saved_fp, fp, n)
        other_fp = False
    changed = (saved_n is not None and n is not None and saved_n != n) or other_fp
    if changed:
        what = f"{saved_n} samples" if isinstance(saved_n, int) else (saved_n or "the same length")
        raise ValueError(
            f"checkpoint {folder} was trained on another train_dataset ({what}, fingerprint {saved_fp}) than this "
            f"run's ({n} samples, fingerprint {fp}): its data position means nothing here; resume with the same "
            "train_dataset, or set ignore_data_skip=True to restart the checkpoint's epoch from its first batch"
        )


def resume_point(folder: Path, global_step: int, batches_per_epoch: int | None, args: Any, layout: BatchLayout,
                 saved_args: dict | None = None, saved_batch_size: int | None = None,
                 identity: dict | None = None) -> ResumePoint:
    """Read the position, RNG and loop state of ``folder`` for this process, checking they fit this run.

    Args:
        folder: the checkpoint folder.
        global_step: ``trainer_state.json``'s step.
        batches_per_epoch: micro-batches in one epoch of this run (None for an iterable dataset).
        args: this run's ``TrainingArguments``.
        layout: this run's batch layout.
        saved_args: the checkpoint's arguments (:func:`load_training_args`), when readable.
        saved_batch_size: ``trainer_state.json``'s ``train_batch_size`` (all a transformers checkpoint says).
        identity: this run's data identity (``loop_state.data_identity``).

    A checkpoint written with another per-device batch, accumulation or number of processes
    continues after the samples that run trained (logged as a warning: not bit-identical).

    Raises:
        ValueError: the checkpoint was trained on another dataset.
    """
    loop = json.loads((folder / LOOP_STATE_NAME).read_text()) if (folder / LOOP_STATE_NAME).exists() else None
    saved_args, identity = saved_args or {}, identity or {}
    # the saving run's layout: loop_state.json, else its args and files
    saved = BatchLayout(
        (loop or {}).get("train_batch_size") or saved_args.get("per_device_train_batch_size") or saved_batch_size
        or layout.train_batch_size,
        (loop or {}).get("gradient_accumulation_steps") or saved_args.get("gradient_accumulation_steps")
        or layout.gradient_accumulation_steps,
        (loop or {}).get("world_size") or checkpoint_world_size(folder) or layout.world_size)
    world = layout.world_size
    same_layout = saved == layout
    saved_epoch_batches = batches_per_epoch  # this data's batches per epoch in the saving run's layout
    if not same_layout and batches_per_epoch is not None and identity.get("num_samples") is not None:
        saved_epoch_batches = _epoch_batches(identity["num_samples"], saved.train_batch_size, saved.world_size,
                                             args.dataloader_drop_last)
    if loop is not None and not args.ignore_data_skip:
        _check_same_data(folder, loop, identity, saved_epoch_batches)
        epoch, skip = loop["epoch"], loop["batches_in_epoch"]
    elif batches_per_epoch is None:  # a stream: its trained batches cannot be skipped, only read again
        epoch, skip = 0, 0 if args.ignore_data_skip else global_step * saved.gradient_accumulation_steps
    else:  # transformers' rule: whole optimizer steps of ga batches into the epoch (of the saving run's layout)
        steps_per_epoch = saved.steps_per_epoch(saved_epoch_batches)
        epoch = global_step // steps_per_epoch
        skip = 0 if args.ignore_data_skip else (global_step % steps_per_epoch) * saved.gradient_accumulation_steps
    if not same_layout:
        skip = _rescale_position(folder, skip, saved, layout, args, epoch, saved_epoch_batches, batches_per_epoch)
    stream_state = None
    if batches_per_epoch is None and skip and (folder / STREAM_STATE_NAME).exists():
        stream_state, skip = safe_load(folder / STREAM_STATE_NAME), 0  # the stream knows its own position
    rng_file = folder / rng_state_name(args.process_index, args.world_size)
    same_world = saved.world_size == world  # another count: another process's RNG is not ours
    rng = safe_load(rng_file, allow_numpy_arrays=True) if rng_file.exists() and same_world else None
    if rng is None and not same_world:
        logger.warning("checkpoint %s was written by %d process(es), this run has %d: the RNG states "
                       "(dropout) are not restored", folder, saved.world_size, world)
    elif rng is None:
        logger.warning("checkpoint %s has no %s: the RNGs are not restored, so the resumed run is not exact", folder, rng_file.name)
    return ResumePoint(folder=folder, epoch=epoch, skip_batches=skip, rng=rng, loop=loop, stream_state=stream_state)


def _rescale_position(folder: Path, skip: int, saved: BatchLayout, layout: BatchLayout, args: Any, epoch: int,
                      saved_epoch_batches: int | None, batches_per_epoch: int | None) -> int:
    """The saving run's ``skip`` batches of the epoch as batches of this run: the samples they held
    (the sampler deals the epoch's order out to processes in turn, so ``skip x batch x processes``
    samples lead it), divided by this run's batch x processes and rounded down. Warns."""
    batch, world = layout.train_batch_size, layout.world_size
    seen = skip * saved.train_batch_size * saved.world_size  # samples of the epoch's order already trained, all processes together
    if batches_per_epoch is not None and saved_epoch_batches is not None and skip >= saved_epoch_batches:
        new_skip, again = batches_per_epoch, 0  # the saving run had trained its whole epoch
    else:
        new_skip = seen // (batch * world)
        again = seen - new_skip * batch * world
        if batches_per_epoch is not None:
            new_skip = min(new_skip, batches_per_epoch)
    logger.warning(
        "checkpoint %s was written with per-device batch %d x accumulation %d x %d process(es) and this run has "
        "%d x %d x %d: the data position is recomputed from the %d samples of epoch %d already trained (%d batches "
        "of this run%s%s). The run continues where that one stopped but is no longer bit-identical to an unbroken one; "
        "global_step goes on counting this run's optimizer steps (as in transformers), so set max_steps to choose how many "
        "more to train",
        folder, *dataclasses.astuple(saved), *dataclasses.astuple(layout), seen, epoch, new_skip,
        f"; the last {again} samples are trained again, as they do not fill a batch here" if again else "",
        "; group_by_length orders the epoch by the global batch, so its order differs too"
        if getattr(args, "train_sampling_strategy", None) == "group_by_length" else "",
    )
    return new_skip


def load_optimizer_and_scheduler(folder: Path, optimizer: Any, lr_scheduler: Any,
                                 load_optimizer: Callable[[Path], None] | None = None) -> None:
    """Load ``optimizer.pt`` and ``scheduler.pt`` (``weights_only``) into the run's objects.

    ``load_optimizer(folder)`` (the backend's, e.g. for FSDP shards in ``optimizer_0/``) replaces the plain load.
    """
    missing = [name for name in (OPTIMIZER_NAME, SCHEDULER_NAME) if not (folder / name).exists()]
    if OPTIMIZER_NAME in missing and ((folder / OPTIMIZER_SHARDS_NAME).is_dir() or (folder / "latest").exists()):
        missing.remove(OPTIMIZER_NAME)  # FSDP's sharded optimizer state, or DeepSpeed's checkpoint
    if missing:
        raise ValueError(
            f"checkpoint {folder} has no {' / '.join(missing)} (written with save_only_model=True?): it holds weights "
            "only and cannot resume training; load its weights into the model and start a new run instead"
        )
    if load_optimizer is not None:
        load_optimizer(folder)
    else:
        optimizer.load_state_dict(safe_load(folder / OPTIMIZER_NAME))
    lr_scheduler.load_state_dict(safe_load(folder / SCHEDULER_NAME))


def restore_callback_states(handler: Any, control: Any, states: dict) -> tuple[Any, list[str]]:
    """Rebuild stateful callbacks (and ``TrainerControl``) from ``state.stateful_callbacks``, in place.

    Each callback whose class name has a saved state is replaced, at the same position, by one
    built from that state (several of a class are matched in order). Returns the control to use and
    the names of saved callbacks this run does not have (the Trainer warns about those).
    """
    callbacks = list(handler.callbacks)
    unmatched = []
    for name, saved in states.items():
        saved = saved if isinstance(saved, list) else [saved]
        if type(control).__name__ == name:
            control = type(control).from_state(saved[0])
            continue
        positions = [i for i, cb in enumerate(callbacks) if type(cb).__name__ == name]
        if not positions:
            unmatched.append(name)
        for i, state in zip(positions, saved):
            callbacks[i] = type(callbacks[i]).from_state(state)
    handler.callbacks = callbacks
    return control, unmatched


# ---------------------------------------------------------------- the save/load pair

# named object -> its file, in writing order; trainer_state.json is written after them all (it marks completeness)
STATE_FILES = {"optimizer": OPTIMIZER_NAME, "scheduler": SCHEDULER_NAME, "loop_state": LOOP_STATE_NAME,
               "stream": STREAM_STATE_NAME, "scaler": SCALER_NAME}
# TrainerState fields a resumed run takes from its own arguments, not from the checkpoint
_RUN_FIELDS = ("is_local_process_zero", "is_world_process_zero", "logging_steps", "eval_steps", "save_steps",
               "train_batch_size", "max_steps", "num_train_epochs")


def find_resume_folder(resume_from_checkpoint: str | os.PathLike | bool, args: Any, barrier: Callable[[], None]) -> Path:
    """The checkpoint ``train(resume_from_checkpoint=...)`` continues from (:func:`resolve_checkpoint`), after
    the main process removed what killed saves left in ``output_dir`` (never chosen); every process calls it."""
    if args.should_save and os.path.isdir(args.output_dir):
        remove_incomplete(args.output_dir)
    barrier()  # so every process sees the same checkpoints
    return resolve_checkpoint(resume_from_checkpoint, args.output_dir)


def save(folder: str | os.PathLike, objects: dict[str, Any], backend: Any, args: Any,
         writer: BackgroundWriter | None = None) -> Path:
    """Write the checkpoint ``folder`` from named objects, atomically, then rotate the older ones away.

    Every process calls it, as a state may be a collective (FSDP gathers the weights or writes shards,
    the loop's loss sums are reduced); each process writes its RNG file, the main one
    (``args.should_save``) every other file, ``trainer_state.json`` last, and only once every process
    agrees the folder is complete are incomplete folders and checkpoints beyond ``save_total_limit``
    deleted (never the best one nor this one). With ``save_only_model`` only the weights, the arguments
    and ``trainer_state.json`` are written.

    With a ``writer`` the save is asynchronous: the states are collected here as always (collectives stay on
    the training thread), the small files that are ready (every process's RNG state, FSDP's sharded DCP
    state, weights a model's ``save_pretrained`` writes only from the live model, e.g. PEFT adapters) go into the
    staging folder now, every process's part is in it at the barrier, and the main process hands a CPU snapshot
    of the rest to the writer's thread, which writes, hashes, renames and rotates. Returns at once;
    ``writer.wait()`` waits for the folder. The caller passes none where ``backend.saves_in_background`` is False.

    Args:
        folder: ``{output_dir}/checkpoint-{global_step}``.
        objects: ``model`` (as trained: wrapped; its unwrapped module's weights are saved), ``processing_class``
            (saved with the weights), ``optimizer``, ``scheduler``, ``scaler``, ``loop_state``, ``stream``
            (each saved through its ``state_dict()`` into the file of :data:`STATE_FILES`; None: nothing),
            ``trainer_state``, and ``callbacks`` (the handler) and ``control``, whose states go into it.
        backend: the run's ``Backend`` (the model's and optimizer's states, barriers).
        args: the run's ``TrainingArguments`` (also saved, as ``training_args.bin`` and ``.json``).
        writer: the Trainer's ``BackgroundWriter`` (``async_save=True``), or None: written before returning.

    Returns:
        ``folder``.

    Example:
        >>> checkpoint.save(Path("out/checkpoint-10"), {"model": model, "optimizer": opt, ...}, backend, args)
    """
    folder = Path(folder)
    tmp = staging_folder(folder)
    full = not args.save_only_model
    if writer is not None:  # one save in flight; its snapshot buffers are free once it is written
        writer.wait(reason=f"the next checkpoint ({folder.name})")
    if args.should_save:  # every process puts its files into the staging folder first
        prepare_staging(folder)
    backend.barrier()
    if full:
        save_rng_state(folder, args.process_index, args.world_size)
    # every process, in the same order (collectives): under FSDP gathered to the main process, or written as shards
    model = objects["model"]
    states = {"model": backend.model_state_dict(model, tmp)}
    if full:
        states["optimizer"] = backend.optimizer_state_dict(model, objects["optimizer"], tmp)  # None: written as shards
        for name in STATE_FILES:
            if name != "optimizer" and objects.get(name) is not None:
                states[name] = objects[name].state_dict()
    state = objects["trainer_state"]
    stateful = [cb for cb in [*objects["callbacks"].callbacks, objects["control"]] if isinstance(cb, ExportableState)]
    state.stateful_callbacks = TrainerState(stateful_callbacks=stateful).stateful_callbacks
    unwrapped, processing_class = backend.unwrap(model), objects.get("processing_class")
    write = None
    if args.should_save:
        logger.info(f"Saving model checkpoint to {folder}")
        if writer is not None:
            if _weights_from_state_dict(unwrapped):
                if states["model"] is None:
                    states["model"] = unwrapped.state_dict()
            else:  # written from the live model, now (adapters are small); the snapshot needs no weights
                _write_weights(folder, unwrapped, processing_class, states.pop("model"))
            states = writer.snapshot(states)
        write = functools.partial(_write_files, unwrapped, processing_class, states, args.to_dict(),
                                  state.to_json_string())
    backend.barrier()  # every process's part is in the staging folder
    if writer is None:
        _complete(folder, write, args, state.best_model_checkpoint, backend.barrier)
    elif write is not None:
        writer.submit(folder, functools.partial(_complete, folder, write, args, state.best_model_checkpoint, None))
    return folder


def _weights_from_state_dict(model: torch.nn.Module) -> bool:
    """Whether ``model``'s weights file can be written from a snapshot of its state dict, later: its
    ``save_pretrained`` takes ``state_dict`` (transformers' models) or it has none (plain safetensors). A PEFT model
    saves its adapters from itself."""
    from . import peft_support

    if peft_support.has_adapters(model):
        return False
    save_pretrained = getattr(model, "save_pretrained", None)
    return save_pretrained is None or _takes_keyword(save_pretrained, "state_dict")


def _write_weights(folder: Path, model: torch.nn.Module, processing_class: Any, state_dict: dict | None) -> None:
    """The weights into the staging folder of ``folder`` now, on the training thread."""
    tmp = staging_folder(folder)
    try:
        save_model_weights(model, tmp, processing_class, state_dict)
    except (OSError, RuntimeError) as e:
        error = _write_error(folder, tmp, e)
        shutil.rmtree(tmp, ignore_errors=True)
        raise error from e


def _write_files(model: torch.nn.Module, processing_class: Any, states: dict, arguments: dict, state_text: str,
                 tmp: Path) -> None:
    """Every file of the main process into ``tmp`` from the collected ``states`` (live, or a snapshot of them),
    ``trainer_state.json`` (``state_text``) last: it marks completeness."""
    if "model" in states:  # else the weights are in the folder already
        save_model_weights(model, tmp, processing_class, states["model"])
    for name, file in STATE_FILES.items():
        if states.get(name) is not None:
            (save_json if file.endswith(".json") else torch.save)(states[name], tmp / file)
    torch.save(arguments, tmp / TRAINING_ARGS_NAME)
    save_json(arguments, tmp / TRAINING_ARGS_JSON)
    (tmp / TRAINER_STATE_NAME).write_text(state_text, encoding="utf-8")  # last: marks completeness


def _complete(folder: Path, write: Callable[[Path], None] | None, args: Any, best: str | None,
              barrier: Callable[[], None] | None) -> None:
    """The rest of a save, inline (``barrier``: every process) or in the writer's thread (``barrier`` None: only the
    main process, after every process's part is in the staging folder): ``write`` the main process's files (None on
    the others), the manifest, fsync and rename (:func:`write_atomically`); then every process agrees the folder is
    complete, and only then are killed saves' leftovers and checkpoints beyond ``save_total_limit`` deleted."""
    if write is not None:
        write_atomically(folder, write, fresh=False)
    if barrier is not None:
        barrier()
    if write is not None:
        remove_incomplete(args.output_dir)
        rotate_checkpoints(args.output_dir, args.save_total_limit, best, folder,
                           output_guard.earlier_checkpoints(args.output_dir, just_written=folder))


def load(folder: str | os.PathLike, objects: dict[str, Any], backend: Any, args: Any) -> ResumePoint:
    """Restore the named objects from the checkpoint ``folder``; returns where the data continues.

    The weights are not among them: they are loaded before the optimizer is built (``Backend.load_model_weights``).
    Order: the arguments first (an unsafe file stops everything before anything else is read), then
    optimizer and scheduler, scaler, ``TrainerState`` (this run's step counts and intervals kept), the loop
    state and the data position; the Trainer then restores the callbacks' states (``_load_callback_state``). A
    transformers checkpoint has no ``loop_state.json``: the loss since its last log is unknown, so, as
    transformers does, the first log averages the steps since the resume.

    Args:
        folder: the checkpoint (from :func:`find_resume_folder`).
        objects: ``model`` (as trained: the optimizer's shards need it), ``optimizer``, ``scheduler``,
            ``scaler`` (None: not loaded), ``trainer_state`` (this run's: its step counts stay), ``loop_state``
            (this run's ``LoopState``: its layout and data identity are checked against the checkpoint's).
            Each is restored in place.
        backend: the run's ``Backend`` (the optimizer's state through the engine).
        args: the run's ``TrainingArguments``.

    Returns:
        The :class:`ResumePoint`: its ``start_epoch`` continues the data where it stopped.

    Raises:
        ValueError: the checkpoint holds weights only, or was trained on another dataset.
    """
    folder = Path(folder)
    saved_args = load_training_args(folder) or {}
    load_optimizer_and_scheduler(folder, objects["optimizer"], objects["scheduler"], functools.partial(
        backend.load_optimizer_state, objects["model"], objects["optimizer"]))
    if (folder / SCALER_NAME).exists():
        scaler_state = safe_load(folder / SCALER_NAME)
        if objects.get("scaler") is not None:  # a resumed fp16 run continues with the same loss scale
            objects["scaler"].load_state_dict(scaler_state)
    state = objects["trainer_state"]
    saved = read_trainer_state(folder)
    if saved.best_model_checkpoint is not None and not os.path.isdir(saved.best_model_checkpoint):
        logger.warning("the best checkpoint %s recorded in %s no longer exists: forgotten", saved.best_model_checkpoint, folder)
        saved.best_model_checkpoint = None
    saved_batch_size = saved.train_batch_size
    for name in _RUN_FIELDS:
        setattr(saved, name, getattr(state, name))
    for field in dataclasses.fields(state):
        setattr(state, field.name, getattr(saved, field.name))
    loop = objects["loop_state"]
    resume = resume_point(folder, state.global_step, loop.batches_per_epoch, args, loop.layout, saved_args,
                          saved_batch_size, loop.identity)
    if resume.loop is not None:
        loop.load_state_dict(resume.loop)
    else:  # a transformers checkpoint: the loss since its last log is unknown; average this run's steps (HF's rule)
        loop.last_logged_step = loop.first_step = state.global_step
    if args.auto_find_batch_size and saved_batch_size and saved_batch_size < loop.layout.train_batch_size:
        # the saving run had shrunk its micro-batches after running out of memory: go on with them (transformers
        # restores its shrunk batch the same way), so the resume is exact and does not run out of memory again
        loop.micro_batch_rows = state.train_batch_size = saved_batch_size
    if state.global_step >= state.max_steps:  # nothing left to train; close the epoch if the saving run had not yet
        if resume.skip_batches and loop.batches_per_epoch:
            resume.skip_batches = loop.batches_per_epoch
        else:
            resume.epoch = state.num_train_epochs
    logger.info("resuming at step %d: epoch %d, %d batches into it (skipped in the sampler)",
                state.global_step, resume.epoch, resume.skip_batches)
    return resume


def save_model(folder: str | os.PathLike, model: torch.nn.Module, processing_class: Any, state_dict: dict | None,
               args: Any) -> None:
    """``Trainer.save_model``'s files: the weights (:func:`save_model_weights`) and ``training_args.bin``."""
    save_model_weights(model, folder, processing_class, state_dict)
    torch.save(args.to_dict(), Path(folder) / TRAINING_ARGS_NAME)


# ---------------------------------------------------------------- SIGTERM / SIGUSR1


class JITCheckpointCallback(TrainerCallback):
    """On SIGTERM or SIGUSR1 (SLURM's warning), save a checkpoint at the next step end and stop.

    Installed by the Trainer when ``enable_jit_checkpoint=True`` (transformers' name; off by
    default, as there), which calls ``set_trainer(trainer)`` as transformers does: ``.trainer`` and
    ``.jit_manager`` (a :class:`CheckpointManager`, its SIGTERM handler installed) are then set. The
    signal only sets a flag; the save happens at a step boundary through the normal save path, so the
    checkpoint is complete and the resume exact (transformers also saves mid-step, at ``on_step_begin``
    or ``on_pre_optimizer_step``, without the loop's state). A request made through ``jit_manager``
    (``is_checkpoint_requested``) is served the same way. The previous handlers come back when training
    ends. With several processes the flags are combined at every step end (one tiny all-reduce, only when
    this option is on), so all processes save and stop at the same step even when the signal reaches
    them at different moments.
    """

    SIGNALS = ("SIGTERM", "SIGUSR1")

    def __init__(self):
        self.trainer = None  # transformers' attributes, set by set_trainer
        self.jit_manager: CheckpointManager | None = None
        self.requested = None  # the signal's name once one arrived
        self._previous: dict = {}

    def set_trainer(self, trainer: Any) -> None:
        """Keep ``trainer`` and, with ``enable_jit_checkpoint``, make ``jit_manager`` and install its handler."""
        self.trainer = trainer
        if trainer.args.enable_jit_checkpoint:
            self.jit_manager = CheckpointManager(trainer)
            try:
                self.jit_manager.setup_signal_handler()
            except ValueError:  # not the main thread: on_train_begin says so once more if training starts here
                logger.warning("enable_jit_checkpoint: cannot install a SIGTERM handler outside the main thread")

    def _handle(self, signum, frame) -> None:
        self.requested = signal.Signals(signum).name

    def on_train_begin(self, args, state, control, **kwargs):
        self.requested = None
        for name in self.SIGNALS:
            if hasattr(signal, name):
                try:
                    self._previous[name] = signal.signal(getattr(signal, name), self._handle)
                except ValueError:  # not the main thread: signals cannot be caught here
                    logger.warning("enable_jit_checkpoint: cannot install a %s handler outside the main thread", name)

    def _agreed(self, args) -> bool:
        if self.jit_manager is not None and self.jit_manager.is_checkpoint_requested and not self.requested:
            self.jit_manager.is_checkpoint_requested = False  # served here, once
            self.requested = "a request through CheckpointManager"
        agreed = backend.any_process(bool(self.requested), args.device)
        if agreed and not self.requested:
            self.requested = "a signal to another process"
        return agreed

    def on_step_end(self, args, state, control, **kwargs):
        if self._agreed(args):
            logger.warning("%s received: saving checkpoint-%d and stopping training", self.requested, state.global_step)
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        for name, previous in self._previous.items():
            signal.signal(getattr(signal, name), previous)
        self._previous.clear()
        manager = self.jit_manager
        if manager is not None and manager._original_sigterm_handler is not None:  # the one before set_trainer
            signal.signal(signal.SIGTERM, manager._original_sigterm_handler)


class CheckpointManager:
    """transformers' object for just-in-time checkpoints, for scripts that drive one themselves: SIGTERM
    requests a checkpoint ``kill_wait`` seconds later (a SIGKILL that follows at once leaves nothing half
    written), and ``execute_jit_checkpoint()`` writes it through the Trainer's atomic save.

    The Trainer itself uses ``JITCheckpointCallback`` (``enable_jit_checkpoint=True``), which saves at the
    next step end with the loop's state, so that resume is exact; a checkpoint written here from outside
    the loop resumes like a transformers one (the logged-loss sums since the last log are not in it).

    Args:
        trainer: the ``Trainer`` whose checkpoint is written.
        kill_wait: seconds between SIGTERM and the request.
    """

    def __init__(self, trainer: Any, kill_wait: int = 3):
        self.trainer, self.kill_wait = trainer, kill_wait
        self.is_checkpoint_requested = False
        self._original_sigterm_handler = None

    def setup_signal_handler(self) -> None:
        self._original_sigterm_handler = signal.signal(signal.SIGTERM, self._sigterm_handler)

    def _sigterm_handler(self, signum, frame) -> None:
        import threading

        if not self.is_checkpoint_requested:
            threading.Timer(self.kill_wait, self._enable_checkpoint).start()

    def _enable_checkpoint(self) -> None:
        self.is_checkpoint_requested = True

    # the spellings of earlier transformers 5 releases, for code written against them
    _toggle_checkpoint_flag = _enable_checkpoint

    @property
    def checkpoint_requested(self) -> bool:
        return self.is_checkpoint_requested

    @checkpoint_requested.setter
    def checkpoint_requested(self, value: bool) -> None:
        self.is_checkpoint_requested = value

    def should_checkpoint_now(self) -> bool:
        return self.is_checkpoint_requested

    def execute_jit_checkpoint(self) -> Path:
        """Write ``checkpoint-{global_step}`` now (an asynchronous save is waited for) and fire ``on_save``; returns
        its folder.

        transformers fires no ``on_save`` here; cadence does, as after every checkpoint: the trackers write
        the logs they keep in batches, so the checkpoint's logs are on disk with it even if the process
        is killed next."""
        self.is_checkpoint_requested = False
        trainer = self.trainer
        logger.warning("saving a just-in-time checkpoint at step %d", trainer.state.global_step)
        folder = trainer._save_checkpoint(trainer.model, trial=None)  # transformers' call, which code may patch
        if not trainer._collect_save(wait=True, reason="a just-in-time checkpoint returns"):  # written in the background:
            trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)  # fired there
        return folder
