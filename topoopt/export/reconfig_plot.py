"""The picture of TopoOpt Figure 17: iteration time against reconfiguration latency."""

from __future__ import annotations

from typing import Sequence

from topoopt._io import atomic_path
from topoopt.export.plots import require_matplotlib
from topoopt.reconfig.sweep import LatencySweep

__all__ = ["plot_latency_sweep"]


def plot_latency_sweep(sweeps: Sequence[LatencySweep], path: str) -> None:
    """One panel per sweep: OCS-reconfig-FW and -noFW against the latency (log axes),
    TopoOpt's constant iteration time as a horizontal line (TopoOpt Figure 17)."""
    plt = require_matplotlib()
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4.6 * len(sweeps), 3.6), dpi=120,
                             squeeze=False)
    for ax, sw in zip(axes[0], sweeps):
        ax.axhline(sw.topoopt * 1e3, color="tab:blue", label="TopoOpt")
        for fw, color, label in ((True, "tab:purple", "OCS-reconfig-FW"),
                                 (False, "tab:orange", "OCS-reconfig-noFW")):
            pts = sw.series(fw)
            if pts:
                lat = [max(p.latency, 1e-9) * 1e6 for p in pts]
                ax.plot(lat, [p.total * 1e3 for p in pts], marker="o", color=color,
                        label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        values = [sw.topoopt] + [p.total for p in sw.points]
        lo, hi = min(values) * 1e3, max(values) * 1e3
        if hi < 2 * lo:        # a flat sweep: linear from 0, not float noise magnified
            ax.set_yscale("linear")
            ax.set_ylim(0, hi * 1.3)
        ax.set_xlabel("reconfiguration latency (us)")
        ax.set_ylabel("iteration time (ms)")
        ax.set_title(f"{sw.model} ({sw.strategy}), n={sw.servers}, d={sw.ports}, "
                     f"B={sw.link_bandwidth / 1e9:g} Gb/s", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
