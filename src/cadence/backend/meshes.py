"""Meshes and tensor parallelism: the layout from the model and ``ParallelismConfig``, TP, FSDP x TP, HSDP."""


from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..checkpoint_io import formats
from ..checkpoint_io.sharded import load_dcp

from ..runtime.devices import default_device
from .fsdp import _FullyShard


# ------------------------------------------------- tensor, 2-D and hybrid parallelism (accelerate's ParallelismConfig)
#
# A model whose parameters are DTensors (loaded with ``from_pretrained(..., tp_plan="auto")`` or
# ``distributed_config=DistributedConfig(tp_size=..., fsdp_size=..., dp_replicate_size=...)``, or given a
# ``parallelize_module`` plan) owns its placement and its gradient reduction, as in transformers: it trains as it is,
# with no DDP wrapper. The backend works out the layout (transformers' rule: ``tp_size`` from the model,
# ``dp_shard_size`` from the rest), builds accelerate's device mesh from the ``ParallelismConfig``, and answers the
# loop's two questions: this process's data-parallel rank and how many data-parallel ranks there are. Processes of
# one TP group (consecutive ranks: tp is the innermost mesh dimension in accelerate's and in transformers' meshes)
# read the same batch, and the items of a step are counted over the data-parallel ranks only.

_CP_NEEDS = ("cp_size={cp} (context parallelism) is not supported by cadence: torch's context_parallel shards the "
             "sequence of scaled_dot_product_attention, whose ring kernels need CUDA (flash or efficient attention) and "
             "FSDP2 over a cp mesh dimension; set cp_size=1")
_SP_NEEDS = ("sp_size={sp} (sequence parallelism, sp_backend={backend!r}) is not supported by cadence: DeepSpeed's "
             "Ulysses sequence parallelism runs on CUDA GPUs through DeepSpeed; set sp_size=1")


def model_tp_size(model: torch.nn.Module | None) -> int:
    """The tensor-parallel degree the model was sharded with: transformers' ``tp_size`` (``_tp_size``), else the size of
    the mesh dimension its DTensor parameters are sharded over (a ``parallelize_module`` plan), else 1."""
    size = getattr(model, "_tp_size", None) or getattr(model, "tp_size", None)
    if isinstance(size, int) and size > 1:
        return size
    for p in (model.parameters() if model is not None else ()):
        mesh = getattr(p, "device_mesh", None)
        names = getattr(mesh, "mesh_dim_names", None) or ()
        if mesh is not None and "tp" in names:
            return mesh["tp"].size()
    return 1


def _has_dtensor_parameters(model: torch.nn.Module | None) -> bool:
    return model is not None and any(hasattr(p, "device_mesh") and hasattr(p, "placements") for p in model.parameters())


def parallelism_layout(args: Any, model: torch.nn.Module | None):
    """The run's ``ParallelismConfig`` (accelerate's), or None for plain DDP/FSDP/one process.

    transformers' rule: a model sharded at load time fixes ``tp_size`` (its own) and ``dp_shard_size`` (its
    ``distributed_config.dp_size``, else the processes left over); ``args.parallelism_config`` gives the rest.

    Raises:
        ValueError: before step 1, naming the numbers: sizes whose product is not the number of processes,
            ``tp_size`` > 1 with a model that is not tensor-parallel, DDP x TP (replicas without sharding, which
            accelerate forbids), or cp_size/sp_size (see ``_CP_NEEDS``/``_SP_NEEDS``).

    Example:
        >>> parallelism_layout(TrainingArguments("out"), model)  # a model loaded with tp_plan="auto" on 2 processes
        ParallelismConfig(... tp_size=2 ...)
    """
    import copy

    config, tp, on_mesh = args.parallelism_config, model_tp_size(model), _has_dtensor_parameters(model)
    if config is None and tp == 1 and not on_mesh:
        return None
    from accelerate import ParallelismConfig

    if isinstance(config, dict):  # from a config file or to_dict(): its sizes and backends
        keys = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size", "sp_backend")
        config = ParallelismConfig(**{k: config[k] for k in keys if config.get(k) is not None})
    if config is not None and not isinstance(config, ParallelismConfig):
        raise TypeError(f"parallelism_config={config!r} is invalid: it must be an accelerate.ParallelismConfig, e.g. "
                        "ParallelismConfig(tp_size=2)")
    config = copy.copy(config) if config is not None else ParallelismConfig()  # the user's stays as given
    config._sizes = dict(config._sizes)
    config.device_mesh = None
    if config.cp_size > 1:
        raise ValueError(_CP_NEEDS.format(cp=config.cp_size))
    if config.sp_size > 1:
        raise ValueError(_SP_NEEDS.format(sp=config.sp_size, backend=config.sp_backend))
    world = args.world_size
    _refuse_ddp_with_tp(config)
    distributed = getattr(getattr(model, "config", None), "distributed_config", None) if on_mesh else None
    if tp > 1 or distributed is not None:  # the model's own layout wins, as transformers' Trainer sets it
        dp = getattr(distributed, "dp_size", None) or world // tp
        replicas = getattr(distributed, "dp_replicate_size", None) or config.dp_replicate_size
        if config.tp_size not in (1, tp):
            raise ValueError(f"parallelism_config tp_size={config.tp_size} but the model was sharded with tp_size={tp}; "
                             f"set tp_size={tp} (or leave it out: the model's is used)")
        if tp > 1:
            config.tp_handler = config.tp_handler or copy.copy(ParallelismConfig(tp_size=2).tp_handler)
            config._set_size("tp", tp)
        config._set_size("dp_replicate", replicas)
        config._set_size("dp_shard", dp // replicas)
    elif config.tp_size > 1:
        plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or getattr(model, "_tp_plan", None)
        how = ("load it with from_pretrained(..., tp_plan='auto') (or distributed_config=DistributedConfig(tp_size="
               f"{config.tp_size}))" if plan else f"{type(model).__name__} has no tensor-parallel plan (no "
               "base_model_tp_plan): give its layers a torch.distributed.tensor.parallel.parallelize_module plan, "
               "or set tp_size=1")
        raise ValueError(f"parallelism_config tp_size={config.tp_size} but the model's parameters are not sharded "
                         f"over a tensor-parallel mesh; {how}")
    _refuse_ddp_with_tp(config)
    if config.total_size == 1 and world > 1:  # plain data parallelism over every process, as accelerate does
        config._set_size("dp_replicate", world)
    sizes = (f"dp_replicate_size={config.dp_replicate_size} x dp_shard_size={config.dp_shard_size} x "
             f"tp_size={config.tp_size}")
    if config.total_size != world:
        raise ValueError(f"parallelism_config {sizes} = {config.total_size} processes, but the run has {world}: "
                         f"make the product {world} (tp_size must divide the number of processes)")
    return config


def _refuse_ddp_with_tp(config: Any) -> None:
    if config.tp_size > 1 and config.dp_replicate_size > 1 and config.dp_shard_size == 1:
        raise ValueError(f"parallelism_config dp_replicate_size={config.dp_replicate_size} x tp_size={config.tp_size} "
                         "without dp_shard_size: data-parallel replicas of a tensor-parallel model need sharding (DDP x TP "
                         f"is not supported by accelerate); use dp_shard_size={config.dp_replicate_size} and "
                         "dp_replicate_size=1 (FSDP x TP), or both > 1 (HSDP x TP)")


def _accelerate_parallelism(layout: Any, args: Any) -> dict[str, Any]:
    """The ``Accelerator`` keyword for the layout, as transformers hands it over; none on CPUs, where accelerate
    refuses a ``ParallelismConfig`` (its check wants GPUs or FSDP), so the backend builds the same mesh itself."""
    if layout is None or default_device(args.use_cpu, args.local_process_index).type == "cpu":
        return {}
    return {"parallelism_config": layout}


class _MeshParallel(_FullyShard):
    """A model already distributed over a device mesh (DTensor parameters: TP, or FSDP x TP / HSDP applied at load):
    it runs as it is, its gradients reduced by its own hooks (FSDP2's) or not at all (TP alone: a TP group computes
    one gradient together). Checkpoints go through DCP as FSDP's do: gathered into full ``model.safetensors`` and
    ``optimizer.pt`` (resumable on any layout), or one shard per process with ``state_dict_type`` sharded. Clipping
    measures the norm of each mesh's gradients and combines them, as transformers does for mixed meshes.

    Args:
        args, accelerator, amp_dtype: as ``_FullyShard``.
        layout: the run's ``ParallelismConfig``; its ``device_mesh`` is built here (accelerate's builder).
        sharded: write DCP shards (``fsdp_config`` ``state_dict_type`` sharded) instead of full files.
    """

    def __init__(self, args: Any, accelerator: Any, layout: Any, amp_dtype: torch.dtype | None, sharded: bool = False):
        from types import SimpleNamespace

        plugin = SimpleNamespace(state_dict_type="SHARDED_STATE_DICT" if sharded else "FULL_STATE_DICT",
                                 cpu_ram_efficient_loading=False)
        super().__init__(args, accelerator, plugin, amp_dtype, layout)
        self.mesh = layout.get_device_mesh(self.device.type)
        self.data_parallel_size = layout.data_parallel_size
        self.data_parallel_rank = torch.distributed.get_rank() // layout.non_data_parallel_size  # tp innermost: a TP group is consecutive

    def check_model(self, model: torch.nn.Module) -> None:
        """The model's TP groups must be the mesh's: consecutive ranks (else two processes of one TP group would
        read different batches)."""
        tp = self.layout.tp_size
        for name, p in model.named_parameters():
            mesh = getattr(p, "device_mesh", None)
            if mesh is None or "tp" not in (mesh.mesh_dim_names or ()):
                continue
            group = sorted(mesh["tp"].mesh.flatten().tolist())
            first = self.data_parallel_rank * tp
            if group != list(range(first, first + tp)):
                raise ValueError(f"{name} is sharded over the tensor-parallel ranks {group}, but cadence gives one batch "
                                 f"to ranks {list(range(first, first + tp))}: build the model's mesh with tp as its last "
                                 "(innermost) dimension, as from_pretrained(..., tp_plan='auto') does")
            return

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> torch.nn.Module:
        """The model as it is (already placed on its mesh), checked, with a resume's sharded weights loaded."""
        self.check_model(model)
        if self.pending is not None:  # sharded weights of a resume, loaded now that the model is known
            folder, self.pending = self.pending, None
            self.load_model_weights(model, folder)
        return model

    @staticmethod
    def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        by_mesh: dict[Any, list] = {}
        for p in parameters:
            if p.grad is not None:  # DTensors of different meshes (and plain tensors) cannot share one norm kernel
                by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
        norms = []
        for params in by_mesh.values():
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # over the mesh's shards
        total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
        for params in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    def load_model_weights(self, model: torch.nn.Module, folder: Path) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

        if (folder / formats.MODEL_SHARDS_NAME).is_dir():
            state = {"model": get_model_state_dict(model)}
            load_dcp(state, folder / formats.MODEL_SHARDS_NAME)  # no file in it can run code
            set_model_state_dict(model, state["model"])
        else:  # full weights, each process keeping its shard of every DTensor
            state = formats.read_model_weights(folder, torch.device("cpu"))
            set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def _mesh_sharding(args: Any, accelerator: Any, layout: Any, model: torch.nn.Module | None, plugin: Any,
                   amp_dtype: torch.dtype | None) -> _FullyShard | None:
    """The engine of a ``ParallelismConfig`` layout: ``_MeshParallel`` for a model already on a mesh (DTensor
    parameters), None where the FSDP plugin (or plain DDP) runs it.

    Raises:
        ValueError: ``dp_shard_size`` > 1 for a model that is not sharded, without ``fsdp`` to shard it.
    """
    if _has_dtensor_parameters(model):
        from torch.distributed.fsdp import FSDPModule

        if layout.data_parallel_size > 1 and not isinstance(model, FSDPModule):  # nothing would average its gradients
            raise ValueError(f"the model's parameters are on a device mesh and the layout has {layout.data_parallel_size} "
                             "data-parallel ranks, but the model is not sharded over them (FSDP2): load it with "
                             "distributed_config=DistributedConfig(tp_size=..., fsdp_size=..., dp_replicate_size=...), "
                             "which applies FSDP2 at load")
        sharded = plugin is not None and plugin.state_dict_type == "SHARDED_STATE_DICT"
        return _MeshParallel(args, accelerator, layout, amp_dtype, sharded=sharded)
    if layout.dp_shard_size > 1 and plugin is None:
        raise ValueError(f"parallelism_config dp_shard_size={layout.dp_shard_size} shards the model with FSDP, but "
                         "fsdp is not set: set fsdp='full_shard' (or load the model sharded, with "
                         "distributed_config=DistributedConfig(fsdp_size=...))")
    if plugin is None:
        return None
    if layout.dp_shard_size == 1:
        raise ValueError(f"fsdp is set but parallelism_config has dp_shard_size=1 (dp_replicate_size="
                         f"{layout.dp_replicate_size}): FSDP has no dimension to shard across; set dp_shard_size > 1 "
                         "or remove fsdp")
    return _FullyShard(args, accelerator, plugin, amp_dtype, layout)  # over the layout's data-parallel mesh: HSDP
