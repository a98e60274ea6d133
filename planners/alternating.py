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

import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from topoopt._require import (
    require_callable,
    require_instance,
    require_int,
    require_seed,
    require_table,
)
from topoopt.cluster import Cluster, Job
from topoopt.config import PLAN_DEFAULTS, PlanSettings
from topoopt.errors import TopoOptError
from topoopt.estimate import EstimateCache
from topoopt.fabrics import direct_connect, ideal_switch
from topoopt.finder.topology_finder import (
    TopologyDraft,
    TopologyPlan,
    draft_topology,
    extend_plan,
    topology_finder,
)
from topoopt.interrupt import stop_requested
from topoopt.model import Model
from topoopt.planners.cost import IterationCost
from topoopt.planners.mcmc import descend
from topoopt.planners.moves import MoveSet
from topoopt.planners.search import SCREENED_FAMILIES, FabricSearch, descent_limits, search_space
from topoopt.planners.space import StrategySpace
from topoopt.planners.structure import Layout
from topoopt.strategy import Strategy, data_parallel, hybrid
from topoopt.traffic import Traffic, derive_traffic

__all__ = ["RoundRecord", "AlternatingResult", "alternating_optimization", "start_strategy",
           "plan_topology", "topoopt_fabric", "best_topology", "split_topologies", "SCREEN",
           "SPLIT_RATIO", "MAX_SEARCH_SERVERS", "WARM_COSTS", "WARM_BYTES"]

#: Largest shard the strategy search plans (docs/limits.md: LLM jobs, planned without
#: it, go to cluster.servers' bound)
MAX_SEARCH_SERVERS = 1024

#: Structured strategies (fastest on the Ideal Switch first) given their own topology
#: before the first round.
SCREEN = 4
#: After a round, its best descends on each other degree split's topology on which it
#: is at most this factor slower than its time on the round's choice: a strategy slower
#: on another split may still descend further there (docs/tuning.md, "Planner").
SPLIT_RATIO = 1.3
#: Topologies whose costs keep their fabric's routing tables (the most recently used):
#: the alternation keeps a cost per live topology, for its memo, and those tables grow
#: as n^2 (docs/limits.md, "Memory of a DLRM plan"; docs/tuning.md, "Warm topologies").
WARM_COSTS = 4
#: Bytes of routing tables the warm costs may hold together (the most recent one kept
#: whatever its size): at 1024 servers one ring-like TopoOpt topology's are ~0.6 GB, so
#: there only the most recent stays warm (docs/tuning.md, "Warm topologies").
WARM_BYTES = 1 << 29


def start_strategy(model: Model, cluster: Cluster, job: Job,
                   space: StrategySpace | None = None) -> Strategy:
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


def _draft(traffic: Traffic, cluster: Cluster, seed: int, allreduce_degree: int | None = None,
           **finder_kwargs) -> TopologyDraft:
    """:func:`plan_topology` before its routes, on a traffic already derived (Steps
    1-3, :func:`~topoopt.finder.topology_finder.draft_topology`)."""
    return draft_topology(traffic, cluster.servers, cluster.nics, cluster.link_bandwidth,
                          cluster.link_latency, seed=seed, allreduce_degree=allreduce_degree,
                          **finder_kwargs)


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
    strategy given its own topology before the first round, with its time there (a
    lower bound of it for one whose topology's bound already put it behind two faster
    ones, :func:`_screen`: ``screened_bounds`` names those).
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
    screened_bounds: frozenset[str] = frozenset()


def best_topology(model: Model, strategy: Strategy, cluster: Cluster, job: Job, seed: int = 0,
                  finder_kwargs: Mapping | None = None, neighbours: bool = True,
                  base: tuple[TopologyPlan, float] | None = None,
                  cost_of: Callable[[TopologyPlan], IterationCost] | None = None,
                  beat: float = math.inf) -> tuple[TopologyPlan, float]:
    """TopologyFinder for ``strategy``, trying Step 1's split and, with ``neighbours``,
    one AllReduce port more and one less.

    Algorithm 1 splits d in proportion to traffic; when MP traffic is a sliver, the
    one port it gets may cost AllReduce more than it saves MP. We let the simulator
    judge between the proportional split and its neighbours. ``base``: Step 1's
    topology and time, when already known; ``cost_of``: the iteration cost on a plan
    (default a new :class:`~topoopt.planners.cost.IterationCost` per plan); ``beat``:
    as :func:`split_topologies` (a time at or above it may be a lower bound).
    """
    return split_topologies(model, strategy, cluster, job, seed, finder_kwargs, neighbours,
                            base, cost_of, beat=beat)[0]


def split_topologies(model: Model, strategy: Strategy, cluster: Cluster, job: Job,
                     seed: int = 0, finder_kwargs: Mapping | None = None,
                     neighbours: bool = True,
                     base: tuple[TopologyPlan, float] | None = None,
                     cost_of: Callable[[TopologyPlan], IterationCost] | None = None,
                     reference_time: float = 0.0, beat: float = math.inf
                     ) -> list[tuple[TopologyPlan, float]]:
    """:func:`best_topology`'s candidates, fastest first: ``(plan, strategy's time on
    it)`` for Step 1's split and, with ``neighbours``, those of its neighbours whose
    time may be within :data:`SPLIT_RATIO` of the fastest.

    Each neighbour's topology is drafted first (TopologyFinder's Steps 1-3,
    :func:`~topoopt.finder.topology_finder.draft_topology`); then, in the order of
    their lower bounds (:meth:`~topoopt.finder.topology_finder.TopologyDraft.lower_bound`:
    the MP bytes over the links on shortest paths, below any simulated time), a
    neighbour is routed and timed unless its bound exceeds :data:`SPLIT_RATIO` x the
    larger of ``reference_time`` and the fastest time found so far; Step 1's split is
    always kept. Routing a split whose matchings leave MP pairs far apart is most of
    the cost and memory of a large shard's topology search (docs/limits.md, "Where
    the 256- and 512-server plans stand").

    Every plan stays the one it was with all splits timed: a split left out is slower
    than SPLIT_RATIO x the fastest split, so it is neither :func:`best_topology`'s
    pick nor a split :func:`_descend_splits` descends on, which skips ``t_d >
    SPLIT_RATIO x time``, where ``time`` is at most the fastest split's (the round's
    pick, :func:`_round_pick`, is the fastest option of all, and the chosen strategy's
    fastest split is one of them) or is passed as ``reference_time`` (a round whose
    chains found nothing new descends from the best so far). ``reference_time=inf``
    times every split.

    ``beat``: only a time below it matters (cross-seeding: the shard's own best, which
    a strategy must beat to be adopted). A split is timed against it as a bound, so
    a time at or above it may be a lower bound, and a neighbour whose bound reaches it
    is not routed. Every split faster than ``beat`` is still timed exactly, so the
    first of the list is the same as with ``beat=inf`` whenever its time is below
    ``beat``.
    """
    finder_kwargs = dict(finder_kwargs or {})

    def timed(plan: TopologyPlan) -> float:
        if cost_of is not None:
            return cost_of(plan)(strategy, beat)
        return IterationCost(model, cluster, job, topoopt_fabric(plan), plan.rings)(strategy,
                                                                                    beat)

    if base is None:
        plan = plan_topology(model, strategy, cluster, job, seed, **finder_kwargs)
        base = (plan, timed(plan))
    scored = [(base[1], 0, base[0].degree_allreduce, base[0])]
    drafts = []
    if neighbours:
        traffic = _traffic(model, strategy, cluster, job)
        for d_ar in (base[0].degree_allreduce - 1, base[0].degree_allreduce + 1):
            if 1 <= d_ar <= cluster.nics:
                draft = _draft(traffic, cluster, seed, d_ar, **finder_kwargs)
                drafts.append((draft.lower_bound(), d_ar, draft))
    drafts.sort(key=lambda b: b[:2])
    fastest = base[1]
    while drafts:
        bound, d_ar, draft = drafts.pop(0)
        if bound > SPLIT_RATIO * max(reference_time, fastest) or bound >= beat:
            continue
        plan = draft.plan()
        del draft               # (its hop distances)
        t = timed(plan)
        fastest = min(fastest, t)
        scored.append((t, 1, d_ar, plan))
    return [(plan, t) for t, _, _, plan in sorted(scored, key=lambda s: s[:3])]


def _descend_splits(p: _Shard, moveset: MoveSet, strategy: Strategy, plan: TopologyPlan,
                    time: float, splits: Sequence[tuple[TopologyPlan, float]], limit: int
                    ) -> tuple[Strategy, TopologyPlan, float]:
    """The round's best (``strategy`` on ``plan``, ``time``) descended
    (:func:`~topoopt.planners.mcmc.descend`) on each of the ``splits`` (the topologies
    of the degree splits TopologyFinder offers for it, with its time on each) within
    :data:`SPLIT_RATIO` of ``time``; the fastest (strategy, topology) pair of all, the
    topology fitted to the strategy (:meth:`_Shard.fit`) and timed as fitted.

    The MCMC judges candidates on one topology, and a round's best may descend further
    on another split's (docs/tuning.md, "Planner"): a finer grain of TopoOpt §4's
    alternation."""
    best = (time, strategy, plan)
    for plan_d, t_d in splits:
        if t_d > SPLIT_RATIO * time or stop_requested():
            continue
        s_d, t_new, _ = descend(p.space, p.cost(plan_d), strategy, t_d, moveset, limit)
        if s_d.configs != strategy.configs:
            # the descent moved off the traffic plan_d was built for: new MP pairs and
            # groups get their routes and rings, and the pair is timed as it will be kept
            plan_d = p.fit(s_d, plan_d)
            t_new = p.cost(plan_d)(s_d)
        if t_new < best[0]:
            best = (t_new, s_d, plan_d)
    return best[1], best[2], best[0]


def alternating_optimization(model: Model, cluster: Cluster, job: Job, start: Strategy, *,
                             rounds: int = PLAN_DEFAULTS.rounds,
                             budget: int = PLAN_DEFAULTS.budget,
                             chains: int = PLAN_DEFAULTS.chains, seed: int = PLAN_DEFAULTS.seed,
                             tolerance: float = PLAN_DEFAULTS.tolerance,
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

    The defaults and bounds of ``rounds`` .. ``tolerance`` are those of
    :class:`topoopt.config.PlanSettings`.

    Returns
    -------
    AlternatingResult

    Raises
    ------
    ConfigError
        A setting out of its bounds (named as in a config: ``plan.rounds``).
    TypeError
        An argument of the wrong type.

    Notes
    -----
    Each round runs MCMC on the current topology (Comp x Comm), then TopologyFinder on
    the traffic of each chain's best (Comm x Topo); a pair is kept only if the
    iteration time improved. The result is never worse than the start on its own
    topology, the baseline every candidate must beat.
    """
    _require_arguments(model, cluster, job, start, rounds=rounds, budget=budget,
                       chains=chains, seed=seed, tolerance=tolerance,
                       finder_kwargs=finder_kwargs, seeds=seeds, screen=screen,
                       screened_families=screened_families, topology_seed=topology_seed,
                       progress=progress)
    p = _Shard(model, cluster, job, StrategySpace.build(model, cluster, job),
               seed if topology_seed is None else topology_seed, dict(finder_kwargs or {}),
               EstimateCache(model, cluster, job))
    screened, refused = _screen(p, start, seeds, layouts, side_layouts, screen)
    (best_strategy, best_plan, best_t), origin, (start_plan, start_t) = _first_start(p,
                                                                                    screened)
    # the screened topologies but the first round's go, and their costs with them
    screened_times = tuple((n, t) for n, _, _, t in screened)
    del screened, start_plan
    rounds_run = _alternate(p, (best_strategy, best_plan, best_t), layouts, rounds=rounds,
                            budget=budget, chains=chains, seed=seed, tolerance=tolerance,
                            screened_families=screened_families, progress=progress)
    (best_strategy, best_plan, best_t), history, searches, interrupted = rounds_run
    return AlternatingResult(best_strategy, best_plan, best_t, start, start_t, history,
                             interrupted, sum(f.moves for f in searches), origin, searches,
                             screened_times, refused)


def _alternate(p: _Shard, best: tuple[Strategy, TopologyPlan, float],
               layouts: Sequence[Layout], *, rounds: int, budget: int, chains: int, seed: int,
               tolerance: float, screened_families: int,
               progress: Callable[[str, int, float], None] | None
               ) -> tuple[tuple[Strategy, TopologyPlan, float], tuple[RoundRecord, ...],
                          tuple[FabricSearch, ...], bool]:
    """The rounds from ``best`` (strategy, topology, time): each an MCMC search on the
    current topology, then TopologyFinder for its chains' bests and descents on the
    other degree splits; until a round improves by less than ``tolerance``. Returns
    the best (strategy, topology, time), the rounds' records and searches, and
    whether Ctrl-C stopped them."""
    best_strategy, best_plan, best_t = best
    history: list[RoundRecord] = []
    searches: list[FabricSearch] = []
    interrupted = stop_requested()
    # (the rounds' searches leave the side layouts out: docs/tuning.md, "Planner")
    moveset = MoveSet(p.space, tuple(layouts))
    for r in range(1, rounds + 1):
        if interrupted:
            break
        found = search_space(p.space, p.cost(best_plan), layouts,
                             extra=[("current", best_strategy)], chains=chains, budget=budget,
                             seed=seed * 1000 + r, tolerance=tolerance,
                             screened_families=screened_families,
                             progress=_stage_progress(progress, f"topoopt round {r}/{rounds}"))
        searches.append(found)
        interrupted = found.stop == "interrupted" or stop_requested()
        pick = _round_pick(p, found, best_strategy, best_plan, best_t)
        strategy, plan, t = pick.strategy, pick.plan, pick.time
        if not interrupted:
            # the round searched its topology's split: the others' topologies descend
            splits = [(sp, tp) for sp, tp in pick.splits
                      if sp.degree_allreduce != best_plan.degree_allreduce]
            strategy, plan, t = _descend_splits(p, moveset, strategy, plan, t, splits,
                                                descent_limits(p.space.servers, budget).final)
        improved = t < best_t * (1 - tolerance)
        history.append(RoundRecord(r, pick.mcmc_time, pick.topology_time,
                                   pick.new_plan.degree_allreduce, pick.new_plan.degree_mp,
                                   found.moves, sum(c.accepted for c in found.chains),
                                   improved))
        if t < best_t:
            best_strategy, best_plan, best_t = strategy, plan, t
        if not improved:
            break
    return (best_strategy, best_plan, best_t), tuple(history), tuple(searches), interrupted


def _require_arguments(model: object, cluster: object, job: object, start: object, *,
                       rounds: int, budget: int, chains: int, seed: int, tolerance: float,
                       finder_kwargs: Mapping | None, seeds: Mapping[str, Strategy] | None,
                       screen: int, screened_families: int, topology_seed: int | None,
                       progress: object) -> None:
    """:func:`alternating_optimization`'s arguments, checked before any work."""
    require_instance("model", model, Model, "topoopt.model_of(job)")
    require_instance("cluster", cluster, Cluster)
    require_instance("job", job, Job)
    require_instance("start", start, Strategy, "start_strategy(model, cluster, job)")
    PlanSettings(budget=budget, rounds=rounds, chains=chains, seed=seed,  # (it checks them)
                 tolerance=tolerance, finder_kwargs=finder_kwargs or {})
    if seeds is not None:
        require_table("seeds", seeds, "{\"hybrid\": strategy}")
        for name, strategy in seeds.items():
            require_instance(f"seeds[{name!r}]", strategy, Strategy)
    require_int("screen", screen, minimum=0)
    require_int("screened_families", screened_families, minimum=0)
    if topology_seed is not None:
        require_seed("topology_seed", topology_seed)
    require_callable("progress", progress)


@dataclass(frozen=True)
class _Shard:
    """What every step of the alternation works on: the job, its shard's strategy
    space, and TopologyFinder's seed and options."""

    model: Model
    cluster: Cluster
    job: Job
    space: StrategySpace
    tseed: int
    finder_kwargs: dict
    #: the per-operator pieces every topology's estimator shares (they do not depend
    #: on the fabric), and each plan's cost, kept while the plan lives: the
    #: alternation times a plan again (a round's splits, its descents, the pick), and
    #: a kept cost keeps its memo (plan id -> (weak reference to the plan, cost))
    cache: EstimateCache | None = field(default=None, compare=False)
    costs: dict = field(default_factory=dict, compare=False, repr=False)
    #: the plans whose costs keep their fabric's routing tables, least recently used
    #: first: a cost pushed out drops them (:meth:`IterationCost.release`)
    warm: OrderedDict = field(default_factory=OrderedDict, compare=False, repr=False)

    def topology(self, strategy: Strategy) -> TopologyPlan:
        """TopologyFinder's topology for ``strategy``'s traffic (Step 1's split)."""
        return plan_topology(self.model, strategy, self.cluster, self.job, self.tseed,
                             **self.finder_kwargs)

    def draft(self, strategy: Strategy) -> TopologyDraft:
        """:meth:`topology` before its routes (Steps 1-3; ``.plan()`` routes it)."""
        return _draft(_traffic(self.model, strategy, self.cluster, self.job), self.cluster,
                      self.tseed, **self.finder_kwargs)

    def fit(self, strategy: Strategy, plan: TopologyPlan) -> TopologyPlan:
        """``plan``'s topology with rings, groups and routes for ``strategy``'s traffic
        (:func:`~topoopt.finder.topology_finder.extend_plan`): every (strategy,
        topology) pair the alternation keeps is made by TopologyFinder for the strategy
        or by this."""
        return extend_plan(plan, _traffic(self.model, strategy, self.cluster, self.job))

    def cost(self, plan: TopologyPlan) -> IterationCost:
        """Iteration time of a strategy on ``plan``'s shard (one cost per plan, kept)."""
        key = id(plan)
        hit = self.costs.get(key)
        if hit is not None and hit[0]() is plan:
            cost = hit[1]
        else:
            cost = IterationCost(self.model, self.cluster, self.job, topoopt_fabric(plan),
                                 plan.rings, cache=self.cache)
            self.costs[key] = (weakref.ref(plan, self._forget(key)), cost)
        self.warm[key] = cost
        self.warm.move_to_end(key)
        # the least recently used go first, past WARM_COSTS or WARM_BYTES of routes
        while len(self.warm) > WARM_COSTS or (
                len(self.warm) > 1 and sum(c.fabric.routes_nbytes for c in self.warm.values())
                > WARM_BYTES):
            self.warm.popitem(last=False)[1].release()
        return cost

    def _forget(self, key: int) -> Callable[[weakref.ref], None]:
        """What drops the cost of the plan ``key`` once nothing else holds the plan
        (it cannot be timed again, and its id may be reused)."""
        # the shard weakly: it holds this callback (through the plan's weak reference in
        # its costs), and a cycle would keep every cost of a finished alternation, with
        # their fabrics' routes, until Python's cyclic collector ran
        shard = weakref.ref(self)

        def forget(ref: weakref.ref) -> None:
            me = shard()
            if me is None:
                return
            hit = me.costs.get(key)
            if hit is not None and hit[0] is ref:
                del me.costs[key]
                me.warm.pop(key, None)
        return forget


def _stage_progress(progress: Callable[[str, int, float], None] | None, stage: str
                    ) -> Callable[[int, float], None] | None:
    """A search's ``progress(moves, best)`` reported as ``stage``'s."""
    if progress is None:
        return None
    return lambda m, t: progress(stage, m, t)


#: A screened strategy: its name, the strategy, its topology (None once it cannot start
#: the first round) and its time there.
Screened = tuple[str, Strategy, TopologyPlan | None, float]
#: Screened strategies besides the start that :func:`_first_start` tries.
_RANKED = 2


def _screen(p: _Shard, start: Strategy, seeds: Mapping[str, Strategy] | None,
            layouts: Sequence[Layout], side_layouts: Sequence[Layout], screen: int
            ) -> tuple[list[Screened], frozenset[str]]:
    """The start, the ``seeds`` and the ``screen`` structured strategies fastest on the
    Ideal Switch (of ``layouts`` and of ``side_layouts`` apart), each on Step 1's
    topology for its traffic with its time there, the start first; and the names of
    those whose time is a lower bound.

    A strategy whose topology's route-free bound (:meth:`~topoopt.finder.
    topology_finder.TopologyDraft.lower_bound`) is above the :data:`_RANKED` fastest
    other times so far cannot be one :func:`_first_start` tries: its topology is not
    routed and the bound stands for its time (the plan is the same)."""
    start_plan = p.topology(start)
    screened: list[Screened] = [("start", start, start_plan, p.cost(start_plan)(start))]
    tried = {start.configs}
    timed: list[float] = []     # the others' times on their topologies
    refused: set[str] = set()   # the others given their bound for a time
    candidates = list((seeds or {}).items())
    if screen > 0 and (layouts or side_layouts):
        cluster = p.cluster
        ideal = IterationCost(p.model, cluster, p.job,
                              ideal_switch(cluster.servers, cluster.server_bandwidth,
                                           cluster.link_latency / 2))
        # the side layouts screened apart: fast on the Ideal Switch, they would take
        # the others' places (docs/tuning.md, "Planner")
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
        if strategy.configs in tried or not p.space.contains(strategy):
            continue
        tried.add(strategy.configs)
        draft = p.draft(strategy)
        bound = draft.lower_bound()
        if len(timed) >= _RANKED and bound > sorted(timed)[_RANKED - 1]:
            # slower than the fastest others whatever Step 4 routes: not routed (a
            # ring-like topology's routes are gigabytes at 1024 servers), its bound kept
            screened.append((name, strategy, None, bound))
            refused.add(name)
            continue
        plan_c = draft.plan()
        del draft               # (its hop distances)
        screened.append((name, strategy, plan_c, p.cost(plan_c)(strategy)))
        timed.append(screened[-1][3])
        del plan_c              # (the list decides whether it is kept)
        _keep_ranked_plans(screened)
    return screened, frozenset(refused)


def _keep_ranked_plans(screened: list[Screened]) -> None:
    """Drop the topology (and with it its cost) of every screened strategy but the
    start and the :data:`_RANKED` fastest others (the first of equal times): the only
    ones :func:`_first_start` reads. A large shard's topologies and their routing
    tables are gigabytes each, and the screen makes up to ``2 x screen + 1``."""
    held = [i for i in range(1, len(screened)) if screened[i][2] is not None]
    for i in sorted(held, key=lambda i: (screened[i][3], i))[_RANKED:]:
        name, strategy, _, t = screened[i]
        screened[i] = (name, strategy, None, t)


def _first_start(p: _Shard, screened: list[Screened]
                 ) -> tuple[tuple[Strategy, TopologyPlan, float], str,
                            tuple[TopologyPlan, float]]:
    """Where the first round starts: the fastest of the start (the baseline every
    result must beat) and the best two other screened strategies, each on the best of
    its neighbouring degree splits too. Returns (strategy, topology, time), its name
    and the start's own (topology, time)."""
    _, start, start_plan, start_t = screened[0]
    assert start_plan is not None
    ranked = [screened[0]] + sorted(screened[1:], key=lambda c: c[3])[:_RANKED]
    best_strategy, best_plan, best_t, origin = start, start_plan, start_t, "start"
    for name, strategy, plan_c, t_c in ranked:
        assert plan_c is not None        # (kept by _keep_ranked_plans)
        if not stop_requested():  # Ctrl-C: no more descents, but the timed ones compete
            plan_c, t_c = best_topology(p.model, strategy, p.cluster, p.job, p.tseed,
                                        p.finder_kwargs, base=(plan_c, t_c), cost_of=p.cost)
        if name == "start":
            start_plan, start_t = plan_c, t_c
            best_plan, best_t = plan_c, t_c
        elif t_c < best_t:
            best_strategy, best_plan, best_t, origin = strategy, plan_c, t_c, name
    return (best_strategy, best_plan, best_t), origin, (start_plan, start_t)


@dataclass(frozen=True)
class _RoundPick:
    """A round's best (strategy, topology, time) before the descents on other splits,
    the times its record keeps, and the degree splits of the chosen strategy."""

    strategy: Strategy
    plan: TopologyPlan
    time: float
    mcmc_time: float
    topology_time: float
    new_plan: TopologyPlan
    splits: list[tuple[TopologyPlan, float]]


def _round_pick(p: _Shard, found: FabricSearch, best_strategy: Strategy,
                best_plan: TopologyPlan, best_t: float) -> _RoundPick:
    """Every chain's best on the topology it was searched on (rings and routes extended
    to its traffic) and on TopologyFinder's topology for its traffic: the fastest."""
    options: list[tuple[float, int, int, Strategy, TopologyPlan]] = []
    splits_of: dict[tuple, list[tuple[TopologyPlan, float]]] = {}
    for res in sorted(found.chains, key=lambda c: (c.best_time, c.seed)):
        # (chains that agree on a best: its topologies once)
        if res.best.configs == best_strategy.configs or res.best.configs in splits_of:
            continue
        kept = p.fit(res.best, best_plan)
        kept_t = p.cost(kept)(res.best)
        splits_of[res.best.configs] = split_topologies(p.model, res.best, p.cluster, p.job,
                                                       p.tseed, p.finder_kwargs,
                                                       cost_of=p.cost)
        plan_r, t_r = splits_of[res.best.configs][0]
        options += [(kept_t, 1, len(options), res.best, kept),
                    (t_r, 0, len(options), res.best, plan_r)]
    if not options:       # the chains found nothing better
        return _RoundPick(best_strategy, best_plan, best_t, best_t, best_t, best_plan,
                          split_topologies(p.model, best_strategy, p.cluster, p.job, p.tseed,
                                           p.finder_kwargs, cost_of=p.cost,
                                           reference_time=best_t))
    t, _, _, strategy, plan = min(options, key=lambda o: o[:3])
    return _RoundPick(strategy, plan, t,
                      mcmc_time=min(o[0] for o in options if o[1] == 1),
                      topology_time=min(o[0] for o in options if o[1] == 0),
                      new_plan=next(o[4] for o in options if o[1] == 0),  # the best chain's
                      splits=splits_of[strategy.configs])
