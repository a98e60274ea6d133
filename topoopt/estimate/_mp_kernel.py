"""The compiled merge of one pass's MP transfers (numba, cached on disk).

:meth:`~topoopt.estimate.graph.IterationGraphBuilder.build` lists one transfer per
(edge, source, destination); a DLRM-128 strategy with 32-way table shards and a
data-parallel interaction has a million of them per pass, merging into a few thousand
flows. Sorting them was nine tenths of a graph build; this kernel merges them through a
dense table instead (work: transfers + consumer segments x servers^2).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["merge_transfers"]


@njit(cache=True)
def merge_transfers(keys, nbytes, preds, nn, nseg):
    """Merge transfers with equal keys; list each merged flow's distinct predecessors.

    Parameters
    ----------
    keys : int64 array
        ``consumer segment x nn + (source x servers + destination)``, consumer segment
        in ``[0, nseg)``.
    nbytes : float array
    preds : int64 array
        The node that releases each transfer (a task, or a barrier's placeholder < 0).
    nn : int
        Servers squared.
    nseg : int

    Returns
    -------
    uk : int64 array
        The distinct keys, ascending (``np.unique(keys)``).
    inv : int64 array
        Merged flow of each transfer (``uk[inv] == keys``).
    sizes : float array
        Bytes per merged flow, summed in transfer order (as ``np.bincount``).
    pair_flow, pair_pred : int64 arrays
        The distinct (merged flow, predecessor) pairs, sorted by flow, then predecessor.
    """
    n = keys.size
    # consumer segments present -> dense rows, in segment order
    row = np.full(nseg, -1, np.int64)
    for i in range(n):
        row[keys[i] // nn] = 0
    rows = 0
    for g in range(nseg):
        if row[g] == 0:
            row[g] = rows
            rows += 1
    seg_of_row = np.empty(rows, np.int64)
    for g in range(nseg):
        if row[g] >= 0:
            seg_of_row[row[g]] = g
    slot = np.full(rows * nn, -1, np.int64)
    dense = np.empty(n, np.int64)
    for i in range(n):
        d = row[keys[i] // nn] * nn + keys[i] % nn
        dense[i] = d
        slot[d] = 0
    flows = 0
    for d in range(rows * nn):
        if slot[d] == 0:
            slot[d] = flows
            flows += 1
    uk = np.empty(flows, np.int64)
    for d in range(rows * nn):
        if slot[d] >= 0:
            uk[slot[d]] = seg_of_row[d // nn] * nn + d % nn
    inv = np.empty(n, np.int64)
    sizes = np.zeros(flows)
    start = np.zeros(flows + 1, np.int64)
    for i in range(n):
        k = slot[dense[i]]
        inv[i] = k
        sizes[k] += nbytes[i]
        start[k + 1] += 1
    for k in range(flows):
        start[k + 1] += start[k]
    fill = start[:-1].copy()
    bucket = np.empty(n, np.int64)
    for i in range(n):
        k = inv[i]
        bucket[fill[k]] = preds[i]
        fill[k] += 1
    pair_flow = np.empty(n, np.int64)
    pair_pred = np.empty(n, np.int64)
    m = 0
    for k in range(flows):
        a, b = start[k], start[k + 1]
        # insertion sort in place: a flow has as many transfers as edges into its
        # consumer segment, a handful (a DLRM interaction's: one per table)
        for i in range(a + 1, b):
            x = bucket[i]
            j = i - 1
            while j >= a and bucket[j] > x:
                bucket[j + 1] = bucket[j]
                j -= 1
            bucket[j + 1] = x
        for i in range(a, b):
            if i == a or bucket[i] != bucket[i - 1]:
                pair_flow[m] = k
                pair_pred[m] = bucket[i]
                m += 1
    return uk, inv, sizes, pair_flow[:m], pair_pred[:m]
