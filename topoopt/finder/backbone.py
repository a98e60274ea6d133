"""The backbone ring's stride: the ring over all servers that connects a TopologyFinder topology.

When the AllReduce rings and MP matchings leave the shard in several pieces,
TopologyFinder lays one ring over all servers first (TopoOpt §4: "at least one degree
to AllReduce" keeps the topology connected). Of the TotientPerms strides it takes the
one whose ring, added to the rest, carries the MP demand in the fewest hop-bytes.

Scoring a stride needs the hop distance of every MP pair, i.e. a BFS from every MP
source: :func:`mp_hop_bytes` runs all of them at once
(:func:`~topoopt.finder.hops.pair_hops`). The candidates are bounded (:data:`MAX_BACKBONE_STRIDES`):
TotientPerms gives ``phi(n)`` strides (``n / 2`` at ``n = 2^k``), and an LLM shard of
2,048 servers would score 1,024 of them per TopologyFinder run.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from topoopt.finder.hops import pair_hops
from topoopt.finder.perms import select_permutations, totient_perms
from topoopt.topology.topology import Topology

__all__ = ["backbone_stride", "backbone_stride_reference", "backbone_candidates",
           "mp_hop_bytes", "MAX_BACKBONE_STRIDES"]

#: strides scored per backbone search; more candidates are thinned to this many
MAX_BACKBONE_STRIDES = 64


def _links(topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    if not topology.links:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    a = np.array([(lk[0], lk[2]) for lk in topology.links], dtype=np.int64)
    return a[:, 0], a[:, 1]


def backbone_candidates(n: int, primes_only: bool, seed: int,
                        limit: int | None = MAX_BACKBONE_STRIDES) -> tuple[int, ...]:
    """The strides a backbone search scores, in order of preference on ties.

    SelectPermutations' single stride first, then the other TotientPerms strides
    ascending. With more than ``limit`` of them, the default and ``limit - 1`` strides
    spread evenly over the ascending list (its first, 1, and its last included), so the
    search costs the same at every size; ``None``: all of them.

    Examples
    --------
    >>> backbone_candidates(12, False, 0)
    (1, 5, 7, 11)
    >>> len(backbone_candidates(2048, False, 0)), len(backbone_candidates(2048, False, 0, None))
    (64, 1024)
    """
    default = select_permutations(n, 1, primes_only=primes_only, seed=seed).strides[0]
    rest = [p for p in totient_perms(n, primes_only) if p != default]
    if limit is not None and len(rest) > limit - 1:
        keep = np.unique(np.round(np.linspace(0, len(rest) - 1, max(limit - 1, 1))).astype(int))
        rest = [rest[i] for i in keep]
    return (int(default), *rest)


def mp_hop_bytes(mp: np.ndarray, src: np.ndarray, dst: np.ndarray, n: int) -> float:
    """Sum over ``mp``'s nonzero pairs of bytes x hop count on the digraph ``src -> dst``.

    Parameters
    ----------
    mp : numpy.ndarray
        ``(n, n)`` bytes.
    src, dst : numpy.ndarray
        The links (parallel links and self-loops allowed; a hop is a hop).
    n : int
        Servers.

    Returns
    -------
    float
        ``inf`` when a pair with bytes has no path. Equal to a BFS from every source
        (``scipy.sparse.csgraph.shortest_path``) weighted by ``mp``.
    """
    s_of, t_of = np.nonzero(mp)
    return _hop_bytes(s_of, t_of, mp[s_of, t_of], src, dst, n)


def _hop_bytes(s_of: np.ndarray, t_of: np.ndarray, nbytes: np.ndarray, src: np.ndarray,
               dst: np.ndarray, n: int) -> float:
    hops = pair_hops(src, dst, n, s_of, t_of, -1)
    if (hops < 0).any():
        return np.inf
    return float((nbytes * hops).sum())


def _score(pairs: tuple[np.ndarray, np.ndarray, np.ndarray], src: np.ndarray,
           dst: np.ndarray, n: int, p: int) -> float:
    ring = np.arange(n, dtype=np.int64)
    return _hop_bytes(*pairs, np.r_[src, ring], np.r_[dst, (ring + p) % n], n)


def backbone_stride(mp: np.ndarray, topology: Topology, primes_only: bool, seed: int,
                    limit: int | None = MAX_BACKBONE_STRIDES) -> int:
    """The stride of the backbone ring that connects ``topology`` (built without one).

    Of :func:`backbone_candidates`, the one whose ring over all servers, added to the
    topology, carries the MP demand ``mp`` in the fewest hop-bytes (sum of bytes x hop
    count); ties go to SelectPermutations' single stride, then the smallest. The
    stride-1 ring crosses between two halves of the shard twice: a pipeline whose
    stages are the halves (server ``i`` sends to ``i + n/2``) would then funnel every
    activation through two links.

    Parameters
    ----------
    mp : numpy.ndarray
        ``(n, n)`` MP bytes.
    topology : Topology
        The topology built without a backbone.
    primes_only, seed : bool, int
        TotientPerms' and SelectPermutations' arguments.
    limit : int or None
        Strides scored at most (:func:`backbone_candidates`); None scores every one,
        which gives :func:`backbone_stride_reference`'s answer.

    Returns
    -------
    int

    References
    ----------
    TopoOpt (NSDI'23) §4, Algorithm 1 (TotientPerms, SelectPermutations).
    """
    n = topology.servers
    cands = backbone_candidates(n, primes_only, seed, limit)
    if not (mp.sum(axis=1) > 0).any():
        return cands[0]
    src, dst = _links(topology)
    s_of, t_of = np.nonzero(mp)           # the pairs once, not per stride
    pairs = (s_of, t_of, mp[s_of, t_of])
    best, best_cost = cands[0], np.inf
    for p in sorted(cands, key=lambda q: (q != cands[0], q)):
        cost = _score(pairs, src, dst, n, p)
        if cost < best_cost * (1.0 - 1e-12):
            best, best_cost = p, cost
    return int(best)


def backbone_stride_reference(mp: np.ndarray, topology: Topology, primes_only: bool,
                              seed: int) -> int:
    """:func:`backbone_stride` over every TotientPerms stride, with a scipy BFS from every
    MP source per stride (kept as the reference the tests hold the fast one to)."""
    n = topology.servers
    cands = backbone_candidates(n, primes_only, seed, None)
    src_rows = np.flatnonzero(mp.sum(axis=1) > 0)
    if src_rows.size == 0:
        return cands[0]
    s, t = _links(topology)
    base = csr_matrix((np.ones(s.size), (s, t)), shape=(n, n))
    ring = np.arange(n)
    best, best_cost = cands[0], np.inf
    for p in cands:
        adj = base + csr_matrix((np.ones(n), (ring, (ring + p) % n)), shape=(n, n))
        adj.data[:] = 1.0
        dist = shortest_path(adj, method="D", unweighted=True, directed=True,
                             indices=src_rows)
        cost = float((mp[src_rows] * dist).sum())
        if cost < best_cost * (1.0 - 1e-12):
            best, best_cost = p, cost
    return int(best)
