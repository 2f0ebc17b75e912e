"""Where transformers changed a behaviour between versions: cadence follows the installed transformers.

A library pinned to an older transformers (SpanMarker and adapters on 4.57, PyLate on 5.3) was written against that
version's behaviour, and its tests and users see cadence through it. Where transformers changed a behaviour that
such a library can observe, cadence does what the installed transformers does; without transformers installed, what
the newest transformers does. Every such switch is here, each with the release that changed it; the names that
transformers removed but cadence keeps for older callers (``Trainer(tokenizer=...)``, ``Trainer.tokenizer``,
``_nested_gather``) are no switch: they stay on every version, as a new caller never passes them.

The version is read from the installed package's metadata, never by importing transformers (``import cadence``
stays fast, and a broken transformers install does not stop a run that never uses it).
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

# (major, minor) of every change below, with what changed
EVALUATES_AT_MAX_STEPS = (5, 4)  # DefaultFlowCallback evaluates at max_steps off the eval_steps interval (5.4.0)
# the releases before a change that the library matrix pins: 4.57 (SpanMarker, adapters), 5.3 (PyLate)


@functools.lru_cache(maxsize=None)
def installed_transformers() -> tuple[int, int] | None:
    """``(major, minor)`` of the installed transformers, or None when it is not installed (or has no readable
    version).

    Example:
        >>> installed_transformers()  # transformers 5.25.0 installed
        (5, 25)
    """
    try:
        text = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _at_least(change: tuple[int, int], version: tuple[int, int] | None) -> bool:
    """Whether ``version`` (None: the installed transformers; not installed: the newest behaviour) has ``change``."""
    version = installed_transformers() if version is None else version
    return version is None or tuple(version[:2]) >= change


def evaluates_at_max_steps(version: tuple[int, int] | None = None) -> bool:
    """Whether a run with ``eval_strategy="steps"`` evaluates at ``max_steps`` when that step is off the
    ``eval_steps`` interval: transformers >= 5.4 does; 4.x and 5.0-5.3 end with the last evaluation on the interval
    (so the model is left in training mode, where an evaluation at the end leaves it in eval mode).

    Args:
        version: ``(major, minor)`` of transformers to follow; None: the installed one.

    Example:
        >>> evaluates_at_max_steps((5, 3)), evaluates_at_max_steps((5, 25))
        (False, True)
    """
    return _at_least(EVALUATES_AT_MAX_STEPS, version)
