"""The MP flows of one pass of a task graph: transfers merged into flows.

A pass lists one transfer per (edge, source, destination); transfers of one stage
(consumer segment, source, destination) are one flow, a per-pair max-min flow or, as
coflows, the flows a task releases at once coupled into one. :func:`add_mp_pass`
merges them, numbers the flows (:class:`FlowTable`) and lists their dependencies,
each distinct one once. Barriers a pass adds are numbered by :class:`Barriers`.
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import numpy as np

from topoopt.estimate.iteration_graph import FLOW_MP
from topoopt.estimate.routes import RouteCache
from topoopt.estimate.templates import BWD_KEY, DST_POS, FWD_KEY, SRC_POS, PairTemplate

__all__ = ["FlowTable", "FlowArrays", "Barriers", "placeholder", "DependencyList",
           "PassTransfers", "forward_transfers", "backward_transfers", "MergedTransfers",
           "merge_pass", "add_mp_pass", "identical_blocks", "coflow_groups", "row_ranks",
           "group_keys"]

#: :func:`add_mp_pass` merges a pass's transfers through a dense table of (consumer
#: segment, source, destination) while the table has at most this many entries per
#: transfer (or at most ``_DENSE_MIN``) and at most ``_DENSE_MAX`` in all, else by
#: sorting them: both give the same arrays, and a sparse table, scanned whole, costs
#: more than a sort (measurements: docs/tuning.md, "Task-graph builder").
_DENSE_PER_TRANSFER = 32
_DENSE_MIN, _DENSE_MAX = 1 << 16, 1 << 22
#: :func:`forward_transfers` sums the bytes of a forward group's edges over all their
#: transfers at once (one ``np.bincount``) up to this many transfers in all, else edge
#: by edge into the group's: the memory of a graph's build then grows with its groups'
#: and kept edges' transfers, not with every edge's.
_SUM_CHUNK = 1 << 16
#: Identical blocks of per-pair flows are looked for in a pass of at least this many
#: flows (below it the search for them costs more than it saves).
_MERGE_MIN = 4096


class FlowTable:
    """The flows of a graph being built, numbered from ``first`` (the node after the
    last task)."""

    def __init__(self, first: int) -> None:
        self.first, self.count = first, 0
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.merged = False     # some flow stands for several

    def add(self, cls: np.ndarray, nbytes: np.ndarray, lat: np.ndarray, kind: int,
            hops: np.ndarray, count: np.ndarray | None = None) -> np.ndarray:
        """Append flows (route class, bytes, latency, hop count and, if some stand for
        several identical flows, ``count``); return their node ids."""
        at = self.first + self.count
        ids = np.arange(at, at + cls.size, dtype=np.int64)
        self.count += cls.size
        if count is None:
            count = np.ones(cls.size, np.int64)
        else:
            self.merged = True
        self.parts.append((cls, nbytes, lat, np.full(cls.size, kind, np.int8), hops, count))
        return ids

    def arrays(self) -> FlowArrays:
        """Every flow's fields, in flow order."""
        dtypes = (np.int64, float, float, np.int8, np.int64, np.int64)
        if not self.parts:
            return FlowArrays(*(np.empty(0, dt) for dt in dtypes))
        return FlowArrays(*(np.concatenate([p[i] for p in self.parts]).astype(dt, copy=False)
                            for i, dt in enumerate(dtypes)))


class FlowArrays(NamedTuple):
    """The flows of a :class:`FlowTable`, one entry per flow."""

    route_class: np.ndarray
    nbytes: np.ndarray
    latency: np.ndarray
    kind: np.ndarray
    hops: np.ndarray
    flow_count: np.ndarray


class Barriers:
    """The zero-time barriers of a graph being built, numbered in creation order.

    Their nodes come after every flow, and the flows are counted only once the graph
    is built: until then barrier ``i`` is named by the placeholder ``-1 - i`` (negative,
    so never a task's or a flow's id), and :meth:`resolve` turns placeholders into
    node ids.
    """

    def __init__(self, count: int = 0) -> None:
        self.count = count

    def reserve(self, k: int) -> int:
        """Number ``k`` new barriers; the first one's number."""
        first = self.count
        self.count += k
        return first

    def new(self, k: int) -> np.ndarray:
        """Placeholders of ``k`` new barriers."""
        return placeholder(self.reserve(k) + np.arange(k))

    @staticmethod
    def resolve(nodes: np.ndarray, first_barrier: int) -> None:
        """In place: placeholders -> node ids, barrier ``i`` at ``first_barrier + i``."""
        neg = nodes < 0
        nodes[neg] = first_barrier - 1 - nodes[neg]


_Number = TypeVar("_Number", int, np.ndarray)


def placeholder(number: _Number) -> _Number:
    """The placeholder node of barrier ``number`` (see :class:`Barriers`)."""
    return -1 - number


class DependencyList:
    """Dependencies ``before[i] -> after[i]`` as arrays appended in order (the order
    the engines see them in)."""

    def __init__(self) -> None:
        self.before: list[np.ndarray] = []
        self.after: list[np.ndarray] = []

    def add(self, before: np.ndarray, after: np.ndarray) -> None:
        """Node ``after[i]`` waits for node ``before[i]``."""
        self.before.append(before)
        self.after.append(after)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(before, after)``, concatenated."""
        return np.concatenate(self.before), np.concatenate(self.after)


class PassTransfers(NamedTuple):
    """The transfers of one pass, as :func:`add_mp_pass` takes them: per transfer, its
    key (``consumer segment x n^2 + src x n + dst``), bytes and predecessor node."""

    keys: np.ndarray
    nbytes: np.ndarray
    preds: np.ndarray


def forward_transfers(plans: list[PairTemplate], consumer: list[int], scale: list[float],
                      group: list[int], first: list[bool], g_base: np.ndarray,
                      g_sign: np.ndarray, nn: int) -> PassTransfers:
    """The forward pass's transfers: each group's once, from its first edge.

    Edge ``i`` (in edge order) has template ``plans[i]``, consumer segment
    ``consumer[i]``, bytes ``overlap x scale[i]``, forward group ``group[i]`` (numbered
    in the order of their first edges) and ``first[i]``: whether it is its group's
    first. The edges of a group share their consumer and both configs, hence their
    template: a group's transfers are its first edge's (keys, and predecessors
    ``g_base + g_sign x source position`` of its group), their bytes summed over the
    group's edges position by position, from 0.0 and in edge order (as
    ``np.bincount`` sums them). Beyond ``_SUM_CHUNK`` transfers in all, only the
    groups' first edges' transfers are listed: each later edge's bytes are added in
    place.
    """
    firsts = [i for i, f in enumerate(first) if f]
    fp = [plans[i] for i in firsts]
    lens = np.fromiter((p.size for p in fp), np.int64, len(fp))
    cons = np.fromiter((consumer[i] for i in firsts), np.int64, len(firsts))
    keys = np.repeat(cons * nn, lens) + np.concatenate([p.ints[FWD_KEY] for p in fp])
    preds = (np.repeat(g_base, lens)
             + np.repeat(g_sign, lens) * np.concatenate([p.ints[SRC_POS] for p in fp]))
    scales = np.asarray(scale, float)
    if len(firsts) == len(plans):       # a group per edge: nothing to add
        nbytes = np.concatenate([p.overlap for p in fp]) * np.repeat(scales, lens)
        return PassTransfers(keys, nbytes, preds)
    f_start = np.cumsum(lens) - lens    # each group's first transfer
    grp = np.asarray(group, np.int64)
    all_lens = np.fromiter((p.size for p in plans), np.int64, len(plans))
    if int(all_lens.sum()) <= _SUM_CHUNK:   # few: every edge's bytes at once
        t_start = np.cumsum(all_lens) - all_lens
        at = np.repeat(f_start[grp] - t_start, all_lens) + np.arange(int(all_lens.sum()))
        w = np.concatenate([p.overlap for p in plans]) * np.repeat(scales, all_lens)
        nbytes = np.bincount(at, weights=w, minlength=keys.size)
    else:       # the first edges', then each later edge's added to its group's
        nbytes = 0.0 + np.concatenate([p.overlap for p in fp]) * np.repeat(scales[firsts], lens)
        for i in np.flatnonzero(~np.asarray(first)).tolist():
            pos = int(f_start[grp[i]])
            nbytes[pos:pos + int(all_lens[i])] += plans[i].overlap * scales[i]
    return PassTransfers(keys, nbytes, preds)


def backward_transfers(plans: list[PairTemplate], segs: list[tuple[int, int]],
                       scale: list[float], kept: list[bool], bwd_base: np.ndarray,
                       nn: int) -> PassTransfers:
    """The backward pass's transfers: those of the edges ``kept`` (an alias's are its
    representative's), in edge order. Edge ``i`` joins segments ``segs[i]``
    (producer, consumer), has template ``plans[i]`` and bytes ``overlap x scale[i]``;
    its gradients go from the consumer's backward tasks (``bwd_base``) to the
    producer's."""
    idx = [i for i, k in enumerate(kept) if k]
    kp = [plans[i] for i in idx]
    lens = np.fromiter((p.size for p in kp), np.int64, len(kp))
    tg = np.array([segs[i] for i in idx], np.int64).reshape(-1, 2)
    keys = np.repeat(tg[:, 0] * nn, lens) + np.concatenate([p.ints[BWD_KEY] for p in kp])
    nbytes = (np.concatenate([p.overlap for p in kp])
              * np.repeat(np.asarray(scale, float)[idx], lens))
    preds = (np.repeat(bwd_base[tg[:, 1]], lens)
             + np.concatenate([p.ints[DST_POS] for p in kp]))
    return PassTransfers(keys, nbytes, preds)


class MergedTransfers(NamedTuple):
    """One pass's transfers merged per key: the distinct keys ``keys``, each
    transfer's flow ``inverse``, each flow's bytes ``sizes``, and the distinct (flow,
    predecessor) pairs ``pair_flow``/``pair_pred`` sorted by flow, then predecessor."""

    keys: np.ndarray
    inverse: np.ndarray
    sizes: np.ndarray
    pair_flow: np.ndarray
    pair_pred: np.ndarray


def merge_pass(keys: np.ndarray, nbytes: np.ndarray, preds: np.ndarray, nn: int,
               segments: int, consumers: int) -> MergedTransfers:
    """Merge transfers with equal keys (``consumer segment x nn + src x n + dst``),
    through a dense table (the compiled kernel) or by sorting, whichever is cheaper:
    both give the same arrays."""
    if consumers * nn <= min(max(_DENSE_PER_TRANSFER * keys.size, _DENSE_MIN), _DENSE_MAX):
        # numba is loaded on the first build only (import topoopt stays light)
        from topoopt.estimate._mp_kernel import merge_transfers
        return MergedTransfers(*merge_transfers(keys, nbytes, preds, nn, segments))
    uk, inv, _ = group_keys(keys)
    sizes = np.bincount(inv, weights=nbytes)
    return MergedTransfers(uk, inv, sizes, *_distinct_pairs(inv, preds))


def add_mp_pass(flows: FlowTable, routes: RouteCache, coflows: bool, merge_blocks: bool,
                keys: np.ndarray, nbytes: np.ndarray, preds: np.ndarray,
                succ_base: np.ndarray, pos_mat: np.ndarray, consumers: int,
                aliases: dict[int, list[int]] | None, barriers: Barriers,
                seg_sizes: np.ndarray, deps: DependencyList) -> None:
    """MP flows of one pass: transfers merged per (consumer segment, src, dst), as
    pairs or as ``coflows``, with their dependencies (each distinct one once).

    Parameters
    ----------
    flows : FlowTable
    routes : RouteCache
    coflows : bool
        Coflows (else per-pair flows).
    merge_blocks : bool
        Per-pair flows: one node for identical blocks of flows (:func:`identical_blocks`).
    keys, nbytes, preds : ndarray
        Per transfer: ``consumer segment x n^2 + src x n + dst``, bytes, the node that
        releases it (a task, or a barrier's placeholder).
    succ_base : ndarray of int
        Per segment, the node of its first task of the pass (the transfers' consumers).
    pos_mat : ndarray of int, shape (segments, n)
        Per segment, each server's position (-1 where unused).
    consumers : int
        Consumer segments in the pass (sizes the dense table).
    aliases : dict, optional
        Consumer segment -> segments whose flows are its own; its flows then end in
        one barrier per destination that all of them wait for.
    barriers : Barriers
    seg_sizes : ndarray of int
        Servers per segment.
    deps : DependencyList
        Where the pass's dependencies go.
    """
    n = routes.n
    nn = n * n
    merged = merge_pass(keys, nbytes, preds, nn, succ_base.size, consumers)
    uk, sizes, k_of, p_of = merged.keys, merged.sizes, merged.pair_flow, merged.pair_pred
    g, rest = uk // nn, uk % nn
    src, dst = rest // n, rest % n
    succs = succ_base[g] + pos_mat[g, dst]
    mult = None
    if aliases:
        mult = _alias_barriers(aliases, g, dst, succs, succ_base, pos_mat, seg_sizes,
                               barriers, deps)
    if coflows:
        if mult is not None:
            sizes = sizes * mult
        co, member, first = coflow_groups(k_of, p_of, uk.size)
        tot = np.bincount(member, weights=sizes, minlength=co.size)
        share = sizes / np.where(tot[member] > 0, tot[member], 1.0)
        cls, lat = routes.coflow_classes(src, dst, member, share, co.size)
        ids = flows.add(cls, tot, lat, FLOW_MP, np.ones(co.size, np.int64))
        # members of a coflow share their predecessors: one member's pairs say them
        is_first = np.zeros(uk.size, bool)
        is_first[first] = True
        take = is_first[k_of]
        p_of, k_of = p_of[take], member[k_of[take]]
        flow_of_succ = member
    else:
        cls, lat = routes.pair_classes(src, dst)
        flow_of_succ = np.arange(uk.size)
        count = mult
        if merge_blocks and uk.size >= _MERGE_MIN:
            flow_of_succ, count = identical_blocks(g, rest, sizes, k_of, p_of, mult)
        if count is None:
            ids = flows.add(cls, sizes, lat, FLOW_MP, np.ones(uk.size, np.int64))
        else:
            keep = count > 0
            ids = np.zeros(uk.size, np.int64)
            ids[keep] = flows.add(cls[keep], sizes[keep], lat[keep], FLOW_MP,
                                  np.ones(int(keep.sum()), np.int64), count[keep])
            take = keep[k_of]     # a merged block's predecessors are its first's
            k_of, p_of = k_of[take], p_of[take]
    deps.add(p_of, ids[k_of])
    deps.add(ids[flow_of_succ], succs)


def _alias_barriers(aliases: dict[int, list[int]], g: np.ndarray, dst: np.ndarray,
                    succs: np.ndarray, succ_base: np.ndarray, pos_mat: np.ndarray,
                    seg_sizes: np.ndarray, barriers: Barriers, deps: DependencyList
                    ) -> np.ndarray:
    """Per merged flow, the flows it stands for (itself and its consumer's aliases');
    the flows into each task of a segment with aliases end, in place in ``succs``, in
    a barrier that the segment's and its aliases' tasks wait for."""
    mult = np.ones(g.size, np.int64)
    for r, al in aliases.items():
        sel = g == r
        mult[sel] += len(al)
        size = int(seg_sizes[r])
        bars = barriers.new(size)
        succs[sel] = bars[pos_mat[r, dst[sel]]]
        deps.add(np.tile(bars, len(al) + 1),
                 (succ_base[[r, *al]][:, None] + np.arange(size)).ravel())
    return mult


def _distinct_pairs(inv: np.ndarray, preds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (merged flow, predecessor) pairs, sorted by flow, then predecessor
    (what :func:`~topoopt.estimate._mp_kernel.merge_transfers` returns, by sorting)."""
    low = min(int(preds.min()), 0) if preds.size else 0    # barrier placeholders < 0
    width = int(preds.max()) + 1 - low if preds.size else 1
    pairs = np.sort(inv * width + (preds - low))
    if pairs.size:
        pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))]
    return pairs // width, pairs % width + low


def identical_blocks(seg: np.ndarray, pair: np.ndarray, sizes: np.ndarray, k_of: np.ndarray,
                      p_of: np.ndarray, weight: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray | None]:
    """Merge the flow blocks of segments that match flow by flow.

    The merged flows of one pass are sorted by segment, then by (source, destination)
    ``pair``; ``(k_of, p_of)`` are their distinct (flow, predecessor task) pairs, sorted
    by flow. Two segments' blocks match when they list the same pairs with the same
    bytes and the same predecessors: their flows then start together on the same
    routes and end together, so the first block's flows stand for the others'.

    ``weight``: the flows each flow already stands for (default one each).

    Returns
    -------
    flow_of : ndarray of int
        Per flow, the flow that stands for it (itself if kept).
    count : ndarray of int or None
        Per flow, the flows it stands for (0 if merged away); ``weight`` when no two
        blocks match.
    """
    cut = np.flatnonzero(seg[1:] != seg[:-1]) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [seg.size]])
    pstart = np.searchsorted(k_of, starts)
    pend = np.searchsorted(k_of, ends)
    # only blocks whose length and predecessor count another block shares can match
    shape = list(zip((ends - starts).tolist(), (pend - pstart).tolist()))
    common: dict[tuple[int, int], list[int]] = {}
    for b, key in enumerate(shape):
        common.setdefault(key, []).append(b)
    flow_of: np.ndarray | None = None
    count = np.empty(0, np.int64)      # set with flow_of
    for blocks in common.values():
        if len(blocks) < 2:
            continue
        first: dict[tuple[bytes, ...], int] = {}
        for b in blocks:
            a, e, pa, pe = int(starts[b]), int(ends[b]), int(pstart[b]), int(pend[b])
            block = (pair[a:e].tobytes(), sizes[a:e].tobytes(), (k_of[pa:pe] - a).tobytes(),
                     p_of[pa:pe].tobytes())
            r = first.setdefault(block, b)
            if r == b:
                continue
            if flow_of is None:
                flow_of = np.arange(seg.size)
                count = (np.ones(seg.size, np.int64) if weight is None
                         else weight.copy())
            ra = int(starts[r])
            flow_of[a:e] = np.arange(ra, ra + e - a)
            count[ra:ra + e - a] += count[a:e]
            count[a:e] = 0
    if flow_of is None:
        return np.arange(seg.size), weight
    return flow_of, count


def coflow_groups(k_of: np.ndarray, p_of: np.ndarray, keys: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group merged MP flows into coflows: flows with exactly the same predecessor tasks.

    ``(k_of[i], p_of[i])`` are the distinct (merged flow, predecessor task) pairs,
    sorted by flow, then task. Returns ``(group labels, member, first)`` with
    ``member[k]`` the coflow of merged flow ``k`` and ``first[c]`` coflow ``c``'s
    lowest member. Grouping by the exact predecessor set keeps the coflow graph
    acyclic whenever the per-pair graph is (a coflow then waits for nothing its
    members did not already wait for); grouping by the first predecessor alone made
    cycles when a consumer read two producer segments on one server.
    """
    # (predecessors < 0 are barrier placeholders: sets get ids from max(0, width) up)
    width = max(int(p_of.max()) + 1, 0) if p_of.size else 1
    count = np.bincount(k_of, minlength=keys)
    sig = np.empty(keys, np.int64)
    single = count == 1
    sig[k_of[single[k_of]]] = p_of[single[k_of]]
    multi = np.flatnonzero(~single & (count > 0))
    if multi.size:
        # several predecessors: one id per distinct set (rows of a padded matrix,
        # compared exactly), numbered after every task id
        row = np.full(keys, -1, np.int64)
        row[multi] = np.arange(multi.size)
        take = row[k_of] >= 0
        first = np.concatenate(([0], np.cumsum(count)))[:-1]
        col = np.arange(k_of.size) - first[k_of]
        mat = np.full((multi.size, int(count[multi].max())), -1, np.int64)
        mat[row[k_of[take]], col[take]] = p_of[take]
        sig[multi] = width + row_ranks(mat)
    return group_keys(sig)


def row_ranks(mat: np.ndarray) -> np.ndarray:
    """Per row of an int matrix, the rank of its value among the distinct rows in
    lexicographic order (``np.unique(mat, axis=0, return_inverse=True)[1]``, eight times
    faster: rows compared as bytes, only the distinct ones sorted by value)."""
    mat = np.ascontiguousarray(mat)
    rows = mat.view(np.dtype((np.void, mat.itemsize * mat.shape[1]))).ravel()
    _, first, inv = np.unique(rows, return_index=True, return_inverse=True)
    order = np.lexsort(mat[first].T[::-1])
    rank = np.empty(order.size, np.int64)
    rank[order] = np.arange(order.size)
    return rank[inv.ravel()]


def group_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(keys, return_index=True, return_inverse=True)`` by one stable
    argsort: (distinct keys, inverse, first index of each)."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    new = np.empty(sk.size, bool)
    new[:1] = True
    np.not_equal(sk[1:], sk[:-1], out=new[1:])
    inv = np.empty(keys.size, np.int64)
    inv[order] = np.cumsum(new) - 1
    return sk[new], inv, order[new]
