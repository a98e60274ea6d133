"""``topoopt sweep-reconfig``: OCS-reconfig against its reconfiguration latency (TopoOpt Fig. 17)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from topoopt._io import atomic_write_text, check_writable, shown
from topoopt.commands._common import (
    SEED,
    ProgressLine,
    build_strategy,
    config_argument,
    options_named,
    print_table,
    read_config,
    require_matplotlib,
    strategy_option,
)
from topoopt.errors import ConfigError
from topoopt.export.reconfig_plot import plot_latency_sweep
from topoopt.interrupt import graceful_interrupt, stop_requested
from topoopt.reconfig.sweep import latency_sweep
from topoopt.units import format_time, parse_time

__all__ = ["sweep_reconfig"]

#: PAPER_LATENCIES as durations.
_DEFAULT_LATENCIES = "1us,5us,20us,100us,1ms,10ms"


def _latencies(text: str) -> list[float]:
    out = [parse_time(t.strip(), "--latencies") for t in text.split(",") if t.strip()]
    if not out:
        raise ConfigError("--latencies", text, "give durations, e.g. 1us,100us,10ms")
    if max(out) > MAX_LATENCY_S:
        raise ConfigError("--latencies", text, f"{format_time(max(out))} is over "
                          f"{format_time(MAX_LATENCY_S)}: optical switches reconfigure in "
                          "microseconds to milliseconds, and the simulated iterations "
                          "would wait past their horizon")
    return out


#: The largest --latencies value: a minute (OCS reconfiguration takes us to tens of ms).
MAX_LATENCY_S = 60.0


def _writable(option: str, path: str) -> None:
    """Refuse, before any work, an output file that cannot be written (one line)."""
    if not path:
        raise ConfigError(option, path, "is empty; give a file name")
    folder = Path(path).parent
    if not folder.is_dir():
        raise ConfigError(option, path, f"folder {shown(folder)} does not exist; create it first")
    check_writable(path, option)


def _interval(text: str) -> tuple[float | None, float]:
    """``"5x"`` (a multiple of the latency) or a duration."""
    t = text.strip()
    if t.endswith("x"):
        try:
            factor = float(t[:-1])
        except ValueError:
            factor = float("nan")
        if not factor > 1:
            raise ConfigError("--interval", text, "a multiple of the latency must be > 1, "
                                                  "e.g. 5x")
        return None, factor
    return parse_time(t, "--interval"), 5.0


@click.command("sweep-reconfig")
@config_argument
@strategy_option
@click.option("--latencies", default=_DEFAULT_LATENCIES,
              help="Reconfiguration latencies to sweep, comma-separated durations (the "
                   "paper's Figure 17 spans 1 us to 10 ms).")
@click.option("--interval", default="5x",
              help="Time between demand measurements: a multiple of the latency (5x = "
                   "50 ms at 10 ms, the schedule of the paper's simulator) or a fixed "
                   "duration such as 50ms.")
@click.option("--idle", type=click.Choice(["keep", "rewire"]), default="keep",
              help="Ports the measured demand does not need: keep their circuits, or wire "
                   "them anew at random at every measurement (the paper's simulator).")
@click.option("--iterations", type=click.IntRange(2), default=2,
              help="Iterations simulated per point; the first is a warm-up (it starts "
                   "from arbitrary circuits) and the others are averaged.")
@click.option("--seed", type=SEED, default=0,
              help="Seed of TopologyFinder and of the idle-port wiring.")
@click.option("--png", type=click.Path(dir_okay=False),
              help="Also draw the sweep (log axes, TopoOpt as a line) to this PNG file "
                   "(needs the plot extra).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write every point to this JSON file.")
def sweep_reconfig(config: str, strategy: str, latencies: str, interval: str, idle: str,
                   iterations: int, seed: int, png: str | None, json_path: str | None) -> None:
    """Iteration time of OCS-reconfig with and without host forwarding (FW, noFW) at
    each reconfiguration latency, next to TopoOpt's (TopoOpt §5.7, Figure 17).

    OCS-reconfig re-plans its OCS circuits from the demand measured every --interval;
    a changed circuit carries nothing for the latency. TopoOpt's shard never changes,
    so its time is one number. Small latencies mean many measurements: at 1 us a
    128-server DLRM point takes minutes. Ctrl-C stops and reports the latencies done.
    """
    lats = _latencies(latencies)
    fixed, factor = _interval(interval)
    if fixed is not None and fixed <= max(lats):
        raise ConfigError("--interval", interval, f"must exceed every latency (the largest is "
                                                  f"{format_time(max(lats))}); use e.g. 5x")
    for option, path in (("--png", png), ("--json", json_path)):
        if path is not None:
            _writable(option, path)
    if png:
        require_matplotlib()
    cfg = read_config(config)
    model, strat = build_strategy(cfg, strategy)
    progress = ProgressLine()
    started: list[str] = []

    def show(text: str) -> None:   # one stage per point: a line per point off a terminal
        started.append(text)
        progress.update(text, f"point {len(started)} of {2 * len(lats)}")

    with graceful_interrupt(), options_named(**{"reconfig.interval": "--interval",
                                                "reconfig.idle": "--idle"}):
        sweep = latency_sweep(model, strat, cfg.cluster, cfg.job, lats, interval=fixed,
                              interval_factor=factor, idle=idle, iterations=iterations,
                              warmup=1, seed=seed, strategy_name=strategy, progress=show,
                              stop=stop_requested)
    progress.done()
    if not sweep.complete:
        click.echo(f"interrupted: {len(sweep.points) // 2} of {len(lats)} latencies done",
                   err=True)
    c = cfg.cluster
    click.echo(f"{cfg.job.model} ({strategy}) on {c.servers} servers x {c.nics} x "
               f"{c.link_bandwidth / 1e9:g} Gb/s; TopoOpt {format_time(sweep.topoopt)} "
               f"(its circuits never change); idle ports: {idle}")
    fw = {p.latency: p for p in sweep.series(True)}
    nofw = {p.latency: p for p in sweep.series(False)}
    rows: list[list[object]] = []
    for lat in sorted(fw):
        a, b = fw[lat], nofw[lat]
        rows.append([format_time(lat), format_time(a.interval), format_time(a.total),
                     format_time(b.total), f"{a.total / b.total:.2f}",
                     f"{a.total / sweep.topoopt:.2f}", f"{b.total / sweep.topoopt:.2f}",
                     f"{a.changes:g}/{b.changes:g}", f"{a.bandwidth_tax:.2f}"])
    print_table(["latency", "interval", "OCS-FW", "OCS-noFW", "FW/noFW", "FW/TopoOpt",
                 "noFW/TopoOpt", "changes FW/noFW", "tax FW"], rows)
    if json_path:
        atomic_write_text(json_path, json.dumps({"config": cfg.source, **sweep.to_json()},
                                                indent=2, sort_keys=True) + "\n")
        click.echo(f"wrote {json_path}")
    if png:
        plot_latency_sweep([sweep], png)
        click.echo(f"wrote {png}")
