"""Progressive filling by bottleneck levels for :mod:`topoopt.netsim._dag_kernel` (numba).

Each link keeps the level at which it would saturate, ``(cap - frozen) / unfrozen``:
what the classes frozen on it already take and the weight of those still rising. That
level only rises as classes freeze (a class freezes at the current level, at or below
every link's), so a min-heap of links keyed by possibly stale levels finds the next
bottleneck: a popped key that is no longer the link's level goes back with the new one.
A filling then costs its entries and a heap operation per level and per stale key,
where one pass over the links per level (the previous kernel) cost levels x links:
45 levels on 640 links per solve on a 256-server Expander (docs/tuning.md,
"Simulators at 256 servers").
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["link_classes", "fill_levels"]

_RTOL = 1e-9


@njit(cache=True)
def link_classes(flow_class, cptr, clink, nlinks):
    """CSR ``(ptr, cls, ent)`` of the route classes used by ``flow_class`` on each link:
    link ``l``'s classes ``cls[ptr[l]:ptr[l + 1]]`` (a class once per entry) and those
    entries' positions in ``clink``."""
    used = np.zeros(cptr.size - 1, np.bool_)
    for f in range(flow_class.size):
        used[flow_class[f]] = True
    ptr = np.zeros(nlinks + 1, np.int64)
    for c in range(used.size):
        if used[c]:
            for e in range(cptr[c], cptr[c + 1]):
                ptr[clink[e] + 1] += 1
    for lk in range(nlinks):
        ptr[lk + 1] += ptr[lk]
    fill = ptr[:-1].copy()
    cls = np.empty(ptr[nlinks], np.int64)
    ent = np.empty(ptr[nlinks], np.int64)
    for c in range(used.size):
        if used[c]:
            for e in range(cptr[c], cptr[c + 1]):
                lk = clink[e]
                cls[fill[lk]] = c
                ent[fill[lk]] = e
                fill[lk] += 1
    return ptr, cls, ent


@njit(cache=True)
def _push(key, ids, size, k, i):
    j = size
    while j > 0:
        p = (j - 1) >> 1
        if key[p] <= k:
            break
        key[j] = key[p]
        ids[j] = ids[p]
        j = p
    key[j] = k
    ids[j] = i
    return size + 1


@njit(cache=True)
def _pop(key, ids, size):
    """Remove the root (read it first); returns the new size."""
    size -= 1
    k, i = key[size], ids[size]
    j = 0
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and key[c + 1] < key[c]:
            c += 1
        if key[c] >= k:
            break
        key[j] = key[c]
        ids[j] = ids[c]
        j = c
    if size > 0:
        key[j] = k
        ids[j] = i
    return size


@njit(cache=True)
def fill_levels(links, nlinks, cap, frozen, rising, left, lptr, lcls, filling, mult, cptr,
                clink, cweight, crate, level, hkey, hid, sat, nfill):
    """Progressive filling from ``level`` of the classes marked in ``filling`` (rate
    ``inf`` on entry): each freezes at the level where one of its links saturates.

    ``links[:nlinks]`` are the links the filling classes cross, with ``frozen`` (bits/s
    the other classes take), ``rising`` (weight x count of the filling classes) and
    ``left`` (their entries) set. Links within ``_RTOL`` of the step to the next level
    saturate together (as the reference :func:`topoopt.netsim.max_min_rates`). Stops
    when the ``nfill`` filling classes have frozen: the links still in the heap then
    carry none of them. ``hkey``, ``hid`` and ``sat`` are scratch of the links' size."""
    size = 0
    for q in range(nlinks):
        lk = links[q]
        if left[lk] > 0 and rising[lk] > 0.0:
            size = _push(hkey, hid, size, (cap[lk] - frozen[lk]) / rising[lk], lk)
    while size > 0 and nfill > 0:
        x, lk = hkey[0], hid[0]
        size = _pop(hkey, hid, size)
        if left[lk] == 0 or not rising[lk] > 0.0:
            continue
        cur = (cap[lk] - frozen[lk]) / rising[lk]
        if cur != x:   # stale: some class on it froze since it was pushed
            size = _push(hkey, hid, size, cur, lk)
            continue
        step = x - level
        if step < 0.0:
            step = 0.0
        lim = level + step * (1.0 + _RTOL)
        level += step
        nsat = 1
        sat[0] = lk
        while size > 0 and hkey[0] <= lim:
            l2 = hid[0]
            size = _pop(hkey, hid, size)
            if left[l2] == 0 or not rising[l2] > 0.0:
                continue
            cur = (cap[l2] - frozen[l2]) / rising[l2]
            if cur <= lim:
                sat[nsat] = l2
                nsat += 1
            else:
                size = _push(hkey, hid, size, cur, l2)
        for s in range(nsat):
            lk = sat[s]
            for z in range(lptr[lk], lptr[lk + 1]):
                c = lcls[z]
                if not filling[c] or crate[c] != np.inf:
                    continue
                crate[c] = level
                nfill -= 1
                m = mult[c]
                for e in range(cptr[c], cptr[c + 1]):
                    l3 = clink[e]
                    w = cweight[e] * m
                    frozen[l3] += level * w
                    rising[l3] -= w
                    left[l3] -= 1
