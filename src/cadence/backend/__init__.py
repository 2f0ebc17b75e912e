"""The only package that knows how processes and devices are run (accelerate over torch.distributed).

The loop asks verbs (``prepare_model``, ``prepare_training``, ``no_sync``, ``autocast``, ``backward``,
``clip_grad_norm``, ``optimizer_step``, ``reduce_mean``, ``gather``, ``broadcast_object``, ``unwrap``, ``barrier``, and
for checkpoints ``model_state_dict``, ``optimizer_state_dict``, ``load_model_weights``, ``load_optimizer_state``) and never
asks which engine is underneath; ``pin_memory``, ``empty_cache`` and ``free_memory`` answer for its device. Code
with no ``Backend`` at hand (arguments, checkpoints, samplers, callbacks) asks ``cadence.runtime``'s functions instead
(re-exported here): ``default_device``, ``accelerator_available``, ``device_rng_state``/``set_device_rng_state``,
``peak_flops``, ``process_group_size_and_rank``, ``any_process``, ``every_process``. No module outside these two
packages calls torch.cuda or torch.distributed.
``AcceleratorView`` is ``trainer.accelerator``: accelerate's ``Accelerator`` methods for subclasses, on one
process or several.

A single process gets no wrapper at all: no DDP module, no optimizer wrapper, no accelerate dataloader; the model
is only moved to the device. Several processes (``torchrun``/``accelerate launch``) go through
accelerate's ``Accelerator``, with its gradient accumulation left at 1: cadence normalises the loss
of a step itself, once, over the items of all processes (see ``loss.py``).

Mixed precision is owned here too, the same way on one process or several, as accelerate does it: ``bf16``/``fp16``
run the model's forward under ``torch.autocast`` and hand its outputs back in float32 (``prepare_model`` wraps the
module's ``forward``, so a loss a subclass computes from the outputs is float32 as in transformers; FSDP, whose
``MixedPrecisionPolicy`` casts the parameters, autocasts forward and loss instead); weights stay float32; ``fp16`` adds a
``torch.amp.GradScaler``: ``backward`` scales the loss, ``clip_grad_norm`` unscales first,
``optimizer_step`` skips a step whose gradients hold inf/NaN and returns False so that the schedule does
not advance. An optimizer that updates inside backward (LOMO/AdaLomo: ``fused_backward``) is driven by the same
verbs: ``backward`` runs its update with the current lr, ``optimizer_step`` does nothing, ``clip_grad_norm`` reports
the norm it clipped by; the loop does not know. ``tf32=True`` needs a CUDA device of compute capability >= 8 (an error elsewhere, as in
transformers); ``tf32=False`` turns it off on CUDA and does nothing on a CPU.

FSDP (``fsdp``/``fsdp_config`` as transformers spells them, or ``accelerate launch`` with an FSDP config file)
is torch's FSDP2 ``fully_shard``, configured through accelerate's ``FullyShardedDataParallelPlugin``
(``fsdp_version=2``) and applied here, on every device type, so the same code runs on CPUs (gloo) and
GPUs; accelerate's own FSDP path only runs on accelerators. See ``_FullyShard``.

Engines are strategies: one object per engine carries the verbs (``strategy``: the interface and one process's
defaults; ``single``: one device; ``ddp``: several processes through accelerate; ``fsdp``: FSDP2; ``meshes``: a
model on a device mesh, TP, FSDP x TP, HSDP; ``deepspeed_engine``: DeepSpeed's engine), and one ``Precision``
object (autocast, the fp16 grad scaler) sits beside it. ``connector`` picks both once, from the arguments and the
model; the ``Backend`` hands each verb to them and never asks which engine runs. A new engine is one new module.

Modules, each importing only the ones before it: ``precision``, ``strategy``, ``single``, ``ddp``, ``fsdp``,
``meshes`` (tensor, 2-D and hybrid parallelism), ``deepspeed`` (its config), ``deepspeed_engine``, ``connector``,
``adapter`` (``Backend``), ``accelerator_view`` (``AcceleratorView``, ``accelerator_kwargs``). The device and process
facts they stand on (``devices``, ``processes``, ``slurm``) are ``cadence.runtime``, a floor below every package;
their names are re-exported here. Every name is importable from ``cadence.backend``.
"""

import torch  # noqa: F401 - ``cadence.backend.torch``, as the module it replaces had it (tests patch torch.amp there)

from ..runtime.devices import (  # noqa: F401
    accelerator_available, bf16_gpu_available, copies_done_event, default_device, device_memory,
    device_rng_state, empty_cache, free_memory, peak_flops, reset_device_peak_memory, set_device_rng_state,
    _EMPTY_CACHE,
)
from ..runtime.processes import (  # noqa: F401
    accelerate_state, any_process, every_process, find_unused_parameters, main_process_first, process_group_size_and_rank,
    process_state,
    require_configured_state, shard_batch_sampler, _process_group_options,
)
from .fsdp import (  # noqa: F401
    fsdp_plugin,
)
from .meshes import (  # noqa: F401
    model_tp_size, parallelism_layout,
)
from .deepspeed import (  # noqa: F401
    deepspeed_config, deepspeed_plugin,
)
from .strategy import Strategy  # noqa: F401
from .precision import Precision  # noqa: F401
from .adapter import (  # noqa: F401
    Backend,
)
from .accelerator_view import (  # noqa: F401
    accelerator_kwargs, AcceleratorView, skip_first_batches,
)
