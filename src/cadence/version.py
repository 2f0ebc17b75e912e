"""cadence's version (its own module, so the model card reads it without importing the package's top)."""

__version__ = "0.1.0"
