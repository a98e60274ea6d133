"""Collective patterns as JSON documents, read back with the semantic check.

The format is ``FORMAT`` of :mod:`topoopt.collectives.ten`; reading checks the pattern
with :mod:`topoopt.collectives.check`."""

from __future__ import annotations

import json

import numpy as np

from topoopt.collectives.check import check_pattern
from topoopt.collectives.ten import FORMAT, Pattern, PatternError

__all__ = ["pattern_to_json", "pattern_from_json"]


def pattern_to_json(pattern: Pattern) -> dict:
    """The pattern as a JSON-able dict (``topoopt react pattern --json``).

    Schema (``format = "topoopt.pattern/1"``)::

        {"format", "name", "collective", "ranks", "itemsize", "elements", "size_bytes",
         "steps", "chunks", "phases": [name, ...],
         "segments": [[start, stop], ...],          # element ranges of the buffer
         "owners": [rank, ...] | null,              # AllGather: whose data segment j is
         "edges": [{"index", "step", "src", "dst", "chunk", "segments": [j, ...],
                    "bytes", "op": "reduce" | "copy", "phase"}, ...]}

    See the module docstring for the execution semantics.
    """
    return {
        "format": FORMAT, "name": pattern.name, "collective": pattern.collective,
        "ranks": pattern.ranks, "itemsize": pattern.itemsize,
        "elements": pattern.elements, "size_bytes": pattern.size,
        "steps": pattern.steps, "chunks": pattern.chunks,
        "phases": list(pattern.phase_names),
        "segments": pattern.segments.tolist(),
        "owners": None if pattern.owners is None else pattern.owners.tolist(),
        "edges": [{"index": e.index, "step": e.step, "src": e.src, "dst": e.dst,
                   "chunk": e.chunk, "segments": list(e.segments), "bytes": e.nbytes,
                   "op": "reduce" if e.reduce else "copy", "phase": e.phase}
                  for e in pattern.edges()],
    }


def pattern_from_json(data: dict | str, check: bool = True) -> Pattern:
    """Load a pattern written by :func:`pattern_to_json` (a dict or JSON text).

    Raises :class:`PatternError` on a malformed document and, with ``check`` (default),
    when the pattern does not implement its collective. Edge order (the flow ids) is
    kept as listed.
    """
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise PatternError(f"pattern JSON does not parse: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PatternError(f"not a pattern document: expected format {FORMAT!r}")
    try:
        phases = list(data["phases"])
        rows = []
        for i, e in enumerate(data["edges"]):
            if e.get("op") not in ("reduce", "copy"):
                raise PatternError(f"edge {i}: op must be 'reduce' or 'copy'")
            if e["phase"] not in phases:
                raise PatternError(f"edge {i}: unknown phase {e['phase']!r}")
            rows.append((e["step"], e["src"], e["dst"], e["chunk"], e["segments"],
                         e["op"] == "reduce", phases.index(e["phase"])))
        p = Pattern.from_edges(data["name"], data["collective"], data["ranks"],
                               np.asarray(data["segments"], np.int64).reshape(-1, 2),
                               rows, itemsize=data["itemsize"], owners=data["owners"],
                               phase_names=phases, sort=False)
    except (KeyError, TypeError, ValueError) as exc:
        raise PatternError(f"malformed pattern document: {exc!r}") from None
    if check:
        check_pattern(p)
    return p
