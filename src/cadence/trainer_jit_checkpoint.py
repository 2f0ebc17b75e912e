"""Re-exports at the import path of ``transformers.trainer_jit_checkpoint``, so users' imports keep working."""

from __future__ import annotations

import logging

from .checkpoint.signals import CheckpointManager, JITCheckpointCallback

logger = logging.getLogger(__name__)

__all__ = ["CheckpointManager", "JITCheckpointCallback"]
