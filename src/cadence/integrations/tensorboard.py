"""``report_to="tensorboard"``: event files under ``logging_dir`` (default ``output_dir/runs/<time>_<host>``).

Scalars carry transformers' names (``train/loss``, ``train/learning_rate``, ``train/grad_norm``,
``eval/loss``, ...) at the global step; the arguments (and the model's config) are text. A resumed
run writes into the same folder with ``purge_step``: TensorBoard drops the steps the interrupted run
logged after its checkpoint, so every step appears once.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime
from typing import Any

from .base import TrackerCallback, rewrite_logs

FLUSH_SECS = 5  # the writer's thread flushes this often (and at the end): a run in progress stays current


def default_logdir() -> str:
    """``runs/<Mon><DD>_<HH-MM-SS>_<host>``: PyTorch's and transformers' default, relative to ``output_dir``."""
    return os.path.join("runs", datetime.now().strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname())


class TensorBoardCallback(TrackerCallback):
    """Send the logs to TensorBoard.

    Args:
        tb_writer: a ``SummaryWriter`` to use instead of opening one.

    Environment:
        TENSORBOARD_LOGGING_DIR: the folder, when ``logging_dir`` is not set.
    """

    def __init__(self, tb_writer: Any = None):
        super().__init__()
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self._writer_class = SummaryWriter
        self.tb_writer = tb_writer

    def start(self, args, state, model, resumed):
        if self.tb_writer is not None:  # the user's writer
            self.run_id = self.tb_writer.log_dir
            return
        if not resumed:
            folder = args.logging_dir or os.getenv("TENSORBOARD_LOGGING_DIR")
            folder = os.path.expanduser(folder) if folder else os.path.join(args.output_dir, default_logdir())
            if state.trial_name is not None:  # each search trial in its own folder
                folder = os.path.join(folder, state.trial_name)
            self.run_id = folder
        # on a resume, events past the checkpoint's step came from the interrupted run: purged
        purge_step = state.global_step + 1 if state.global_step > 0 else None
        self.tb_writer = self._writer_class(log_dir=self.run_id, purge_step=purge_step, flush_secs=FLUSH_SECS)
        if not resumed:
            self.tb_writer.add_text("args", args.to_json_string())
            config = getattr(model, "config", None)
            if config is not None and hasattr(config, "to_json_string"):
                self.tb_writer.add_text("model_config", config.to_json_string())

    def write(self, logs, step):
        from tensorboard.compat.proto.summary_pb2 import Summary

        logs = rewrite_logs(logs)
        # one event holding every scalar of the log (what add_scalar writes, one value each): a log
        # costs one record, not one per metric, and no flush (the writer's thread flushes every FLUSH_SECS)
        values = [Summary.Value(tag=k, simple_value=v) for k, v in logs.items() if isinstance(v, (int, float))]
        self.tb_writer._get_file_writer().add_summary(Summary(value=values), step)
        for key, value in logs.items():
            if isinstance(value, str):
                self.tb_writer.add_text(key, value, step)

    def finish(self, failed):
        if self.tb_writer is not None:
            self.tb_writer.close()
            self.tb_writer = None

