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

The values behind the numbers are :mod:`topoopt.export.report_values`, the markup and
SVG figures :mod:`topoopt.export.report_svg`, the checker
:mod:`topoopt.export.report_check` (:func:`check_report`, re-exported here with
:func:`value_of` and :func:`report_extras`).
"""

from __future__ import annotations

from typing import Any, Mapping

from topoopt.export.report_check import check_report
from topoopt.export.report_svg import (
    FORWARDED,
    Page,
    bar_chart,
    colour_of,
    curves_figure,
    esc,
    heatmap_figure,
    stride_of,
    topology_section,
)
from topoopt.export.report_values import PlanValues, extras_kind, report_extras, value_of
from topoopt.fabrics.catalog import FABRICS

__all__ = ["REPORT", "build_report", "check_report", "report_extras", "value_of"]

#: The report's file name in a plan folder.
REPORT = "report.html"
#: The packet simulator's name (a <cite>: its digit is no number of the plan; the
#: checker skips <cite> and <abbr>, names and abbreviations such as p95).
_NS3 = "<cite>ns-3</cite>"


def _summary(p: Page, doc: Mapping) -> str:
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


def _section_job(p: Page, doc: Mapping) -> str:
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
    rows += [(f"model size: {esc(k)}",
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

    lines = "".join(f"<li>{p.n(f'describe:{i}', 'str')}</li>" for i in range(len(p.v.describe)))
    return ('<section id="job"><h2>Job and cluster</h2><div class="cols">'
            + _kv("Job and cluster", rows) + _kv("Search", search)
            + _kv("Planned topology", metrics) + "</div>"
            + f"<h3>TopoOpt strategy</h3><ul class=\"strategy\">{lines}</ul></section>")


def _kv(title: str, rows: list) -> str:
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv"><caption>{title}</caption>{body}</table>'


def _field(name: str, path: str) -> str:
    """A plan.json key as a row label (``zero1``: a name, not a number), its path on hover."""
    return f'<abbr title="{esc(path)}">{esc(name)}</abbr>'


def _unit(value: Any) -> str:
    return "str" if isinstance(value, (str, bool)) else "int" if isinstance(value, int) \
        else "num"


def _section_llm_job(p: Page, doc: Mapping, rows: list) -> str:
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


def _fabric_section(p: Page, doc: Mapping, head: tuple[str, str], cells, title,
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
        rows.append(f'<tr class="fabric" data-fabric="{esc(name)}"><th>{title(name)}'
                    f' ({esc(name)})</th>'
                    f'<td>{p.n(f"iteration_time_s.{name}", "time")}</td><td>{gap}</td>'
                    f'{middle}<td>{p.n(f"cost.{name}", "cost")}</td>'
                    f'<td>{p.n(f"cost.{name}/cost.topoopt", "ratio")}</td>{tail}</tr>')
    table = (f'<table id="fabric-table" class="grid"><tr><th>fabric</th><th>iteration</th>'
             f"<th>vs Ideal Switch</th>{head[0]}<th>cost (relative units)</th>"
             f'<th>cost ratio</th>{head[1]}</tr>{"".join(rows)}</table>')
    charts = "".join(bar_chart(p, names, key, unit, label) for key, unit, label in (
        ("iteration_time_s", "time", "iteration time"), second,
        ("cost", "cost", "interconnect cost (relative units)")))
    return ('<section id="fabrics"><h2>Fabrics compared</h2>'
            f"<p>{prose} Costs in relative units: one hundred is a one-hundred Gb/s "
            "transceiver.</p>" + table + f'<div class="cols">{charts}</div></section>')


def _section_fabrics(p: Page, doc: Mapping) -> str:
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


def _section_rings(p: Page, doc: Mapping) -> str:
    t = doc["topology"]
    hop: dict[tuple[int, int, str], list[int]] = {}
    for i, ((a, _, b, _), lab) in enumerate(zip(t["links"], t["labels"])):
        hop.setdefault((a, b, lab), []).append(i)
    strides = sorted({stride_of(lab) for lab in t["labels"] if lab != "mp"})
    rows = []
    for i, ring in enumerate(doc["rings"]):
        members, order = ring["members"], ring["order"]
        idx = {s: k for k, s in enumerate(members)}
        stride = (idx[order[1 % len(order)]] - idx[order[0]]) % len(members)
        lab = f"ring:p={stride}"
        first = hop.get((order[0], order[1 % len(order)], lab))
        kind = (p.n(f"topology.labels[{first[0]}]", "str") if ring["direct"] and first
                else "forwarded")
        colour = colour_of(lab, strides) if ring["direct"] and first else FORWARDED
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


def _section_traffic(p: Page, doc: Mapping) -> str:
    parts = []
    if p.v.llm:
        parts += [heatmap_figure(p, "before", "Before: one ring per DP group, in member order"),
                  heatmap_figure(p, "after", "After: the DP groups over the planned rings")]
        what = ("Bytes each server sends each other server in one iteration (pipeline and "
                "expert traffic, DP AllReduce ring hops; tensor parallelism stays on NVLink).")
    else:
        if p.v.before is not None:
            parts.append(heatmap_figure(p, "before",
                                        "Before: the start strategy, one ring per group"))
        parts.append(heatmap_figure(p, "after",
                                    "After: the planned strategy over the planned rings"))
        what = ("Bytes each server sends each other server in one iteration (MP transfers and "
                "AllReduce ring hops; <cite>TopoOpt Figs. 8, 9</cite>). The start strategy: "
                + p.n("search.start_strategy", "str") + ".")
    return ('<section id="traffic"><h2>Traffic</h2>'
            f"<p>{what}</p>"
            f'<div class="cols">{"".join(parts)}</div></section>')


def _section_search(p: Page, doc: Mapping) -> str:
    if p.v.llm:  # the parallelism is searched exhaustively, not by MCMC chains
        return ""
    charts = []
    for r, rnd in enumerate(doc["search"]["history"]):
        title = p.text("span", ["TopoOpt shard, round ", (f"search.history[{r}].round", "int"),
                                ": ", (f"search.history[{r}].stop", "str")])
        charts.append(curves_figure(p, title, [(f"search.history[{r}].chains[{k}].curve_s",
                                                c["curve_s"])
                                               for k, c in enumerate(rnd["chains"])]))
    for name in _fabric_names(doc)[1:]:
        f = doc["fabrics"][name]
        title = p.text("span", [f"{name}: ", (f"fabrics.{name}.search.stop", "str")])
        charts.append(curves_figure(p, title, [(f"fabrics.{name}.search.chains[{k}].curve_s",
                                                c["curve_s"])
                                               for k, c in enumerate(f["search"]["chains"])]))
    return ('<section id="search"><h2>Search convergence</h2>'
            "<p>Each MCMC chain's best iteration time so far against its moves (one line per "
            "chain; a search stops once its chains agree within the tolerance).</p>"
            f'<div class="cols">{"".join(charts)}</div></section>')


def _section_ports(p: Page, doc: Mapping) -> str:
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


def _section_extras(p: Page, extras: Mapping[str, Any]) -> str:
    if not extras:
        return ""
    out = []
    for name, data in extras.items():
        f = f"@{name}:"
        if extras_kind(data) == "validate":
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
    p = Page(PlanValues(doc, extras))
    heading = p.text("h1", ["Plan: ", ("job.model", "str"), " on ", ("cluster.servers", "int"),
                            " servers \u00d7 ", ("cluster.nics", "int"), " ports"])
    sections = [_summary(p, doc), _section_job(p, doc), _section_fabrics(p, doc),
                topology_section(p, doc), _section_rings(p, doc), _section_traffic(p, doc),
                _section_search(p, doc), _section_ports(p, doc), _section_extras(p, extras)]
    body = "".join(sections)
    nav = " ".join(f'<a href="#{k}">{v}</a>' for k, v in (
        ("job", "job"), ("fabrics", "fabrics"), ("topology", "topology"), ("rings", "rings"),
        ("traffic", "traffic"), ("search", "search"), ("ports", "port map"),
        ("validation", "validation")) if f'<section id="{k}">' in body)
    files = ", ".join(p.n(f"files[{i}]", "str") for i in range(len(doc.get("files", []))))
    title = "topoopt plan report"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
            f"<title>{esc(title)}</title>"
            '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
            f"<style>{_CSS}</style></head><body>{heading}"
            f'<p class="sub">{p.n("config", "str")} \u00b7 format {p.n("format", "str")}</p>'
            f"<nav>{nav}</nav>" + body
            + (f'<footer><h2>Files of this plan</h2><p>{files}</p></footer>' if files else "")
            + "</body></html>\n")


