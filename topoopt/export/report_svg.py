"""The plan report's markup: :class:`Page`, through which every number goes with its
source and unit, and the inline SVG figures (bar charts, the topology, traffic
heatmaps, search curves).

No script: each figure is static SVG with a hover ``<title>`` per element (TopoOpt
Figures 8 and 9 for the heatmaps, §4 for the rings and the MCMC search).
"""

from __future__ import annotations

import html
import math
from typing import Any, Mapping

import numpy as np

from topoopt.export.report_values import PlanValues, format_value

__all__ = ["STRIDE_COLOURS", "FORWARDED", "esc", "Page", "stride_of", "colour_of", "bar_chart",
           "topology_section", "heatmap_figure", "curves_figure"]

#: Heatmap colours, light (few bytes) to dark (many), log-spaced bins (viridis, reversed).
_HEAT = ("#fde725", "#b5de2b", "#6ece58", "#35b779", "#1f9e89", "#26828e", "#31688e",
         "#3e4989", "#482878", "#440154")
#: Colours of ring strides, in order of stride (Tableau 10 without grey).
STRIDE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                  "#bcbd22", "#17becf")
FORWARDED = "#7f7f7f"
#: Heatmaps of up to this many servers get a hover title per cell.
_CELLS_TITLED = 32
#: Up to this many forwarded paths are drawn one by one, with a hover title each.
_ROUTES_DRAWN = 400


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


class Page:
    """Markup helpers: every number goes through :meth:`n` or :meth:`text`."""

    def __init__(self, values: PlanValues):
        self.v = values

    def n(self, expr: str, unit: str, tag: str = "span", attrs: str = "") -> str:
        """One number (or string field) with its source and unit."""
        text = format_value(unit, self.v(expr))
        return (f'<{tag}{attrs} data-f="{esc(expr)}" data-u="{unit}">{esc(text)}'
                f'</{tag}>')

    def text(self, tag: str, parts: list, attrs: str = "", ids: bool = False) -> str:
        """An element whose text mixes literals and ``(expr, unit)`` values."""
        keys, units, out = [], [], []
        for p in parts:
            if isinstance(p, tuple):
                keys.append(p[0])
                units.append(p[1])
                out.append(format_value(p[1], self.v(p[0])))
            else:
                out.append(str(p))
        meta = (f' data-f="{esc(";".join(keys))}" data-u="{";".join(units)}"' if keys else "")
        mark = ' data-ids=""' if ids else ""
        return f'<{tag}{attrs}{meta}{mark}>{esc("".join(out))}</{tag}>'

    def ids(self, text: Any, tag: str = "span", attrs: str = "") -> str:
        """A server, port, ring or chain number."""
        return f'<{tag}{attrs} data-ids="">{esc(text)}</{tag}>'


def stride_of(label: str) -> int:
    return int(label.split("=")[1]) if "=" in label else 0


def colour_of(label: str, strides: list[int]) -> str:
    if label == "mp":
        return "#000000"
    return STRIDE_COLOURS[strides.index(stride_of(label)) % len(STRIDE_COLOURS)]


def _key(pattern: str, name: str) -> str:
    return pattern.format(name) if "{}" in pattern else f"{pattern}.{name}"


def bar_chart(p: Page, names: list[str], pattern: str, unit: str, label: str) -> str:
    values = [float(p.v(_key(pattern, n))) for n in names]
    top = max(values) or 1.0
    row, left, width = 22, 92, 220
    out = [f'<svg class="bars" viewBox="0 0 {left + width + 80} {row * len(names) + 30}" '
           f'width="{left + width + 80}" role="img"><text class="axis" x="0" y="14">'
           f'{esc(label)}</text>']
    for i, (n, v) in enumerate(zip(names, values)):
        y = 24 + i * row
        w = max(1.0, width * v / top)
        colour = "#1f77b4" if n == "topoopt" else "#9a9a9a"
        out.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{esc(n)}</text>'
                   f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{row - 6}" '
                   f'fill="{colour}"/>'
                   + p.n(_key(pattern, n), unit, "text", f' x="{left + w + 4:.1f}" y="{y + 13}"'))
    return "".join(out) + "</svg>"


def topology_section(p: Page, doc: Mapping) -> str:
    t = doc["topology"]
    n, links, labels = t["servers"], t["links"], t["labels"]
    strides = sorted({stride_of(lab) for lab in labels if lab != "mp"})
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
                     f'stroke="{colour_of(lab, strides)}" stroke-width="{width:.2f}"{dash}>'
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
        at = [f"{x:.0f} {y:.0f}" for x, y in xy]     # each server's point, formatted once
        d = "".join("M" + "L".join([at[s] for s in path]) for _, _, path in forwarded)
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
                                                  stride_of(s), s)):
        first = labels.index(lab)
        swatch = colour_of(lab, strides)
        dash = ' stroke-dasharray="4 3"' if lab.startswith("spare") else ""
        legend.append(f'<li><svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" '
                      f'stroke="{swatch}" stroke-width="3"{dash}/></svg>'
                      + p.n(f"topology.labels[{first}]", "str") + ": "
                      + p.n(f"topology.labels~{lab}", "int") + " links</li>")
    if routes:
        legend.append(f'<li><svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" '
                      f'stroke="{FORWARDED}" stroke-width="2" stroke-dasharray="1 3"/></svg>'
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


def heatmap_figure(p: Page, which: str, caption: str) -> str:
    m = getattr(p.v, which)
    n = m.shape[0]
    positive = m[m > 0]
    if not positive.size:
        return f"<figure><figcaption>{esc(caption)}: no traffic</figcaption></figure>"
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
    return (f'<figure class="heatmap"><figcaption>{esc(caption)}</figcaption>'
            f'<svg class="heat" data-which="{which}" viewBox="0 0 {n} {n}" '
            f'width="{px}" height="{px}" shape-rendering="crispEdges" role="img">'
            f'<rect x="0" y="0" width="{n}" height="{n}" fill="#ffffff" stroke="#999999" '
            f'stroke-width="{n / 300:.3f}"/>{"".join(paths)}</svg>'
            f'<div class="scale">{p.n(f"traffic:{which}:min", "size")} '
            f'<svg width="{18 * bins}" height="10">{bar}</svg> '
            f'{p.n(f"traffic:{which}:max", "size")} per server pair per iteration '
            f"(log scale; rows send, columns receive; white: none)</div></figure>")


def _chain(curve_field: str) -> str:
    """``...chains[k]`` of ``...chains[k].curve_s``."""
    return curve_field.rsplit(".", 1)[0]


def curves_figure(p: Page, title: str, chains: list[tuple[str, list]]) -> str:
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
        colour = STRIDE_COLOURS[k % len(STRIDE_COLOURS)]
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


