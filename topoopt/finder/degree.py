"""Degree allocation: AllReduce vs MP (Step 1) and among AllReduce groups (Step 2), TopoOpt §4."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["split_degree", "allocate_group_degrees"]


def split_degree(degree: int, allreduce_bytes: float, mp_bytes: float) -> int:
    """AllReduce's share of the ``d`` ports per server (Algorithm 1, lines 9-10).

    Parameters
    ----------
    degree : int
        d.
    allreduce_bytes, mp_bytes : float
        Bytes of each kind of traffic in one iteration.

    Returns
    -------
    int
        ``d_AR = clamp(floor(d x AR share), 1, d)``; MP gets ``d - d_AR``.

    Notes
    -----
    "Proportionally ... at least one degree to AllReduce ... the remaining degrees,
    if any, to MP": AllReduce's quota is rounded down, so any MP traffic whose share
    is at least ``1/d`` of the total, or that rounding leaves a port for, gets its
    own links (the authors' public code gave everything to AllReduce, so its
    Blossom step never ran). Without MP traffic, all ``d`` go to AllReduce.

    Examples
    --------
    >>> split_degree(4, 95.0, 5.0), split_degree(4, 1.0, 0.0), split_degree(4, 0.0, 1.0)
    (3, 4, 1)
    """
    if int(degree) != degree or degree < 1:
        raise ValueError(f"degree must be a positive integer, got {degree}")
    if allreduce_bytes < 0 or mp_bytes < 0:
        raise ValueError("traffic bytes must be non-negative")
    if mp_bytes <= 0:
        return int(degree)
    share = allreduce_bytes / (allreduce_bytes + mp_bytes)
    return int(min(degree, max(1, math.floor(degree * share + 1e-9))))


def allocate_group_degrees(groups: Sequence[Sequence[int]], weights: Sequence[float],
                           budget: np.ndarray) -> tuple[int, ...]:
    """Rings per AllReduce group, in proportion to its traffic, within each server's ports.

    Parameters
    ----------
    groups : sequence of member sequences
    weights : sequence of float
        Traffic of each group (its ring AllReduce bytes).
    budget : ndarray of int, shape (n,)
        AllReduce ports available at each server.

    Returns
    -------
    tuple of int
        ``d_k`` per group; a ring uses one port at each member, so for every server
        the ``d_k`` of the groups containing it sum to at most its budget.

    Notes
    -----
    A group's quota is ``budget[s] x w_k / (sum of w_j over groups j containing s)`` at
    its tightest member ``s`` (groups that overlap share their common servers' ports in
    proportion to traffic; disjoint groups each get the full budget). Quotas are
    rounded down, then the largest remainders get one more ring while every member
    has a port left, then groups with the most traffic per ring take ports still free
    at all their members. Groups left with 0 rings are routed over other groups'
    links (Algorithm 1, line 15).

    Examples
    --------
    >>> allocate_group_degrees([range(4), range(2)], [9.0, 1.0], np.array([3, 3, 3, 3]))
    (3, 0)
    """
    budget = np.asarray(budget, dtype=np.int64)
    members = [np.asarray(list(g), dtype=np.int64) for g in groups]
    w = np.asarray(weights, dtype=float)
    load = np.zeros(budget.size)
    for m, wk in zip(members, w):
        load[m] += wk
    quota = np.zeros(len(members))
    for k, (m, wk) in enumerate(zip(members, w)):
        if wk > 0:
            quota[k] = float(np.min(budget[m] * wk / load[m]))
    deg = np.floor(quota + 1e-9).astype(np.int64)
    spare = budget.copy()
    for m, dk in zip(members, deg):
        spare[m] -= dk
    order = sorted(range(len(members)),
                   key=lambda k: (-(quota[k] - deg[k]), -w[k], tuple(members[k])))
    for k in order:
        if w[k] > 0 and quota[k] - deg[k] > 1e-9 and np.all(spare[members[k]] > 0):
            deg[k] += 1
            spare[members[k]] -= 1
    while True:
        able = [k for k in range(len(members)) if w[k] > 0 and np.all(spare[members[k]] > 0)]
        if not able:
            break
        k = max(able, key=lambda j: (w[j] / (deg[j] + 1), -j))
        deg[k] += 1
        spare[members[k]] -= 1
    return tuple(int(x) for x in deg)
