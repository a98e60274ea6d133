"""Max-min fair rates of flows over capacitated links, by progressive filling."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["max_min_rates", "gather_rows", "row_runs", "sum_by_key"]


def gather_rows(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the CSR entries of ``rows``, and how many each row has.

    Parameters
    ----------
    ptr : ndarray of int, shape (R + 1,)
        CSR row pointer.
    rows : ndarray of int
        Row indices to gather (any order, repeats allowed).

    Returns
    -------
    idx : ndarray of int
        Entry positions, row after row in the order of ``rows``.
    counts : ndarray of int
        Entries per gathered row.

    Examples
    --------
    >>> idx, counts = gather_rows(np.array([0, 2, 3, 6]), np.array([2, 0]))
    >>> idx.tolist(), counts.tolist()
    ([3, 4, 5, 0, 1], [3, 2])
    """
    starts = ptr[rows]
    counts = ptr[rows + 1] - starts
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64), counts
    offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    return np.arange(total, dtype=np.int64) + offsets, counts


def row_runs(ptr: np.ndarray, size: int) -> Iterator[tuple[int, int]]:
    """Runs ``(lo, hi)`` of consecutive CSR rows holding about ``size`` entries each: each
    run ends at the last row whose end is within ``size`` entries of the run's start, and
    holds at least one row. Together they cover rows ``0 .. len(ptr) - 2`` in order.

    What a pass over a large table takes at a time, so that its work arrays are a few
    times ``size`` whatever the table's length.

    Examples
    --------
    >>> list(row_runs(np.array([0, 2, 3, 9, 10]), 3))
    [(0, 2), (2, 3), (3, 4)]
    """
    rows = ptr.size - 1
    lo = 0
    while lo < rows:
        hi = min(max(int(np.searchsorted(ptr, ptr[lo] + size, side="right")) - 1, lo + 1),
                 rows)
        yield lo, hi
        lo = hi


def sum_by_key(keys: np.ndarray, weights: np.ndarray, size: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct keys in ``0..size-1`` and the sum of their weights (zero sums dropped).

    A dense ``bincount`` when ``size`` is small enough (no sort), else ``unique``.

    Examples
    --------
    >>> k, w = sum_by_key(np.array([3, 1, 3]), np.array([1.0, 2.0, 0.5]), 4)
    >>> k.tolist(), w.tolist()
    ([1, 3], [2.0, 1.5])
    """
    if size <= 1 << 23:
        dense = np.bincount(keys, weights=weights, minlength=size)
        ukey = np.flatnonzero(dense)
        return ukey, dense[ukey]
    ukey, inv = np.unique(keys, return_inverse=True)
    total = np.bincount(inv, weights=weights)
    keep = total != 0
    return ukey[keep], total[keep]


def max_min_rates(capacity: np.ndarray, entry_flow: np.ndarray, entry_link: np.ndarray,
                  entry_weight: np.ndarray, flows: int, rtol: float = 1e-9) -> np.ndarray:
    """Max-min fair rate of every flow (progressive filling / water filling).

    Every flow that is not yet bottlenecked raises its rate at the same pace; a
    link saturates when ``sum_f weight[l, f] * rate[f]`` reaches its capacity, and
    the flows crossing it freeze at the current level. Repeats until every flow is
    frozen, so it runs one round per distinct bottleneck level, each round a few
    ``bincount`` passes over the incidence entries (O(entries + links)).

    Parameters
    ----------
    capacity : ndarray of float, shape (L,)
        Link capacities (any rate unit; the rates come out in the same unit).
        Zero is allowed (a failed link freezes its flows at rate 0).
    entry_flow, entry_link : ndarray of int, shape (E,)
        The incidence matrix in coordinate form: flow ``entry_flow[e]`` crosses
        link ``entry_link[e]``.
    entry_weight : ndarray of float, shape (E,)
        Share of the flow's rate carried on that link (1 for a single path; the
        path fraction for multipath; the number of crossings for a coupled flow
        that crosses a link several times).
    flows : int
        Number of flows F (flows with no entry get an infinite rate).
    rtol : float
        Relative tolerance for calling a link saturated.

    Returns
    -------
    ndarray of float, shape (F,)

    Examples
    --------
    Parking lot: links 0 and 1 of capacity 1; flow 0 crosses both, flows 1 and 2
    one each. Every flow gets 1/2.

    >>> max_min_rates(np.array([1.0, 1.0]), np.array([0, 0, 1, 2]),
    ...               np.array([0, 1, 0, 1]), np.ones(4), 3).tolist()
    [0.5, 0.5, 0.5]

    References
    ----------
    .. [1] D. Bertsekas and R. Gallager, *Data Networks*, 2nd ed., §6.5.2
       (max-min fairness and the progressive filling algorithm).
    """
    rate = np.full(flows, np.inf)
    if entry_flow.size == 0:
        return rate
    links = capacity.size
    residual = np.array(capacity, dtype=float)
    share = np.empty(links)
    fl, ln, w = entry_flow, entry_link, entry_weight
    level = 0.0
    # Few, whole-array numpy passes per level: the number of levels, not the work
    # per level, is what grows with heterogeneous routes.
    while fl.size:
        load = np.bincount(ln, weights=w, minlength=links)
        used = load > 0
        share.fill(np.inf)
        np.divide(residual, load, out=share, where=used)
        step = max(float(share.min()), 0.0)
        level += step
        residual -= step * load
        hit = share <= step * (1.0 + rtol) + 1e-300
        residual[hit] = 0.0
        rate[fl[hit[ln]]] = level
        keep = np.isinf(rate[fl])
        fl, ln, w = fl[keep], ln[keep], w[keep]
    return rate
