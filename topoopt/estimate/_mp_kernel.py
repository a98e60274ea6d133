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

__all__ = ["coflow_groups", "merge_transfers"]


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


@njit(cache=True)
def _row_order(a, b, start, preds, width):
    """-1, 0 or 1 as flow ``a``'s predecessor row sorts before, with or after ``b``'s,
    rows padded with -1 to ``width`` entries."""
    for j in range(width):
        x = preds[start[a] + j] if start[a] + j < start[a + 1] else -1
        y = preds[start[b] + j] if start[b] + j < start[b + 1] else -1
        if x != y:
            return -1 if x < y else 1
    return 0


@njit(cache=True)
def coflow_groups(pair_flow, pair_pred, flows):
    """Coflows of one pass: merged flows with the same predecessor set (what
    :func:`topoopt.estimate.graph._coflow_groups` computes with numpy, label for label).

    Parameters
    ----------
    pair_flow, pair_pred : int64 arrays
        The distinct (flow, predecessor) pairs, sorted by flow, then predecessor
        (:func:`merge_transfers`); every flow has at least one.
    flows : int

    Returns
    -------
    labels : int64 array
        Per coflow, its signature: the predecessor of a one-predecessor set, else
        ``max(predecessor + 1, 0)`` plus the rank of its set (padded with -1,
        compared entry by entry) among the distinct larger sets; ascending.
    member : int64 array
        Coflow of each flow.
    first : int64 array
        Lowest flow of each coflow.
    """
    m = pair_flow.size
    start = np.zeros(flows + 1, np.int64)
    for i in range(m):
        start[pair_flow[i] + 1] += 1
    longest = 0
    for k in range(flows):
        longest = max(longest, start[k + 1])
        start[k + 1] += start[k]
    top = -1
    for i in range(m):
        top = max(top, pair_pred[i])
    base = max(top + 1, 0) if m else 1
    sig = np.empty(flows, np.int64)
    multi = np.empty(flows, np.int64)
    nm = 0
    for k in range(flows):
        if start[k + 1] - start[k] == 1:
            sig[k] = pair_pred[start[k]]
        else:
            multi[nm] = k
            nm += 1
    # larger sets: a bottom-up merge sort of their rows, then ranks of the distinct ones
    order = multi[:nm].copy()
    spare = np.empty(nm, np.int64)
    run = 1
    while run < nm:
        for lo in range(0, nm, 2 * run):
            mid, hi = min(lo + run, nm), min(lo + 2 * run, nm)
            i, j, o = lo, mid, lo
            while i < mid and j < hi:
                if _row_order(order[j], order[i], start, pair_pred, longest) < 0:
                    spare[o] = order[j]
                    j += 1
                else:
                    spare[o] = order[i]
                    i += 1
                o += 1
            while i < mid:
                spare[o] = order[i]
                i += 1
                o += 1
            while j < hi:
                spare[o] = order[j]
                j += 1
                o += 1
        order, spare = spare, order
        run *= 2
    rank = -1
    for q in range(nm):
        if q == 0 or _row_order(order[q - 1], order[q], start, pair_pred, longest) != 0:
            rank += 1
        sig[order[q]] = base + rank
    # group equal signatures, labels ascending
    by_sig = np.argsort(sig, kind="mergesort")
    member = np.empty(flows, np.int64)
    labels = np.empty(flows, np.int64)
    first = np.empty(flows, np.int64)
    c = -1
    for q in range(flows):
        k = by_sig[q]
        if q == 0 or sig[k] != sig[by_sig[q - 1]]:
            c += 1
            labels[c] = sig[k]
            first[c] = k    # stable: the lowest flow of its signature comes first
        member[k] = c
    return labels[:c + 1], member, first[:c + 1]
