"""The facts every floor of cadence needs, below everything else: which device this process runs on and what it
holds (``devices``: the device, its cache and memory counters, device RNG states, peak FLOP/s), which processes
run beside it (``processes``: the process group and rendezvous, accelerate's process state, ranks, collectives,
torchrun's restarts), and how they were launched (``slurm``: SLURM's ``srun`` as a launcher).

Data, checkpoints, arguments and the engines ask these modules; they import nothing of cadence. The engines
(DDP, FSDP, DeepSpeed, meshes) are ``cadence.backend``, a floor above, which re-exports these names too.
This ``__init__`` imports nothing, so importing one module does not pull in the others.
"""
