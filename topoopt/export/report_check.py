"""The plan report's checker: every number ``report.html`` shows must be the value of
the ``plan.json`` field it names (:mod:`topoopt.export.report_values`), and no other
digit may appear except server, port, ring and chain numbers and names.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any, Mapping

from topoopt.errors import PlanCheckError
from topoopt.export.report_values import PlanValues, format_value

__all__ = ["check_report"]

_DIGIT = re.compile(r"\d")


class _Reader(HTMLParser):
    """Collects each ``data-f`` element's text and every digit outside one."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict, list]] = []
        self.fields: list[tuple[dict, str, bool]] = []  # attrs, text, inside data-ids
        self.loose: list[tuple[str, bool]] = []  # text outside data-f, inside data-ids
        self.tags: dict[str, int] = {}
        self.classes: dict[str, int] = {}
        self.title = ""

    def _count(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for c in (attrs.get("class") or "").split():
            self.classes[f"{tag}.{c}"] = self.classes.get(f"{tag}.{c}", 0) + 1

    def _ids(self) -> bool:
        return any("data-ids" in a for _, a, _ in self.stack)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self._count(tag, attrs)
        self.stack.append((tag, attrs, []))

    def handle_startendtag(self, tag, attrs):
        attrs = dict(attrs)
        self._count(tag, attrs)
        if "data-f" in attrs:
            self.fields.append((attrs, "", self._ids()))

    def handle_endtag(self, tag):
        while self.stack:
            name, attrs, text = self.stack.pop()
            if "data-f" in attrs:
                self.fields.append((attrs, "".join(text), self._ids() or "data-ids" in attrs))
            elif self.stack and any("data-f" in a for _, a, _ in self.stack):
                for _, a, t in reversed(self.stack):  # hand the text to the data-f element
                    if "data-f" in a:
                        t.append("".join(text))
                        break
            if name == tag:
                break

    def handle_data(self, data):
        if not self.stack:
            return
        tag = self.stack[-1][0]
        if tag in ("style", "script", "cite", "abbr"):  # a paper's figure, a tool's name,
            # an abbreviation (p95): names, not numbers
            return
        if tag == "title" and len(self.stack) >= 2 and self.stack[-2][0] == "head":
            self.title += data
        if any("data-f" in a for _, a, _ in self.stack):
            self.stack[-1][2].append(data)
        elif _DIGIT.search(data):
            self.loose.append((data, self._ids()))


def _only_ids(text: str, bound: int, where: str) -> None:
    """Digits outside a field: whole numbers below ``bound`` (servers, ports, rings)."""
    for token in re.findall(r"[\d.]+", text):
        if not token.isdigit() or int(token) >= bound:
            raise PlanCheckError(f"report.html shows {token!r} ({where!r}), not a number "
                                 "from plan.json; write the report again (topoopt report DIR)")


def check_report(text: str, doc: Mapping, extras: Mapping[str, Any] | None = None) -> dict:
    """Check a report page against its plan: every number it shows comes from plan.json.

    Each ``data-f`` element's text must be its expressions' values, formatted in its
    units, in order; what remains of it, and every text outside such elements, may hold
    no digit except server, port, ring and chain numbers inside a ``data-ids`` element
    (whole numbers below the plan's largest count) and names inside ``<cite>`` or
    ``<abbr>`` (a paper's figure, ns-3, p95). The page must have one
    ``<g class="server">`` per server, one ``<line class="link">`` per link and one
    fabric row per fabric, and no script or external resource.

    Parameters
    ----------
    text : str
        The page (:func:`build_report`).
    doc : dict
        Its ``plan.json``.
    extras : mapping, optional
        The folder's validation and REACT results (:func:`report_extras`).

    Returns
    -------
    dict
        ``fields`` (values checked), ``servers``, ``links``, ``fabrics``.

    Raises
    ------
    PlanCheckError
        Naming the first number that is not the plan's, or the missing element.
    """
    values = PlanValues(doc, extras)
    reader = _Reader()
    reader.feed(text)
    reader.close()
    t = doc["topology"]
    chains = [len(r["chains"]) for r in doc.get("search", {}).get("history", [])]
    chains += [len(f["search"]["chains"]) for f in doc.get("fabrics", {}).values()]
    bound = max([t["servers"], t["ports"], len(doc["rings"]), *chains])
    checked = 0
    for attrs, shown, ids in reader.fields:
        keys, units = attrs["data-f"].split(";"), (attrs.get("data-u") or "").split(";")
        if len(keys) != len(units):
            raise PlanCheckError(f"report.html field {attrs['data-f']!r} has "
                                 f"{len(units)} units for {len(keys)} values")
        shown = " ".join(shown.split())
        pos, rest = 0, []
        for key, unit in zip(keys, units):
            want = " ".join(format_value(unit, values(key)).split())
            at = shown.find(want, pos)
            if at < 0:
                raise PlanCheckError(f"report.html shows {shown!r} for {key}, but plan.json "
                                     f"gives {want!r}; write the report again "
                                     "(topoopt report DIR)")
            rest.append(shown[pos:at])
            pos = at + len(want)
            checked += 1
        rest.append(shown[pos:])
        left = " ".join(rest)
        if _DIGIT.search(left):
            if not ids:
                raise PlanCheckError(f"report.html shows {shown!r}: {left.strip()!r} is not "
                                     "a number from plan.json")
            _only_ids(left, bound, shown)
    for loose, ids in reader.loose:
        if not ids:
            raise PlanCheckError(f"report.html shows {' '.join(loose.split())!r}, not a "
                                 "number from plan.json")
        _only_ids(loose, bound, loose.strip())
    counts = {"servers": reader.classes.get("g.server", 0),
              "links": reader.classes.get("line.link", 0),
              "fabrics": reader.classes.get("tr.fabric", 0)}
    planned = {"servers": t["servers"], "links": len(t["links"]),
               "fabrics": len(doc["iteration_time_s"])}
    for what, n in planned.items():
        if counts[what] != n:
            raise PlanCheckError(f"report.html draws {counts[what]} {what} but the plan has "
                                 f"{n}; write the report again (topoopt report DIR)")
    if reader.tags.get("script") or re.search(r"""(src|href)=["']?(https?:)?//""", text):
        raise PlanCheckError("report.html loads a script or an external resource; it must "
                             "be one self-contained page")
    return {"fields": checked, **counts}
