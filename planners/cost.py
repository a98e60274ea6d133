"""The MCMC's cost: simulated iteration seconds of a strategy on one fabric, memoized."""

from __future__ import annotations

import math

from topoopt.cluster import Cluster, Job
from topoopt.estimate import EstimateCache, FastEstimator, estimate_iteration
from topoopt.fabrics.fabric import Fabric
from topoopt.fabrics.reconfigurable import reconfiguration_of
from topoopt.model import Model
from topoopt.reconfig import iteration_estimator
from topoopt.strategy import Strategy

__all__ = ["IterationCost"]


class IterationCost:
    """The MCMC's cost: simulated iteration seconds of a strategy on one fabric.

    Wraps the fast estimator (:class:`topoopt.estimate.FastEstimator`: the task
    graph from pieces cached across strategies, max-min rates memoized across
    simulations) and a memo of strategies already evaluated (restarts revisit them).
    ``reference=True`` runs :func:`topoopt.estimate.estimate_iteration`'s reference
    path instead (same times to ~1e-12, several times slower).

    Parameters
    ----------
    model, cluster, job :
        The job.
    fabric : topoopt.fabrics.Fabric
    rings : Mapping, optional
        AllReduce group -> ring orders (a TopoOpt plan's rings).
    overlap : bool
        Overlap AllReduce with the backward pass.
    seed : int
    reference : bool
        Use the reference estimator (for checks and benchmarks).
    cache : topoopt.estimate.EstimateCache, optional
        Per-operator pieces (compute times, fused segments, MP transfer patterns) to
        share with other costs of the same (model, cluster, job) on other fabrics:
        they do not depend on the fabric (default a cache of its own).
    """

    def __init__(self, model: Model, cluster: Cluster, job: Job, fabric: Fabric, rings=None,
                 overlap: bool = True, seed: int = 0, reference: bool = False,
                 cache: EstimateCache | None = None) -> None:
        self.model, self.cluster, self.job, self.fabric = model, cluster, job, fabric
        self.rings, self.overlap, self.seed = rings, overlap, seed
        # the reference path simulates a static network: on a reconfigurable fabric it
        # would freeze the initial circuits, so such a fabric keeps its own simulation
        self.reference = reference and reconfiguration_of(fabric) is None
        self.cache = cache if cache is not None else EstimateCache(model, cluster, job)
        # a reconfigurable fabric (OCS-reconfig, SiP-ML) gets its time-varying simulation
        self.fast = iteration_estimator(model, cluster, job, fabric, rings, overlap,
                                        cache=self.cache)
        self.memo: dict[tuple, float] = {}
        self.lower: dict[tuple, float] = {}   # lower bounds of candidates cut short
        self.evaluations = 0   # strategies simulated
        self.bounded = 0       # candidates rejected by an analytical bound alone

    def release(self) -> None:
        """Drop the fabric's routing tables (:meth:`~topoopt.fabrics.Fabric.
        release_routes`): the memory of a cost not in use, rebuilt when it is called
        again, the same routes and times. The estimator's own caches stay: its route
        classes are numbered in the order they were first asked for, and a simulation
        sums its flows' shares in that order, so numbered afresh the times could
        change in their last bits. Its per-config templates go (rebuilt when asked:
        they hold no route classes). (The bounds keep no routes of their own: they read
        the fabric's.)
        """
        self.fabric.release_routes()
        builder = getattr(self.fast, "builder", None)
        if builder is not None:
            builder.reset_configs()

    @property
    def work(self) -> int:
        """Entry-events of every simulation it has run (:func:`~topoopt.netsim.dag.
        run_work`; 0 on the reference path and for an estimator that keeps no count):
        what a descent's work limit counts (:func:`~topoopt.planners.mcmc.descend`)."""
        return 0 if self.reference else int(getattr(self.fast, "work", 0))

    @property
    def supports_bound(self) -> bool:
        """Whether ``cost(strategy, bound)`` may stop early (the fast path does)."""
        return not self.reference

    def lower_bound(self, strategy: Strategy, links: bool = False) -> float:
        """A lower bound of ``strategy``'s time, without building or simulating its graph.

        The largest of the analytical bounds the fast path checks before a simulation
        (:mod:`topoopt.estimate.bounds`): the busiest server's and, on a static fabric,
        the critical path's; with ``links`` also the busiest link's (whose first call
        per transfer pattern costs more). The time itself where it is already known;
        0.0 on the reference path.
        """
        key = strategy.configs
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        if self.reference:
            return 0.0
        builder = self.fast.builder
        low = builder.lower_bound(strategy)
        if isinstance(self.fast, FastEstimator):
            low = max(low, builder.critical_path_bound(strategy))
            if links:
                low = max(low, builder.link_bound(strategy))
        low = max(low, self.lower.get(key, 0.0))
        if len(self.memo) + len(self.lower) <= 20_000:
            self.lower[key] = low       # a later cost(strategy, bound) may stop here
        return low

    def estimate(self, strategy: Strategy):
        """The full :class:`~topoopt.estimate.IterationEstimate` of ``strategy``."""
        if not self.reference:
            return self.fast.estimate(strategy)
        return estimate_iteration(self.model, strategy, self.cluster, self.job, self.fabric,
                                  rings=self.rings, overlap=self.overlap, cache=self.cache,
                                  seed=self.seed, reference=True)

    def __call__(self, strategy: Strategy, bound: float = math.inf) -> float:
        """Iteration seconds of ``strategy``.

        A :class:`~topoopt.netsim.SimulationError` propagates: every strategy of the
        space has an acyclic task graph, so an error here is a bug to see, not a cost.
        With a finite ``bound`` the fast path may return a lower bound above ``bound``
        instead of the time: an analytical bound, no graph built, when it already
        exceeds ``bound`` (the busiest server's,
        :meth:`~topoopt.estimate.graph.IterationGraphBuilder.lower_bound`, then the
        busiest link's and the critical path's in
        :meth:`~topoopt.estimate.FastEstimator.bounded_total`; counted in ``bounded``),
        else the simulation's as it stopped past it (counted in ``evaluations``;
        the MCMC asks for the acceptance threshold of its next draw, see
        :class:`~topoopt.planners.mcmc.Chain`).
        """
        key = strategy.configs
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        low = self.lower.get(key)
        if low is not None and low > bound:
            return low
        # a kept lower bound is at least the busiest server's (every path that keeps one
        # computed that first): at or below ``bound``, so is that
        if low is None and math.isfinite(bound) and not self.reference:
            low = self.fast.builder.lower_bound(strategy)
            if low > bound:
                self.bounded += 1
                self.lower[key] = low
                return low
        if self.reference:
            hit, exact = self.estimate(strategy).total, True
        else:
            rejected = self.fast.rejected
            hit, exact = self.fast.bounded_total(strategy, bound)
            if self.fast.rejected > rejected:   # by a bound, before any graph was built
                self.bounded += 1
                self.lower[key] = hit
                return hit
        self.evaluations += 1
        if len(self.memo) + len(self.lower) > 20_000:  # bound memory on long searches
            self.memo.clear()
            self.lower.clear()
        if exact:
            self.memo[key] = hit
        else:
            self.lower[key] = hit
        return hit
