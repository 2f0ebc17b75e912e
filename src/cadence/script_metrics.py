"""The metrics scripts print and write around ``train()``/``evaluate()``, with transformers' names, formats and files:
``metrics_format``, ``log_metrics`` (an aligned table) and ``save_metrics`` (``{split}_results.json``,
``all_results.json``). transformers defines them in ``trainer_pt_utils`` as functions of the Trainer; the ``Trainer``
binds these as its methods (a subclass overrides them there).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from pathlib import Path
from typing import Any

from .checkpoint_io.formats import CorruptCheckpointError, _file_kind, checked_path

logger = logging.getLogger(__name__)


def metrics_format(metrics: dict[str, float]) -> dict[str, Any]:
    """Metrics for reading: runtimes as ``h:mm:ss.cc``, ``total_flos`` in GF, memory in MB, floats to 4 decimals.

    Example:
        >>> Trainer.metrics_format({"train_runtime": 62.5, "train_loss": 1.234567})
        {'train_runtime': '0:01:02.50', 'train_loss': 1.2346}
    """
    formatted: dict[str, Any] = {}
    for key, value in metrics.items():
        if "_mem_" in key:
            formatted[key] = f"{value >> 20}MB"
        elif "_runtime" in key:
            whole = int(value)
            formatted[key] = f"{datetime.timedelta(seconds=whole)}.{int(abs(value - whole) * 100):02d}"
        elif key == "total_flos":
            formatted[key] = f"{int(value) >> 30}GF"
        else:
            formatted[key] = round(value, 4) if isinstance(value, float) else value
    return formatted


def log_metrics(self: Any, split: str, metrics: dict[str, float]) -> None:
    """Print ``metrics`` as an aligned table headed ``***** {split} metrics *****`` (main process only).

    Args:
        split: ``"train"``, ``"eval"``, ``"test"``, ...
        metrics: what ``train().metrics``, ``evaluate()`` or ``predict().metrics`` returned.
    """
    if not self.is_world_process_zero():
        return
    print(f"***** {split} metrics *****")
    formatted = self.metrics_format(metrics)
    key_width = max((len(str(k)) for k in formatted), default=0)
    value_width = max((len(str(v)) for v in formatted.values()), default=0)
    for key in sorted(formatted):
        print(f"  {key: <{key_width}} = {formatted[key]:>{value_width}}")


def save_metrics(self: Any, split: str, metrics: dict[str, float], combined: bool = True) -> None:
    """Write ``{output_dir}/{split}_results.json`` and, with ``combined``, merge into ``all_results.json``
    (main process only; JSON with 4-space indent and sorted keys, as transformers writes them).

    Example:
        >>> trainer.save_metrics("eval", trainer.evaluate())
    """
    if not self.is_world_process_zero():
        return
    out = Path(self.args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = out / f"{split}_results.json"
    _regular_file(results)
    results.write_text(json.dumps(metrics, indent=4, sort_keys=True), encoding="utf-8")
    if combined:
        path = out / "all_results.json"
        merged = {**(json.loads(path.read_text(encoding="utf-8")) if _regular_file(path) else {}), **metrics}
        path.write_text(json.dumps(merged, indent=4, sort_keys=True), encoding="utf-8")


def _regular_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (links followed, as transformers follows them), to be read or overwritten;
    False when nothing is there. A FIFO (whose open blocks forever), a socket or a device there is never opened: it is
    removed, with a warning naming it, so the write makes a fresh file in its place."""
    try:
        checked_path(path.parent, path, confine=False)  # the one rule: only regular files are opened
        return True
    except FileNotFoundError:
        return False
    except CorruptCheckpointError:
        pass
    if not os.path.exists(path) or os.path.isdir(path):
        return False  # a link to nothing is written through, as transformers writes; a folder is never deleted
    logger.warning("%s is %s, not a regular file: it was not opened (a FIFO would block forever); writing a fresh "
                   "%s in its place", path, _file_kind(os.stat(path).st_mode), path.name)
    os.unlink(path)
    return False
