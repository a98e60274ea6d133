"""The event loop of the flow-level simulator: max-min fair flows, tasks, dependencies."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from topoopt.errors import TopoOptError
from topoopt.netsim.maxmin import gather_rows, max_min_rates
from topoopt.netsim.workload import (
    Background,
    CapacityChange,
    CompiledWorkload,
    FlowRoutes,
    Workload,
    check_workload,
)

__all__ = ["Network", "LinkNetwork", "RoutedNetwork", "SimResult", "SimulationError",
           "simulate"]

# Blocked (waiting for predecessors), waiting for release, queued on a resource,
# running (task) or transmitting (flow), delivering (flow latency), done.
_BLOCKED, _WAIT, _QUEUED, _RUN, _DELIVER, _DONE = range(6)


class SimulationError(TopoOptError):
    """The workload cannot finish: a dependency cycle, or flows stuck on dead links."""


class LinkNetwork(Protocol):
    """What the simulators read of a network: per directed link, capacity (bits/s) and
    latency (s). :class:`Network` and :class:`topoopt.fabrics.Fabric` are ones."""

    @property
    def capacity(self) -> np.ndarray: ...

    @property
    def latency(self) -> np.ndarray: ...


class RoutedNetwork(LinkNetwork, Protocol):
    """A network of servers ``0..servers-1`` and switches that routes flows between
    servers: what the packet-level backend and the wire model read of a
    :class:`topoopt.fabrics.Fabric` (the simulators never import the fabrics)."""

    name: str
    servers: int
    nodes: int

    @property
    def src(self) -> np.ndarray: ...

    @property
    def dst(self) -> np.ndarray: ...

    def route(self, src, dst, random: bool = False, seed: int | None = 0) -> FlowRoutes: ...

    def paths(self, src: int, dst: int, random: bool = False, seed: int | None = 0
              ) -> list[tuple[np.ndarray, float]]: ...


@dataclass(frozen=True)
class Network:
    """Directed links with capacities and latencies (anything with these two
    arrays works as a network, e.g. a :class:`topoopt.fabrics.Fabric`).

    Attributes
    ----------
    capacity : ndarray of float, shape (L,)
        Bits/s, finite, >= 0.
    latency : ndarray of float, shape (L,)
        Seconds, >= 0.
    """

    capacity: np.ndarray
    latency: np.ndarray

    def __post_init__(self) -> None:
        cap = np.asarray(self.capacity, float)
        lat = np.broadcast_to(np.asarray(self.latency, float), cap.shape).copy()
        if cap.ndim != 1:
            raise TopoOptError("Network.capacity must be a 1-D array")
        if np.any(~np.isfinite(cap) | (cap < 0)):
            raise TopoOptError("Network.capacity must be finite and >= 0 bits/s")
        if np.any(~np.isfinite(lat) | (lat < 0)):
            raise TopoOptError("Network.latency must be finite and >= 0 seconds")
        object.__setattr__(self, "capacity", cap)
        object.__setattr__(self, "latency", lat)

    @property
    def links(self) -> int:
        return int(self.capacity.size)


@dataclass(frozen=True)
class SimResult:
    """Timings of one simulation, indexed by node id (flows and tasks share ids).

    Attributes
    ----------
    start : ndarray, shape (N,)
        A flow's first byte on the wire / a task's start on its resource, seconds.
    finish : ndarray, shape (N,)
        A flow's delivery (last byte sent + latency) / a task's end, seconds.
    tx_end : ndarray, shape (N,)
        When a flow's last byte left (NaN for tasks).
    is_flow : ndarray of bool, shape (N,)
    size : ndarray, shape (N,)
        Flow bytes (NaN for tasks).
    t0 : float
        Simulation start time.
    makespan : float
        ``max(finish) - t0`` (0 for an empty workload).
    events : int
        Event times processed (simultaneous events count once).
    link_bytes : ndarray, shape (L,)
        Bytes each link carried, background included.
    background_bytes : ndarray, shape (B,)
        Bytes each background flow sent.
    stopped_at : float
        NaN when the workload ran to completion; otherwise the checkpoint time at which
        ``on_checkpoint`` stopped it (see :func:`simulate`): nodes not finished by then
        have NaN ``finish`` (and NaN ``tx_end`` when still transmitting).
    remaining : ndarray, shape (N,), optional
        With ``stopped_at``: bytes each flow still had to send (its size when not
        started, 0 once sent; NaN for tasks). None for a run to completion.
    """

    start: np.ndarray
    finish: np.ndarray
    tx_end: np.ndarray
    is_flow: np.ndarray
    size: np.ndarray
    t0: float
    makespan: float
    events: int
    link_bytes: np.ndarray = field(repr=False)
    background_bytes: np.ndarray = field(repr=False)
    stopped_at: float = math.nan
    remaining: np.ndarray | None = field(default=None, repr=False)

    @property
    def flow_nodes(self) -> np.ndarray:
        return np.flatnonzero(self.is_flow)

    @property
    def task_nodes(self) -> np.ndarray:
        return np.flatnonzero(~self.is_flow)

    @property
    def completion_time(self) -> np.ndarray:
        """``finish - start`` per node (a flow's FCT, a task's duration)."""
        return self.finish - self.start

    @property
    def throughput(self) -> np.ndarray:
        """Bits/s of each flow over its completion time, ``8 x size / FCT``
        (NaN for tasks; inf for an instantaneous flow)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.is_flow, 8.0 * self.size / self.completion_time, np.nan)


def _next_toggle(bg: Background, t: float) -> float:
    """First time after ``t`` at which ``bg`` switches on or off."""
    if t < bg.start:
        return bg.start
    if t >= bg.stop:
        return math.inf
    if bg.on is None or bg.off == 0:
        return bg.stop
    period = bg.on + bg.off
    k = math.floor((t - bg.start) / period)
    for b in (bg.start + k * period + bg.on, bg.start + (k + 1) * period,
              bg.start + (k + 1) * period + bg.on):
        if b > t:
            return min(b, bg.stop)
    return bg.stop  # pragma: no cover - unreachable


def _state_after(bg: Background, t: float) -> bool:
    """Whether ``bg`` is on just after boundary time ``t``."""
    nudge = 1e-9 * ((bg.on + bg.off) if bg.on is not None else max(1.0, abs(t)))
    return bg.active(t + nudge)


def _flow_latencies(w: CompiledWorkload, link_latency: np.ndarray) -> np.ndarray:
    """Each flow's latency: its own, else the weighted sum of its links' latencies."""
    nf = w.flow_size.size
    flow_lat = w.flow_latency.copy()
    missing = np.isnan(flow_lat)
    if missing.any():
        routes = w.routes
        owner = np.repeat(np.arange(nf), np.diff(routes.ptr))
        sums = np.bincount(owner, weights=link_latency[routes.link] * routes.weight,
                           minlength=nf)
        flow_lat[missing] = sums[missing]
    return flow_lat


def _with_background(routes: FlowRoutes, capacity: np.ndarray,
                     background: Sequence[Background]) -> tuple[FlowRoutes, np.ndarray]:
    """Routes and link capacities with the background flows appended as never-ending
    flows; a background flow's rate cap becomes a private link of that capacity."""
    links = capacity.size
    caps = [b.rate for b in background if b.rate is not None]
    bg_lists, bg_weights, v = [], [], links
    for b in background:
        if max(b.links) >= links or min(b.links) < 0:
            raise TopoOptError(f"background flow uses a link outside 0..{links - 1}")
        ls, ws = list(b.links), list(b.weights or [1.0] * len(b.links))
        if b.rate is not None:
            ls.append(v)
            ws.append(1.0)
            v += 1
        bg_lists.append(ls)
        bg_weights.append(ws)
    if background:
        routes = FlowRoutes.concat([routes, FlowRoutes.from_lists(bg_lists, bg_weights)])
    return routes, np.concatenate([capacity, np.asarray(caps, float)])


def _successors(w: CompiledWorkload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Successor lists in CSR form (``succ[succ_ptr[i]:succ_ptr[i + 1]]``) and each
    node's count of predecessors."""
    n = w.nodes
    order = np.argsort(w.dep_before, kind="stable")
    succ_ptr = np.concatenate([[0], np.cumsum(np.bincount(w.dep_before, minlength=n))])
    return w.dep_after[order], succ_ptr, np.bincount(w.dep_after, minlength=n)


def simulate(network: LinkNetwork, workload: Workload | CompiledWorkload,
             background: Sequence[Background] = (),
             capacity_changes: Sequence[CapacityChange] = (), *, t0: float = 0.0,
             check: bool = True, checkpoints: Iterable[float] | None = None,
             on_checkpoint: Callable[[float, np.ndarray], bool] | None = None) -> SimResult:
    """Run flows and compute tasks to completion on a network (flow level).

    Flow rates are max-min fair (:func:`max_min_rates`) and recomputed at every
    event that changes the set of transmitting flows, a link's capacity or the
    set of active background flows. Events at the same time (within 1e-9
    relative) are processed together.

    Parameters
    ----------
    network : Network or Fabric
        Anything with ``capacity`` (bits/s) and ``latency`` (s) arrays, one per link.
    workload : Workload or CompiledWorkload
        Flows, tasks and their dependencies; route link ids index ``network``.
    background : sequence of Background
        External flows competing for bandwidth (they never finish).
    capacity_changes : sequence of CapacityChange
        Link capacity changes at given times (gray failures, repairs).
    t0 : float
        Start of the simulated clock; releases before it count as ``t0``.
    check : bool
        Validate the workload first (:func:`check_workload`).
    checkpoints : iterable of float
        Increasing times, consumed lazily (an endless generator is fine), at which
        ``on_checkpoint(t, remaining)`` is called once the events of ``t`` are
        processed; ``remaining`` holds the bytes each flow (in flow order, the
        compiled workload's ``flow_node`` order) still has to send while it
        transmits, 0 for flows not transmitting. When it returns True the simulation
        stops at ``t`` and the result says so (``stopped_at``, ``remaining``): a
        caller can change the network or the routes and run the rest of the workload
        from that state (epochs of a reconfigurable fabric). Checkpoints at or before
        ``t0`` are skipped. Without them nothing changes.
    on_checkpoint : callable, optional
        Required with ``checkpoints``.

    Returns
    -------
    SimResult

    Raises
    ------
    SimulationError
        A dependency cycle, or a flow that cannot progress (a zero-capacity link
        that is never repaired).

    Notes
    -----
    Model: a flow is a fluid; while it transmits, its rate ``r`` loads each link
    ``l`` of its route with ``weight[l] x r``. When its last byte is sent it frees
    the links and is delivered ``latency`` seconds later, which is when dependent
    nodes may start. So one flow alone on a link of bandwidth B takes
    ``8 x size / B + latency``. No packets, headers, queues or slow start: that
    is what the packet-level ns-3 backend (``topoopt.netsim.ns3``) is for.
    Deterministic: no randomness inside; ties are broken by node id.

    Examples
    --------
    >>> net = Network(np.array([100e9]), np.array([1e-6]))
    >>> w = Workload()
    >>> f = w.add_flow(12.5e6, [0])          # 100 Mbit over 100 Gbit/s
    >>> round(float(simulate(net, w).finish[f]) * 1e6, 3)   # 1 ms + 1 us
    1001.0
    """
    cap_nominal = np.asarray(network.capacity, float)
    link_latency = np.broadcast_to(np.asarray(network.latency, float), cap_nominal.shape)
    links = cap_nominal.size
    w = workload.compile() if isinstance(workload, Workload) else workload
    if check:
        check_workload(w, links)
    if checkpoints is not None and on_checkpoint is None:
        raise TopoOptError("simulate: checkpoints need an on_checkpoint callback")
    n, nf = w.nodes, w.flow_size.size
    routes = w.routes

    flow_lat = _flow_latencies(w, link_latency)
    bgs = list(background)
    nb = len(bgs)
    all_routes, cap = _with_background(routes, cap_nominal, bgs)
    ptr, rlink, rweight = all_routes.ptr, all_routes.link, all_routes.weight
    size_bits = np.concatenate([8.0 * w.flow_size, np.full(nb, np.inf)])
    empty_route = np.diff(ptr) == 0
    rem = np.zeros(nf + nb)
    rate = np.zeros(nf + nb)

    succ, succ_ptr, pending = _successors(w)

    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    tx_end = np.full(n, np.nan)
    timer = np.full(n, np.inf)
    phase = np.zeros(n, np.int8)
    is_flow, local, release = w.is_flow, w.local, w.release
    t_res, t_dur, t_prio = w.task_resource, w.task_duration, w.task_priority
    nres = int(t_res.max()) + 1 if t_res.size else 0
    busy = np.zeros(nres, bool)
    queues: dict[int, list] = {}

    st = {"timed": np.empty(0, np.int64), "act": np.empty(0, np.int64), "rates": True,
          "done": 0}
    link_bytes = np.zeros(cap.size)
    bg_bytes = np.zeros(nb)

    def schedule(nodes: np.ndarray, times: np.ndarray, ph: int) -> None:
        timer[nodes] = times
        phase[nodes] = ph
        st["timed"] = np.concatenate([st["timed"], nodes])

    def dispatch(resources, t: float) -> None:
        started = []
        for r in resources:
            q = queues.get(r)
            if busy[r] or not q:
                continue
            started.append(heapq.heappop(q)[1])
            busy[r] = True
        if started:
            nodes = np.asarray(started, np.int64)
            start[nodes] = t
            schedule(nodes, t + t_dur[local[nodes]], _RUN)

    def activate(nodes: np.ndarray, t: float) -> None:
        flows = nodes[is_flow[nodes]]
        if flows.size:
            start[flows] = t
            fi = local[flows]
            instant = empty_route[fi] | (size_bits[fi] == 0)
            if instant.any():
                tx_end[flows[instant]] = t
                schedule(flows[instant], t + flow_lat[fi[instant]], _DELIVER)
            go = fi[~instant]
            if go.size:
                phase[flows[~instant]] = _RUN
                rem[go] = size_bits[go]
                st["act"] = np.concatenate([st["act"], go])
                st["rates"] = True
        tasks = nodes[~is_flow[nodes]]
        if tasks.size:
            ti = local[tasks]
            res = t_res[ti]
            free = res < 0
            if free.any():
                start[tasks[free]] = t
                schedule(tasks[free], t + t_dur[ti[free]], _RUN)
            dirty = set()
            for node, r, p in zip(tasks[~free].tolist(), res[~free].tolist(),
                                  t_prio[ti[~free]].tolist()):
                heapq.heappush(queues.setdefault(r, []), (p, node))
                phase[node] = _QUEUED
                dirty.add(r)
            dispatch(sorted(dirty), t)

    def ready(nodes: np.ndarray, t: float, eps: float) -> None:
        later = release[nodes] > t + eps
        if later.any():
            schedule(nodes[later], release[nodes[later]], _WAIT)
        if (~later).any():
            activate(nodes[~later], t)

    def complete(nodes: np.ndarray, times: np.ndarray, t: float, eps: float) -> None:
        finish[nodes] = times
        phase[nodes] = _DONE
        st["done"] += nodes.size
        idx, _ = gather_rows(succ_ptr, nodes)
        if idx.size:
            hit = succ[idx]
            if hit.size * 16 < n:  # few successors: sort them; many: count over all nodes
                s, c = np.unique(hit, return_counts=True)
                pending[s] -= c
                newly = s[pending[s] == 0]
            else:
                c = np.bincount(hit, minlength=n)
                pending[:] -= c
                newly = np.flatnonzero((c > 0) & (pending == 0))
            if newly.size:
                ready(newly, t, eps)

    def fire_timers(t: float, eps: float) -> None:
        while st["timed"].size:
            timed = st["timed"]
            when = timer[timed]
            due = when <= t + eps
            if not due.any():
                return
            fire, fire_t = timed[due], when[due]
            st["timed"] = timed[~due]
            timer[fire] = np.inf
            ph = phase[fire]
            rel = ph == _WAIT
            if rel.any():
                activate(fire[rel], t)
            end = ~rel
            if end.any():
                nodes = fire[end]
                tasks = nodes[~is_flow[nodes]]
                freed = t_res[local[tasks]]
                freed = freed[freed >= 0]
                busy[freed] = False
                complete(nodes, fire_t[end], t, eps)
                if freed.size:
                    dispatch(sorted(set(freed.tolist())), t)

    # Initial state at t0.
    t = float(t0)
    eps0 = 1e-9 * max(abs(t), 1e-6)
    changes = sorted(capacity_changes, key=lambda c: c.time)
    for c in changes:
        if not 0 <= c.link < links:
            raise TopoOptError(f"capacity change on link {c.link} outside 0..{links - 1}")
    ci = 0
    while ci < len(changes) and changes[ci].time <= t + eps0:
        cap[changes[ci].link] = changes[ci].capacity
        ci += 1
    bg_on = np.array([b.active(t) for b in bgs], bool)
    bg_next = np.array([_next_toggle(b, t) for b in bgs], float)
    if nb:
        st["act"] = np.concatenate([st["act"], nf + np.flatnonzero(bg_on)])
        rem[nf:] = np.inf
    ready(np.flatnonzero(pending == 0), t, eps0)
    fire_timers(t, eps0)

    cps = iter(checkpoints if checkpoints is not None else ())
    cp_next = _next_checkpoint(cps, t + eps0)
    stopped = math.nan

    events = 0
    load = np.zeros(cap.size)
    while st["done"] < n:
        act = st["act"]
        if st["rates"]:
            st["rates"] = False
            if act.size:
                idx, counts = gather_rows(ptr, act)
                ef = np.repeat(np.arange(act.size), counts)
                r = max_min_rates(cap, ef, rlink[idx], rweight[idx], act.size)
                rate[act] = r
                load = np.bincount(rlink[idx], weights=rweight[idx] * r[ef], minlength=cap.size)
            else:
                load = np.zeros(cap.size)
        t_next = math.inf
        if act.size:
            real = act[act < nf]
            if real.size:
                rr = rate[real]
                with np.errstate(divide="ignore"):
                    dt = np.where(rr > 0, rem[real] / rr, np.inf)
                t_next = t + float(dt.min())
        if st["timed"].size:
            t_next = min(t_next, float(timer[st["timed"]].min()))
        if nb:
            t_next = min(t_next, float(bg_next.min()))
        if ci < len(changes):
            t_next = min(t_next, changes[ci].time)
        t_next = min(t_next, cp_next)
        if not math.isfinite(t_next):
            _raise_stuck(act[act < nf] if act.size else act, rate, rlink, ptr, cap, phase,
                         w.flow_node)
        dt = t_next - t
        if dt > 0 and act.size:
            rem[act] -= rate[act] * dt
            link_bytes += load * dt / 8.0
            bga = act[act >= nf]
            bg_bytes[bga - nf] += rate[bga] * dt / 8.0
        t = t_next
        eps = 1e-9 * max(abs(t), 1e-6)
        events += 1
        # Flows whose last byte is out.
        if act.size:
            real = act < nf
            sent = real & (rem[act] <= rate[act] * eps + 1e-6)
            if sent.any():
                fi = act[sent]
                st["act"] = act[~sent]
                st["rates"] = True
                rem[fi] = 0.0
                rate[fi] = 0.0
                nodes = w.flow_node[fi]
                tx_end[nodes] = t
                schedule(nodes, t + flow_lat[fi], _DELIVER)
        # Capacity changes and background switches.
        while ci < len(changes) and changes[ci].time <= t + eps:
            cap[changes[ci].link] = changes[ci].capacity
            ci += 1
            st["rates"] = True
        if nb:
            for j in np.flatnonzero(bg_next <= t + eps).tolist():
                at = bg_next[j]
                on = _state_after(bgs[j], at)
                if on != bg_on[j]:
                    bg_on[j] = on
                    a = st["act"]
                    st["act"] = (np.concatenate([a, [nf + j]]) if on else a[a != nf + j])
                    rate[nf + j] = 0.0
                    st["rates"] = True
                bg_next[j] = _next_toggle(bgs[j], at + 1e-9 * max(abs(at), 1e-6))
        fire_timers(t, eps)
        if cp_next <= t + eps:
            cp_next = _next_checkpoint(cps, t + eps)
            if st["done"] < n:
                left = np.zeros(nf)
                real = st["act"][st["act"] < nf]
                left[real] = rem[real] / 8.0
                if on_checkpoint(t, left):
                    stopped = t
                    break

    done_t = finish[np.isfinite(finish)]
    makespan = float(done_t.max() - t0) if done_t.size else 0.0
    size = np.full(n, np.nan)
    size[w.flow_node] = w.flow_size
    remaining = None
    if math.isfinite(stopped):
        left = np.where(np.isfinite(tx_end[w.flow_node]), 0.0, w.flow_size)
        real = st["act"][st["act"] < nf]
        left[real] = rem[real] / 8.0
        remaining = np.full(n, np.nan)
        remaining[w.flow_node] = left
    return SimResult(start, finish, tx_end, is_flow.copy(), size, float(t0), makespan, events,
                     link_bytes[:links], bg_bytes, stopped, remaining)


def _next_checkpoint(cps, after: float) -> float:
    """The first checkpoint later than ``after`` (inf when there is none)."""
    for c in cps:
        if c > after:
            return float(c)
    return math.inf


def _raise_stuck(act, rate, rlink, ptr, cap, phase, flow_node) -> None:
    stuck = act[rate[act] <= 0] if act.size else act
    if stuck.size:
        f = int(stuck[0])
        ls = rlink[ptr[f]:ptr[f + 1]]
        dead = ls[cap[ls] <= 0]
        where = f" (link {int(dead[0])} has capacity 0)" if dead.size else ""
        raise SimulationError(f"flow node {int(flow_node[f])} cannot progress{where}; "
                              "restore the link with a CapacityChange or reroute it")
    blocked = np.flatnonzero(phase == _BLOCKED)
    raise SimulationError(f"{blocked.size} node(s) never become ready, e.g. node "
                          f"{int(blocked[0]) if blocked.size else -1}: the dependencies "
                          "contain a cycle")
