"""The compiled pass of :func:`topoopt.topology.topology.check_routes` (numba, cached on
disk): whether a path visits a server twice, in one pass over the nodes."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["revisits"]


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
