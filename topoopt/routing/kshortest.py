"""k-shortest simple paths on an unweighted directed topology, and MP routes split across them."""

from __future__ import annotations

from itertools import islice
from typing import Iterable, Iterator

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from topoopt.topology.topology import RouteArrays, Topology

__all__ = ["UNREACHABLE", "hop_distances", "neighbour_table", "k_shortest_paths",
           "equal_cost_paths", "equal_cost_path_arrays", "k_shortest_routes",
           "k_shortest_route_arrays", "paths_to_arrays"]

#: Hop distance stored for unreachable pairs.
UNREACHABLE = np.iinfo(np.int32).max // 2


def _adjacency(topology: Topology) -> csr_matrix:
    n = topology.servers
    if not topology.links:
        return csr_matrix((n, n))
    a = np.array([(l[0], l[2]) for l in topology.links], dtype=np.int64)
    m = csr_matrix((np.ones(len(a)), (a[:, 0], a[:, 1])), shape=(n, n))
    m.data[:] = 1.0  # parallel links are one hop
    return m


def hop_distances(topology: Topology) -> np.ndarray:
    """All-pairs hop counts (BFS from every server); ``UNREACHABLE`` where no path exists."""
    d = shortest_path(_adjacency(topology), method="D", unweighted=True, directed=True)
    d[np.isinf(d)] = UNREACHABLE
    return d.astype(np.int32)


def neighbour_table(topology: Topology) -> np.ndarray:
    """``(n, w)`` distinct out-neighbours of every server, ascending, padded with -1."""
    adj = _adjacency(topology)
    adj.sort_indices()
    n = topology.servers
    counts = np.diff(adj.indptr)
    w = int(counts.max()) if n else 0
    table = np.full((n, max(w, 1)), -1, dtype=np.int64)
    rows = np.repeat(np.arange(n), counts)
    cols = np.arange(adj.indices.size) - np.repeat(adj.indptr[:-1], counts)
    table[rows, cols] = adj.indices
    return table


def k_shortest_paths(neighbours: np.ndarray | list[list[int]], dist: np.ndarray,
                     source: int, target: int,
                     k: int, max_extra_hops: int | None = None) -> list[tuple[int, ...]]:
    """The ``k`` shortest simple paths from ``source`` to ``target``, shortest first.

    Parameters
    ----------
    neighbours : ndarray or list of list of int
        :func:`neighbour_table` of the topology, or its rows without the padding
        (faster when called for many pairs).
    dist : ndarray
        :func:`hop_distances` of the topology (the column of ``target`` is used as an
        exact lower bound on the hops left).
    source, target : int
    k : int
    max_extra_hops : int or None
        Ignore paths more than this many hops longer than the shortest (None = none
        ignored: the same lengths as networkx's ``shortest_simple_paths``).

    Returns
    -------
    list of tuple of int
        Node paths, ascending length; fewer than ``k`` when fewer exist.

    Notes
    -----
    Iterative deepening on the path length ``L``: a depth-first search that only
    steps to ``v`` when ``hops so far + 1 + dist[v, target] <= L`` enumerates the
    simple paths of length exactly ``L`` without ever straying off them by more than
    the simple-path constraint, so the cost is proportional to the paths produced,
    not to the graph (unlike Yen's algorithm, which reruns a shortest-path search for
    every spur node). Equal-length paths come in lexicographic order of their nodes.

    Examples
    --------
    >>> from topoopt.topology.topology import Topology
    >>> t = Topology(4, 2, ((0, 0, 1, 0), (1, 0, 2, 0), (2, 0, 3, 0), (3, 0, 0, 0),
    ...                     (0, 1, 2, 1), (2, 1, 0, 1)), 1e9)
    >>> k_shortest_paths(neighbour_table(t), hop_distances(t), 0, 3, 3)
    [(0, 2, 3), (0, 1, 2, 3)]
    """
    if source == target:
        raise ValueError("source and target must differ")
    dt = dist[:, target]
    base = int(dt[source])
    if base >= UNREACHABLE:
        return []
    n = dist.shape[0]
    top = n - 1 if max_extra_hops is None else min(n - 1, base + max_extra_hops)
    succ = [[int(v) for v in row if v >= 0] for row in neighbours] \
        if not isinstance(neighbours, list) else neighbours
    dtl = dt.tolist()
    found: list[tuple[int, ...]] = []
    for length in range(base, top + 1):
        path, on_path = [source], {source}
        stack = [(0, iter(succ[source]))]
        while stack and len(found) < k:
            hops, it = stack[-1]
            v = next(it, None)
            if v is None:  # frame exhausted: backtrack
                stack.pop()
                if len(path) > 1:
                    on_path.discard(path.pop())
                continue
            if v == target:
                if hops + 1 == length:
                    found.append(tuple(path) + (target,))
                continue
            if v in on_path or hops + 1 + dtl[v] > length:
                continue
            path.append(v)
            on_path.add(v)
            stack.append((hops + 1, iter(succ[v])))
        if len(found) >= k:
            break
    return found


def equal_cost_paths(neighbours: np.ndarray, dist: np.ndarray, sources: np.ndarray,
                     targets: np.ndarray, k: int, chunk: int = 65536
                     ) -> dict[tuple[int, int], list[tuple[int, ...]]]:
    """Up to ``k`` shortest paths per pair, all of the minimal length, vectorized.

    Walks the shortest-path DAG toward each target level by level for all pairs at
    once (a step ``u -> v`` is kept when ``dist[v, t] = dist[u, t] - 1``), keeping
    at most ``k`` partial paths per pair; every DAG walk reaches its target, so the
    result is exactly ``min(k, number of shortest paths)`` paths per pair, and
    every one is simple. Pairs must be reachable and distinct.
    """
    out: dict[tuple[int, int], list[tuple[int, ...]]] = {}
    sources = np.asarray(sources, dtype=np.int64)
    targets = np.asarray(targets, dtype=np.int64)
    for lo in range(0, sources.size, chunk):
        src, dst = sources[lo:lo + chunk], targets[lo:lo + chunk]
        if np.any(dist[src, dst] >= UNREACHABLE) or np.any(src == dst):
            raise ValueError("every pair must be distinct and reachable")
        pair = np.arange(src.size)
        cur = src.copy()
        paths = src[:, None]
        while pair.size:
            tt = dst[pair]
            cand = neighbours[cur]
            want = (dist[cur, tt] - 1)[:, None]
            ok = (cand >= 0) & (dist[np.maximum(cand, 0), tt[:, None]] == want)
            r, c = np.nonzero(ok)
            newpair = pair[r]
            starts = np.flatnonzero(np.r_[True, newpair[1:] != newpair[:-1]])
            rank = np.arange(newpair.size) - np.repeat(starts, np.diff(np.r_[starts,
                                                                             newpair.size]))
            keep = rank < k
            r, c, pair = r[keep], c[keep], newpair[keep]
            cur = cand[r, c]
            paths = np.concatenate([paths[r], cur[:, None]], axis=1)
            done = cur == dst[pair]
            if done.any():
                rows = list(map(tuple, paths[done].tolist()))
                ids = pair[done]  # ascending: a pair's paths are contiguous
                first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]).tolist()
                keys = zip(src[ids[first]].tolist(), dst[ids[first]].tolist())
                for key, a, b in zip(keys, first, first[1:] + [len(rows)]):
                    out[key] = rows[a:b]
                pair, cur, paths = pair[~done], cur[~done], paths[~done]
    return out


def equal_cost_path_arrays(neighbours: np.ndarray, dist: np.ndarray, sources: np.ndarray,
                           targets: np.ndarray, k: int, chunk: int = 65536
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`equal_cost_paths` in compressed form: the same paths, in the same order.

    Parameters
    ----------
    neighbours, dist, sources, targets, k, chunk
        As for :func:`equal_cost_paths`.

    Returns
    -------
    path_ptr : ndarray of int64, shape (m + 1,)
        Paths of input pair ``i``: ``path_ptr[i]:path_ptr[i + 1]``.
    node_ptr : ndarray of int64, shape (P + 1,)
    nodes : ndarray of int32

    Notes
    -----
    The same level-by-level walk of the shortest-path DAG, so pair ``i`` gets its
    first ``min(k, #shortest paths)`` shortest paths in lexicographic order, but the
    finished paths stay in arrays (one block per walk length) and are put in pair
    order by one gather, instead of becoming a dict of tuples.

    Examples
    --------
    >>> from topoopt.topology.topology import Topology
    >>> t = Topology(4, 2, ((0, 0, 1, 0), (1, 0, 3, 0), (0, 1, 2, 0), (2, 0, 3, 1)), 1e9)
    >>> pp, np_, nodes = equal_cost_path_arrays(neighbour_table(t), hop_distances(t),
    ...                                         np.array([0]), np.array([3]), 4)
    >>> pp.tolist(), nodes.tolist()
    ([0, 2], [0, 1, 3, 0, 2, 3])
    """
    sources = np.asarray(sources, dtype=np.int64)
    targets = np.asarray(targets, dtype=np.int64)
    n, m = dist.shape[0], sources.size
    if neighbours.shape[1] > 64:
        raise ValueError(f"at most 64 neighbours per server, got {neighbours.shape[1]}")
    dist32 = np.asarray(dist, np.int32)
    on = _dag_steps(neighbours, dist32)
    itype = np.int32 if n * n < 2**31 else np.int64
    succ = np.where(neighbours >= 0, neighbours, 0).astype(itype)
    ids, blocks = [], []  # per finished block: pair ids (ascending), paths (rows)
    for lo in range(0, m, chunk):
        src, dst = sources[lo:lo + chunk], targets[lo:lo + chunk]
        left = dist32[src, dst]
        if np.any(left >= UNREACHABLE) or np.any(src == dst):
            raise ValueError("every pair must be distinct and reachable")
        for pair, path in _walk_dag(on, succ, src, dst, left, k):
            ids.append(pair + lo)
            blocks.append(path)
    return _gather_paths(ids, blocks, m)


def _dag_steps(neighbours: np.ndarray, dist32: np.ndarray) -> np.ndarray:
    """The shortest-path DAG as bits: bit ``j`` of ``on[u * n + t]`` is set when
    neighbour slot ``j`` of ``u`` is one hop closer to ``t`` (a DAG step toward ``t``).

    The narrowest unsigned type with a bit per neighbour slot (at most 64)."""
    n, w = dist32.shape[0], neighbours.shape[1]
    bits = next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64)
                if np.iinfo(t).bits >= w)
    on = np.zeros((n, n), bits)
    for j in range(w):
        nb = neighbours[:, j]
        has = nb >= 0
        step = np.zeros((n, n), bool)
        step[has] = dist32[nb[has]] == dist32[has] - 1
        on |= np.left_shift(step.astype(bits), bits(j))
    return on.ravel()


def _walk_dag(on: np.ndarray, succ: np.ndarray, src: np.ndarray, dst: np.ndarray,
              left: np.ndarray, k: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Walk the shortest-path DAG (:func:`_dag_steps`) from every ``src[i]`` toward
    ``dst[i]``, ``left[i]`` hops away, keeping each pair's first ``k`` partial paths.

    Yields ``(pairs, paths)`` for each walk length at which some pairs finish: their
    indices into ``src`` (ascending, a pair's paths contiguous) and their paths, one
    row of nodes each.
    """
    n, w = succ.shape
    shifts = np.arange(w, dtype=on.dtype)
    one = on.dtype.type(1)
    pair = np.arange(src.size)
    cur, tt = src.astype(succ.dtype), dst.astype(succ.dtype)
    # rows of each level: their node and their parent row in the level before
    level_node = [cur]
    level_parent = [np.empty(0, np.int64)]  # level 0 has no parents
    while pair.size:
        ok = ((on[cur * n + tt][:, None] >> shifts) & one).astype(bool)
        at = np.flatnonzero(ok.ravel())  # one output array: faster than 2-d nonzero
        r, c = at // w, at % w
        newpair = pair[r]
        starts = np.flatnonzero(np.r_[True, newpair[1:] != newpair[:-1]])
        rank = np.arange(newpair.size) - np.repeat(starts, np.diff(np.r_[starts,
                                                                         newpair.size]))
        keep = np.flatnonzero(rank < k)
        r, pair = r[keep], newpair[keep]
        cur = succ[cur[r], c[keep]]
        left, tt = left[r] - 1, tt[r]
        level_node.append(cur)
        level_parent.append(r)
        done = left == 0
        if done.any():
            rows = np.flatnonzero(done)
            depth = len(level_node) - 1
            path = np.empty((rows.size, depth + 1), succ.dtype)  # int32 up to 46,340 servers
            for lev in range(depth, 0, -1):  # walk back up the parents
                path[:, lev] = level_node[lev][rows]
                rows = level_parent[lev][rows]
            path[:, 0] = level_node[0][rows]
            yield pair[done], path
            more = np.flatnonzero(~done)
            pair, cur, left, tt = pair[more], cur[more], left[more], tt[more]
            level_node[-1], level_parent[-1] = cur, level_parent[-1][more]


def _gather_paths(ids: list[np.ndarray], blocks: list[np.ndarray], m: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(path_ptr, node_ptr, nodes)`` of ``m`` pairs from the walk's blocks: the pairs
    laid out in input order, then each block's rows copied into place."""
    if not blocks:
        return np.zeros(m + 1, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64)
    pid = np.concatenate(ids)
    counts = np.bincount(pid, minlength=m)
    length = np.zeros(m, np.int64)
    for p, b in zip(ids, blocks):
        length[p] = b.shape[1]
    path_ptr = np.zeros(m + 1, np.int64)
    np.cumsum(counts, out=path_ptr[1:])
    node_ptr = np.zeros(path_ptr[-1] + 1, np.int64)
    np.cumsum(np.repeat(length, counts), out=node_ptr[1:])
    nodes = np.empty(node_ptr[-1], np.int32)     # RouteArrays' dtype: no copy
    for p, b in zip(ids, blocks):
        first = np.r_[True, p[1:] != p[:-1]]
        starts = np.flatnonzero(first)
        rank = np.arange(p.size) - np.repeat(starts, np.diff(np.r_[starts, p.size]))
        at = node_ptr[path_ptr[p] + rank]
        for j in range(b.shape[1]):
            nodes[at + j] = b[:, j]
    return path_ptr, node_ptr, nodes


def paths_to_arrays(paths_per_pair: Iterable[list[tuple[int, ...]]]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(path_ptr, node_ptr, nodes)`` of per-pair lists of node paths."""
    per = list(paths_per_pair)
    counts = np.fromiter((len(ps) for ps in per), np.int64, len(per))
    flat = [p for ps in per for p in ps]
    lens = np.fromiter((len(p) for p in flat), np.int64, len(flat))
    nodes = np.fromiter((v for p in flat for v in p), np.int64, int(lens.sum()))
    return np.r_[0, np.cumsum(counts)], np.r_[0, np.cumsum(lens)], nodes


def k_shortest_routes(topology: Topology, pairs: Iterable[tuple[int, int]], k: int = 4,
                      max_extra_hops: int | None = 0, method: str = "fast",
                      dist: np.ndarray | None = None
                      ) -> dict[tuple[int, int], tuple[tuple[tuple[int, ...], float], ...]]:
    """Routes for server pairs: each pair's bytes split evenly over its k shortest paths.

    Parameters
    ----------
    topology : Topology
    pairs : iterable of (src, dst)
        Distinct, reachable pairs.
    k : int
        Paths per pair (TopoOpt §4 Step 4: k-shortest path routing for MP).
    max_extra_hops : int or None
        Keep only paths at most this many hops longer than the pair's shortest. The
        default 0 spreads over up to ``k`` equal-cost shortest paths (a longer path
        would add bandwidth tax, §5.5); None keeps all ``k`` (Yen's semantics).
    method : {"fast", "networkx"}
        "fast": :func:`equal_cost_paths` (for ``max_extra_hops=0``) or
        :func:`k_shortest_paths`; "networkx": ``nx.shortest_simple_paths`` (the
        reference, slow: it reruns Dijkstra per spur node).
    dist : ndarray, optional
        Precomputed :func:`hop_distances`.

    Returns
    -------
    dict
        ``(src, dst) -> ((node_path, fraction), ...)``, the payload of
        :class:`~topoopt.topology.topology.Routes`.
    """
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k}")
    pairs = sorted({(int(s), int(t)) for s, t in pairs})
    if not pairs:
        return {}
    dist = hop_distances(topology) if dist is None else dist
    arr = np.array(pairs, dtype=np.int64)
    if np.any(dist[arr[:, 0], arr[:, 1]] >= UNREACHABLE):
        bad = arr[np.argmax(dist[arr[:, 0], arr[:, 1]] >= UNREACHABLE)]
        raise ValueError(f"server {bad[1]} is unreachable from server {bad[0]}")
    if method == "networkx":
        g = topology.simple_graph()
        found = {}
        for s, t in pairs:
            paths = [tuple(p) for p in islice(nx.shortest_simple_paths(g, s, t), k)]
            limit = len(paths[0]) + (max_extra_hops if max_extra_hops is not None else len(g))
            found[s, t] = [p for p in paths if len(p) <= limit]
    elif method == "fast":
        nbr = neighbour_table(topology)
        if max_extra_hops == 0:
            found = equal_cost_paths(nbr, dist, arr[:, 0], arr[:, 1], k)
        else:
            succ = [[int(v) for v in row if v >= 0] for row in nbr]
            found = {(s, t): k_shortest_paths(succ, dist, s, t, k, max_extra_hops)
                     for s, t in pairs}
    else:
        raise ValueError(f"method must be 'fast' or 'networkx', got {method!r}")
    return {pair: tuple((p, 1.0 / len(ps)) for p in ps) for pair, ps in found.items()}


def k_shortest_route_arrays(topology: Topology, sources, targets, k: int = 4,
                            max_extra_hops: int | None = 0, dist: np.ndarray | None = None
                            ) -> RouteArrays:
    """:func:`k_shortest_routes` (method "fast") as :class:`RouteArrays`: equal routes.

    Parameters
    ----------
    topology : Topology
    sources, targets : array_like of int
        The pairs (distinct, reachable; repeats are routed once).
    k, max_extra_hops, dist
        As for :func:`k_shortest_routes`.

    Returns
    -------
    RouteArrays
        Pairs sorted; each pair's bytes split evenly over its paths (fraction
        ``1.0 / count``, the same floats as the tuple form).
    """
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k}")
    src = np.asarray(sources, dtype=np.int64).reshape(-1)
    dst = np.asarray(targets, dtype=np.int64).reshape(-1)
    key = (src << 32) + dst
    if key.size > 1 and not np.all(key[1:] > key[:-1]):  # np.nonzero's pairs already are
        key = np.unique(key)
    src, dst = key >> 32, key & 0xFFFFFFFF
    if not key.size:
        return RouteArrays(src, dst, np.zeros(1), np.zeros(1), np.zeros(0), np.zeros(0))
    dist = hop_distances(topology) if dist is None else dist
    far = dist[src, dst] >= UNREACHABLE
    if np.any(far):
        i = int(np.argmax(far))
        raise ValueError(f"server {dst[i]} is unreachable from server {src[i]}")
    nbr = neighbour_table(topology)
    if max_extra_hops == 0:
        path_ptr, node_ptr, nodes = equal_cost_path_arrays(nbr, dist, src, dst, k)
    else:
        succ = [[int(v) for v in row if v >= 0] for row in nbr]
        path_ptr, node_ptr, nodes = paths_to_arrays(
            k_shortest_paths(succ, dist, s, t, k, max_extra_hops)
            for s, t in zip(src.tolist(), dst.tolist()))
    counts = np.diff(path_ptr)
    fraction = 1.0 / np.repeat(counts, counts)
    return RouteArrays(src, dst, path_ptr, node_ptr, nodes, fraction)
