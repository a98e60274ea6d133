"""``topoopt topology``: TopologyFinder on a job's traffic, its metrics next to an Expander's."""

from __future__ import annotations

import click

from topoopt.commands._common import (
    PLAN_BOUNDS,
    SEED,
    build_strategy,
    config_argument,
    output_file,
    print_table,
    read_config,
    require_matplotlib,
    strategy_option,
)
from topoopt.export.plots import plot_topology
from topoopt.finder.topology_finder import topology_finder
from topoopt.routing.metrics import topology_metrics
from topoopt.topology.expander import expander_topology
from topoopt.traffic import derive_traffic
from topoopt.units import format_size

__all__ = ["topology"]


@click.command()
@config_argument
@strategy_option
@click.option("--routing", type=click.Choice(["kshortest", "lp"]), default="kshortest",
              help="MP routing: split evenly over the k shortest paths, or the LP "
                   "(OR-Tools GLOP) that minimizes the largest link load (slow for "
                   "all-to-all traffic above ~64 servers).")
@click.option("--k", "k_paths", type=click.IntRange(*PLAN_BOUNDS["k_paths"]), default=4,
              help="Paths per MP pair.")
@click.option("--seed", type=SEED, default=0, help="Tie-break seed (and the Expander's).")
@click.option("--png", type=click.Path(dir_okay=False),
              help="Also draw the topology to this PNG file, rings coloured by stride "
                   "(needs the plot extra).")
def topology(config: str, strategy: str, routing: str, k_paths: int, seed: int,
             png: str | None) -> None:
    """Build the TopoOpt topology for CONFIG's job and print how good it is.

    TopologyFinder (TopoOpt §4) splits each server's NIC ports between AllReduce
    rings (TotientPerms strides picked by SelectPermutations) and Blossom matchings
    of the MP demand, then routes AllReduce by coin change and MP over k shortest
    paths. Printed: the degree split, each group's rings, and diameter, average path
    length (hops), bandwidth tax (bytes carried / bytes demanded) and link loads,
    next to a random expander with the same ports.
    """
    output_file(png, "--png")
    cfg = read_config(config)
    cluster, job = cfg.cluster, cfg.job
    if png:
        require_matplotlib()
    model, strat = build_strategy(cfg, strategy)
    traffic = derive_traffic(model, strat, cluster.servers, job.global_batch(cluster),
                             job.dtype_bytes)
    n, d = cluster.servers, cluster.nics
    plan = topology_finder(traffic, n, d, cluster.link_bandwidth, cluster.link_latency,
                           k_paths=k_paths, routing=routing, seed=seed)
    click.echo(f"config    {cfg.source}: {n} servers x {d} ports of "
               f"{cluster.link_bandwidth / 1e9:g} Gbps, {model.name}, strategy {strategy}")
    click.echo(f"degree    AllReduce {plan.degree_allreduce}, MP {plan.degree_mp} "
               f"(traffic {format_size(traffic.allreduce_bytes)} AllReduce, "
               f"{format_size(traffic.mp_bytes)} MP)")
    if plan.groups:
        print_table(["group", "rings", "strides", "diameter", "ring bytes/pair"],
                    [[f"{len(g.members)} servers" if len(g.members) < n else f"all {n}",
                      g.degree,
                      ",".join(map(str, g.selection.strides)) if g.selection else
                      ("coin change" if g.host else "shortest paths"),
                      g.selection.diameter if g.selection else "-",
                      format_size(g.bytes / len(g.members))]
                     for g in plan.groups])
    extras = []
    if plan.matching_rounds:
        extras.append(f"{len(plan.matching_rounds)} Blossom round(s), {plan.mp_links} MP links")
    if plan.backbone:
        extras.append("backbone ring for connectivity")
    if plan.spare_rings:
        extras.append(f"{len(plan.spare_rings)} spare ring(s)")
    if extras:
        click.echo("links     " + "; ".join(extras))
    ours = topology_metrics(plan.topology, traffic, plan.rings, plan.routes)
    rows = [("TopoOpt", ours)]
    exp = expander_topology(n, d, cluster.link_bandwidth, cluster.link_latency, seed)
    rows.append(("Expander", topology_metrics(exp, traffic)))
    print_table(["fabric", "diameter", "avg path length", "bandwidth tax", "MP hops",
                 "max link load", "load spread"],
                [[name, f"{m.diameter:g}", f"{m.average_path_length:.2f}",
                  f"{m.bandwidth_tax:.3f}", f"{m.mp_hops:.2f}",
                  format_size(m.max_link_load), f"{m.load_spread:.0%}"] for name, m in rows])
    if png:
        plot_topology(plan, f"{model.name}, {strategy}, {n} servers x {d} ports", png)
        click.echo(f"wrote {png}")
