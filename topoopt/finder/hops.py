"""Hop counts of chosen server pairs: one BFS from all their sources at once, as bitsets.

TopologyFinder needs hop distances of the pairs with MP demand only (the matching's
tie-break, the backbone's score), not of all ``n^2`` pairs. A level-synchronous BFS
keeps, per server, the set of sources that have reached it as a bitset (64 sources per
machine word): one level costs ``links x sources / 64`` word operations, and the search
stops as soon as every asked pair has its distance.

A pair whose ends lie in different weakly connected components has no path and is
never searched for: early in Step 3 the links are the groups' rings, which no MP pair
crosses, and the BFS would otherwise walk each ring to its end.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

__all__ = ["pair_hops"]


def _bits(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Word and bit of each bitset column."""
    return cols // 64, (cols % 64).astype(np.uint64)


def pair_hops(src: np.ndarray, dst: np.ndarray, n: int, s_of: np.ndarray, t_of: np.ndarray,
              unreachable: int) -> np.ndarray:
    """Hop count from ``s_of[i]`` to ``t_of[i]`` on the digraph of links ``src -> dst``.

    Parameters
    ----------
    src, dst : numpy.ndarray
        The links (parallel links and self-loops allowed; a hop is a hop).
    n : int
        Servers.
    s_of, t_of : numpy.ndarray
        The pairs asked.
    unreachable : int
        The count given to a pair without a path.

    Returns
    -------
    numpy.ndarray
        int64, one per pair: equal to a BFS from every source (networkx
        ``shortest_path_length``, scipy ``shortest_path(unweighted=True)``; tests).
    """
    s_of, t_of = np.asarray(s_of, dtype=np.int64), np.asarray(t_of, dtype=np.int64)
    hops = np.where(s_of == t_of, 0, unreachable).astype(np.int64)
    left = s_of != t_of                  # a server is 0 hops from itself
    if not left.any() or len(src) == 0:
        return hops
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    graph = csr_matrix((np.ones(src.size, dtype=np.int8), (src, dst)), shape=(n, n))
    _, comp = connected_components(graph, directed=True, connection="weak")
    left &= comp[s_of] == comp[t_of]     # no path between weak components
    if not left.any():
        return hops
    sources, col = np.unique(s_of[left], return_inverse=True)   # bit ``col`` of a row
    pair_idx = np.flatnonzero(left)
    words = (sources.size + 63) // 64
    word, bit = _bits(col)
    reached = np.zeros((n, words), dtype=np.uint64)
    cols = np.arange(sources.size)
    w0, b0 = _bits(cols)
    reached[sources, w0] |= np.uint64(1) << b0
    # in-links grouped by head: a server's new set is the OR of its tails' frontiers
    order = np.argsort(dst, kind="stable")
    tails, heads = src[order], dst[order]
    starts = np.flatnonzero(np.r_[True, heads[1:] != heads[:-1]])
    hit_heads = heads[starts]
    frontier = reached.copy()
    t_left = t_of[pair_idx]
    level = 0
    while pair_idx.size:
        level += 1
        new = np.zeros_like(reached)
        new[hit_heads] = np.bitwise_or.reduceat(frontier[tails], starts, axis=0)
        new &= ~reached
        if not new.any():
            break
        reached |= new
        got = ((new[t_left, word] >> bit) & np.uint64(1)).astype(bool)
        hops[pair_idx[got]] = level
        pair_idx, t_left, col = pair_idx[~got], t_left[~got], col[~got]
        frontier = new
        word, bit = _bits(col)
    return hops
