"""Re-exports at the import path of ``transformers.trainer_pt_utils``, so users' imports keep working."""

from __future__ import annotations

import logging

from .data import LengthGroupedSampler
from .data import length_grouped_indices as get_length_grouped_indices
from .loss import LabelSmoother

logger = logging.getLogger(__name__)

__all__ = ["LengthGroupedSampler", "get_length_grouped_indices", "LabelSmoother"]
