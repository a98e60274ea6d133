"""User-defined models from a list of operator tables (``[[job.operators]]`` in TOML)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence, TypeGuard

from topoopt.errors import ConfigError
from topoopt.model import OP_KINDS, Model, Operator

__all__ = ["OPERATOR_KEYS", "custom_model"]

#: Keys an operator table may have; ``name`` and ``kind`` are required.
OPERATOR_KEYS = ("name", "kind", "params", "fwd_flops", "bwd_flops", "out_elems", "inputs",
                 "mem_elems")
_INT_KEYS = ("params", "out_elems", "mem_elems")
_FLOAT_KEYS = ("fwd_flops", "bwd_flops")
_FIELD = "job.operators"


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(where: str, value: object) -> int:
    if not _is_int(value) or value < 0:
        hint = ""
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            hint = f" (write {int(value)}, not {value!r})"
        raise ConfigError(where, value, f"must be an integer >= 0{hint}")
    return int(value)


def _flops(where: str, value: object) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise ConfigError(where, value, "must be a finite number >= 0 (FLOPs per sample)")
    return float(value)


def _operator(i: int, table: object, seen: Mapping[str, int]) -> Operator:
    """Validate table ``i``; ``seen`` maps earlier operator names to their index."""
    where = f"{_FIELD}[{i}]"
    if not isinstance(table, Mapping):
        raise ConfigError(where, table,
                          "each operator must be a table, e.g. [[job.operators]] "
                          "with name = \"fc1\" and kind = \"dense\"")
    for key in table:
        if key not in OPERATOR_KEYS:
            raise ConfigError(f"{where}.{key}", table[key],
                              f"unknown key; use one of {', '.join(OPERATOR_KEYS)}")
    for key in ("name", "kind"):
        if key not in table:
            example = "name = \"fc1\"" if key == "name" else "kind = \"dense\""
            raise ConfigError(f"{where}.{key}", None, f"is required, e.g. {example}")

    name = table["name"]
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name", name, "must be a non-empty string")
    if name in seen:
        raise ConfigError(f"{where}.name", name,
                          f"operator names must be unique; {name!r} is "
                          f"{_FIELD}[{seen[name]}]")
    kind = table["kind"]
    if kind not in OP_KINDS:
        raise ConfigError(f"{where}.kind", kind, f"use one of {', '.join(OP_KINDS)}")

    values: dict[str, Any] = {key: _count(f"{where}.{key}", table[key])
                              for key in _INT_KEYS if key in table}
    values.update({key: _flops(f"{where}.{key}", table[key])
                   for key in _FLOAT_KEYS if key in table})
    params = values.get("params", 0)
    fwd = values.get("fwd_flops", 0.0)
    bwd = values.get("bwd_flops", 2.0 * fwd if params > 0 else fwd)

    inputs = table.get("inputs", [])
    if isinstance(inputs, str) or not isinstance(inputs, (list, tuple)):
        raise ConfigError(f"{where}.inputs", inputs,
                          "must be a list of operator names, e.g. inputs = [\"fc1\"]")
    for j, src in enumerate(inputs):
        if not isinstance(src, str):
            raise ConfigError(f"{where}.inputs[{j}]", src, "must be an operator name (string)")
        if src not in seen:
            if src == name:
                allowed = "an operator cannot consume its own output"
            elif seen:
                shown = ", ".join(repr(s) for s in list(seen)[-5:])
                allowed = (f"must name an operator listed earlier in {_FIELD} "
                           f"(the most recent are {shown})")
            else:
                allowed = "the first operator cannot have inputs; list its producers before it"
            raise ConfigError(f"{where}.inputs[{j}]", src, allowed)
    if len(set(inputs)) != len(inputs):
        raise ConfigError(f"{where}.inputs", list(inputs), "list each input once")

    return Operator(name=name, kind=kind, params=params, fwd_flops=fwd, bwd_flops=bwd,
                    out_elems=values.get("out_elems", 0), inputs=tuple(inputs),
                    mem_elems=values.get("mem_elems", 0))


def custom_model(name: str, operators: Sequence[Mapping[str, Any]]) -> Model:
    """Build a model from operator tables, validating every key.

    Parameters
    ----------
    name : str
        Model name (for reports).
    operators : list of dict
        One table per operator, in a topological order (producers first), as
        parsed from ``[[job.operators]]``. Keys:

        ``name`` (str, required, unique), ``kind`` (str, required, one of
        :data:`workloads.graph.OP_KINDS`), ``params`` (int, default 0),
        ``fwd_flops`` (number, FLOPs per sample, default 0), ``bwd_flops`` (number,
        default ``2 * fwd_flops`` if ``params > 0`` else ``fwd_flops``),
        ``out_elems`` (int, output elements per sample, default 0), ``inputs``
        (list of names of earlier operators, default ``[]``), ``mem_elems`` (int,
        elements read per sample by a memory-bound operator, default 0).

    Returns
    -------
    Model

    Raises
    ------
    ConfigError
        On the first bad entry, naming its field with a 0-based index, e.g.
        ``job.operators[3].kind``, and saying what is allowed: an unknown key, a
        missing ``name`` or ``kind``, a duplicate name, an unknown kind, a value of
        the wrong type or negative, or an input that is not an earlier operator.

    Examples
    --------
    >>> m = custom_model("mlp", [
    ...     {"name": "x", "kind": "input", "out_elems": 512},
    ...     {"name": "fc", "kind": "dense", "params": 512 * 10 + 10,
    ...      "fwd_flops": 2 * 512 * 10, "out_elems": 10, "inputs": ["x"]},
    ... ])
    >>> m.bwd_flops
    20480.0
    """
    if isinstance(operators, (str, bytes, Mapping)) or not isinstance(operators, Sequence):
        raise ConfigError(_FIELD, operators,
                          "must be a list of operator tables ([[job.operators]] in TOML)")
    if not operators:
        raise ConfigError(_FIELD, [], "a custom model needs at least one [[job.operators]] table")
    if not isinstance(name, str) or not name:
        raise ConfigError("job.name", name, "the model needs a non-empty name")
    ops: list[Operator] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(operators):
        op = _operator(i, table, seen)
        ops.append(op)
        seen[op.name] = i
    return Model(name=name, operators=tuple(ops), size={"operators": len(ops)})
