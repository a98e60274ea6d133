"""What the flow-level simulator runs: flows, compute tasks, dependencies and network events."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from topoopt.errors import TopoOptError
from topoopt.netsim.maxmin import sum_by_key

__all__ = ["couple_routes", "FlowRoutes", "Workload", "CompiledWorkload", "Background",
           "CapacityChange", "degrade", "check_workload", "NO_RESOURCE"]

#: Resource id of a task that needs no resource (a pure delay or a barrier).
NO_RESOURCE = -1


@dataclass(frozen=True)
class FlowRoutes:
    """Routes of a batch of flows in CSR form: flow ``i`` crosses
    ``link[ptr[i]:ptr[i+1]]`` carrying ``weight[...]`` of its rate on each.

    A weight is the share of the flow's rate that crosses the link: 1 on a
    single path, the path fraction on a multipath (ECMP) route, 2 when a coupled
    flow (a pipelined ring) crosses the same link twice. A link appears at most
    once per flow (weights of repeated links are summed by :meth:`from_lists`).

    Attributes
    ----------
    ptr : ndarray of int64, shape (F + 1,)
    link : ndarray of int64
    weight : ndarray of float64
    """

    ptr: np.ndarray
    link: np.ndarray
    weight: np.ndarray

    def __len__(self) -> int:
        return int(self.ptr.size - 1)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Links and weights of flow ``i``."""
        a, b = self.ptr[i], self.ptr[i + 1]
        return self.link[a:b], self.weight[a:b]

    @classmethod
    def from_lists(cls, links: Sequence[Sequence[int]],
                   weights: Sequence[Sequence[float]] | None = None) -> "FlowRoutes":
        """Build from one link list (and optional weight list) per flow; repeated
        links within a flow are merged by summing their weights."""
        ptr = [0]
        out_l: list[np.ndarray] = []
        out_w: list[np.ndarray] = []
        for i, row in enumerate(links):
            ls = np.asarray(row, dtype=np.int64).ravel()
            ws = (np.ones(ls.size) if weights is None
                  else np.asarray(weights[i], dtype=float).ravel())
            if ws.size != ls.size:
                raise TopoOptError(f"flow {i}: {ls.size} links but {ws.size} weights")
            if ls.size and np.unique(ls).size != ls.size:
                ls, inv = np.unique(ls, return_inverse=True)
                ws = np.bincount(inv, weights=ws)
            out_l.append(ls)
            out_w.append(ws)
            ptr.append(ptr[-1] + ls.size)
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.empty(0, dt))
        return cls(np.asarray(ptr, np.int64), cat(out_l, np.int64), cat(out_w, float))

    @classmethod
    def uniform(cls, links: np.ndarray) -> "FlowRoutes":
        """Every flow crosses the same number of links with weight 1: ``links`` has
        shape ``(F, k)`` (e.g. ``k = 2``: uplink and downlink on one switch)."""
        links = np.asarray(links, dtype=np.int64)
        if links.ndim != 2:
            raise TopoOptError("FlowRoutes.uniform needs a 2-D (flows, links) array")
        f, k = links.shape
        return cls(np.arange(f + 1, dtype=np.int64) * k, links.ravel().copy(), np.ones(f * k))

    @classmethod
    def concat(cls, parts: Sequence["FlowRoutes"]) -> "FlowRoutes":
        """Stack several batches into one."""
        if not parts:
            return cls(np.zeros(1, np.int64), np.empty(0, np.int64), np.empty(0))
        offsets = np.cumsum([0] + [p.link.size for p in parts[:-1]])
        ptr = np.concatenate([np.zeros(1, np.int64)]
                             + [p.ptr[1:] + o for p, o in zip(parts, offsets)])
        return cls(ptr, np.concatenate([p.link for p in parts]),
                   np.concatenate([p.weight for p in parts]))


def couple_routes(routes: FlowRoutes, latency: np.ndarray, group: np.ndarray, share: np.ndarray,
                  groups: int, links: int) -> tuple[FlowRoutes, np.ndarray]:
    """Merge flows into coupled flows: flow ``i`` (row ``i`` of ``routes``) carries
    ``share[i]`` of coupled flow ``group[i]``'s rate, so the group loads each link with
    the share-weighted sum of its members' weights; its latency is the slowest member's.

    Examples
    --------
    >>> r = FlowRoutes.from_lists([[0, 1], [1, 2]])
    >>> merged, lat = couple_routes(r, np.array([2e-6, 1e-6]), np.array([0, 0]),
    ...                             np.array([0.5, 0.5]), 1, 3)
    >>> merged.link.tolist(), merged.weight.tolist(), lat.tolist()
    ([0, 1, 2], [0.5, 1.0, 0.5], [2e-06])
    """
    flow = np.repeat(np.arange(len(routes)), np.diff(routes.ptr))
    ukey, weight = sum_by_key(group[flow] * links + routes.link, routes.weight * share[flow],
                              groups * links)
    ptr = np.zeros(groups + 1, np.int64)
    np.cumsum(np.bincount(ukey // links, minlength=groups), out=ptr[1:])
    lat = np.zeros(groups)
    np.maximum.at(lat, group, latency)
    return FlowRoutes(ptr, ukey % links, weight), lat


@dataclass(frozen=True)
class Background:
    """An external flow that competes for bandwidth but never finishes (REACT §5.2).

    It takes part in max-min sharing like any flow (a greedy TCP sender), capped
    at ``rate`` when given (a constant-rate sender). It is active in
    ``[start, stop)``; with ``on`` and ``off`` it alternates, starting at
    ``start``: active ``on`` seconds, idle ``off`` seconds, and so on.

    Attributes
    ----------
    links : tuple of int
    weights : tuple of float, optional
        Per link (default all 1).
    rate : float, optional
        Cap in bits/s (None = greedy).
    start, stop : float
        Seconds (absolute simulation time).
    on, off : float, optional
        Period of an on/off source, seconds.
    """

    links: tuple[int, ...]
    weights: tuple[float, ...] | None = None
    rate: float | None = None
    start: float = 0.0
    stop: float = math.inf
    on: float | None = None
    off: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "links", tuple(int(x) for x in self.links))
        if self.weights is not None:
            object.__setattr__(self, "weights", tuple(float(x) for x in self.weights))
            if len(self.weights) != len(self.links) or min(self.weights, default=1) <= 0:
                raise TopoOptError("Background.weights needs one positive weight per link")
        if not self.links:
            raise TopoOptError("Background needs at least one link")
        if self.rate is not None and not self.rate > 0:
            raise TopoOptError(f"Background.rate = {self.rate!r}: must be > 0 bits/s or None")
        if not self.stop > self.start:
            raise TopoOptError("Background needs start < stop")
        if (self.on is None) != (self.off is None):
            raise TopoOptError("Background: give both on and off, or neither")
        if self.on is not None and self.off is not None and not (self.on > 0
                                                                 and self.off >= 0):
            raise TopoOptError("Background: on must be > 0 and off >= 0 seconds")

    def active(self, t: float) -> bool:
        """Whether the source sends at time ``t``."""
        if not self.start <= t < self.stop:
            return False
        if self.on is None or self.off is None:   # (they come together)
            return True
        return (t - self.start) % (self.on + self.off) < self.on


@dataclass(frozen=True)
class CapacityChange:
    """From ``time`` on, link ``link`` has ``capacity`` bits/s (a gray failure when
    lower than nominal, a repair when set back; 0 = down)."""

    time: float
    link: int
    capacity: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.capacity) and self.capacity >= 0):
            raise TopoOptError(f"CapacityChange.capacity = {self.capacity!r}: must be >= 0")
        if not math.isfinite(self.time):
            raise TopoOptError("CapacityChange.time must be finite")


def degrade(link: int, capacity: float, nominal: float, start: float = 0.0,
            stop: float = math.inf) -> tuple[CapacityChange, ...]:
    """A gray failure: ``link`` runs at ``capacity`` during ``[start, stop)``, then
    back at ``nominal``."""
    changes = [CapacityChange(start, link, capacity)]
    if math.isfinite(stop):
        changes.append(CapacityChange(stop, link, nominal))
    return tuple(changes)


@dataclass(frozen=True)
class CompiledWorkload:
    """A workload as flat arrays (what :func:`topoopt.netsim.simulate` runs).

    Node ids are shared by flows and tasks, in the order they were added.
    """

    nodes: int
    is_flow: np.ndarray        # (N,) bool
    local: np.ndarray          # (N,) index into the flow or the task arrays
    release: np.ndarray        # (N,) seconds
    flow_node: np.ndarray      # (F,)
    flow_size: np.ndarray      # (F,) bytes
    flow_latency: np.ndarray   # (F,) seconds; NaN = sum of weight x link latency
    routes: FlowRoutes         # (F rows)
    task_node: np.ndarray      # (T,)
    task_duration: np.ndarray  # (T,) seconds
    task_resource: np.ndarray  # (T,) int, NO_RESOURCE = none
    task_priority: np.ndarray  # (T,) float, lower first
    dep_before: np.ndarray     # (E,)
    dep_after: np.ndarray      # (E,)


class Workload:
    """A mutable set of flows and compute tasks with dependencies, built in bulk.

    Every ``add_*`` call returns node ids (ints, shared by flows and tasks, in the
    order added); dependencies refer to them. A node starts when all of its
    predecessors have finished and its release time has come:

    - a flow then transmits at its max-min fair rate until its bytes are sent,
      and finishes (is delivered) ``latency`` seconds later;
    - a task then waits for its resource (tasks on one resource run one at a time,
      lowest priority value first, ties by node id; ``NO_RESOURCE`` = never waits)
      and runs for its duration.

    Examples
    --------
    >>> w = Workload()
    >>> t = w.add_task(1e-3, resource=0)
    >>> f = w.add_flow(1e6, [0], after=[t])
    >>> w.nodes, w.flows, w.tasks
    (2, 1, 1)
    """

    def __init__(self) -> None:
        self._n = 0
        self._flow_chunks: list[tuple] = []
        self._task_chunks: list[tuple] = []
        self._deps: list[tuple[np.ndarray, np.ndarray]] = []
        self._nflows = 0
        self._ntasks = 0
        self._compiled: CompiledWorkload | None = None

    @property
    def nodes(self) -> int:
        """Flows plus tasks."""
        return self._n

    @property
    def flows(self) -> int:
        return self._nflows

    @property
    def tasks(self) -> int:
        return self._ntasks

    def _ids(self, count: int) -> np.ndarray:
        ids = np.arange(self._n, self._n + count, dtype=np.int64)
        self._n += count
        self._compiled = None
        return ids

    def add_flows(self, size, routes: FlowRoutes, *, release=0.0, latency=None) -> np.ndarray:
        """Add ``F`` flows at once.

        Parameters
        ----------
        size : array_like of float, shape (F,) or scalar
            Bytes.
        routes : FlowRoutes
            One row per flow (link ids of the network and weights).
        release : array_like of float or scalar
            Earliest start, seconds.
        latency : array_like of float or scalar, optional
            Seconds from the last byte sent to its delivery. Default (NaN): the
            weighted sum of the route's link latencies (the path latency for a
            single path, the mean over paths for ECMP).

        Returns
        -------
        ndarray of int64
            Node ids.
        """
        f = len(routes)
        size = np.broadcast_to(np.asarray(size, float), (f,)).copy()
        release = np.broadcast_to(np.asarray(release, float), (f,)).copy()
        lat = np.broadcast_to(np.asarray(np.nan if latency is None else latency, float),
                              (f,)).copy()
        ids = self._ids(f)
        self._flow_chunks.append((ids, size, release, lat, routes))
        self._nflows += f
        return ids

    def add_flow(self, size: float, links: Sequence[int], weights: Sequence[float] | None = None,
                 *, release: float = 0.0, latency: float | None = None,
                 after: Iterable[int] = ()) -> int:
        """Add one flow over ``links`` (weights default to 1); return its node id."""
        routes = FlowRoutes.from_lists([links], None if weights is None else [weights])
        node = int(self.add_flows(size, routes, release=release, latency=latency)[0])
        self.add_dependencies(list(after), node)
        return node

    def add_tasks(self, duration, resource, *, release=0.0, priority=None) -> np.ndarray:
        """Add ``T`` compute tasks at once.

        Parameters
        ----------
        duration : array_like of float
            Seconds.
        resource : array_like of int
            Resource id (e.g. the server whose GPUs run it), or ``NO_RESOURCE``.
        release : array_like of float or scalar
        priority : array_like of float, optional
            Order among ready tasks on one resource, lower first (default: node id).

        Returns
        -------
        ndarray of int64
            Node ids.
        """
        duration = np.atleast_1d(np.asarray(duration, float))
        t = duration.size
        resource = np.broadcast_to(np.asarray(resource, np.int64), (t,)).copy()
        release = np.broadcast_to(np.asarray(release, float), (t,)).copy()
        ids = self._ids(t)
        prio = (ids.astype(float) if priority is None
                else np.broadcast_to(np.asarray(priority, float), (t,)).copy())
        self._task_chunks.append((ids, duration.copy(), resource, release, prio))
        self._ntasks += t
        return ids

    def add_task(self, duration: float, resource: int | None = None, *, release: float = 0.0,
                 after: Iterable[int] = (), priority: float | None = None) -> int:
        """Add one task (``resource=None``: no resource); return its node id."""
        node = int(self.add_tasks([duration], NO_RESOURCE if resource is None else resource,
                                  release=release, priority=priority)[0])
        self.add_dependencies(list(after), node)
        return node

    def add_dependencies(self, before, after) -> None:
        """Node(s) ``after`` start only once node(s) ``before`` have finished.

        ``before`` and ``after`` are ids or arrays of ids, broadcast together (one
        node after many, many after one, or pairwise).
        """
        b = np.asarray(before, np.int64)
        a = np.asarray(after, np.int64)
        if b.size == 0 or a.size == 0:
            return
        b, a = np.broadcast_arrays(b, a)
        self._deps.append((b.ravel().copy(), a.ravel().copy()))
        self._compiled = None

    def compile(self) -> CompiledWorkload:
        """Flatten into arrays (cached until the workload changes)."""
        if self._compiled is not None:
            return self._compiled
        n = self._n
        is_flow = np.zeros(n, bool)
        local = np.zeros(n, np.int64)
        release = np.zeros(n)
        if self._flow_chunks:
            fid = np.concatenate([c[0] for c in self._flow_chunks])
            fsize = np.concatenate([c[1] for c in self._flow_chunks])
            frel = np.concatenate([c[2] for c in self._flow_chunks])
            flat = np.concatenate([c[3] for c in self._flow_chunks])
            routes = FlowRoutes.concat([c[4] for c in self._flow_chunks])
        else:
            fid = np.empty(0, np.int64)
            fsize = frel = flat = np.empty(0)
            routes = FlowRoutes.concat([])
        if self._task_chunks:
            tid = np.concatenate([c[0] for c in self._task_chunks])
            tdur = np.concatenate([c[1] for c in self._task_chunks])
            tres = np.concatenate([c[2] for c in self._task_chunks])
            trel = np.concatenate([c[3] for c in self._task_chunks])
            tprio = np.concatenate([c[4] for c in self._task_chunks])
        else:
            tid = np.empty(0, np.int64)
            tdur = trel = tprio = np.empty(0)
            tres = np.empty(0, np.int64)
        is_flow[fid] = True
        local[fid] = np.arange(fid.size)
        local[tid] = np.arange(tid.size)
        release[fid] = frel
        release[tid] = trel
        if self._deps:
            before = np.concatenate([d[0] for d in self._deps])
            after = np.concatenate([d[1] for d in self._deps])
        else:
            before = after = np.empty(0, np.int64)
        self._compiled = CompiledWorkload(n, is_flow, local, release, fid, fsize, flat, routes,
                                          tid, tdur, tres, tprio, before, after)
        return self._compiled


def check_workload(work: CompiledWorkload, links: int) -> None:
    """Raise :class:`TopoOptError` unless the compiled workload is well formed for a
    network of ``links`` links: sizes, durations and releases finite and >= 0,
    weights > 0, link ids in range, dependencies between existing distinct nodes."""
    r = work.routes
    if r.ptr.size != work.flow_size.size + 1 or r.ptr[0] != 0 or np.any(np.diff(r.ptr) < 0):
        raise TopoOptError("flow routes: ptr must start at 0, be non-decreasing, one row per flow")
    for name, arr in (("flow size", work.flow_size), ("task duration", work.task_duration),
                      ("release time", work.release)):
        bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
        if bad.size:
            raise TopoOptError(f"{name} #{bad[0]} = {arr[bad[0]]!r}: must be finite and >= 0")
    lat = work.flow_latency
    bad = np.flatnonzero(~np.isnan(lat) & ~((lat >= 0) & np.isfinite(lat)))
    if bad.size:
        raise TopoOptError(f"flow latency #{bad[0]} = {lat[bad[0]]!r}: must be >= 0")
    if r.link.size and (r.link.min() < 0 or r.link.max() >= links):
        raise TopoOptError(f"a flow route uses a link outside 0..{links - 1}")
    bad = np.flatnonzero(~(r.weight > 0) | ~np.isfinite(r.weight))
    if bad.size:
        raise TopoOptError(f"route weight {r.weight[bad[0]]!r}: weights must be finite and > 0")
    if work.task_resource.size and work.task_resource.min() < NO_RESOURCE:
        raise TopoOptError("task resources must be >= 0 (or NO_RESOURCE)")
    b, a = work.dep_before, work.dep_after
    if b.size:
        if min(b.min(), a.min()) < 0 or max(b.max(), a.max()) >= work.nodes:
            raise TopoOptError(f"a dependency names a node outside 0..{work.nodes - 1}")
        if np.any(b == a):
            raise TopoOptError(f"node {int(b[b == a][0])} depends on itself")
