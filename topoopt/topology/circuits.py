"""Circuits of reconfigurable fabrics from a measured demand (TopoOpt §5.1, App. E.4, App. F).

A configuration is a matrix of circuit counts: ``counts[i, j]`` directed circuits of
one port's bandwidth from server ``i`` to server ``j``. Two schemes build one from
the traffic demand measured at a reconfiguration:

- :func:`ocs_circuits`, OCS-reconfig: ``d`` OCS ports per server, so at most ``d``
  circuits leave and ``d`` enter every server. A greedy heuristic serves the current
  demand with diminishing returns (each circuit already given to a pair halves what
  the pair asks for, as TopologyFinder's MP step does, §4 Step 3), then the idle ports
  are wired (keeping the previous circuits first, so an unchanged demand changes
  nothing) and the graph is made strongly connected (so forwarding always has a path).
- :func:`sip_ring_circuits`, SiP-ML's SiP-Ring: servers on a unidirectional fibre ring,
  ``d`` wavelengths per ring segment; a circuit ``i -> j`` occupies one wavelength on
  every segment from ``i`` to ``j`` clockwise. Wavelengths are given in proportion to
  the demand (the max-concurrent-flow optimum of the ring, rounded down) and the rest
  greedily to the pair that would take longest to drain.

TopoOpt's App. E.4 (OCS-reconfig) and App. F (SiP-ML) are not in the text this project
works from; what is implemented and why is said per function (§5.1: "we measure the
traffic demand every 50 ms and adjust the circuits based on a heuristic algorithm to
satisfy the current traffic demand as much as possible"). The authors' simulator
(docs/reference-data.md) allocates circuits greedily by halving demand and SiP-Ring
wavelengths by an LP with random rounding; here circuits are directed (an OCS joins a
port's transmitter to another port's receiver, as :class:`~topoopt.topology.Topology`
models them, so a one-way ring gets all d ports, as TopoOpt's permutations do; the
authors pair both directions) and the rounding is deterministic.
"""

from __future__ import annotations

import heapq

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from topoopt.errors import PlanCheckError
from topoopt.topology.topology import Topology

__all__ = ["ocs_circuits", "sip_ring_circuits", "circuit_topology", "check_circuits",
           "check_sip_ring", "ring_segment_load"]


def ocs_circuits(demand: np.ndarray, ports: int, previous: np.ndarray | None = None,
                 seed: int = 0) -> np.ndarray:
    """OCS-reconfig's circuits for the measured ``demand`` (TopoOpt §5.1, App. E.4).

    1. Serve the demand: candidates ``(i, j, k)`` for every pair with demand and
       ``k = 0..d-1`` are taken in decreasing order of ``demand[i, j] / 2**k`` (the
       pair's demand halved once per circuit it already has; ties by pair, then k), each
       accepted when ``i`` still has a free transmit port and ``j`` a free receive port.
       This is the greedy counterpart of TopologyFinder's repeated matchings with
       diminishing returns, and what the authors' simulator does.
    2. Wire the idle ports: first with ``previous`` circuits that fit (so an unchanged or
       absent demand keeps the configuration, and circuits not needed now stay up for
       what comes next), then idle transmitters to idle receivers in a seeded random
       order, never a server to itself.
    3. Make the graph strongly connected: while it is not, take a source component S and
       another, sink, component K of its condensation and swap the ends of two circuits, the
       least demanded ``x -> y`` inside K and ``p -> q`` into S, into ``x -> q`` and
       ``p -> y``; that merges S and K (every port is used, so both have such circuits).

    Parameters
    ----------
    demand : ndarray, shape (n, n)
        Bytes still to send from server i to server j (the diagonal is ignored).
    ports : int
        d, OCS ports per server.
    previous : ndarray of int, shape (n, n), optional
        The circuits in place.
    seed : int
        Seed of the wiring of idle ports.

    Returns
    -------
    ndarray of int64, shape (n, n)
        Circuit counts; every server uses all ``d`` transmit and receive ports (n >= 2).

    Examples
    --------
    >>> ring = np.roll(np.eye(4), 1, axis=1) * 1e6       # i -> i+1
    >>> c = ocs_circuits(ring, 2)
    >>> int(c[0, 1]), int(c[1, 2]), c.sum(axis=1).tolist()
    (2, 2, [2, 2, 2, 2])
    >>> bool((ocs_circuits(np.zeros((4, 4)), 2, previous=c) == c).all())
    True
    """
    demand = _square(demand, "demand")
    n = demand.shape[0]
    if ports < 1:
        raise PlanCheckError(f"ocs_circuits: ports = {ports}, need >= 1")
    counts = np.zeros((n, n), np.int64)
    if n < 2:
        return counts
    want = np.where(np.eye(n, dtype=bool), 0.0, np.maximum(demand, 0.0))
    out_free = np.full(n, ports, np.int64)
    in_free = np.full(n, ports, np.int64)
    _serve(want, ports, counts, out_free, in_free)
    if previous is not None:
        prev = _square(previous, "previous").astype(np.int64)
        i, j = np.nonzero((prev - counts > 0) & ~np.eye(n, dtype=bool))
        out_l, in_l = out_free.tolist(), in_free.tolist()
        for a, b, want_more in zip(i.tolist(), j.tolist(), (prev - counts)[i, j].tolist()):
            add = min(want_more, out_l[a], in_l[b])
            if add > 0:
                counts[a, b] += add
                out_l[a] -= add
                in_l[b] -= add
        out_free[:] = out_l
        in_free[:] = in_l
    _wire_idle(counts, out_free, in_free, want, np.random.default_rng(seed))
    _strongly_connect(counts, want)
    return counts


def _serve(want: np.ndarray, ports: int, counts: np.ndarray, out_free: np.ndarray,
           in_free: np.ndarray) -> None:
    """Step 1 of :func:`ocs_circuits`: the greedy with halving demand.

    Only the best ``4 n d`` candidates are sorted first (the greedy takes at most ``n d``);
    the others, all of a lower value, are sorted and scanned only if some of them could
    still be taken. Within a scan, candidates of servers whose ports are all taken are
    dropped chunk by chunk (they could only be refused).
    """
    n = want.shape[0]
    flat = want.ravel()
    pairs = np.flatnonzero(flat > 0)
    if pairs.size == 0:
        return
    # candidates in (pair, k) order, so a stable sort by value breaks ties as specified
    value = (flat[pairs][:, None] / 2.0 ** np.arange(ports)[None, :]).ravel()
    src = np.repeat(pairs // n, ports)
    dst = np.repeat(pairs % n, ports)
    top = np.ones(value.size, bool)
    m = 4 * n * ports
    if pairs.size > m:
        # the m-th largest first-circuit value is at most the m-th largest candidate, so
        # everything below it is below the best m (any threshold splits correctly)
        first = flat[pairs]
        top = value >= np.partition(first, first.size - m)[first.size - m]
    for part in (np.flatnonzero(top), np.flatnonzero(~top)):
        if part.size == 0 or not out_free.any():
            return
        part = part[(out_free[src[part]] > 0) & (in_free[dst[part]] > 0)]
        part = part[np.argsort(-value[part], kind="stable")]
        _scan(src[part], dst[part], counts, out_free, in_free)


def _scan(src: np.ndarray, dst: np.ndarray, counts: np.ndarray, out_free: np.ndarray,
          in_free: np.ndarray, chunk: int = 512) -> None:
    """Take candidates ``src[i] -> dst[i]`` in order while both ends have a free port."""
    out_l, in_l = out_free.tolist(), in_free.tolist()
    while src.size:
        for i, j in zip(src[:chunk].tolist(), dst[:chunk].tolist()):
            if out_l[i] and in_l[j]:
                out_l[i] -= 1
                in_l[j] -= 1
                counts[i, j] += 1
        out_free[:] = out_l
        in_free[:] = in_l
        src, dst = src[chunk:], dst[chunk:]
        live = (out_free[src] > 0) & (in_free[dst] > 0)
        src, dst = src[live], dst[live]


def _wire_idle(counts: np.ndarray, out_free: np.ndarray, in_free: np.ndarray,
               want: np.ndarray, rng: np.random.Generator) -> None:
    """Step 2 of :func:`ocs_circuits`: idle transmitters to idle receivers, no self-loop."""
    tx = np.repeat(np.arange(counts.shape[0]), out_free)
    rx = rng.permutation(np.repeat(np.arange(counts.shape[0]), in_free))
    out_free[:] = 0
    in_free[:] = 0
    for a in np.flatnonzero(tx == rx).tolist():       # a stub pair that would be a loop
        ok = np.flatnonzero((tx != rx[a]) & (rx != tx[a]))
        if ok.size:
            b = int(ok[0])
            rx[a], rx[b] = rx[b], rx[a]
    for i, j in zip(tx.tolist(), rx.tolist()):
        if i != j:
            counts[i, j] += 1
            continue
        # Only server i has idle ports left: split the least demanded circuit a -> b
        # (a, b != i) into a -> i and i -> b.
        cand = counts.copy()
        cand[i, :] = 0
        cand[:, i] = 0
        a, b = _least_demanded(cand, want)
        counts[a, b] -= 1
        counts[a, i] += 1
        counts[i, b] += 1


def _least_demanded(candidates: np.ndarray, want: np.ndarray) -> tuple[int, int]:
    """The pair with circuits in ``candidates`` whose demand per circuit is least
    (ties: lowest pair index)."""
    has = np.flatnonzero(candidates.ravel() > 0)
    per = want.ravel()[has] / candidates.ravel()[has]
    pick = int(has[np.argmin(per)])
    n = candidates.shape[0]
    return pick // n, pick % n


def _strongly_connect(counts: np.ndarray, want: np.ndarray) -> None:
    """Step 3 of :func:`ocs_circuits`: swap circuit ends until one strong component.

    Each round pairs sources with sinks of the condensation, every component in at most
    one pair, and swaps one circuit end per pair (each swap merges its pair; they touch
    disjoint components, so they do not interfere).
    """
    n = counts.shape[0]
    for _ in range(n):
        a, b = np.nonzero(counts)
        graph = csr_matrix((np.ones(a.size), (a, b)), shape=(n, n))
        k, label = connected_components(graph, directed=True, connection="strong")
        if k == 1:
            return
        cross = label[a] != label[b]
        has_in = np.zeros(k, bool)
        has_out = np.zeros(k, bool)
        has_in[label[b[cross]]] = True
        has_out[label[a[cross]]] = True
        sources = np.flatnonzero(~has_in).tolist()
        sinks = np.flatnonzero(~has_out).tolist()
        used: set[int] = set()
        pairs = []
        for src_comp in sources:
            if src_comp in used:
                continue
            sink = next((c for c in sinks if c != src_comp and c not in used), None)
            if sink is None:
                break
            used.update((src_comp, sink))
            pairs.append((src_comp, sink))
        w = want[a, b] / counts[a, b]
        order = np.lexsort((a * n + b, w))                 # least demanded first
        la, lb = label[a[order]], label[b[order]]
        for src_comp, sink in pairs:
            inside = np.flatnonzero((la == sink) & (lb == sink))[0]
            into = np.flatnonzero(lb == src_comp)[0]
            x, y = int(a[order[inside]]), int(b[order[inside]])
            p_, q = int(a[order[into]]), int(b[order[into]])
            counts[x, y] -= 1
            counts[p_, q] -= 1
            counts[x, q] += 1
            counts[p_, y] += 1
    raise PlanCheckError("ocs_circuits: could not make the circuits strongly connected")


def ring_segment_load(counts: np.ndarray) -> np.ndarray:
    """Per segment ``s -> s+1 (mod n)`` of a unidirectional ring, the sum of ``counts[i,
    j]`` over the pairs whose clockwise arc from ``i`` to ``j`` crosses it.

    Examples
    --------
    >>> c = np.zeros((4, 4)); c[0, 2] = 1; c[3, 1] = 2      # 0->1->2 and 3->0->1
    >>> ring_segment_load(c).tolist()
    [3.0, 1.0, 0.0, 2.0]
    """
    counts = _square(counts, "counts")
    n = counts.shape[0]
    i, j = np.nonzero(counts)
    w = counts[i, j].astype(float)
    length = (j - i) % n
    diff = np.zeros(2 * n + 1)
    np.add.at(diff, i, w)
    np.add.at(diff, i + length, -w)
    line = np.cumsum(diff)[:2 * n]
    return line[:n] + line[n:]


def sip_ring_circuits(demand: np.ndarray, wavelengths: int,
                      previous: np.ndarray | None = None) -> np.ndarray:
    """SiP-ML's SiP-Ring wavelength allocation for the measured ``demand`` (TopoOpt App. F).

    Servers sit on a unidirectional ring in id order; each ring segment carries
    ``wavelengths`` (d) wavelengths of one port's bandwidth, and a circuit ``i -> j``
    holds one wavelength on each segment of its clockwise arc (so a server sends and
    receives at most d circuits; no forwarding). As in the authors' simulator, the
    allocation is a linear program rounded to integers:

    1. the LP -- every pair with demand gets ``x[i, j] = lam * demand[i, j]`` wavelengths,
       the largest ``lam`` that keeps every segment within d (max concurrent flow: all
       pairs drain together) -- has the closed form ``lam = d / max_s load_s``;
    2. ``x`` is rounded down, then wavelengths are added one at a time to the pair that
       would take longest to drain (none first, then the largest demand per wavelength)
       while its arc has a free wavelength on every segment;
    3. wavelengths still free keep ``previous`` circuits that fit (pair order), so what is
       not needed now is not torn down.

    Parameters
    ----------
    demand : ndarray, shape (n, n)
        Bytes still to send from i to j.
    wavelengths : int
        d.
    previous : ndarray of int, shape (n, n), optional
        The circuits in place.

    Returns
    -------
    ndarray of int64, shape (n, n)

    Examples
    --------
    >>> ring = np.roll(np.eye(4), 1, axis=1) * 1e6            # i -> i+1: arcs of 1 segment
    >>> sip_ring_circuits(ring, 2)[[0, 1, 2, 3], [1, 2, 3, 0]].tolist()
    [2, 2, 2, 2]
    >>> far = np.zeros((4, 4)); far[0, 3] = far[1, 0] = 1e6   # arcs 0..3 and 1..0 overlap
    >>> c = sip_ring_circuits(far, 2)                         # on segments 1->2 and 2->3
    >>> int(c[0, 3]), int(c[1, 0]), ring_segment_load(c).tolist()
    (1, 1, [1.0, 2.0, 2.0, 1.0])
    """
    demand = _square(demand, "demand")
    n = demand.shape[0]
    if wavelengths < 1:
        raise PlanCheckError(f"sip_ring_circuits: wavelengths = {wavelengths}, need >= 1")
    counts = np.zeros((n, n), np.int64)
    want = np.where(np.eye(n, dtype=bool), 0.0, np.maximum(demand, 0.0))
    if n < 2:
        return counts
    free = np.full(n, float(wavelengths))
    if want.any():
        lam = wavelengths / ring_segment_load(want).max()
        counts[:] = np.floor(lam * want * (1 + 1e-12))
        free -= ring_segment_load(counts)
        _top_up(want, counts, free)
    if previous is not None:
        prev = _square(previous, "previous").astype(np.int64)
        for a, b in zip(*np.nonzero(prev - counts > 0)):
            for _ in range(int(prev[a, b] - counts[a, b])):
                if a == b or not _take_arc(free, int(a), int(b), n):
                    break
                counts[a, b] += 1
    return counts


def _top_up(want: np.ndarray, counts: np.ndarray, free: np.ndarray) -> None:
    """Step 2 of :func:`sip_ring_circuits` (in place): one wavelength at a time to the
    pair that would drain last, while its arc has a free wavelength on every segment.

    Pairs are kept in one sorted array (their first turn) plus a heap (the turns after a
    wavelength was added); a pair whose arc crosses a full segment is dropped for good
    (loads only grow), all such pairs at once when a segment fills up.
    """
    n = want.shape[0]
    a, b = np.nonzero(want)
    length = (b - a) % n
    demand = want[a, b]
    have = counts[a, b]
    group = (have > 0).astype(np.int64)               # pairs without a wavelength first
    value = np.where(have > 0, -demand / np.maximum(have, 1), -demand)
    order = np.lexsort((np.arange(a.size), value, group)).tolist()
    alive = np.ones(a.size, bool)

    def close(segments: np.ndarray) -> None:
        for s in segments.tolist():
            alive[((s - a) % n) < length] = False

    close(np.flatnonzero(free < 1))
    fresh = np.ones(a.size, bool)                     # its entry in ``order`` still holds
    heap: list[tuple[int, float, int]] = []
    ptr, end = 0, len(order)
    group_l, value_l = group.tolist(), value.tolist()
    while True:
        while ptr < end and not (alive[order[ptr]] and fresh[order[ptr]]):
            ptr += 1
        while heap and not alive[heap[0][2]]:
            heapq.heappop(heap)
        if ptr < end and (not heap or (group_l[order[ptr]], value_l[order[ptr]], order[ptr])
                          < heap[0]):
            e = order[ptr]
            ptr += 1
        elif heap:
            e = heapq.heappop(heap)[2]
        else:
            return
        arc = (a[e] + np.arange(length[e])) % n
        free[arc] -= 1
        counts[a[e], b[e]] += 1
        fresh[e] = False
        heapq.heappush(heap, (1, -demand[e] / counts[a[e], b[e]], e))
        full = arc[free[arc] < 1]
        if full.size:
            close(full)


def _take_arc(free: np.ndarray, a: int, b: int, n: int) -> bool:
    """Take one wavelength on every segment of the arc a -> b if each has one free."""
    arc = (a + np.arange((b - a) % n)) % n
    if free[arc].min() < 1:
        return False
    free[arc] -= 1
    return True


def circuit_topology(counts: np.ndarray, ports: int, link_bandwidth: float,
                     link_latency: float = 1e-6, label: str = "circuit") -> Topology:
    """A :class:`~topoopt.topology.Topology` of the circuits: ``counts[i, j]`` links
    ``i -> j``, on ports numbered in pair order at each end.

    Examples
    --------
    >>> t = circuit_topology(np.array([[0, 2], [1, 0]]), 2, 100e9)
    >>> t.links
    ((0, 0, 1, 0), (0, 1, 1, 1), (1, 0, 0, 0))
    """
    check_circuits(counts, ports)
    n = counts.shape[0]
    flat = counts.ravel()
    pair = np.repeat(np.arange(flat.size), flat)
    src, dst = pair // n, pair % n
    out_port = _rank_within(src)
    order = np.argsort(dst, kind="stable")
    in_port = np.empty_like(out_port)
    in_port[order] = _rank_within(dst[order])
    links = tuple(zip(src.tolist(), out_port.tolist(), dst.tolist(), in_port.tolist()))
    return Topology(n, ports, links, float(link_bandwidth), float(link_latency),
                    (label,) * len(links))


def _rank_within(sorted_keys: np.ndarray) -> np.ndarray:
    """0, 1, 2... within each run of equal keys of a sorted array."""
    if sorted_keys.size == 0:
        return sorted_keys.copy()
    start = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    run = np.diff(np.r_[start, sorted_keys.size])
    return np.arange(sorted_keys.size) - np.repeat(start, run)


def check_circuits(counts: np.ndarray, ports: int) -> None:
    """Raise :class:`PlanCheckError` unless ``counts`` is an OCS configuration: square,
    integral, >= 0, no circuit from a server to itself, at most ``ports`` circuits
    leaving and entering each server."""
    counts = _square(counts, "circuit counts")
    if np.any(counts < 0) or np.any(counts != np.round(counts)):
        raise PlanCheckError("circuit counts must be integers >= 0")
    if np.any(np.diag(counts) != 0):
        raise PlanCheckError(f"server {int(np.flatnonzero(np.diag(counts))[0])} has a circuit "
                             "to itself")
    for axis, what in ((1, "leave"), (0, "enter")):
        deg = counts.sum(axis=axis)
        if np.any(deg > ports):
            s = int(np.flatnonzero(deg > ports)[0])
            raise PlanCheckError(f"{int(deg[s])} circuits {what} server {s}; it has {ports} "
                                 "ports")


def check_sip_ring(counts: np.ndarray, wavelengths: int) -> None:
    """Raise :class:`PlanCheckError` unless ``counts`` is a SiP-Ring allocation: an OCS
    configuration (:func:`check_circuits`) whose clockwise arcs use at most
    ``wavelengths`` wavelengths on every ring segment."""
    check_circuits(counts, wavelengths)
    load = ring_segment_load(counts)
    if np.any(load > wavelengths):
        s = int(np.argmax(load))
        raise PlanCheckError(f"ring segment {s} -> {(s + 1) % counts.shape[0]} carries "
                             f"{int(load[s])} wavelengths; it has {wavelengths}")


def _square(matrix: np.ndarray, what: str) -> np.ndarray:
    m = np.asarray(matrix)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise PlanCheckError(f"{what} must be a square (n, n) matrix, got shape {m.shape}")
    return m
