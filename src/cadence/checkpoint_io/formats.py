"""Checkpoint files: their names, writing and reading the weights, and reading every other file safely.

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

Reading never runs code: weights come through safetensors, every other file through JSON or
``torch.load(weights_only=True)`` (for ``rng_state.pth`` with numpy's array type allowed, as
transformers writes numpy's RNG state as an array; cadence writes it as plain lists). A file that
``weights_only`` refuses raises :class:`UnsafeCheckpointError` and nothing in it is executed.

The bottom layer of the package: it imports nothing of cadence's but ``peft_support``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .. import peft_support

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
MODEL_SHARDS_NAME = "pytorch_model_fsdp_0"  # FSDP's sharded state (DCP folders, see sharded.py), accelerate's names
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
        if getattr(model, "generation_config", None) is not None and hasattr(model.generation_config, "save_pretrained"):
            model.generation_config.save_pretrained(folder)  # as save_pretrained(state_dict={}) writes it
    elif state_dict is not None and getattr(getattr(model, "config", None), "distributed_config", None) is not None:
        # a model transformers distributed at load (tp_plan, DistributedConfig): its save_pretrained gathers the
        # shards and waits on a barrier itself, collectives the one writing process (maybe a background thread)
        # cannot run; the weights given are already gathered, so write them and the configs directly
        save_safetensors_sharded(state_dict, folder)
        model.config.save_pretrained(folder)
        if getattr(model, "generation_config", None) is not None and hasattr(model.generation_config, "save_pretrained"):
            model.generation_config.save_pretrained(folder)
    elif hasattr(model, "save_pretrained"):
        extra = {} if state_dict is None else {"state_dict": state_dict}
        if _takes_keyword(model.save_pretrained, "max_shard_size"):  # transformers' models; a user's may not
            extra["max_shard_size"] = MAX_SHARD_SIZE
        model.save_pretrained(folder, safe_serialization=True, **extra)
    else:
        save_safetensors_sharded(model.state_dict() if state_dict is None else state_dict, folder)
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        processing_class.save_pretrained(folder)


@contextlib.contextmanager
def writing(what: str):
    """Label an error raised inside with what was being written (``"writing optimizer.pt"``), for the checkpoint
    writer's message (``writer._write_error``); the innermost label wins (a shard's name over "the weights")."""
    try:
        yield
    except Exception as e:
        if getattr(e, "checkpoint_step", None) is None:
            try:
                e.checkpoint_step = what
            except AttributeError:  # an exception type without attributes of its own: named by the newest file
                pass
        raise


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
        with writing(f"writing {name}"):  # safetensors' error names a temporary file, not this one
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
class CorruptCheckpointError(ValueError):
    """A checkpoint file is missing, truncated, changed on disk, or unreadable."""


def _corrupt(folder: Path, name: str, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"checkpoint {folder} is damaged: {name} {why}")

def save_json(obj: Any, path: Path) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")

# ---------------------------------------------------------------- reading, safely


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file holds more than tensors and plain data; it was not unpickled."""


# The rule for every file read from a checkpoint or a model folder, written once here and used by every reader
# (verify_checkpoint, the DeepSpeed and DCP checks, safe_load, the weights, the JSON state files):
# - only a regular file is opened: a FIFO blocks the open forever, /dev/zero never ends, a socket or device is no file;
# - in a checkpoint folder (``checkpoint-N``, ``tmp-checkpoint-N``, and DeepSpeed's tag folders in any folder) a file
#   or sub-folder reached through a symlink must resolve inside the folder's resolved path: a link planted there cannot
#   make cadence read (or hash, or print the size of) a file elsewhere. The folder itself may be a symlink (an
#   output_dir on a mount) since the comparison is against its resolved path. Any other folder (a model folder given
#   by the user, as the Hugging Face cache lays it out: files linked into ../../blobs) is followed, as transformers does.
CHECKPOINT_FOLDER_RE = re.compile(r"(tmp-)?checkpoint-\d+")


def confined(folder: str | os.PathLike) -> bool:
    """Whether the files of ``folder`` must stay inside it: it is a ``checkpoint-N`` folder (see above)."""
    return bool(CHECKPOINT_FOLDER_RE.fullmatch(Path(folder).name))


def _file_kind(mode: int) -> str:
    import stat

    for test, kind in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return kind
    return "not a regular file"


def checked_path(folder: str | os.PathLike, path: str | os.PathLike, confine: bool | None = None,
                 directory: bool = False) -> Path:
    """``path`` (inside ``folder``) once it may be opened: a regular file (``directory``: a folder) and, when
    ``confine`` (default: :func:`confined` of ``folder``), resolving inside ``folder``'s resolved path.

    Raises:
        FileNotFoundError: ``path`` (or a link's target) does not exist.
        CorruptCheckpointError: ``path`` is a FIFO, device, socket (never opened: that could hang or never end).
        UnsafeCheckpointError: ``path`` leads outside ``folder`` through a symlink (the link is named; nothing of
            its target is read, not even its size).
    """
    import stat

    folder, path = Path(folder), Path(path)
    try:
        name = path.relative_to(folder).as_posix()
    except ValueError:
        name = path.name
    if confine if confine is not None else confined(folder):
        root = os.path.realpath(folder)
        real = os.path.realpath(path)
        if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
            raise UnsafeCheckpointError(
                f"refusing to read checkpoint {folder}: {name} leads outside the checkpoint folder through a symbolic "
                "link, and a checkpoint is read only through files inside its folder; nothing of it was read. Replace "
                "the link with the file itself, or resume from another checkpoint")
    try:
        mode = os.stat(path).st_mode  # follows links
    except FileNotFoundError:
        if not os.path.lexists(path):
            raise
        raise _corrupt(folder, name, "is a symbolic link to nothing") from None
    if directory and not stat.S_ISDIR(mode) or not directory and not stat.S_ISREG(mode):
        raise _corrupt(folder, name, f"is {_file_kind(mode)}, not a {'folder' if directory else 'regular file'}: "
                                     "it was not opened (reading it could hang or never end)")
    return path


def checked_files(folder: str | os.PathLike, under: str | os.PathLike | None = None,
                  confine: bool | None = None) -> list[Path]:
    """Every file under ``under`` (default ``folder``), each through :func:`checked_path`, sorted. Sub-folders
    reached through symlinks are walked too (each real folder once), so nothing DeepSpeed or torch could open
    there escapes the check; one leading outside a confined ``folder`` is refused."""
    folder = Path(folder)
    start = checked_path(folder, Path(under) if under is not None else folder, confine, directory=True)
    found, seen = [], set()
    for top, dirs, files in os.walk(start, followlinks=True):
        real = os.path.realpath(top)
        checked_path(folder, top, confine, directory=True)
        if real in seen:  # a link loop, or two links to one folder: walked once
            dirs[:] = []
            continue
        seen.add(real)
        for name in files:
            found.append(checked_path(folder, Path(top) / name, confine))
    return sorted(found)


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
    checked_path(Path(path).parent, path, confine=False)  # a regular file: a FIFO or /dev/zero would hang the load
    if _is_torchscript(path):  # torch.load hands such an archive to torch.jit.load, even with weights_only
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it is a TorchScript archive (a saved program), not a torch.save file of tensors "
            "and plain data, and nothing in it was loaded; replace the file with one written by cadence or "
            "transformers, or resume from another checkpoint")
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


def _is_torchscript(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a TorchScript archive (``torch.jit.save``: a zip holding ``constants.pkl``/``code/``)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return any(n.endswith("/constants.pkl") or "/code/" in n for n in archive.namelist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def unsafe_globals(path: str | os.PathLike) -> list[str]:
    """The classes and functions a pickle names that ``weights_only`` does not allow (read, not run)."""
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # not a torch zip file at all: nothing more to say
        return []


_HF_ARGS_PACKAGES = ("transformers", "accelerate")  # what transformers' pickled TrainingArguments names


def load_training_args(folder: str | os.PathLike) -> dict | None:
    """The arguments a checkpoint was written with, as a dict, or None when it has none readable.

    cadence stores a plain dict in ``training_args.bin`` (and ``training_args.json``); transformers pickles its
    ``TrainingArguments`` object there, and libraries their subclass of it (TRL's configs,
    ``SentenceTransformerTrainingArguments``). Such a file is never unpickled (that could run code) and never
    blocks a resume, which does not need it: it is skipped, with one log line naming what it pickles. A damaged
    file (truncated, empty, a TorchScript archive, not a regular file) is skipped too, with one warning naming it
    and why; then ``training_args.json`` is read, if it is there and sound.
    """
    folder = Path(folder)
    path = folder / TRAINING_ARGS_NAME
    if os.path.lexists(path):
        try:
            loaded = safe_load(path)
            if isinstance(loaded, dict):
                return dict(loaded)
            logger.warning("%s holds a %s, not the arguments' fields: skipped, as a resume does not need it", path,
                           type(loaded).__name__)
        except UnsafeCheckpointError as e:
            names = unsafe_globals(path)
            # the package is the name's first dotted part: "transformers_evil.Args" is not transformers'
            if names and all(n.split(".")[0] in _HF_ARGS_PACKAGES for n in names):
                logger.info("%s holds transformers' TrainingArguments object: not unpickled (not needed to resume)", path)
            elif not names:  # a TorchScript archive, a link out of the checkpoint: the error says what
                logger.warning("%s; skipped, as a resume does not need it", e)
            else:  # a library's arguments class, or anything else: read by name only, never run
                logger.warning("%s pickles %s, not only transformers' TrainingArguments: not unpickled (unpickling "
                               "could run code) and skipped, as a resume does not need it", path,
                               ", ".join(names) or "objects")
        except Exception as e:  # noqa: BLE001 - truncated, empty, a TorchScript archive, a FIFO: never blocks a resume
            logger.warning("%s cannot be read (%s: %s): skipped, as a resume does not need it", path,
                           type(e).__name__, (str(e).strip().splitlines() or [""])[0][:200])
    json_path = folder / TRAINING_ARGS_JSON
    if not os.path.lexists(json_path):
        return None
    try:
        loaded = json.loads(checked_path(folder, json_path).read_text(encoding="utf-8"))
    except Exception as e:  # noqa: BLE001 - as training_args.bin: the arguments never block a resume
        logger.warning("%s cannot be read (%s: %s): skipped, as a resume does not need it", json_path,
                       type(e).__name__, (str(e).strip().splitlines() or [""])[0][:200])
        return None
    if not isinstance(loaded, dict):
        logger.warning("%s holds a %s, not the arguments' fields: skipped, as a resume does not need it", json_path,
                       type(loaded).__name__)
        return None
    return loaded


def load_model_weights(model: torch.nn.Module, folder: str | os.PathLike) -> None:
    """Load ``model.safetensors`` (or its sharded index) of ``folder`` into ``model``.

    Tied weights stored once (as ``save_pretrained`` and safetensors do) are accepted; any other
    missing or unexpected key is an error naming the keys. A model with PEFT adapters loads its
    adapters (what its ``save_pretrained`` wrote), not the frozen base.
    """
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
        checked_path(folder, path)  # a shard an index names may be a FIFO or a link out of a checkpoint-N folder
        if path.suffix == ".safetensors":
            state.update(load_file(str(path), device=str(device)))
        else:  # a pickle: loaded with weights_only, so it cannot run code
            loaded = safe_load(path)
            if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
                raise _corrupt(folder, path.name, "does not hold a state dict of tensors")
            state.update({k: v.to(device) for k, v in loaded.items()})
    return state


_NUMBER, _INT, _NONE = (int, float), (int,), (type(None),)
