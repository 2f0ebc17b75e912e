"""Processes and rendezvous: the process group started and ended, accelerate's process state, ranks, collectives."""


from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import time
from datetime import timedelta
from typing import Any, Callable

import torch


from .devices import accelerator_available


def _destroy_process_group() -> None:
    """End the process group cadence started (at exit): its gloo/NCCL threads stop before the interpreter
    tears down, instead of "terminate called without an active exception" after the work is done."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # a Trainer lives in reference cycles: collect the unreachable ones now, so their DDP wrappers
        # release the group here, not at some point of the interpreter's teardown
        gc.collect()
        torch.distributed.destroy_process_group()


def _end_at_exit_if_started(start: Callable[[], Any]) -> Any:
    """Run ``start`` (which may create the process group); a group it created is ours to end at exit: one left to
    the interpreter's teardown can abort the process. Whichever of ``main_process_first`` and ``Backend`` comes
    first creates the group, so both come through here."""
    started_here = not torch.distributed.is_initialized()
    result = start()
    if started_here and torch.distributed.is_initialized():
        atexit.unregister(_destroy_process_group)  # once, however many times a group is started
        atexit.register(_destroy_process_group)
    return result


def find_unused_parameters(args: Any, model: torch.nn.Module | None) -> bool:
    """DDP's ``find_unused_parameters``: ``args.ddp_find_unused_parameters`` when set, else transformers' rule: a
    transformers model finds them unless it checkpoints activations (reentrant checkpointing breaks the search),
    any other module finds them (a model with a parameter the loss never reaches, such as BERT's pooler under a
    token-level head, then trains on several processes as on transformers)."""
    if args.ddp_find_unused_parameters is not None:
        return bool(args.ddp_find_unused_parameters)
    hf = sys.modules.get("transformers")  # a transformers model implies the module is loaded
    if hf is not None and isinstance(model, hf.PreTrainedModel):
        return not (getattr(model, "is_activation_checkpointing", False) or args.activation_checkpointing)
    return True


def _process_group_options(args: Any) -> dict[str, Any]:
    """``init_process_group``'s options for this run, the same wherever the group is started (``Backend``,
    ``main_process_first``, ``trainer.accelerator``): ``ddp_backend``, ``ddp_timeout`` and, in a job torchrun
    restarted on one node, a rendezvous of this attempt's own (see ``_attempt_rendezvous``)."""
    options: dict[str, Any] = {"backend": args.ddp_backend, "timeout": timedelta(seconds=args.ddp_timeout)}
    if _restarted_on_torchruns_shared_store():
        from torch.distributed.rendezvous import register_rendezvous_handler

        with contextlib.suppress(RuntimeError):  # registered already (torch refuses a second registration)
            register_rendezvous_handler(_ATTEMPT_SCHEME, _attempt_rendezvous)
        options["init_method"] = f"{_ATTEMPT_SCHEME}://"
    return options


_ATTEMPT_SCHEME = "cadence-torchrun-attempt"


def _restarted_on_torchruns_shared_store() -> bool:
    """A worker whose process group would be set up through torchrun's shared TCPStore, where a killed attempt's keys
    may be: a restarted one on one node (``TORCHELASTIC_RESTART_COUNT > 0``), or any on several nodes. torchrun keeps
    that one store for every attempt of the job (torch 2.13 here), and gloo's and NCCL's setup keys carry no attempt:
    a restarted rank that reads its peer's key before the peer wrote it again gets the address of the killed attempt's
    process, and the connect fails ("Connection refused", "Connect timeout";
    https://github.com/pytorch/pytorch/issues/135712). The attempt count is the same for every worker of one agent, so
    on one node it names the attempt for all of them; across nodes each agent counts its own restarts (a healthy node's
    agent counts none when another node's process died), so the workers agree on a name through the store itself
    (:func:`_agreed_attempt`), on the first attempt too (a node's count of 0 does not say that no attempt came
    before)."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return False
    return env.get("GROUP_WORLD_SIZE", "1") != "1" or env.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0")


def _attempt_rendezvous(url: str, **kwargs: Any):
    """torch's ``env://`` rendezvous, with the store's keys under this attempt's own prefix: the process group's
    setup never reads a key a killed attempt left in torchrun's store."""
    from torch.distributed.rendezvous import rendezvous

    store, rank, world_size = next(rendezvous("env" + url[len(_ATTEMPT_SCHEME):], **kwargs))
    if os.environ.get("GROUP_WORLD_SIZE", "1") == "1":
        prefix = f"cadence/torchrun_attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}"
    else:
        timeout = kwargs.get("timeout") or timedelta(minutes=30)
        prefix = f"cadence/torchrun_start_{_agreed_attempt(store, rank, world_size, timeout)}"
    yield torch.distributed.PrefixStore(prefix, store), rank, world_size


def _agreed_attempt(store: Any, rank: int, world_size: int, timeout: timedelta) -> int:
    """A number naming this attempt of the job, the same on every process, through torchrun's store (whose keys of
    earlier attempts stay): keys are read only where they cannot be an earlier attempt's. Each rank counts its own
    starts (``starts/R``, an atomic add: its count is new), and waits for rank 0's answer under that count; rank 0
    names the attempt by its own count (new too), and answers each rank under the rank's current count until the
    rank acknowledges that name, so an answer written before the rank started this attempt is written again."""
    mine = store.add(f"cadence/starts/{rank}", 1)
    if rank != 0:
        store.wait([f"cadence/answer/{rank}/{mine}"], timeout)
        attempt = int(store.get(f"cadence/answer/{rank}/{mine}"))
        store.set(f"cadence/ack/{rank}/{attempt}", b"1")
        return attempt
    waiting, deadline = set(range(1, world_size)), time.monotonic() + timeout.total_seconds()
    while waiting:
        for other in sorted(waiting):
            if store.check([f"cadence/ack/{other}/{mine}"]):
                waiting.discard(other)
            else:
                store.set(f"cadence/answer/{other}/{store.add(f'cadence/starts/{other}', 0)}", str(mine).encode())
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"process(es) {sorted(waiting)} did not join the process group's set-up within "
                               f"{timeout.total_seconds():g}s (ddp_timeout)")
        if waiting:
            time.sleep(0.01)
    return mine


# what torch.distributed's transports say when a peer is gone or silent (gloo raises plain RuntimeErrors)
_COLLECTIVE_FAILURES = ("connection closed by peer", "connection reset by peer", "timed out", "timeout", "gloo", "nccl",
                        "broken pipe", "socket")


def _is_collective_failure(error: BaseException) -> bool:
    dist_error = getattr(torch.distributed, "DistError", ())
    if dist_error and isinstance(error, dist_error):
        return True
    return isinstance(error, RuntimeError) and any(word in str(error).lower() for word in _COLLECTIVE_FAILURES)


def process_state(args: Any):
    """accelerate's ``PartialState`` with the run's settings (``TrainingArguments.distributed_state``)."""
    from accelerate import PartialState

    return _end_at_exit_if_started(lambda: PartialState(cpu=_on_cpu(args), **_process_group_options(args)))


def _on_cpu(args: Any) -> bool:
    """Whether accelerate is told ``cpu=True``: with ``use_cpu``, and on a machine without a GPU, where accelerate
    (1.16) would otherwise set up no distributed state at all under torchrun (each process then trains alone, its
    reductions doing nothing: transformers' runs have that bug)."""
    return args.use_cpu or not accelerator_available()


def require_configured_state(args: Any) -> None:
    """``accelerator_config={"use_configured_state": True}``: on several processes accelerate's state must exist
    already (transformers' rule); it is then the run's ``distributed_state``. One process needs none: cadence never
    resets the state, so there is nothing to keep (sentence-transformers builds such arguments inside its Trainer)."""
    from accelerate import PartialState

    if not PartialState._shared_state and args.world_size > 1:
        raise ValueError(
            "accelerator_config use_configured_state=True is invalid here: no accelerate PartialState or "
            "AcceleratorState was created before the TrainingArguments; create one first (accelerate.PartialState()) "
            "or remove use_configured_state")
    if args.deepspeed and PartialState().distributed_type.value != "DEEPSPEED":
        raise ValueError("accelerator_config use_configured_state=True with deepspeed is invalid: the configured "
                         "accelerate state was not set up for DeepSpeed; remove use_configured_state")


def accelerate_state(args: Any):
    """accelerate's ``AcceleratorState`` on one process, as transformers' ``Accelerator`` leaves it: libraries built on
    the Trainer call accelerate's helpers that read it (``set_seed(seed, device_specific=True)``)."""
    from accelerate.state import AcceleratorState

    process_state(args)  # the process group with the run's options, before AcceleratorState reuses it
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "no"
    # _from_accelerator: accelerate refuses to build it outside an Accelerator, which one process here never makes
    from accelerate.utils import TorchDynamoPlugin

    shared = AcceleratorState._shared_state
    if shared and (shared.get("_mixed_precision") != precision or shared.get("device") != args.device):
        # an earlier run in this process set it otherwise; transformers resets it for each run's arguments too
        AcceleratorState._reset_state()
    return AcceleratorState(cpu=_on_cpu(args), mixed_precision=precision, dynamo_plugin=TorchDynamoPlugin(),
                            _from_accelerator=True)


def main_process_first(args: Any, local: bool = True):
    """accelerate's "main process goes first" barrier (``TrainingArguments.main_process_first``).

    accelerate's process state is created here with the run's ``ddp_backend`` and ``ddp_timeout``, the same
    ones ``Backend``'s ``Accelerator`` asks for; whichever comes first creates it, the other reuses it.
    """
    state = process_state(args)
    return state.local_main_process_first() if local else state.main_process_first()


def process_group_size_and_rank() -> tuple[int, int] | None:
    """``(world size, rank)`` of the started process group, or None when none is started."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    return torch.distributed.get_world_size(), torch.distributed.get_rank()


def shard_batch_sampler(batch_sampler: Any, num_processes: int, process_index: int, even_batches: bool = True) -> Any:
    """accelerate's ``BatchSamplerShard`` over ``batch_sampler``: of every ``num_processes`` batches, process
    ``process_index`` takes its own; the last round is completed from the epoch's first indices (``even_batches``).
    What ``Accelerator.prepare`` deals a transformers Trainer's training dataloader (never ``split_batches``: cadence
    refuses it)."""
    from accelerate.data_loader import BatchSamplerShard

    return BatchSamplerShard(batch_sampler, num_processes=num_processes, process_index=process_index,
                             split_batches=False, even_batches=even_batches)


def any_process(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` is True on any process (a max all-reduce of one number on ``device``; a collective when a
    process group is started, so every process must call it); ``flag`` itself without a process group."""
    if process_group_size_and_rank() is None:
        return bool(flag)
    combined = torch.tensor([1.0 if flag else 0.0], device=device)
    torch.distributed.all_reduce(combined, op=torch.distributed.ReduceOp.MAX)
    return bool(combined.item())


def every_process(obj: Any) -> list:
    """Every process's ``obj`` (picklable), in rank order: a collective over the whole process group (every process
    must call it), ``[obj]`` without one. How the processes of a job on several machines see one another's disk and
    environment before they take a decision that steers collectives (which checkpoint to resume, is this a restart)."""
    if process_group_size_and_rank() is None:
        return [obj]
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, obj)
    return gathered
