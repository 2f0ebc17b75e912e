"""``report_to="jsonl"``: cadence's own tracker, no dependency.

One JSON object per log, ``{..., "step": N}`` exactly as ``state.log_history`` holds it, appended to
``output_dir/log_history.jsonl`` and flushed: a run in progress can be read (and plotted: ``cadence plot``)
at any time. The rows are written in batches (``TrackerCallback.flush_secs``): the file is at most a second
behind the loop, and holds every log up to a checkpoint when it is saved.

A resumed run first cuts the rows after its checkpoint's step off the file's end (``drop_rows_after``):
the interrupted run wrote them after the checkpoint, and the resumed run logs those steps again. Then it
appends. A value JSON cannot write (an object, a tuple key) is left out of its row with one warning;
numpy scalars and one-element tensors are written as numbers.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from .base import FLUSH_SECS, TrackerCallback, number

logger = logging.getLogger(__name__)

LOG_HISTORY_NAME = "log_history.jsonl"


class JsonlCallback(TrackerCallback):
    """Append every log to ``output_dir/log_history.jsonl``."""

    flush_secs = FLUSH_SECS

    def __init__(self):
        super().__init__()
        self._file = None

    def start(self, args, state, model, resumed):
        os.makedirs(args.output_dir, exist_ok=True)
        self.run_id = os.path.join(args.output_dir, LOG_HISTORY_NAME)
        if state.global_step > 0 and os.path.exists(self.run_id):  # rows past this step are a lost run's
            dropped = drop_rows_after(self.run_id, state.global_step)
            if dropped:
                logger.info("%s: %d rows logged after step %d by the interrupted run removed (the resumed run "
                            "logs those steps again)", self.run_id, dropped, state.global_step)
        self._file = open(self.run_id, "ab")  # noqa: SIM115 - open for the run, closed in finish()

    def write_rows(self, rows):
        rows = [{**logs, "step": step} for logs, step, _ in rows]
        try:
            text = json_lines(rows)
        except (TypeError, ValueError, RecursionError):  # a value JSON cannot write: sorted out value by value
            text = json_lines([self._json_row(row) for row in rows])
        self._file.write(text.encode())
        self._file.flush()  # a batch at a time: a reader sees whole rows (a cut last line only mid-write)

    def _json_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with numpy scalars and one-element tensors as numbers, and without what JSON cannot write."""
        kept = {}
        for key, value in row.items():
            as_number = number(value)
            if as_number is not None:
                value = as_number
            else:
                try:
                    json.dumps({key: value})
                except (TypeError, ValueError, RecursionError) as error:
                    self.skip(key, value, f"JSON cannot write it ({error})")
                    continue
            kept[key] = value
        return kept

    def finish(self, failed):
        if self._file is not None:
            self._file.close()
            self._file = None


def json_lines(rows: list[dict[str, Any]]) -> str:
    """``rows`` as JSON lines, each as ``json.dumps`` writes it.

    One ``json.dumps`` of the list, its rows then split where one ends and the next starts (``}, {``):
    a third faster than one call per row, whose fixed cost is as large as a row's numbers. When a value
    holds ``}, {`` too (a text, a list of dicts), the rows are encoded one by one.

    Example:
        >>> json_lines([{"loss": 1.5, "step": 1}, {"loss": 1.25, "step": 2}])
        '{"loss": 1.5, "step": 1}\\n{"loss": 1.25, "step": 2}\\n'
    """
    text = json.dumps(rows)[1:-1]
    if text.count("}, {") != len(rows) - 1:
        return "".join(json.dumps(row) + "\n" for row in rows)
    return text.replace("}, {", "}\n{") + "\n"


def drop_rows_after(path: str | os.PathLike, step: int, block: int = 1 << 16) -> int:
    """Cut the rows with a step above ``step`` off the end of the ``log_history.jsonl`` at ``path``, and a last
    line cut short; return how many lines were cut. Earlier rows (those of an earlier run too) stay as they are.
    Only the file's tail is read, ``block`` bytes at a time: a run reopens the file after every resume and
    every ``evaluate()`` after training.

    Example:
        >>> drop_rows_after("out/log_history.jsonl", 4)  # a run that logged steps 5 and 6 after checkpoint-4
        2
    """
    with open(path, "r+b") as f:
        cut, dropped = None, 0
        for start, line in _lines_backwards(f, block):
            if _row_step(line) <= step:
                break
            cut, dropped = start, dropped + 1
        if cut is not None:
            f.truncate(cut)
    return dropped


def _row_step(line: bytes) -> float:
    """A row's step; infinity for a line that is not a row (cut short by a crash mid-write)."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, TypeError, KeyError):
        return math.inf
    return step if isinstance(step, (int, float)) else math.inf


def _lines_backwards(f, block: int):
    """``(offset, line)`` for each line of the open file ``f``, the last first (a final newline ends the last line)."""
    pos, rest, first = f.seek(0, os.SEEK_END), b"", True
    while pos > 0:
        size = min(block, pos)
        pos -= size
        f.seek(pos)
        parts = (f.read(size) + rest).split(b"\n")  # the bytes from pos to the start of the lines already given
        if first and parts[-1] == b"":
            parts.pop()
        first = False
        starts = [pos]
        for part in parts[:-1]:
            starts.append(starts[-1] + len(part) + 1)
        for i in range(len(parts) - 1, 0, -1):
            yield starts[i], parts[i]
        if pos == 0:
            yield starts[0], parts[0]
        rest = parts[0]  # may begin before pos: completed by the next block


def read_log_history(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a ``log_history.jsonl``, as one uninterrupted run would have logged them.

    A row whose step is below the previous row's starts a resumed run: the earlier rows from that step
    on are dropped. A last line cut short (a run writing right now) is skipped; so is, with a warning, a line
    that is not JSON, not a log row, or not UTF-8 text.

    Example:
        >>> read_log_history("out/log_history.jsonl")[0]
        {'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1, 'step': 10}
    """
    rows: list[dict[str, Any]] = []
    lines = Path(path).read_bytes().splitlines()  # decoded line by line: one damaged line costs that line only
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as error:  # the writer's json.dumps writes ASCII: other bytes are damage
            logger.warning("%s line %d is not UTF-8 text (byte 0x%02x at column %d): skipped", path, number,
                           line[error.start], error.start + 1)
            continue
        except json.JSONDecodeError:
            if number < len(lines):
                logger.warning("%s line %d is not JSON: skipped", path, number)
            continue
        if not (isinstance(row, dict) and type(row.get("step", 0)) is int):  # null, a list, a "3" step: not a log row
            logger.warning("%s line %d is not a log row (an object with an integer step): skipped", path, number)
            continue
        step = row.get("step", 0)
        if rows and step < rows[-1].get("step", 0):  # a resumed run: its rows replace the tail
            rows = [r for r in rows if r.get("step", 0) < step]
        rows.append(row)
    return rows
