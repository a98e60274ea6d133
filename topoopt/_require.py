"""Input checks shared by every public entry point; each raises one ConfigError line.

A value of the wrong kind for a config field or a scalar parameter is a
:class:`~topoopt.errors.ConfigError` (the user typed it); an argument of the wrong type
in a library call (a path where a :class:`~topoopt.cluster.Cluster` goes) is a
``TypeError`` naming the parameter and what to pass instead.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence, TypeVar

from topoopt.errors import ConfigError

__all__ = ["require_int", "require_positive", "require_fraction", "require_between",
           "require_bool", "require_choice", "require_keys", "require_seed", "require_table",
           "require_names", "require_instance", "require_callable", "MAX_SEED"]

#: Seeds are 0 .. 2**32 - 1 (numpy's legacy seeding range; negative seeds are refused).
MAX_SEED = 2 ** 32 - 1

T = TypeVar("T")


def require_int(field: str, value: object, minimum: int | None = None,
                maximum: int | None = None) -> int:
    """``value`` must be an int (not bool) within ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, value, "must be an integer")
    if minimum is not None and value < minimum:
        raise ConfigError(field, value, f"must be an integer >= {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(field, value, f"must be an integer <= {maximum}")
    return value


def require_seed(field: str, value: object) -> int:
    """``value`` must be a seed: an integer in 0 .. :data:`MAX_SEED`."""
    return require_int(field, value, minimum=0, maximum=MAX_SEED)


def require_positive(field: str, value: object, allow_zero: bool = False) -> float:
    """``value`` must be a finite number > 0 (or >= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(field, value, "must be a finite number")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(field, value, "must be >= 0" if allow_zero else "must be > 0")
    return float(value)


def require_fraction(field: str, value: object) -> float:
    """``value`` must be a number in (0, 1]."""
    fraction = require_positive(field, value)
    if fraction > 1:
        raise ConfigError(field, value, "must be a fraction in (0, 1]")
    return fraction


def require_between(field: str, value: object, low: float, high: float, *,
                    low_open: bool = False, high_open: bool = False, what: str = "a number",
                    hint: str = "") -> float:
    """``value`` must be a number between ``low`` and ``high`` (each end included
    unless ``low_open`` / ``high_open``); ``hint`` ends the message, e.g. ``e.g. 0.01``."""
    span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    allowed = f"must be {what} in {span}" + (f", {hint}" if hint else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, allowed)
    if not ((low < value if low_open else low <= value)
            and (value < high if high_open else value <= high)):
        raise ConfigError(field, value, allowed)
    return float(value)


def require_bool(field: str, value: object) -> bool:
    """``value`` must be ``True`` or ``False`` (not a string or a number)."""
    if not isinstance(value, bool):
        raise ConfigError(field, value, "must be true or false")
    return value


def require_choice(field: str, value: object, choices: Sequence[str]) -> str:
    """``value`` must be one of ``choices``."""
    if value not in choices:
        raise ConfigError(field, value, f"use one of {', '.join(map(str, choices))}")
    return value  # type: ignore[return-value]  # one of the strings in choices


def require_keys(section: str, table: Mapping[str, Any], allowed: Sequence[str]) -> None:
    """Every key of ``table`` must be in ``allowed`` (catches typos in configs)."""
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{section}.{key}" if section else key, table[key],
                              f"unknown key; allowed keys are {', '.join(allowed)}")


def require_table(field: str, value: object, example: str) -> Mapping[str, Any]:
    """``value`` must be a table (a mapping), e.g. ``example``."""
    if not isinstance(value, Mapping):
        raise ConfigError(field, value, f"must be a table, e.g. {example}")
    return value


def require_names(field: str, value: object, allowed: Sequence[str] | None = None,
                  example: str = "") -> tuple[str, ...]:
    """``value`` must be a list of names, each once (each in ``allowed`` when given);
    a single string is refused rather than read letter by letter."""
    listed = f"; use some of {', '.join(allowed)}" if allowed is not None else ""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(field, value, f"must be a list of names, e.g. {example}{listed}"
                          if example else f"must be a list of names{listed}")
    for name in value:
        if not isinstance(name, str) or (allowed is not None and name not in allowed):
            raise ConfigError(field, name, f"use some of {', '.join(allowed)}"
                              if allowed is not None else "must be a name (a string)")
    if len(set(value)) != len(value):
        raise ConfigError(field, list(value), "list each name once")
    return tuple(value)


def require_instance(name: str, value: object, kind: type[T], fix: str = "") -> T:
    """``value`` must be a ``kind``; else a ``TypeError`` naming the parameter ``name``,
    the type it got and ``fix`` (what to pass instead)."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, not {type(value).__name__}"
                        + (f": {fix}" if fix else ""))
    return value


def require_callable(name: str, value: object) -> None:
    """``value`` must be ``None`` or callable (a ``TypeError`` naming ``name``)."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, not {type(value).__name__}")
