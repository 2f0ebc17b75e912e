"""Checkpoints in Hugging Face's layout: written atomically, read safely, resumed exactly.

A package in layers; each module imports only the ones before it in the list below (``tests/docs/test_import_layers.py`` checks that no
import cycle exists anywhere in cadence). The files' names and safe reading are ``cadence.checkpoint_io``, the
package below this one and below the engines:

- ``rng``: the RNG states of a process, captured and restored.
- ``manifest``: the checksum manifest written into every checkpoint, and checking a folder before it is read.
- ``writer``: staging folders, fsync, the atomic rename, removing what killed saves left, rotation.
- ``resume``: which checkpoint to resume and where the data continues (``ResumePoint``).
- ``save_load``: the one ``save``/``load`` pair the Trainer calls, over a dict of named stateful objects.
- ``signals``: SIGTERM/SIGUSR1 (just-in-time) checkpoints.
- ``manager``: the ``Checkpointer``, the one object the Trainer asks: the save in flight, the ``output_dir`` claim,
  the objects a checkpoint holds, every load at its moment.

This ``__init__`` imports nothing, so importing the bottom layer does not pull in the rest.
"""
