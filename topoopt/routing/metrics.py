"""Topology quality: diameter, average path length, bandwidth tax and per-link load (TopoOpt §5.5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Container, Mapping

import numpy as np

from topoopt.routing.kshortest import UNREACHABLE, hop_distances, k_shortest_route_arrays
from topoopt.topology.topology import RouteArrays, Routes, Topology
from topoopt.traffic import Traffic

__all__ = ["TopologyMetrics", "topology_metrics", "link_loads", "route_traffic",
           "path_length_stats", "mp_link_time_bound"]


@dataclass(frozen=True)
class TopologyMetrics:
    """How well a topology and its routes carry one iteration's traffic.

    Attributes
    ----------
    diameter : float
        Largest hop count between two servers (inf if not strongly connected).
    average_path_length : float
        Mean hop count over all ordered server pairs (TopoOpt Figure 14).
    bandwidth_tax : float
        Bytes carried by all links, forwarding included, / bytes of logical demand.
    mp_hops : float
        MP bytes-weighted average hops of the routes MP takes.
    link_load : ndarray
        Bytes per link, aligned with ``topology.links`` (parallel links share evenly).
    """

    diameter: float
    average_path_length: float
    bandwidth_tax: float
    mp_hops: float
    link_load: np.ndarray = field(repr=False)

    @property
    def max_link_load(self) -> float:
        return float(self.link_load.max()) if self.link_load.size else 0.0

    @property
    def load_spread(self) -> float:
        """1 - least loaded / most loaded link (TopoOpt Figure 15 reads 39% / 59%)."""
        if not self.link_load.size or self.link_load.max() <= 0:
            return 0.0
        return float(1.0 - self.link_load.min() / self.link_load.max())


def path_length_stats(topology: Topology) -> tuple[float, float]:
    """``(diameter, average path length)`` over all ordered pairs of distinct servers."""
    d = hop_distances(topology)
    off = d[~np.eye(topology.servers, dtype=bool)]
    if off.size == 0:
        return 0.0, 0.0
    if np.any(off >= UNREACHABLE):
        return float("inf"), float("inf")
    return float(off.max()), float(off.mean())


def mp_link_time_bound(topology: Topology, mp: np.ndarray, dist: np.ndarray | None = None
                       ) -> float:
    """Seconds the links need at least to carry the MP bytes ``mp[u, v]``, however routed.

    Each byte from ``u`` to ``v`` crosses at least ``dist[u, v]`` links (the hop
    distance), and all the links together carry ``len(topology.links) x
    link_bandwidth`` bits per second, so no routing delivers them sooner than
    ``8 x sum(mp x dist) / (links x link_bandwidth)``. Any simulation that sends each
    pair's bytes over paths of links at rates within the links' capacities (the
    flow-level simulator's max-min rates) takes at least this long; known before any
    route is computed.

    Parameters
    ----------
    topology : Topology
    mp : ndarray
        ``n x n`` bytes (:attr:`topoopt.traffic.Traffic.mp`).
    dist : ndarray, optional
        :func:`~topoopt.routing.kshortest.hop_distances` of ``topology``, when known.

    Returns
    -------
    float
        0.0 without MP bytes; inf when a pair with bytes has no path.
    """
    mp = np.asarray(mp, np.float64)
    src, dst = np.nonzero(mp)
    if src.size == 0:
        return 0.0
    hops = (hop_distances(topology) if dist is None else dist)[src, dst]
    if np.any(hops >= UNREACHABLE) or not topology.links:
        return float("inf")
    bits = 8.0 * float(np.dot(mp[src, dst], hops.astype(np.float64)))
    return bits / (len(topology.links) * float(topology.link_bandwidth))


#: Hops handed to one accumulation call in :func:`link_loads` (bounds the memory).
_HOP_CHUNK = 1 << 22


def _demand_hops(arr: RouteArrays, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every hop the demand ``nbytes[i]`` of ``src[i] -> dst[i]`` takes, in demand order.

    Returns ``(u, v, weight, demand index)``: a routed pair's hops path by path with
    ``nbytes * fraction``, an unrouted pair's one hop ``src -> dst`` with ``nbytes``.
    """
    idx = arr.find(src, dst) if arr.pairs else np.full(src.size, -1)
    routed = np.flatnonzero(idx >= 0)
    sub = arr.take(idx[routed])
    path_w = nbytes[routed][sub.path_pair] * sub.fraction
    starts_hop = np.ones(sub.nodes.size, bool)
    starts_hop[sub.node_ptr[1:] - 1] = False
    at = np.flatnonzero(starts_hop)
    path_of_hop = np.repeat(np.arange(sub.fraction.size), np.diff(sub.node_ptr))[at]
    hop_demand = routed[sub.path_pair[path_of_hop]]
    # one slot per hop, demand after demand: a routed pair's hops, else its own hop
    count = np.ones(src.size, np.int64)
    count[routed] = np.bincount(hop_demand, minlength=src.size)[routed]
    offset = np.r_[0, np.cumsum(count)[:-1]]
    rank = np.arange(at.size) - np.r_[0, np.cumsum(count[routed])[:-1]].repeat(
        count[routed]) if at.size else np.zeros(0, np.int64)
    total = int(count.sum())
    u, v = np.empty(total, np.int64), np.empty(total, np.int64)
    w, dem = np.empty(total), np.empty(total, np.int64)
    slot = offset[hop_demand] + rank
    u[slot], v[slot], w[slot], dem[slot] = sub.nodes[at], sub.nodes[at + 1], \
        path_w[path_of_hop], hop_demand
    direct = np.flatnonzero(idx < 0)
    slot = offset[direct]
    u[slot], v[slot], w[slot], dem[slot] = src[direct], dst[direct], nbytes[direct], direct
    return u, v, w, dem


def link_loads(topology: Topology, matrix: np.ndarray, routes: Routes) -> np.ndarray:
    """Bytes per link when ``matrix[u, v]`` bytes go over ``routes[u, v]`` (else the link ``u->v``).

    Raises
    ------
    ValueError
        If a pair carries bytes, has no route and is not a link.

    Notes
    -----
    Vectorized over :meth:`~topoopt.topology.topology.Routes.arrays`; the bytes of
    each server pair are summed in the order of the pairs (row-major), their paths
    and hops, as a loop over the pairs would, so the loads are the same floats.
    """
    n = topology.servers
    src, dst = np.nonzero(matrix)
    nbytes = np.asarray(matrix, np.float64)[src, dst]
    arr = routes.arrays()
    flat_load = np.zeros(n * n)
    step = max(1, _HOP_CHUNK // max(1, arr.nodes.size // max(arr.pairs, 1)))
    for lo in range(0, src.size, step):
        u, v, w, _ = _demand_hops(arr, src[lo:lo + step], dst[lo:lo + step],
                                  nbytes[lo:lo + step])
        np.add.at(flat_load, u * n + v, w)  # in order: the same sums as one by one
    pair_load = flat_load.reshape(n, n)
    links = np.array([(a, b) for a, _, b, _ in topology.links], dtype=np.int64).reshape(-1, 2)
    mult = np.zeros((n, n))
    np.add.at(mult, (links[:, 0], links[:, 1]), 1.0)
    stray = (pair_load > 0) & (mult == 0)
    if stray.any():
        u, v = np.argwhere(stray)[0]
        raise ValueError(f"{u}->{v} carries bytes but is not a link and has no route")
    if not links.size:
        return np.zeros(0)
    return pair_load[links[:, 0], links[:, 1]] / mult[links[:, 0], links[:, 1]]


def _in(pairs, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Whether each ``(src[i], dst[i])`` is in ``pairs`` (Routes, a mapping or a container)."""
    arr = pairs.arrays() if isinstance(pairs, Routes) else getattr(pairs, "arrays", None)
    if not isinstance(arr, RouteArrays) and isinstance(pairs, Mapping):
        try:
            keys = np.array(list(pairs.keys()), np.int64).reshape(-1, 2)
            keys = np.unique(keys, axis=0)
            arr = RouteArrays(keys[:, 0], keys[:, 1], np.zeros(keys.shape[0] + 1),
                              np.zeros(1), np.zeros(0), np.zeros(0))
        except (TypeError, ValueError, OverflowError):
            arr = None
    if isinstance(arr, RouteArrays):
        return arr.find(src, dst) >= 0 if arr.pairs else np.zeros(src.size, bool)
    return np.fromiter(((s, t) in pairs for s, t in zip(src.tolist(), dst.tolist())), bool,
                       src.size)


def route_traffic(topology: Topology, traffic: Traffic, rings: Mapping | None = None,
                  k_paths: int = 4, max_extra_hops: int | None = 0,
                  skip: Container[tuple[int, int]] = ()) -> Routes:
    """Routes for a topology not built for the traffic (e.g. the Expander baseline).

    Each AllReduce group runs one ring in member order unless ``rings`` says
    otherwise; every MP pair and every ring hop that is not a link takes the k
    shortest paths (see :func:`~topoopt.routing.kshortest.k_shortest_routes`),
    except the pairs in ``skip`` (already routed; a :class:`Routes` is looked up
    vectorized).
    """
    n = topology.servers
    matrix = traffic.matrix(rings)
    direct = np.zeros((n, n), bool)
    for a, _, b, _ in topology.links:
        direct[a, b] = True
    src, dst = np.nonzero((traffic.mp != 0) | ((matrix != 0) & ~direct))
    if src.size and (isinstance(skip, (Routes, Mapping)) or skip):
        keep = ~_in(skip, src, dst)
        src, dst = src[keep], dst[keep]
    found = k_shortest_route_arrays(topology, src, dst, k_paths, max_extra_hops)
    # a pair that is a link but also carries MP bytes: ring bytes stay on the link
    ring = matrix[src, dst] - traffic.mp[src, dst]
    extra = {}
    for i in np.flatnonzero(direct[src, dst] & (ring > 0)).tolist():
        pair = (int(src[i]), int(dst[i]))
        ring_bytes = matrix[pair] - traffic.mp[pair]
        opts = found.entry(int(found.find([pair[0]], [pair[1]])[0]))
        agg = {p: f * traffic.mp[pair] for p, f in opts}
        agg[pair] = agg.get(pair, 0.0) + ring_bytes
        total = sum(agg.values())
        extra[pair] = tuple((p, b / total) for p, b in sorted(agg.items()))
    return Routes.from_arrays(found).merge(Routes(extra))


def topology_metrics(topology: Topology, traffic: Traffic, rings: Mapping | None = None,
                     routes: Routes | None = None) -> TopologyMetrics:
    """Diameter, average path length, bandwidth tax, MP hops and per-link load.

    Parameters
    ----------
    topology : Topology
    traffic : topoopt.traffic.Traffic
    rings : mapping, optional
        Ring orders per AllReduce group (TopologyPlan.rings); default member order.
    routes : Routes, optional
        Default :func:`route_traffic`.

    Returns
    -------
    TopologyMetrics

    Notes
    -----
    Logical demand is ``traffic.matrix(rings).sum()`` (each ring hop and MP byte
    counted once); carried is the sum of link loads, so the tax is the bytes-weighted
    mean number of hops (TopoOpt §5.5: 1.11 at d = 4 for DLRM at batch 64).
    """
    routes = route_traffic(topology, traffic, rings) if routes is None else routes
    matrix = traffic.matrix(rings)
    load = link_loads(topology, matrix, routes)
    demand = float(matrix.sum())
    tax = float(load.sum() / demand) if demand > 0 else 1.0
    src, dst = np.nonzero(traffic.mp)
    arr = routes.arrays()
    idx = arr.find(src, dst) if arr.pairs else np.full(src.size, -1)
    hops = np.ones(src.size)
    routed = np.flatnonzero(idx >= 0)
    sub = arr.take(idx[routed])
    # per pair, fraction x hops summed path by path; then over the pairs in order
    hops[routed] = np.bincount(sub.path_pair, weights=sub.fraction * (np.diff(sub.node_ptr) - 1),
                               minlength=routed.size)
    carried = np.cumsum(traffic.mp[src, dst] * hops)
    mp_carried = float(carried[-1]) if carried.size else 0.0
    mp_hops = mp_carried / traffic.mp_bytes if traffic.mp_bytes > 0 else 0.0
    diameter, apl = path_length_stats(topology)
    return TopologyMetrics(diameter, apl, tax, float(mp_hops), load)
