"""``report_to="tensorboard"``: event files under ``logging_dir`` (default ``output_dir/runs/<time>_<host>``).

Scalars carry transformers' names (``train/loss``, ``train/learning_rate``, ``train/grad_norm``,
``eval/loss``, ...) at the global step; the arguments (and the model's config) are text. A resumed
run writes into the same folder with a purge step: TensorBoard drops the steps the interrupted run
logged after its checkpoint, so every step appears once.

The events are written here, in the training thread, one record per log (``_EventFile``). torch's
``SummaryWriter`` writes one record per scalar from a background thread that checksums each record
with tensorboard's pure-Python CRC-32C; that thread holds the GIL about 0.2 ms per record and stalls
a fast training loop. With ``google-crc32c`` installed (the ``tensorboard`` extra) the checksum is C.

The logs come in batches (``TrackerCallback.flush_secs``): encoded and flushed together, each event with
the wall time of its log. A log's numbers are one ``Event`` whose bytes ``scalars_event`` builds itself:
1.9 us a log, where building and serializing protobuf's objects takes 3.2 (the tests compare the bytes
with protobuf's own); the other events (text, file header, purge mark) go through protobuf.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import socket
import struct
import time
from datetime import datetime
from typing import Any

from .base import FLUSH_SECS, TrackerCallback, metric_name


def default_logdir() -> str:
    """``runs/<Mon><DD>_<HH-MM-SS>_<host>``: PyTorch's and transformers' default, relative to ``output_dir``."""
    return os.path.join("runs", datetime.now().strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname())


def masked_crc32c():
    """TensorBoard's record checksum: CRC-32C, rotated and offset ("masked"); C when google-crc32c is installed."""
    try:
        import google_crc32c
    except ImportError:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as slow

        return slow
    crc = google_crc32c.value

    def masked(data: bytes) -> int:
        value = crc(data)
        return (((value >> 15) | (value << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    return masked


_F32, _F64 = struct.Struct("<f"), struct.Struct("<d")


def _varint(n: int) -> bytes:
    """protobuf's varint: 7 bits a byte, low bits first; a negative int64 as its 64-bit two's complement."""
    n &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@functools.lru_cache(maxsize=4096)  # a run logs the same few keys over and over
def _value_head(key: str) -> bytes:
    """One ``Summary.value`` entry for ``key`` up to its number: the entry's field (1) and length, the
    ``Value``'s ``tag`` (field 1: ``metric_name(key)``) and the key of its ``simple_value`` (field 2, 32 bits)."""
    tag = metric_name(key).encode()
    value = b"\x0a" + _varint(len(tag)) + tag + b"\x15"
    return b"\x0a" + _varint(len(value) + 4) + value


def _float32(value: float) -> bytes:
    try:
        return _F32.pack(value)
    except OverflowError:  # beyond float32: infinity of the same sign, as protobuf converts it
        return _F32.pack(math.copysign(math.inf, value))


def scalars_event(wall_time: float, step: int, logs: dict[str, Any]) -> bytes:
    """The numbers of ``logs`` as one serialized ``Event(wall_time, step, summary=Summary(value=[Value(tag,
    simple_value), ...]))``: the bytes protobuf writes (fields in number order, step 0 left out), built directly."""
    summary = b"".join([_value_head(k) + _float32(v) for k, v in logs.items() if isinstance(v, (int, float))])
    step_field = b"\x10" + _varint(step) if step else b""
    return b"\x09" + _F64.pack(wall_time) + step_field + b"\x2a" + _varint(len(summary)) + summary


class _EventFile:
    """One TensorBoard event file: ``Event`` protos as TFRecords (length, its checksum, data, its checksum)."""

    _numbers = itertools.count()  # two files opened in the same second get different names

    def __init__(self, folder: str, purge_step: int | None):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self._event = Event
        self._crc = masked_crc32c()
        os.makedirs(folder, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.{next(self._numbers)}"
        self._file = open(os.path.join(folder, name), "ab")  # noqa: SIM115 - open for the run, closed in close()
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:  # readers drop the events at and after this step that came before this mark
            self._write(Event(wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def add_event(self, event: Any, step: int | None = None, walltime: float | None = None) -> None:
        """Write ``event`` at ``step`` and ``walltime`` (default: now), as torch's ``FileWriter`` does."""
        event.wall_time = time.time() if walltime is None else walltime
        if step is not None:
            event.step = int(step)
        self._write(event)

    def add_summary(self, summary: Any, global_step: int | None = None, walltime: float | None = None) -> None:
        self.add_event(self._event(summary=summary), global_step, walltime)

    def _write(self, event: Any) -> None:
        self.write_record(event.SerializeToString())

    def write_record(self, data: bytes) -> None:
        """Append one serialized ``Event``."""
        header = struct.pack("<Q", len(data))
        self._file.write(header + struct.pack("<I", self._crc(header)) + data + struct.pack("<I", self._crc(data)))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardCallback(TrackerCallback):
    """Send the logs to TensorBoard.

    Args:
        tb_writer: a ``SummaryWriter`` (torch's or tensorboardX's) to write through instead of cadence's own file.

    Environment:
        TENSORBOARD_LOGGING_DIR: the folder, when ``logging_dir`` is not set.
    """

    flush_secs = FLUSH_SECS

    def __init__(self, tb_writer: Any = None):
        super().__init__()
        from tensorboard.compat.proto.event_pb2 import Event  # needs the tensorboard package

        self._event = Event
        self.tb_writer = tb_writer
        self._events = None  # where the events go: cadence's _EventFile or the user's writer

    def start(self, args, state, model, resumed):
        if self.tb_writer is not None:  # the user's writer
            self.run_id, self._events = self.tb_writer.log_dir, self.tb_writer._get_file_writer()
        else:
            if not resumed:
                folder = args.logging_dir or os.getenv("TENSORBOARD_LOGGING_DIR")
                folder = os.path.expanduser(folder) if folder else os.path.join(args.output_dir, default_logdir())
                if state.trial_name is not None:  # each search trial in its own folder
                    folder = os.path.join(folder, state.trial_name)
                self.run_id = folder
            # on a resume, events past the checkpoint's step came from the interrupted run: purged
            self._events = _EventFile(self.run_id, state.global_step + 1 if state.global_step > 0 else None)
        if not resumed:
            self._text("args", args.to_json_string(), 0)
            config = getattr(model, "config", None)
            if config is not None and hasattr(config, "to_json_string"):
                self._text("model_config", config.to_json_string(), 0)

    def _text(self, tag: str, text: str, step: int, wall_time: float | None = None) -> None:
        from torch.utils.tensorboard.summary import text as text_summary

        self._events.add_summary(text_summary(tag, text), step, wall_time)

    def write_rows(self, rows):
        for logs, step, wall_time in rows:
            event = scalars_event(wall_time, step, logs)  # every number of the log: one record, not one per metric
            if isinstance(self._events, _EventFile):
                self._events.write_record(event)
            else:  # a user's writer takes protobuf objects
                self._events.add_event(self._event.FromString(event), step, wall_time)
            for key, value in logs.items():
                if isinstance(value, str):
                    self._text(metric_name(key), value, step, wall_time)
        self._events.flush()

    def finish(self, failed):
        if self._events is not None:
            self._events.close()
            self._events = None
        self.tb_writer = None  # as transformers: the writer is closed with the run
