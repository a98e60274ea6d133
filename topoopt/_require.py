"""Input checks shared by every public entry point; each raises one ConfigError line."""

from __future__ import annotations

import math
from typing import Sequence

from topoopt.errors import ConfigError

__all__ = ["require_int", "require_positive", "require_fraction", "require_choice",
           "require_keys"]


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


def require_positive(field: str, value: object, allow_zero: bool = False) -> float:
    """``value`` must be a finite number > 0 (or >= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(field, value, "must be a finite number")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(field, value, "must be >= 0" if allow_zero else "must be > 0")
    return float(value)


def require_fraction(field: str, value: object) -> float:
    """``value`` must be a number in (0, 1]."""
    require_positive(field, value)
    if value > 1:
        raise ConfigError(field, value, "must be a fraction in (0, 1]")
    return float(value)


def require_choice(field: str, value: object, choices: Sequence[str]) -> str:
    """``value`` must be one of ``choices``."""
    if value not in choices:
        raise ConfigError(field, value, f"use one of {', '.join(map(str, choices))}")
    return value  # type: ignore[return-value]


def require_keys(section: str, table: dict, allowed: Sequence[str]) -> None:
    """Every key of ``table`` must be in ``allowed`` (catches typos in configs)."""
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{section}.{key}" if section else key, table[key],
                              f"unknown key; allowed keys are {', '.join(allowed)}")
