"""``report_to="tensorboard"``: event files under ``logging_dir`` (default ``output_dir/runs/<time>_<host>``).

Scalars carry transformers' names (``train/loss``, ``train/learning_rate``, ``train/grad_norm``,
``eval/loss``, ...) at the global step; the arguments (and the model's config) are text. A resumed
run writes into the same folder with a purge step: TensorBoard drops the steps the interrupted run
logged after its checkpoint, so every step appears once.

The events are written here, in the training thread, one record per log (``_EventFile``). torch's
``SummaryWriter`` writes one record per scalar from a background thread that checksums each record
with tensorboard's pure-Python CRC-32C; that thread holds the GIL about 0.2 ms per record and stalls
a fast training loop. With ``google-crc32c`` installed (the ``tensorboard`` extra) the checksum is C.

The logs come in batches (``TrackerCallback.flush_secs``): encoded together and written in one write,
each event with the wall time of its log. A log's numbers are one ``Event`` whose bytes ``scalars_event``
builds itself, with one ``struct.pack`` for a log of numbers: 1.3 us for a training log, where building
and serializing protobuf's objects takes 5.0 (timeit, same machine; the tests compare the bytes with
protobuf's own). The other events (texts, file header, purge mark) go through protobuf.

What TensorBoard takes: numbers as scalars (numpy scalars and one-element tensors too; beyond float32,
infinity of the sign), texts as text. Another value (None, a list, an object), or a key that is not a
string, is left out with one warning per key.
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

from .base import FLUSH_SECS, TrackerCallback, metric_name, number, unwritable


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


_F32, _F64, _U32, _U64 = struct.Struct("<f"), struct.Struct("<d"), struct.Struct("<I"), struct.Struct("<Q")


def _varint(n: int) -> bytes:
    """protobuf's varint: 7 bits a byte, low bits first; a negative int64 as its 64-bit two's complement."""
    if 0 <= n < 0x4000:  # one or two bytes: most lengths and steps
        return bytes((n,)) if n < 0x80 else bytes((n & 0x7F | 0x80, n >> 7))
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


def _scalar(key: str, value: Any) -> bytes:
    """``key``'s ``Summary.value`` entry for the number ``value`` (struct.error when it is not one)."""
    try:
        return _value_head(key) + _F32.pack(value)
    except OverflowError:  # beyond float32: infinity of the same sign, as protobuf converts it
        return _value_head(key) + _F32.pack(math.copysign(math.inf, value))
    except struct.error:
        if isinstance(value, int):  # an int beyond float64 too: infinity of its sign
            return _value_head(key) + _F32.pack(math.inf if value > 0 else -math.inf)
        raise


@functools.lru_cache(maxsize=256)  # a run logs the same few sets of keys over and over
def _summary_layout(keys: tuple[str, ...]) -> tuple[Any, list]:
    """The ``Summary`` of a log with these keys, all numbers: a ``struct`` packer and its arguments, each
    ``Value``'s head (``_value_head``) then a place for its number."""
    heads = [_value_head(key) for key in keys]
    return struct.Struct("<" + "".join(f"{len(head)}sf" for head in heads)).pack, [x for h in heads for x in (h, 0.0)]


def scalars_event(wall_time: float, step: int, logs: dict[str, Any]) -> bytes:
    """``logs`` as one serialized ``Event(wall_time, step, summary=Summary(value=[Value(tag, simple_value),
    ...]))``: the bytes protobuf writes (fields in number order, step 0 left out), built directly.

    Every value must be a number (what converts to a float: ints, bools, numpy scalars) and every key a
    string: else an exception (struct.error, AttributeError), and the caller sorts the log out."""
    pack, args = _summary_layout(tuple(logs))
    args = args.copy()
    args[1::2] = logs.values()
    try:  # the usual log, all numbers within float32: one struct.pack
        summary = pack(*args)
    except (struct.error, OverflowError):  # an overflow (or not a number: raised again below): value by value
        summary = b"".join([_scalar(k, v) for k, v in logs.items()])
    step_field = b"\x10" + _varint(step) if step else b""
    return b"\x09" + _F64.pack(wall_time) + step_field + b"\x2a" + _varint(len(summary)) + summary


class _EventFile:
    """One TensorBoard event file: serialized ``Event``s as TFRecords (length, its checksum, data, its checksum)."""

    _numbers = itertools.count()  # two files opened in the same second get different names

    def __init__(self, folder: str, purge_step: int | None):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self._crc = masked_crc32c()
        self._lengths: dict[int, bytes] = {}  # a record's length -> its framed length (a run's events have a few)
        os.makedirs(folder, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.{next(self._numbers)}"
        self._file = open(os.path.join(folder, name), "ab")  # noqa: SIM115 - open for the run, closed in close()
        events = [Event(wall_time=time.time(), file_version="brain.Event:2")]
        if purge_step is not None:  # readers drop the events at and after this step that came before this mark
            events.append(Event(wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START)))
        self.write([event.SerializeToString() for event in events])

    def write(self, events: list[bytes]) -> None:
        """Append serialized ``Event``s, in one write."""
        parts = []
        for data in events:
            length = self._lengths.get(len(data))
            if length is None:  # the length field, then its checksum
                field = _U64.pack(len(data))
                length = self._lengths[len(data)] = field + _U32.pack(self._crc(field))
            parts += (length, data, _U32.pack(self._crc(data)))
        self._file.write(b"".join(parts))

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

    def check_args(self, args):
        if self.tb_writer is not None:
            return
        name, folder = "logging_dir", args.logging_dir
        if not folder and os.getenv("TENSORBOARD_LOGGING_DIR"):
            name, folder = "$TENSORBOARD_LOGGING_DIR", os.environ["TENSORBOARD_LOGGING_DIR"]
        why = unwritable(folder) if folder else None  # the default is under output_dir, which the Trainer checks
        if why:
            raise ValueError(f"{name}={folder!r} cannot be written ({why}): report_to 'tensorboard' writes its event "
                             f"files there; give a folder this process can write, or leave {name} unset "
                             f"(output_dir/runs/<time>_<host>)")

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
            now = time.time()
            texts = [self._text_event("args", args.to_json_string(), 0, now)]
            config = getattr(model, "config", None)
            if config is not None and hasattr(config, "to_json_string"):
                texts.append(self._text_event("model_config", config.to_json_string(), 0, now))
            self._write(texts)

    def _text_event(self, tag: str, text: str, step: int, wall_time: float) -> bytes:
        from torch.utils.tensorboard.summary import text as text_summary

        return self._event(wall_time=wall_time, step=step, summary=text_summary(tag, text)).SerializeToString()

    def _write(self, events: list[bytes]) -> None:
        if isinstance(self._events, _EventFile):
            self._events.write(events)
        else:  # a user's writer takes protobuf objects
            for data in events:
                event = self._event.FromString(data)
                self._events.add_event(event, event.step, event.wall_time)
        self._events.flush()

    def write_rows(self, rows):
        events = []
        for logs, step, wall_time in rows:
            try:  # the usual log: all numbers, one event
                events.append(scalars_event(wall_time, step, logs))
            except Exception:  # noqa: BLE001 - texts, values that are no numbers, keys that are no names
                numbers, texts = self._sort_out(logs)
                events.append(scalars_event(wall_time, step, numbers))
                events += [self._text_event(metric_name(k), v, step, wall_time) for k, v in texts.items()]
        self._write(events)

    def _sort_out(self, logs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """(the numbers, the texts) of ``logs``; anything else is skipped with a warning."""
        numbers, texts = {}, {}
        for key, value in logs.items():
            if not isinstance(key, str):
                self.skip(key, value, "a TensorBoard tag is a string")
            elif isinstance(value, str):
                texts[key] = value
            elif (as_number := number(value)) is not None:
                numbers[key] = as_number
            else:
                self.skip(key, value, "TensorBoard takes numbers (scalars) and texts")
        return numbers, texts

    def finish(self, failed):
        if self._events is not None:
            self._events.close()
            self._events = None
        self.tb_writer = None  # as transformers: the writer is closed with the run
