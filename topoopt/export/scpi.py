"""SCPI ``:oxc:swit:conn:add`` lines that set one OCS unit's cross-connects.

File ``ocs/ocs{u}.scpi``: one command per line, in ingress order::

    :oxc:swit:conn:add (@1),(@321)

i.e. connect ingress port 1 to egress port 321 (Polatis numbering, see
:mod:`topoopt.export.ocs`), keeping the switch's other connections. The command takes
SCPI channel lists ``(@ingress,...),(@egress,...)``, ingress list first; public Polatis
SCPI clients send exactly this form (e.g. ``":oxc:swit:conn:add (@%d),(@%d)" % (ingress,
egress)``, with ``:oxc:swit:conn:port? P`` to read a connection back). SCPI has no comment syntax, so the file
holds commands only: send it line by line to the switch's SCPI port (e.g. TCP 5025).
``:oxc:swit:disc:all`` clears a unit first if it is dedicated to the shard.
"""

from __future__ import annotations

import re
from typing import Sequence

from topoopt.errors import PlanCheckError
from topoopt.export.ocs import CrossConnect

__all__ = ["format_scpi", "parse_scpi"]

_LINE = re.compile(r":oxc:swit:conn:add \(@(\d+)\),\(@(\d+)\)\Z", re.IGNORECASE)


def format_scpi(connects: Sequence[CrossConnect]) -> str:
    """The SCPI text for one unit's ``connects`` (ingress order)."""
    return "".join(f":oxc:swit:conn:add (@{c.ingress}),(@{c.egress})\n"
                   for c in sorted(connects, key=lambda c: c.ingress))


def parse_scpi(text: str) -> list[tuple[int, int]]:
    """Read SCPI lines back: their ``(ingress, egress)`` pairs.

    Raises
    ------
    PlanCheckError
        A non-blank line that is not a single-port ``:oxc:swit:conn:add``.
    """
    pairs = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        m = _LINE.match(line.strip())
        if not m:
            raise PlanCheckError(f"SCPI line {i} is not ':oxc:swit:conn:add (@IN),(@OUT)': {line!r}")
        pairs.append((int(m.group(1)), int(m.group(2))))
    return pairs
