"""Hop counts of chosen server pairs: one BFS from all their sources at once, as bitsets.

TopologyFinder needs hop distances of the pairs with MP demand only (the matching's
tie-break, the backbone's score), not of all ``n^2`` pairs. A level-synchronous BFS
keeps, per server, the set of sources that have reached it as a bitset (64 sources per
machine word): one level costs ``links x sources / 64`` word operations, and the search
stops as soon as every asked pair has its distance.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pair_hops"]


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
    sources, col = np.unique(s_of, return_inverse=True)    # bit ``col`` of a word row
    words = (sources.size + 63) // 64
    word, bit = col // 64, (col % 64).astype(np.uint64)
    reached = np.zeros((n, words), dtype=np.uint64)
    cols = np.arange(sources.size)
    reached[sources, cols // 64] |= np.uint64(1) << (cols % 64).astype(np.uint64)
    # in-links grouped by head: a server's new set is the OR of its tails' frontiers
    order = np.argsort(dst, kind="stable")
    tails, heads = np.asarray(src)[order], np.asarray(dst)[order]
    starts = np.flatnonzero(np.r_[True, heads[1:] != heads[:-1]])
    hit_heads = heads[starts]
    frontier = reached.copy()
    level = 0
    while left.any():
        level += 1
        new = np.zeros_like(reached)
        new[hit_heads] = np.bitwise_or.reduceat(frontier[tails], starts, axis=0)
        new &= ~reached
        if not new.any():
            break
        reached |= new
        idx = np.flatnonzero(left)
        got = ((new[t_of[idx], word[idx]] >> bit[idx]) & np.uint64(1)).astype(bool)
        hops[idx[got]] = level
        left[idx[got]] = False
        frontier = new
    return hops
