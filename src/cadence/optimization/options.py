"""Options: ``optim_args`` parsed, and each optimizer's options read and checked."""


from __future__ import annotations

import logging
import math
from typing import Any, Callable


logger = logging.getLogger(__name__)


def _as_name(value: Any) -> str:
    """A plain string from a str or a str-Enum member (``SchedulerType.LINEAR`` -> ``"linear"``)."""
    return str(getattr(value, "value", value))


# =============================================================================================
# optim_args and the optimizer table
# =============================================================================================


def _convert_value(text: str) -> Any:
    """"True"/"False" -> bool, "3" -> int, "1e-3" -> float, anything else stays a string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_optim_args(optim_args: str | None) -> dict[str, Any]:
    """Parse ``TrainingArguments.optim_args`` ("k=v,k2=v2") into a dict of typed values.

    Spaces are ignored (as in transformers) and values become bool, int or float when they read as
    one. Empty entries (a trailing comma) are skipped.

    Args:
        optim_args: the string, or None.

    Returns:
        The options.

    Example:
        >>> parse_optim_args("momentum=0.9, nesterov=True, rank=8, proj_type=std")
        {'momentum': 0.9, 'nesterov': True, 'rank': 8, 'proj_type': 'std'}
    """
    if not optim_args:
        return {}
    options: dict[str, Any] = {}
    for entry in optim_args.replace(" ", "").split(","):
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        if not key or not sep or "=" in value:
            raise ValueError(
                f"optim_args={optim_args!r} is invalid: the entry {entry!r} is not key=value; write e.g. "
                "optim_args='momentum=0.9,nesterov=True'"
            )
        options[key] = _convert_value(value)
    return options


def _as_bool(value: Any) -> bool:
    # HfArgumentParser's words; anything else ("maybe") is an error, never a silent False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "t", "y", "false", "0", "no", "f", "n"):
        return value.lower() in ("true", "1", "yes", "t", "y")
    raise ValueError("not True or False")


def _finite_float(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not finite")
    return number


def _finite_int(value: Any) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise ValueError("not a whole number")
    return int(value)


# converter -> what a value must be, for the error message
_CONVERTED = {_as_bool: "True or False", _finite_float: "a finite number", _finite_int: "a whole number"}


def _optim_options(args: Any, name: str, converters: dict[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """The optim_args this optimizer reads, converted; the rest are reported (transformers drops them)."""
    options = parse_optim_args(getattr(args, "optim_args", None))
    ignored = sorted(set(options) - set(converters))
    if ignored:
        logger.warning("optim=%r ignores optim_args %s (it reads %s)", name, ignored, sorted(converters))
    converted = {}
    for key, convert in converters.items():
        if key in options:
            try:
                converted[key] = convert(options[key])
            except (TypeError, ValueError):
                raise ValueError(
                    f"optim_args {key}={options[key]!r} is invalid for optim={name!r}: it must be "
                    f"{_CONVERTED.get(convert, 'a ' + getattr(convert, '__name__', 'value'))}; fix it in "
                    f"optim_args={getattr(args, 'optim_args', None)!r}"
                ) from None
    return converted


def _adam_options(args: Any) -> dict[str, Any]:
    return {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
