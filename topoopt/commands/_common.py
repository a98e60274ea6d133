"""Helpers shared by CLI commands: config loading and every table's validation, option
types with documented bounds, output places, tables, optional extras."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator, Sequence

import click

from topoopt._io import check_writable
from topoopt._require import MAX_SEED
from topoopt.config import PLAN_BOUNDS, PLAN_DEFAULTS, PLAN_KEYS, Config, load_config
from topoopt.errors import ConfigError
from topoopt.export.plots import require_matplotlib
from topoopt.fabrics.cost import price_table
from topoopt.planners.llm import check_fixed
from topoopt.planners.planner import require_baselines
from topoopt.react.loop import ReactParams
from topoopt.strategy import data_parallel, hybrid
from topoopt.units import format_time
from topoopt.workloads import model_of
from topoopt.workloads.gpt import is_transformer

__all__ = ["config_argument", "read_config", "print_table", "require_matplotlib",
           "strategy_option", "build_strategy", "ProgressLine", "SEED", "MAX_SEED",
           "PLAN_KEYS", "PLAN_BOUNDS", "PLAN_DEFAULTS", "output_file",
           "MAX_WORKERS", "options_named"]

config_argument = click.argument("config", type=click.Path(dir_okay=False))

#: Seeds are 0 .. MAX_SEED (topoopt._require).
SEED = click.IntRange(0, MAX_SEED)


#: Local worker processes (--workers): more than this is a typo, not a machine.
MAX_WORKERS = 256


@contextlib.contextmanager
def options_named(**fields: str) -> Iterator[None]:
    """Re-raise a library's :class:`ConfigError` for ``field`` as one naming its CLI
    option (``options_named(warmup="--warmup")``): the user typed the option."""
    try:
        yield
    except ConfigError as exc:
        if exc.field in fields:
            raise ConfigError(fields[exc.field], exc.value, exc.allowed) from None
        raise


def output_file(path: str | None, option: str) -> str | None:
    """Check, before any work, that ``option``'s file can be written (one-line error)."""
    if path is not None:
        check_writable(path, option)
    return path

strategy_option = click.option(
    "--strategy", type=click.Choice(["dp", "hybrid"]), default="hybrid",
    help="dp: every operator data parallel; hybrid: embedding tables model-parallel "
         "(spread evenly), the rest data parallel (TopoOpt §2).")


def read_config(path: str) -> Config:
    """Load a config and validate every table in it, whichever command reads it: a typo
    in ``[plan]``, ``[cost]`` or ``[react]`` is an error even where that table is unused.
    Errors surface as one line through the CLI group."""
    cfg = load_config(path)   # [cluster], [job], [plan]
    parallel = cfg.plan_settings.parallel
    if parallel and not is_transformer(model_of(cfg.job)):
        raise ConfigError("plan.parallel", dict(parallel), f"only an LLM or MoE job takes a "
                          f"parallelism; {cfg.job.model} is planned by the strategy search: "
                          "remove it")
    check_fixed(parallel)
    require_baselines(cfg.plan_settings.baselines)
    price_table(cfg.cost)
    ReactParams.from_mapping(cfg.react)
    return cfg


def build_strategy(cfg: Config, name: str):
    """The model of ``cfg`` and the named reference strategy on its cluster."""
    model = model_of(cfg.job)
    make = {"dp": data_parallel, "hybrid": hybrid}[name]
    return model, make(model, cfg.cluster.servers)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
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
        self.line: str | None = None
        self.stage: str | None = None
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
