"""Checkpoint files: their names and layout, written and read safely; below the engines and the checkpoint writer.

- ``formats``: the file names, writing and reading the weights (safetensors, sharded, ``pytorch_model.bin``), and
  reading every other file without running code (``torch.load(weights_only=True)``).
- ``sharded``: FSDP's sharded state (DCP folders), read through a restricted unpickler.
- ``deepspeed_files``: DeepSpeed's own files (``latest``, ``latest_universal``, everything under their tags), checked
  with ``weights_only`` and DeepSpeed's few classes before ``engine.load_checkpoint`` unpickles them.

``cadence.backend`` (the engines read and write weights and optimizer shards) and ``cadence.checkpoint`` (the
atomic writer, the manifest, resume) both stand on this package; it imports neither (as Lightning Fabric's
``CheckpointIO`` never imports a strategy). This ``__init__`` imports nothing.
"""
