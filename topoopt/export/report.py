"""A plan report people can read: one self-contained HTML page (``DIR/report.html``)
built from ``plan.json`` alone, and its checker.

The page has the job and cluster, the fabric comparison (table and bar chart), the
planned topology drawn as inline SVG (servers on a circle, one labelled node per server,
one line per link coloured by its ring stride and as wide as the bytes it carries,
model-parallel links and forwarded routes drawn apart, a hover title per link), the
rings and their shares, the traffic heatmaps before and after planning (TopoOpt
Figures 8 and 9), each search chain's best-so-far curve (TopoOpt §4, the MCMC search),
the per-server port map (what the patch panel or OCS connects) and, where the folder
has them, the results of ``topoopt validate --json`` and ``topoopt react simulate
--json``. No script, no network access: inline SVG and CSS, readable in print.

Every number the page shows is written with the plan.json field it comes from
(``data-f``, an expression over fields) and its unit (``data-u``);
:func:`check_report` evaluates those expressions on the plan again, compares the
printed text, and refuses any other digit on the page except server, port, ring and
chain numbers (``data-ids``, checked against the plan's counts) and names
(``<cite>``, ``<abbr>``).

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

import html
import json
import math
import re
from functools import cached_property
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from topoopt.errors import PlanCheckError
from topoopt.fabrics.catalog import FABRICS
from topoopt.llm import LLMParallel, finder_traffic, llm_traffic
from topoopt.plans.document import cluster_job_of, rings_of, routes_of, strategy_of, topology_of
from topoopt.plans.llm import is_llm_document
from topoopt.routing.metrics import link_loads
from topoopt.strategy import data_parallel, describe_strategy, hybrid
from topoopt.traffic import derive_traffic
from topoopt.units import format_bandwidth, format_size, format_time
from topoopt.workloads import model_of
from topoopt.workloads.gpt import transformer_shape

__all__ = ["REPORT", "build_report", "check_report", "report_extras", "value_of"]

#: The report's file name in a plan folder.
REPORT = "report.html"
#: Start strategies the report can rebuild for the "before" heatmap (``search.start_strategy``).
_STARTS = {"dp": data_parallel, "hybrid": hybrid}
#: Heatmap colours, light (few bytes) to dark (many), log-spaced bins (viridis, reversed).
_HEAT = ("#fde725", "#b5de2b", "#6ece58", "#35b779", "#1f9e89", "#26828e", "#31688e",
         "#3e4989", "#482878", "#440154")
#: Colours of ring strides, in order of stride (Tableau 10 without grey).
_STRIDE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#bcbd22", "#17becf")
_FORWARDED = "#7f7f7f"
#: The packet simulator's name (a <cite>: its digit is no number of the plan; the
#: checker skips <cite> and <abbr>, names and abbreviations such as p95).
_NS3 = "<cite>ns-3</cite>"
#: Heatmaps of up to this many servers get a hover title per cell.
_CELLS_TITLED = 32
#: Up to this many forwarded paths are drawn one by one, with a hover title each.
_ROUTES_DRAWN = 400


# ------------------------------------------------------------------------ values
def _fmt(unit: str, v: Any) -> str:
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


class _Values:
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
            transformer_shape(model), LLMParallel(**self.doc["llm"]["parallel"]),
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
    return _Values(doc, extras)(expr)


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
        if _kind(data):
            out[path.name] = data
    return out


def _kind(data: Any) -> str:
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


# ----------------------------------------------------------------------- builder
def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


class _Page:
    """Markup helpers: every number goes through :meth:`n` or :meth:`text`."""

    def __init__(self, values: _Values):
        self.v = values

    def n(self, expr: str, unit: str, tag: str = "span", attrs: str = "") -> str:
        """One number (or string field) with its source and unit."""
        text = _fmt(unit, self.v(expr))
        return (f'<{tag}{attrs} data-f="{_esc(expr)}" data-u="{unit}">{_esc(text)}'
                f'</{tag}>')

    def text(self, tag: str, parts: list, attrs: str = "", ids: bool = False) -> str:
        """An element whose text mixes literals and ``(expr, unit)`` values."""
        keys, units, out = [], [], []
        for p in parts:
            if isinstance(p, tuple):
                keys.append(p[0])
                units.append(p[1])
                out.append(_fmt(p[1], self.v(p[0])))
            else:
                out.append(str(p))
        meta = (f' data-f="{_esc(";".join(keys))}" data-u="{";".join(units)}"' if keys else "")
        mark = ' data-ids=""' if ids else ""
        return f'<{tag}{attrs}{meta}{mark}>{_esc("".join(out))}</{tag}>'

    def ids(self, text: Any, tag: str = "span", attrs: str = "") -> str:
        """A server, port, ring or chain number."""
        return f'<{tag}{attrs} data-ids="">{_esc(text)}</{tag}>'


def _stride(label: str) -> int:
    return int(label.split("=")[1]) if "=" in label else 0


def _colour(label: str, strides: list[int]) -> str:
    if label == "mp":
        return "#000000"
    return _STRIDE[strides.index(_stride(label)) % len(_STRIDE)]


def _summary(p: _Page, doc: Mapping) -> str:
    """The answer first: the shard's time and cost next to the Ideal Switch and the
    cost-equivalent Fat-tree (TopoOpt §5.2's comparison)."""
    times = doc["iteration_time_s"]
    how = (p.n("llm.fabrics.topoopt.iteration.mfu", "pct") + " model FLOPs utilization"
           if p.v.llm else p.n("breakdown.topoopt.exposed_communication", "time")
           + " of it communication not hidden behind compute")
    out = ["The TopoOpt shard runs an iteration in " + p.n("iteration_time_s.topoopt", "time")
           + f" ({how}) at an interconnect cost of " + p.n("cost.topoopt", "cost")
           + " (relative units)."]
    if "ideal" in times:
        out.append("The Ideal Switch takes " + p.n("iteration_time_s.ideal", "time")
                   + " (the shard takes " + p.n("gap_to_ideal.topoopt", "ratio")
                   + " as long) and costs " + p.n("cost.ideal/cost.topoopt", "ratio")
                   + " as much.")
    if "fattree" in times:
        out.append("The Fat-tree of about the same cost takes "
                   + p.n("iteration_time_s.fattree", "time") + ": the shard is "
                   + p.n("iteration_time_s.fattree/iteration_time_s.topoopt", "ratio")
                   + " as fast.")
    return f'<p class="summary">{" ".join(out)}</p>'


def _section_job(p: _Page, doc: Mapping) -> str:
    j = doc["job"]
    rows = [("model", p.n("job.model", "str")),
            ("config", p.n("config", "str")),
            ("servers", p.n("cluster.servers", "int")),
            ("NICs (optical ports) per server", p.n("cluster.nics", "int")),
            ("link bandwidth", p.n("cluster.link_bandwidth", "bw")),
            ("link latency", p.n("cluster.link_latency", "time")),
            ("GPUs per server", p.n("cluster.gpus_per_server", "int") + " \u00d7 "
             + p.n("cluster.gpu", "str")),
            ("batch per GPU / global batch", p.n("job.batch_per_gpu", "int") + " / "
             + p.n("job.global_batch", "int") + " samples"),
            ("precision", p.n("job.precision", "str"))]
    rows += [(f"model size: {_esc(k)}",
              p.n(f"job.size.{k}", "int" if isinstance(v, int) else "num"))
             for k, v in sorted(j["size"].items())]
    if p.v.llm:
        return _section_llm_job(p, doc, rows)
    s = doc["search"]
    search = [("degree split AllReduce / MP", p.n("topology.degree_allreduce", "int") + " / "
               + p.n("topology.degree_mp", "int") + " ports"),
              ("start strategy", p.n("search.start_strategy", "str") + ", "
               + p.n("search.start_time_s", "time")),
              ("first round from", p.n("search.first_round_from", "str")),
              ("best (TopoOpt shard)", p.n("search.best_time_s", "time")),
              ("search", p.n("search.chains", "int") + " chains \u00d7 "
               + p.n("search.budget", "int") + " moves, "
               + p.n("search.rounds", "int") + " rounds, tolerance "
               + p.n("search.tolerance", "pct") + ", seed " + p.n("search.seed", "int")),
              ("moves made", p.n("search.moves", "int")
               + (" (interrupted: best so far)" if s["interrupted"] else ""))]
    if s["adopted_from"]:
        search.append(("strategy adopted from", p.n("search.adopted_from", "str")))
    metrics = [("diameter", p.n("metrics.diameter", "num") + " hops"),
               ("average path length", p.n("metrics.average_path_length", "num") + " hops"),
               ("bandwidth tax", p.n("metrics.bandwidth_tax", "num")
                + " (bytes carried over bytes sent)"),
               ("MP hops (bytes-weighted)", p.n("metrics.mp_hops", "num")),
               ("busiest link", p.n("metrics.max_link_load_bytes", "size")
                + " per iteration")]

    def table(title, rows):
        body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
        return f'<table class="kv"><caption>{title}</caption>{body}</table>'

    lines = "".join(f"<li>{p.n(f'describe:{i}', 'str')}</li>" for i in range(len(p.v.describe)))
    return ('<section id="job"><h2>Job and cluster</h2><div class="cols">'
            + table("Job and cluster", rows) + table("Search", search)
            + table("Planned topology", metrics) + "</div>"
            + f"<h3>TopoOpt strategy</h3><ul class=\"strategy\">{lines}</ul></section>")


def _kv(title: str, rows: list) -> str:
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv"><caption>{title}</caption>{body}</table>'


def _field(name: str, path: str) -> str:
    """A plan.json key as a row label (``zero1``: a name, not a number), its path on hover."""
    return f'<abbr title="{_esc(path)}">{_esc(name)}</abbr>'


def _unit(value: Any) -> str:
    return "str" if isinstance(value, (str, bool)) else "int" if isinstance(value, int) \
        else "num"


def _section_llm_job(p: _Page, doc: Mapping, rows: list) -> str:
    """An LLM plan's job: the parallelism it chose, the memory per GPU, the search."""
    llm = doc["llm"]
    rows.append(("parameters (active)", p.n("llm.model.params", "num") + " ("
                 + p.n("llm.model.active_params", "num") + ")"))
    par = [(_field(k, f"llm.parallel.{k}"), p.n(f"llm.parallel.{k}", _unit(v)))
           for k, v in llm["parallel"].items()]
    par.insert(0, ("degree split AllReduce / MP", p.n("topology.degree_allreduce", "int")
                   + " / " + p.n("topology.degree_mp", "int") + " ports"))
    mem = [(_field(k, f"llm.memory_per_gpu.{k}"),
            p.n(f"llm.memory_per_gpu.{k}", "int" if k == "stage" else "size"))
           for k in llm["memory_per_gpu"]]
    search = [(_field(k, f"llm.search.{k}"), p.n(f"llm.search.{k}", _unit(v)))
              for k, v in llm["search"].items()
              if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    return ('<section id="job"><h2>Job and cluster</h2><div class="cols">'
            + _kv("Job and cluster", rows) + _kv("Parallelism (TopoOpt shard)", par)
            + _kv("Memory per GPU", mem) + _kv("Search", search) + "</div></section>")


def _fabric_names(doc: Mapping) -> list[str]:
    """The plan's fabrics: TopoOpt first, then the catalog's order."""
    order = list(FABRICS)
    return sorted(doc["iteration_time_s"], key=lambda n: (n != "topoopt", order.index(n)
                                                          if n in order else len(order), n))


def _fabric_section(p: _Page, doc: Mapping, head: tuple[str, str], cells, title,
                    second: tuple[str, str, str], prose: str) -> str:
    """The fabric table and its bar charts: per fabric (TopoOpt first) its name, iteration
    time, gap to the Ideal Switch, ``cells(name)`` (the columns in ``head[0]``), cost,
    cost ratio and ``cells`` tail (``head[1]``); charts of the time, ``second`` (key
    pattern, unit, label) and the cost."""
    names = _fabric_names(doc)
    rows = []
    for name in names:
        gap = p.n(f"gap_to_ideal.{name}", "ratio") if name in doc["gap_to_ideal"] else "-"
        middle, tail = cells(name)
        rows.append(f'<tr class="fabric" data-fabric="{_esc(name)}"><th>{title(name)}'
                    f' ({_esc(name)})</th>'
                    f'<td>{p.n(f"iteration_time_s.{name}", "time")}</td><td>{gap}</td>'
                    f'{middle}<td>{p.n(f"cost.{name}", "cost")}</td>'
                    f'<td>{p.n(f"cost.{name}/cost.topoopt", "ratio")}</td>{tail}</tr>')
    table = (f'<table id="fabric-table" class="grid"><tr><th>fabric</th><th>iteration</th>'
             f"<th>vs Ideal Switch</th>{head[0]}<th>cost (relative units)</th>"
             f'<th>cost ratio</th>{head[1]}</tr>{"".join(rows)}</table>')
    charts = "".join(_bars(p, names, key, unit, label) for key, unit, label in (
        ("iteration_time_s", "time", "iteration time"), second,
        ("cost", "cost", "interconnect cost (relative units)")))
    return ('<section id="fabrics"><h2>Fabrics compared</h2>'
            f"<p>{prose} Costs in relative units: one hundred is a one-hundred Gb/s "
            "transceiver.</p>" + table + f'<div class="cols">{charts}</div></section>')


def _section_fabrics(p: _Page, doc: Mapping) -> str:
    if p.v.llm:  # each fabric's parallelism, its iteration's parts and MFU
        parts = ("compute", "tp", "pp", "ep", "bubble", "dp")

        def llm_cells(name):
            f = f"llm.fabrics.{name}"
            par = p.text("span", [x for k in ("tp", "pp", "dp", "ep")
                                  for x in (f"{k} ", (f"{f}.parallel.{k}", "int"), " ")])
            return (f"<td>{par}</td>"
                    + "".join(f'<td>{p.n(f"{f}.iteration.{k}", "time")}</td>' for k in parts)
                    + f'<td>{p.n(f"{f}.iteration.mfu", "pct")}</td>', "")

        head = ("<th>parallelism</th>"
                + "".join(f"<th>{k if k in ('compute', 'bubble') else k.upper()}</th>"
                          for k in parts) + "<th>MFU</th>", "")
        return _fabric_section(
            p, doc, head, llm_cells, lambda n: p.n(f"llm.fabrics.{n}.title", "str"),
            ("llm.fabrics.{}.iteration.mfu", "pct", "model FLOPs utilization"),
            "Each fabric's own best parallelism (tensor, pipeline, data, expert); the "
            "iteration's parts are the time each kind of communication is not hidden; the "
            "Ideal Switch bounds them all.")

    def cells(name):
        b = f"breakdown.{name}"
        if name == "topoopt":
            h = doc["search"]["history"]
            how = (p.n(f"search.history[{len(h) - 1}].stop", "str") if h else "start")
        else:
            how = (p.n(f"fabrics.{name}.search.stop", "str") + ", spread "
                   + p.n(f"fabrics.{name}.search.spread", "ratio"))
            if doc["fabrics"][name]["adopted_from"]:
                how += ", from " + p.n(f"fabrics.{name}.adopted_from", "str")
        return ("".join(f'<td>{p.n(f"{b}.{k}", "time")}</td>'
                        for k in ("compute", "mp", "allreduce", "exposed_communication")),
                f"<td>{how}</td>")

    return _fabric_section(
        p, doc, ("<th>compute</th><th>MP</th><th>AllReduce</th><th>exposed communication</th>",
                 "<th>search</th>"), cells,
        lambda n: "TopoOpt shard" if n == "topoopt" else p.n(f"fabrics.{n}.title", "str"),
        ("breakdown.{}.exposed_communication", "time", "exposed communication"),
        "Each fabric's own best strategy from the same search budget; the Ideal Switch (no "
        "blocking, no forwarding) bounds them all.")


def _key(pattern: str, name: str) -> str:
    return pattern.format(name) if "{}" in pattern else f"{pattern}.{name}"


def _bars(p: _Page, names: list[str], pattern: str, unit: str, label: str) -> str:
    values = [float(p.v(_key(pattern, n))) for n in names]
    top = max(values) or 1.0
    row, left, width = 22, 92, 220
    out = [f'<svg class="bars" viewBox="0 0 {left + width + 80} {row * len(names) + 30}" '
           f'width="{left + width + 80}" role="img"><text class="axis" x="0" y="14">'
           f'{_esc(label)}</text>']
    for i, (n, v) in enumerate(zip(names, values)):
        y = 24 + i * row
        w = max(1.0, width * v / top)
        colour = "#1f77b4" if n == "topoopt" else "#9a9a9a"
        out.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{_esc(n)}</text>'
                   f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{row - 6}" '
                   f'fill="{colour}"/>'
                   + p.n(_key(pattern, n), unit, "text", f' x="{left + w + 4:.1f}" y="{y + 13}"'))
    return "".join(out) + "</svg>"


def _section_topology(p: _Page, doc: Mapping) -> str:
    t = doc["topology"]
    n, links, labels = t["servers"], t["links"], t["labels"]
    strides = sorted({_stride(lab) for lab in labels if lab != "mp"})
    loads = p.v.loads
    top = float(loads.max(initial=0.0)) or 1.0
    size = 760 if n <= 48 else 980
    r = size / 2 - 60
    cx = cy = size / 2
    ang = 2 * np.pi * np.arange(n) / n - np.pi / 2
    xy = np.c_[cx + r * np.cos(ang), cy + r * np.sin(ang)]
    # spare links at the bottom, then by bytes: the busiest ring is drawn last, on top
    order = sorted(range(len(links)),
                   key=lambda i: (not labels[i].startswith("spare"), loads[i], i))
    lines = []
    for i in order:
        a, pa, b, pb = links[i]
        lab = labels[i]
        (x1, y1), (x2, y2) = xy[a], xy[b]
        dx, dy = x2 - x1, y2 - y1
        norm = math.hypot(dx, dy) or 1.0
        ox, oy = -dy / norm * 1.6, dx / norm * 1.6  # a->b and b->a side by side
        kind = "mp" if lab == "mp" else lab.split(":")[0]
        width = 0.6 + 5.4 * loads[i] / top
        dash = ' stroke-dasharray="4 3"' if kind == "spare" else ""
        title = p.text("title", ["server ", (f"topology.links[{i}][0]", "int"), " port ",
                                 (f"topology.links[{i}][1]", "int"), " \u2192 server ",
                                 (f"topology.links[{i}][2]", "int"), " port ",
                                 (f"topology.links[{i}][3]", "int"), ", ",
                                 (f"topology.labels[{i}]", "str"), ", ",
                                 (f"load:{i}", "size"), " per iteration"])
        lines.append(f'<line class="link {kind}" data-link="{i}" x1="{x1 + ox:.1f}" '
                     f'y1="{y1 + oy:.1f}" x2="{x2 + ox:.1f}" y2="{y2 + oy:.1f}" '
                     f'stroke="{_colour(lab, strides)}" stroke-width="{width:.2f}"{dash}>'
                     f'{title}</line>')
    forwarded = [(i, k, q["path"]) for i, route in enumerate(doc["routes"])
                 for k, q in enumerate(route["paths"]) if len(q["path"]) > 2]
    routes = []
    if len(forwarded) <= _ROUTES_DRAWN:  # one line with its own hover title each
        for i, k, path in forwarded:
            pts = " ".join(f"{xy[s][0]:.1f},{xy[s][1]:.1f}" for s in path)
            title = p.text("title", ["forwarded: server ", (f"routes[{i}].src", "int"),
                                     " \u2192 server ", (f"routes[{i}].dst", "int"), " via ",
                                     ", ".join(str(s) for s in path[1:-1]), ": ",
                                     (f"routes[{i}].paths[{k}].fraction", "pct"),
                                     " of the pair's bytes"], ids=True)
            routes.append(f'<polyline class="route" points="{pts}">{title}</polyline>')
    else:  # thousands: one outline of them all (a title each would be megabytes)
        d = "".join("M" + "L".join(f"{xy[s][0]:.0f} {xy[s][1]:.0f}" for s in path)
                    for _, _, path in forwarded)
        title = p.text("title", [("forwarded:paths", "int"), " forwarded paths of ",
                                 ("#routes", "int"), " routed pairs"])
        routes.append(f'<path class="route" d="{d}">{title}</path>')
    nodes = []
    font = 11 if n <= 48 else 7
    for s in range(n):
        x, y = xy[s]
        lx, ly = cx + (r + 18) * math.cos(ang[s]), cy + (r + 18) * math.sin(ang[s])
        nodes.append(f'<g class="server" data-server="{s}"><circle cx="{x:.1f}" cy="{y:.1f}" '
                     f'r="{max(2.5, min(7.0, 300 / n)):.1f}"/>'
                     + p.ids(s, "text", f' x="{lx:.1f}" y="{ly + font / 3:.1f}" '
                                        f'text-anchor="middle" font-size="{font}"')
                     + p.text("title", ["server ", str(s)], ids=True) + "</g>")
    legend = []
    for lab in sorted(set(labels), key=lambda s: (s == "mp", s.split(":")[0] != "ring",
                                                  _stride(s), s)):
        first = labels.index(lab)
        swatch = _colour(lab, strides)
        dash = ' stroke-dasharray="4 3"' if lab.startswith("spare") else ""
        legend.append(f'<li><svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" '
                      f'stroke="{swatch}" stroke-width="3"{dash}/></svg>'
                      + p.n(f"topology.labels[{first}]", "str") + ": "
                      + p.n(f"topology.labels~{lab}", "int") + " links</li>")
    if routes:
        legend.append(f'<li><svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" '
                      f'stroke="{_FORWARDED}" stroke-width="2" stroke-dasharray="1 3"/></svg>'
                      f"forwarded route (through other servers)</li>")
    return ('<section id="topology"><h2>Topology</h2>'
            "<p>Servers on a circle; each line is a fibre from a transmitter to a receiver "
            "(hover for its ports, label and bytes), coloured by ring stride, as wide as "
            "the bytes it carries per iteration (the busiest on top; busiest: "
            + p.n("load:max", "size") + "). MP links are black, spare links dashed, "
            "forwarded routes dotted.</p>"
            f'<div class="topo"><svg id="topology-svg" viewBox="0 0 {size} {size}" '
            f'width="{size}" height="{size}" role="img">'
            f'<g class="routes">{"".join(routes)}</g><g class="links">{"".join(lines)}</g>'
            f'<g class="servers">{"".join(nodes)}</g></svg>'
            f'<ul class="legend">{"".join(legend)}</ul></div></section>')


def _section_rings(p: _Page, doc: Mapping) -> str:
    t = doc["topology"]
    hop = {}
    for i, ((a, _, b, _), lab) in enumerate(zip(t["links"], t["labels"])):
        hop.setdefault((a, b, lab), []).append(i)
    strides = sorted({_stride(lab) for lab in t["labels"] if lab != "mp"})
    rows = []
    for i, ring in enumerate(doc["rings"]):
        members, order = ring["members"], ring["order"]
        idx = {s: k for k, s in enumerate(members)}
        stride = (idx[order[1 % len(order)]] - idx[order[0]]) % len(members)
        lab = f"ring:p={stride}"
        first = hop.get((order[0], order[1 % len(order)], lab))
        kind = (p.n(f"topology.labels[{first[0]}]", "str") if ring["direct"] and first
                else "forwarded")
        colour = _colour(lab, strides) if ring["direct"] and first else _FORWARDED
        rows.append(f'<tr>{p.ids(i, "td")}<td><span class="swatch" '
                    f'style="background:{colour}"></span>{kind}</td>'
                    f'<td>{p.n(f"#rings[{i}].members", "int")}</td>'
                    f'<td>{p.n(f"rings[{i}].share", "pct")}</td>'
                    f'<td>{p.n(f"rings[{i}].group_bytes*rings[{i}].share", "size")}</td>'
                    f'<td>{p.n(f"rings[{i}].group_bytes*rings[{i}].share/#rings[{i}].members", "size")}</td>'
                    f'<td class="order">{p.ids(" ".join(map(str, order)))}</td></tr>')
    if not rows:
        return ('<section id="rings"><h2>Rings</h2><p>The planned strategy has no AllReduce '
                "group: no rings.</p></section>")
    return ('<section id="rings"><h2>Rings</h2><p>One row per ring of each AllReduce group: '
            "its share of the group's bytes, the bytes it sends per iteration (all members) "
            "and per hop, and the server order.</p>"
            '<table class="grid"><tr><th>ring</th><th>stride</th><th>members</th>'
            "<th>share</th><th>bytes</th><th>bytes per hop</th><th>order</th></tr>"
            + "".join(rows) + "</table></section>")


def _heatmap(p: _Page, which: str, caption: str) -> str:
    m = getattr(p.v, which)
    n = m.shape[0]
    positive = m[m > 0]
    if not positive.size:
        return f"<figure><figcaption>{_esc(caption)}: no traffic</figcaption></figure>"
    lo, hi = math.log(positive.min()), math.log(positive.max())
    bins = len(_HEAT)
    level = np.zeros(m.shape, int)
    if hi > lo:
        level[m > 0] = np.minimum(bins - 1, ((np.log(positive) - lo) / (hi - lo) * bins)
                                  .astype(int))
    else:
        level[m > 0] = bins - 1
    paths = []
    for b in range(bins):
        rr, cc = np.nonzero((level == b) & (m > 0))
        if not rr.size:
            continue
        if n <= _CELLS_TITLED:  # a cell each, hover for its bytes
            paths += [f'<rect class="cell" x="{c}" y="{r}" width="1" height="1" '
                      f'fill="{_HEAT[b]}">'
                      + p.text("title", ["server ", str(r), " \u2192 server ", str(c), ": ",
                                         (f"traffic:{which}:{r},{c}", "size")], ids=True)
                      + "</rect>" for r, c in zip(rr.tolist(), cc.tolist())]
        else:  # one outline per colour: a title per cell would be megabytes
            d = "".join(f"M{c} {r}h1v1h-1z" for r, c in zip(rr.tolist(), cc.tolist()))
            paths.append(f'<path fill="{_HEAT[b]}" d="{d}"/>')
    px = n * max(1, round(360 / n))  # whole pixels per cell: no seams between cells
    bar = "".join(f'<rect x="{i * 18}" y="0" width="18" height="10" fill="{c}"/>'
                  for i, c in enumerate(_HEAT))
    return (f'<figure class="heatmap"><figcaption>{_esc(caption)}</figcaption>'
            f'<svg class="heat" data-which="{which}" viewBox="0 0 {n} {n}" '
            f'width="{px}" height="{px}" shape-rendering="crispEdges" role="img">'
            f'<rect x="0" y="0" width="{n}" height="{n}" fill="#ffffff" stroke="#999999" '
            f'stroke-width="{n / 300:.3f}"/>{"".join(paths)}</svg>'
            f'<div class="scale">{p.n(f"traffic:{which}:min", "size")} '
            f'<svg width="{18 * bins}" height="10">{bar}</svg> '
            f'{p.n(f"traffic:{which}:max", "size")} per server pair per iteration '
            f"(log scale; rows send, columns receive; white: none)</div></figure>")


def _section_traffic(p: _Page, doc: Mapping) -> str:
    parts = []
    if p.v.llm:
        parts += [_heatmap(p, "before", "Before: one ring per DP group, in member order"),
                  _heatmap(p, "after", "After: the DP groups over the planned rings")]
        what = ("Bytes each server sends each other server in one iteration (pipeline and "
                "expert traffic, DP AllReduce ring hops; tensor parallelism stays on NVLink).")
    else:
        if p.v.before is not None:
            parts.append(_heatmap(p, "before", "Before: the start strategy, one ring per group"))
        parts.append(_heatmap(p, "after", "After: the planned strategy over the planned rings"))
        what = ("Bytes each server sends each other server in one iteration (MP transfers and "
                "AllReduce ring hops; <cite>TopoOpt Figs. 8, 9</cite>). The start strategy: "
                + p.n("search.start_strategy", "str") + ".")
    return ('<section id="traffic"><h2>Traffic</h2>'
            f"<p>{what}</p>"
            f'<div class="cols">{"".join(parts)}</div></section>')


def _chain(curve_field: str) -> str:
    """``...chains[k]`` of ``...chains[k].curve_s``."""
    return curve_field.rsplit(".", 1)[0]


def _curves(p: _Page, title: str, chains: list[tuple[str, list]]) -> str:
    """One chart: each chain's best-so-far curve; ``chains`` as (field, curve)."""
    chains = [(f, c) for f, c in chains if c]
    if not chains:
        return ""
    w, h, left, bottom = 330, 170, 62, 28
    hi = max(range(len(chains)), key=lambda i: chains[i][1][0])
    lo = min(range(len(chains)), key=lambda i: chains[i][1][-1])
    ymax, ymin = chains[hi][1][0], chains[lo][1][-1]
    span = (ymax - ymin) or ymax or 1.0
    moves = [p.v(_chain(f) + ".moves") for f, _ in chains]
    longest = max(range(len(chains)), key=lambda i: moves[i])
    xmax = max(moves[longest], 1)
    lines = []
    for k, (field, curve) in enumerate(chains):
        # the curve is sampled every so many moves, evenly over the chain's moves
        step = moves[k] / max(len(curve), 1)
        pts = " ".join(f"{left + (w - left - 8) * (j + 1) * step / xmax:.1f},"
                       f"{8 + (h - bottom - 8) * (ymax - y) / span:.1f}"
                       for j, y in enumerate(curve))
        colour = _STRIDE[k % len(_STRIDE)]
        lines.append(f'<polyline class="curve" points="{pts}" stroke="{colour}">'
                     + p.text("title", ["chain ", str(k), ": from ", (f"{field}[0]", "time"),
                                        " to ", (f"{field}[-1]", "time")], ids=True)
                     + "</polyline>")
    return (f'<figure class="chart"><figcaption>{title}</figcaption>'
            f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img">'
            f'<line class="axis" x1="{left}" y1="8" x2="{left}" y2="{h - bottom}"/>'
            f'<line class="axis" x1="{left}" y1="{h - bottom}" x2="{w - 8}" y2="{h - bottom}"/>'
            + p.n(f"{chains[hi][0]}[0]", "time", "text",
                  f' x="{left - 4}" y="14" text-anchor="end"')
            + p.n(f"{chains[lo][0]}[-1]", "time", "text",
                  f' x="{left - 4}" y="{h - bottom}" text-anchor="end"')
            + p.n(_chain(chains[longest][0]) + ".moves", "int", "text",
                  f' x="{w - 8}" y="{h - 8}" text-anchor="end"')
            + f'<text x="{left}" y="{h - 8}">moves</text>'
            + "".join(lines) + "</svg></figure>")


def _section_search(p: _Page, doc: Mapping) -> str:
    if p.v.llm:  # the parallelism is searched exhaustively, not by MCMC chains
        return ""
    charts = []
    for r, rnd in enumerate(doc["search"]["history"]):
        title = p.text("span", ["TopoOpt shard, round ", (f"search.history[{r}].round", "int"),
                                ": ", (f"search.history[{r}].stop", "str")])
        charts.append(_curves(p, title, [(f"search.history[{r}].chains[{k}].curve_s", c["curve_s"])
                                         for k, c in enumerate(rnd["chains"])]))
    for name in _fabric_names(doc)[1:]:
        f = doc["fabrics"][name]
        title = p.text("span", [f"{name}: ", (f"fabrics.{name}.search.stop", "str")])
        charts.append(_curves(p, title, [(f"fabrics.{name}.search.chains[{k}].curve_s",
                                          c["curve_s"])
                                         for k, c in enumerate(f["search"]["chains"])]))
    return ('<section id="search"><h2>Search convergence</h2>'
            "<p>Each MCMC chain's best iteration time so far against its moves (one line per "
            "chain; a search stops once its chains agree within the tolerance).</p>"
            f'<div class="cols">{"".join(charts)}</div></section>')


def _section_ports(p: _Page, doc: Mapping) -> str:
    t = doc["topology"]
    tx, rx = {}, {}
    for i, (a, pa, b, pb) in enumerate(t["links"]):
        tx[a, pa], rx[b, pb] = i, i
    head = "".join(f"<th>port {p.ids(q)}</th>" for q in range(t["ports"]))
    rows = []
    for s in range(t["servers"]):
        cells = []
        for q in range(t["ports"]):
            out = []
            if (s, q) in tx:
                i = tx[s, q]
                out.append(p.text("div", ["tx \u2192 ", (f"topology.links[{i}][2]", "int"),
                                          ".", (f"topology.links[{i}][3]", "int"), " ",
                                          (f"topology.labels[{i}]", "str")]))
            if (s, q) in rx:
                i = rx[s, q]
                out.append(p.text("div", ["rx \u2190 ", (f"topology.links[{i}][0]", "int"),
                                          ".", (f"topology.links[{i}][1]", "int")]))
            cells.append(f"<td>{''.join(out) or 'unused'}</td>")
        rows.append(f"<tr>{p.ids(s, 'th')}{''.join(cells)}</tr>")
    return ('<section id="ports"><h2>Port map</h2><p>What the patch panel or OCS connects: '
            "per server and port, where its transmitter goes (server.port, link label) and "
            "where its receiver hears from.</p>"
            f'<table class="grid ports"><tr><th>server</th>{head}</tr>{"".join(rows)}</table>'
            "</section>")


def _section_extras(p: _Page, extras: Mapping[str, Any]) -> str:
    if not extras:
        return ""
    out = []
    for name, data in extras.items():
        f = f"@{name}:"
        if _kind(data) == "validate":
            rows = "".join(
                f"<tr><td>{p.n(f'{f}fabrics[{i}].fabric', 'str')}</td>"
                f"<td>{p.n(f'{f}fabrics[{i}].predicted_s', 'time')}</td>"
                f"<td>{p.n(f'{f}fabrics[{i}].flow_s', 'time')}</td>"
                f"<td>{p.n(f'{f}fabrics[{i}].ns3_s', 'time')}</td>"
                f"<td>{p.n(f'{f}fabrics[{i}].ns3_s/{f}fabrics[{i}].predicted_s', 'ratio')}</td>"
                "</tr>" for i in range(len(data["fabrics"])))
            out.append(f"<h3>{p.n(f, 'str')}: packet-level validation ({_NS3})</h3>"
                       '<table class="grid"><tr><th>fabric</th><th>predicted</th>'
                       f"<th>flow-level</th><th>{_NS3}</th><th>{_NS3} / predicted</th></tr>"
                       f"{rows}</table>")
        else:
            sc = data["scenario"]
            what = [p.n(f"{f}scenario.{k}", "str") for k in ("collective", "kind", "fabric")
                    if isinstance(sc.get(k), str) and sc.get(k)]
            setting = [p.n(f"{f}scenario.{k}", unit) + f" {label}" for k, unit, label in (
                ("size", "size", "per collective"), ("congested", "int", "congested servers"),
                ("p", "int", "flows each"), ("capacity", "bw", "external capacity"),
                ("epochs", "int", "epochs"), ("warmup", "int", "warm-up epochs"))
                if isinstance(sc.get(k), (int, float)) and not isinstance(sc.get(k), bool)]
            cols = [("mean_s", "time", "mean"), ("p95_s", "time", '<abbr title="95th percentile">p95</abbr>'),
                    ("algbw_Bps", "size", "algorithm bandwidth")]
            cols = [c for c in cols if all(c[0] in data[k] for k in ("baseline", "react"))]
            head = "".join(f"<th>{label}</th>" for _, _, label in cols)
            body = "".join(
                f"<tr><th>{k}</th>" + "".join(
                    f"<td>{p.n(f'{f}{k}.{c}', unit)}{'/s' if c == 'algbw_Bps' else ''}</td>"
                    for c, unit, _ in cols) + "</tr>" for k in ("baseline", "react"))
            changes = (f", {p.n(f'#{f}changes', 'int')} changes of the schedule"
                       if isinstance(data.get("changes"), list) else "")
            out.append(f"<h3>{p.n(f, 'str')}: REACT ({', '.join(what)})</h3>"
                       f"<p>{', '.join(setting)}</p>"
                       f'<table class="grid"><tr><th></th>{head}</tr>{body}</table>'
                       "<p>REACT's speed-up on the mean: "
                       + p.n(f"{f}baseline.mean_s/{f}react.mean_s", "ratio") + changes
                       + "</p>")
    return ('<section id="validation"><h2>Validation and REACT runs</h2>'
            + "".join(out) + "</section>")


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#222;
margin:0 auto;max-width:1400px;padding:0 24px 40px}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:18px;border-bottom:1px solid #ccc;
padding-bottom:3px;margin-top:30px}h3{font-size:15px}
nav a{margin-right:12px}
table{border-collapse:collapse;margin:6px 0 12px}caption{text-align:left;font-weight:600;
padding:4px 0}
.kv th{text-align:left;font-weight:normal;color:#555;padding:2px 12px 2px 0}
.grid th,.grid td{border:1px solid #ddd;padding:3px 7px;text-align:right}
.grid th{background:#f4f4f4}.grid tr.fabric th{text-align:left}.grid td.order{text-align:left;font-family:monospace;
font-size:12px;max-width:520px}
.ports td{font-size:11px;text-align:left;white-space:nowrap}
.cols{display:flex;flex-wrap:wrap;gap:22px;align-items:flex-start}
.topo{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
.legend{list-style:none;padding:0;min-width:220px}.legend li{margin:3px 0}
.legend svg{vertical-align:middle;margin-right:6px}
.swatch{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px}
svg text{font-size:11px;fill:#222}svg .axis{fill:#555;stroke:#999}
.link{stroke-linecap:round;opacity:.85}.link.mp{opacity:.7}.link.spare{opacity:.45}
.link:hover{opacity:1;stroke-width:6}
.route{fill:none;stroke:#7f7f7f;stroke-width:1;stroke-dasharray:1 3;opacity:.6}
.server circle{fill:#555;stroke:#fff;stroke-width:1}.server text{fill:#111}
.curve{fill:none;stroke-width:1.6}
figure{margin:0}figcaption{font-weight:600;margin-bottom:4px}
.scale{font-size:12px;color:#444}.scale svg{vertical-align:middle}
.strategy{font-family:monospace;font-size:12px}
.summary{font-size:15px;background:#f3f7fb;border-left:4px solid #1f77b4;padding:8px 12px}
@media print{body{max-width:none;padding:0;font-size:11px}nav{display:none}
section{break-inside:avoid-page}#ports,#topology{break-before:page}
.link:hover{stroke-width:inherit}a{color:inherit;text-decoration:none}}
"""


def build_report(doc: Mapping, extras: Mapping[str, Any] | None = None) -> str:
    """The report of a plan document as one self-contained HTML page.

    Parameters
    ----------
    doc : dict
        A ``plan.json`` document (:func:`topoopt.plans.plan_to_json`, checked).
    extras : mapping, optional
        Validation and REACT results by file name (:func:`report_extras`).

    Returns
    -------
    str
        The page; the same document gives the same page, byte for byte.

    References
    ----------
    TopoOpt (NSDI'23) §4 (the alternating search and TopologyFinder's rings, strides and
    MP links), Figures 8 and 9 (traffic before and after).
    """
    extras = dict(extras or {})
    p = _Page(_Values(doc, extras))
    heading = p.text("h1", ["Plan: ", ("job.model", "str"), " on ", ("cluster.servers", "int"),
                            " servers \u00d7 ", ("cluster.nics", "int"), " ports"])
    sections = [_summary(p, doc), _section_job(p, doc), _section_fabrics(p, doc),
                _section_topology(p, doc), _section_rings(p, doc), _section_traffic(p, doc),
                _section_search(p, doc), _section_ports(p, doc), _section_extras(p, extras)]
    body = "".join(sections)
    nav = " ".join(f'<a href="#{k}">{v}</a>' for k, v in (
        ("job", "job"), ("fabrics", "fabrics"), ("topology", "topology"), ("rings", "rings"),
        ("traffic", "traffic"), ("search", "search"), ("ports", "port map"),
        ("validation", "validation")) if f'<section id="{k}">' in body)
    files = ", ".join(p.n(f"files[{i}]", "str") for i in range(len(doc.get("files", []))))
    title = "topoopt plan report"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
            f"<title>{_esc(title)}</title>"
            '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
            f"<style>{_CSS}</style></head><body>{heading}"
            f'<p class="sub">{p.n("config", "str")} \u00b7 format {p.n("format", "str")}</p>'
            f"<nav>{nav}</nav>" + body
            + (f'<footer><h2>Files of this plan</h2><p>{files}</p></footer>' if files else "")
            + "</body></html>\n")


# ----------------------------------------------------------------------- checker
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
    values = _Values(doc, extras)
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
            want = " ".join(_fmt(unit, values(key)).split())
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
    want = {"servers": t["servers"], "links": len(t["links"]),
            "fabrics": len(doc["iteration_time_s"])}
    for what, n in want.items():
        if counts[what] != n:
            raise PlanCheckError(f"report.html draws {counts[what]} {what} but the plan has "
                                 f"{n}; write the report again (topoopt report DIR)")
    if reader.tags.get("script") or re.search(r"""(src|href)=["']?(https?:)?//""", text):
        raise PlanCheckError("report.html loads a script or an external resource; it must "
                             "be one self-contained page")
    return {"fields": checked, **counts}
