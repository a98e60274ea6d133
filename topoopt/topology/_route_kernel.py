"""The compiled passes over a plan's route nodes (numba, cached on disk): whether a path
visits a server twice or takes a hop that is not a link
(:func:`topoopt.topology.topology.check_routes`), and the merge of two route tables.
One pass each, with no array per node: at 1024 servers a ring-like topology's routes
hold ~10^8 nodes, and a vectorized hop table (int64 pairs, their keys) or gather index
took gigabytes for a moment."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["revisits", "unlinked_hop", "splice_runs"]


@njit(cache=True)
def revisits(nodes: np.ndarray, node_ptr: np.ndarray, n: int) -> bool:
    """Whether a path ``nodes[node_ptr[p]:node_ptr[p + 1]]`` holds a node twice.

    Each node is stamped with the last path that visited it: a stamp equal to the
    path's own is a second visit. Linear in the nodes, where sorting them is not.
    Node ids must be in ``0..n - 1``.
    """
    stamp = np.full(n, -1, np.int64)
    for p in range(node_ptr.size - 1):
        for i in range(node_ptr[p], node_ptr[p + 1]):
            x = nodes[i]
            if stamp[x] == p:
                return True
            stamp[x] = p
    return False


@njit(cache=True)
def unlinked_hop(nodes: np.ndarray, node_ptr: np.ndarray, linked: np.ndarray, n: int) -> bool:
    """Whether a hop ``u -> v`` of a path is not a link: ``linked[u * n + v]`` false.
    Node ids must be in ``0..n - 1``."""
    for p in range(node_ptr.size - 1):
        for i in range(node_ptr[p], node_ptr[p + 1] - 1):
            if not linked[np.int64(nodes[i]) * n + nodes[i + 1]]:
                return True
    return False


@njit(cache=True)
def splice_runs(mine: np.ndarray, theirs: np.ndarray, a: np.ndarray, b: np.ndarray,
                c: np.ndarray, d: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out`` with ``mine[a[0]:b[0]]``, ``theirs[c[0]:d[0]]``, ``mine[a[1]:b[1]]``,
    ... ``mine[a[-1]:b[-1]]`` (``a``, ``b`` one longer than ``c``, ``d``): the
    merge of two route tables, run by run."""
    k = 0
    for r in range(a.size):
        for i in range(a[r], b[r]):
            out[k] = mine[i]
            k += 1
        if r < c.size:
            for i in range(c[r], d[r]):
                out[k] = theirs[i]
                k += 1
