"""Topology quality: diameter, average path length, bandwidth tax and per-link load (TopoOpt §5.5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Container, Mapping

import numpy as np

from topoopt.routing.kshortest import UNREACHABLE, hop_distances, k_shortest_routes
from topoopt.topology.topology import Routes, Topology

__all__ = ["TopologyMetrics", "topology_metrics", "link_loads", "route_traffic",
           "path_length_stats"]


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


def link_loads(topology: Topology, matrix: np.ndarray, routes: Routes) -> np.ndarray:
    """Bytes per link when ``matrix[u, v]`` bytes go over ``routes[u, v]`` (else the link ``u->v``).

    Raises
    ------
    ValueError
        If a pair carries bytes, has no route and is not a link.
    """
    n = topology.servers
    pair_load = np.zeros((n, n))
    src, dst = np.nonzero(matrix)
    for u, v in zip(src.tolist(), dst.tolist()):
        nbytes = float(matrix[u, v])
        if (u, v) in routes:
            for path, frac in routes[u, v]:
                p = np.asarray(path)
                np.add.at(pair_load, (p[:-1], p[1:]), nbytes * frac)
        else:
            pair_load[u, v] += nbytes
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


def route_traffic(topology: Topology, traffic, rings: Mapping | None = None,
                  k_paths: int = 4, max_extra_hops: int | None = 0,
                  skip: Container[tuple[int, int]] = ()) -> Routes:
    """Routes for a topology not built for the traffic (e.g. the Expander baseline).

    Each AllReduce group runs one ring in member order unless ``rings`` says
    otherwise; every MP pair and every ring hop that is not a link takes the k
    shortest paths (see :func:`~topoopt.routing.kshortest.k_shortest_routes`),
    except the pairs in ``skip`` (already routed).
    """
    matrix = traffic.matrix(rings)
    direct = {(a, b) for a, _, b, _ in topology.links}
    need = {(int(u), int(v)) for u, v in zip(*np.nonzero(traffic.mp))}
    need |= {(int(u), int(v)) for u, v in zip(*np.nonzero(matrix)) if (u, v) not in direct}
    need = {pair for pair in need if pair not in skip}
    found = k_shortest_routes(topology, need, k_paths, max_extra_hops)
    # a pair that is a link but also carries MP bytes: ring bytes stay on the link
    out = {}
    for pair, opts in found.items():
        ring_bytes = matrix[pair] - traffic.mp[pair]
        if pair in direct and ring_bytes > 0:
            agg = {p: f * traffic.mp[pair] for p, f in opts}
            agg[pair] = agg.get(pair, 0.0) + ring_bytes
            total = sum(agg.values())
            out[pair] = tuple((p, b / total) for p, b in sorted(agg.items()))
        else:
            out[pair] = opts
    return Routes(out)


def topology_metrics(topology: Topology, traffic, rings: Mapping | None = None,
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
    mp_carried = 0.0
    for u, v in zip(*np.nonzero(traffic.mp)):
        hops = sum(f * (len(p) - 1) for p, f in routes[int(u), int(v)]) \
            if (int(u), int(v)) in routes else 1.0
        mp_carried += traffic.mp[u, v] * hops
    mp_hops = mp_carried / traffic.mp_bytes if traffic.mp_bytes > 0 else 0.0
    diameter, apl = path_length_stats(topology)
    return TopologyMetrics(diameter, apl, tax, float(mp_hops), load)
