"""Optimizers and learning-rate schedules, at the names users import from ``transformers.optimization``.

Two dispatch tables drive everything:

- ``SCHEDULERS``: ``lr_scheduler_type`` string -> how to build the schedule (which step counts it
  needs, which ``lr_scheduler_kwargs`` it accepts). ``get_scheduler`` reads it.
- ``OPTIMIZERS``: ``optim`` string -> ``entry(args, model=None) -> (optimizer_cls, kwargs)``.
  ``create_optimizer`` reads it after splitting the parameters into a weight-decay group and a
  no-decay group.

Every schedule multiplies the optimizer's initial lr by a factor computed by a module-level function
bound with ``functools.partial`` (not a lambda), so ``LambdaLR.state_dict()`` holds only numbers and
a ``scheduler.pt`` loads with ``torch.load(weights_only=True)``, from either library. The factors are
the same floating-point expressions as transformers', so the per-step learning rates are identical.

Modules, each importing only the ones before it: ``options`` (``optim_args``), ``requirements`` (the package each
optimizer needs), ``greedy`` (GreedyLR), ``schedules``, ``adafactor``, ``parameter_groups``, ``packages``
(bitsandbytes, torchao, schedule-free, ...), ``low_rank`` (GaLore, APOLLO, layer-wise), ``lomo``, ``optimizers``
(the ``optim`` table, ``create_optimizer``). Every name is importable from ``cadence.optimization``.
"""

from ..trainer_utils import SchedulerType  # noqa: F401 - transformers.optimization has it too
from .options import (  # noqa: F401
    parse_optim_args,
)
from .requirements import (  # noqa: F401
    _OPTIONAL_PACKAGES, _package_available,
)
from .greedy import (  # noqa: F401
    get_greedy_schedule, GreedyLR, METRIC_SCHEDULERS, steps_on_metric,
)
from .schedules import (  # noqa: F401
    get_constant_schedule, get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
    get_cosine_with_hard_restarts_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup_lr_rate, get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup, get_polynomial_decay_schedule_with_warmup, get_reduce_on_plateau_schedule,
    get_scheduler, get_wsd_schedule, SCHEDULERS, TYPE_TO_SCHEDULER_FUNCTION,
)
from .adafactor import (  # noqa: F401
    Adafactor, AdafactorSchedule, get_adafactor_schedule,
)
from .parameter_groups import (  # noqa: F401
    get_decay_parameter_names, get_parameter_groups, get_parameter_names, optimizer_group,
)
from .low_rank import (  # noqa: F401
    LayerwiseOptimizer, _LOW_RANK,
)
from .optimizers import (  # noqa: F401
    check_optimizer, create_optimizer, eval_weights, get_optimizer_cls_and_kwargs, is_optimizer_factory,
    OPTIMIZERS, set_optimizer_mode, _NOT_BUILT,
)

__all__ = [
    "Adafactor",
    "AdafactorSchedule",
    "GreedyLR",
    "LayerwiseOptimizer",
    "OPTIMIZERS",
    "SCHEDULERS",
    "TYPE_TO_SCHEDULER_FUNCTION",
    "check_optimizer",
    "create_optimizer",
    "get_adafactor_schedule",
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
    "get_decay_parameter_names",
    "get_greedy_schedule",
    "get_inverse_sqrt_schedule",
    "get_linear_schedule_with_warmup",
    "get_optimizer_cls_and_kwargs",
    "get_parameter_groups",
    "get_parameter_names",
    "get_polynomial_decay_schedule_with_warmup",
    "get_reduce_on_plateau_schedule",
    "get_scheduler",
    "get_wsd_schedule",
    "eval_weights",
    "is_optimizer_factory",
    "parse_optim_args",
    "set_optimizer_mode",
]
