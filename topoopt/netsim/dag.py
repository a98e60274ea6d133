"""A leaner event loop for closed dependency graphs of flows and tasks (no background,
no capacity changes, no release times): the iteration estimator's hot path.

Same model and event grouping as :func:`topoopt.netsim.simulate` (the reference); the
differences are in how the work is done, see :func:`run_dag`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

import numpy as np

from topoopt.netsim.engine import LinkNetwork, SimResult, SimulationError, simulate
from topoopt.netsim.maxmin import gather_rows, max_min_rates
from topoopt.netsim.workload import CompiledWorkload, FlowRoutes, Workload, check_workload

__all__ = ["DagArrays", "RateMemo", "HorizonExceeded", "class_rates", "refill_after_removal",
           "dag_arrays", "route_classes", "run_dag", "simulate_dag"]

#: Batches with at most this much work (nodes plus successors) are handled one node at
#: a time in plain Python; larger ones with whole-array numpy operations (a numpy call
#: costs microseconds whatever its size, a Python step on one node a fraction of one).
SMALL_BATCH = 48


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


class HorizonExceeded(Exception):
    """:func:`run_dag` stopped: the makespan is at least ``time``, past the horizon."""

    def __init__(self, time: float) -> None:
        super().__init__(f"makespan >= {time!r}")
        self.time = time


class RateMemo:
    """Max-min rates by active route-class multiset, reused across simulations.

    Valid for one network (capacities) and one append-only numbering of route
    classes (a class id, once seen, always names the same route): the caller keys
    it (the estimator keeps one per fabric and route store, and drops both
    together). ``limit`` bounds the entries (cleared when full).

    A miss whose active flows are the previous call's minus some (flows end far
    more often than they start one by one) is warm-started from the previous
    solution (:func:`refill_after_removal`).
    """

    def __init__(self, limit: int = 50_000) -> None:
        self.table: dict = {}
        self.limit = limit
        self.hits = 0
        self.misses = 0
        self.warm = 0
        self._last: tuple | None = None

    def rates(self, cap: np.ndarray, routes: FlowRoutes, classes: np.ndarray,
              mult: np.ndarray) -> np.ndarray:
        """Rate of one flow of each of ``classes`` (sorted, distinct) when ``mult`` flows
        of each are active."""
        key = (classes.tobytes(), mult.tobytes())
        r = self.table.get(key)
        if r is not None:
            self.hits += 1
        else:
            self.misses += 1
            if len(self.table) >= self.limit:
                self.table.clear()
            r = None
            last = self._last
            if last is not None and classes.size <= last[0].size:
                r = refill_after_removal(cap, routes, classes, mult, *last)
                self.warm += r is not None
            if r is None:
                r = class_rates(cap, routes, classes, mult)
            self.table[key] = r
        self._last = (classes, mult, r)
        return r


def refill_after_removal(cap: np.ndarray, routes: FlowRoutes, classes: np.ndarray,
                         mult: np.ndarray, old_classes: np.ndarray, old_mult: np.ndarray,
                         old_rates: np.ndarray) -> np.ndarray | None:
    """Max-min rates after some flows of a solved problem are removed, or ``None`` when
    ``(classes, mult)`` is not a part of ``(old_classes, old_mult)``.

    Progressive filling froze every flow at its rate, lowest first. Let ``lam`` be
    the lowest old rate of a class that lost flows. No link that saturated below
    ``lam`` carries such a class (it would have frozen there), and removing load
    only raises the other links' shares, so every level below ``lam`` -- which
    flows froze and at what rate -- is unchanged. The filling resumes from the last
    of those levels on what the frozen flows leave of each link
    (:func:`class_rates` on the residual capacities). Sums are taken in another
    order than a fresh filling (~1e-16 relative).
    """
    pos = np.searchsorted(old_classes, classes)
    if pos.size and (pos[-1] >= old_classes.size or (old_classes[pos] != classes).any()
                     or (mult > old_mult[pos]).any()):
        return None
    kept = np.zeros(old_classes.size, np.int64)
    kept[pos] = mult
    lost = kept < old_mult
    if not lost.any():
        return None
    lam = float(old_rates[lost].min())
    prev = old_rates[pos]
    fixed = prev < lam
    if fixed.all():
        return prev.copy()
    if not fixed.any():
        return None            # nothing to reuse
    level0 = float(prev[fixed].max())
    fx, rest = np.flatnonzero(fixed), np.flatnonzero(~fixed)
    idx, counts = gather_rows(routes.ptr, classes[fx])
    frozen_load = np.bincount(routes.link[idx], minlength=cap.size, weights=routes.weight[idx]
                              * np.repeat(prev[fx] * mult[fx], counts))
    idx, counts = gather_rows(routes.ptr, classes[rest])
    ef = np.repeat(np.arange(rest.size), counts)
    link, weight = routes.link[idx], routes.weight[idx] * np.repeat(mult[rest], counts)
    residual = cap - frozen_load - level0 * np.bincount(link, weights=weight, minlength=cap.size)
    out = prev.copy()
    out[rest] = level0 + max_min_rates(np.maximum(residual, 0.0), ef, link, weight, rest.size)
    return out


def class_rates(cap: np.ndarray, routes: FlowRoutes, classes: np.ndarray,
                mult: np.ndarray) -> np.ndarray:
    """Max-min rate per flow when ``mult[i]`` flows follow route ``classes[i]``.

    Flows with the same links and weights freeze at the same level of progressive
    filling, so one row per class with its weights times the count gives every
    flow's rate (:func:`max_min_rates`).
    """
    idx, counts = gather_rows(routes.ptr, classes)
    ef = np.repeat(np.arange(classes.size), counts)
    return max_min_rates(cap, ef, routes.link[idx], routes.weight[idx] * mult[ef], classes.size)


def route_classes(routes: FlowRoutes) -> tuple[np.ndarray, FlowRoutes]:
    """Merge identical route rows: the class of every flow and one row per class.

    Rows are identical when they list the same links with the same weights in the
    same order (what builders produce for flows over one path or ring).
    """
    ptr, link, weight = routes.ptr, routes.link, routes.weight
    seen: dict = {}
    klass = np.empty(len(routes), np.int64)
    rows = []
    lb, wb = link.tobytes(), weight.tobytes()
    for i, (a, b) in enumerate(zip(ptr[:-1].tolist(), ptr[1:].tolist())):
        key = (lb[8 * a:8 * b], wb[8 * a:8 * b])
        c = seen.get(key)
        if c is None:
            c = seen[key] = len(rows)
            rows.append(i)
        klass[i] = c
    rows = np.asarray(rows, np.int64)
    idx, counts = gather_rows(ptr, rows)
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
    order = np.argsort(w.dep_before, kind="stable")
    succ_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(w.dep_before, minlength=n), out=succ_ptr[1:])
    has = w.task_resource >= 0
    q = np.lexsort((w.task_node[has], w.task_priority[has], w.task_resource[has]))
    return DagArrays(n, w.is_flow, w.local, w.flow_node, 8.0 * w.flow_size, flow_lat, klass,
                     class_routes, node_res, node_dur, succ_ptr, w.dep_after[order],
                     np.bincount(w.dep_after, minlength=n), w.task_node[has][q])


def simulate_dag(network: LinkNetwork, workload: Workload | CompiledWorkload, *, check: bool = True,
                 memo: RateMemo | None = None) -> SimResult:
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
    memo : RateMemo, optional
        Max-min rates by active route multiset (only valid for this network and
        this workload's routes; a fresh one per call by default).

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
    start, finish, tx_end, events = run_dag(cap, dag, memo)
    done = finish[np.isfinite(finish)]
    size = np.full(w.nodes, np.nan)
    size[w.flow_node] = w.flow_size
    r = w.routes
    owner = np.repeat(np.arange(w.flow_size.size), np.diff(r.ptr))
    link_bytes = np.bincount(r.link, weights=r.weight * w.flow_size[owner], minlength=cap.size)
    return SimResult(start, finish, tx_end, w.is_flow.copy(), size, 0.0,
                     float(done.max()) if done.size else 0.0, events, link_bytes, np.zeros(0))


def run_dag(cap: np.ndarray, dag: DagArrays, memo: RateMemo | None = None,
            horizon: float = math.inf) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Event loop of :func:`simulate_dag` on :class:`DagArrays`.

    Same model as :func:`topoopt.netsim.simulate`: max-min rates re-solved whenever
    the set of transmitting flows changes; events within 1e-9 relative processed
    together (a timer fires when due by ``t + eps``); a flow's last bit is out when
    its remaining bits are within ``rate x eps + 1e-6``; ready tasks wait for their
    resource, lowest (priority, node id) first. How the work is done differs:

    - flows are tracked lazily: remaining bits are brought up to date only when the
      rates change, with the next completion time and the first time any flow could
      pass the "sent" test kept as two numbers, so events that only touch tasks cost
      no array work for the flows. (Sums are taken once per rate change instead of
      once per event: differences ~1e-16 relative per step.)
    - flows with one route (a class) are one row of the max-min problem with their
      count as weight -- they freeze at the same level -- and the rates are memoized
      by the multiset of active classes (``memo``), which recurs within and across
      iterations; when flows only left since the last solve, the solve resumes from
      the last level they did not touch (:func:`refill_after_removal`);
    - timers are a heap of batches (nodes that start together with one duration end
      together); a resource's queue is a row of flags over its tasks in dispatch
      order (first flag = next task); a task that finds its resource free and its
      queue empty starts without touching the queue;
    - batches with little work (:data:`SMALL_BATCH`: nodes plus successors) are
      handled node by node in plain Python, larger ones with whole-array numpy
      operations.

    Sums are taken in another order than the reference (class loads, remaining bits
    once per rate change, warm-started fillings): times agree to ~1e-12 relative on
    the estimator's graphs (tests: ``tests/test_estimate_fast.py``), and the event
    count is the same.

    Parameters
    ----------
    cap : ndarray
        Link capacities, bits/s.
    dag : DagArrays
    memo : RateMemo, optional
        Shared by runs on the same network and route classes.
    horizon : float
        Stop as soon as the next event lies past it (every unfinished node then ends
        later, so the makespan does too): :class:`HorizonExceeded` is raised with that
        event's time. A search that only needs to know whether a candidate beats a
        bound stops there.

    Returns
    -------
    start, finish, tx_end : ndarray, shape (N,)
    events : int
        Event times processed (as :attr:`SimResult.events`).
    """
    n = dag.nodes
    is_flow, local = dag.is_flow, dag.local
    node_res, node_dur = dag.node_resource, dag.node_duration
    succ_ptr, succ = dag.succ_ptr, dag.succ
    pending = dag.pending.copy()
    bits, flow_lat, flow_class = dag.flow_bits, dag.flow_latency, dag.flow_class
    flow_node = dag.flow_node
    croutes = dag.class_routes
    memo = memo if memo is not None else RateMemo()
    instant = (np.diff(croutes.ptr)[flow_class] == 0) | (bits == 0)
    nclass = len(croutes)

    # Resource queues: tasks of each resource in dispatch order, one row of flags.
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
    table = np.full((nres, width), -1, np.int64)
    table[qres, slot[qnodes]] = qnodes
    qflag = np.zeros((nres, width), bool)
    qcount = np.zeros(nres, np.int64)
    busy = np.zeros(nres, bool)

    # Plain-Python views for the small-batch path (memoryviews: no copy to make).
    succ_l, sptr_l = _view(succ, np.int64), _view(succ_ptr, np.int64)
    res_l, dur_l = _view(node_res, np.int64), _view(node_dur, float)
    isf_l, inst_l = _view(is_flow, np.uint8), _view(instant, np.uint8)
    local_l, slot_l = _view(local, np.int64), _view(slot, np.int64)
    table_l, lat_l = _view(table, np.int64), _view(flow_lat, float)

    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    tx_end = np.full(n, np.nan)
    # Memoryviews share the arrays' memory: plain-Python scalar access, 2x numpy's speed.
    pend_v, busy_v, qcount_v = memoryview(pending), memoryview(busy.view(np.uint8)), \
        memoryview(qcount)
    start_v, finish_v, tx_end_v = memoryview(start), memoryview(finish), memoryview(tx_end)
    heap: list = []
    heappush = heapq.heappush
    seq = itertools.count()
    # Mutable scalars of the loop (closures write them through this dict).
    st = {"done": 0, "new": []}

    def push_one(when: float, node: int) -> None:
        heapq.heappush(heap, (when, next(seq), node))

    def push(nodes: np.ndarray, times: np.ndarray) -> None:
        if nodes.size == 1:
            heapq.heappush(heap, (float(times[0]), next(seq), nodes))
            return
        lo, hi = float(times.min()), float(times.max())
        if lo == hi:
            heapq.heappush(heap, (lo, next(seq), nodes))
            return
        o = np.argsort(times, kind="stable")
        ts, ns = times[o], nodes[o]
        cut = (np.flatnonzero(ts[1:] != ts[:-1]) + 1).tolist()
        tl = ts.tolist()
        for a, b in zip([0, *cut], [*cut, ts.size]):
            heapq.heappush(heap, (tl[a], next(seq), ns[a:b]))

    # -- numpy path ---------------------------------------------------------------
    def dispatch_np(res: np.ndarray, t: float) -> None:
        res = res[~busy[res] & (qcount[res] > 0)]
        if not res.size:
            return
        head = qflag[res].argmax(axis=1)
        nodes = table[res, head]
        qflag[res, head] = False
        qcount[res] -= 1
        busy[res] = True
        start[nodes] = t
        push(nodes, t + node_dur[nodes])

    def activate_np(nodes: np.ndarray, freed: np.ndarray, t: float) -> None:
        fl = is_flow[nodes]
        if fl.any():
            flows = nodes[fl]
            nodes = nodes[~fl]
            start[flows] = t
            fi = local[flows]
            inst = instant[fi]
            if inst.any():
                tx_end[flows[inst]] = t
                push(flows[inst], t + flow_lat[fi[inst]])
                fi = fi[~inst]
            if fi.size:
                st["new"].append(fi)
        if nodes.size:
            r = node_res[nodes]
            free = r < 0
            if free.any():
                fn = nodes[free]
                start[fn] = t
                push(fn, t + node_dur[fn])
                nodes, r = nodes[~free], r[~free]
            if nodes.size:
                qflag[r, slot[nodes]] = True
                qcount[:] += np.bincount(r, minlength=nres)
                freed = np.concatenate([freed, r]) if freed.size else r
        if freed.size:
            dispatch_np(_distinct(freed, nres), t)

    def complete_np(nodes: np.ndarray, times, t: float) -> None:
        finish[nodes] = times
        st["done"] += nodes.size
        freed = node_res[nodes]
        freed = freed[freed >= 0]
        if freed.size:
            busy[freed] = False
        lo, hi = int(nodes[0]), int(nodes[-1])
        if hi - lo + 1 == nodes.size and bool((nodes[1:] > nodes[:-1]).all()):
            hit = succ[succ_ptr[lo]:succ_ptr[hi + 1]]  # a run of consecutive ids
        else:
            idx, _ = gather_rows(succ_ptr, nodes)
            hit = succ[idx]
        if hit.size:
            s, c = _counts(hit)
            pending[s] -= c
            newly = s[pending[s] == 0]
            if newly.size:
                activate_np(newly, freed, t)
                return
        if freed.size:
            dispatch_np(_distinct(freed, nres), t)

    # -- plain-Python path --------------------------------------------------------
    def complete_py(nodes: list, times: list, t: float) -> None:
        newly: list[int] = []
        freed: list[int] = []
        for v, when in zip(nodes, times):
            finish_v[v] = when
            r = res_l[v]
            if r >= 0:
                busy_v[r] = 0
                freed.append(r)
            for k in range(sptr_l[v], sptr_l[v + 1]):
                u = succ_l[k]
                c = pend_v[u] - 1
                pend_v[u] = c
                if c == 0:
                    newly.append(u)
        st["done"] += len(nodes)
        # A new task on a free resource with an empty queue starts at once (the first
        # in dispatch order if several arrive); the others join their queue.
        claim: dict[int, int] = {}
        new_flows = []
        for v in newly:
            if isf_l[v]:
                start_v[v] = t
                fi = local_l[v]
                if inst_l[fi]:
                    tx_end_v[v] = t
                    heappush(heap, (t + lat_l[fi], next(seq), v))
                else:
                    new_flows.append(fi)
                continue
            r = res_l[v]
            if r < 0:
                start_v[v] = t
                heappush(heap, (t + dur_l[v], next(seq), v))
                continue
            if not busy_v[r]:
                old = claim.get(r)
                if old is not None:      # (its queue was empty: only losers are in it)
                    if slot_l[v] < slot_l[old]:
                        claim[r], v = v, old
                elif not qcount_v[r]:
                    claim[r] = v
                    continue
            qflag[r, slot_l[v]] = True
            qcount_v[r] += 1
        if new_flows:
            st["new"].append(np.asarray(new_flows, np.int64))
        for r, v in claim.items():
            busy_v[r] = 1
            start_v[v] = t
            heappush(heap, (t + dur_l[v], next(seq), v))
        for r in freed:
            if not busy_v[r] and qcount_v[r]:
                row = qflag[r]
                h = int(row.argmax())
                v = table_l[r, h]
                row[h] = False
                qcount_v[r] -= 1
                busy_v[r] = 1
                start_v[v] = t
                heappush(heap, (t + dur_l[v], next(seq), v))

    def fire(t: float, eps: float) -> None:
        lim = t + eps
        while heap and heap[0][0] <= lim:
            one_n, one_t, arrays, arr_t = [], [], [], []
            work = 0
            while heap and heap[0][0] <= lim:
                when, _, p = heapq.heappop(heap)
                if isinstance(p, int):
                    one_n.append(p)
                    one_t.append(when)
                    work += 1 + sptr_l[p + 1] - sptr_l[p]
                else:
                    arrays.append(p)
                    arr_t.append(when)
                    if work <= SMALL_BATCH:
                        if p.size > SMALL_BATCH:
                            work += p.size
                        else:
                            for v in p.tolist():
                                work += 1 + sptr_l[v + 1] - sptr_l[v]
            if work <= SMALL_BATCH:
                for p, when in zip(arrays, arr_t):
                    one_n.extend(p.tolist())
                    one_t.extend([when] * p.size)
                complete_py(one_n, one_t, t)
            elif not one_n and len(arrays) == 1:
                complete_np(arrays[0], arr_t[0], t)
            else:
                nodes = np.concatenate([np.asarray(one_n, np.int64), *arrays])
                times = np.concatenate([np.asarray(one_t, float),
                                        *[np.full(p.size, w) for p, w in zip(arrays, arr_t)]])
                complete_np(nodes, times, t)

    # Transmitting flows: local ids, remaining bits at t_ref, rates.
    act = np.empty(0, np.int64)
    arem = np.empty(0)
    arate = np.empty(0)
    t_ref = 0.0
    flow_next = sent_next = math.inf

    t = 0.0
    activate_np(np.flatnonzero(pending == 0), np.empty(0, np.int64), t)
    fire(t, 1e-15)
    events = 0
    while st["done"] < n:
        if st["new"]:
            # The set of transmitting flows changed: bring the remainders up to date,
            # add the new flows and re-solve max-min.
            if act.size and t > t_ref:
                arem = arem - arate * (t - t_ref)
            new = st["new"]
            st["new"] = []
            act = np.concatenate([act, *new])
            arem = np.concatenate([arem, bits[np.concatenate(new)]])
            t_ref = t
            arate = _rates(cap, croutes, flow_class[act], memo, nclass)
            if not act.size:
                flow_next = sent_next = math.inf
            elif float(arate.min()) > 0.0:
                flow_next = t + float((arem / arate).min())
                sent_next = t + float(((arem - 1e-6) / arate).min())
            else:  # a flow on a dead link: never done
                with np.errstate(divide="ignore", invalid="ignore"):
                    flow_next = t + float(np.where(arate > 0, arem / arate, np.inf).min())
                    sent_next = t + float(np.where(arate > 0, (arem - 1e-6) / arate,
                                                   np.inf).min())
        t_next = flow_next
        if heap and heap[0][0] < t_next:
            t_next = heap[0][0]
        if not math.isfinite(t_next):
            _stuck(act, arate, croutes, flow_class, cap, flow_node, pending, finish)
        if t_next > horizon:
            raise HorizonExceeded(t_next)
        t = t_next
        eps = 1e-9 * max(abs(t), 1e-6)
        events += 1
        if act.size and t + 2.0 * eps >= sent_next:  # (slack: this is only a filter)
            rem = arem - arate * (t - t_ref)
            sent = rem <= arate * eps + 1e-6
            if sent.any():
                keep = ~sent
                fi = act[sent]
                act, arem, arate = act[keep], rem[keep], arate[keep]
                t_ref = t
                nodes = flow_node[fi]
                tx_end[nodes] = t
                push(nodes, t + flow_lat[fi])
                st["new"].append(np.empty(0, np.int64))  # rates change
        fire(t, eps)
    return start, finish, tx_end, events


def _distinct(values: np.ndarray, bound: int) -> np.ndarray:
    """Sorted distinct values of small non-negative ints below ``bound``."""
    if values.size == 1:
        return values
    return np.flatnonzero(np.bincount(values, minlength=bound))


def _counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_counts=True)`` by one sort (several times faster on
    the short arrays of an event)."""
    if values.size == 1:
        return values, np.ones(1, np.int64)
    v = np.sort(values)
    first = np.empty(v.size + 1, bool)
    first[0] = first[-1] = True
    np.not_equal(v[1:], v[:-1], out=first[1:-1])
    edges = np.flatnonzero(first)
    return v[edges[:-1]], np.diff(edges)


def _view(a: np.ndarray, dtype) -> memoryview:
    """A memoryview of ``a`` as ``dtype`` (contiguous), for plain-Python indexing."""
    return memoryview(np.ascontiguousarray(a, dtype).view(dtype) if a.dtype != bool
                      else np.ascontiguousarray(a).view(np.uint8))


def _rates(cap, croutes: FlowRoutes, klass: np.ndarray, memo: RateMemo, nclass: int
           ) -> np.ndarray:
    """Max-min rate of each active flow (by class, memoized)."""
    if not klass.size:
        return np.empty(0)
    order = np.argsort(klass, kind="stable")
    k = klass[order]
    first = np.empty(k.size + 1, bool)
    first[0] = first[-1] = True
    np.not_equal(k[1:], k[:-1], out=first[1:-1])
    edges = np.flatnonzero(first)
    mult = np.diff(edges)
    out = np.empty(k.size)
    out[order] = np.repeat(memo.rates(cap, croutes, k[edges[:-1]], mult), mult)
    return out


def _stuck(act, rate, croutes, klass, cap, flow_node, pending, finish) -> None:
    stuck = act[rate <= 0] if act.size else act
    if stuck.size:
        f = int(stuck[0])
        ls, _ = croutes.row(int(klass[f]))
        dead = ls[cap[ls] <= 0]
        where = f" (link {int(dead[0])} has capacity 0)" if dead.size else ""
        raise SimulationError(f"flow node {int(flow_node[f])} cannot progress{where}; "
                              "restore the link with a CapacityChange or reroute it")
    blocked = np.flatnonzero(np.isnan(finish) & (pending > 0))
    raise SimulationError(f"{blocked.size} node(s) never become ready, e.g. node "
                          f"{int(blocked[0]) if blocked.size else -1}: the dependencies "
                          "contain a cycle")
