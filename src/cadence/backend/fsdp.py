"""FSDP: transformers' ``fsdp``/``fsdp_config`` read into accelerate's plugin, torch's ``fully_shard`` applied."""


from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Any

import torch

from ..checkpoint_io import formats
from ..checkpoint_io.sharded import load_dcp

from .ddp import DataParallel


# ---------------------------------------------------------------------------------------------- FSDP

# transformers' `fsdp` words -> what each sets (sharding words are exclusive; "offload"/"auto_wrap" add)
_FSDP_SHARDING = {
    "full_shard": {"reshard_after_forward": True},
    "shard_grad_op": {"reshard_after_forward": False},
    "hybrid_shard": {"reshard_after_forward": True, "hybrid": True},
    "hybrid_shard_zero2": {"reshard_after_forward": False, "hybrid": True},
}
_FSDP_WORDS = (*_FSDP_SHARDING, "offload", "auto_wrap")
# fsdp_config keys cadence reads (transformers' names; an "fsdp_" prefix is accepted, as transformers does)
_FSDP_CONFIG_KEYS = (
    "version", "min_num_params", "transformer_layer_cls_to_wrap", "reshard_after_forward", "cpu_offload",
    "offload_params", "activation_checkpointing", "state_dict_type", "cpu_ram_efficient_loading",
)
# FSDP1 options that FSDP2 has no use for: accepted and ignored, so configs written for transformers still run
_FSDP1_ONLY_KEYS = ("backward_prefetch", "forward_prefetch", "use_orig_params", "sync_module_states", "limit_all_gathers", "xla")
_STATE_DICT_TYPES = {"full": "FULL_STATE_DICT", "full_state_dict": "FULL_STATE_DICT",
                     "sharded": "SHARDED_STATE_DICT", "sharded_state_dict": "SHARDED_STATE_DICT"}


def _fsdp_words(fsdp: Any) -> list[str]:
    if fsdp in (None, False, "", []):
        return []
    if fsdp is True:
        return ["full_shard"]
    words = fsdp.split() if isinstance(fsdp, str) else [str(getattr(w, "value", w)) for w in fsdp]
    unknown = [w for w in words if w not in _FSDP_WORDS]
    if unknown:
        hint = " ('no_shard' is plain data parallelism: leave fsdp unset)" if "no_shard" in unknown else ""
        raise ValueError(f"fsdp={fsdp!r} is invalid: {unknown} unknown{hint}; use words from {list(_FSDP_WORDS)}, "
                         "e.g. fsdp='full_shard auto_wrap'")
    if sum(w in _FSDP_SHARDING for w in words) > 1:
        raise ValueError(f"fsdp={fsdp!r} is invalid: it names more than one sharding strategy; keep one of {list(_FSDP_SHARDING)}")
    return words


def _fsdp_config(args: Any) -> dict[str, Any]:
    raw = args.fsdp_config
    if isinstance(raw, str):  # a JSON file (a JSON string was parsed by TrainingArguments)
        import json

        with open(raw) as f:
            raw = json.load(f)
    config = {k.removeprefix("fsdp_"): v for k, v in (raw or {}).items()}
    unknown = [k for k in config if k not in _FSDP_CONFIG_KEYS + _FSDP1_ONLY_KEYS]
    if unknown:
        raise ValueError(f"fsdp_config has unknown keys {unknown}; cadence reads {list(_FSDP_CONFIG_KEYS)}")
    if _fsdp_config_int(config, "version", 2) != 2:
        raise ValueError(f"fsdp_config version={config['version']!r} is invalid: cadence runs FSDP2 only; set version=2")
    _fsdp_config_int(config, "min_num_params", 0)
    if config.get("xla"):
        raise ValueError("fsdp_config xla=True is invalid: cadence has no XLA/TPU support; remove it")
    kind = str(config.get("state_dict_type", "full")).lower()
    if kind not in _STATE_DICT_TYPES:
        raise ValueError(f"fsdp_config state_dict_type={config['state_dict_type']!r} is invalid; use 'FULL_STATE_DICT' or 'SHARDED_STATE_DICT'")
    config["state_dict_type"] = _STATE_DICT_TYPES[kind]
    return config


def _fsdp_config_int(config: dict[str, Any], key: str, default: int) -> int:
    """A whole number >= 0 from fsdp_config (JSON may hold "2"); anything else names the key, not int()'s text."""
    value = config.get(key, default)
    text = str(value).strip()
    if isinstance(value, bool) or not ((isinstance(value, int) and value >= 0) or (isinstance(value, str) and text.isdigit())):
        raise ValueError(f"fsdp_config {key}={value!r} is invalid: it must be a whole number >= 0; e.g. {key}={default}")
    return int(text) if isinstance(value, str) else value


def fsdp_plugin(args: Any):
    """accelerate's ``FullyShardedDataParallelPlugin`` (FSDP2) from transformers' ``fsdp``/``fsdp_config``, or
    from the environment ``accelerate launch`` sets from an FSDP config file; None without FSDP.

    Raises:
        ValueError: an unknown word or key, FSDP version 1, or ``fsdp_config`` without ``fsdp``.
    """
    words = _fsdp_words(args.fsdp)
    from_launcher = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if not words and not from_launcher:
        if args.fsdp_config:
            raise ValueError("fsdp_config is set but fsdp is not: FSDP is off; set fsdp='full_shard' (or remove fsdp_config)")
        return None
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        raise ValueError(f"fsdp needs torch >= 2.6 (FSDP2's fully_shard); this is torch {torch.__version__}: upgrade torch") from None
    from accelerate.utils import FullyShardedDataParallelPlugin

    if not words:  # `accelerate launch --config_file` with distributed_type FSDP: its FSDP_* variables
        plugin = FullyShardedDataParallelPlugin()
        if plugin.fsdp_version != 2:
            raise ValueError("the accelerate config asks for FSDP version 1: cadence runs FSDP2; set fsdp_version: 2 in it")
        plugin.state_dict_type = getattr(plugin.state_dict_type, "name", plugin.state_dict_type)
        return plugin
    config = _fsdp_config(args)
    sharding = next((_FSDP_SHARDING[w] for w in words if w in _FSDP_SHARDING), _FSDP_SHARDING["full_shard"])
    min_params = _fsdp_config_int(config, "min_num_params", 0)
    layers = config.get("transformer_layer_cls_to_wrap")
    wrap = "auto_wrap" in words or min_params > 0 or layers is not None
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=bool(config.get("reshard_after_forward", sharding["reshard_after_forward"])),
        cpu_offload=bool("offload" in words or config.get("cpu_offload") or config.get("offload_params")),
        auto_wrap_policy=("size_based_wrap" if min_params > 0 else "transformer_based_wrap") if wrap else "no_wrap",
        transformer_cls_names_to_wrap=[layers] if isinstance(layers, str) else layers,
        min_num_params=min_params,
        state_dict_type=config["state_dict_type"],
        activation_checkpointing=bool(config.get("activation_checkpointing", False)),
        cpu_ram_efficient_loading=bool(config.get("cpu_ram_efficient_loading", False)),
    )
    plugin.hybrid = sharding.get("hybrid", False)
    plugin.state_dict_type = config["state_dict_type"]
    return plugin


def _fqn(name: str) -> str:
    """A parameter's name as torch's state-dict helpers write it (wrappers' prefixes removed)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


class _FullyShard(DataParallel):
    """torch's FSDP2: ``fully_shard`` on each wrapped layer, then the root; checkpoints through
    ``torch.distributed.checkpoint`` (DCP): consolidated on the saving process, or one shard per process.

    Numerics: a reduce-scatter averages gradients over processes, as DDP's all-reduce does, so the loop's
    loss weighting is the same; clipping measures the norm over all shards (one collective). Mixed precision is
    FSDP's ``MixedPrecisionPolicy`` (parameters cast for the compute), with autocast around the loss, not the forward.

    Args:
        args, accelerator: as ``DataParallel`` (whose collectives this shares).
        plugin: accelerate's ``FullyShardedDataParallelPlugin`` (``fsdp_plugin``).
        amp_dtype: the mixed-precision compute dtype, or None.
        layout: a ``ParallelismConfig`` whose data-parallel mesh to shard over (HSDP), or None.
    """

    shards_parameters, forward_autocasts = True, False
    sharding = property(lambda self: self)  # transformers' is_fsdp_enabled (device meshes too)

    def __init__(self, args: Any, accelerator: Any, plugin: Any, amp_dtype: torch.dtype | None, layout: Any = None):
        super().__init__(args, accelerator)
        self.plugin, self.amp_dtype, self.layout = plugin, amp_dtype, layout
        self.sharded_state = plugin.state_dict_type == "SHARDED_STATE_DICT"
        self.pending: Path | None = None  # sharded weights to load once the model is sharded (a resume)
        self._save_group = None  # the gloo group of DCP's background writes (async_save), made at the first one

    def no_sync(self, model: torch.nn.Module):
        """Nothing skipped: FSDP reduce-scatters every micro-batch, since skipping it would keep whole unsharded
        gradients on every process, the memory FSDP exists to save (the sum is the same either way)."""
        return contextlib.nullcontext()

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> torch.nn.Module:
        """Shard ``model`` in place and point ``optimizer`` at the sharded parameters."""
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

        if isinstance(model, FSDPModule):
            return model
        from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

        model = model.to(self.device)
        wrap = fsdp2_prepare_auto_wrap_policy(self.plugin, model) or (lambda module: False)
        layers = [(n, m) for n, m in model.named_modules() if m is not model and wrap(m)]
        if self.plugin.activation_checkpointing:  # recompute each wrapped layer's activations in backward
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            for name, layer in layers:
                model.set_submodule(name, checkpoint_wrapper(layer))
            if getattr(getattr(model, "config", None), "use_cache", False):  # a cache filled twice (forward and
                model.config.use_cache = False  # its recomputation) breaks the shapes, as transformers warns
            layers = [(n, model.get_submodule(n)) for n, _ in layers]
        before = {_fqn(n): p for n, p in model.named_parameters()}
        options = dict(
            reshard_after_forward=self.plugin.reshard_after_forward,
            mesh=self._mesh(),
            # mixed precision: compute in the autocast dtype, reduce gradients in float32
            mp_policy=MixedPrecisionPolicy(param_dtype=self.amp_dtype, reduce_dtype=torch.float32) if self.amp_dtype else MixedPrecisionPolicy(),
        )
        if self.plugin.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=self.device.type == "cuda")
        for _, layer in reversed(layers):  # innermost first, the root last
            fully_shard(layer, **options)
        fully_shard(model, **options)
        if optimizer is not None:  # fully_shard replaced the parameters: the optimizer must step the new ones
            after = {_fqn(n): p for n, p in model.named_parameters()}
            new = {id(before[name]): after[name] for name in before}
            for group in optimizer.param_groups:
                group["params"] = [new.get(id(p), p) for p in group["params"]]
        if self.plugin.cpu_ram_efficient_loading:  # the main process's weights are the ones everyone trains
            self._broadcast_from_main(model)
        if self.pending is not None:
            folder, self.pending = self.pending, None
            self.load_model_weights(model, folder)
        return model

    def _mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        if self.layout is not None:  # parallelism_config's dp_replicate x dp_shard (HSDP)
            mesh = self.layout.get_device_mesh(self.device.type)
            return mesh[tuple(self.layout.fsdp_dim_names)] if self.layout.dp_replicate_enabled else mesh["dp_shard_cp"]
        world = int(os.environ.get("WORLD_SIZE", 1))
        if not getattr(self.plugin, "hybrid", False):
            return init_device_mesh(self.device.type, (world,))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # replicate across nodes, shard inside one
        return init_device_mesh(self.device.type, (world // local, local), mesh_dim_names=("replicate", "shard"))

    def _broadcast_from_main(self, model: torch.nn.Module) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

    @staticmethod
    def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
        parameters = list(parameters)
        grads = [p.grad for p in parameters if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)  # over all shards: a replicated DTensor
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
        return norm

    def _save_shards(self, state: dict, folder: Path, pending: list | None) -> None:
        """Every process writes its shards of ``state`` into the DCP folder ``folder``: now, or (``pending``) from a
        CPU copy taken now, by the writer's thread, which calls what this appends to ``pending``. Those writes run
        DCP's collectives on a gloo group of their own, one after the other in the same order on every process, while
        the training thread's collectives go on over the default group."""
        import torch.distributed.checkpoint as dcp

        if pending is None:
            dcp.save(state, checkpoint_id=folder)
            return
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._save_group is None:  # every process saves at the same step: they create it together
            self._save_group = torch.distributed.new_group(backend="gloo")
        stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                              use_async_staging=False, use_non_blocking_copy=False))
        try:
            staged = stager.stage(state)  # each local shard copied to the CPU, here: training changes them next
        finally:
            stager.close()
        pending.append(functools.partial(dcp.save, staged, checkpoint_id=folder, process_group=self._save_group))

    def model_state_dict(self, model: torch.nn.Module, folder: Path, full: bool, pending: list | None = None) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.sharded_state and not full:
            self._save_shards({"model": get_model_state_dict(model)}, folder / formats.MODEL_SHARDS_NAME, pending)
            return {}
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        first: dict[int, str] = {}  # tied parameters (GPT-2's lm_head and wte) come back as copies: tie them again,
        for name, p in model.named_parameters(remove_duplicate=False):  # so they are stored once, as unsharded
            name = _fqn(name)
            if id(p) in first and name in state:
                state[name] = state[first[id(p)]]
            first.setdefault(id(p), name)
        return state

    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
                             pending: list | None = None) -> dict | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        if self.sharded_state:
            self._save_shards({"optimizer": get_optimizer_state_dict(model, optimizer)},
                              folder / formats.OPTIMIZER_SHARDS_NAME, pending)
            return None
        state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if "param_groups" not in state:  # not the saving process: nothing gathered here
            return {}
        # parameter names -> their numbers in group order: the format of optimizer.state_dict()
        number = {name: i for i, name in enumerate(n for g in state["param_groups"] for n in g["params"])}
        return {"state": {number[name]: value for name, value in state["state"].items()},
                "param_groups": [{**g, "params": [number[n] for n in g["params"]]} for g in state["param_groups"]]}

    def load_model_weights(self, model: torch.nn.Module, folder: Path) -> None:
        from torch.distributed.fsdp import FSDPModule

        if (folder / formats.MODEL_SHARDS_NAME).is_dir():
            if not isinstance(model, FSDPModule):  # shards load into a sharded model: after prepare_model
                self.pending = folder
                return
            from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

            state = {"model": get_model_state_dict(model)}
            load_dcp(state, folder / formats.MODEL_SHARDS_NAME)  # no file in it can run code
            set_model_state_dict(model, state["model"])
        elif not isinstance(model, FSDPModule):
            formats.load_model_weights(model, folder)  # full weights, before sharding: sharding splits them
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            state = formats.read_model_weights(folder, torch.device("cpu"))
            set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        if (folder / formats.OPTIMIZER_SHARDS_NAME).is_dir():
            state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
            load_dcp(state, folder / formats.OPTIMIZER_SHARDS_NAME)  # no file in it can run code
            set_optimizer_state_dict(model, optimizer, state["optimizer"])
            return
        saved = formats.safe_load(folder / formats.OPTIMIZER_NAME)
        names = {id(p): _fqn(n) for n, p in model.named_parameters()}
        order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]  # numbers -> parameter names
        state = {"state": {order[i]: value for i, value in saved["state"].items()},
                 "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in saved["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
