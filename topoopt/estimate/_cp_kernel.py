"""The compiled pass of :meth:`topoopt.estimate.graph.IterationGraphBuilder.critical_path_bound`
(numba, cached on disk): the longest dependency chain over a strategy's segments."""

from __future__ import annotations

import numpy as np
from numba import njit

from topoopt.netsim._dag_kernel import successor_lists

__all__ = ["critical_path"]


@njit(cache=True)
def _relax(times, ascending, ptr, by, other, size, off, dur, link_x, link_pat, skip_other,
           pool, servers, in_bps, acc):
    """One pass of :func:`critical_path`: each segment ``g`` (in index order, or
    reversed), after the segments at the other end of its links (``ptr``/``by`` list
    them, ``other`` names them) have run ``dur``: ``times`` per position, in place.
    A link's vectors for ``g`` lie ``4 x size[other]`` into its pattern when
    ``skip_other`` (the gradients' half)."""
    nseg = size.size
    for i in range(nseg):
        g = i if ascending else nseg - 1 - i
        if ptr[g] == ptr[g + 1]:
            continue
        k, og = size[g], off[g]
        first = np.inf
        for d in range(k):
            acc[og + d] = 0.0
        for q in range(ptr[g], ptr[g + 1]):
            lk = by[q]
            h = other[lk]
            ready = np.inf
            for p in range(off[h], off[h + 1]):
                ready = min(ready, times[p])
            ready += dur[h]
            first = min(first, ready)
            x, o = link_x[lk], link_pat[lk] + (4 * size[h] if skip_other else 0)
            for d in range(k):
                t = times[og + d]
                if pool[o + 2 * k + d] == 0.0:          # a server both use
                    t = max(t, ready)
                if x > 0.0:                            # the slowest transfer in, alone
                    t = max(t, ready + x * pool[o + d] + pool[o + 3 * k + d])
                    acc[og + d] += x * pool[o + k + d]
                times[og + d] = t
        for d in range(k):                             # every byte in, over the ingress
            bps = in_bps[servers[og + d]]
            if bps > 0.0:
                times[og + d] = max(times[og + d], first + 8.0 * acc[og + d] / bps)


@njit(cache=True)
def critical_path(size, fwd, bwd, update, mp, dp, servers, in_bps, link_u, link_v, link_x,
                  link_pat, pool, ar_off, ar_rings, shard, overlap):
    """Seconds of the longest chain (see the method's docstring).

    Segment ``g`` has ``size[g]`` positions (its servers, concatenated in ``servers``)
    and task seconds ``fwd``/``bwd``/``update``. Link ``l`` joins producer segment
    ``link_u[l]`` to consumer ``link_v[l]`` (segments are in topological order, so
    ``link_u < link_v``) with scale ``link_x[l]``; its pattern's vectors lie in
    ``pool`` from ``link_pat[l]``: per consumer position the slowest transfer's
    seconds, the bytes in, 0/-inf for a shared server and the least latency in, then
    the same four per producer position for the gradients. A segment with an
    AllReduce has its rings at ``ar_off[g]`` (else -1): ``ar_rings[g]`` seconds per
    shard byte, then latencies, then replica groups."""
    nseg = size.size
    off = np.zeros(nseg + 1, np.int64)
    for g in range(nseg):
        off[g + 1] = off[g] + size[g]
    acc = np.zeros(off[nseg])
    # the links of each consumer, and of each producer (CSR, in link order)
    ptr_v, by_v = successor_lists(link_v, np.arange(link_v.size), nseg)
    ptr_u, by_u = successor_lists(link_u, np.arange(link_u.size), nseg)
    # forward: a consumer after its producers
    start = np.zeros(off[nseg])
    _relax(start, True, ptr_v, by_v, link_u, size, off, fwd, link_x, link_pat, False, pool,
           servers, in_bps, acc)
    # backward: each task after its own forward, a producer after its consumers
    back = np.empty(off[nseg])
    for g in range(nseg):
        for p in range(off[g], off[g + 1]):
            back[p] = start[p] + fwd[g]
    _relax(back, False, ptr_u, by_u, link_v, size, off, bwd, link_x, link_pat, True, pool,
           servers, in_bps, acc)
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
            ready = last                  # overlap off: after every backward task
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
