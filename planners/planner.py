"""Plan a job's optical shard: co-optimized strategy and topology, compared with every fabric.

:func:`plan` is the library call behind ``topoopt plan CONFIG -o DIR`` (and
``topoopt.plan``):

1. the Ideal Switch is searched first, with :data:`IDEAL_EFFORT` times the budget: it
   is the cheapest fabric to simulate and the bound of all the others, so its search
   should converge best, and its chains' bests start every other search but the
   Expander's (:data:`BESIDE_IDEAL`: searched at the same time);
2. every other fabric is then searched on its own, in parallel through the executor:
   the TopoOpt shard by alternating optimization (TopoOpt §4,
   :func:`~topoopt.planners.alternating.alternating_optimization`), each baseline
   (cost-equivalent Fat-tree, 2:1 oversubscribed Fat-tree, Expander; §5) by
   :func:`~topoopt.planners.search.search_space` with the same per-chain budget; all
   start from the same structured strategies (:mod:`~topoopt.planners.structure`;
   the TopoOpt shard's first round may also start from the side-branch layouts,
   :data:`~topoopt.planners.structure.SIDE_LAYOUTS`);
3. every fabric's best strategy is then tried on every other fabric and kept where it
   is faster ("cross-seeding"): a strategy found on one fabric is often good on
   another, and this is what makes the Ideal Switch -- a relaxation of every fabric
   here (the same d x B per server, one link latency between any two servers, no
   forwarding, no blocking) -- come out at least as fast as all of them, so each
   fabric's gap to it is the price of its network, not of its search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError
from topoopt.executor import Executor, SerialExecutor
from topoopt.fabrics.catalog import FABRICS, build_fabric
from topoopt.fabrics.cost import DEFAULT_PRICES, PriceTable, fabric_cost
from topoopt.finder.topology_finder import TopologyPlan
from topoopt.interrupt import stop_requested
from topoopt.planners.alternating import (
    AlternatingResult,
    alternating_optimization,
    best_topology,
    start_strategy,
    topoopt_fabric,
)
from topoopt.planners.cost import IterationCost
from topoopt.planners.llm import plan_llm
from topoopt.planners.search import (
    DEFAULT_TOLERANCE,
    SCREENED_FAMILIES,
    FabricSearch,
    search_space,
)
from topoopt.planners.space import StrategySpace
from topoopt.planners.structure import SIDE_LAYOUTS, structured_strategies
from topoopt.plans.document import BASELINES, FabricResult, Plan
from topoopt.strategy import Strategy, data_parallel, hybrid
from topoopt.workloads import model_of
from topoopt.workloads.gpt import is_transformer

__all__ = ["plan", "FabricTask", "FabricOutcome", "search_one_fabric", "IDEAL_EFFORT",
           "BESIDE_IDEAL"]

#: The Ideal Switch's budget, in multiples of the others'.
IDEAL_EFFORT = 2
#: Fabrics searched beside the Ideal Switch instead of after it, without its bests as
#: starts: the Expander's random graph favours strategies on small, well-connected
#: server blocks that the Ideal Switch's never are (DLRM-128 and BERT-128, seeds 0-4:
#: its bests the same or faster without them, 156.2-165.1 ms and 159.4-168.9 ms), and
#: it is the costliest search, so that is when the pool has a free worker.
BESIDE_IDEAL = ("expander",)


@dataclass(frozen=True)
class FabricTask:
    """One fabric's search, self-contained so a process pool or Ray can run it."""

    name: str
    cluster: Cluster
    job: Job
    budget: int
    rounds: int
    chains: int
    seed: int
    tolerance: float
    prices: PriceTable
    finder_kwargs: Mapping = field(default_factory=dict)
    #: strategies to time on this fabric instead of searching (cross-seeding)
    candidates: tuple[tuple[str, Strategy], ...] = ()
    #: more starts for the search (the Ideal Switch's best strategies)
    extra: tuple[tuple[str, Strategy], ...] = ()
    #: the Expander's random graph and TopologyFinder's tie-breaks
    fabric_seed: int = 0


@dataclass(frozen=True)
class FabricOutcome:
    """What a :class:`FabricTask` found: the best strategy and time, and the record."""

    name: str
    strategy: Strategy
    time: float
    search: FabricSearch | None = None
    alternating: AlternatingResult | None = None
    topology_plan: TopologyPlan | None = None
    #: per candidate of a cross-seeding task: (name, time, topology plan or None)
    timed: tuple = ()


def _reference_starts(model, cluster, space) -> list[tuple[str, Strategy]]:
    """The plan's start (data parallel, else DLRM's hybrid) and the other of the two
    where it is valid: the strategies people compare a plan with."""
    out: list[tuple[str, Strategy]] = []
    for name, make in (("data parallel", data_parallel), ("hybrid", hybrid)):
        s = make(model, cluster.servers)
        if space.contains(s) and all(s.configs != t.configs for _, t in out):
            out.append((name, s))
    return out


def _screened(task: FabricTask) -> int:
    """Families a task's search descends beyond one per chain: none where the Ideal
    Switch's bests start it -- its screened bottoms stand for the families (the same
    times without: DLRM-128's 2:1 and cost-equal Fat-trees and TopoOpt, seeds 0-1,
    DLRM-16's 2:1 Fat-tree and TopoOpt, seeds 0-4; the 2:1 Fat-tree's DLRM-128 search
    7.5 s of CPU instead of about 18)."""
    return 0 if task.extra else SCREENED_FAMILIES


def search_one_fabric(task: FabricTask,
                      progress: Callable[[str, int, float], None] | None = None
                      ) -> FabricOutcome:
    """Run one fabric's search, or time ``task.candidates`` on it (module-level so pool
    and Ray workers can import it)."""
    cluster, job = task.cluster, task.job
    model = model_of(job)
    space = StrategySpace.build(model, cluster, job)
    if task.name == "topoopt":
        if task.candidates:
            timed = tuple((n, *reversed(best_topology(model, s, cluster, job, task.fabric_seed,
                                                      task.finder_kwargs)))
                          for n, s in task.candidates)
            return FabricOutcome(task.name, task.candidates[0][1], timed[0][1], timed=timed)
        start = start_strategy(model, cluster, job, space)
        refs = _reference_starts(model, cluster, space)
        found = alternating_optimization(
            model, cluster, job, start, rounds=task.rounds, budget=task.budget,
            chains=task.chains, seed=task.seed, tolerance=task.tolerance,
            topology_seed=task.fabric_seed,
            finder_kwargs=task.finder_kwargs,
            seeds={n: s for n, s in [*refs, *task.extra] if s.configs != start.configs},
            layouts=structured_strategies(model, space),
            side_layouts=structured_strategies(model, space, SIDE_LAYOUTS), progress=progress,
            screened_families=_screened(task))
        return FabricOutcome(task.name, found.strategy, found.time, alternating=found,
                             topology_plan=found.topology_plan)
    start = start_strategy(model, cluster, job, space)
    fabric = build_fabric(task.name, cluster, task.prices, task.fabric_seed, job=job,
                          model=model, strategy=start)
    cost = IterationCost(model, cluster, job, fabric, seed=task.fabric_seed)
    if task.candidates:
        timed = tuple((n, cost(s), None) for n, s in task.candidates)
        return FabricOutcome(task.name, task.candidates[0][1], timed[0][1], timed=timed)
    refs = _reference_starts(model, cluster, space)
    found = search_space(space, cost, structured_strategies(model, space),
                         extra=[("start", start), *refs, *task.extra], chains=task.chains,
                         budget=task.budget * task.rounds, seed=task.seed,
                         tolerance=task.tolerance, screened_families=_screened(task),
                         progress=(lambda m, t: progress(task.name, m, t)) if progress else None)
    return FabricOutcome(task.name, found.best, found.best_time, search=found)


def plan(cluster: Cluster, job: Job, *, budget: int = 200, rounds: int = 2, chains: int = 2,
         seed: int = 0, tolerance: float = DEFAULT_TOLERANCE,
         baselines: Sequence[str] = BASELINES, executor: Executor | None = None,
         prices: PriceTable | None = None, finder_kwargs: dict | None = None,
         source: str = "", progress: Callable[[str, int, float], None] | None = None,
         on_fabric: Callable[[str, float, str], None] | None = None,
         fabric_seed: int = 0, parallel: Mapping | None = None) -> Plan:
    """Co-optimize a job's strategy and its shard's topology, and compare fabrics.

    Parameters
    ----------
    cluster : Cluster
    job : Job
    budget : int
        MCMC moves per chain per round. Each baseline gets ``budget x rounds`` moves
        per chain, the most the TopoOpt alternation can spend.
    rounds : int
        k, rounds of alternating optimization.
    chains : int
        MCMC chains per search, each from a different structured start; a search
        stops early once they agree within ``tolerance``.
    seed : int
        The searches' seed (their MCMC chains).
    tolerance : float
        Agreement of the chains that ends a search (and the least improvement that
        keeps the alternation going), as a fraction.
    baselines : sequence of str
        Fabrics to compare (default: ideal, fattree, oversub, expander).
    executor : Executor, optional
        :func:`topoopt.executor.make_executor`; serial by default. The result does
        not depend on it.
    prices : PriceTable, optional
        Cost model prices (:func:`topoopt.fabrics.cost.price_table`).
    finder_kwargs : dict, optional
        TopologyFinder options (``routing``, ``k_paths``, ``primes_only``, ``mp_decay``).
    source : str
        Config path, echoed in the plan.
    progress : callable, optional
        ``progress(stage, moves_done, best_seconds)`` (searches run in this process only).
    on_fabric : callable, optional
        ``on_fabric(name, best_seconds, how)`` as each fabric's search ends.
    fabric_seed : int
        The Expander's random graph and TopologyFinder's tie-breaks: part of the
        fabrics, not of the search, so fixed by default -- another ``seed`` then changes
        only the search.

    Returns
    -------
    Plan

    Examples
    --------
    >>> from topoopt import Cluster, Job
    >>> p = plan(Cluster(servers=4, nics=2, link_bandwidth=100e9),
    ...          Job("ncf", 32, size={"tables": 4, "rows": 1000, "top_layers": 2}),
    ...          budget=20, rounds=1)
    >>> p.fabric("topoopt").estimate.total <= p.search.start_time
    True
    >>> p.iteration_time_s["ideal"] <= min(p.iteration_time_s.values())
    True
    """
    for name, value, low in (("plan.budget", budget, 0), ("plan.rounds", rounds, 1),
                             ("plan.chains", chains, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(name, value, f"must be an integer >= {low}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) \
            or not 0 <= tolerance < 1:
        raise ConfigError("plan.tolerance", tolerance, "must be a fraction in [0, 1), "
                                                       "e.g. 0.01 for 1%")
    if isinstance(baselines, str):
        raise ConfigError("plan.baselines", baselines, "must be a list of fabric names, "
                                                       f"e.g. [\"{baselines}\"]")
    for name in baselines:
        if name not in FABRICS or name == "topoopt":
            raise ConfigError("plan.baselines", name,
                              f"use some of {', '.join(n for n in FABRICS if n != 'topoopt')}")
    prices = prices or DEFAULT_PRICES
    executor = executor or SerialExecutor()
    finder_kwargs = dict(finder_kwargs or {})
    model = model_of(job)
    # --- LLM and MoE jobs (gpt, moe and their presets): the Megatron-style planner of
    # topoopt.planners.llm (degrees, micro-batches, placement; TopologyFinder per
    # candidate), which returns a topoopt.plans.llm.LLMPlan. Budget, rounds, chains,
    # seed and tolerance are for the MCMC search and do not apply: it is exhaustive.
    if is_transformer(model):
        return plan_llm(cluster, job, baselines=baselines, prices=prices, source=source,
                        fabric_seed=fabric_seed, finder_kwargs=finder_kwargs,
                        on_fabric=on_fabric, fixed=parallel)
    # ---
    space = StrategySpace.build(model, cluster, job)
    start = start_strategy(model, cluster, job, space)
    names = ("topoopt", *dict.fromkeys(baselines))
    task = (lambda name, budget_=budget, candidates=(), extra=(): FabricTask(
        name, cluster, job, budget_, rounds, chains, seed, float(tolerance), prices,
        finder_kwargs, candidates, extra, fabric_seed))
    if stop_requested():
        budget = 0

    def done(out: FabricOutcome) -> None:
        if on_fabric is not None:
            s = out.search or (out.alternating.searches[-1] if out.alternating
                               and out.alternating.searches else None)
            on_fabric(out.name, out.time, s.stop if s is not None else "start")

    def run(tasks: list[FabricTask]) -> list[FabricOutcome]:
        if executor.name == "serial":
            out = []
            for t in tasks:
                out.append(search_one_fabric(t, progress))
                done(out[-1])
            return out
        return executor.map(search_one_fabric, tasks, on_done=lambda i, o: done(o))

    best: dict[str, FabricOutcome] = {}
    extra: tuple = ()
    # the fabrics that do not start from the Ideal Switch's bests run beside its search
    # (in this process: after it, with their progress shown)
    beside = [n for n in names if n in BESIDE_IDEAL]
    pending = {n: executor.submit(search_one_fabric, task(n, budget)) for n in beside
               if executor.name != "serial" and "ideal" in names}
    if "ideal" in names:
        best["ideal"] = run([task("ideal", budget * IDEAL_EFFORT)])[0]
        bests = sorted(best["ideal"].search.chains, key=lambda c: (c.best_time, c.seed))
        extra = tuple((f"ideal best {k + 1}", c.best) for k, c in enumerate(
            dict((c.best.configs, c) for c in bests).values()))
    # the costliest searches first: the pool then ends them about together
    order = sorted((n for n in names if n != "ideal" and n not in pending),
                   key=lambda n: (n not in ("topoopt", "expander"), names.index(n)))
    for out in run([task(n, budget, extra=() if n in beside else extra) for n in order]):
        best[out.name] = out
    for n, started in pending.items():
        best[n] = started.result()
        done(best[n])

    # Cross-seeding: each fabric's best strategy timed on every other fabric.
    adopted: dict[str, str] = {}
    if not stop_requested():
        cross = []
        for n in names:
            others = [(m, best[m].strategy) for m in names
                      if m != n and best[m].strategy.configs != best[n].strategy.configs]
            # one entry per distinct strategy
            uniq: dict = {}
            for m, s in others:
                uniq.setdefault(s.configs, (m, s))
            if uniq:
                cross.append(task(n, candidates=tuple(uniq.values())))
        for out in executor.map(search_one_fabric, cross):
            for m, t, tp in out.timed:
                if t < best[out.name].time:
                    src = best[m]
                    best[out.name] = FabricOutcome(
                        out.name, src.strategy, t, search=best[out.name].search,
                        alternating=best[out.name].alternating,
                        topology_plan=tp if out.name == "topoopt" else None)
                    adopted[out.name] = m
    results = []
    topo = best["topoopt"]
    topology_plan = topo.topology_plan
    for n in names:
        o = best[n]
        if n == "topoopt":
            fabric = topoopt_fabric(topology_plan)
            est = IterationCost(model, cluster, job, fabric, topology_plan.rings).estimate(
                o.strategy)
            start_t = o.alternating.start_time
            moves = o.alternating.moves
        else:
            fabric = build_fabric(n, cluster, prices, fabric_seed, job=job, model=model,
                                  strategy=start)
            est = IterationCost(model, cluster, job, fabric, seed=fabric_seed).estimate(
                o.strategy)
            start_t = o.search.start_time
            moves = o.search.moves
        results.append(FabricResult(n, FABRICS[n].title, o.strategy, est,
                                    fabric_cost(fabric, prices), start_t, moves,
                                    search=o.search, adopted_from=adopted.get(n, "")))
    start_name = "data parallel" if start.name == "dp" else "hybrid"
    references = {}
    for n in names:
        o = best[n]
        timed = o.alternating.screened if n == "topoopt" else o.search.starts
        refs = {(start_name if k == "start" else k): t for k, t in timed
                if k in ("start", "data parallel", "hybrid")}
        references[n] = {k: refs[k] for k in ("data parallel", "hybrid") if k in refs}
    return Plan(cluster, job, model, topology_plan, tuple(results), topo.alternating, seed,
                budget, rounds, chains, source, tolerance=float(tolerance),
                references=references, fabric_seed=fabric_seed)
