"""Integrations, at the import path of ``transformers.integrations``."""

from .neftune import activate_neftune, deactivate_neftune  # noqa: F401
