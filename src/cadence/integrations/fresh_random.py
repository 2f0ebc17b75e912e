"""Keep a tracker's draws from Python's ``random`` out of the training's stream.

Some trackers draw from the global ``random`` when imported or when a run starts (Comet names its offline
archives with it, ClearML and SwanLab their ids and colours). After ``set_seed`` those draws would move the
training's own stream (a run that reports would shuffle or augment differently from one that does not), and
give a resumed run the same "random" names as the run it resumes. Inside ``fresh_random()`` the global
``random`` runs on fresh entropy; the training's state is put back after it.
"""

from __future__ import annotations

import contextlib
import random


@contextlib.contextmanager
def fresh_random():
    """Run the block on a freshly seeded global ``random``; restore the caller's state afterwards.

    Example:
        >>> random.seed(0)
        >>> with fresh_random():
        ...     _ = random.random()  # a tracker's draw
        >>> random.random() == random.Random(0).random()  # the caller's stream did not move
        True
    """
    state = random.getstate()
    random.seed()
    try:
        yield
    finally:
        random.setstate(state)
