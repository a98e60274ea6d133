"""``topoopt simulate``: iteration time, its breakdown and the cost of a job on each fabric."""

from __future__ import annotations

import json

import click

from topoopt._io import atomic_write_text
from topoopt.commands._common import (
    SEED,
    ProgressLine,
    build_strategy,
    config_argument,
    output_file,
    print_table,
    read_config,
    strategy_option,
)
from topoopt.config import Config
from topoopt.estimate import EstimateCache, estimate_iteration
from topoopt.fabrics.catalog import FABRICS, build_fabric
from topoopt.fabrics.cost import SPEED_COMPONENTS, fabric_cost, price_table
from topoopt.fabrics.reconfigurable import reconfiguration_of
from topoopt.reconfig import reconfig_iteration
from topoopt.units import format_bandwidth, format_time

__all__ = ["simulate", "simulate_fabrics"]


def simulate_fabrics(cfg: Config, strategy_name: str, fabrics: list[str], seed: int = 0,
                     overlap: bool = True, mp_flows: str = "auto",
                     progress: ProgressLine | None = None) -> dict:
    """Estimate one iteration of ``cfg``'s job and price each named fabric.

    A reconfigurable fabric (OCS-reconfig, SiP-ML) is simulated over its iterations with
    its circuits changing (:func:`topoopt.reconfig.reconfig_iteration`); its entry also
    has ``reconfig`` (latency, interval, forwarding, changes per iteration, bandwidth tax).

    Returns
    -------
    dict
        ``{"config", "strategy", "seed", "overlap", "fabrics": [...], "prices": {...}}``;
        each fabric entry has the :class:`~topoopt.estimate.IterationEstimate` fields,
        ``server_bandwidth_bps`` and ``cost`` (a priced bill of materials with the
        source of every price).
    """
    cluster, job = cfg.cluster, cfg.job
    prices = price_table(cfg.cost)
    model, strat = build_strategy(cfg, strategy_name)
    cache = EstimateCache(model, cluster, job)
    rows = []
    for name in fabrics:
        if progress is not None:
            progress.update("simulate", name)
        fabric = build_fabric(name, cluster, prices, seed, job=job, model=model,
                              strategy=strat)
        spec = reconfiguration_of(fabric)
        extra = {}
        if spec is None:
            est = estimate_iteration(model, strat, cluster, job, fabric, overlap=overlap,
                                     cache=cache, seed=seed, mp_flows=mp_flows)
        else:
            run = reconfig_iteration(model, strat, cluster, job, fabric, overlap=overlap,
                                     cache=cache, mp_flows=mp_flows)
            est = run.estimate
            extra = {"reconfig": {"scheme": spec.scheme, "latency_s": spec.latency,
                                  "interval_s": spec.every, "forwarding": spec.forwarding,
                                  "idle": spec.idle,
                                  "iteration_times_s": list(run.iteration_times),
                                  "warmup_iterations": spec.warmup,
                                  "changes_per_iteration": list(run.reconfigurations),
                                  "bandwidth_tax": run.bandwidth_tax}}
        cost = fabric_cost(fabric, prices)
        rows.append({"name": name, "title": FABRICS[name].title, **est.to_json(),
                     "server_bandwidth_bps": fabric.server_bandwidth, "cost": cost.to_json(),
                     **extra})
    return {"config": cfg.source, "strategy": strategy_name, "seed": seed, "overlap": overlap,
            "mp_flows": mp_flows, "fabrics": rows,
            "prices": {"patch_panel_port": prices.patch_panel_port,
                       "ocs_port": prices.ocs_port, "fibre": prices.fibre,
                       **{c: {format_bandwidth(s).replace(" ", ""): p
                              for s, p in getattr(prices, c).items()}
                          for c in SPEED_COMPONENTS},
                       "sources": dict(prices.sources)}}


def _fabric_names() -> list[str]:
    return list(FABRICS)


def _static_names() -> list[str]:
    """The fabrics whose topology does not change during an iteration."""
    return [n for n, spec in FABRICS.items() if not spec.reconfigurable]


@click.command()
@config_argument
@click.option("--fabric", "fabric", type=click.Choice(_fabric_names() + ["static", "all"]),
              default="static",
              help="Which fabric (TopoOpt §5): topoopt = TopologyFinder shard on patch "
                   "panels; ideal = d x B per server into one non-blocking switch; fattree = "
                   "full bisection at the cost-equivalent d x B'; oversub = 2:1 Fat-tree with "
                   "d x B links; expander = random d-regular; ocs-reconfig(-nofw) = OCS "
                   "circuits re-planned from the measured demand every 50 ms, 10 ms per "
                   "change, with (without) host forwarding; sipml = SiP-ML's SiP-Ring, 25 us "
                   "per change (the reconfigurable ones simulate 2 iterations and report the "
                   "second; sipml can take minutes on MP-heavy jobs); static = the first "
                   "five; all = every one.")
@strategy_option
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write the table, the cost bills and the prices used to this JSON file.")
@click.option("--seed", type=SEED, default=0, help="Seed of the expander and TopologyFinder.")
@click.option("--overlap/--no-overlap", default=True,
              help="Start each AllReduce when its layers' backward is done, or after the "
                   "whole backward pass.")
@click.option("--mp-flows", type=click.Choice(["auto", "pair", "coflow"]), default="auto",
              help="MP flow granularity: one max-min flow per server pair (exact), or one "
                   "coupled flow per sending task (fast); auto = pairs on a single switch, "
                   "coflows elsewhere.")
@click.option("--prices", "show_prices", is_flag=True,
              help="Also print the unit prices each fabric's cost used, with their sources.")
def simulate(config: str, fabric: str, strategy: str, json_path: str | None, seed: int,
             overlap: bool, mp_flows: str, show_prices: bool) -> None:
    """Simulate one training iteration of CONFIG's job on each fabric and price it.

    Prints the iteration time and where it goes -- compute (busiest server's GPUs),
    MP and AllReduce (time with such transfers in flight), exposed communication
    (iteration - compute) -- and the interconnect cost. Costs use the relative price
    table of topoopt.fabrics.cost (calibrated to TopoOpt §5.2), overridable in the
    config's [cost] table.
    """
    output_file(json_path, "--json")
    cfg = read_config(config)
    names = (_fabric_names() if fabric == "all" else _static_names() if fabric == "static"
             else [fabric])
    progress = ProgressLine()
    report = simulate_fabrics(cfg, strategy, names, seed, overlap, mp_flows, progress)
    progress.done()
    c = cfg.cluster
    click.echo(f"config    {cfg.source}: {c.servers} servers x {c.nics} NICs of "
               f"{format_bandwidth(c.link_bandwidth)}, {c.gpus_per_server} {c.gpu.name} each")
    click.echo(f"job       {cfg.job.model}, batch {cfg.job.global_batch(c)}, strategy {strategy}, "
               f"{'overlapped' if overlap else 'serial'} AllReduce")
    base = report["fabrics"][0]["cost"]["total"]
    rows = [[r["name"], format_time(r["total"]), format_time(r["compute"]), format_time(r["mp"]),
             format_time(r["allreduce"]), format_time(r["exposed_communication"]),
             format_bandwidth(r["server_bandwidth_bps"]), f"{r['cost']['total']:,.0f}",
             f"{r['cost']['total'] / base:.2f}"] for r in report["fabrics"]]
    print_table(["fabric", "iteration", "compute", "MP", "AllReduce", "exposed",
                 "per server", "cost", f"cost/{report['fabrics'][0]['name']}"], rows)
    click.echo("cost in relative units (100 = one 100 Gb/s transceiver); --prices lists them")
    for r in report["fabrics"]:
        rc = r.get("reconfig")
        if rc:
            click.echo(f"{r['name']}: circuits changed {rc['changes_per_iteration'][-1]} times in "
                       f"the measured iteration ({format_time(rc['latency_s'])} each, demand "
                       f"measured every {format_time(rc['interval_s'])}), bandwidth tax "
                       f"{rc['bandwidth_tax']:.2f}")
    if show_prices:
        for r in report["fabrics"]:
            click.echo(f"\n{r['name']}: {r['cost']['note']}")
            print_table(["component", "speed", "count", "unit price", "source"],
                        [[i["component"],
                          format_bandwidth(i["speed_bps"]) if i["speed_bps"] else "-",
                          f"{i['count']:,.0f}", f"{i['unit_price']:,.2f}", i["source"][:90]]
                         for i in r["cost"]["items"]])
    if json_path:
        atomic_write_text(json_path, json.dumps(report, indent=2, sort_keys=True) + "\n")
        click.echo(f"wrote {json_path}")
