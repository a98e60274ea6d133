"""Typed fields of ``plan.json``: each reader takes a field by its dotted name and says,
in one line, which field is missing or mangled and what it must be.

The checkers of every plan kind (:mod:`topoopt.plans.check`, :mod:`topoopt.plans.llm`)
and the readers of :mod:`topoopt.plans.common` read ``plan.json`` through these, so a
bad document is a :class:`~topoopt.errors.PlanCheckError` naming the field (never a
Python exception's repr).
"""

from __future__ import annotations

import math
from typing import Any

from topoopt.errors import PlanCheckError

__all__ = ["show", "bad_field", "required", "as_table", "as_list", "as_int", "as_number",
           "as_bool", "as_str", "check_same", "check_same_table"]


def show(value: object) -> str:
    """A value as an error message quotes it: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def bad_field(where: str, value: object, allowed: str) -> PlanCheckError:
    """The error (to raise) for field ``where`` holding ``value``: ``allowed`` says what
    it must be instead."""
    return PlanCheckError(f"plan.json {where} = {show(value)}: {allowed}")


def required(table: Any, key: str, where: str) -> Any:
    """``table[key]``, where ``table`` must be a JSON object that has ``key`` (the
    field ``where``)."""
    if not isinstance(table, dict):
        raise bad_field(where.rsplit(".", 1)[0] if "." in where else where, table,
                        "must be a table")
    if key not in table:
        raise PlanCheckError(f"plan.json has no {where}")
    return table[key]


def as_table(value: Any, where: str, keys: tuple[str, ...] | None = None,
             optional: tuple[str, ...] = ()) -> dict:
    """``value`` must be a JSON object; with ``keys``, exactly those (and ``optional``)."""
    if not isinstance(value, dict):
        raise bad_field(where, value, "must be a table")
    if keys is not None:
        for k in keys:
            if k not in value:
                raise PlanCheckError(f"plan.json has no {where}.{k}" if where else
                                     f"plan.json has no {k}")
        for k in value:
            if k not in keys and k not in optional:
                raise bad_field(f"{where}.{k}" if where else k, value[k],
                                f"unknown key; {where or 'plan.json'} has "
                                f"{', '.join(keys + optional)}")
    return value


def as_list(value: Any, where: str) -> list:
    """``value``, which must be a JSON list."""
    if not isinstance(value, list):
        raise bad_field(where, value, "must be a list")
    return value


def as_int(value: Any, where: str, low: int | None = None, high: int | None = None) -> int:
    """``value``, which must be an integer (not a bool) in ``low..high`` (either optional)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_field(where, value, "must be an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        span = (f"in {low}..{high}" if low is not None and high is not None
                else f">= {low}" if low is not None else f"<= {high}")
        raise bad_field(where, value, f"must be an integer {span}")
    return value


def as_number(value: Any, where: str, positive: bool = False) -> float:
    """A finite number, >= 0 (> 0 with ``positive``)."""
    number = math.nan
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:   # an integer past float's range (JSON allows 1e400 digits)
            pass
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise bad_field(where, value, f"must be a finite number {'>' if positive else '>='} 0")
    return number


def as_bool(value: Any, where: str) -> bool:
    """``value``, which must be true or false."""
    if not isinstance(value, bool):
        raise bad_field(where, value, "must be true or false")
    return value


def as_str(value: Any, where: str) -> str:
    """``value``, which must be a string."""
    if not isinstance(value, str):
        raise bad_field(where, value, "must be a string")
    return value


def check_same(value: float, derived: float, where: str, what: str) -> None:
    """A stored number must equal the one re-derived from the checked fields."""
    if not math.isclose(value, derived, rel_tol=1e-6, abs_tol=1e-12):
        raise bad_field(where, value, f"but {what} gives {derived:.6g}")


def check_same_table(stored: Any, derived: dict, where: str, what: str) -> None:
    """A stored table must have exactly the keys of ``derived``, each number equal to
    the derived one (:func:`check_same`) and every other value identical."""
    t = as_table(stored, where, tuple(derived))
    for k, v in derived.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            check_same(as_number(t[k], f"{where}.{k}"), v, f"{where}.{k}", what)
        elif t[k] != v:
            raise bad_field(f"{where}.{k}", t[k], f"but {what} gives {v}")
