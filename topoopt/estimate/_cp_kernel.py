"""The compiled pass of :meth:`topoopt.estimate.graph.IterationGraphBuilder.critical_path_bound`
(numba, cached on disk): the longest dependency chain over a strategy's segments."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["critical_path"]


@njit(cache=True)
def _by(key, nseg):
    """CSR of the links grouped by ``key`` (a segment per link): ``(ptr, links)``."""
    ptr = np.zeros(nseg + 1, np.int64)
    for i in range(key.size):
        ptr[key[i] + 1] += 1
    for g in range(nseg):
        ptr[g + 1] += ptr[g]
    fill = ptr[:-1].copy()
    out = np.empty(key.size, np.int64)
    for i in range(key.size):
        out[fill[key[i]]] = i
        fill[key[i]] += 1
    return ptr, out


@njit(cache=True)
def critical_path(size, fwd, bwd, update, mp, dp, servers, in_bps, link_u, link_v, link_x,
                  link_pat, pool, ar_off, ar_rings, shard, overlap):
    """Seconds of the longest chain (see the method's docstring).

    Segment ``g`` has ``size[g]`` positions (its servers, concatenated in ``servers``)
    and task seconds ``fwd``/``bwd``/``update``. Link ``l`` joins producer segment
    ``link_u[l]`` to consumer ``link_v[l]`` (``link_u < link_v``) with scale
    ``link_x[l]``; its pattern's vectors lie in ``pool`` from ``link_pat[l]``: per
    consumer position the slowest transfer's seconds, the bytes in, 0/-inf for a
    shared server and the least latency in, then the same four per producer position
    for the gradients. A
    segment with an AllReduce has its rings at ``ar_off[g]`` (else -1):
    ``ar_rings[g]`` seconds per shard byte, then latencies, then replica groups."""
    nseg = size.size
    off = np.zeros(nseg + 1, np.int64)
    for g in range(nseg):
        off[g + 1] = off[g] + size[g]
    npos = off[nseg]
    start = np.zeros(npos)
    acc = np.zeros(npos)
    ptr_v, by_v = _by(link_v, nseg)
    ptr_u, by_u = _by(link_u, nseg)
    # forward: consumers in segment order (producers come first)
    for gv in range(nseg):
        if ptr_v[gv] == ptr_v[gv + 1]:
            continue
        kv, ov = size[gv], off[gv]
        first = np.inf
        for d in range(kv):
            acc[ov + d] = 0.0
        for q in range(ptr_v[gv], ptr_v[gv + 1]):
            lk = by_v[q]
            gu = link_u[lk]
            ready = np.inf
            for p in range(off[gu], off[gu + 1]):
                ready = min(ready, start[p])
            ready += fwd[gu]
            first = min(first, ready)
            x, o = link_x[lk], link_pat[lk]
            for d in range(kv):
                t = start[ov + d]
                if pool[o + 2 * kv + d] == 0.0:
                    t = max(t, ready)
                if x > 0.0:
                    t = max(t, ready + x * pool[o + d] + pool[o + 3 * kv + d])
                    acc[ov + d] += x * pool[o + kv + d]
                start[ov + d] = t
        for d in range(kv):
            bps = in_bps[servers[ov + d]]
            if bps > 0.0:
                start[ov + d] = max(start[ov + d], first + 8.0 * acc[ov + d] / bps)
    # backward: each task after its own forward, producers after their consumers
    back = np.empty(npos)
    for g in range(nseg):
        for p in range(off[g], off[g + 1]):
            back[p] = start[p] + fwd[g]
    for gu in range(nseg - 1, -1, -1):
        if ptr_u[gu] == ptr_u[gu + 1]:
            continue
        ku, ou = size[gu], off[gu]
        first = np.inf
        for d in range(ku):
            acc[ou + d] = 0.0
        for q in range(ptr_u[gu], ptr_u[gu + 1]):
            lk = by_u[q]
            gv = link_v[lk]
            ready = np.inf
            for p in range(off[gv], off[gv + 1]):
                ready = min(ready, back[p])
            ready += bwd[gv]
            first = min(first, ready)
            x, o = link_x[lk], link_pat[lk] + 4 * size[gv]
            for d in range(ku):
                t = back[ou + d]
                if pool[o + 2 * ku + d] == 0.0:
                    t = max(t, ready)
                if x > 0.0:
                    t = max(t, ready + x * pool[o + d] + pool[o + 3 * ku + d])
                    acc[ou + d] += x * pool[o + ku + d]
                back[ou + d] = t
        for d in range(ku):
            bps = in_bps[servers[ou + d]]
            if bps > 0.0:
                back[ou + d] = max(back[ou + d], first + 8.0 * acc[ou + d] / bps)
    last = 0.0
    for g in range(nseg):
        for p in range(off[g], off[g + 1]):
            last = max(last, back[p] + bwd[g])
    total = last
    for g in range(nseg):
        if ar_off[g] < 0:
            for p in range(off[g], off[g + 1]):
                total = max(total, back[p] + bwd[g] + update[g])
            continue
        a0, r = ar_off[g], ar_rings[g]
        for b in range(mp[g]):
            ready = last
            if overlap:
                ready = 0.0
                for a in range(dp[g]):
                    ready = max(ready, back[off[g] + a * mp[g] + b] + bwd[g])
            ring = 0.0
            for k in range(r):
                if int(pool[a0 + 2 * r + k]) == b:
                    ring = max(ring, shard[g] * pool[a0 + k] + pool[a0 + r + k])
            total = max(total, ready + ring + update[g])
    return total
