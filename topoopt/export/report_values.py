"""The values a plan report shows: each number on ``report.html`` is an expression over
``plan.json`` (``data-f``) in a unit (``data-u``), evaluated here for the page's
builder (:mod:`topoopt.export.report`) and again by its checker
(:mod:`topoopt.export.report_check`).

Expressions (``data-f``, several separated by ``;``): a field path (``cost.fattree``,
``rings[2].order[0]``, ``[-1]`` the last item), ``#path`` (its length),
``path~value`` (how many of its items equal ``value``), ``@FILE:path`` (a field of a
validation or REACT JSON file in the folder), ``traffic:before|after:min|max|R,C``,
``load:I``/``load:max`` (bytes on link I, per :func:`topoopt.routing.link_loads`),
``forwarded:paths`` (how many route paths go through other servers),
``describe:I`` (a line of :func:`topoopt.strategy.describe_strategy`); terms joined
by ``*`` and ``/``.
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from topoopt.errors import PlanCheckError
from topoopt.llm import LLMParallel, finder_traffic, llm_traffic
from topoopt.plans.check import strategy_of
from topoopt.plans.common import cluster_job_of, rings_of, routes_of, topology_of
from topoopt.plans.llm import is_llm_document
from topoopt.routing.metrics import link_loads
from topoopt.strategy import data_parallel, describe_strategy, hybrid
from topoopt.traffic import derive_traffic
from topoopt.units import format_bandwidth, format_size, format_time
from topoopt.workloads import model_of
from topoopt.workloads.gpt import transformer_shape

__all__ = ["format_value", "PlanValues", "value_of", "report_extras", "extras_kind"]

#: Start strategies the report can rebuild for the "before" heatmap (``search.start_strategy``).
_STARTS = {"dp": data_parallel, "hybrid": hybrid}


def format_value(unit: str, v: Any) -> str:
    """The printed form of a value in ``unit``."""
    if unit == "time":
        return format_time(v)
    if unit == "size":
        return format_size(v)
    if unit == "bw":
        return format_bandwidth(v)
    if unit == "cost":
        return f"{v:,.0f}"
    if unit == "ratio":
        return f"{v:.2f}\u00d7"
    if unit == "pct":
        return f"{100 * v:.1f}%"
    if unit == "int":
        if isinstance(v, float) and not v.is_integer():
            raise PlanCheckError(f"report shows {v!r} as an integer")
        return str(int(v))
    if unit == "num":
        return f"{v:.4g}"
    if unit == "str":
        return str(v)
    raise PlanCheckError(f"report uses an unknown unit {unit!r}")


_STEP = re.compile(r"\[(-?\d+)\]|\.?([^.\[\]]+)")


def _walk(root: Any, path: str, where: str) -> Any:
    obj, pos = root, 0
    while pos < len(path):
        m = _STEP.match(path, pos)
        if m is None:
            raise PlanCheckError(f"report field {where!r} is not a field path")
        try:
            obj = obj[int(m[1])] if m[1] is not None else obj[m[2]]
        except (KeyError, IndexError, TypeError):
            raise PlanCheckError(f"report shows {where}, which plan.json does not have; "
                                 "write the report again (topoopt report DIR)") from None
        pos = m.end()
    return obj


class PlanValues:
    """Evaluates ``data-f`` expressions on a plan document (and the folder's extras);
    the derived quantities (traffic, link loads) are computed once, on demand."""

    def __init__(self, doc: Mapping, extras: Mapping[str, Any] | None = None):
        self.doc, self.extras = doc, dict(extras or {})

    @cached_property
    def _setting(self):
        cluster, job = cluster_job_of(dict(self.doc))
        return cluster, job, model_of(job)

    def _traffic(self, strategy):
        cluster, job, model = self._setting
        return derive_traffic(model, strategy, cluster.servers, job.global_batch(cluster),
                              job.dtype_bytes)

    @cached_property
    def llm(self) -> bool:
        """An LLM job's plan (:mod:`topoopt.plans.llm`): a parallelism, no operator
        strategy and no MCMC search."""
        return is_llm_document(self.doc)

    @cached_property
    def strategy(self):
        return strategy_of(self.doc["strategy"])

    @cached_property
    def _llm_traffic(self):
        """TopologyFinder's traffic of an LLM plan: the DP groups' AllReduces and the
        PP/EP bytes (:func:`topoopt.llm.finder_traffic`)."""
        cluster, job, model = self._setting
        return finder_traffic(llm_traffic(
            transformer_shape(model), LLMParallel.from_dict(self.doc["llm"]["parallel"]),
            cluster.servers, cluster.gpus_per_server, job.global_batch(cluster),
            job.dtype_bytes))

    @cached_property
    def after(self) -> np.ndarray:
        """The planned strategy's bytes per server pair over the planned rings."""
        traffic = self._llm_traffic if self.llm else self._traffic(self.strategy)
        return traffic.matrix(rings_of(dict(self.doc)))

    @cached_property
    def before(self) -> np.ndarray | None:
        """The start strategy's bytes per pair, one ring per group in member order (as
        ``traffic_before.png``; an LLM plan: its parallelism, one ring per DP group); None
        if the start is not one the report can rebuild."""
        if self.llm:
            return self._llm_traffic.matrix(None)
        make = _STARTS.get(self.doc["search"]["start_strategy"])
        if make is None:
            return None
        cluster, _, model = self._setting
        return self._traffic(make(model, cluster.servers)).matrix(None)

    @cached_property
    def loads(self) -> np.ndarray:
        """Bytes per link of the planned topology (ring, MP and forwarded bytes)."""
        return link_loads(topology_of(dict(self.doc)), self.after, routes_of(dict(self.doc)))

    @cached_property
    def describe(self) -> list[str]:
        cluster, _, model = self._setting
        return describe_strategy(model, self.strategy, cluster.servers)

    def term(self, term: str) -> Any:
        if term.startswith("#"):
            return len(self.term(term[1:]))
        if term.startswith("@"):
            name, _, path = term[1:].partition(":")
            if name not in self.extras:
                raise PlanCheckError(f"report shows {term} but the folder has no {name}; write "
                                     "the report again (topoopt report DIR)")
            return _walk(self.extras[name], path, term) if path else name
        if term.startswith("traffic:"):
            _, which, stat = term.split(":")
            m = getattr(self, which)
            if m is None:
                raise PlanCheckError(f"report shows {term} but the start strategy cannot be "
                                     "rebuilt")
            if "," in stat:
                r, c = stat.split(",")
                return float(m[int(r), int(c)])
            positive = m[m > 0]
            return float(positive.max() if stat == "max" else positive.min())
        if term.startswith("load:"):
            i = term[5:]
            return float(self.loads.max(initial=0.0) if i == "max" else self.loads[int(i)])
        if term == "forwarded:paths":
            return sum(len(q["path"]) > 2 for r in self.doc["routes"] for q in r["paths"])
        if term.startswith("describe:"):
            return self.describe[int(term[9:])]
        if "~" in term:
            path, _, want = term.partition("~")
            return sum(1 for x in _walk(self.doc, path, term) if str(x) == want)
        return _walk(self.doc, term, term)

    def __call__(self, expr: str) -> Any:
        parts = re.split(r"([*/])", expr)
        value = self.term(parts[0])
        for op, term in zip(parts[1::2], parts[2::2]):
            other = self.term(term)
            value = value * other if op == "*" else value / other
        return value


def value_of(expr: str, doc: Mapping, extras: Mapping[str, Any] | None = None) -> Any:
    """The value a report expression (``data-f``) names in a plan document.

    Examples
    --------
    >>> value_of("cost.fattree/cost.topoopt", {"cost": {"fattree": 300, "topoopt": 100}})
    3.0
    >>> value_of("#rings[0].order", {"rings": [{"order": [0, 2, 1]}]})
    3
    """
    return PlanValues(doc, extras)(expr)


def report_extras(directory: str | Path, doc: Mapping) -> dict[str, Any]:
    """The validation and REACT results in a plan folder: each top-level ``*.json`` that
    the plan did not write and that holds a ``topoopt validate --json`` table
    (``fabrics`` rows with ``ns3_s``) or a ``topoopt react simulate --json`` result
    (``baseline`` and ``react`` means); by file name, sorted."""
    out = {}
    owned = set(doc.get("files", ())) | {"plan.json"}
    for path in sorted(Path(directory).glob("*.json")):
        if path.name in owned or not path.is_file() or path.is_symlink():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if extras_kind(data):
            out[path.name] = data
    return out


def extras_kind(data: Any) -> str:
    if not isinstance(data, dict):
        return ""
    rows = data.get("fabrics")
    if isinstance(rows, list) and rows and all(
            isinstance(r, dict) and {"fabric", "predicted_s", "flow_s", "ns3_s"} <= set(r)
            for r in rows):
        return "validate"
    if all(isinstance(data.get(k), dict) and "mean_s" in data[k] for k in ("baseline", "react")) \
            and isinstance(data.get("scenario"), dict):
        return "react"
    return ""


