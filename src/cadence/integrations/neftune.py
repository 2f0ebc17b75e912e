"""``transformers.integrations.neftune``'s functions, at that import path (cadence's ``neftune`` module)."""

from __future__ import annotations

import logging

from ..neftune import activate_neftune, deactivate_neftune

logger = logging.getLogger(__name__)

__all__ = ["activate_neftune", "deactivate_neftune"]
