"""``topoopt plan``: co-optimize a job's strategy and its optical shard; export the result."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from topoopt._require import require_keys
from topoopt.commands._common import ProgressLine, print_table, read_config
from topoopt.errors import ConfigError, TopoOptError
from topoopt.executor import make_executor
from topoopt.export.plan_dir import check_plan_dir, write_plan
from topoopt.fabrics.cost import price_table
from topoopt.interrupt import graceful_interrupt
from topoopt.model import Model
from topoopt.planners.planner import plan as make_plan
from topoopt.plans import BASELINES
from topoopt.strategy import Strategy
from topoopt.units import format_time

__all__ = ["plan", "PLAN_KEYS", "plan_settings"]

#: Keys of a config's [plan] table (CLI options override them).
PLAN_KEYS = ("budget", "rounds", "chains", "seed", "baselines", "routing", "k_paths",
             "primes_only", "mp_decay")
DEFAULTS = {"budget": 400, "rounds": 3, "chains": 1, "seed": 0}


def plan_settings(table, **cli) -> dict:
    """Merge a config's [plan] table with CLI options (CLI wins), validated."""
    require_keys("plan", table, PLAN_KEYS)
    out = {**DEFAULTS, **{k: table[k] for k in DEFAULTS if k in table}}
    out.update({k: v for k, v in cli.items() if v is not None})
    out["baselines"] = tuple(table.get("baselines", BASELINES))
    finder = {}
    if "routing" in table:
        if table["routing"] not in ("kshortest", "lp"):
            raise ConfigError("plan.routing", table["routing"], "use 'kshortest' or 'lp'")
        finder["routing"] = table["routing"]
    if "k_paths" in table:
        if isinstance(table["k_paths"], bool) or not isinstance(table["k_paths"], int) \
                or table["k_paths"] < 1:
            raise ConfigError("plan.k_paths", table["k_paths"], "must be an integer >= 1")
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


class _Progress(ProgressLine):
    """The search's progress: moves and best time per stage."""

    def __call__(self, stage: str, moves: int, best: float) -> None:
        self.update(stage, f"{moves} moves, best {format_time(best)}")


def _strategy_summary(model: Model, strategy: Strategy, servers: int) -> str:
    """Operators by kind of config: DP on all servers, DP on fewer, model parallel."""
    kinds = {"dp-all": 0, "dp-part": 0, "mp": 0}
    for op, cfg in zip(model.operators, strategy.configs):
        if op.kind != "input":
            kinds["mp" if cfg.mp > 1 else "dp-all" if cfg.dp == servers else "dp-part"] += 1
    return ", ".join(f"{v} {k}" for k, v in kinds.items() if v)


def _check(directory: str) -> None:
    checked = check_plan_dir(directory)
    click.echo(f"ok: {directory}: {len(checked)} files valid ({', '.join(checked)})")


@click.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(file_okay=False),
              help="Folder for plan.json, the exports and the pictures (created; files of an "
                   "earlier plan in it are replaced).")
@click.option("--check", "check_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Instead of planning, re-validate the plan in DIR (ports, degrees, rings, "
                   "routes, strategy, every export) and exit 1 naming the first violation.")
@click.option("--budget", type=int, help="MCMC moves per chain per round [default: 400, or "
                                         "[plan] budget].")
@click.option("--rounds", type=int, help="Rounds of alternating optimization, k [default: 3].")
@click.option("--chains", type=int, help="Independent MCMC chains per search [default: 1].")
@click.option("--seed", type=int, help="Seed of every search [default: 0]; the same seed "
                                       "gives the same plan.json, byte for byte.")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Local processes for chains and baseline searches.")
@click.option("--ray", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run chains on Ray: --ray starts a local Ray, --ray HOST:PORT joins a "
                   "cluster (needs the ray extra).")
@click.option("--exports/--no-exports", default=True,
              help="Write patch-panel, OCS, NCCL rank-order and MSCCL files.")
@click.option("--plots/--no-plots", default=True,
              help="Draw traffic heatmaps, the topology and the fabric comparison (needs "
                   "matplotlib).")
@click.option("--quiet", is_flag=True, help="No progress line.")
def plan(config: str | None, output: str | None, check_dir: str | None, budget, rounds,
         chains, seed, workers: int, ray: str | None, exports: bool, plots: bool,
         quiet: bool) -> None:
    """Plan CONFIG's job on a TopoOpt shard and compare it with other fabrics.

    Alternates an MCMC search over parallelization strategies (FlexFlow, on the
    flow-level simulator) with TopologyFinder (TopoOpt §4), then searches each
    baseline fabric (Ideal Switch, cost-equivalent Fat-tree, 2:1 oversubscribed
    Fat-tree, Expander) with the same budget. Ctrl-C stops the search and keeps the
    best plan found so far. Writes DIR/plan.json (schema in README) and the exports:

    \b
      patch_panel.csv        one row per fibre strand, panel port <-> server NIC
      ocs/                   OCS port map; Polatis NETCONF, SCPI, TL1, SONiC JSON
      rank_order.txt         host order that makes NCCL's ring follow the plan
      hostfile               the same with slots= per host
      msccl_allreduce.xml    MSCCL AllReduce over all planned rings
      *.png                  traffic before/after, topology, fabric comparison
    """
    if check_dir:
        if config or output:
            raise TopoOptError("--check DIR takes no CONFIG or -o; run them separately")
        try:
            _check(check_dir)
        except TopoOptError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        return
    if not config:
        raise TopoOptError("CONFIG is required: topoopt plan CONFIG -o DIR (or --check DIR)")
    if not output:
        raise TopoOptError("-o/--output DIR is required: where to write plan.json and exports")
    if Path(output).exists() and not Path(output).is_dir():
        raise ConfigError("--output", output, "exists and is not a folder")
    cfg = read_config(config)
    settings = plan_settings(cfg.plan, budget=budget, rounds=rounds, chains=chains, seed=seed)
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            click.echo("note: no matplotlib, skipping pictures (pip install 'topoopt[plot]')",
                       err=True)
            plots = False
    prices = price_table(cfg.cost)
    progress = _Progress(not quiet)
    started = time.monotonic()
    with make_executor(workers, ray) as executor, graceful_interrupt():
        result = make_plan(cfg.cluster, cfg.job, budget=settings["budget"],
                           rounds=settings["rounds"], chains=settings["chains"],
                           seed=settings["seed"], baselines=settings["baselines"],
                           executor=executor, prices=prices,
                           finder_kwargs=settings["finder_kwargs"], source=config,
                           progress=progress)
    progress.done()
    paths = write_plan(result, output, exports=exports, plots=plots)
    c = cfg.cluster
    click.echo(f"plan      {config}: {cfg.job.model} on {c.servers} servers x {c.nics} ports, "
               f"seed {settings['seed']}, {time.monotonic() - started:.1f} s"
               + (" (interrupted: best so far)" if result.search.interrupted else ""))
    s = result.search
    origin = "" if s.origin == "start" else f" (first round from the {s.origin} strategy)"
    click.echo(f"search    {s.start.name} start {format_time(s.start_time)} -> "
               f"{format_time(s.time)} on TopoOpt in {len(s.history)} round(s){origin}, "
               f"{s.moves} moves; AllReduce/MP degree {result.topology_plan.degree_allreduce}/"
               f"{result.topology_plan.degree_mp}")
    base = result.fabric("topoopt")
    rows = [[f.name, format_time(f.estimate.total), f"{f.estimate.total / base.estimate.total:.2f}",
             format_time(f.estimate.exposed_communication), f"{f.cost.total:,.0f}",
             f"{f.cost.total / base.cost.total:.2f}", _strategy_summary(result.model, f.strategy, c.servers)]
            for f in result.fabrics]
    print_table(["fabric", "iteration", "vs topoopt", "exposed comm", "cost", "cost ratio",
                 "strategy (operators)"], rows)
    click.echo(f"wrote {len(paths)} files to {output}/ (check them: topoopt plan --check {output})")
