"""The compiled event loop of :func:`topoopt.netsim.dag.run_dag` (numba, cached on disk).

Same model and event grouping as :func:`topoopt.netsim.simulate`: max-min fair rates
re-solved whenever the set of transmitting flows changes, events within 1e-9 relative
processed together, ready tasks dispatched per resource in (priority, node id) order.
Flows of one route class are one row of the max-min problem with their count as weight;
a flow node may stand for several identical flows (``fcount``: same route, size and
predecessors, so the same rate and times), each counted in its class's weight.
"""

from __future__ import annotations

import heapq

import numpy as np
from numba import njit

from topoopt.netsim._fill_kernel import fill_levels, link_classes

__all__ = ["run_kernel", "successor_lists", "OK", "PAST_HORIZON", "STUCK"]

#: Status codes of :func:`run_kernel`.
OK, PAST_HORIZON, STUCK = 0, 1, 2

#: Relative slack of the watched links' bound: a flow is taken as out when within
#: ``rate x 1e-9 t + 1e-6`` bits of its end, so a link's remaining bits over-count its
#: remaining time by at most ~1e-9 relative per flow still to cross it; 1e-4 leaves
#: room for 100,000 such flows on one link.
_WATCH_SLACK = 1e-4


@njit(cache=True)
def successor_lists(before, after, n):
    """CSR successor lists of the dependencies ``before[i] -> after[i]`` on nodes
    ``0..n-1``: ``(ptr, succ)``, node ``v``'s successors ``succ[ptr[v]:ptr[v + 1]]`` in
    the order the dependencies are listed (``after[argsort(before, stable)]``). A
    counting sort: linear, where numpy's stable sort of more than 2**16 node ids is a
    merge sort (timings: docs/tuning.md, "Simulators")."""
    ptr = np.zeros(n + 1, np.int64)
    for i in range(before.size):
        ptr[before[i] + 1] += 1
    for v in range(n):
        ptr[v + 1] += ptr[v]
    fill = ptr[:-1].copy()
    succ = np.empty(after.size, np.int64)
    for i in range(before.size):
        b = before[i]
        succ[fill[b]] = after[i]
        fill[b] += 1
    return ptr, succ


#: The filling scans each saturated link's classes: past this many entries of the
#: graph's classes per entry of those filling, the filling lists its own per link.
_SPARSE_LINKS = 3

#: Solves between fresh sums of the links' load: the running sums between gather
#: rounding (docs/tuning.md, "Simulators at 256 servers").
_REFRESH = 16


@njit(cache=True)
def _own_link_classes(cls, ncls, filling, cptr, clink, links, nlinks, left, nent, size):
    """Link -> class CSR of the filling classes alone (``left``: their entries per link)."""
    ptr = np.zeros(size, np.int64)
    for q in range(nlinks):
        ptr[links[q] + 1] = left[links[q]]
    for lk in range(size - 1):
        ptr[lk + 1] += ptr[lk]
    pos = ptr[:-1].copy()
    out = np.empty(nent, np.int64)
    for k in range(ncls):
        c = cls[k]
        if filling[c]:
            for e in range(cptr[c], cptr[c + 1]):
                lk = clink[e]
                out[pos[lk]] = c
                pos[lk] += 1
    return ptr, out


@njit(cache=True)
def _added_bound(cls, ncls, mult, pmult, cptr, clink, cweight, cap, aload, aweight, extra,
                 touched):
    """A level below which no link saturates now that the classes ``cls[:ncls]`` carry
    ``mult`` flows where the last solve had ``pmult``: at level ``x`` the old classes
    take at most ``min(x W, U)`` of a link (``W = aweight``: their weight on it, ``U =
    aload``: what they take at their rates), so with ``x D`` more (``D`` the weight
    added on it) the link has room up to ``max(cap / (W + D), (cap - U) / D)``.
    ``extra`` and ``touched`` are scratch of the links' size (``extra`` left zero)."""
    n = 0
    for k in range(ncls):
        c = cls[k]
        more = mult[c] - pmult[c]
        if more <= 0:
            continue
        for e in range(cptr[c], cptr[c + 1]):
            lk = clink[e]
            if extra[lk] == 0.0:
                touched[n] = lk
                n += 1
            extra[lk] += cweight[e] * more
    bound = np.inf
    for q in range(n):
        lk = touched[q]
        d = extra[lk]
        extra[lk] = 0.0
        if not d > 0.0:
            continue
        room = max(cap[lk] / (aweight[lk] + d), (cap[lk] - aload[lk]) / d)
        if room < bound:
            bound = room
    return bound


@njit(cache=True)
def _kept_load(refresh, cls, ncls, prev_cls, nprev, lam, mult, pmult, crate, cptr, clink,
               cweight, aload, aweight):
    """Bring ``aload`` and ``aweight`` (per link: bits/s and weight x count of the last
    solve's classes) to those of the classes kept frozen (rate below ``lam``, count
    unchanged): the other classes' shares taken out of the running sums, or
    (``refresh``) summed afresh on every link, which bounds the rounding the running
    sums gather."""
    if refresh:
        aload[:] = 0.0
        aweight[:] = 0.0
        for k in range(ncls):
            c = cls[k]
            if crate[c] < lam and mult[c] == pmult[c]:
                m = mult[c]
                r = crate[c]
                for e in range(cptr[c], cptr[c + 1]):
                    w = cweight[e] * m
                    aweight[clink[e]] += w
                    aload[clink[e]] += r * w
        return
    for k in range(nprev):
        c = prev_cls[k]
        if crate[c] < lam and mult[c] == pmult[c]:
            continue
        m = pmult[c]
        r = crate[c]
        if not r < np.inf:
            continue    # never froze: no share on any link
        for e in range(cptr[c], cptr[c + 1]):
            w = cweight[e] * m
            aweight[clink[e]] -= w
            aload[clink[e]] -= r * w


@njit(cache=True)
def _solve(act, nact, flow_class, fcount, cptr, clink, cweight, cap, warm, refresh, mult,
           pmult, prev_cls, nprev, crate, aload, aweight, lptr, lcls, scratch, iscratch,
           filling, out_rate):
    """Max-min rate of each active flow by progressive filling on class rows: the flows
    of one class freeze together, so a class is one row weighted by its count (as
    :func:`topoopt.netsim.max_min_rates` on the expanded flows).

    ``warm``: ``crate`` holds the last solve's rates. Progressive filling froze every
    class at its rate, lowest first; let ``lam`` be the lowest old rate of a class that
    lost flows, or lower, the lowest level at which a link of a class that gained flows
    may now saturate (:func:`_added_bound`). No link that saturated below ``lam``
    carries a class that lost flows, and removing load only raises the other links'
    shares; no link that gained load saturates below it: every level below ``lam`` is
    unchanged, and the filling resumes from the last of those levels on what the
    classes frozen there leave of each link. (``pmult``, ``prev_cls``, ``nprev`` and
    ``crate`` keep the last solve, ``aload`` and ``aweight`` its load and weight per
    link as running sums (:func:`_kept_load`; ``refresh``: summed afresh); the count of
    classes is returned.) ``lptr, lcls``: the classes of each link
    (:func:`~topoopt.netsim._fill_kernel.link_classes`); ``scratch`` (4 x links floats,
    row 3 zero) and ``iscratch`` (5 x links ints, row 3 all ``-1``) are work space."""
    cls = np.empty(nact, np.int64)
    ncls = 0
    for i in range(nact):
        c = flow_class[act[i]]
        if mult[c] == 0:
            cls[ncls] = c
            ncls += 1
        mult[c] += fcount[act[i]]
    lam = -np.inf           # a class is kept frozen iff its old rate is below lam
    if warm:
        lam = np.inf
        for k in range(nprev):
            c = prev_cls[k]
            if mult[c] < pmult[c] and crate[c] < lam:
                lam = crate[c]
        lam = min(lam, _added_bound(cls, ncls, mult, pmult, cptr, clink, cweight, cap, aload,
                                    aweight, scratch[3], iscratch[4]))
    _kept_load(refresh or not warm, cls, ncls, prev_cls, nprev, lam, mult, pmult, crate, cptr,
               clink, cweight, aload, aweight)
    fixed_n = 0
    level0 = 0.0
    for k in range(ncls):
        c = cls[k]
        if crate[c] < lam and mult[c] == pmult[c]:
            fixed_n += 1
            if crate[c] > level0:
                level0 = crate[c]
    if fixed_n < ncls:
        frozen, rising, hkey = scratch[0], scratch[1], scratch[2]
        links, left, hid, seen, sat = (iscratch[0], iscratch[1], iscratch[2], iscratch[3],
                                       iscratch[4])
        nlinks = 0
        nent = 0
        for k in range(ncls):
            c = cls[k]
            if crate[c] < lam and mult[c] == pmult[c]:
                continue
            filling[c] = True
            crate[c] = np.inf
            m = mult[c]
            for e in range(cptr[c], cptr[c + 1]):
                lk = clink[e]
                if seen[lk] < 0:
                    seen[lk] = nlinks
                    links[nlinks] = lk
                    nlinks += 1
                    rising[lk] = 0.0
                    left[lk] = 0
                rising[lk] += cweight[e] * m
                left[lk] += 1
            nent += cptr[c + 1] - cptr[c]
        for q in range(nlinks):
            lk = links[q]
            frozen[lk] = aload[lk]      # what the classes kept frozen take of it
            aweight[lk] += rising[lk]
        if lptr[-1] > _SPARSE_LINKS * nent:
            # most classes on the links are idle (an all-to-all's thousands of pairs
            # per switch port): their own link -> class lists cost less to build than
            # to skip over
            lptr, lcls = _own_link_classes(cls, ncls, filling, cptr, clink, links, nlinks,
                                           left, nent, lptr.size)
        fill_levels(links, nlinks, cap, frozen, rising, left, lptr, lcls, filling, mult, cptr,
                    clink, cweight, crate, level0, hkey, hid, sat, ncls - fixed_n)
        for q in range(nlinks):
            lk = links[q]
            aload[lk] = frozen[lk]
            seen[lk] = -1
        for k in range(ncls):
            filling[cls[k]] = False
    for i in range(nact):
        out_rate[i] = crate[flow_class[act[i]]]
    for k in range(nprev):
        pmult[prev_cls[k]] = 0
    for k in range(ncls):
        c = cls[k]
        pmult[c] = mult[c]
        prev_cls[k] = c
        mult[c] = 0
    return ncls


@njit(cache=True)
def _activate(v, t, is_flow, local, instant, flow_lat, node_res, node_dur, slot, qflag,
              qcount, start, tx_end, heap, seq, new_flows, nnew, touched, ntouched):
    if is_flow[v]:
        start[v] = t
        f = local[v]
        if instant[f]:
            tx_end[v] = t
            heapq.heappush(heap, (t + flow_lat[f], seq, v))
            seq += 1
        else:
            new_flows[nnew] = f
            nnew += 1
    else:
        r = node_res[v]
        if r < 0:
            start[v] = t
            heapq.heappush(heap, (t + node_dur[v], seq, v))
            seq += 1
        else:
            qflag[r, slot[v]] = True
            qcount[r] += 1
            touched[ntouched] = r
            ntouched += 1
    return seq, nnew, ntouched


@njit(cache=True)
def _dispatch(touched, ntouched, t, busy, qcount, qflag, table, node_dur, start, heap, seq):
    for q in range(ntouched):
        r = touched[q]
        if busy[r] or qcount[r] == 0:
            continue
        row = qflag[r]
        h = 0
        while not row[h]:
            h += 1
        row[h] = False
        qcount[r] -= 1
        busy[r] = True
        v = table[r, h]
        start[v] = t
        heapq.heappush(heap, (t + node_dur[v], seq, v))
        seq += 1
    return seq


@njit(cache=True)
def _consume(wrem, watch, aload, dt):
    """Take ``dt`` seconds at the current rates (``aload``) off the watched links."""
    for j in range(watch.size):
        wrem[j] -= aload[watch[j]] * dt


@njit(cache=True)
def _watched_end(t, wrem, wcap):
    """A lower bound on the makespan at time ``t``: no watched link can carry its
    remaining bits faster than its capacity (less :data:`_WATCH_SLACK`)."""
    most = 0.0
    for j in range(wrem.size):
        x = wrem[j] / wcap[j]
        if x > most:
            most = x
    return t + most * (1.0 - _WATCH_SLACK)


# One function of ~200 lines: split into njit steps it ran 5-7 % slower on dlrm-16 graphs,
# inlined or not (docs/tuning.md, "Simulators").
@njit(cache=True)
def run_kernel(n, is_flow, local, flow_node, bits, flow_lat, flow_class, fcount, cptr, clink,
               cweight, node_res, node_dur, succ_ptr, succ, pending0, table, slot, cap, horizon,
               watch, watch_bits):
    """Run the DAG; returns ``(start, finish, tx_end, events, status, value)``: status
    :data:`OK`; :data:`PAST_HORIZON` with a lower bound on the makespan above
    ``horizon`` as ``value`` (the next event's time, or when a rate solve finds a
    watched link whose remaining bits cannot be out by ``horizon``, that link's end);
    or :data:`STUCK` with a flow's local id that cannot progress as ``value`` (-1: no
    transmitting flow, the dependencies contain a cycle). ``watch``: links (capacity
    above 0) whose bits still to carry are kept, ``watch_bits`` their bits in all."""
    nres = table.shape[0]
    nflows = flow_node.size
    nclass = cptr.size - 1
    pending = pending0.copy()
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    tx_end = np.full(n, np.nan)
    qflag = np.zeros(table.shape, np.bool_)
    qcount = np.zeros(nres, np.int64)
    busy = np.zeros(nres, np.bool_)
    instant = np.empty(nflows, np.bool_)
    for f in range(nflows):
        c = flow_class[f]
        instant[f] = cptr[c + 1] == cptr[c] or bits[f] == 0.0
    heap = [(0.0, 0, 0)]
    heap.pop()
    seq = 0
    new_flows = np.empty(nflows, np.int64)
    nnew = 0
    touched = np.empty(n + nres, np.int64)
    ntouched = 0
    # max-min scratch
    L = cap.size
    mult = np.zeros(max(nclass, 1), np.int64)
    pmult = np.zeros(max(nclass, 1), np.int64)
    prev_cls = np.empty(nflows, np.int64)
    nprev = 0
    crate = np.zeros(max(nclass, 1))
    lptr, lcls, _ = link_classes(flow_class, cptr, clink, L)
    aload = np.zeros(L)
    aweight = np.zeros(L)
    nsolve = 0
    scratch = np.zeros((4, L))
    iscratch = np.zeros((5, L), np.int64)
    iscratch[3] = -1
    filling = np.zeros(max(nclass, 1), np.bool_)
    # transmitting flows
    act = np.empty(nflows, np.int64)
    arem = np.empty(nflows)
    arate = np.empty(nflows)
    nact = 0
    t_ref = 0.0
    flow_next = np.inf
    sent_next = np.inf
    dirty = False
    done = 0
    batch_v = np.empty(n, np.int64)
    batch_t = np.empty(n)
    newly = np.empty(n, np.int64)
    freed = np.empty(n, np.int64)
    # watched links: bits still to carry, taken off at the solved rates as time passes
    # and by what a flow taken as out had left
    wrem = watch_bits.copy()
    wcap = cap[watch]
    wpos = np.full(L, -1, np.int64)
    for j in range(watch.size):
        wpos[watch[j]] = j

    t = 0.0
    for v in range(n):
        if pending[v] == 0:
            seq, nnew, ntouched = _activate(v, t, is_flow, local, instant, flow_lat, node_res,
                                            node_dur, slot, qflag, qcount, start, tx_end,
                                            heap, seq, new_flows, nnew, touched, ntouched)
    seq = _dispatch(touched, ntouched, t, busy, qcount, qflag, table, node_dur, start, heap, seq)
    ntouched = 0
    lim = t + 1e-15
    events = 0
    while True:
        # -- fire everything due by lim, round after round --------------------------
        while len(heap) > 0 and heap[0][0] <= lim:
            nb = 0
            while len(heap) > 0 and heap[0][0] <= lim:
                when, _, v = heapq.heappop(heap)
                batch_v[nb] = v
                batch_t[nb] = when
                nb += 1
            nnewly = 0
            nfreed = 0
            for b in range(nb):
                v = batch_v[b]
                finish[v] = batch_t[b]
                done += 1
                r = node_res[v]
                if r >= 0:
                    busy[r] = False
                    freed[nfreed] = r
                    nfreed += 1
                for k in range(succ_ptr[v], succ_ptr[v + 1]):
                    u = succ[k]
                    pending[u] -= 1
                    if pending[u] == 0:
                        newly[nnewly] = u
                        nnewly += 1
            ntouched = 0
            for b in range(nfreed):
                touched[ntouched] = freed[b]
                ntouched += 1
            for b in range(nnewly):
                seq, nnew, ntouched = _activate(newly[b], t, is_flow, local, instant, flow_lat,
                                                node_res, node_dur, slot, qflag, qcount, start,
                                                tx_end, heap, seq, new_flows, nnew, touched,
                                                ntouched)
            seq = _dispatch(touched, ntouched, t, busy, qcount, qflag, table, node_dur, start,
                            heap, seq)
        if done >= n:
            break
        # -- the set of transmitting flows changed: re-solve max-min ------------------
        if nnew > 0 or dirty:
            warm = nprev > 0
            if nact > 0 and t > t_ref:
                for i in range(nact):
                    arem[i] = arem[i] - arate[i] * (t - t_ref)
                if watch.size:
                    _consume(wrem, watch, aload, t - t_ref)
            if watch.size:
                end = _watched_end(t, wrem, wcap)
                if end > horizon:
                    return start, finish, tx_end, events, PAST_HORIZON, end
            for i in range(nnew):
                act[nact] = new_flows[i]
                arem[nact] = bits[new_flows[i]]
                nact += 1
            nnew = 0
            dirty = False
            t_ref = t
            nprev = _solve(act, nact, flow_class, fcount, cptr, clink, cweight, cap, warm,
                           nsolve % _REFRESH == 0, mult, pmult, prev_cls, nprev, crate, aload,
                           aweight, lptr, lcls, scratch, iscratch, filling, arate)
            nsolve += 1
            flow_next = np.inf
            sent_next = np.inf
            for i in range(nact):
                if arate[i] > 0.0:
                    a = t + arem[i] / arate[i]
                    if a < flow_next:
                        flow_next = a
                    b = t + (arem[i] - 1e-6) / arate[i]
                    if b < sent_next:
                        sent_next = b
        t_next = flow_next
        if len(heap) > 0 and heap[0][0] < t_next:
            t_next = heap[0][0]
        if not np.isfinite(t_next):
            for i in range(nact):
                if arate[i] <= 0.0:
                    return start, finish, tx_end, events, STUCK, float(act[i])
            return start, finish, tx_end, events, STUCK, -1.0
        if t_next > horizon:
            return start, finish, tx_end, events, PAST_HORIZON, t_next
        t = t_next
        eps = 1e-9 * max(abs(t), 1e-6)
        events += 1
        if nact > 0 and t + 2.0 * eps >= sent_next:   # (slack: this is only a filter)
            any_sent = False
            for i in range(nact):
                if arem[i] - arate[i] * (t - t_ref) <= arate[i] * eps + 1e-6:
                    any_sent = True
                    break
            if any_sent:
                if watch.size:
                    _consume(wrem, watch, aload, t - t_ref)
                w = 0
                for i in range(nact):
                    rem = arem[i] - arate[i] * (t - t_ref)
                    if rem <= arate[i] * eps + 1e-6:
                        f = act[i]
                        if watch.size and rem != 0.0:
                            c = flow_class[f]
                            for e in range(cptr[c], cptr[c + 1]):
                                j = wpos[clink[e]]
                                if j >= 0:
                                    wrem[j] -= rem * fcount[f] * cweight[e]
                        node = flow_node[f]
                        tx_end[node] = t
                        heapq.heappush(heap, (t + flow_lat[f], seq, node))
                        seq += 1
                    else:
                        act[w] = act[i]
                        arem[w] = rem
                        arate[w] = arate[i]
                        w += 1
                nact = w
                t_ref = t
                dirty = True
        lim = t + eps
    return start, finish, tx_end, events, OK, 0.0
