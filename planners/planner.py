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
   is faster ("cross-seeding", :mod:`~topoopt.planners.crossing`): a strategy found on
   one fabric is often good on another, and this is what makes the Ideal Switch -- a
   relaxation of every fabric here (the same d x B per server, one link latency
   between any two servers, no forwarding, no blocking) -- come out at least as fast
   as all of them, so each fabric's gap to it is the price of its network, not of its
   search. Each timing starts as soon as the two searches it needs have ended, beside
   the searches still running; they are applied in the fixed order of the fabrics
   once all have ended, so the plan does not depend on which search ended first.
   Each search ends by estimating its best on its fabric built afresh, what the plan
   reports unless another fabric's best is adopted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Hashable, Mapping, Sequence

from topoopt._require import require_callable, require_instance, require_names, require_seed
from topoopt.cluster import Cluster, Job
from topoopt.config import PLAN_DEFAULTS, PlanSettings
from topoopt.errors import ConfigError
from topoopt.executor import Executor, Pending, SerialExecutor
from topoopt.fabrics.catalog import FABRICS, build_fabric
from topoopt.fabrics.cost import DEFAULT_PRICES, PriceTable
from topoopt.finder.topology_finder import TopologyPlan
from topoopt.interrupt import stop_requested
from topoopt.model import Model
from topoopt.planners.alternating import (
    MAX_SEARCH_SERVERS,
    AlternatingResult,
    alternating_optimization,
    start_strategy,
)
from topoopt.planners.cost import IterationCost
from topoopt.planners.crossing import (
    CrossUnit,
    Evaluation,
    adopt,
    cross_pairs,
    cross_time,
    evaluate,
)
from topoopt.planners.llm import plan_llm
from topoopt.planners.search import SCREENED_FAMILIES, FabricSearch, search_space
from topoopt.planners.space import StrategySpace
from topoopt.planners.structure import SIDE_LAYOUTS, structured_strategies
from topoopt.plans.document import FabricResult, Plan
from topoopt.plans.llm import LLMPlan
from topoopt.strategy import Strategy, data_parallel, hybrid
from topoopt.workloads import model_of
from topoopt.workloads.gpt import is_transformer

__all__ = ["plan", "FabricTask", "FabricOutcome", "search_one_fabric", "require_baselines",
           "IDEAL_EFFORT", "BESIDE_IDEAL"]

#: The Ideal Switch's budget, in multiples of the others'.
IDEAL_EFFORT = 2
#: Fabrics searched beside the Ideal Switch instead of after it, without its bests as
#: starts: the Expander's random graph favours strategies on small, well-connected
#: server blocks that the Ideal Switch's never are (docs/tuning.md, "Planner"), and
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
    #: the best strategy estimated on the fabric built afresh (module notes)
    evaluation: Evaluation | None = None


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
    times without them, in less time: docs/tuning.md, "Planner")."""
    return 0 if task.extra else SCREENED_FAMILIES


def search_one_fabric(task: FabricTask,
                      progress: Callable[[str, int, float], None] | None = None
                      ) -> FabricOutcome:
    """Run one fabric's search and estimate its best (module-level so pool and Ray
    workers can import it)."""
    require_instance("task", task, FabricTask)
    require_callable("progress", progress)
    cluster, job = task.cluster, task.job
    model = model_of(job)
    space = StrategySpace.build(model, cluster, job)
    if task.name == "topoopt":
        return _alternate(task, model, space, progress)
    start = start_strategy(model, cluster, job, space)
    fabric = build_fabric(task.name, cluster, task.prices, task.fabric_seed, job=job,
                          model=model, strategy=start)
    cost = IterationCost(model, cluster, job, fabric, seed=task.fabric_seed)
    refs = _reference_starts(model, cluster, space)
    found = search_space(space, cost, structured_strategies(model, space),
                         extra=[("start", start), *refs, *task.extra], chains=task.chains,
                         budget=task.budget * task.rounds, seed=task.seed,
                         tolerance=task.tolerance, screened_families=_screened(task),
                         progress=(lambda m, t: progress(task.name, m, t)) if progress else None)
    cost.release()   # the estimate below builds the fabric afresh
    own = evaluate(task.name, model, cluster, job, found.best, task.prices, task.fabric_seed,
                   found.best_time, start=start)
    return FabricOutcome(task.name, found.best, found.best_time, search=found, evaluation=own)


def _alternate(task: FabricTask, model: Model, space: StrategySpace,
               progress: Callable[[str, int, float], None] | None) -> FabricOutcome:
    """The TopoOpt shard's search: alternating optimization from the plan's start,
    with the reference strategies and ``task.extra`` as more first-round starts."""
    cluster, job = task.cluster, task.job
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
    own = evaluate(task.name, model, cluster, job, found.strategy, task.prices,
                   task.fabric_seed, found.time, found.topology_plan)
    return FabricOutcome(task.name, found.strategy, found.time, alternating=found,
                         topology_plan=found.topology_plan, evaluation=own)


def require_baselines(baselines: object) -> tuple[str, ...]:
    """``baselines`` as fabrics of the catalog to compare with the TopoOpt shard: a
    list of names (not one string), each once, none of them ``topoopt``.

    Raises
    ------
    ConfigError
        ``plan.baselines``, naming the fabrics allowed.
    """
    allowed = tuple(n for n in FABRICS if n != "topoopt")
    return require_names("plan.baselines", baselines, allowed, example='["ideal"]')


def _type_fix(name: str, value: object) -> str:
    """What to pass instead of ``value`` for :func:`plan`'s ``cluster`` or ``job``."""
    if isinstance(value, (str, Path)):
        return "read a config with topoopt.load_config(path) and pass cfg.cluster, cfg.job"
    if isinstance(value, (Cluster, Job)):
        return "the arguments are swapped: plan(cluster, job, ...)"
    if name == "cluster":
        return ("build one with topoopt.Cluster(servers=..., nics=..., link_bandwidth=...) "
                "or topoopt.config.cluster_from_table(table)")
    return ("build one with topoopt.Job(model, batch_per_gpu, ...) or "
            "topoopt.config.job_from_table(table)")


def _require_arguments(cluster: object, job: object, executor: object, prices: object,
                       progress: object, on_fabric: object, source: object,
                       fabric_seed: object) -> None:
    """:func:`plan`'s arguments other than its settings, checked before any work."""
    require_instance("cluster", cluster, Cluster, _type_fix("cluster", cluster))
    require_instance("job", job, Job, _type_fix("job", job))
    if executor is not None and not all(hasattr(executor, a) for a in ("name", "map",
                                                                         "submit")):
        raise TypeError(f"executor must be an Executor or None, not "
                        f"{type(executor).__name__}: topoopt.executor.make_executor(workers)")
    if prices is not None:
        require_instance("prices", prices, PriceTable,
                         "topoopt.fabrics.cost.price_table(config's [cost] table)")
    require_callable("progress", progress)
    require_callable("on_fabric", on_fabric)
    require_instance("source", source, str, "the config's path, for the plan")
    require_seed("fabric_seed", fabric_seed)


def plan(cluster: Cluster, job: Job, *, budget: int = PLAN_DEFAULTS.budget,
         rounds: int = PLAN_DEFAULTS.rounds, chains: int = PLAN_DEFAULTS.chains,
         seed: int = PLAN_DEFAULTS.seed, tolerance: float = PLAN_DEFAULTS.tolerance,
         baselines: Sequence[str] = PLAN_DEFAULTS.baselines, executor: Executor | None = None,
         prices: PriceTable | None = None, finder_kwargs: Mapping | None = None,
         source: str = "", progress: Callable[[str, int, float], None] | None = None,
         on_fabric: Callable[[str, float, str], None] | None = None,
         fabric_seed: int = 0, parallel: Mapping | None = None) -> Plan | LLMPlan:
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
        Fabrics to compare, each once (default: ideal, fattree, oversub, expander).
    executor : Executor, optional
        :func:`topoopt.executor.make_executor`; serial by default. The result does
        not depend on it.
    prices : PriceTable, optional
        Cost model prices (:func:`topoopt.fabrics.cost.price_table`).
    finder_kwargs : mapping, optional
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
    parallel : mapping, optional
        An LLM job's fixed degrees (a config's ``[plan] parallel``).

    The defaults and bounds of ``budget`` .. ``baselines`` are those of
    :class:`topoopt.config.PlanSettings` (a config's ``[plan]``, ``topoopt plan``).

    Returns
    -------
    Plan or LLMPlan
        An :class:`~topoopt.plans.llm.LLMPlan` for an LLM or MoE job
        (:func:`~topoopt.planners.llm.plan_llm`).

    Raises
    ------
    ConfigError
        A setting out of its bounds, named as in a config (``plan.budget``).
    TypeError
        ``cluster``, ``job`` or another argument of the wrong type.

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
    _require_arguments(cluster, job, executor, prices, progress, on_fabric, source,
                       fabric_seed)
    settings = PlanSettings(budget=budget, rounds=rounds, chains=chains, seed=seed,
                            tolerance=tolerance, baselines=baselines,
                            parallel=parallel if parallel is not None else {},
                            finder_kwargs=finder_kwargs if finder_kwargs is not None else {})
    require_baselines(settings.baselines)
    prices = prices or DEFAULT_PRICES
    executor = executor or SerialExecutor()
    model = model_of(job)
    # LLM and MoE jobs: the Megatron-style planner (degrees, micro-batches, placement;
    # TopologyFinder per candidate). Budget, rounds, chains, seed and tolerance are for
    # the MCMC search and do not apply: it is exhaustive.
    if is_transformer(model):
        return plan_llm(cluster, job, baselines=settings.baselines, prices=prices,
                        source=source, fabric_seed=fabric_seed,
                        finder_kwargs=dict(settings.finder_kwargs), on_fabric=on_fabric,
                        fixed=settings.parallel, executor=executor)
    if cluster.servers > MAX_SEARCH_SERVERS:
        raise ConfigError("cluster.servers", cluster.servers,
                          f"must be 2 to {MAX_SEARCH_SERVERS} for a strategy search (DLRM and "
                          "other non-LLM jobs; docs/limits.md)")
    return _plan_dnn(cluster, job, model, settings, executor, prices, source, progress,
                     on_fabric, fabric_seed)


def _plan_dnn(cluster: Cluster, job: Job, model: Model, settings: PlanSettings,
              executor: Executor, prices: PriceTable, source: str,
              progress: Callable[[str, int, float], None] | None,
              on_fabric: Callable[[str, float, str], None] | None, fabric_seed: int) -> Plan:
    """:func:`plan` for a DNN job (module notes): every fabric searched, cross-seeded,
    and the results gathered into a :class:`Plan`."""
    space = StrategySpace.build(model, cluster, job)
    start = start_strategy(model, cluster, job, space)
    names = ("topoopt", *settings.baselines)
    make_task = partial(FabricTask, cluster=cluster, job=job, budget=settings.budget,
                        rounds=settings.rounds, chains=settings.chains, seed=settings.seed,
                        tolerance=settings.tolerance, prices=prices,
                        finder_kwargs=dict(settings.finder_kwargs), fabric_seed=fabric_seed)
    budget = 0 if stop_requested() else settings.budget
    crossing = _Crossing(names, executor, partial(
        CrossUnit, cluster=cluster, job=job, prices=prices, fabric_seed=fabric_seed,
        finder_kwargs=dict(settings.finder_kwargs), start=start))
    best = _search_fabrics(names, make_task, budget, executor, progress, on_fabric,
                           crossing.add)
    own = {n: o.evaluation for n, o in best.items() if o.evaluation is not None}
    timed = crossing.results()
    chosen = {n: (own[n], "") for n in names} if timed is None else adopt(names, own, timed)
    return Plan(cluster, job, model, chosen["topoopt"][0].topology_plan,
                _fabric_results(names, best, chosen),
                best["topoopt"].alternating, settings.seed, budget, settings.rounds, settings.chains,
                source, tolerance=settings.tolerance,
                references=_references(names, best, start), fabric_seed=fabric_seed)


def _search_fabrics(names: Sequence[str], make_task: Callable[..., FabricTask], budget: int,
                    executor: Executor,
                    progress: Callable[[str, int, float], None] | None,
                    on_fabric: Callable[[str, float, str], None] | None,
                    ended: Callable[[FabricOutcome], None] = lambda out: None
                    ) -> dict[str, FabricOutcome]:
    """Every fabric's search (module notes, steps 1 and 2): the Ideal Switch first with
    :data:`IDEAL_EFFORT` times ``budget`` (the :data:`BESIDE_IDEAL` fabrics beside it),
    then the others from its chains' bests as well. ``ended(outcome)`` as each search
    ends (in a pool or on Ray: as it ends, after any searches it lets start)."""
    best: dict[str, FabricOutcome] = {}

    def done(out: FabricOutcome) -> None:
        best[out.name] = out
        if on_fabric is not None:
            s = out.search or (out.alternating.searches[-1] if out.alternating
                               and out.alternating.searches else None)
            on_fabric(out.name, out.time, s.stop if s is not None else "start")
        ended(out)

    def task(n: str, extra: tuple[tuple[str, Strategy], ...] = ()) -> FabricTask:
        if n == "ideal":
            return make_task(n, budget=budget * IDEAL_EFFORT)
        return make_task(n, budget=budget, extra=() if n in BESIDE_IDEAL else extra)

    # the fabrics that do not start from the Ideal Switch's bests run beside its search
    # (in this process: after it, with their progress shown)
    serial = executor.name == "serial"
    beside = [n for n in names if n in BESIDE_IDEAL and "ideal" in names and not serial]
    # the costliest searches first: the pool then ends them about together
    order = sorted((n for n in names if n != "ideal" and n not in beside),
                   key=lambda n: (n not in ("topoopt", "expander"), names.index(n)))
    if serial:
        extra: tuple[tuple[str, Strategy], ...] = ()
        for n in ["ideal"] * ("ideal" in names) + order:
            done(search_one_fabric(task(n, extra), progress))
            extra = _chain_bests(best[n].search) if n == "ideal" else extra
        return best
    running = {n: executor.submit(search_one_fabric, task(n))
               for n in [*beside, *["ideal"] * ("ideal" in names)]}
    if "ideal" not in names:
        running.update((n, executor.submit(search_one_fabric, task(n))) for n in order)
    while running:
        n = list(running)[_next_done(executor, list(running.values()))]
        out = running.pop(n).result()
        if n == "ideal":
            extra = _chain_bests(out.search)
            running.update((m, executor.submit(search_one_fabric, task(m, extra)))
                           for m in order)
        done(out)
    return best


def _next_done(executor: Executor, pending: list[Pending]) -> int:
    """The index of a task of ``pending`` that has ended, waiting for one (the first,
    where the executor cannot tell: it has no ``next_done``)."""
    next_done = getattr(executor, "next_done", None)
    return next_done(pending) if next_done is not None else 0


def _chain_bests(search: FabricSearch | None) -> tuple[tuple[str, Strategy], ...]:
    """A search's chains' distinct bests, fastest first, named ``ideal best k``: the
    Ideal Switch's, as more starts for the other fabrics."""
    if search is None:
        return ()
    bests = sorted(search.chains, key=lambda c: (c.best_time, c.seed))
    return tuple((f"ideal best {k + 1}", c.best) for k, c in enumerate(
        dict((c.best.configs, c) for c in bests).values()))


class _Crossing:
    """Cross-seeding's timings (module notes, step 3), started as the searches end:
    :meth:`add` each search's outcome, then :meth:`results`."""

    def __init__(self, names: Sequence[str], executor: Executor,
                 make_unit: Callable[..., CrossUnit]) -> None:
        self.names, self.executor, self.make_unit = names, executor, make_unit
        self.strategies: dict[str, Strategy] = {}
        self.times: dict[str, float] = {}
        self.pending: dict[tuple[str, Hashable], Pending] = {}

    def add(self, out: FabricOutcome) -> None:
        """Start the timings ``out``'s search makes possible: its best on the fabrics
        whose searches have ended, and theirs on its fabric."""
        self.strategies[out.name] = out.strategy
        self.times[out.name] = out.time
        if stop_requested():  # Ctrl-C: no cross-seeding
            return
        new = [(n, self.strategies[m]) for n, m in cross_pairs(self.names, self.strategies)
               if (n, self.strategies[m].configs) not in self.pending]
        # the costliest first (TopologyFinder on the shard, the Expander's routes); a
        # strategy only matters where it beats the fabric's own best
        for n, s in sorted(new, key=lambda p: (p[0] != "topoopt", p[0] != "expander")):
            self.pending[(n, s.configs)] = self.executor.submit(
                cross_time, self.make_unit(n, strategy=s, beat=self.times[n]))

    def results(self) -> dict[tuple[str, Hashable], Evaluation] | None:
        """``(fabric, strategy configs)`` -> the timing, once all have ended; None after
        a Ctrl-C (the plan then keeps every fabric's own best)."""
        if stop_requested():
            return None
        return {key: p.result() for key, p in self.pending.items()}


def _fabric_results(names: Sequence[str], best: dict[str, FabricOutcome],
                    chosen: dict[str, tuple[Evaluation, str]]) -> tuple[FabricResult, ...]:
    """Every fabric's best strategy (its own or adopted) estimated on its fabric, with
    the fabric's cost."""
    results = []
    for n in names:
        o = best[n]
        e, adopted = chosen[n]
        if n == "topoopt":
            # the shard's search is an alternation, which always ends with a topology
            assert o.alternating is not None and e.topology_plan is not None
            start_t, moves = o.alternating.start_time, o.alternating.moves
        else:
            assert o.search is not None  # every baseline is searched
            start_t, moves = o.search.start_time, o.search.moves
        results.append(FabricResult(n, FABRICS[n].title, e.strategy, e.estimate, e.cost,
                                    start_t, moves, search=o.search, adopted_from=adopted))
    return tuple(results)


def _references(names: Sequence[str], best: dict[str, FabricOutcome], start: Strategy
                ) -> dict[str, dict[str, float]]:
    """Per fabric, the time of data parallel and of the hybrid where its search timed
    them (the TopoOpt shard: each on its own topology)."""
    start_name = "data parallel" if start.name == "dp" else "hybrid"
    references: dict[str, dict[str, float]] = {}
    for n in names:
        o = best[n]
        timed: Sequence[tuple[str, float]]
        if n == "topoopt":
            assert o.alternating is not None  # as in _fabric_results
            timed = o.alternating.screened
        else:
            assert o.search is not None
            timed = o.search.starts
        refs = {(start_name if k == "start" else k): t for k, t in timed
                if k in ("start", "data parallel", "hybrid")}
        references[n] = {k: refs[k] for k in ("data parallel", "hybrid") if k in refs}
    # Ctrl-C can stop the TopoOpt shard before it timed a reference on its topology:
    # the table compares a strategy on every fabric or not at all
    common = set.intersection(*(set(r) for r in references.values())) if references else set()
    return {n: {k: t for k, t in r.items() if k in common} for n, r in references.items()}
