"""Plan pictures: traffic heatmaps (TopoOpt Figures 1, 8, 9), the topology, fabric bars;
and the iteration times of a shared cluster per fabric (Fig. 16)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from topoopt._io import atomic_path
from topoopt.errors import TopoOptError
from topoopt.finder.topology_finder import TopologyPlan
from topoopt.plans.interface import PlanLike

__all__ = ["require_matplotlib", "plot_heatmap", "plot_topology", "plot_fabrics",
           "plot_cluster", "write_plan_plots"]


def require_matplotlib():
    """Import matplotlib (Agg backend) or fail with how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise TopoOptError("pictures need matplotlib: pip install 'topoopt[plot]'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_heatmap(matrix: np.ndarray, title: str, path: str) -> None:
    """Draw a server-to-server traffic heatmap (TopoOpt Figure 1 style) to a PNG."""
    from matplotlib.colors import LogNorm

    plt = require_matplotlib()
    n = matrix.shape[0]
    fig, ax = plt.subplots(figsize=(6.4, 5.4), dpi=120)
    data = np.ma.masked_equal(matrix, 0.0)
    positive = matrix[matrix > 0]
    norm = LogNorm(vmin=positive.min(), vmax=positive.max()) if positive.size else None
    image = ax.imshow(data, cmap="viridis_r", norm=norm, interpolation="nearest")
    ax.set_facecolor("white")
    ax.set_xlabel("destination server")
    ax.set_ylabel("source server")
    ax.set_title(title, fontsize=10)
    step = max(1, n // 16)
    ax.set_xticks(range(0, n, step))
    ax.set_yticks(range(0, n, step))
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("bytes per iteration")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def plot_topology(plan: TopologyPlan, title: str, path: str) -> None:
    """Draw servers on a circle, links as chords coloured by ring stride (MP in black)."""
    from matplotlib.collections import LineCollection

    plt = require_matplotlib()
    topo = plan.topology
    n = topo.servers
    angle = 2 * np.pi * np.arange(n) / n
    xy = np.c_[np.cos(angle), np.sin(angle)]
    kinds = sorted(set(topo.labels), key=lambda s: (s == "mp", s))
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(6.4, 6.4), dpi=120)
    for i, kind in enumerate(kinds):
        segs = [(xy[a], xy[b]) for (a, _, b, _), lab in zip(topo.links, topo.labels)
                if lab == kind]
        color = "black" if kind == "mp" else cmap(i % 10)
        ax.add_collection(LineCollection(segs, colors=[color], linewidths=0.6,
                                         alpha=0.35 if kind == "mp" else 0.7,
                                         label=f"{kind} ({len(segs)} links)"))
    ax.scatter(xy[:, 0], xy[:, 1], s=max(2, 400 / n), c="tab:gray", zorder=3)
    ax.set_aspect("equal")
    ax.set_axis_off()
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize=7,
              frameon=False)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def plot_fabrics(names: list[str], times: list[float], costs: list[float], title: str,
                 path: str) -> None:
    """Bar charts of iteration time and interconnect cost per fabric, side by side."""
    plt = require_matplotlib()
    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(9.0, 3.6), dpi=120)
    colors = ["tab:blue" if n == "topoopt" else "tab:gray" for n in names]
    ax_t.bar(names, np.asarray(times) * 1e3, color=colors)
    ax_t.set_ylabel("iteration time (ms)")
    ax_c.bar(names, costs, color=colors)
    ax_c.set_ylabel("interconnect cost (relative units)")
    for ax, values, fmt in ((ax_t, np.asarray(times) * 1e3, "{:.3g}"), (ax_c, costs, "{:,.0f}")):
        for i, v in enumerate(values):
            ax.annotate(fmt.format(v), (i, v), ha="center", va="bottom", fontsize=7)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def plot_cluster(classes: list[str], fabrics: dict, title: str, path: str) -> None:
    """Mean iteration time per kind of job and fabric (bars), p99 as a tick above
    each bar: a shared cluster (TopoOpt Fig. 16).

    ``fabrics`` maps a fabric name to ``(means, p99s)``, seconds, one per class.
    """
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(7.2, 3.8), dpi=120)
    width = 0.8 / max(len(fabrics), 1)
    others = iter(["tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"])
    x = np.arange(len(classes))
    for i, (name, (means, p99s)) in enumerate(fabrics.items()):
        color = "tab:blue" if name == "topoopt" else next(others)
        pos = x + (i - (len(fabrics) - 1) / 2) * width
        ax.bar(pos, np.asarray(means) * 1e3, width * 0.9, color=color, label=name)
        ax.scatter(pos, np.asarray(p99s) * 1e3, marker="_", s=120, color="black", zorder=3)
    ax.set_xticks(x, classes)
    ax.set_yscale("log")
    ax.set_ylabel("iteration time (ms); tick: p99")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def write_plan_plots(plan: PlanLike, directory: str | Path) -> list[Path]:
    """The pictures of a plan: traffic before/after (TopoOpt Figures 8/9), topology, fabrics.

    The heatmaps are the plan's :meth:`~topoopt.plans.PlanLike.traffic_heatmaps`: for an
    operator strategy, ``traffic_before.png`` is the start strategy's traffic with one
    ring per AllReduce group in member order and ``traffic_after.png`` the planned
    strategy's traffic over the planned rings (bytes split across each group's rings);
    for an LLM plan, its pipeline, expert and DP traffic before and after the rings.
    """
    directory = Path(directory)
    c, model = plan.cluster, plan.model
    out = []
    for which, (matrix, title) in plan.traffic_heatmaps().items():
        out.append(directory / f"traffic_{which}.png")
        plot_heatmap(matrix, title, str(out[-1]))
    out.append(directory / "topology.png")
    plot_topology(plan.topology_plan, f"{model.name}: {c.servers} servers x {c.nics} ports",
                  str(out[-1]))
    out.append(directory / "fabrics.png")
    times, costs = plan.iteration_time_s, plan.costs
    plot_fabrics(list(times), list(times.values()), [costs[n] for n in times],
                 f"{model.name}, {c.servers} servers, d={c.nics}", str(out[-1]))
    return out
