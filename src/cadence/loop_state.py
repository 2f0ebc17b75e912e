"""The state of one ``train()`` call's loop: where the data is, what was summed since the last log,
the per-step values the loop's helpers share, and the run's final metrics (``train_loss``, speed, FLOPs).

``LoopState`` is what a checkpoint keeps of the loop (``loop_state.json``, through ``state_dict``),
so a resumed run logs exactly what an unbroken one logs; everything else on it lives only for the
run. ``BatchLayout`` is the one place where the global batch and the steps of an epoch are worked
out from the per-device batch, the accumulation and the number of processes.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from . import data
from .trainer_utils import estimate_mfu, has_length, speed_metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchLayout:
    """How the samples of one optimizer step are laid out: per-device batch x accumulation x processes.

    Example:
        >>> BatchLayout(8, 4, 2).global_batch, BatchLayout(8, 4, 2).steps_per_epoch(10)
        (64, 3)
    """

    train_batch_size: int
    gradient_accumulation_steps: int
    world_size: int

    @classmethod
    def from_args(cls, args: Any) -> BatchLayout:
        return cls(args.train_batch_size, args.gradient_accumulation_steps, args.world_size)

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all processes."""
        return self.train_batch_size * self.gradient_accumulation_steps * self.world_size

    def steps_per_epoch(self, batches: int) -> int:
        """Optimizer steps of an epoch of ``batches`` micro-batches per process (the last one may be shorter)."""
        return max(math.ceil(batches / self.gradient_accumulation_steps), 1)


def step_counts(args: Any, layout: BatchLayout, batches: int | None, dataset: Any) -> tuple[int, int, int | None]:
    """``(max_steps, num_train_epochs, micro-batches per epoch or None)`` of a run, transformers' rules: ``max_steps``
    when set, else ``num_train_epochs`` epochs of ``batches`` (None: a stream, trained for ``max_steps``).

    Raises:
        ValueError: an epoch without a batch (``dataloader_drop_last`` and fewer samples than a batch).
    """
    if batches is None:
        return args.max_steps, 2**62, None
    if batches == 0:
        raise ValueError(
            f"the training dataloader has no batch: {len(dataset)} samples with "
            f"per_device_train_batch_size={args.per_device_train_batch_size} and dataloader_drop_last=True; "
            "lower the batch size or set dataloader_drop_last=False"
        )
    steps_per_epoch = layout.steps_per_epoch(batches)
    if args.max_steps > 0:
        return args.max_steps, math.ceil(args.max_steps / steps_per_epoch), batches
    return math.ceil(args.num_train_epochs * steps_per_epoch), math.ceil(args.num_train_epochs), batches


def transformers_step_counts(args: Any, total_batch: int, batches: int | None, num_examples: Callable[[], int]
                             ) -> tuple[int, int, int, int, int, int | None, int]:
    """transformers' ``set_initial_training_values``: ``(num_train_epochs, num_update_steps_per_epoch, num_examples,
    num_train_samples, total_train_batch_size, steps_in_epoch, max_steps)`` of a run of ``batches`` micro-batches an
    epoch (None: a stream, which needs ``max_steps > 0`` and counts ``sys.maxsize`` epochs of ``max_steps`` steps).
    """
    ga = args.gradient_accumulation_steps
    if batches is not None:
        per_epoch = max(math.ceil(batches / ga), 1)
        max_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * per_epoch)
        examples = num_examples()
        if args.max_steps > 0:
            epochs, samples = math.ceil(max_steps / per_epoch), max_steps * total_batch
        else:
            epochs, samples = math.ceil(args.num_train_epochs), examples * args.num_train_epochs
        return epochs, per_epoch, examples, samples, total_batch, batches, max_steps
    if args.max_steps <= 0:
        raise ValueError(f"args.max_steps must be set to a positive value if dataloader does not have a length, "
                         f"was {args.max_steps}")
    max_steps = args.max_steps
    return sys.maxsize, max_steps, total_batch * max_steps, total_batch * max_steps, total_batch, max_steps * ga, max_steps


def data_identity(dataset: Any) -> dict[str, Any]:
    """What ``loop_state.json`` keeps of the training data to recognise it on resume: its length and,
    for a ``datasets.Dataset``, its fingerprint and a hash of a few rows (None where there are none)."""
    return {"num_samples": len(dataset) if has_length(dataset) else None,
            "fingerprint": getattr(dataset, "_fingerprint", None), "sample": data.content_sample(dataset)}


def data_states(loop: Any, dataloader: Any) -> dict[str, Any]:
    """What a checkpoint keeps of the data beside ``loop_state.json``: ``stream``, an iterable dataset's position
    (before the batch collated ahead, when one is pending; None when the dataset cannot say), and
    ``look_ahead_rng``, the RNG states that pending batch was drawn from (a resume draws it again from them).

    Args:
        loop: the running ``LoopState``, or None outside ``train()``.
        dataloader: the training dataloader (its dataset's own state when nothing is pending).
    """
    pending = getattr(getattr(loop, "batches", None), "before_pending", None) or {}
    return {"stream": data.SavedState(pending["stream"]) if pending.get("stream") is not None else
            data.stateful_stream(dataloader),
            "look_ahead_rng": pending.get("rng")}


class LoopState:
    """Every per-run value of the training loop; its ``state_dict`` is ``loop_state.json``.

    The loss is summed on the device between logs and read (one host sync) only when logging: each
    micro-batch's loss is only appended to a list (no device work on the hot path); the list is folded
    into the sums when a log reads it. With ``filter_nonfinite``, a step whose loss is non-finite on
    any process is counted and left out: the logged loss is the mean over the interval's finite steps,
    ``train_loss`` the mean over the run's finite steps.

    Args:
        backend: the run's ``Backend`` (device, cross-process sums).
        filter_nonfinite: ``logging_nan_inf_filter``.
        tokens: the input-token counter (``include_num_input_tokens_seen``).
        layout: this run's batch layout.
        batches_per_epoch: micro-batches of one epoch on this process (None for a stream).
        identity: what identifies the training data (its length and fingerprint), saved to refuse another.
    """

    FOLD_EVERY = 1024  # steps: bounds the list when nothing is logged for a long time

    def __init__(self, backend: Any, filter_nonfinite: bool, tokens: data.TokenCounter | None = None,
                 layout: BatchLayout | None = None, batches_per_epoch: int | None = None, identity: dict | None = None):
        device = backend.device
        self.backend = backend
        # ---- saved in loop_state.json
        self.sum = torch.zeros((), device=device, dtype=torch.float64)  # float32 would round long sums
        # non-finite steps of this log interval, the same count on every process
        self.nonfinite = torch.zeros((), device=device, dtype=torch.long) if filter_nonfinite else None
        self.nonfinite_total = 0  # non-finite steps of the logged intervals, for train_loss
        self.total = 0.0  # sum of the logged intervals, for train_loss
        self.last_logged_step = 0
        self.first_step = 0  # train_loss averages the steps from here (the resumed step when the sums were not saved)
        self.epoch, self.batches_in_epoch, self.batches_per_epoch = 0, 0, batches_per_epoch  # where the data is
        self.batches: Any = None  # the epoch's batch iterator (data.LookAhead): its pending batch's RNG states are saved
        self.layout = layout  # what the position is counted in
        self.identity = identity or {}  # the data the position is in
        # ---- this run only
        self.pending: list[torch.Tensor] = []
        self.pending_steps: list[int] = []  # micro-batches of each pending step
        self.tokens = tokens or data.TokenCounter("no")  # input tokens of this run, on the device
        self.tokens_stored = 0  # of those, how many are already in state.num_input_tokens_seen
        self.flos = 0.0  # this process's floating-point operations in this run
        self.resumed_step = 0  # the step this train() call started from
        self.initial_num_input_tokens_seen, self.initial_total_flos = 0, 0.0  # the state's counts at that step
        self.start_time = time.time()
        self.params: list[torch.nn.Parameter] = []  # read once, used every step (frozen ones have no grad)
        self.skipped = self.skipped_total = 0  # optimizer steps fp16 loss scaling skipped (inf/NaN gradients)
        self.count_items = False  # whether each step's items are counted (loss.counts_items decides)
        self.micro_batch_rows: int | None = None  # auto_find_batch_size: each batch cut into pieces of this many rows
        self.micro_batches = 0  # micro-batches of the current step
        self.items: torch.Tensor | None = None  # items of the current step over all processes (None: not counted)
        self.grad_norm: torch.Tensor | None = None  # of the last step (None without clipping)
        self.learning_rate = 0.0  # used by the last step

    def begin(self, state: Any, params: list[torch.nn.Parameter]) -> None:
        """Start the clock and note where the run starts (``state``: the ``TrainerState``, resumed or fresh)."""
        self.resumed_step = state.global_step
        self.initial_num_input_tokens_seen, self.initial_total_flos = state.num_input_tokens_seen, state.total_flos
        self.params = params
        self.start_time = time.time()

    def count(self, window: list, floating_point_ops: Callable) -> None:
        """Input tokens and FLOPs of one step's batches (no host sync)."""
        for inputs in window:
            self.tokens.add(inputs)
            self.flos += floating_point_ops(inputs)

    def store_counts(self, state: Any) -> None:
        """Tokens and FLOPs of all processes into ``state`` (a host sync: only when logging or saving)."""
        counted = int(self.backend.reduce_sum_data_parallel(self.tokens.total(self.backend.device)).item())
        # added, not assigned: a subclass's own additions to the state (TRL's GRPO counts its tokens) are kept
        state.num_input_tokens_seen += counted - self.tokens_stored
        self.tokens_stored = counted
        flos = torch.tensor(self.flos, dtype=torch.float64, device=self.backend.device)
        state.total_flos = self.initial_total_flos + self.backend.reduce_sum_data_parallel(flos).item()

    def final_metrics(self, state: Any, total_train_batch_size: int, count_tokens: bool,
                      world_size: int) -> tuple[float, dict[str, Any]]:
        """The run's ``train_loss`` and its ``train_*`` metrics, once the run ended (the last interval closed and
        the counts stored into ``state``, the ``TrainerState``).

        Args:
            state: the run's ``TrainerState``.
            total_train_batch_size: samples per optimizer step over all processes.
            count_tokens: report ``train_tokens_per_second`` (``include_num_input_tokens_seen``).
            world_size: processes (for the MFU).

        Returns:
            ``(train_loss, metrics)``: the mean loss over the run's finite steps (after a resume from a checkpoint
            without cadence's sums: this call's steps), and runtime, speed, ``total_flos``, ``train_mfu`` (on GPUs
            of known peak), ``train_loss`` and the skipped or non-finite step counts when there were any.
        """
        self.close_interval()  # the steps since the last log count in train_loss
        self.store_counts(state)
        steps, bad = max(state.global_step - self.first_step, 1), self.nonfinite_total
        train_loss = self.mean(self.total, steps, bad)  # over the finite steps
        if bad == steps:
            logger.warning("train_loss is NaN: the loss of every one of the %d steps was non-finite", steps)
        steps = state.global_step - self.resumed_step  # speed counts this call's steps only
        tokens = state.num_input_tokens_seen - self.initial_num_input_tokens_seen
        metrics = speed_metrics("train", self.start_time, num_samples=steps * total_train_batch_size, num_steps=steps,
                                num_tokens=tokens if count_tokens else None)
        metrics["total_flos"] = state.total_flos
        mfu = estimate_mfu(state.total_flos - self.initial_total_flos, metrics["train_runtime"], self.backend.device,
                           world_size)
        if mfu is not None:  # on GPUs of known peak only
            metrics["train_mfu"] = mfu
        metrics["train_loss"] = train_loss
        skipped = self.skipped_total + self.skipped
        if skipped:
            metrics["train_skipped_optimizer_steps"] = skipped
        if bad:
            metrics["train_nonfinite_losses"] = bad  # steps left out of train_loss
        return train_loss, metrics

    def interval_logs(self, global_step: int) -> dict[str, Any]:
        """The training log of the steps since the last log: their mean ``loss`` over the finite ones (the one host
        sync of a log), and how many were non-finite or skipped by fp16 loss scaling (warned), when any."""
        interval_loss, bad = self.close_interval()
        steps = global_step - self.last_logged_step
        logs: dict[str, Any] = {"loss": self.mean(interval_loss, steps, bad)}
        if bad:
            logs["nonfinite_losses"] = bad
            logger.warning("%d of %d steps (%d-%d) had a non-finite loss: left out of the logged loss (the mean "
                           "of the others%s)", bad, steps, self.last_logged_step + 1, global_step,
                           "; none was finite, so it is NaN" if bad == steps else "")
        if self.skipped:
            logs["skipped_optimizer_steps"] = self.skipped
            logger.warning("fp16 loss scaling skipped %d optimizer step(s) with inf/NaN gradients in steps %d-%d",
                           self.skipped, self.last_logged_step + 1, global_step)
            self.skipped_total += self.skipped
            self.skipped = 0
        return logs

    def state_dict(self) -> dict[str, Any]:
        """Plain numbers (a float64 goes through JSON exactly); sums over processes (a collective)."""
        self.fold()
        nonfinite = 0 if self.nonfinite is None else int(self.nonfinite.item())
        layout = asdict(self.layout) if self.layout is not None else {}
        return {"loss_sum": self.backend.reduce_mean(self.sum.clone()).item(), "nonfinite": nonfinite, "total": self.total,
                "nonfinite_total": self.nonfinite_total,
                "last_logged_step": self.last_logged_step, "first_step": self.first_step, "epoch": self.epoch,
                "batches_in_epoch": self.batches_in_epoch, "batches_per_epoch": self.batches_per_epoch,
                **layout, **self.identity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The sums of a saved ``state_dict`` (the position is read by ``checkpoint.load``)."""
        self.sum.fill_(state["loss_sum"])  # every process: the logged value is their mean
        if self.nonfinite is not None:  # a count of steps, the same on every process
            self.nonfinite.fill_(state["nonfinite"])
        self.total, self.last_logged_step, self.first_step = state["total"], state["last_logged_step"], state["first_step"]
        self.nonfinite_total = state.get("nonfinite_total", 0)

    def add(self, micro_batch_losses: list[torch.Tensor]) -> None:
        """One optimizer step's micro-batch losses (their sum is the step's loss on this process)."""
        self.pending.extend(micro_batch_losses)
        self.pending_steps.append(len(micro_batch_losses))
        if len(self.pending_steps) >= self.FOLD_EVERY:  # a step count: every process folds at the same step
            self.fold()

    def fold(self) -> None:
        """Move the pending losses into the sums; never let one NaN hide the others, but count its step."""
        if not self.pending:
            return
        losses = torch.stack(self.pending).double()  # summed in float64, like the running sum
        sizes = torch.tensor(self.pending_steps, device=losses.device)
        self.pending.clear()
        self.pending_steps.clear()
        if self.nonfinite is not None:
            step_of = torch.arange(len(sizes), device=losses.device).repeat_interleave(sizes)
            steps = losses.new_zeros(len(sizes)).index_add_(0, step_of, losses)
            # a step is left out on every process when it is non-finite on any (a collective, no host sync)
            bad = self.backend.reduce_sum((~torch.isfinite(steps)).long()) > 0
            self.nonfinite += bad.sum()
            losses = steps.masked_fill(bad, 0.0)
        self.sum += losses.sum()

    def close_interval(self) -> tuple[float, int]:
        """End the interval since the last log: returns its loss sum (the mean over processes; one host sync)
        and its non-finite step count, adds both to the run's totals (for ``train_loss``) and starts a new one."""
        self.fold()
        loss_sum = self.backend.reduce_mean(self.sum).item()
        nonfinite = 0 if self.nonfinite is None else int(self.nonfinite.item())
        self.total += loss_sum
        self.nonfinite_total += nonfinite
        self.sum.zero_()
        if self.nonfinite is not None:
            self.nonfinite.zero_()
        return loss_sum, nonfinite

    @staticmethod
    def mean(loss_sum: float, steps: int, nonfinite: int) -> float:
        """``loss_sum`` over the finite ones of ``steps``; NaN when none was finite."""
        finite = steps - nonfinite
        return loss_sum / finite if finite > 0 else float("nan")
