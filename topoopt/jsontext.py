"""Readable, deterministic JSON text for large documents (``plan.json``), at C speed.

``json.dumps(doc, indent=1, sort_keys=True)`` puts every number of a long list on a
line of its own and, for any ``indent``, runs Python's pure-Python encoder: on a plan
of hundreds of servers (one route entry per server pair) that is most of the time
spent writing the plan. :func:`json_text` writes the same document -- ``json.loads``
of its text equals ``json.loads`` of that one, keys in the same sorted order -- laid
out for reading: objects one key per line, indented; a list of numbers on one line;
any other list or object on one line where it fits (:data:`WIDTH` characters, or
:data:`ROW` for an element of a list: a record such as a route), else one element per
line. Every line is encoded by the C encoder.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_text", "WIDTH", "ROW"]

#: The longest line a list or object (other than a list of numbers) is kept on.
WIDTH = 120
#: The same for an element of a list.
ROW = 400
#: Lists of these go on one line, whatever their length.
_NUMBERS = (int, float, bool, type(None))
_SCALARS = (str, *_NUMBERS)
# ", " and ": " between items, as json.dumps without indent; keys sorted as sort_keys
_LINE = json.JSONEncoder(sort_keys=True)


def json_text(doc: Any, width: int = WIDTH, row: int = ROW) -> str:
    """``doc`` as indented JSON text with a final newline: the same document gives the
    same text, and ``json.loads`` of it equals ``json.loads`` of
    ``json.dumps(doc, indent=1, sort_keys=True)`` (module notes).

    Parameters
    ----------
    doc : JSON-serializable value
        Dicts, lists, tuples, strings, numbers, booleans and None.
    width, row : int
        Containers whose one-line text is longer (``row``: elements of a list) are
        written one element per line.

    Raises
    ------
    TypeError, ValueError
        As :func:`json.dumps` for a value it cannot encode.
    """
    out: list[str] = []
    _write(doc, 0, (width, row), out, top=True)
    out.append("\n")
    return "".join(out)


def _one_line(value: list | tuple | dict, width: int) -> str | None:
    """``value``'s one-line text if it fits in ``width``, else None (checked by its
    length first: every item takes at least three characters with its separator)."""
    if 3 * len(value) > width:
        return None
    text = _LINE.encode(value)
    return text if len(text) <= width else None


def _write(value: Any, level: int, widths: tuple[int, int], out: list[str],
           top: bool = False, row: bool = False) -> None:
    """Append ``value``'s text at indentation ``level`` to ``out`` (``row``: an element
    of a list, ``widths[1]`` wide; ``top``: the document, never on one line)."""
    width = widths[row]
    if isinstance(value, (list, tuple)):
        if not value or all(isinstance(v, _NUMBERS) for v in value):
            out.append(_LINE.encode(value))
            return
        line = _one_line(value, width)
        if line is not None:
            out.append(line)
            return
        items: list[tuple[str | None, Any]] = [(None, v) for v in value]
        brackets = "[]"
    elif isinstance(value, dict):
        # keys json.dumps would convert (numbers, None, booleans): left to it, on one line
        if not value or not all(isinstance(k, str) for k in value):
            out.append(_LINE.encode(value))
            return
        line = None if top else _one_line(value, width)
        if line is not None:
            out.append(line)
            return
        items = [(_LINE.encode(k), value[k]) for k in sorted(value)]
        brackets = "{}"
    else:
        out.append(_LINE.encode(value))
        return
    pad = "\n" + " " * (level + 1)
    out.append(brackets[0])
    for i, (key, v) in enumerate(items):
        out.append(pad if i == 0 else "," + pad)
        if key is not None:
            out.append(key + ": ")
        if isinstance(v, _SCALARS):
            out.append(_LINE.encode(v))
        else:
            _write(v, level + 1, widths, out, row=key is None)
    out.append("\n" + " " * level + brackets[1])
