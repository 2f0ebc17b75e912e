"""FSDP's sharded state (torch.distributed.checkpoint), read so that no file in it can run code."""

from __future__ import annotations

import functools
import io
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from .formats import CorruptCheckpointError, UnsafeCheckpointError, _corrupt, checked_path, confined, unsafe_globals

logger = logging.getLogger(__name__)

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


def _dcp_checked(path: Path) -> Path:
    """``path`` of a DCP folder once it may be opened (``formats.checked_path``, judged from its checkpoint folder)."""
    checkpoint = path.parent.parent
    return checked_path(checkpoint, path, confine=confined(checkpoint))


def read_dcp_metadata(folder: str | os.PathLike) -> Any:
    """The ``Metadata`` of the DCP folder ``folder``, unpickled with only DCP's records allowed, and checked:
    every storage entry points at a ``.distcp`` file inside ``folder``, within its size.

    Raises:
        UnsafeCheckpointError: ``.metadata`` names anything else (nothing was run).
        CorruptCheckpointError: it is unreadable or describes data that is not there.
    """
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata

    folder = Path(folder)
    path = _dcp_checked(folder / DCP_METADATA_NAME)
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
            if not os.path.lexists(folder / name):
                raise _corrupt(folder.parent, f"{folder.name}/{name}", "is missing")
            _dcp_checked(folder / name)
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


