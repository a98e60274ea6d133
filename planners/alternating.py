"""Alternating optimization of strategy and topology (TopoOpt §4, Figure 6).

Comp x Comm plane: MCMC over strategies on the current topology
(:func:`~topoopt.planners.search.search_space`). Comm x Topo plane: TopologyFinder on
the traffic of the strategies it found. Repeat until the iteration time stops
improving or ``rounds`` rounds ran.

MCMC on a fixed topology is myopic: on a topology built for one strategy's traffic,
moves toward a strategy whose traffic needs other links are rejected even where that
strategy on *its* topology is much faster (the 128-server DLRM shard built for the
hybrid's AllReduce has no MP ports, so every MLP move adds forwarded transfers). So
candidates are judged on a topology that fits them: before the first round, the
start, the given seeds and the structured strategies that are fastest on the Ideal
Switch (a relaxation of the shard: same d x B per server, no forwarding) each get
their own TopologyFinder topology, and after every round so do the chains' bests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from topoopt.cluster import Cluster, Job
from topoopt.errors import TopoOptError
from topoopt.fabrics import direct_connect, ideal_switch
from topoopt.finder.topology_finder import TopologyPlan, extend_plan, topology_finder
from topoopt.interrupt import stop_requested
from topoopt.model import Model
from topoopt.planners.cost import IterationCost
from topoopt.planners.mcmc import descend
from topoopt.planners.moves import MoveSet
from topoopt.planners.search import (
    DEFAULT_TOLERANCE,
    DESCENT,
    SCREENED_FAMILIES,
    FabricSearch,
    search_space,
)
from topoopt.planners.space import StrategySpace
from topoopt.planners.structure import Layout
from topoopt.strategy import Strategy, data_parallel, hybrid
from topoopt.traffic import derive_traffic

__all__ = ["RoundRecord", "AlternatingResult", "alternating_optimization", "start_strategy",
           "plan_topology", "topoopt_fabric", "best_topology", "split_topologies", "SCREEN",
           "SPLIT_RATIO"]

#: Structured strategies (fastest on the Ideal Switch first) given their own topology
#: before the first round.
SCREEN = 4
#: After a round, its best descends on each other degree split's topology on which it
#: is at most this factor slower than its time on the round's choice (DLRM-16's
#: two-stage, tensor-split layout: 73.28 ms on Step 1's 3 + 1 split descends to 68.19,
#: from 89.06 on the 2 + 2 split to 56.60).
SPLIT_RATIO = 1.3


def start_strategy(model: Model, cluster: Cluster, job: Job, space: StrategySpace | None = None) -> Strategy:
    """Data parallel if it fits in memory, else DLRM-style hybrid (tables model-parallel).

    Raises
    ------
    TopoOptError
        When neither fits (the model is too large for the shard).
    """
    space = space or StrategySpace.build(model, cluster, job)
    for make in (data_parallel, hybrid):
        strategy = make(model, cluster.servers)
        if space.contains(strategy):
            return strategy
    raise TopoOptError(
        f"job.model = {model.name!r}: neither data parallel nor hybrid fits in "
        f"{cluster.gpus_per_server} x {cluster.gpu.memory / 1e9:.0f} GB per server; "
        "use more servers, a smaller model or fp16")


def _traffic(model: Model, strategy: Strategy, cluster: Cluster, job: Job):
    return derive_traffic(model, strategy, cluster.servers, job.global_batch(cluster),
                          job.dtype_bytes)


def plan_topology(model: Model, strategy: Strategy, cluster: Cluster, job: Job, seed: int = 0,
                  allreduce_degree: int | None = None, **finder_kwargs):
    """TopologyFinder (Algorithm 1) on the traffic of ``strategy``."""
    return topology_finder(_traffic(model, strategy, cluster, job), cluster.servers,
                           cluster.nics, cluster.link_bandwidth, cluster.link_latency,
                           seed=seed, allreduce_degree=allreduce_degree, **finder_kwargs)


def topoopt_fabric(topology_plan: TopologyPlan):
    """The direct-connect fabric (patch panels, host forwarding) of a TopologyFinder plan."""
    return direct_connect(topology_plan.topology, topology_plan.routes, optics="patch_panel",
                          name="topoopt", rings=topology_plan.rings)


@dataclass(frozen=True)
class RoundRecord:
    """One round of alternating optimization.

    Attributes
    ----------
    round : int
    mcmc_time : float
        Best strategy's iteration time on the round's starting topology (with rings
        and routes extended to its traffic, :func:`~topoopt.finder.topology_finder.extend_plan`).
    topology_time : float
        The same strategy on the topology TopologyFinder built for its traffic.
    allreduce_degree, mp_degree : int
        Step 1's split of the new topology.
    moves, accepted : int
    improved : bool
        Whether the round beat the best so far.
    """

    round: int
    mcmc_time: float
    topology_time: float
    allreduce_degree: int
    mp_degree: int
    moves: int
    accepted: int
    improved: bool

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class AlternatingResult:
    """The best (strategy, topology) pair and how the search got there.

    ``origin`` names the strategy the first round started from: ``"start"``, the key
    of one of the ``seeds`` given to :func:`alternating_optimization` or a structured
    layout's name. ``searches`` are the rounds' MCMC searches and ``screened`` every
    strategy given its own topology before the first round, with its time there.
    """

    strategy: Strategy
    topology_plan: TopologyPlan
    time: float
    start: Strategy
    start_time: float
    history: tuple[RoundRecord, ...]
    interrupted: bool = False
    moves: int = 0
    origin: str = "start"
    searches: tuple[FabricSearch, ...] = ()
    screened: tuple[tuple[str, float], ...] = ()


def best_topology(model: Model, strategy: Strategy, cluster: Cluster, job: Job, seed: int = 0,
                  finder_kwargs: Mapping | None = None, neighbours: bool = True,
                  base: tuple[TopologyPlan, float] | None = None
                  ) -> tuple[TopologyPlan, float]:
    """TopologyFinder for ``strategy``, trying Step 1's split and, with ``neighbours``,
    one AllReduce port more and one less.

    Algorithm 1 splits d in proportion to traffic; when MP traffic is a sliver, the
    one port it gets may cost AllReduce more than it saves MP. We let the simulator
    judge between the proportional split and its neighbours. ``base``: Step 1's
    topology and time, when already known.
    """
    return split_topologies(model, strategy, cluster, job, seed, finder_kwargs, neighbours,
                            base)[0]


def split_topologies(model: Model, strategy: Strategy, cluster: Cluster, job: Job,
                     seed: int = 0, finder_kwargs: Mapping | None = None,
                     neighbours: bool = True,
                     base: tuple[TopologyPlan, float] | None = None
                     ) -> list[tuple[TopologyPlan, float]]:
    """:func:`best_topology`'s candidates, fastest first: ``(plan, strategy's time on
    it)`` for Step 1's split and, with ``neighbours``, its neighbours."""
    finder_kwargs = dict(finder_kwargs or {})

    def timed(plan: TopologyPlan) -> float:
        return IterationCost(model, cluster, job, topoopt_fabric(plan), plan.rings)(strategy)

    if base is None:
        plan = plan_topology(model, strategy, cluster, job, seed, **finder_kwargs)
        base = (plan, timed(plan))
    scored = [(base[1], 0, base[0].degree_allreduce, base[0])]
    if neighbours:
        for d_ar in (base[0].degree_allreduce - 1, base[0].degree_allreduce + 1):
            if 1 <= d_ar <= cluster.nics:
                plan = plan_topology(model, strategy, cluster, job, seed,
                                     allreduce_degree=d_ar, **finder_kwargs)
                scored.append((timed(plan), 1, d_ar, plan))
    return [(plan, t) for t, _, _, plan in sorted(scored, key=lambda s: s[:3])]


def _descend_splits(space: StrategySpace, moveset: MoveSet, model: Model, cluster: Cluster,
                    job: Job, strategy: Strategy, plan: TopologyPlan, time: float,
                    splits: Sequence[tuple[TopologyPlan, float]], limit: int
                    ) -> tuple[Strategy, TopologyPlan, float]:
    """The round's best (``strategy`` on ``plan``, ``time``) descended
    (:func:`~topoopt.planners.mcmc.descend`) on each of the ``splits`` (the topologies
    of the degree splits TopologyFinder offers for it, with its time on each) within
    :data:`SPLIT_RATIO` of ``time``; the fastest (strategy, topology) pair of all.

    The MCMC judges candidates on one topology: the DLRM-128 shard's round on its 4 + 0
    split ends at 55.59 ms, while the same strategy on the 3 + 1 split (56.05 ms there)
    descends to 54.28 ms -- a finer grain of TopoOpt §4's alternation."""
    best = (time, strategy, plan)
    for plan_d, t_d in splits:
        if t_d > SPLIT_RATIO * time or stop_requested():
            continue
        cost = IterationCost(model, cluster, job, topoopt_fabric(plan_d), plan_d.rings)
        s_d, t_new, _ = descend(space, cost, strategy, t_d, moveset, limit)
        if t_new < best[0]:
            best = (t_new, s_d, plan_d)
    return best[1], best[2], best[0]


def alternating_optimization(model: Model, cluster: Cluster, job: Job, start: Strategy, *,
                             rounds: int = 3, budget: int = 200, chains: int = 1, seed: int = 0,
                             tolerance: float = DEFAULT_TOLERANCE,
                             finder_kwargs: Mapping | None = None,
                             seeds: Mapping[str, Strategy] | None = None,
                             layouts: Sequence[Layout] = (),
                             side_layouts: Sequence[Layout] = (), screen: int = SCREEN,
                             screened_families: int = SCREENED_FAMILIES,
                             topology_seed: int | None = None,
                             progress: Callable[[str, int, float], None] | None = None
                             ) -> AlternatingResult:
    """Co-optimize strategy and topology by alternating MCMC and TopologyFinder.

    Parameters
    ----------
    model, cluster, job :
        The job and its shard.
    start : Strategy
        Initial strategy (see :func:`start_strategy`).
    rounds : int
        k, the most rounds of (MCMC, TopologyFinder).
    budget : int
        MCMC moves per chain per round.
    chains : int
        Chains per round (:func:`~topoopt.planners.search.search_space`).
    seed : int
        The chains' seed.
    tolerance : float
        A round must improve the best time by this fraction to continue; the chains
        of a round stop when they agree within it.
    finder_kwargs : dict, optional
        Extra TopologyFinder options (routing, k_paths, primes_only, mp_decay).
    seeds : mapping of str to Strategy, optional
        Other strategies the first round may start from, e.g. the best strategy found
        on another fabric; each gets its own TopologyFinder topology.
    layouts : sequence of Layout
        Structured strategies: the ``screen`` fastest on the Ideal Switch get their own
        topology too; all of them serve the search's moves.
    side_layouts : sequence of Layout
        More structured strategies, screened apart (``screen`` more) that only the
        first round may start from: the rounds' searches leave them out (the
        :data:`~topoopt.planners.structure.SIDE_LAYOUTS`).
    screen : int
    screened_families : int
        As :func:`~topoopt.planners.search.search_space`, for each round's search.
    topology_seed : int, optional
        TopologyFinder's seed (its tie-breaks); default ``seed``.
    progress : callable, optional
        ``progress(stage, moves_done, best_time)``.

    Returns
    -------
    AlternatingResult

    Notes
    -----
    Each round runs MCMC on the current topology (Comp x Comm), then TopologyFinder on
    the traffic of each chain's best (Comm x Topo); a pair is kept only if the
    iteration time improved. The result is never worse than the start on its own
    topology, the baseline every candidate must beat.
    """
    finder_kwargs = dict(finder_kwargs or {})
    tseed = seed if topology_seed is None else topology_seed
    space = StrategySpace.build(model, cluster, job)
    start_plan = plan_topology(model, start, cluster, job, tseed, **finder_kwargs)
    start_t = IterationCost(model, cluster, job, topoopt_fabric(start_plan),
                            start_plan.rings)(start)
    # every candidate on Step 1's topology for its traffic, then the best two with
    # the neighbouring degree splits too
    screened: list[tuple[str, Strategy, TopologyPlan, float]] = [
        ("start", start, start_plan, start_t)]
    tried = {start.configs}
    candidates = list((seeds or {}).items())
    if screen > 0 and (layouts or side_layouts):
        ideal = IterationCost(model, cluster, job,
                              ideal_switch(cluster.servers, cluster.server_bandwidth,
                                           cluster.link_latency / 2))
        # the side layouts screened apart: fast on the Ideal Switch, they would take
        # the others' places (DLRM-128: tables-mp4+body-stages2@ops, whose round ends
        # at 54.28 ms, against 54.47 from the side layout that displaced it)
        for pool in (layouts, side_layouts):
            times = [ideal(lay.strategy) for lay in pool]
            picked: list[int] = []
            for i in sorted(range(len(pool)), key=lambda i: (times[i], i)):
                # layouts of equal time are symmetric twins: one each
                if len(picked) < screen and all(abs(times[i] - times[k]) > 1e-9 * times[k]
                                                for k in picked):
                    picked.append(i)
            candidates += [(pool[i].name, pool[i].strategy) for i in picked]
    for name, strategy in candidates:
        if stop_requested():
            break               # Ctrl-C: no more TopologyFinder runs
        if strategy.configs in tried or not space.contains(strategy):
            continue
        tried.add(strategy.configs)
        plan_c = plan_topology(model, strategy, cluster, job, tseed, **finder_kwargs)
        t_c = IterationCost(model, cluster, job, topoopt_fabric(plan_c), plan_c.rings)(strategy)
        screened.append((name, strategy, plan_c, t_c))
    # the start (the baseline every result must beat) and the best two others get
    # the neighbouring degree splits too
    ranked = [screened[0]] + sorted(screened[1:], key=lambda c: c[3])[:2]
    best_strategy, best_plan, best_t, origin = start, start_plan, start_t, "start"
    for name, strategy, plan_c, t_c in ranked:
        if stop_requested():
            break
        plan_c, t_c = best_topology(model, strategy, cluster, job, tseed, finder_kwargs,
                                    base=(plan_c, t_c))
        if name == "start":
            start_plan, start_t = plan_c, t_c
            best_plan, best_t = plan_c, t_c
        elif t_c < best_t:
            best_strategy, best_plan, best_t, origin = strategy, plan_c, t_c, name
    screened_times = [(n, t) for n, _, _, t in screened]
    history: list[RoundRecord] = []
    searches: list[FabricSearch] = []
    moves = 0
    interrupted = stop_requested()
    # (the rounds' searches leave the side layouts out: with them as families too,
    # DLRM-128's round ends at 54.47 ms, not 54.28)
    moveset = MoveSet(space, tuple(layouts))
    for r in range(1, rounds + 1):
        if interrupted:
            break
        stage = f"topoopt round {r}/{rounds}"
        fabric = topoopt_fabric(best_plan)
        cost = IterationCost(model, cluster, job, fabric, best_plan.rings)
        found = search_space(space, cost, layouts, extra=[("current", best_strategy)],
                             chains=chains, budget=budget, seed=seed * 1000 + r,
                             tolerance=tolerance, screened_families=screened_families,
                             progress=(lambda m, t, s=stage: progress(s, m, t))
                             if progress else None)
        searches.append(found)
        moves += found.moves
        interrupted = found.stop == "interrupted" or stop_requested()
        # every chain's best on the topology it was searched on (rings and routes
        # extended to its traffic) and on TopologyFinder's topology for its traffic
        options = []
        splits_of = {}
        for res in sorted(found.chains, key=lambda c: (c.best_time, c.seed)):
            # (chains that agree on a best: its topologies once)
            if res.best.configs == best_strategy.configs or res.best.configs in splits_of:
                continue
            kept = extend_plan(best_plan, _traffic(model, res.best, cluster, job))
            kept_t = IterationCost(model, cluster, job, topoopt_fabric(kept),
                                   kept.rings)(res.best)
            splits_of[res.best.configs] = split_topologies(model, res.best, cluster, job,
                                                           tseed, finder_kwargs)
            plan_r, t_r = splits_of[res.best.configs][0]
            options += [(kept_t, 1, len(options), res.best, kept),
                        (t_r, 0, len(options), res.best, plan_r)]
        if options:
            t, _, _, strategy, plan = min(options, key=lambda o: o[:3])
            mcmc_t = min(o[0] for o in options if o[1] == 1)
            topo_t = min(o[0] for o in options if o[1] == 0)
            new_plan = next(o[4] for o in options if o[1] == 0)   # the best chain's
            splits = splits_of[strategy.configs]
        else:       # the chains found nothing better
            t, strategy, plan, mcmc_t, topo_t, new_plan = (best_t, best_strategy, best_plan,
                                                           best_t, best_t, best_plan)
            splits = split_topologies(model, best_strategy, cluster, job, tseed,
                                      finder_kwargs)
        # the round searched its topology's split: the others' topologies descend
        splits = [(p, tp) for p, tp in splits
                  if p.degree_allreduce != best_plan.degree_allreduce]
        if not interrupted:
            strategy, plan, t = _descend_splits(space, moveset, model, cluster, job, strategy,
                                                plan, t, splits, min(DESCENT, 4 * budget))
        improved = t < best_t * (1 - tolerance)
        history.append(RoundRecord(r, mcmc_t, topo_t, new_plan.degree_allreduce,
                                   new_plan.degree_mp, found.moves,
                                   sum(c.accepted for c in found.chains), improved))
        if t < best_t:
            best_strategy, best_plan, best_t = strategy, plan, t
        if not improved:
            break
    return AlternatingResult(best_strategy, best_plan, best_t, start, start_t, tuple(history),
                             interrupted, moves, origin, tuple(searches), tuple(screened_times))
