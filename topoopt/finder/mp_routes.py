"""TopologyFinder's Step 4b: the MP pairs' routes, merged with the ring hops' (TopoOpt §4).

Split from :mod:`~topoopt.finder.topology_finder`, which calls it once the topology
of Steps 1-3 and its hop distances are known.
"""

from __future__ import annotations

import numpy as np

from topoopt.routing.kshortest import (
    k_shortest_paths,
    k_shortest_route_arrays,
    k_shortest_routes,
    neighbour_table,
    paths_to_arrays,
)
from topoopt.routing.lp import min_max_load_route_arrays, min_max_load_routes
from topoopt.topology.topology import RouteArrays, Routes, Topology
from topoopt.traffic import Traffic

__all__: list[str] = []

Path = tuple[int, ...]
#: (src, dst) -> [(path, bytes)]
Contribs = dict[tuple[int, int], list[tuple[Path, float]]]


def _merge(contribs: list[tuple[Path, float]]) -> tuple[tuple[Path, float], ...]:
    agg: dict[Path, float] = {}
    for path, nbytes in contribs:
        agg[path] = agg.get(path, 0.0) + nbytes
    total = sum(agg.values())
    if total <= 0:
        return tuple((p, 1.0 / len(agg)) for p in sorted(agg))
    return tuple((p, v / total) for p, v in sorted(agg.items()) if v > 0)


def _mp_routes_reference(traffic: Traffic, topo: Topology, dist: np.ndarray,
                         direct: set[tuple[int, int]], contribs: Contribs, routing: str,
                         k_paths: int, max_extra_hops: int | None
                         ) -> tuple[Routes, float | None]:
    """Step 4b with a tuple per path (kept as the reference for :func:`_mp_routes`)."""
    src, dst = np.nonzero(traffic.mp)
    mp_pairs = {(int(s), int(t)): float(traffic.mp[s, t]) for s, t in zip(src, dst)}
    mp_max_load = None
    if routing == "lp" and mp_pairs:
        nbr = [[int(v) for v in row if v >= 0] for row in neighbour_table(topo)]
        cands = {pair: k_shortest_paths(nbr, dist, pair[0], pair[1], k_paths, 2)
                 for pair in mp_pairs}
        mp_routes, mp_max_load = min_max_load_routes(topo, mp_pairs, cands,
                                                     method="reference")
    else:
        mp_routes = k_shortest_routes(topo, mp_pairs, k_paths, max_extra_hops, dist=dist)
    # a pair with both ring and MP bytes splits its total by bytes; MP-only pairs as routed
    merged = dict(mp_routes)
    for pair, parts in contribs.items():
        if pair in mp_routes:
            parts = parts + [(p, mp_pairs[pair] * f) for p, f in mp_routes[pair]]
        elif pair in direct:
            continue
        merged[pair] = _merge(parts)
    return Routes(merged), mp_max_load


def _mp_routes(traffic: Traffic, topo: Topology, dist: np.ndarray,
               direct: set[tuple[int, int]], contribs: Contribs, routing: str, k_paths: int,
               max_extra_hops: int | None) -> tuple[Routes, float | None]:
    """Step 4b on arrays: MP routes stay :class:`RouteArrays`; only the few pairs that
    also carry ring bytes are merged as tuples. Equal to :func:`_mp_routes_reference`
    (for the LP: the same optimum)."""
    mp = traffic.mp
    src, dst = np.nonzero(mp)
    mp_max_load = None
    if routing == "lp" and src.size:
        nbr = [[int(v) for v in row if v >= 0] for row in neighbour_table(topo)]
        path_ptr, node_ptr, nodes = paths_to_arrays(
            k_shortest_paths(nbr, dist, s, t, k_paths, 2)
            for s, t in zip(src.tolist(), dst.tolist()))
        cands = RouteArrays(src, dst, path_ptr, node_ptr, nodes, np.ones(node_ptr.size - 1))
        mp_arr, mp_max_load = min_max_load_route_arrays(topo, cands, mp[src, dst])
    else:
        mp_arr = k_shortest_route_arrays(topo, src, dst, k_paths, max_extra_hops, dist=dist)
    merged = {}
    for pair, parts in contribs.items():
        if mp[pair] > 0:
            i = int(mp_arr.find([pair[0]], [pair[1]])[0])
            nbytes = float(mp[pair])
            parts = parts + [(p, nbytes * f) for p, f in mp_arr.entry(i)]
        elif pair in direct:
            continue
        merged[pair] = _merge(parts)
    return Routes.from_arrays(mp_arr).merge(Routes(merged)), mp_max_load
