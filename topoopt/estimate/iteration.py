"""Iteration time of a strategy on a fabric: the task graph of one training iteration
(:mod:`topoopt.estimate.graph`) run on the flow-level simulator, and the one place
that chooses the engine.

Two engines run the same graph: the DAG engine (:func:`topoopt.netsim.dag.run_dag`,
route classes, memoized max-min rates, early stop past a bound), which the planner
uses, and the general simulator (:func:`topoopt.netsim.simulate`, ``reference=True``),
a second implementation of the same flow model that the tests compare it with (times
equal to ~1e-12 relative, same event counts). Both run the graph the one builder made,
so they check the engine, not the graph.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np

from topoopt._require import require_instance
from topoopt.cluster import Cluster, Job
from topoopt.estimate.builder import IterationGraphBuilder
from topoopt.estimate.checks import check_estimate_inputs
from topoopt.estimate.iteration_graph import FLOW_ALLREDUCE, FLOW_MP, IterationGraph
from topoopt.estimate.segments import EstimateCache
from topoopt.fabrics.fabric import Fabric
from topoopt.model import Model
from topoopt.netsim.dag import HorizonExceeded, run_dag, run_work
from topoopt.netsim.engine import simulate
from topoopt.strategy import Strategy

__all__ = ["IterationEstimate", "FastEstimator", "estimate_iteration", "summarize"]

#: The critical-path bound is tried while at least this share of its recent tries
#: (a moving average) rejected the candidate, else once every ``_PATH_PROBE``
#: candidates: it costs about a twentieth of a build and a simulation, so it pays from
#: about one rejection in twenty (measurements: docs/tuning.md, "Task-graph builder").
#: The gate changes no decision: a candidate it lets through is simulated up to the
#: bound.
_PATH_MIN_RATE = 0.05
_PATH_PROBE = 16

Rings = Mapping[tuple[int, ...], Sequence[Sequence[int]]]


@dataclass(frozen=True)
class IterationEstimate:
    """Predicted time of one training iteration and where it goes.

    Attributes
    ----------
    total : float
        Seconds from the first forward task to the last weight update.
    compute : float
        Busy time of the busiest server's GPUs (forward + backward + update).
    mp : float
        Time during which at least one MP transfer is in flight.
    allreduce : float
        Time during which at least one AllReduce ring is in flight.
    exposed_communication : float
        ``total - compute``: time the busiest server waits for the network.
    fabric : str
    flows, tasks, events : int
        Size of the simulated task graph and the simulator's event count.
    mp_bytes, allreduce_bytes : float
        Bytes of MP transfers and of ring AllReduce (all hops) in the iteration.
    """

    total: float
    compute: float
    mp: float
    allreduce: float
    exposed_communication: float
    fabric: str = ""
    flows: int = 0
    tasks: int = 0
    events: int = 0
    mp_bytes: float = 0.0
    allreduce_bytes: float = 0.0

    def to_json(self) -> dict:
        """The fields as a JSON-able dict."""
        return asdict(self)


class FastEstimator:
    """Iteration times of many strategies of one job on one fabric (the planner's cost).

    One :class:`~topoopt.estimate.graph.IterationGraphBuilder` (its caches kept across
    strategies, identical per-pair flows merged: ``merge_flows``) on the DAG engine.

    Parameters
    ----------
    model, cluster, job, fabric, rings, overlap, mp_flows, cache
        As :class:`~topoopt.estimate.graph.IterationGraphBuilder`.

    Examples
    --------
    >>> from topoopt.cluster import Cluster, Job
    >>> from topoopt.fabrics import ideal_switch
    >>> from topoopt.strategy import data_parallel
    >>> from topoopt.workloads import model_of
    >>> job = Job("ncf", batch_per_gpu=128)
    >>> model = model_of(job)
    >>> cluster = Cluster(servers=4, nics=4, link_bandwidth=100e9)
    >>> fast = FastEstimator(model, cluster, job, ideal_switch(4, 400e9))
    >>> est = fast.estimate(data_parallel(model, 4))
    >>> est.total >= est.compute > 0
    True
    """

    def __init__(self, model: Model, cluster: Cluster, job: Job, fabric: Fabric,
                 rings: Rings | None = None, overlap: bool = True, mp_flows: str = "auto",
                 cache: EstimateCache | None = None) -> None:
        for name, value, kind in (("model", model, Model), ("cluster", cluster, Cluster),
                                  ("job", job, Job), ("fabric", fabric, Fabric)):
            require_instance(name, value, kind)
        self.builder = IterationGraphBuilder(model, cluster, job, fabric, rings, overlap,
                                             mp_flows, cache, merge_flows=True)
        self.fabric = fabric
        self.rejected = 0       # candidates bounded_total rejected without a graph
        self.work = 0           # entry-events of its runs (run_work), cut ones included
        self._path_rate = 1.0   # recent share of critical-path bounds that rejected
        self._path_skipped = 0

    def graph(self, strategy: Strategy) -> IterationGraph:
        """The task graph of ``strategy``."""
        return self.builder.build(strategy)

    def estimate(self, strategy: Strategy) -> "IterationEstimate":
        """Simulated iteration of ``strategy`` (as :func:`estimate_iteration`)."""
        graph = self.graph(strategy)
        start, finish, _, events = run_dag(self.fabric.capacity, graph.dag)
        return summarize(graph, start, finish, events, self.fabric.name)

    def total(self, strategy: Strategy) -> float:
        """Simulated iteration seconds of ``strategy``."""
        return self.bounded_total(strategy)[0]

    def bounded_total(self, strategy: Strategy, bound: float = math.inf
                      ) -> tuple[float, bool]:
        """``(seconds, exact)``: the iteration time of ``strategy``, or -- when it is
        sure to exceed ``bound`` -- a lower bound above ``bound`` (``exact`` False): the
        busiest link's or the critical path's, before any graph is built (counted in
        ``rejected``), else the simulation's (:func:`~topoopt.netsim.dag.run_dag` with
        ``bound`` as its horizon: an event past it, or a link that cannot carry what is
        left of its bits by then)."""
        if math.isfinite(bound):
            # bounds that need no simulation nor even the graph: the busiest link's bits
            # (forwarded traffic piled onto a few fibres shows here first), then the
            # longest chain of tasks and transfers (a pipeline too deep for the bound)
            low = self.builder.link_bound(strategy)
            if low > bound:
                self.rejected += 1
                return low, False
            if self._path_rate >= _PATH_MIN_RATE or self._path_skipped >= _PATH_PROBE:
                self._path_skipped = 0
                low = self.builder.critical_path_bound(strategy)
                self._path_rate = 0.9 * self._path_rate + 0.1 * (low > bound)
                if low > bound:
                    self.rejected += 1
                    return low, False
            else:
                self._path_skipped += 1
        graph = self.graph(strategy)
        try:
            _, finish, _, events = run_dag(self.fabric.capacity, graph.dag, bound)
        except HorizonExceeded as past:
            self.work += run_work(graph.dag, past.events)
            return past.time, False
        self.work += run_work(graph.dag, events)
        return _makespan(finish), True


def summarize(graph: IterationGraph, start: np.ndarray, finish: np.ndarray, events: int,
              fabric_name: str = "") -> "IterationEstimate":
    """The :class:`IterationEstimate` of a simulated graph (per-node start and finish)."""
    busy = np.bincount(graph.task_server, weights=graph.task_duration)
    compute = float(busy.max()) if busy.size else 0.0
    fn = graph.flow_nodes
    mp = graph.flow_kind == FLOW_MP
    ar = graph.flow_kind == FLOW_ALLREDUCE
    count = graph.counts()
    nbytes = graph.flow_bytes * count
    total = _makespan(finish)
    return IterationEstimate(
        total=total, compute=compute,
        mp=_busy(start[fn[mp]], finish[fn[mp]]),
        allreduce=_busy(start[fn[ar]], finish[fn[ar]]),
        exposed_communication=max(total - compute, 0.0), fabric=fabric_name,
        flows=int(count.sum()), tasks=graph.tasks, events=events,
        mp_bytes=float(nbytes[mp].sum()),
        allreduce_bytes=float((nbytes[ar] * graph.hop_count[ar]).sum()))


def _makespan(finish: np.ndarray) -> float:
    done = finish[np.isfinite(finish)]
    return float(done.max()) if done.size else 0.0


def _busy(intervals_start: np.ndarray, intervals_end: np.ndarray) -> float:
    """Length of the union of intervals."""
    if intervals_start.size == 0:
        return 0.0
    order = np.argsort(intervals_start, kind="stable")
    s, e = intervals_start[order], intervals_end[order]
    reach = np.maximum.accumulate(e)
    # a new block starts where the start passes everything seen before
    new = np.concatenate([[True], s[1:] > reach[:-1]])
    block = np.cumsum(new) - 1
    starts = s[new]
    ends = np.zeros(starts.size)
    np.maximum.at(ends, block, e)
    return float((ends - starts).sum())


def estimate_iteration(model: Model, strategy: Strategy, cluster: Cluster, job: Job,
                       fabric: Fabric, rings: Rings | None = None, overlap: bool = True,
                       cache: EstimateCache | None = None, random_paths: bool = False,
                       seed: int = 0, mp_flows: str = "auto",
                       reference: bool = False) -> IterationEstimate:
    """Simulate one training iteration of ``strategy`` on ``fabric``.

    Parameters
    ----------
    model : Model
    strategy : Strategy
    cluster : Cluster
    job : Job
    fabric : Fabric
        With ``cluster.servers`` servers.
    rings : Mapping, optional
        AllReduce group members (sorted tuple) -> tuple of ring orders.
    overlap : bool
        Start each AllReduce as soon as the backward of its operators is done
        (True) or only after the whole backward pass (False).
    cache : EstimateCache, optional
        Reuse per-operator pieces across calls (MCMC).
    random_paths : bool
        One seeded random shortest path per flow instead of ECMP.
    seed : int
    mp_flows : {"auto", "pair", "coflow"}
        MP flow granularity, see :class:`~topoopt.estimate.graph.IterationGraphBuilder`.
    reference : bool
        Run the graph on the general simulator (:func:`topoopt.netsim.simulate`)
        instead of the DAG engine: a second engine on the same graph. Both give the
        same times to ~1e-12 relative and the same event count.

    Returns
    -------
    IterationEstimate

    Raises
    ------
    TypeError, ConfigError
        An argument of the wrong type, or a strategy that does not fit the model or
        the cluster (a server id past the cluster's, a config per operator missing).

    Examples
    --------
    >>> from topoopt.cluster import Cluster, Job
    >>> from topoopt.fabrics import ideal_switch
    >>> from topoopt.strategy import data_parallel
    >>> from topoopt.workloads import model_of
    >>> job = Job("ncf", batch_per_gpu=128)
    >>> model = model_of(job)
    >>> cluster = Cluster(servers=4, nics=4, link_bandwidth=100e9)
    >>> est = estimate_iteration(model, data_parallel(model, 4), cluster, job,
    ...                          ideal_switch(4, 400e9))
    >>> est.total >= est.compute > 0
    True

    References
    ----------
    .. [1] TopoOpt §5, "FlexNet simulator" (the task graph of FlexFlow's simulator,
       made network-aware).
    """
    check_estimate_inputs(model, strategy, cluster, job, fabric, seed)
    builder = IterationGraphBuilder(model, cluster, job, fabric, rings, overlap, mp_flows,
                                    cache, random_paths, seed)
    graph = builder.build(strategy)
    if reference:
        result = simulate(fabric, graph.workload, check=False)
        start, finish, events = result.start, result.finish, result.events
    else:
        start, finish, _, events = run_dag(fabric.capacity, graph.dag)
    return summarize(graph, start, finish, events, fabric.name)
