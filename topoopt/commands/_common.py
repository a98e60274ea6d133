"""Helpers shared by CLI commands: config loading, tables, optional extras."""

from __future__ import annotations

import click

from topoopt.config import Config, load_config
from topoopt.export.plots import require_matplotlib

__all__ = ["config_argument", "read_config", "print_table", "require_matplotlib",
           "strategy_option", "build_strategy"]

config_argument = click.argument("config", type=click.Path(dir_okay=False))

strategy_option = click.option(
    "--strategy", type=click.Choice(["dp", "hybrid"]), default="hybrid",
    help="dp: every operator data parallel; hybrid: embedding tables model-parallel "
         "(spread evenly), the rest data parallel (TopoOpt §2).")


def read_config(path: str) -> Config:
    """Load a config; errors surface as one line through the CLI group."""
    return load_config(path)


def build_strategy(cfg: Config, name: str):
    """The model of ``cfg`` and the named reference strategy on its cluster."""
    from topoopt.strategy import data_parallel, hybrid

    model = cfg.job.build_model()
    make = {"dp": data_parallel, "hybrid": hybrid}[name]
    return model, make(model, cfg.cluster.servers)


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    """Print an aligned plain-text table (first column left, others right)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                for i, (c, w) in enumerate(zip(row, widths)))
    click.echo(fmt(headers))
    click.echo("  ".join("-" * w for w in widths))
    for row in cells:
        click.echo(fmt(row))
