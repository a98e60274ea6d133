"""TL1 ``ENT-PATCH`` commands that set one OCS unit's cross-connects.

File ``ocs/ocs{u}.tl1``: one TL1 input message per line, in ingress order, with
correlation tags 1, 2, ...::

    ENT-PATCH::1,321:1:;

TL1 input form ``VERB-MODIFIER:TID:AID:CTAG::;`` with an empty TID (the switch the
session is logged in to) and AID ``ingress,egress`` (Polatis numbering, see
:mod:`topoopt.export.ocs`), as Polatis TL1 clients send it (e.g.
``"ENT-PATCH::" + inport + "," + outport + ":123:;"``; ``RTRV-PATCH:::123:;`` lists
the connections, ``DLT-PATCH::ALL:123:;`` clears them). TL1 has no comments and the
session must be opened with ``ACT-USER`` first; the file holds no credentials, so log
in, then send the lines.
"""

from __future__ import annotations

import re
from typing import Sequence

from topoopt.errors import PlanCheckError
from topoopt.export.ocs import CrossConnect

__all__ = ["format_tl1", "parse_tl1"]

_LINE = re.compile(r"ENT-PATCH:([A-Za-z0-9_-]*):(\d+),(\d+):(\d+):?;\Z", re.IGNORECASE)


def format_tl1(connects: Sequence[CrossConnect]) -> str:
    """The TL1 text for one unit's ``connects`` (ingress order, ctags from 1)."""
    return "".join(f"ENT-PATCH::{c.ingress},{c.egress}:{ctag}:;\n"
                   for ctag, c in enumerate(sorted(connects, key=lambda c: c.ingress), start=1))


def parse_tl1(text: str) -> list[tuple[int, int]]:
    """Read TL1 lines back: their ``(ingress, egress)`` pairs.

    Raises
    ------
    PlanCheckError
        A non-blank line that is not ``ENT-PATCH:TID:IN,OUT:CTAG:;``, or a ctag used
        twice (responses could not be told apart).
    """
    pairs = []
    ctags: set[int] = set()
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        m = _LINE.match(line.strip())
        if not m:
            raise PlanCheckError(f"TL1 line {i} is not 'ENT-PATCH::IN,OUT:CTAG:;': {line!r}")
        ctag = int(m.group(4))
        if ctag in ctags:
            raise PlanCheckError(f"TL1 line {i}: correlation tag {ctag} used twice")
        ctags.add(ctag)
        pairs.append((int(m.group(2)), int(m.group(3))))
    return pairs
