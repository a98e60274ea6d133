"""``topoopt cluster``: many jobs sharing a cluster, simulated at once on every fabric."""

from __future__ import annotations

import json
from pathlib import Path

import click

from topoopt._io import atomic_write_text
from topoopt.commands._common import (
    MAX_WORKERS,
    PLAN_BOUNDS,
    PLAN_DEFAULTS,
    SEED,
    ProgressLine,
    output_file,
    print_table,
    require_matplotlib,
)
from topoopt.errors import ConfigError
from topoopt.executor import make_executor
from topoopt.export.plots import plot_cluster
from topoopt.fabrics.catalog import FABRICS
from topoopt.multijob import (
    PLACEMENTS,
    ClusterRun,
    load_cluster_config,
    plan_jobs,
    simulate_fabrics,
)
from topoopt.multijob.config import ECMP
from topoopt.units import format_bandwidth, format_time

__all__ = ["cluster", "cluster_report"]


class _Progress(ProgressLine):
    def __call__(self, stage: str, done: int, total: int) -> None:
        self.update(stage, f"{done}/{total}")


def cluster_report(runs: list[ClusterRun], config) -> dict:
    """The JSON document of a run: the config's setting and every fabric's jobs."""
    c = config.cluster
    return {"config": config.source, "servers": c.servers, "nics": c.nics,
            "link_bandwidth": c.link_bandwidth, "placement": config.placement,
            "iterations": config.iterations, "ecmp": config.ecmp, "seed": config.seed,
            "plan": dict(config.plan), "fabrics": [r.to_json() for r in runs]}


@click.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--fabric", "fabrics", multiple=True, type=click.Choice(list(FABRICS)),
              help="Fabric to simulate (repeat for several) [default: the config's "
                   "run.fabrics]: topoopt = a TopologyFinder shard per job on patch panels; "
                   "fattree = one cost-equivalent full-bisection Fat-tree (d x B' per "
                   "server) shared by all jobs; oversub = a shared 2:1 Fat-tree of d x B "
                   "links; ideal, expander: shared too.")
@click.option("--jobs", type=click.IntRange(1, 10_000),
              help="Total jobs, split over the [[mix]] shares [default: run.jobs].")
@click.option("--placement", type=click.Choice(PLACEMENTS),
              help="Servers of each job on a shared fabric: contiguous blocks, random, or "
                   "fragmented (dealt round-robin) [default: run.placement].")
@click.option("--iterations", type=click.IntRange(1, 1000),
              help="Iterations of the slowest job in the measurement window [default: "
                   "run.iterations, 4]; faster jobs run as many as fit.")
@click.option("--ecmp", type=click.Choice(ECMP),
              help="Switched fabrics: hash = one random shortest path per flow (ECMP "
                   "hashing), split = every shortest path an equal share [default: run.ecmp].")
@click.option("--seed", type=SEED, help="Seed of placements, phases and ECMP [default: run.seed].")
@click.option("--strategy", type=click.Choice(["plan", "hybrid", "dp"]),
              help="plan = topoopt.plan per distinct job and fabric; hybrid / dp = that "
                   "strategy everywhere, TopologyFinder for the shards [default: "
                   "plan.strategy].")
@click.option("--budget", type=click.IntRange(*PLAN_BOUNDS["budget"]),
              help="MCMC moves per chain per round of each plan [default: plan.budget, "
                   f"{PLAN_DEFAULTS.budget}].")
@click.option("--per-job", is_flag=True, help="Also print every job's times per fabric.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write every job's iteration times (seconds) to this JSON file.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Draw mean and p99 iteration time per kind of job and fabric to this PNG "
                   "(needs matplotlib).")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=1, show_default=True,
              help="Local processes: distinct jobs are planned, fabrics simulated in parallel.")
@click.option("--ray", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Use Ray instead: --ray starts a local Ray, --ray HOST:PORT joins a cluster.")
@click.option("--quiet", is_flag=True, help="No progress line.")
def cluster(config: str, fabrics: tuple[str, ...], jobs: int | None, placement: str | None,
            iterations: int | None, ecmp: str | None, seed: int | None,
            strategy: str | None, budget: int | None, per_job: bool,
            json_path: str | None, plot_path: str | None, workers: int, ray: str | None,
            quiet: bool) -> None:
    """Simulate CONFIG's jobs training at once on a shared cluster (TopoOpt §5, Fig. 16).

    CONFIG has a [cluster] table (the whole cluster: servers, d NICs of B), [run]
    (fabrics, jobs, placement, iterations, ecmp, seed), [plan] (strategy = plan,
    hybrid or dp; budget, rounds) and one [[mix]] table per kind of job ([job] keys,
    servers per job, share or count); see configs/cluster-fig16.toml. Each distinct
    job is planned once per fabric (topoopt.plan); then every job's iterations run
    concurrently on the flow-level simulator, jobs out of phase. Prints each
    fabric's average and 99th-percentile iteration time (jobs weighted equally) and
    the slowdown against each job running alone on the same servers.
    """
    cfg = load_cluster_config(config)
    changes = {k: v for k, v in (("jobs", jobs), ("placement", placement),
                                 ("iterations", iterations), ("ecmp", ecmp), ("seed", seed),
                                 ("fabrics", fabrics or None)) if v is not None}
    plan_table = {**cfg.plan, **{k: v for k, v in (("strategy", strategy), ("budget", budget))
                                 if v is not None}}
    cfg = cfg.with_(plan=plan_table, **changes)
    if plot_path and Path(plot_path).suffix.lower() != ".png":
        raise ConfigError("--plot", plot_path, "give a .png file name")
    output_file(json_path, "--json")
    output_file(plot_path, "--plot")
    if plot_path:
        require_matplotlib()
    progress = _Progress(not quiet)
    with make_executor(workers, ray) as executor:
        plans = plan_jobs(cfg, executor=executor, progress=progress)
        runs = simulate_fabrics([cfg], cfg.fabrics, plans, executor, progress)
    progress.done()
    c = cfg.cluster
    specs = cfg.job_list()
    mix = ", ".join(f"{sum(s.name == m.name for s in specs)} {m.name}" for m in cfg.mix)
    click.echo(f"cluster   {config}: {c.servers} servers x {c.nics} NICs of "
               f"{format_bandwidth(c.link_bandwidth)}; {len(specs)} jobs ({mix}), "
               f"{sum(s.servers for s in specs)} servers busy")
    click.echo(f"run       {cfg.placement} placement, ECMP {cfg.ecmp}, {cfg.iterations} "
               f"iterations of the slowest job, seed {cfg.seed}; strategies: "
               f"{cfg.plan['strategy']}")
    if per_job:
        for r in runs:
            click.echo(f"\n{r.fabric}")
            print_table(["job", "model", "first server", "alone", "mean", "p99", "slowdown",
                         "iterations"],
                        [[j.index, j.name, j.servers[0], format_time(j.alone),
                          format_time(j.mean), format_time(j.p99), f"{j.mean / j.alone:.3f}",
                          int(j.measured.sum())] for j in r.jobs])
        click.echo("")
    base = next((r for r in runs if r.fabric == "topoopt"), runs[0])
    print_table(["fabric", "mean", "p99", f"mean/{base.fabric}", f"p99/{base.fabric}",
                 "slowdown", "link groups"],
                [[r.fabric, format_time(r.mean), format_time(r.p99),
                  f"{r.mean / base.mean:.2f}", f"{r.p99 / base.p99:.2f}", f"{r.slowdown:.3f}",
                  r.groups] for r in runs])
    click.echo("mean, p99: iteration time with every job weighted equally; slowdown: mean "
               "over jobs of iteration time / alone on the same servers")
    if json_path:
        atomic_write_text(json_path, json.dumps(cluster_report(runs, cfg), indent=2,
                                                sort_keys=True) + "\n")
        click.echo(f"wrote {json_path}")
    if plot_path:
        names = [m.name for m in cfg.mix if any(s.name == m.name for s in specs)]
        plot_cluster(names, {r.fabric: (r.by_class(names)) for r in runs},
                     f"{len(specs)} jobs on {c.servers} servers ({cfg.placement} placement)",
                     plot_path)
        click.echo(f"wrote {plot_path}")
