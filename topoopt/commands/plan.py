"""``topoopt plan``: co-optimize a job's strategy and its optical shard; export the result."""

from __future__ import annotations

import os
import sys
import time
import warnings

import click
import numpy as np

from topoopt._io import check_writable, folder_lock, shown
from topoopt.commands._common import (
    MAX_WORKERS,
    PLAN_BOUNDS,
    PLAN_DEFAULTS,
    PLAN_KEYS,
    SEED,
    ProgressLine,
    print_table,
    read_config,
)
from topoopt.errors import ConfigError, TopoOptError
from topoopt.executor import make_executor
from topoopt.export.bundle import ExportSkipped
from topoopt.export.msccl_runtime import DEFAULT_RUNTIME, MSCCL_RUNTIMES
from topoopt.export.plan_dir import check_plan_dir, check_plan_output, write_plan
from topoopt.fabrics.cost import price_table
from topoopt.interrupt import graceful_interrupt, reset_stop, stop_requested
from topoopt.planners.planner import plan as make_plan
from topoopt.strategy import data_parallel, describe_strategy, hybrid, memory_per_server
from topoopt.units import format_time
from topoopt.workloads import model_of
from topoopt.workloads.gpt import is_transformer

__all__ = ["plan", "PLAN_KEYS"]

class _Progress(ProgressLine):
    """The search's progress: moves and best time per stage, and each fabric's end."""

    def __call__(self, stage: str, moves: int, best: float, done: str = "") -> None:
        if done:
            self.update(stage, f"done, best {format_time(best)} ({done})")
        else:
            self.update(stage, f"{moves} moves, best {format_time(best)}")


def _ended(search) -> str:
    """How a search ended: its stop reason with the chains' spread then, and their
    spread after the final descents."""
    return f"{search.stop} at {search.stop_spread:.3f}, spread {search.spread:.3f}"


def _search_summary(f) -> str:
    """How a fabric's search ended (:func:`_ended`) and whose strategy it adopted."""
    how = _ended(f.search) if f.search is not None else ""
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
    topo_how = _ended(rounds[-1]) if rounds else "start"
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


def _report_llm(result, config: str, seconds: float) -> None:
    """What ``topoopt plan`` prints for an LLM job: every fabric's parallelism,
    iteration, MFU and cost, and the plan's placement and traffic."""
    c = result.cluster
    click.echo(f"plan      {config}: {result.job.model} on {c.servers} servers x "
               f"{c.gpus_per_server} {c.gpu.name}, {c.nics} ports of "
               f"{c.link_bandwidth / 1e9:g} Gb/s, {seconds:.1f} s")
    click.echo(f"search    {result.space} parallelisms, {result.feasible} fit in memory; the "
               f"{len(result.candidates)} fastest on the Ideal Switch timed on every fabric")
    ideal = result.iteration_time_s.get("ideal")
    base = result.fabric("topoopt").cost.total
    rows = [[f.name, f.parallel.label(), format_time(f.iteration.total),
             f"{f.iteration.total / ideal:.2f}" if ideal else "-", f"{f.iteration.mfu:.1%}",
             f"{f.cost.total:,.0f}", f"{f.cost.total / base:.2f}"] for f in result.fabrics]
    print_table(["fabric", "parallelism", "iteration", "vs ideal", "MFU", "cost",
                 "cost ratio"], rows)
    top = result.fabric("topoopt")
    parts = top.iteration.parts()
    click.echo("TopoOpt iteration: " + ", ".join(f"{k} {format_time(v)}"
                                                  for k, v in parts.items()))
    nb = top.traffic.network_bytes()
    click.echo("network bytes per iteration: " + ", ".join(f"{k} {v / 1e9:,.1f} GB"
                                                            for k, v in nb.items()))
    click.echo(f"TopoOpt shard: {top.allreduce_degree} of {c.nics} ports per server for the "
               f"{len(top.traffic.dp_groups)} DP rings, the rest for PP/EP")


def _require_batch_fits(cfg) -> None:
    """Name the batch, not the model, when only the batch's activations do not fit.

    The planner starts from data parallel or hybrid, whichever fits in memory
    (:func:`topoopt.strategy.memory_per_server`: weights, gradients, activations). A
    server's bytes are affine in the global batch, so the largest batch that fits
    follows from two evaluations; if the weights alone fit, the batch is what to change.
    """
    c, job = cfg.cluster, cfg.job
    model = model_of(job)
    limit = c.gpus_per_server * c.gpu.memory
    per_gpu_batch = c.servers * c.gpus_per_server
    best = 0
    for make in (data_parallel, hybrid):
        strategy = make(model, c.servers)
        fixed = np.array(memory_per_server(model, strategy, c.servers, job.dtype_bytes, 0))
        slope = np.array(memory_per_server(model, strategy, c.servers, job.dtype_bytes, 1)) - fixed
        if fixed.max() + slope.max() * job.global_batch(c) <= limit:
            return  # this strategy fits at the configured batch
        if fixed.max() <= limit and slope.max() > 0:
            room = (limit - fixed[slope > 0]) / slope[slope > 0]
            best = max(best, int(room.min() // per_gpu_batch))
    if best >= 1:
        raise ConfigError("job.batch_per_gpu", job.batch_per_gpu,
                          f"its activations do not fit in {c.gpus_per_server} x "
                          f"{c.gpu.memory / 1e9:.0f} GB per server with data parallel or "
                          f"hybrid; at most {best} fits")


def _check(directory: str) -> None:
    checked = check_plan_dir(directory)
    click.echo(f"ok: {shown(directory)}: {len(checked)} files valid ({', '.join(checked)})")


@click.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(file_okay=False),
              help="Folder for plan.json, the exports and the pictures (created; the files "
                   "an earlier plan wrote there, listed in its plan.json, are replaced, and "
                   "nothing else is touched).")
@click.option("--check", "check_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Instead of planning, re-validate the plan in DIR (ports, degrees, rings, "
                   "routes, strategy, every export) and exit 1 naming the first violation.")
@click.option("--budget", type=click.IntRange(*PLAN_BOUNDS["budget"]),
              help=f"MCMC moves per chain per round [default: {PLAN_DEFAULTS.budget}, or "
                   "[plan] budget].")
@click.option("--rounds", type=click.IntRange(*PLAN_BOUNDS["rounds"]),
              help=f"Rounds of alternating optimization, k [default: {PLAN_DEFAULTS.rounds}].")
@click.option("--chains", type=click.IntRange(*PLAN_BOUNDS["chains"]),
              help="MCMC chains per search, each from a different structured start "
                   f"[default: {PLAN_DEFAULTS.chains}].")
@click.option("--tolerance", type=click.FloatRange(0, 1, max_open=True),
              help="A search stops once its chains agree within this fraction "
                   f"[default: {PLAN_DEFAULTS.tolerance:g} = {PLAN_DEFAULTS.tolerance:.0%}].")
@click.option("--seed", type=SEED, help=f"Seed of every search [default: {PLAN_DEFAULTS.seed}]; "
                                        "the same seed gives the same plan.json, byte for byte.")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS),
              default=min(os.cpu_count() or 1, MAX_WORKERS), show_default="all cores",
              help="Local processes: the fabrics are searched in parallel.")
@click.option("--ray", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run chains on Ray: --ray starts a local Ray, --ray HOST:PORT joins a "
                   "cluster (needs the ray extra).")
@click.option("--exports/--no-exports", default=True,
              help="Write patch-panel, OCS, NCCL rank-order and MSCCL files.")
@click.option("--plots/--no-plots", default=True,
              help="Draw traffic heatmaps, the topology and the fabric comparison (needs "
                   "matplotlib).")
@click.option("--report/--no-report", "html_report", default=True,
              help="Write report.html: the plan as one self-contained page (topoopt report "
                   "DIR writes it again, with validation results).")
@click.option("--msccl-runtime", type=click.Choice(MSCCL_RUNTIMES), default=DEFAULT_RUNTIME,
              show_default=True,
              help="MSCCL runtime msccl_allreduce.xml (and an LLM plan's msccl/*.xml) targets: "
                   "msccl-executor-nccl (maxBytes=0, "
                   "no limit) or msccl (microsoft/msccl: maxBytes=2^40, in place only).")
@click.option("--quiet", is_flag=True, help="No progress line.")
def plan(config: str | None, output: str | None, check_dir: str | None, budget, rounds,
         chains, tolerance, seed, workers: int, ray: str | None, exports: bool, plots: bool,
         html_report: bool, msccl_runtime: str, quiet: bool) -> None:
    """Plan CONFIG's job on a TopoOpt shard and compare it with other fabrics.

    Searches every fabric from the same structured strategies (tables x body
    layouts; the TopoOpt shard's first round may also start from DLRM's bottom MLP
    beside the tables) with MCMC chains that stop once they agree: the TopoOpt shard by
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
      chakra/                Chakra execution traces, one per server (mlc-chakra)
      astra_sim/             ASTRA-sim system, analytical and ns-3 network inputs
      nccl/                  NCCL ring graph files (NCCL_GRAPH_FILE) and launch.json
      *.png                  traffic before/after, topology, fabric comparison
      report.html            all of it as one page (topoopt report DIR)
    """
    if check_dir:
        if config or output:
            raise TopoOptError("--check DIR takes no CONFIG or -o; run them separately")
        try:
            _check(check_dir)
        except TopoOptError as exc:
            click.echo(f"error: {' '.join(str(exc).split())}", err=True)
            sys.exit(1)
        return
    if not config:
        raise TopoOptError("CONFIG is required: topoopt plan CONFIG -o DIR (or --check DIR)")
    if not output:
        raise TopoOptError("-o/--output DIR is required: where to write plan.json and exports")
    cfg = read_config(config)
    settings = cfg.plan_settings.with_(budget=budget, rounds=rounds, chains=chains, seed=seed,
                                       tolerance=tolerance)   # the options given win
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            click.echo("note: no matplotlib, skipping pictures (pip install 'topoopt[plot]')",
                       err=True)
            plots = False
    # before the search, not after
    llm = is_transformer(model_of(cfg.job))
    check_writable(output, "--output", folder=True)
    with folder_lock(output):   # one writer per folder: another run is refused at once
        check_plan_output(output, cfg.cluster, exports, plots, html_report, llm=llm)
        if not llm:  # an LLM job's memory is checked per parallelism by its planner
            _require_batch_fits(cfg)
        _plan_and_write(cfg, config, output, settings, workers, ray, exports, plots,
                        html_report, quiet, llm, msccl_runtime)


def _plan_and_write(cfg, config: str, output: str, settings, workers: int, ray: str | None,
                    exports: bool, plots: bool, html_report: bool, quiet: bool,
                    llm: bool, msccl_runtime: str = DEFAULT_RUNTIME) -> None:
    """Search, then write the plan folder: a Ctrl-C in the search keeps the best so far;
    the first one while the files are written lets them finish (a second abandons them,
    leaving the previous plan), so a finished search is not lost to an impatient key."""
    prices = price_table(cfg.cost)
    progress = _Progress(not quiet)
    started = time.monotonic()
    with graceful_interrupt():
        with make_executor(workers, ray) as executor:
            result = make_plan(cfg.cluster, cfg.job, budget=settings.budget,
                               rounds=settings.rounds, chains=settings.chains,
                               seed=settings.seed, tolerance=settings.tolerance,
                               baselines=settings.baselines,
                               executor=executor, prices=prices,
                               finder_kwargs=settings.finder_kwargs, source=config,
                               parallel=settings.parallel,
                               progress=progress,
                               on_fabric=lambda n, t, how: progress(n, 0, t, how))
        progress.done()
        reset_stop()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ExportSkipped)
            paths = write_plan(result, output, exports=exports, plots=plots,
                               report=html_report, msccl_runtime=msccl_runtime)
        if stop_requested():
            click.echo("note: Ctrl-C while writing: the plan's files were finished first",
                       err=True)
    for w in caught:
        if issubclass(w.category, ExportSkipped):
            click.echo(f"note: {w.message}", err=True)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if llm:
        _report_llm(result, config, time.monotonic() - started)
    else:
        _report(result, config, settings.seed, time.monotonic() - started)
    for w in caught:  # in the summary too, not only in a note line (issue 33)
        if issubclass(w.category, ExportSkipped):
            click.echo(f"skipped   {w.message}")
    folder = shown(output.rstrip("/") or "/")
    click.echo(f"wrote {len(paths)} file{'s' * (len(paths) != 1)} to {folder}/ (check them: "
               f"topoopt plan --check {folder})")
