"""Helpers shared by CLI commands: config loading and every table's validation, option
types with documented bounds, output places, tables, optional extras."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator

import click

from topoopt._io import check_writable
from topoopt._require import require_int, require_keys
from topoopt.config import Config, load_config
from topoopt.errors import ConfigError
from topoopt.export.plots import require_matplotlib
from topoopt.fabrics.catalog import FABRICS
from topoopt.fabrics.cost import price_table
from topoopt.plans import BASELINES
from topoopt.react.loop import ReactParams
from topoopt.strategy import data_parallel, hybrid
from topoopt.units import format_time
from topoopt.workloads import model_of

__all__ = ["config_argument", "read_config", "print_table", "require_matplotlib",
           "strategy_option", "build_strategy", "ProgressLine", "SEED", "MAX_SEED",
           "PLAN_KEYS", "PLAN_BOUNDS", "plan_settings", "output_file", "MAX_WORKERS",
           "options_named"]

config_argument = click.argument("config", type=click.Path(dir_okay=False))

#: Seeds are 0 .. 2**32 - 1 (numpy's legacy seeding range; negative seeds are refused).
MAX_SEED = 2 ** 32 - 1
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


#: Keys of a config's [plan] table (CLI options override them).
PLAN_KEYS = ("budget", "rounds", "chains", "seed", "tolerance", "baselines", "routing",
             "k_paths", "primes_only", "mp_decay", "parallel")
#: The search effort's bounds (docs/limits.md), for the [plan] table and the options.
PLAN_BOUNDS = {"budget": (0, 10 ** 8), "rounds": (1, 1000), "chains": (1, 256),
               "seed": (0, MAX_SEED), "k_paths": (1, 64)}
DEFAULTS = {"budget": 200, "rounds": 2, "chains": 2, "seed": 0, "tolerance": 0.01}


def plan_settings(table, **cli) -> dict:
    """Merge a config's [plan] table with CLI options (CLI wins), validated."""
    require_keys("plan", table, PLAN_KEYS)
    for key in ("budget", "rounds", "chains", "seed", "k_paths"):
        if key in table:
            low, high = PLAN_BOUNDS[key]
            require_int(f"plan.{key}", table[key], minimum=low, maximum=high)
    if "tolerance" in table:
        t = table["tolerance"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < 1:
            raise ConfigError("plan.tolerance", t, "must be a fraction in [0, 1), e.g. 0.01")
    out = {**DEFAULTS, **{k: table[k] for k in DEFAULTS if k in table}}
    out.update({k: v for k, v in cli.items() if v is not None})
    baselines = table.get("baselines", BASELINES)
    allowed = [n for n in FABRICS if n != "topoopt"]
    if isinstance(baselines, str) or not isinstance(baselines, (list, tuple)):
        raise ConfigError("plan.baselines", baselines,
                          f"must be a list of fabric names, e.g. [\"ideal\"]; use some of "
                          f"{', '.join(allowed)}")
    for name in baselines:
        if name not in allowed:
            raise ConfigError("plan.baselines", name, f"use some of {', '.join(allowed)}")
    if len(set(baselines)) != len(baselines):
        raise ConfigError("plan.baselines", list(baselines), "list each fabric once")
    out["baselines"] = tuple(baselines)
    parallel = table.get("parallel", {})  # an LLM job's fixed degrees (planners/llm.py)
    if not isinstance(parallel, dict):
        raise ConfigError("plan.parallel", parallel, "must be a table, e.g. {ep = 8}")
    out["parallel"] = dict(parallel)
    finder = {}
    if "routing" in table:
        if table["routing"] not in ("kshortest", "lp"):
            raise ConfigError("plan.routing", table["routing"], "use 'kshortest' or 'lp'")
        finder["routing"] = table["routing"]
    if "k_paths" in table:
        finder["k_paths"] = table["k_paths"]
    if "primes_only" in table:
        if not isinstance(table["primes_only"], bool):
            raise ConfigError("plan.primes_only", table["primes_only"], "must be true or false")
        finder["primes_only"] = table["primes_only"]
    if "mp_decay" in table:
        d = table["mp_decay"]
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 < d <= 1:
            raise ConfigError("plan.mp_decay", d, "must be a factor in (0, 1] (paper: 0.5)")
        finder["mp_decay"] = float(d)
    out["finder_kwargs"] = finder
    return out


def read_config(path: str) -> Config:
    """Load a config and validate every table in it, whichever command reads it: a typo
    in ``[plan]``, ``[cost]`` or ``[react]`` is an error even where that table is unused.
    Errors surface as one line through the CLI group."""
    cfg = load_config(path)
    plan_settings(cfg.plan)
    price_table(cfg.cost)
    ReactParams.from_mapping(cfg.react)
    return cfg


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
