"""``topoopt plan``: co-optimize a job's strategy and its optical shard; export the result."""

from __future__ import annotations

import os
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
from topoopt.planners.planner import plan as make_plan
from topoopt.plans import BASELINES
from topoopt.strategy import describe_strategy
from topoopt.units import format_time

__all__ = ["plan", "PLAN_KEYS", "plan_settings"]

#: Keys of a config's [plan] table (CLI options override them).
PLAN_KEYS = ("budget", "rounds", "chains", "seed", "tolerance", "baselines", "routing",
             "k_paths", "primes_only", "mp_decay")
DEFAULTS = {"budget": 200, "rounds": 2, "chains": 2, "seed": 0, "tolerance": 0.01}


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
    """The search's progress: moves and best time per stage, and each fabric's end."""

    def __call__(self, stage: str, moves: int, best: float, done: str = "") -> None:
        if done:
            self.update(stage, f"done, best {format_time(best)} ({done})")
        else:
            self.update(stage, f"{moves} moves, best {format_time(best)}")


def _search_summary(f) -> str:
    """How a fabric's search ended: its stop reason and the chains' spread."""
    how = f"{f.search.stop}, spread {f.search.spread:.3f}" if f.search is not None else ""
    return how + (f", from {f.adopted_from}" if f.adopted_from else "")


def _report(result, config: str, seed: int, seconds: float) -> None:
    """What ``topoopt plan`` prints: every fabric's result, how the searches ended,
    and how the planned strategies compare with data parallel and the hybrid."""
    c = result.cluster
    click.echo(f"plan      {config}: {result.job.model} on {c.servers} servers x {c.nics} "
               f"ports, seed {seed}, {seconds:.1f} s"
               + (" (interrupted: best so far)" if result.search.interrupted else ""))
    s = result.search
    rounds = s.searches
    topo_how = (f"{rounds[-1].stop}, spread {rounds[-1].spread:.3f}" if rounds else "start")
    origin = "" if s.origin == "start" else f", first round from {s.origin}"
    click.echo(f"search    {result.chains} chains x {result.budget} moves per round per fabric "
               f"(Ideal Switch x2), tolerance {result.tolerance:.0%}; TopoOpt: "
               f"{len(s.history)} round(s){origin}, AllReduce/MP degree "
               f"{result.topology_plan.degree_allreduce}/{result.topology_plan.degree_mp}")
    base = result.fabric("topoopt")
    ideal = result.iteration_time_s.get("ideal")
    rows = []
    for f in result.fabrics:
        how = (topo_how + (f", from {f.adopted_from}" if f.adopted_from else "")
               if f.name == "topoopt" else _search_summary(f))
        rows.append([f.name, format_time(f.estimate.total),
                     f"{f.estimate.total / ideal:.2f}" if ideal else "-",
                     format_time(f.estimate.exposed_communication), f"{f.cost.total:,.0f}",
                     f"{f.cost.total / base.cost.total:.2f}", how])
    print_table(["fabric", "iteration", "vs ideal", "exposed comm", "cost", "cost ratio",
                 "search"], rows)
    refs = result.references
    names = [f.name for f in result.fabrics]
    kinds = [k for k in ("data parallel", "hybrid") if any(k in refs.get(n, {}) for n in names)]
    if kinds:
        click.echo("iteration time of the planned strategy next to the usual ones:")
        rows = [[k] + [format_time(refs[n][k]) if k in refs.get(n, {}) else "-" for n in names]
                for k in kinds]
        rows.append(["planned"] + [format_time(f.estimate.total) for f in result.fabrics])
        print_table(["strategy"] + names, rows)
    click.echo("TopoOpt strategy:")
    for line in describe_strategy(result.model, base.strategy, c.servers):
        click.echo(f"  {line}")


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
@click.option("--budget", type=int, help="MCMC moves per chain per round [default: 200, or "
                                         "[plan] budget].")
@click.option("--rounds", type=int, help="Rounds of alternating optimization, k [default: 2].")
@click.option("--chains", type=int, help="MCMC chains per search, each from a different "
                                         "structured start [default: 2].")
@click.option("--tolerance", type=float, help="A search stops once its chains agree within "
                                              "this fraction [default: 0.01 = 1%].")
@click.option("--seed", type=int, help="Seed of every search [default: 0]; the same seed "
                                       "gives the same plan.json, byte for byte.")
@click.option("--workers", type=int, default=os.cpu_count() or 1, show_default="all cores",
              help="Local processes: the fabrics are searched in parallel.")
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
         chains, tolerance, seed, workers: int, ray: str | None, exports: bool, plots: bool,
         quiet: bool) -> None:
    """Plan CONFIG's job on a TopoOpt shard and compare it with other fabrics.

    Searches every fabric from the same structured strategies (tables x body
    layouts) with MCMC chains that stop once they agree: the TopoOpt shard by
    alternating the search with TopologyFinder (TopoOpt §4), the baselines (Ideal
    Switch, cost-equivalent Fat-tree, 2:1 oversubscribed Fat-tree, Expander) with the
    same budget, the Ideal Switch first and with twice the budget (it bounds the
    others); then every fabric's best is tried on every other. Ctrl-C stops the search
    and keeps the best plan found so far. Writes DIR/plan.json (schema in README) and
    the exports:

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
    settings = plan_settings(cfg.plan, budget=budget, rounds=rounds, chains=chains, seed=seed,
                             tolerance=tolerance)
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
                           seed=settings["seed"], tolerance=settings["tolerance"],
                           baselines=settings["baselines"],
                           executor=executor, prices=prices,
                           finder_kwargs=settings["finder_kwargs"], source=config,
                           progress=progress,
                           on_fabric=lambda n, t, how: progress(n, 0, t, how))
    progress.done()
    paths = write_plan(result, output, exports=exports, plots=plots)
    _report(result, config, settings["seed"], time.monotonic() - started)
    click.echo(f"wrote {len(paths)} files to {output}/ (check them: topoopt plan --check {output})")
