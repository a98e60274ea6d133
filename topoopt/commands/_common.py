"""Helpers shared by CLI commands: config loading, tables, optional extras."""

from __future__ import annotations

import sys
import time

import click

from topoopt.config import Config, load_config
from topoopt.export.plots import require_matplotlib
from topoopt.strategy import data_parallel, hybrid
from topoopt.units import format_time
from topoopt.workloads import model_of

__all__ = ["config_argument", "read_config", "print_table", "require_matplotlib",
           "strategy_option", "build_strategy", "ProgressLine"]

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
    model = model_of(cfg.job)
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


class ProgressLine:
    """Progress of long work on stderr: one line rewritten in place on a terminal,
    else one line per finished stage; nothing with ``enabled=False``."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.line = None
        self.stage = None
        self.last = 0.0
        self.t0 = time.monotonic()

    def update(self, stage: str, text: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not self.tty and stage != self.stage and self.line:
            click.echo(self.line, err=True)
        self.line = f"{stage}: {text} ({now - self.t0:.0f} s)"
        if self.tty and (now - self.last > 0.2 or stage != self.stage):
            click.echo("\r" + self.line.ljust(78), err=True, nl=False)
            self.last = now
        self.stage = stage

    def done(self) -> None:
        if self.enabled and self.line:
            click.echo(("\r" + " " * 78 + "\r") if self.tty else self.line, err=True,
                       nl=not self.tty)


def print_react_comparison(res, size: float, warmup: int, epochs: int) -> None:
    """The without/with REACT table of a run (mean and p95 epoch time, algorithm
    bandwidth) and the line that says how much it changed."""
    rows = []
    for label, which in (("without REACT", "baseline"), ("with REACT", "react")):
        rows.append([label, format_time(res.mean(which)), format_time(res.p95(which)),
                     f"{size / res.mean(which) / 1e9:.3f}"])
    print_table(["", "mean time", "p95 time", "algbw GB/s"], rows)
    click.echo(f"algorithm bandwidth change: {100 * res.improvement:+.1f}% "
               f"(epochs {warmup}..{epochs - 1}); pattern fixed from epoch "
               f"{res.converged_epoch}")
