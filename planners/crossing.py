"""Cross-seeding, one strategy on one fabric at a time: every fabric's best strategy is
timed on every other fabric and kept where it is faster (:mod:`topoopt.planners.planner`,
step 3).

Each timing is a task of its own (:class:`CrossUnit`, :func:`cross_time`), so the
planner starts it as soon as the two searches it needs have ended, beside the searches
still running. A unit builds its fabric afresh: a fabric's routing tables and an
estimator's caches number routes in the order they are first asked for, and a
simulation sums in that order, so a time taken after other strategies could differ in
its last bits from one taken first -- and which units run, and when, depends on the
order in which the searches end. From scratch, a unit's result depends on its fabric
and strategy alone, and :func:`adopt` applies the timings in the fixed order of the
fabrics, so the plan does not depend on that order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence

from topoopt.cluster import Cluster, Job
from topoopt.fabrics.catalog import build_fabric
from topoopt.fabrics.cost import PriceTable, fabric_cost
from topoopt.finder.topology_finder import TopologyPlan
from topoopt.model import Model
from topoopt.planners.alternating import best_topology, start_strategy, topoopt_fabric
from topoopt.planners.cost import IterationCost
from topoopt.strategy import Strategy
from topoopt.workloads import model_of

__all__ = ["Evaluation", "CrossUnit", "cross_time", "evaluate", "cross_pairs", "adopt"]


@dataclass(frozen=True)
class Evaluation:
    """A strategy on one fabric, estimated from scratch (what the plan reports for it).

    Attributes
    ----------
    fabric : str
    strategy : Strategy
    time : float
        The time cross-seeding compares: the search's own for a fabric's searched best,
        :func:`~topoopt.planners.alternating.best_topology`'s on the TopoOpt shard,
        else ``estimate.total``.
    estimate : IterationEstimate or None
        On a fabric built afresh (on the TopoOpt shard: the strategy's own topology).
        None where a :class:`CrossUnit` only showed that the strategy is not faster
        than its ``beat`` (``time`` is then at or above it: a split's lower bound, not
        the strategy's time).
    cost : CostReport or None
        The fabric's (:func:`~topoopt.fabrics.cost.fabric_cost`); None with ``estimate``.
    topology_plan : TopologyPlan, optional
        The TopoOpt shard's topology for the strategy.
    """

    fabric: str
    strategy: Strategy
    time: float
    estimate: Any
    cost: Any
    topology_plan: TopologyPlan | None = None


def evaluate(name: str, model: Model, cluster: Cluster, job: Job, strategy: Strategy,
             prices: PriceTable, fabric_seed: int, time: float | None = None,
             topology_plan: TopologyPlan | None = None,
             start: Strategy | None = None) -> Evaluation:
    """``strategy`` estimated on fabric ``name`` built afresh (a baseline from the job's
    start strategy ``start``, as its search built it; the TopoOpt shard from
    ``topology_plan``); ``time`` defaults to the estimate's total."""
    if name == "topoopt":
        if topology_plan is None:
            raise ValueError("the TopoOpt shard is estimated on a topology_plan")
        fabric = topoopt_fabric(topology_plan)
        est = IterationCost(model, cluster, job, fabric, topology_plan.rings).estimate(strategy)
    else:
        fabric, cost = _baseline_cost(name, model, cluster, job, prices, fabric_seed, start)
        est = cost.estimate(strategy)
    return Evaluation(name, strategy, est.total if time is None else time, est,
                      fabric_cost(fabric, prices), topology_plan)


def _baseline_cost(name: str, model: Model, cluster: Cluster, job: Job, prices: PriceTable,
                   fabric_seed: int, start: Strategy | None):
    """Baseline fabric ``name`` built afresh (from the job's start strategy, as its
    search built it) and a new iteration cost on it."""
    fabric = build_fabric(name, cluster, prices, fabric_seed, job=job, model=model,
                          strategy=start or start_strategy(model, cluster, job))
    return fabric, IterationCost(model, cluster, job, fabric, seed=fabric_seed)


@dataclass(frozen=True)
class CrossUnit:
    """One strategy to time on one fabric (self-contained for a pool or Ray worker)."""

    name: str
    cluster: Cluster
    job: Job
    strategy: Strategy
    prices: PriceTable
    fabric_seed: int = 0
    #: TopologyFinder options (the TopoOpt shard)
    finder_kwargs: Mapping = field(default_factory=dict)
    #: the job's start strategy, a baseline fabric's input (found again if None)
    start: Strategy | None = None
    #: the time the strategy must beat to matter: the fabric's own best (:func:`adopt`
    #: keeps a strategy only where it is strictly faster)
    beat: float = math.inf


def cross_time(unit: CrossUnit) -> Evaluation:
    """``unit.strategy`` on ``unit.name``'s fabric from scratch; on the TopoOpt shard on
    the topology TopologyFinder builds for it (module-level so workers can import it).

    The strategy is timed against ``unit.beat`` first (on the TopoOpt shard each split,
    :func:`~topoopt.planners.alternating.best_topology`; on a baseline one simulation
    cut at it): where it is not faster, the evaluation has a lower bound at or above
    ``beat`` and no estimate (it cannot be adopted), and the shard's other splits'
    routes and the estimate a slower strategy would cost are not spent; where it is,
    it is the evaluation ``beat=inf`` gives (a baseline's estimated on a fabric and cost
    built afresh again, so its sums are the same to the bit).
    """
    model = model_of(unit.job)
    plan = None
    time = None
    if unit.name == "topoopt":
        plan, time = best_topology(model, unit.strategy, unit.cluster, unit.job,
                                   unit.fabric_seed, unit.finder_kwargs, beat=unit.beat)
    elif unit.beat < math.inf:
        _, cost = _baseline_cost(unit.name, model, unit.cluster, unit.job, unit.prices,
                                 unit.fabric_seed, unit.start)
        time = cost(unit.strategy, unit.beat)
    if time is not None and not time < unit.beat:
        return Evaluation(unit.name, unit.strategy, time, None, None)
    # a baseline's time is the estimate's total, from scratch; the shard's, its split's
    return evaluate(unit.name, model, unit.cluster, unit.job, unit.strategy, unit.prices,
                    unit.fabric_seed, time if unit.name == "topoopt" else None, plan,
                    unit.start)


def cross_pairs(names: Sequence[str], strategies: Mapping[str, Strategy]
                ) -> list[tuple[str, str]]:
    """The timings cross-seeding needs among the fabrics of ``strategies`` (those whose
    search ended), as ``(fabric, fabric whose best to time there)``, in ``names`` order:
    each other fabric's best once per distinct strategy, none equal to the fabric's own."""
    pairs = []
    for n in names:
        if n not in strategies:
            continue
        seen: set[Hashable] = {strategies[n].configs}
        for m in names:
            if m in strategies and strategies[m].configs not in seen:
                seen.add(strategies[m].configs)
                pairs.append((n, m))
    return pairs


def adopt(names: Sequence[str], own: Mapping[str, Evaluation],
          timed: Mapping[tuple[str, Hashable], Evaluation]
          ) -> dict[str, tuple[Evaluation, str]]:
    """Per fabric, the evaluation to report and the fabric it was adopted from ("" for
    its own search's best).

    ``own``: each fabric's searched best; ``timed``: ``(fabric, strategy configs)`` ->
    that strategy on it, for every pair of :func:`cross_pairs`. The other fabrics'
    bests are tried in ``names`` order and one is kept where it is strictly faster than
    the best so far, so the first of the fastest wins, whatever order the timings came
    in.
    """
    strategies = {n: e.strategy for n, e in own.items()}
    out = {n: (own[n], "") for n in names}
    for n, m in cross_pairs(names, strategies):
        e = timed[(n, strategies[m].configs)]
        if e.time < out[n][0].time:
            out[n] = (e, m)
    return out
