"""Re-exports at the import path of ``transformers.trainer_optimizer``, so users' imports keep working."""

from __future__ import annotations

import logging

from .optimization import get_optimizer_cls_and_kwargs, is_optimizer_factory

logger = logging.getLogger(__name__)

__all__ = ["get_optimizer_cls_and_kwargs", "is_optimizer_factory"]
