"""``topoopt workloads``: the built-in models with their sizes."""

from __future__ import annotations

from collections import Counter

import click

from topoopt.commands._common import print_table
from topoopt.workloads import MODEL_NAMES, build_model

__all__ = ["workloads"]


@click.command()
def workloads() -> None:
    """List the built-in models: parameters, FLOPs per sample and operator kinds.

    Sizes are the defaults of the TopoOpt evaluation; override any of them in a
    config's [job.size] table.
    """
    rows = []
    for name in MODEL_NAMES:
        m = build_model(name)
        kinds = Counter(op.kind for op in m.operators if op.kind != "input")
        rows.append([name, f"{m.params / 1e6:,.1f}M", f"{m.fwd_flops / 1e9:.3g}",
                     f"{(m.fwd_flops + m.bwd_flops) / 1e9:.3g}", len(m.operators),
                     ", ".join(f"{k} {c}" for k, c in sorted(kinds.items()))])
    print_table(["model", "params", "fwd GFLOP/sample", "fwd+bwd GFLOP/sample", "operators",
                 "kinds"], rows)
