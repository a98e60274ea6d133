"""Iteration time on a fabric that re-plans its circuits during the iteration (TopoOpt §5.1).

The task graph of the iteration is built once on the *logical* network, a full mesh with
one link per ordered server pair (:func:`full_mesh`): each flow's route there is its
demand, bytes per pair. The fabric's circuits live on the same pair links (capacity =
circuits x B, 0 without a circuit). The flow simulator then runs in epochs
(a :class:`topoopt.netsim.Simulation` paused at every measurement, stopped when the
circuits change, :func:`topoopt.netsim.epochs.rest_of` to go on):

- every ``interval`` the demand is measured -- the bytes the flows in transmission still
  have to send, per pair -- and the scheme re-plans the circuits for it
  (:func:`topoopt.topology.circuits.ocs_circuits` or ``sip_ring_circuits``);
- when the plan differs, the circuits that change are down for ``latency`` (their pair
  keeps only the circuits it has in both plans; flows keep their routes, so those that
  cross a changing circuit wait), then the new circuits carry traffic;
- without forwarding a flow uses the circuits of its own pairs only (none: it waits);
  with forwarding it follows ECMP over the shortest paths of the circuits up at the
  time (:meth:`topoopt.fabrics.Fabric.coupled_route`, as on a static TopoOpt shard), and
  is rerouted at every change.

Iterations run back to back (the circuits carry over); the first ``warmup`` start from
the fabric's initial circuits and are not measured. With ``latency = 0`` and a demand
that does not change, the fabric settles on one set of circuits and an iteration takes
exactly what a static shard of those circuits takes (tested).

:class:`ReconfigEstimator` has the interface of :class:`topoopt.estimate.FastEstimator`
(``estimate``, ``total``, ``bounded_total``), and :func:`iteration_estimator` picks the
right one for a fabric: that is the one call a planner's cost needs.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count
from typing import Callable, Iterator

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError, TopoOptError
from topoopt.estimate import (
    FLOW_ALLREDUCE,
    EstimateCache,
    FastEstimator,
    IterationEstimate,
    IterationGraph,
    IterationGraphBuilder,
    summarize,
)
from topoopt.fabrics.direct import direct_connect
from topoopt.fabrics.fabric import Fabric
from topoopt.fabrics.reconfigurable import Reconfiguration, reconfiguration_of
from topoopt.model import Model
from topoopt.netsim.engine import Network, Simulation, SimulationError
from topoopt.netsim.epochs import merge_times, rest_of
from topoopt.netsim.maxmin import sum_by_key
from topoopt.netsim.workload import CompiledWorkload, FlowRoutes
from topoopt.strategy import Strategy
from topoopt.topology.circuits import circuit_topology, ocs_circuits, sip_ring_circuits
from topoopt.topology.topology import Routes

__all__ = ["Epoch", "ReconfigResult", "ReconfigEstimator", "Interrupted", "reconfig_iteration",
           "iteration_estimator", "full_mesh", "MAX_SIMULATED_TIME"]

#: An iteration that has not finished after this much simulated time is reported stuck.
MAX_SIMULATED_TIME = 3600.0


def full_mesh(servers: int, link_bandwidth: float, link_latency: float = 1e-6) -> Fabric:
    """The logical network: one link per ordered server pair (link ids in pair order:
    ``(0, 1), (0, 2), ..., (1, 0), (1, 2), ...``).

    Examples
    --------
    >>> m = full_mesh(3, 100e9)
    >>> list(zip(m.src.tolist(), m.dst.tolist()))
    [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    """
    counts = 1 - np.eye(servers, dtype=np.int64)
    topo = circuit_topology(counts, max(servers - 1, 1), link_bandwidth, link_latency, "mesh")
    # every pair's route is its own link: given, so the router need not search for it
    direct = Routes({(i, j): (((i, j), 1.0),) for i in range(servers)
                     for j in range(servers) if i != j})
    return direct_connect(topo, direct, optics="none", name="mesh")


@dataclass(frozen=True)
class Epoch:
    """A stretch of time with one set of circuits up (recorded with ``trace=True``).

    Attributes
    ----------
    start, end : float
        Seconds (absolute, across iterations).
    circuits : ndarray of int, shape (n, n)
        Circuits up during the epoch (a reconfiguration window: those kept by both plans).
    link_bytes : ndarray, shape (n, n)
        Bytes each pair's circuits carried during the epoch.
    window : bool
        Whether changed circuits were down (a reconfiguration in progress).
    """

    start: float
    end: float
    circuits: np.ndarray = field(repr=False)
    link_bytes: np.ndarray = field(repr=False)
    window: bool


@dataclass(frozen=True)
class ReconfigResult:
    """Iterations simulated on a reconfigurable fabric.

    Attributes
    ----------
    estimate : IterationEstimate
        The measured iterations (after the warm-up), field by field their mean.
    iteration_times : tuple of float
        Seconds of every simulated iteration, warm-up included.
    reconfigurations : tuple of int
        Changes of circuits during each iteration.
    bandwidth_tax : float
        Bytes the circuits carried / bytes of logical demand, over the measured
        iterations (1 without forwarding).
    final_circuits : ndarray of int, shape (n, n)
        The circuits at the end.
    epochs : tuple of Epoch
        With ``trace=True``, every epoch; else empty.
    """

    estimate: IterationEstimate
    iteration_times: tuple[float, ...]
    reconfigurations: tuple[int, ...]
    bandwidth_tax: float
    final_circuits: np.ndarray = field(repr=False)
    epochs: tuple[Epoch, ...] = field(default=(), repr=False)


class Interrupted(TopoOptError):
    """A run stopped because its ``stop()`` callback asked (Ctrl-C in a command)."""


@dataclass(frozen=True)
class _Exceeded:
    """The measured iterations are sure to exceed the caller's bound: on average they
    take at least ``lower`` seconds."""

    lower: float


@dataclass(frozen=True)
class _Iteration:
    """One simulated iteration: per-node start and finish (absolute seconds), events,
    changes of circuits, bytes the circuits carried."""

    start: np.ndarray
    finish: np.ndarray
    events: int
    changes: int
    carried: float


class ReconfigEstimator:
    """Iteration times of strategies of one job on one reconfigurable fabric.

    The interface of :class:`topoopt.estimate.FastEstimator`, so a planner's cost can use
    either (:func:`iteration_estimator`). The logical task graph comes from one
    :class:`~topoopt.estimate.IterationGraphBuilder` on :func:`full_mesh` (caches kept
    across strategies); every estimate simulates ``spec.iterations`` iterations.

    Parameters
    ----------
    model, cluster, job :
        The job.
    fabric : Fabric
        A reconfigurable fabric (:func:`topoopt.fabrics.reconfigurable.ocs_reconfig`,
        :func:`~topoopt.fabrics.reconfigurable.sip_ml`).
    rings : Mapping, optional
        AllReduce ring orders (default one ring per group in member order: the
        circuits follow whatever ring the job uses).
    overlap : bool
    mp_flows : {"auto", "pair", "coflow"}
        MP flow granularity (:class:`~topoopt.estimate.IterationGraphBuilder`); ``"auto"``:
        coflows with forwarding (as on a static direct fabric), pairs without (a coflow
        would wait for a circuit to its every destination at once).
    cache : EstimateCache, optional
    spec : Reconfiguration, optional
        Overrides the fabric's (e.g. another latency, for a sweep).
    """

    def __init__(self, model: Model, cluster: Cluster, job: Job, fabric: Fabric, rings=None,
                 overlap: bool = True, mp_flows: str = "auto",
                 cache: EstimateCache | None = None,
                 spec: Reconfiguration | None = None) -> None:
        spec = spec or reconfiguration_of(fabric)
        if spec is None:
            raise ConfigError("fabric", fabric.name, "is not reconfigurable (it has no "
                              "info['reconfig']); estimate it with FastEstimator")
        self.spec: Reconfiguration = spec
        if fabric.servers != cluster.servers:
            raise ConfigError("fabric", fabric.servers, f"has {fabric.servers} servers but the "
                              f"cluster has {cluster.servers}")
        self.fabric = fabric
        self.rejected = 0   # (FastEstimator's count of candidates rejected unbuilt: none here)
        # The logical links share a server's d x B: the builder's analytical lower bound
        # (a server's bytes over its link capacity) then holds for any set of circuits.
        n = cluster.servers
        self.mesh = full_mesh(n, self.spec.ports * self.spec.port_bandwidth / max(n - 1, 1),
                              cluster.link_latency)
        if mp_flows == "auto":
            # Without forwarding a coflow would wait for the circuit of its last member
            # (it may never come: d ports, many destinations): MP transfers go per pair.
            mp_flows = "coflow" if self.spec.forwarding else "pair"
        self.mp_flows = mp_flows
        self.builder = IterationGraphBuilder(model, cluster, job, self.mesh, rings, overlap,
                                             mp_flows, cache)
        self.initial = _counts_of(fabric)

    def graph(self, strategy: Strategy) -> IterationGraph:
        """The logical task graph of ``strategy`` (routes = per-pair demand)."""
        return self.builder.build(strategy)

    def run(self, strategy: Strategy, trace: bool = False,
            spec: Reconfiguration | None = None,
            stop: Callable[[], bool] | None = None) -> ReconfigResult:
        """Simulate ``spec.iterations`` iterations of ``strategy`` (see the module doc);
        ``spec`` overrides the estimator's for this run (same forwarding: the graph's MP
        flows were chosen for it). ``stop()`` is polled at every measurement; when it
        says so the run ends with :class:`Interrupted`."""
        out = self._run(strategy, trace, math.inf, spec, stop)
        if isinstance(out, _Exceeded):   # pragma: no cover - no bound, nothing exceeds it
            raise AssertionError("an unbounded run stopped at a bound")
        return out

    def _run(self, strategy: Strategy, trace: bool, bound: float,
             spec: Reconfiguration | None, stop: Callable[[], bool] | None
             ) -> ReconfigResult | _Exceeded:
        spec = spec or self.spec
        if spec.forwarding != self.spec.forwarding:
            raise ConfigError("reconfig.forwarding", spec.forwarding,
                              "use an estimator built with that forwarding")
        return _Run(self, spec, self.graph(strategy), trace, bound, stop).outcome()

    def estimate(self, strategy: Strategy) -> IterationEstimate:
        """The measured iterations' :class:`IterationEstimate` (as FastEstimator's)."""
        return self.run(strategy).estimate

    def total(self, strategy: Strategy) -> float:
        """Seconds of a measured iteration (their mean)."""
        return self.run(strategy).estimate.total

    def bounded_total(self, strategy: Strategy, bound: float = math.inf
                      ) -> tuple[float, bool]:
        """``(seconds, exact)``; stops early, with a lower bound above ``bound``, once the
        measured iterations are sure to take longer on average (as FastEstimator's)."""
        out = self._run(strategy, False, bound, None, None)
        if isinstance(out, _Exceeded):
            return out.lower, False
        return out.estimate.total, True


def reconfig_iteration(model: Model, strategy: Strategy, cluster: Cluster, job: Job,
                       fabric: Fabric, rings=None, overlap: bool = True,
                       cache: EstimateCache | None = None,
                       spec: Reconfiguration | None = None, mp_flows: str = "auto",
                       trace: bool = False) -> ReconfigResult:
    """Simulate iterations of ``strategy`` on the reconfigurable ``fabric``.

    The reconfigurable counterpart of :func:`topoopt.estimate.estimate_iteration`; see
    the module docstring for the model and :class:`ReconfigEstimator` for the
    parameters. ``trace=True`` records every epoch (:class:`Epoch`).

    Returns
    -------
    ReconfigResult

    Examples
    --------
    >>> from topoopt.cluster import Cluster, Job
    >>> from topoopt.fabrics.reconfigurable import ocs_reconfig
    >>> from topoopt.strategy import data_parallel
    >>> from topoopt.workloads import model_of
    >>> cluster = Cluster(servers=8, nics=2, link_bandwidth=100e9)
    >>> job = Job("resnet50", 32)
    >>> model = model_of(job)
    >>> r = reconfig_iteration(model, data_parallel(model, 8), cluster, job,
    ...                        ocs_reconfig(8, 2, 100e9, latency=1e-3))
    >>> r.reconfigurations, round(r.bandwidth_tax, 6)    # settles on the ring at once
    ((1, 0), 1.0)

    References
    ----------
    .. [1] TopoOpt §5.1 (OCS-reconfig, SiP-ML), §5.3 (Figure 11), §5.7 (Figure 17).
    """
    est = ReconfigEstimator(model, cluster, job, fabric, rings, overlap, mp_flows, cache, spec)
    return est.run(strategy, trace=trace)


def iteration_estimator(model: Model, cluster: Cluster, job: Job, fabric: Fabric, rings=None,
                        overlap: bool = True, cache: EstimateCache | None = None):
    """The estimator a planner's cost should use for ``fabric``: a
    :class:`ReconfigEstimator` for a reconfigurable fabric, else the static
    :class:`topoopt.estimate.FastEstimator` (same methods: ``estimate``, ``total``,
    ``bounded_total``)."""
    if reconfiguration_of(fabric) is not None:
        return ReconfigEstimator(model, cluster, job, fabric, rings, overlap, cache=cache)
    return FastEstimator(model, cluster, job, fabric, rings, overlap, cache=cache)


def _counts_of(fabric: Fabric) -> np.ndarray:
    """Circuit counts of a direct fabric's bundled links."""
    n = fabric.servers
    counts = np.zeros((n, n), np.int64)
    per = fabric.capacity / float(fabric.info["port_bandwidth"])
    counts[fabric.src, fabric.dst] = np.rint(per).astype(np.int64)
    return counts


class _Routing:
    """Routes and latencies of every flow over a set of circuits (cached per set)."""

    def __init__(self, est: ReconfigEstimator, spec: Reconfiguration,
                 graph: IterationGraph) -> None:
        mesh = est.mesh
        n = mesh.servers
        self.n, self.spec = n, spec
        self.pair_link = np.full((n, n), -1, np.int64)
        self.pair_link[mesh.src, mesh.dst] = np.arange(mesh.links)
        self.mesh_src, self.mesh_dst = mesh.src, mesh.dst
        self.link_latency = float(mesh.latency[0]) if mesh.links else 0.0
        self.logical = graph.flow_routes()
        flows = len(self.logical)
        self.member_flow = np.repeat(np.arange(flows), np.diff(self.logical.ptr))
        self.member_src = mesh.src[self.logical.link]
        self.member_dst = mesh.dst[self.logical.link]
        self.member_weight = self.logical.weight
        self.flow_latency = graph.flow_latency
        ring = graph.flow_kind == FLOW_ALLREDUCE
        # a ring's delivery waits 2(k-1) of its slowest hop (estimate.graph)
        self.latency_factor = np.where(ring, 2.0 * (graph.hop_count - 1), 1.0)
        # demand per pair: (pairs x flows) @ bytes left per flow
        self.demand_matrix = csr_matrix(
            (self.member_weight, (self.logical.link, self.member_flow)),
            shape=(mesh.links, flows))
        self.logical_bytes = float((graph.flow_bytes * np.bincount(
            self.member_flow, weights=self.member_weight, minlength=flows)).sum())
        self._cache: OrderedDict = OrderedDict()

    def demand(self, left: np.ndarray) -> np.ndarray:
        """Bytes left per server pair (n x n) from the bytes left per flow."""
        d = np.zeros(self.n * self.n)
        d[self.mesh_src * self.n + self.mesh_dst] = self.demand_matrix @ left
        return d.reshape(self.n, self.n)

    def capacity(self, counts: np.ndarray) -> np.ndarray:
        return counts[self.mesh_src, self.mesh_dst] * self.spec.port_bandwidth

    def routes(self, counts: np.ndarray) -> tuple[FlowRoutes, np.ndarray]:
        """(routes, latency) of every flow over ``counts`` circuits."""
        if not self.spec.forwarding:
            return self.logical, self.flow_latency
        key = counts.tobytes()
        hit = self._cache.get(key)
        if hit is None:
            hit = self._forwarded(counts)
            self._cache[key] = hit
            if len(self._cache) > 64:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return hit

    def _forwarded(self, counts: np.ndarray) -> tuple[FlowRoutes, np.ndarray]:
        """ECMP over the shortest paths of the circuits; pairs they do not join keep their
        (dead) pair link and wait."""
        flows = len(self.logical)
        reach = np.isfinite(shortest_path(csr_matrix(counts > 0), unweighted=True))
        ok = reach[self.member_src, self.member_dst]
        keys, vals = [], []
        lat = np.zeros(flows)
        L = self.pair_link.size
        if ok.any() and counts.any():
            topo = circuit_topology(counts, int(max(counts.sum(0).max(), counts.sum(1).max())),
                                    self.spec.port_bandwidth, self.link_latency)
            circuits = direct_connect(topo, None, optics="ocs", name="circuits")
            r, lat = circuits.coupled_route(self.member_src[ok], self.member_dst[ok],
                                            self.member_flow[ok], self.member_weight[ok], flows)
            mesh_link = self.pair_link[circuits.src, circuits.dst]
            owner = np.repeat(np.arange(flows), np.diff(r.ptr))
            keys.append(owner * L + mesh_link[r.link])
            vals.append(r.weight)
        if (~ok).any():
            keys.append(self.member_flow[~ok] * L
                        + self.pair_link[self.member_src[~ok], self.member_dst[~ok]])
            vals.append(self.member_weight[~ok])
        if keys:
            ukey, weight = sum_by_key(np.concatenate(keys), np.concatenate(vals), flows * L)
        else:
            ukey, weight = np.empty(0, np.int64), np.empty(0)
        ptr = np.zeros(flows + 1, np.int64)
        np.cumsum(np.bincount(ukey // L, minlength=flows), out=ptr[1:])
        one_hop = self.flow_latency / self.latency_factor
        hop = np.where(lat > 0, lat, one_hop)
        return FlowRoutes(ptr, ukey % L, weight), hop * self.latency_factor


class _Run:
    """One simulation of ``spec.iterations`` iterations of a graph (the epoch loop)."""

    def __init__(self, est: ReconfigEstimator, spec: Reconfiguration, graph: IterationGraph,
                 trace: bool, bound: float, stop: Callable[[], bool] | None = None) -> None:
        self.est, self.graph, self.spec, self.stop = est, graph, spec, stop
        self.routing = _Routing(est, spec, graph)
        self.trace, self.bound = trace, bound
        self.target = est.initial.copy()      # circuits once any change is done
        # a change in progress: (end, circuits up until then, circuits the routes follow)
        self.window: tuple[float, np.ndarray, np.ndarray] | None = None
        self.epochs: list[Epoch] = []
        self.plans = 0                        # re-plans so far (seeds the random wiring)
        self._last_plan: tuple | None = None  # (circuits in place, demand / max, plan)
        self.mesh_net_latency = np.zeros(est.mesh.links)

    # -- the circuits --------------------------------------------------------------
    def _up(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """(circuits carrying traffic, circuits the routes were computed for) at ``t``."""
        if self.window is not None and t < self.window[0]:
            return self.window[1], self.window[2]
        return self.target, self.target

    def _plan(self, demand: np.ndarray) -> np.ndarray:
        """The scheme's circuits for the measured demand (``spec.idle`` decides whether the
        circuits in place fill what the demand leaves free, or random ones do)."""
        spec = self.spec
        keep = spec.idle == "keep"
        if keep and not demand.any():
            return self.target               # nothing measured: nothing to change
        if keep:
            # Both schemes are scale-free (only ratios of demands matter) and the plan
            # depends on the circuits in place: a demand proportional to the last one,
            # with the same circuits in place, gets the same plan (rings draining evenly).
            shape = demand / demand.max()
            last = self._last_plan
            if last is not None and last[0] is self.target and np.array_equal(last[1], shape):
                return last[2]
        self.plans += 1
        if spec.scheme == "ocs":
            plan = ocs_circuits(demand, spec.ports, previous=self.target if keep else None,
                                seed=spec.seed if keep else spec.seed * 1_000_003 + self.plans)
        else:
            plan = sip_ring_circuits(demand, spec.ports, previous=self.target if keep else None)
        if keep:
            self._last_plan = (self.target, shape, plan)
        return plan

    # -- the loop ------------------------------------------------------------------
    def outcome(self) -> ReconfigResult | _Exceeded:
        """Run the iterations; :class:`_Exceeded` as soon as the measured ones are sure
        to exceed the bound on average."""
        spec, graph = self.spec, self.graph
        work0 = graph.workload.compile()
        t = 0.0
        times, changes, ests = [], [], []
        carried = logical = 0.0
        measured = spec.iterations - spec.warmup
        done_time = 0.0
        for it in range(spec.iterations):
            t_start = t
            counted = it >= spec.warmup
            limit = (self.bound * measured - done_time) if counted else math.inf
            run = self._iteration(work0, t_start, limit, done_time)
            if isinstance(run, _Exceeded):
                return run
            finish = run.finish
            t = float(np.nanmax(finish)) if np.isfinite(finish).any() else t_start
            times.append(t - t_start)
            changes.append(run.changes)
            if counted:
                done_time += t - t_start
                ests.append(summarize(graph, run.start - t_start, finish - t_start, run.events,
                                      self.est.fabric.name))
                carried += run.carried
                logical += self.routing.logical_bytes
        return ReconfigResult(_mean(ests), tuple(times), tuple(changes),
                              carried / logical if logical > 0 else 1.0,
                              self.target.copy(), tuple(self.epochs))

    def _iteration(self, work0: CompiledWorkload, t0: float, limit: float,
                   done_before: float) -> _Iteration | _Exceeded:
        """One iteration from ``t0``, epoch after epoch (the circuits change between
        them). :class:`_Exceeded` once it runs past ``limit`` (the measured iterations
        before it took ``done_before``)."""
        spec, routing = self.spec, self.routing
        start = np.full(work0.nodes, np.nan)
        finish = np.full(work0.nodes, np.nan)
        events = nchange = 0
        carried = 0.0
        t, res, work = t0, None, work0
        while True:
            if self.window is not None and t >= self.window[0] * (1 - 1e-12):
                self.window = None
            up, routed = self._up(t)
            routes, lat = routing.routes(routed)
            work = (_with_routes(work0, routes, lat) if res is None
                    else rest_of(work, res, routes, lat))
            sim = Simulation(Network(routing.capacity(up), self.mesh_net_latency), work,
                             t0=t, check=False)
            window_end = self.window[0] if self.window is not None else None
            new: np.ndarray | None = None
            for tc in sim.stops(self._checkpoints(t, window_end)):
                if window_end is not None and tc >= window_end * (1 - 1e-12):
                    break                                # the change in progress is done
                if tc - t0 > limit:
                    measured = spec.iterations - spec.warmup
                    return _Exceeded((done_before + (tc - t0)) / measured)
                self._check_progress(tc - t0)
                plan = self._plan(routing.demand(sim.flow_bytes_left()))
                if not np.array_equal(plan, self.target):
                    new = plan                           # re-plan: the epoch ends here
                    break
            res = sim.result()
            merge_times(start, res.start)
            merge_times(finish, res.finish)
            events += res.events
            carried += float(res.link_bytes.sum())
            end = res.stopped_at if math.isfinite(res.stopped_at) else float(np.nanmax(res.finish))
            if self.trace:
                lb = np.zeros((routing.n, routing.n))
                lb[routing.mesh_src, routing.mesh_dst] = res.link_bytes
                self.epochs.append(Epoch(t, end, up.copy(), lb, self.window is not None))
            if not math.isfinite(res.stopped_at):
                return _Iteration(start, finish, events, nchange, carried)
            t = res.stopped_at
            if new is not None:
                nchange += 1
                if spec.latency > 0:
                    self.window = (t + spec.latency, np.minimum(self.target, new), self.target)
                self.target = new

    def _check_progress(self, elapsed: float) -> None:
        """Raise when the caller asked to stop, or the iteration is stuck."""
        if self.stop is not None and self.stop():
            raise Interrupted("the simulation was asked to stop")
        if elapsed > MAX_SIMULATED_TIME:
            raise SimulationError(
                f"fabric {self.est.fabric.name!r}: the iteration has not finished "
                f"after {MAX_SIMULATED_TIME:g} s of simulated time (flows wait for "
                "circuits that never come)")

    def _checkpoints(self, t: float, window_end: float | None) -> Iterator[float]:
        """The window's end (when a change is in progress), then every measurement."""
        if window_end is not None:
            yield window_end
        every = self.spec.every
        for k in count(int(math.floor(t / every)) + 1):
            yield k * every


def _with_routes(work: CompiledWorkload, routes: FlowRoutes, latency: np.ndarray
                 ) -> CompiledWorkload:
    return CompiledWorkload(work.nodes, work.is_flow, work.local, work.release, work.flow_node,
                            work.flow_size, np.asarray(latency, float), routes, work.task_node,
                            work.task_duration, work.task_resource, work.task_priority,
                            work.dep_before, work.dep_after)


def _mean(estimates: list[IterationEstimate]) -> IterationEstimate:
    """Field-by-field mean of iteration estimates (counts rounded)."""
    first = estimates[0]
    if len(estimates) == 1:
        return first
    k = len(estimates)
    mean = {f: sum(getattr(e, f) for e in estimates) / k
            for f in ("total", "compute", "mp", "allreduce", "exposed_communication",
                      "mp_bytes", "allreduce_bytes")}
    return IterationEstimate(**mean, fabric=first.fabric, flows=first.flows, tasks=first.tasks,
                             events=round(sum(e.events for e in estimates) / k))
