"""A leaner event loop for closed dependency graphs of flows and tasks (no background,
no capacity changes, no release times): the iteration estimator's hot path.

Same model and event grouping as :func:`topoopt.netsim.simulate` (the reference); the
differences are in how the work is done, see :func:`run_dag`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from topoopt.netsim.engine import LinkNetwork, SimResult, SimulationError, simulate
from topoopt.netsim.maxmin import gather_rows
from topoopt.netsim.workload import CompiledWorkload, FlowRoutes, Workload, check_workload

__all__ = ["DagArrays", "HorizonExceeded", "dag_arrays", "route_classes", "run_dag",
           "simulate_dag", "link_load_bound", "successor_lists", "run_work"]

#: Links whose remaining bits a run with a horizon keeps (:func:`run_dag`): a few dozen
#: cost the kernel ~nothing per rate solve, and the bottleneck that makes a run miss
#: its horizon is among the links most loaded for their capacity.
WATCHED_LINKS = 64

# The compiled kernels (:mod:`topoopt.netsim._dag_kernel`) load numba: they are imported
# where they are called, so that importing the simulators does not.


def successor_lists(before: np.ndarray, after: np.ndarray, n: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """CSR successor lists of the dependencies ``before[i] -> after[i]`` on nodes
    ``0..n-1``: ``(ptr, succ)``, node ``v``'s successors ``succ[ptr[v]:ptr[v + 1]]`` in
    the order the dependencies are listed (``after[argsort(before, stable)]``), by a
    compiled counting sort (linear).

    Examples
    --------
    >>> ptr, succ = successor_lists(np.array([2, 0, 2]), np.array([1, 2, 0]), 3)
    >>> ptr.tolist(), succ.tolist()
    ([0, 1, 1, 3], [2, 1, 0])
    """
    from topoopt.netsim._dag_kernel import successor_lists as kernel
    return kernel(before, after, n)

@dataclass(frozen=True)
class DagArrays:
    """A dependency graph ready for :func:`run_dag` (node ids shared by flows and tasks).

    Attributes
    ----------
    nodes : int
    is_flow : ndarray of bool, shape (N,)
    local : ndarray of int, shape (N,)
        Index into the flow arrays (flows) -- unused for tasks.
    flow_node : ndarray of int, shape (F,)
    flow_bits : ndarray of float, shape (F,)
        Size in bits.
    flow_latency : ndarray of float, shape (F,)
        Seconds from the last bit sent to delivery.
    flow_class : ndarray of int, shape (F,)
        Route of each flow, a row of ``class_routes``; flows of one class cross the
        same links with the same weights.
    class_routes : FlowRoutes
    node_resource : ndarray of int, shape (N,)
        Resource of a task (-1: none, and for flows).
    node_duration : ndarray of float, shape (N,)
        Task durations (0 for flows).
    succ_ptr, succ : ndarray of int
        Successors of every node (CSR).
    pending : ndarray of int, shape (N,)
        Number of predecessors.
    queue_order : ndarray of int, optional
        Tasks with a resource, in dispatch order per resource (priority, then node
        id); ``None`` = node id order.
    flow_count : ndarray of int, shape (F,), optional
        Identical flows each flow node stands for (same class, size and
        predecessors: they share every rate, so one node runs them all; each counts
        in the max-min problem and in the link loads); ``None`` = one each.
    """

    nodes: int
    is_flow: np.ndarray
    local: np.ndarray
    flow_node: np.ndarray
    flow_bits: np.ndarray
    flow_latency: np.ndarray
    flow_class: np.ndarray
    class_routes: FlowRoutes
    node_resource: np.ndarray
    node_duration: np.ndarray
    succ_ptr: np.ndarray
    succ: np.ndarray
    pending: np.ndarray
    queue_order: np.ndarray | None = None
    flow_count: np.ndarray | None = None

    def counts(self) -> np.ndarray:
        """:attr:`flow_count`, ones where it is ``None``."""
        if self.flow_count is None:
            return np.ones(self.flow_node.size, np.int64)
        return self.flow_count


def run_work(dag: DagArrays, events: int) -> int:
    """A run's work in entry-events: ``events`` (event times processed) times the route
    entries of the classes its flows use (the rows its rate solves read).

    A count, the same on every machine, that grows with a run's CPU time (each event
    re-solves rates over some of those entries): what a search can budget where the
    number of runs says little (at 1024 servers one run of a strategy may cost a
    thousand times another's).

    Examples
    --------
    >>> routes = FlowRoutes(np.array([0, 2, 3]), np.array([0, 1, 1]), np.ones(3))
    >>> two = np.zeros(2, np.int64)
    >>> dag = DagArrays(2, np.ones(2, bool), np.arange(2), np.arange(2), np.full(2, 8e6),
    ...                 np.zeros(2), two, routes, np.full(2, -1), np.zeros(2),
    ...                 np.zeros(3, np.int64), np.zeros(0, np.int64), two)
    >>> run_work(dag, 3)    # both flows in class 0, 2 entries: 3 events x 2
    6
    """
    used = np.zeros(len(dag.class_routes), bool)
    used[dag.flow_class] = True     # (a mask, not a sort: the graph's flows are many)
    return int(events) * int(np.diff(dag.class_routes.ptr)[used].sum())


class HorizonExceeded(Exception):
    """:func:`run_dag` stopped: the makespan is at least ``time``, past the horizon,
    after ``events`` event times."""

    def __init__(self, time: float, events: int = 0) -> None:
        super().__init__(f"makespan >= {time!r}")
        self.time = time
        self.events = events


def route_classes(routes: FlowRoutes) -> tuple[np.ndarray, FlowRoutes]:
    """Merge identical route rows: the class of every flow and one row per class.

    Rows are identical when they list the same links with the same weights in the
    same order (what builders produce for flows over one path or ring).
    """
    ptr, link, weight = routes.ptr, routes.link, routes.weight
    seen: dict = {}
    klass = np.empty(len(routes), np.int64)
    rows: list[int] = []
    lb, wb = link.tobytes(), weight.tobytes()
    for i, (a, b) in enumerate(zip(ptr[:-1].tolist(), ptr[1:].tolist())):
        key = (lb[8 * a:8 * b], wb[8 * a:8 * b])
        c = seen.get(key)
        if c is None:
            c = seen[key] = len(rows)
            rows.append(i)
        klass[i] = c
    idx, counts = gather_rows(ptr, np.asarray(rows, np.int64))
    return klass, FlowRoutes(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                             link[idx], weight[idx])


def dag_arrays(workload: CompiledWorkload, link_latency: np.ndarray) -> DagArrays:
    """:class:`DagArrays` of a compiled workload (route classes by identical rows)."""
    w = workload
    n, nf = w.nodes, w.flow_size.size
    routes = w.routes
    counts = np.diff(routes.ptr)
    flow_lat = w.flow_latency.copy()
    missing = np.isnan(flow_lat)
    if missing.any():
        owner = np.repeat(np.arange(nf), counts)
        sums = np.bincount(owner, weights=link_latency[routes.link] * routes.weight,
                           minlength=nf)
        flow_lat[missing] = sums[missing]
    klass, class_routes = route_classes(routes)
    node_res = np.full(n, -1, np.int64)
    node_res[w.task_node] = w.task_resource
    node_dur = np.zeros(n)
    node_dur[w.task_node] = w.task_duration
    succ_ptr, succ = successor_lists(np.asarray(w.dep_before, np.int64),
                                     np.asarray(w.dep_after, np.int64), n)
    has = w.task_resource >= 0
    q = np.lexsort((w.task_node[has], w.task_priority[has], w.task_resource[has]))
    return DagArrays(n, w.is_flow, w.local, w.flow_node, 8.0 * w.flow_size, flow_lat, klass,
                     class_routes, node_res, node_dur, succ_ptr, succ,
                     np.bincount(w.dep_after, minlength=n), w.task_node[has][q])


def simulate_dag(network: LinkNetwork, workload: Workload | CompiledWorkload, *,
                 check: bool = True) -> SimResult:
    """Run a dependency graph of flows and tasks to completion, like :func:`simulate`.

    Parameters
    ----------
    network : Network or Fabric
        ``capacity`` (bits/s) and ``latency`` (s) arrays, one per link.
    workload : Workload or CompiledWorkload
        With release times <= 0; otherwise :func:`simulate` runs it (it also
        handles background flows and capacity changes, which this path has not).
    check : bool
        Validate the workload first (:func:`check_workload`).

    Returns
    -------
    SimResult
        As :func:`simulate`, to ~1e-12 relative (see :func:`run_dag`).
        ``link_bytes`` is every flow's bytes times its route weights (what the
        reference integrates over time); ``background_bytes`` is empty.

    Examples
    --------
    >>> from topoopt.netsim import Network
    >>> net = Network(np.array([100e9]), np.array([1e-6]))
    >>> w = Workload()
    >>> t = w.add_task(1e-3, resource=0)
    >>> f = w.add_flow(12.5e6, [0], after=[t])
    >>> round(float(simulate_dag(net, w).finish[f]) * 1e6, 3)   # 1 ms + 1 ms + 1 us
    2001.0
    """
    cap = np.asarray(network.capacity, float)
    link_latency = np.broadcast_to(np.asarray(network.latency, float), cap.shape)
    w = workload.compile() if isinstance(workload, Workload) else workload
    if check:
        check_workload(w, cap.size)
    if w.release.size and float(w.release.max()) > 0.0:
        return simulate(network, w, check=False)
    dag = dag_arrays(w, link_latency)
    start, finish, tx_end, events = run_dag(cap, dag)
    done = finish[np.isfinite(finish)]
    size = np.full(w.nodes, np.nan)
    size[w.flow_node] = w.flow_size
    r = w.routes
    owner = np.repeat(np.arange(w.flow_size.size), np.diff(r.ptr))
    link_bytes = np.bincount(r.link, weights=r.weight * w.flow_size[owner], minlength=cap.size)
    return SimResult(start, finish, tx_end, w.is_flow.copy(), size, 0.0,
                     float(done.max()) if done.size else 0.0, events, link_bytes, np.zeros(0))


def link_load_bound(cap: np.ndarray, dag: DagArrays) -> float:
    """A lower bound on the makespan of ``dag`` on links of capacities ``cap``: the most
    bits any link must carry over its capacity.

    A flow of ``b`` bits whose route puts weight ``w`` on link ``l`` sends ``w x b`` bits
    over ``l``, and no link carries more than its capacity per second, so the flows of
    ``l`` cannot all be out before ``sum(w x b) / cap[l]``. Links of capacity 0 are left
    out (a flow on one is stuck, which the simulation reports). One pass over the route
    entries: far cheaper than simulating, and tight when forwarded traffic piles onto a
    few fibres.

    Examples
    --------
    >>> from topoopt.netsim import Workload
    >>> w = Workload()
    >>> _ = w.add_flow(12.5e6, [0, 1])             # 100 Mbit over two links
    >>> dag = dag_arrays(w.compile(), np.zeros(2))
    >>> link_load_bound(np.array([100e9, 50e9]), dag)   # the 50 Gbit/s link: 2 ms
    0.002
    """
    r = dag.class_routes
    if not r.link.size:
        return 0.0
    class_bits = np.bincount(dag.flow_class, weights=dag.flow_bits * dag.counts(),
                             minlength=r.ptr.size - 1)
    # only the classes this graph uses: a builder's route store keeps every class it
    # has met (half a million entries on a 128-server Expander after a search)
    used = np.flatnonzero(class_bits)
    idx, counts = gather_rows(r.ptr, used)
    load = _link_bits(class_bits[used], FlowRoutes(np.concatenate([[0], np.cumsum(counts)]),
                                                   r.link[idx], r.weight[idx]), cap.size)
    live = cap > 0
    return float((load[live] / cap[live]).max()) if live.any() else 0.0


def run_dag(cap: np.ndarray, dag: DagArrays, horizon: float = math.inf
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Event loop of :func:`simulate_dag` on :class:`DagArrays` (compiled:
    :mod:`topoopt.netsim._dag_kernel`).

    Same model as :func:`topoopt.netsim.simulate`: max-min rates re-solved whenever
    the set of transmitting flows changes; events within 1e-9 relative processed
    together (a timer fires when due by ``t + eps``); a flow's last bit is out when
    its remaining bits are within ``rate x eps + 1e-6``; ready tasks wait for their
    resource, lowest (priority, node id) first. Flows with one route (a class) are one
    row of the max-min problem with their count as weight (they freeze at the same
    level); remaining bits are brought up to date only when the rates change. Sums are
    taken in another order than the reference: times agree to ~1e-12 relative on the
    estimator's graphs (tests: ``tests/test_estimate_fast.py``), and the event count is
    the same.

    Parameters
    ----------
    cap : ndarray
        Link capacities, bits/s.
    dag : DagArrays
    horizon : float
        Stop as soon as the next event lies past it (every unfinished node then ends
        later, so the makespan does too), or a rate solve finds that one of the
        :data:`WATCHED_LINKS` links most loaded for their capacity still has more bits
        to carry than it can by then (its bits over its capacity, from now):
        :class:`HorizonExceeded` is raised with that lower bound on the makespan. A
        search that only needs to know whether a candidate beats a bound stops there.

    Returns
    -------
    start, finish, tx_end : ndarray, shape (N,)
    events : int
        Event times processed (as :attr:`SimResult.events`).
    """
    n = dag.nodes
    node_res = dag.node_resource
    # Resource queues: tasks of each resource in dispatch order, one row each.
    qnodes = dag.queue_order
    if qnodes is None:
        qnodes = np.flatnonzero(node_res >= 0)
        qnodes = qnodes[np.argsort(node_res[qnodes], kind="stable")]
    qres = node_res[qnodes]
    nres = int(qres.max()) + 1 if qres.size else 0
    per_res = np.bincount(qres, minlength=nres)
    width = max(int(per_res.max()) if per_res.size else 0, 1)
    slot = np.zeros(n, np.int64)
    slot[qnodes] = np.arange(qnodes.size) - np.repeat(np.cumsum(per_res) - per_res, per_res)
    table = np.full((max(nres, 1), width), -1, np.int64)
    table[qres, slot[qnodes]] = qnodes
    from topoopt.netsim._dag_kernel import PAST_HORIZON, STUCK, run_kernel
    # only the classes this graph uses, renumbered: a builder's route store keeps every
    # class it has met, and the filling's passes over the rows then stay in cache
    seen = np.zeros(len(dag.class_routes) + 1, np.int64)
    seen[dag.flow_class + 1] = 1
    renumber = np.cumsum(seen)
    used = np.flatnonzero(seen[1:])
    flow_class = renumber[dag.flow_class]
    idx, counts = gather_rows(dag.class_routes.ptr, used)
    r = FlowRoutes(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                   dag.class_routes.link[idx], dag.class_routes.weight[idx])
    i64 = (lambda a: np.ascontiguousarray(a, np.int64))
    f64 = (lambda a: np.ascontiguousarray(a, np.float64))
    watch, watch_bits = _watched_links(cap, dag, flow_class, r, horizon)
    start, finish, tx_end, events, status, value = run_kernel(
        n, np.ascontiguousarray(dag.is_flow, np.bool_), i64(dag.local), i64(dag.flow_node),
        f64(dag.flow_bits), f64(dag.flow_latency), i64(flow_class), i64(dag.counts()),
        i64(r.ptr), i64(r.link), f64(r.weight), i64(node_res), f64(dag.node_duration),
        i64(dag.succ_ptr), i64(dag.succ), i64(dag.pending), table, slot, f64(cap),
        float(horizon), watch, watch_bits)
    if status == PAST_HORIZON:
        raise HorizonExceeded(value, int(events))
    if status == STUCK:
        _stuck(int(value), dag, cap, finish)
    return start, finish, tx_end, events


def _watched_links(cap: np.ndarray, dag: DagArrays, flow_class: np.ndarray, r: FlowRoutes,
                   horizon: float) -> tuple[np.ndarray, np.ndarray]:
    """The links whose remaining bits the kernel keeps to stop a run that cannot end by
    ``horizon`` (none without one), with the bits each carries in all: the
    :data:`WATCHED_LINKS` most loaded for their capacity, the links that bound the
    makespan (:func:`link_load_bound`) and, as a run falls behind, the first to show
    it cannot catch up."""
    none = (np.zeros(0, np.int64), np.zeros(0))
    if not math.isfinite(horizon) or not r.link.size:
        return none
    class_bits = np.bincount(flow_class, weights=dag.flow_bits * dag.counts(),
                             minlength=r.ptr.size - 1)
    load = _link_bits(class_bits, r, cap.size)
    live = np.flatnonzero((cap > 0) & (load > 0))
    if not live.size:
        return none
    if live.size > WATCHED_LINKS:
        live = live[np.argpartition(-(load[live] / cap[live]), WATCHED_LINKS - 1)
                    [:WATCHED_LINKS]]
    return np.ascontiguousarray(live, np.int64), np.ascontiguousarray(load[live], np.float64)


def _link_bits(class_bits: np.ndarray, routes: FlowRoutes, links: int) -> np.ndarray:
    """Bits each link carries: every class's bits spread over its route row's weights."""
    return np.bincount(routes.link, weights=np.repeat(class_bits, np.diff(routes.ptr))
                       * routes.weight, minlength=links)


def _stuck(flow: int, dag: DagArrays, cap: np.ndarray, finish: np.ndarray) -> None:
    if flow >= 0:
        ls, _ = dag.class_routes.row(int(dag.flow_class[flow]))
        dead = ls[cap[ls] <= 0]
        where = f" (link {int(dead[0])} has capacity 0)" if dead.size else ""
        raise SimulationError(f"flow node {int(dag.flow_node[flow])} cannot progress{where}; "
                              "restore the link with a CapacityChange or reroute it")
    blocked = np.flatnonzero(np.isnan(finish))
    raise SimulationError(f"{blocked.size} node(s) never become ready, e.g. node "
                          f"{int(blocked[0]) if blocked.size else -1}: the dependencies "
                          "contain a cycle")
