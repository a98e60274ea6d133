"""The event loop of the flow-level simulator: max-min fair flows, tasks, dependencies."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, NoReturn, Protocol, Sequence

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
           "Simulation", "simulate"]

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

    # read-only members: a frozen dataclass's fields and a class's properties both fit
    @property
    def name(self) -> str: ...

    @property
    def servers(self) -> int: ...

    @property
    def nodes(self) -> int: ...

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
    if bg.on is None or bg.off is None or bg.off == 0:   # (on and off come together)
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
    if bg.on is not None and bg.off is not None:   # (they come together)
        nudge = 1e-9 * (bg.on + bg.off)
    else:
        nudge = 1e-9 * max(1.0, abs(t))
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
    w = workload.compile() if isinstance(workload, Workload) else workload
    if check:
        check_workload(w, np.asarray(network.capacity).size)
    if checkpoints is not None and on_checkpoint is None:
        raise TopoOptError("simulate: checkpoints need an on_checkpoint callback")
    sim = Simulation(network, w, background, capacity_changes, t0=t0, check=False)
    if on_checkpoint is not None:
        for t in sim.stops(checkpoints if checkpoints is not None else ()):
            if on_checkpoint(t, sim.flow_bytes_left()):
                return sim.result()
    else:
        sim.run()
    return sim.result()


class Simulation:
    """One run of the flow-level simulator, which can pause at given times and go on.

    :func:`simulate` runs one to completion (the model is described there). A caller
    that must look at the state during the run (how many bytes each flow still has
    to send) and decide there whether to stop -- the epochs of a reconfigurable
    fabric, :mod:`topoopt.reconfig` -- steps one instead::

        sim = Simulation(network, workload, t0=t0)
        for t in sim.stops(checkpoints):     # paused at t, nodes left
            if decide(sim.flow_bytes_left()):
                break
        result = sim.result()                # stopped at t, or run to the end

    Parameters
    ----------
    network, workload, background, capacity_changes, t0, check :
        As :func:`simulate`. The state at ``t0`` (nodes without predecessors
        started) is set up on construction.

    Attributes
    ----------
    now : float
        The simulated clock: the time of the last event processed.
    events : int
        Event times processed so far.
    """

    # -- fixed: the workload, routes (background flows appended), dependencies ------
    w: CompiledWorkload
    nodes: int                 # flows and tasks (node ids)
    flows: int                 # flows of the workload (local ids 0..flows-1)
    backgrounds: list[Background]   # background flow j has local id flows + j
    links: int                 # the network's links (capacity also has rate-cap links)
    flow_latency: np.ndarray   # per flow: seconds from the last byte to delivery
    ptr: np.ndarray            # routes (CSR) of flows, then of background flows
    route_link: np.ndarray
    route_weight: np.ndarray
    size_bits: np.ndarray      # per flow (inf for background flows)
    empty_route: np.ndarray    # per flow: no link to cross (delivered at once)
    succ: np.ndarray           # successors of node v: succ[succ_ptr[v]:succ_ptr[v + 1]]
    succ_ptr: np.ndarray
    changes: list[CapacityChange]   # sorted by time
    # -- state -------------------------------------------------------------------
    t0: float                  # start of the clock
    now: float
    eps: float                 # events within eps of ``now`` are simultaneous
    events: int
    capacity: np.ndarray       # current bits/s per link
    next_change: int           # index of the first change not applied yet
    bg_on: np.ndarray          # per background flow: transmitting now
    bg_next: np.ndarray        # per background flow: next switch on or off
    pending: np.ndarray        # per node: predecessors not finished yet
    phase: np.ndarray          # per node: _BLOCKED, _WAIT, ..., _DONE
    timer: np.ndarray          # per node: when its timer fires (inf: none)
    timed: np.ndarray          # nodes with a timer set (phase _WAIT, _RUN or _DELIVER)
    start: np.ndarray          # per node, as SimResult
    finish: np.ndarray
    tx_end: np.ndarray
    done: int                  # nodes finished
    busy: np.ndarray           # per resource: running a task
    queues: dict[int, list[tuple[float, int]]]   # per resource: heap of (priority, node)
    active: np.ndarray         # local ids of the flows transmitting (background included)
    remaining_bits: np.ndarray   # per flow, while it transmits
    rate: np.ndarray           # per flow: max-min rate, bits/s
    rates_stale: bool          # the active set or a capacity changed since the last solve
    load: np.ndarray           # per link: bits/s at the current rates
    link_bytes: np.ndarray     # per link: bytes carried so far
    bg_bytes: np.ndarray       # per background flow: bytes sent so far

    def __init__(self, network: LinkNetwork, workload: Workload | CompiledWorkload,
                 background: Sequence[Background] = (),
                 capacity_changes: Sequence[CapacityChange] = (), *, t0: float = 0.0,
                 check: bool = True) -> None:
        capacity = np.asarray(network.capacity, float)
        link_latency = np.broadcast_to(np.asarray(network.latency, float), capacity.shape)
        self.links = capacity.size
        w = workload.compile() if isinstance(workload, Workload) else workload
        if check:
            check_workload(w, self.links)
        self.w, self.nodes, self.flows = w, w.nodes, w.flow_size.size
        self._init_flows(capacity, link_latency, background)
        self._init_nodes()
        self._init_clock(t0, capacity_changes)

    def _init_flows(self, capacity: np.ndarray, link_latency: np.ndarray,
                    background: Sequence[Background]) -> None:
        """Routes, sizes and per-flow state of the flows and the background flows."""
        w = self.w
        self.flow_latency = _flow_latencies(w, link_latency)
        self.backgrounds = list(background)
        nb = len(self.backgrounds)
        routes, self.capacity = _with_background(w.routes, capacity, self.backgrounds)
        self.ptr, self.route_link, self.route_weight = routes.ptr, routes.link, routes.weight
        self.size_bits = np.concatenate([8.0 * w.flow_size, np.full(nb, np.inf)])
        self.empty_route = np.diff(self.ptr) == 0
        self.remaining_bits = np.zeros(self.flows + nb)
        self.rate = np.zeros(self.flows + nb)
        self.active = np.empty(0, np.int64)
        self.rates_stale = True
        self.load = np.zeros(self.capacity.size)
        self.link_bytes = np.zeros(self.capacity.size)
        self.bg_bytes = np.zeros(nb)

    def _init_nodes(self) -> None:
        """Dependencies, per-node times and phases, resource queues."""
        w, n = self.w, self.nodes
        self.succ, self.succ_ptr, self.pending = _successors(w)
        self.start = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.tx_end = np.full(n, np.nan)
        self.timer = np.full(n, np.inf)
        self.phase = np.zeros(n, np.int8)
        self.timed = np.empty(0, np.int64)
        self.done = 0
        nres = int(w.task_resource.max()) + 1 if w.task_resource.size else 0
        self.busy = np.zeros(nres, bool)
        self.queues = {}

    def _init_clock(self, t0: float, capacity_changes: Sequence[CapacityChange]) -> None:
        """The state at ``t0``: changes due applied, background flows on, nodes without
        predecessors (and those they complete at once) under way."""
        self.t0 = t0
        t = self.now = float(t0)
        self.eps = 1e-9 * max(abs(t), 1e-6)
        self.events = 0
        self.changes = sorted(capacity_changes, key=lambda c: c.time)
        for c in self.changes:
            if not 0 <= c.link < self.links:
                raise TopoOptError(f"capacity change on link {c.link} outside "
                                   f"0..{self.links - 1}")
        self.next_change = 0
        self._apply_capacity_changes(t, self.eps)
        bgs = self.backgrounds
        self.bg_on = np.array([b.active(t) for b in bgs], bool)
        self.bg_next = np.array([_next_toggle(b, t) for b in bgs], float)
        if bgs:
            self.active = np.concatenate([self.active, self.flows + np.flatnonzero(self.bg_on)])
            self.remaining_bits[self.flows:] = np.inf
        self._ready(np.flatnonzero(self.pending == 0), t, self.eps)
        self._fire_timers(t, self.eps)

    # -- running -----------------------------------------------------------------
    def run(self, until: float = math.inf) -> bool:
        """Process events up to time ``until`` (later than :attr:`now`; the clock stops
        there: an event of its own). True when it paused at ``until`` with nodes left,
        False once every node has finished.

        Raises
        ------
        SimulationError
            As :func:`simulate`.
        """
        while self.done < self.nodes:
            self._step(until)
            if until <= self.now + self.eps:
                return self.done < self.nodes
        return False

    def stops(self, checkpoints: Iterable[float]) -> Iterator[float]:
        """Run to each of the increasing ``checkpoints`` in turn (consumed lazily; those
        not after the clock skipped) and yield the time of each one reached with nodes
        left, paused there; run to the end once they are exhausted."""
        cps = iter(checkpoints)
        until = _next_checkpoint(cps, self.now + self.eps)
        while self.run(until):
            t = self.now
            until = _next_checkpoint(cps, t + self.eps)
            yield t

    def flow_bytes_left(self) -> np.ndarray:
        """Bytes each flow (in flow order) still has to send while it transmits, 0 for
        flows not transmitting."""
        left = np.zeros(self.flows)
        real = self.active[self.active < self.flows]
        left[real] = self.remaining_bits[real] / 8.0
        return left

    def result(self) -> SimResult:
        """The timings so far: a run to completion, or one stopped at :attr:`now` when
        nodes are left (``stopped_at``, ``remaining``, see :class:`SimResult`)."""
        w, n, nf = self.w, self.nodes, self.flows
        stopped = self.now if self.done < n else math.nan
        done_t = self.finish[np.isfinite(self.finish)]
        makespan = float(done_t.max() - self.t0) if done_t.size else 0.0
        size = np.full(n, np.nan)
        size[w.flow_node] = w.flow_size
        remaining = None
        if math.isfinite(stopped):
            left = np.where(np.isfinite(self.tx_end[w.flow_node]), 0.0, w.flow_size)
            real = self.active[self.active < nf]
            left[real] = self.remaining_bits[real] / 8.0
            remaining = np.full(n, np.nan)
            remaining[w.flow_node] = left
        return SimResult(self.start, self.finish, self.tx_end, w.is_flow.copy(), size,
                         float(self.t0), makespan, self.events, self.link_bytes[:self.links],
                         self.bg_bytes, stopped, remaining)

    def _step(self, until: float) -> None:
        """Move the clock to the next event (``until`` at the latest) and process
        everything due there."""
        self._solve_rates()
        self._advance_to(self._next_event_time(until))
        t, eps = self.now, self.eps
        self._end_transmissions(t, eps)
        if self._apply_capacity_changes(t, eps):
            self.rates_stale = True
        if self.backgrounds:
            self._toggle_backgrounds(t, eps)
        self._fire_timers(t, eps)

    # -- flows -------------------------------------------------------------------
    def _solve_rates(self) -> None:
        """Max-min rates of the active flows and the links' loads, when stale."""
        if not self.rates_stale:
            return
        self.rates_stale = False
        act, cap = self.active, self.capacity
        if act.size:
            idx, counts = gather_rows(self.ptr, act)
            ef = np.repeat(np.arange(act.size), counts)
            r = max_min_rates(cap, ef, self.route_link[idx], self.route_weight[idx], act.size)
            self.rate[act] = r
            self.load = np.bincount(self.route_link[idx], weights=self.route_weight[idx] * r[ef],
                                    minlength=cap.size)
        else:
            self.load = np.zeros(cap.size)

    def _next_event_time(self, until: float) -> float:
        """The earliest of: a flow's last byte out, a timer, a background switch, a
        capacity change, ``until``. Raises SimulationError when there is none."""
        act, nf = self.active, self.flows
        t_next = math.inf
        if act.size:
            real = act[act < nf]
            if real.size:
                rr = self.rate[real]
                with np.errstate(divide="ignore"):
                    dt = np.where(rr > 0, self.remaining_bits[real] / rr, np.inf)
                t_next = self.now + float(dt.min())
        if self.timed.size:
            t_next = min(t_next, float(self.timer[self.timed].min()))
        if self.backgrounds:
            t_next = min(t_next, float(self.bg_next.min()))
        if self.next_change < len(self.changes):
            t_next = min(t_next, self.changes[self.next_change].time)
        t_next = min(t_next, until)
        if not math.isfinite(t_next):
            _raise_stuck(act[act < nf] if act.size else act, self.rate, self.route_link,
                         self.ptr, self.capacity, self.phase, self.w.flow_node)
        return t_next

    def _advance_to(self, t_next: float) -> None:
        """Transmit at the current rates until ``t_next`` and move the clock there."""
        act, nf = self.active, self.flows
        dt = t_next - self.now
        if dt > 0 and act.size:
            self.remaining_bits[act] -= self.rate[act] * dt
            self.link_bytes += self.load * dt / 8.0
            bga = act[act >= nf]
            self.bg_bytes[bga - nf] += self.rate[bga] * dt / 8.0
        self.now = t_next
        self.eps = 1e-9 * max(abs(t_next), 1e-6)
        self.events += 1

    def _end_transmissions(self, t: float, eps: float) -> None:
        """Flows whose last byte is out (within ``rate x eps + 1e-6`` bits) leave the
        active set; each is delivered its latency later."""
        act = self.active
        if not act.size:
            return
        real = act < self.flows
        sent = real & (self.remaining_bits[act] <= self.rate[act] * eps + 1e-6)
        if sent.any():
            fi = act[sent]
            self.active = act[~sent]
            self.rates_stale = True
            self.remaining_bits[fi] = 0.0
            self.rate[fi] = 0.0
            nodes = self.w.flow_node[fi]
            self.tx_end[nodes] = t
            self._schedule(nodes, t + self.flow_latency[fi], _DELIVER)

    def _apply_capacity_changes(self, t: float, eps: float) -> bool:
        """Apply the capacity changes due by ``t + eps``; whether there were any."""
        changed = False
        changes = self.changes
        while self.next_change < len(changes) and changes[self.next_change].time <= t + eps:
            c = changes[self.next_change]
            self.capacity[c.link] = c.capacity
            self.next_change += 1
            changed = True
        return changed

    def _toggle_backgrounds(self, t: float, eps: float) -> None:
        """Switch the background flows due by ``t + eps`` on or off."""
        nf = self.flows
        for j in np.flatnonzero(self.bg_next <= t + eps).tolist():
            at = self.bg_next[j]
            bg = self.backgrounds[j]
            on = _state_after(bg, at)
            if on != self.bg_on[j]:
                self.bg_on[j] = on
                a = self.active
                self.active = (np.concatenate([a, [nf + j]]) if on else a[a != nf + j])
                self.rate[nf + j] = 0.0
                self.rates_stale = True
            self.bg_next[j] = _next_toggle(bg, at + 1e-9 * max(abs(at), 1e-6))

    # -- nodes -------------------------------------------------------------------
    def _schedule(self, nodes: np.ndarray, times: np.ndarray, phase: int) -> None:
        """Set the timers of ``nodes`` to fire at ``times`` into ``phase``'s end."""
        self.timer[nodes] = times
        self.phase[nodes] = phase
        self.timed = np.concatenate([self.timed, nodes])

    def _dispatch(self, resources: Iterable[int], t: float) -> None:
        """Start the next queued task of each idle resource in ``resources``."""
        started = []
        for r in resources:
            q = self.queues.get(r)
            if self.busy[r] or not q:
                continue
            started.append(heapq.heappop(q)[1])
            self.busy[r] = True
        if started:
            nodes = np.asarray(started, np.int64)
            self.start[nodes] = t
            self._schedule(nodes, t + self.w.task_duration[self.w.local[nodes]], _RUN)

    def _activate(self, nodes: np.ndarray, t: float) -> None:
        """Start ``nodes`` at ``t``: flows transmit (or are delivered at once when empty),
        tasks run or queue on their resource."""
        w = self.w
        flows = nodes[w.is_flow[nodes]]
        if flows.size:
            self.start[flows] = t
            fi = w.local[flows]
            instant = self.empty_route[fi] | (self.size_bits[fi] == 0)
            if instant.any():
                self.tx_end[flows[instant]] = t
                self._schedule(flows[instant], t + self.flow_latency[fi[instant]], _DELIVER)
            go = fi[~instant]
            if go.size:
                self.phase[flows[~instant]] = _RUN
                self.remaining_bits[go] = self.size_bits[go]
                self.active = np.concatenate([self.active, go])
                self.rates_stale = True
        tasks = nodes[~w.is_flow[nodes]]
        if tasks.size:
            ti = w.local[tasks]
            res = w.task_resource[ti]
            free = res < 0
            if free.any():
                self.start[tasks[free]] = t
                self._schedule(tasks[free], t + w.task_duration[ti[free]], _RUN)
            dirty = set()
            for node, r, p in zip(tasks[~free].tolist(), res[~free].tolist(),
                                  w.task_priority[ti[~free]].tolist()):
                heapq.heappush(self.queues.setdefault(r, []), (p, node))
                self.phase[node] = _QUEUED
                dirty.add(r)
            self._dispatch(sorted(dirty), t)

    def _ready(self, nodes: np.ndarray, t: float, eps: float) -> None:
        """``nodes`` have all their predecessors done: start them, or wait for their
        release time."""
        release = self.w.release
        later = release[nodes] > t + eps
        if later.any():
            self._schedule(nodes[later], release[nodes[later]], _WAIT)
        if (~later).any():
            self._activate(nodes[~later], t)

    def _complete(self, nodes: np.ndarray, times: np.ndarray, t: float, eps: float) -> None:
        """``nodes`` finished at ``times``: successors with no predecessor left are ready."""
        n = self.nodes
        self.finish[nodes] = times
        self.phase[nodes] = _DONE
        self.done += nodes.size
        idx, _ = gather_rows(self.succ_ptr, nodes)
        if idx.size:
            hit = self.succ[idx]
            pending = self.pending
            if hit.size * 16 < n:  # few successors: sort them; many: count over all nodes
                s, c = np.unique(hit, return_counts=True)
                pending[s] -= c
                newly = s[pending[s] == 0]
            else:
                c = np.bincount(hit, minlength=n)
                pending[:] -= c
                newly = np.flatnonzero((c > 0) & (pending == 0))
            if newly.size:
                self._ready(newly, t, eps)

    def _fire_timers(self, t: float, eps: float) -> None:
        """Fire every timer due by ``t + eps``, round after round (a node that fires
        may set timers due at once): releases start nodes, ends complete them and
        free their resources."""
        w = self.w
        while self.timed.size:
            timed = self.timed
            when = self.timer[timed]
            due = when <= t + eps
            if not due.any():
                return
            fire, fire_t = timed[due], when[due]
            self.timed = timed[~due]
            self.timer[fire] = np.inf
            rel = self.phase[fire] == _WAIT
            if rel.any():
                self._activate(fire[rel], t)
            end = ~rel
            if end.any():
                nodes = fire[end]
                tasks = nodes[~w.is_flow[nodes]]
                freed = w.task_resource[w.local[tasks]]
                freed = freed[freed >= 0]
                self.busy[freed] = False
                self._complete(nodes, fire_t[end], t, eps)
                if freed.size:
                    self._dispatch(sorted(set(freed.tolist())), t)


def _next_checkpoint(cps: Iterator[float], after: float) -> float:
    """The first checkpoint later than ``after`` (inf when there is none)."""
    for c in cps:
        if c > after:
            return float(c)
    return math.inf


def _raise_stuck(act: np.ndarray, rate: np.ndarray, rlink: np.ndarray, ptr: np.ndarray,
                 cap: np.ndarray, phase: np.ndarray, flow_node: np.ndarray) -> NoReturn:
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
