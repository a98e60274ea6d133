"""Semantic check of collective patterns with one-hot bit vectors (REACT Appendix A.3).

Every rank starts with a one-hot bit vector (its own rank) in each segment it owns,
the pattern is executed with exactly the rules of :mod:`topoopt.collectives.ten`
(reduce = add, copy = overwrite, reads at the start of a step), and the final state must
be the collective's postcondition: all bits in every segment of every rank (AllReduce),
or segment ``j`` = ``{owners[j]}`` everywhere (AllGather). Bit vectors catch double
counting too: a reduce that would add a contribution already present fails, since a
sum would then count it twice.

The simulation is vectorized over edges and over a batch of K variants of the same
pattern that differ only in their endpoints, which is how position-equivalent swaps are
found by brute force (:func:`semantic_ok_batch`).
"""

from __future__ import annotations

import numpy as np

from topoopt.collectives.ten import COLLECTIVES, Pattern, PatternError

__all__ = ["check_pattern", "check_structure", "semantic_ok", "semantic_ok_batch"]

# failure codes of the kernel, in the order they are tested
_REASONS = {
    1: "sends to itself",
    2: "sends a segment it holds no valid data for",
    3: "writes one segment twice in a step (a copy must be the only write)",
    4: "reduces a contribution that is already there (it would be counted twice)",
    5: "final state is not the collective's result",
}


def check_structure(p: Pattern) -> None:
    """Raise :class:`PatternError` unless the arrays form a well-formed pattern.

    Checks: known collective, n >= 2, ranks in range, no self-loops, steps >= 0 and
    non-decreasing, segments partition the buffer, every edge carries >= 1 segment, edge
    segments belong to their chunk only (chunks have disjoint segment sets), one edge
    per ``(step, chunk, src, dst)``, AllGather has owners and no reduce edges.
    """
    if p.collective not in COLLECTIVES:
        raise PatternError(f"collective {p.collective!r}: use one of {', '.join(COLLECTIVES)}")
    n, E, S = p.ranks, p.edges_count, len(p.segments)
    if n < 2:
        raise PatternError(f"ranks = {n}: a collective needs at least 2 ranks")
    arrays = (p.step, p.src, p.dst, p.chunk, p.reduce, p.phase)
    if any(a.shape != (E,) for a in arrays) or p.seg_ptr.shape != (E + 1,):
        raise PatternError("edge arrays have different lengths")
    if E == 0:
        raise PatternError("pattern has no edges")
    for name, a in (("src", p.src), ("dst", p.dst)):
        bad = np.flatnonzero((a < 0) | (a >= n))
        if bad.size:
            raise PatternError(f"edge {bad[0]}: {name} {a[bad[0]]} not in 0..{n - 1}")
    loops = np.flatnonzero(p.src == p.dst)
    if loops.size:
        raise PatternError(f"edge {loops[0]}: rank {p.src[loops[0]]} sends to itself")
    if p.step.min() < 0 or np.any(np.diff(p.step) < 0):
        raise PatternError("edge steps must be >= 0 and in non-decreasing order")
    if p.chunk.min() < 0 or p.phase.min() < 0 or p.phase.max() >= len(p.phase_names):
        raise PatternError("chunk ids must be >= 0 and phases index phase_names")
    # segments: a partition of [0, elements)
    order = np.argsort(p.segments[:, 0], kind="stable")
    seg = p.segments[order]
    if (S == 0 or seg[0, 0] != 0 or np.any(seg[:, 1] < seg[:, 0])
            or np.any(seg[1:, 0] != seg[:-1, 1]) or seg[-1, 1] != p.elements):
        raise PatternError("segments must be element ranges that partition the buffer")
    counts = np.diff(p.seg_ptr)
    if p.seg_ptr[0] != 0 or np.any(counts < 1) or p.seg_ptr[-1] != p.seg_idx.size:
        raise PatternError("every edge must carry at least one segment")
    if p.seg_idx.size and (p.seg_idx.min() < 0 or p.seg_idx.max() >= S):
        raise PatternError(f"edge segment ids must be in 0..{S - 1}")
    item_chunk = np.repeat(p.chunk, counts)
    pairs = np.unique(np.stack([p.seg_idx, item_chunk], 1), axis=0)
    dup = np.flatnonzero(np.diff(pairs[:, 0]) == 0)
    if dup.size:
        j = pairs[dup[0], 0]
        raise PatternError(f"segment {j} is carried by chunks {pairs[dup[0], 1]} and "
                           f"{pairs[dup[0] + 1, 1]}: chunks must be independent")
    keys = np.stack([p.step, p.chunk, p.src, p.dst], 1)
    if np.unique(keys, axis=0).shape[0] != E:
        raise PatternError("two edges share (step, chunk, src, dst): merge their segments")
    if p.collective == "allgather":
        if p.owners is None or p.owners.shape != (S,):
            raise PatternError("an AllGather pattern needs one owner rank per segment")
        if p.owners.min() < 0 or p.owners.max() >= n:
            raise PatternError(f"segment owners must be ranks in 0..{n - 1}")
        if p.reduce.any():
            raise PatternError("an AllGather pattern only copies (no reduce edges)")


def _items(p: Pattern, edges: np.ndarray, seg_map: np.ndarray):
    """(edge, local segment) items of ``edges``, sorted by step, with step boundaries."""
    counts = np.diff(p.seg_ptr)[edges]
    item_edge = np.repeat(edges, counts)
    starts = p.seg_ptr[edges]
    offs = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    item_seg = seg_map[p.seg_idx[np.repeat(starts, counts) + offs]]
    T = p.steps
    bounds = np.searchsorted(p.step[item_edge], np.arange(T + 1))
    return item_edge, item_seg, bounds


def semantic_ok_batch(p: Pattern, src: np.ndarray, dst: np.ndarray,
                      chunk: int | None = None, seg_idx: np.ndarray | None = None,
                      return_reason: bool = False, start: int = 0,
                      state0: np.ndarray | None = None, record: list | None = None):
    """Run the bit-vector check on K endpoint variants of ``p`` at once.

    Parameters
    ----------
    p : Pattern
        Gives the structure: steps, chunks, segments, ops (assumed well formed).
    src, dst : ndarray, shape (K, E)
        Endpoints of every edge in each variant.
    chunk : int, optional
        Only simulate this chunk's edges and segments (chunks are independent, so a
        variant that only changes chunk ``c`` is decided by chunk ``c`` alone).
    seg_idx : ndarray, optional
        Replacement for ``p.seg_idx`` (same CSR layout), shared by all variants.
    return_reason : bool
        Also return the failure code per variant (0 = ok).
    start, state0 : int, ndarray of shape (n, S, n)
        Resume at step ``start`` from a known state (shared by all variants): variants
        that only differ from step ``start`` on need not replay the common prefix.
    record : list, optional
        Appended with a copy of the state (K, n, S, n) before every step and at the end.

    Returns
    -------
    ok : ndarray of bool, shape (K,)
    """
    src = np.atleast_2d(np.asarray(src, np.int64))
    dst = np.atleast_2d(np.asarray(dst, np.int64))
    K, n = src.shape[0], p.ranks
    if seg_idx is not None and seg_idx is not p.seg_idx:
        p = p.replace(seg_idx=seg_idx)
    S_all = len(p.segments)
    if chunk is None:
        edges = np.arange(p.edges_count)
        segs = np.arange(S_all)
    else:
        edges = np.flatnonzero(p.chunk == chunk)
        segs = p.chunk_segments(chunk)
    seg_map = np.full(S_all, -1, np.int64)
    seg_map[segs] = np.arange(len(segs))
    S = len(segs)
    item_edge, item_seg, bounds = _items(p, edges, seg_map)
    reason = np.zeros(K, np.int64)
    _fail(reason, (src[:, edges] == dst[:, edges]).any(1), 1)
    src_c = np.clip(src, 0, n - 1)
    dst_c = np.clip(dst, 0, n - 1)

    state = _initial_state(p, K, segs, state0)
    flat = state.reshape(K * n * S, n)
    kk = np.arange(K)[:, None]
    for t in range(start, p.steps):
        if record is not None:
            record.append(state.copy())
        lo, hi = bounds[t], bounds[t + 1]
        if lo == hi:
            continue
        e = item_edge[lo:hi]
        s = item_seg[lo:hi][None, :]
        vals = flat[(kk * n + src_c[:, e]) * S + s]          # (K, I, n) read before writes
        _fail(reason, ~vals.any(-1).all(1), 2)
        rows = (kk * n + dst_c[:, e]) * S + s                 # (K, I) written rows
        _write_step(flat, rows, vals, p.reduce[e], reason, n * S)
    if record is not None:
        record.append(state.copy())
    _fail(reason, ~_postcondition(p, state, segs), 5)
    ok = reason == 0
    return (ok, reason) if return_reason else ok


def _fail(reason: np.ndarray, mask: np.ndarray, code: int) -> None:
    """Record failure ``code`` for the variants in ``mask`` that have not failed yet."""
    reason[(reason == 0) & mask] = code


def _initial_state(p: Pattern, K: int, segs: np.ndarray, state0: np.ndarray | None
                   ) -> np.ndarray:
    """The bit vectors (K, n, S, n) before the first step: ``state0`` if given, else
    one-hot contributions (every rank its own in every segment for AllReduce, the
    owner's in its segment for AllGather)."""
    n, S = p.ranks, len(segs)
    state = np.zeros((K, n, S, n), bool)
    if state0 is not None:
        state[:] = state0[None]
    elif p.collective == "allreduce":
        r = np.arange(n)
        state[:, r, :, r] = True
    else:
        own = _owners(p)[segs]
        state[:, own, np.arange(S), own] = True
    return state


def _write_step(flat: np.ndarray, rows: np.ndarray, vals: np.ndarray, red: np.ndarray,
                reason: np.ndarray, per_variant: int) -> None:
    """Apply one step's writes to ``flat`` (rows of every variant's state): copies
    overwrite, reduces add. A copy that shares its row with another write fails with
    code 3; a reduce that adds a bit already there fails with code 4."""
    K, n = reason.size, flat.shape[1]
    rows_r, vals_r = rows[:, red].ravel(), vals[:, red].reshape(-1, n)
    rows_c, vals_c = rows[:, ~red].ravel(), vals[:, ~red].reshape(-1, n)
    if rows_c.size:
        uc, cc = np.unique(rows_c, return_counts=True)
        clash = uc[cc > 1]
        if rows_r.size:
            clash = np.union1d(clash, np.intersect1d(uc, rows_r))
        bad = np.zeros(K, bool)
        bad[clash // per_variant] = True
        _fail(reason, bad, 3)
    if rows_r.size:
        ur, inv = np.unique(rows_r, return_inverse=True)
        acc = np.zeros((len(ur), n), np.int16)
        np.add.at(acc, inv, vals_r)
        acc += flat[ur]
        bad = np.zeros(K, bool)
        bad[ur[(acc > 1).any(1)] // per_variant] = True
        _fail(reason, bad, 4)
        flat[ur] = acc > 0
    if rows_c.size:
        flat[rows_c] = vals_c


def _postcondition(p: Pattern, state: np.ndarray, segs: np.ndarray) -> np.ndarray:
    """Per variant: whether the final state is the collective's result."""
    n, S = p.ranks, len(segs)
    if p.collective == "allreduce":
        return np.asarray(state.all(axis=(1, 2, 3)))
    want = np.zeros((S, n), bool)
    want[np.arange(S), _owners(p)[segs]] = True
    return (state == want[None, None]).all(axis=(1, 2, 3))


def _owners(p: Pattern) -> np.ndarray:
    """The owner rank of each segment (an AllGather has them: :func:`check_structure`)."""
    if p.owners is None:
        raise PatternError(f"pattern {p.name!r} ({p.collective}) has no segment owners")
    return p.owners


def semantic_ok(p: Pattern) -> bool:
    """True if ``p`` is well formed and implements its collective (no exception)."""
    try:
        check_pattern(p)
    except PatternError:
        return False
    return True


def check_pattern(p: Pattern) -> None:
    """Raise :class:`PatternError` unless ``p`` implements its collective.

    Structure first (:func:`check_structure`), then the one-hot bit-vector execution
    (REACT App. A.3) with the runtime's rules (module docstring of
    :mod:`topoopt.collectives.ten`).

    Examples
    --------
    >>> from topoopt.collectives import ring_allreduce
    >>> check_pattern(ring_allreduce(range(4), size=4096))  # passes silently
    """
    check_structure(p)
    ok, reason = semantic_ok_batch(p, p.src[None], p.dst[None], return_reason=True)
    if not ok[0]:
        code = int(reason[0])
        where = _locate(p, code) if code in (2, 3, 4) else ""
        raise PatternError(f"pattern {p.name!r} ({p.collective}, n={p.ranks}) is not "
                           f"correct: a rank {_REASONS[code]}{where}")


def _locate(p: Pattern, code: int) -> str:
    """Find the first step at which failure ``code`` happens (for the message)."""
    for t in range(p.steps):
        sel = p.step <= t
        q = Pattern.from_edges(p.name, p.collective, p.ranks, p.segments,
                               [(p.step[e], p.src[e], p.dst[e], p.chunk[e],
                                 p.edge_segments(e), p.reduce[e], p.phase[e])
                                for e in np.flatnonzero(sel).tolist()],
                               itemsize=p.itemsize, owners=p.owners,
                               phase_names=p.phase_names, sort=False)
        _, r = semantic_ok_batch(q, q.src[None], q.dst[None], return_reason=True)
        if r[0] == code:
            return f" at step {t}"
    return ""
