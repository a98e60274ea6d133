"""Safe transforms of a collective pattern: node swaps, their classes, pruning (REACT §5.3).

Three swap kinds, from coarse to fine:

1. ``global``: swap every instance of ranks ``a`` and ``b`` (a permutation of the
   rank-to-device map). For AllGather the two ranks' own segments are swapped too, so
   the output layout (segment ``j`` = rank ``j``'s data) is kept.
2. ``chunk``: the same, inside one chunk sub-graph only.
3. ``position``: swap one TEN vertex ``(t, a)`` with ``(t, b)`` of one chunk: chunk edges
   arriving at time ``t`` (step ``t-1``) into ``a`` go to ``b`` and vice versa, chunk
   edges leaving at step ``t`` from ``a`` leave from ``b`` and vice versa. Which pairs are
   safe is found once per pattern by brute force with the bit-vector check (App. A.3),
   batched over all pairs (:func:`position_classes`).

Every candidate is re-checked (:func:`topoopt.collectives.check_pattern` semantics)
before it is offered, so no transform can break a collective. Pruning (§5.3.2): with
``deg(t, r) = max(in, out)`` of vertex ``(t, r)`` over all chunks, a swap of ``a`` and ``b``
is viable only if neither rank's peak per-step degree afterwards exceeds the peak of
the rank whose place it took. (Under this reading the paper's Fig. 1 example comes
out as stated: for congested node 3 in the 16-rank dual tree, nodes 4 and 12 are
pruned and node 2 is kept.) Priority: swaps that lower the congested node's total
degree in the congested direction ("green") before the other viable ones ("yellow");
within each, position before chunk before global swaps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topoopt.collectives.check import semantic_ok_batch
from topoopt.collectives.ten import Pattern, degrees

__all__ = ["Swap", "apply_swap", "apply_swaps", "position_classes", "position_work",
           "POSITION_WORK_LIMIT", "PositionSpace", "candidate_swaps", "is_viable",
           "lowers_degree", "peak_degrees", "KINDS"]

#: Swap kinds, finest first (the priority order of §5.3.1).
KINDS = ("position", "chunk", "global")


@dataclass(frozen=True, order=True)
class Swap:
    """One transform: swap ranks ``a`` and ``b`` (everywhere, in ``chunk``, or at vertex
    time ``step`` of ``chunk``)."""

    kind: str
    a: int
    b: int
    chunk: int = -1
    step: int = -1

    def __str__(self) -> str:
        if self.kind == "global":
            return f"{self.a}<->{self.b}"
        if self.kind == "chunk":
            return f"{self.a}<->{self.b}@c{self.chunk}"
        return f"{self.a}<->{self.b}@c{self.chunk}t{self.step}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "a": self.a, "b": self.b, "chunk": self.chunk,
                "step": self.step}


def _swap_values(x: np.ndarray, mask: np.ndarray, a: int, b: int) -> np.ndarray:
    out = x.copy()
    out[mask & (x == a)] = b
    out[mask & (x == b)] = a
    return out


def _segment_map(p: Pattern, a: int, b: int) -> np.ndarray | None:
    """AllGather: the segment permutation that goes with swapping ranks a and b."""
    if p.collective != "allgather":
        return None
    sa, sb = np.flatnonzero(p.owners == a), np.flatnonzero(p.owners == b)
    if len(sa) != len(sb):
        return None
    perm = np.arange(len(p.segments))
    perm[sa], perm[sb] = sb, sa
    return perm


def apply_swap(p: Pattern, swap: Swap) -> Pattern:
    """The pattern after ``swap`` (not checked; see :func:`candidate_swaps`).

    Examples
    --------
    >>> from topoopt.collectives import ring_allreduce
    >>> q = apply_swap(ring_allreduce([0, 1, 2, 3], size=64), Swap("global", 1, 2))
    >>> q.src[:4].tolist(), q.dst[:4].tolist()
    ([0, 2, 1, 3], [2, 1, 3, 0])
    """
    a, b = swap.a, swap.b
    if swap.kind == "position":
        in_chunk = p.chunk == swap.chunk
        src = _swap_values(p.src, in_chunk & (p.step == swap.step), a, b)
        dst = _swap_values(p.dst, in_chunk & (p.step == swap.step - 1), a, b)
        return p.replace(src=src, dst=dst)
    mask = np.ones(p.edges_count, bool) if swap.kind == "global" else p.chunk == swap.chunk
    src = _swap_values(p.src, mask, a, b)
    dst = _swap_values(p.dst, mask, a, b)
    perm = _segment_map(p, a, b)
    seg_idx = None
    if perm is not None:
        item_mask = np.repeat(mask, np.diff(p.seg_ptr))
        seg_idx = np.where(item_mask, perm[p.seg_idx], p.seg_idx)
    return p.replace(src=src, dst=dst, seg_idx=seg_idx)


def apply_swaps(p: Pattern, swaps) -> Pattern:
    """Apply several swaps in order."""
    for s in swaps:
        p = apply_swap(p, s)
    return p


#: Work (:func:`position_work`) above which the position classes are not computed (the
#: brute force would take too long; docs/tuning.md, REACT). A 24-rank ring AllReduce
#: needs ~4e8; the 4-ring AllReduce of a 128-server plan ~3e13.
POSITION_WORK_LIMIT = 3e9


def position_work(p: Pattern) -> float:
    """Upper bound of :func:`position_classes`' work: candidate swaps x state bits.

    Per chunk, at most ``(steps + 1) n^2`` candidate swaps, each checked on a state of
    ``n x segments x n`` bits.
    """
    n = p.ranks
    return float(sum((p.steps + 1) * n * n * n * len(p.chunk_segments(c)) * n
                     for c in range(p.chunks)))


def position_classes(p: Pattern) -> dict[tuple[int, int], frozenset[tuple[int, int]]]:
    """Safe position swaps of ``p`` by brute force (REACT App. A.3).

    For every chunk ``c`` and vertex time ``t``, every pair of ranks ``a < b`` of which
    at least one has a chunk-``c`` edge at ``(t, ·)`` is swapped (:class:`Swap` kind
    ``position``) and the chunk re-checked with one-hot bit vectors; all pairs of a chunk
    are checked in one vectorized batch. Pairs whose swap leaves the chunk unchanged
    are skipped.

    Returns
    -------
    dict
        ``(chunk, t) -> frozenset of (a, b)`` pairs that keep the collective correct.
        Connected components of these pairs are the "colours" of REACT Fig. 2.
    """
    out: dict[tuple[int, int], set[tuple[int, int]]] = {}
    n = p.ranks
    for c in range(p.chunks):
        sub = _chunk_pattern(p, c)
        st, sr, ds = sub.step, sub.src, sub.dst
        cand = set()
        for t in range(sub.steps + 1):
            active = np.union1d(sr[st == t], ds[st == t - 1]).tolist()
            for a in active:
                for b in range(n):
                    if b != a:
                        cand.add((t, min(a, b), max(a, b)))
        if not cand:
            continue
        cand_arr = np.array(sorted(cand), np.int64)
        ok = np.zeros(len(cand_arr), bool)
        states: list = []                       # the unmodified chunk's state per step
        semantic_ok_batch(sub, sr[None], ds[None], record=states)
        first = np.maximum(cand_arr[:, 0] - 1, 0)   # a swap at time t changes steps >= t-1
        for s0 in np.unique(first):
            rows = np.flatnonzero(first == s0)
            for lo in range(0, len(rows), 4096):
                idx = rows[lo:lo + 4096]
                ts, xs, ys = cand_arr[idx, :1], cand_arr[idx, 1:2], cand_arr[idx, 2:3]
                ms, md = st[None] == ts, st[None] == ts - 1
                src = np.where(ms & (sr == xs), ys, np.where(ms & (sr == ys), xs, sr))
                dst = np.where(md & (ds == xs), ys, np.where(md & (ds == ys), xs, ds))
                ok[idx] = semantic_ok_batch(sub, src, dst, start=int(s0),
                                            state0=states[int(s0)][0])
        for (t, a, b) in cand_arr[ok].tolist():
            out.setdefault((c, t), set()).add((a, b))
    return {k: frozenset(v) for k, v in out.items()}


def _chunk_pattern(p: Pattern, c: int) -> Pattern:
    """Chunk ``c`` of ``p`` on its own (its edges and segments; steps start at 0 as in p)."""
    sel = np.flatnonzero(p.chunk == c)
    segs = p.chunk_segments(c)
    local = np.full(len(p.segments), -1, np.int64)
    local[segs] = np.arange(len(segs))
    rows = [(p.step[e], p.src[e], p.dst[e], 0, tuple(local[list(p.edge_segments(e))]),
             p.reduce[e], p.phase[e]) for e in sel.tolist()]
    elements = np.cumsum(np.concatenate([[0], p.segments[segs, 1] - p.segments[segs, 0]]))
    return Pattern.from_edges(p.name, p.collective, p.ranks,
                              np.stack([elements[:-1], elements[1:]], 1), rows,
                              itemsize=p.itemsize,
                              owners=None if p.owners is None else p.owners[segs],
                              phase_names=p.phase_names, sort=False)


@dataclass(frozen=True)
class PositionSpace:
    """Position classes of the initial pattern plus where each original vertex is now.

    ``sigma[c, t, r]`` is the rank now at the position rank ``r`` held at vertex ``(t, r)``
    of chunk ``c`` in the initial pattern; transforms update it, so classes computed
    once (at the start of the job, §5.3.1) keep naming the right ranks. ``skipped``
    says the classes were wanted but the pattern is too large for their brute force
    (:data:`POSITION_WORK_LIMIT`): only chunk and global swaps are offered then.
    """

    classes: dict
    sigma: np.ndarray
    skipped: bool = False

    @classmethod
    def of(cls, p: Pattern, with_positions: bool = True) -> "PositionSpace":
        sigma = np.broadcast_to(np.arange(p.ranks), (p.chunks, p.steps + 1, p.ranks)).copy()
        sigma.setflags(write=False)
        skipped = with_positions and position_work(p) > POSITION_WORK_LIMIT
        classes = position_classes(p) if with_positions and not skipped else {}
        return cls(classes, sigma, skipped)

    def after(self, swap: Swap) -> "PositionSpace":
        """The space after ``swap`` was applied to the current pattern."""
        s = self.sigma.copy()
        a, b = swap.a, swap.b
        if swap.kind == "global":
            view = s
        elif swap.kind == "chunk":
            view = s[swap.chunk]
        else:
            view = s[swap.chunk, swap.step]
        ia, ib = view == a, view == b
        view[ia], view[ib] = b, a
        s.setflags(write=False)
        return PositionSpace(self.classes, s, self.skipped)

    def position_swaps(self, node: int) -> list[Swap]:
        """Position swaps of the current pattern that move ``node``, from the classes."""
        out = []
        for (c, t), pairs in self.classes.items():
            cur = self.sigma[c, t]
            for a, b in pairs:
                ra, rb = int(cur[a]), int(cur[b])
                if node in (ra, rb):
                    other = rb if ra == node else ra
                    out.append(Swap("position", node, other, c, t))
        return out


def peak_degrees(p: Pattern) -> np.ndarray:
    """Peak over steps of each rank's per-step degree ``max(in, out)``, shape (n,)."""
    indeg, outdeg = degrees(p)
    return np.maximum(indeg, outdeg).max(axis=0)


def is_viable(old: Pattern, new: Pattern, swap: Swap) -> bool:
    """Degree pruning of §5.3.2: neither swapped rank's peak per-step degree may exceed
    the old peak of the rank whose place it took."""
    before, after = peak_degrees(old), peak_degrees(new)
    return after[swap.a] <= before[swap.b] and after[swap.b] <= before[swap.a]


def _direction_totals(p: Pattern, node: int) -> tuple[int, int]:
    return int((p.dst == node).sum()), int((p.src == node).sum())


def lowers_degree(old: Pattern, new: Pattern, node: int, incoming: bool,
                  outgoing: bool) -> bool:
    """True if ``node`` has fewer flows in its congested direction(s) after the swap
    (the "green" swaps of REACT Fig. 1)."""
    i0, o0 = _direction_totals(old, node)
    i1, o1 = _direction_totals(new, node)
    before = i0 * incoming + o0 * outgoing
    after = i1 * incoming + o1 * outgoing
    return after < before


def candidate_swaps(p: Pattern, space: PositionSpace, node: int, *, incoming: bool = True,
                    outgoing: bool = True, exclude: frozenset[int] = frozenset()
                    ) -> list[list[tuple[Swap, Pattern]]]:
    """Viable swaps that move ``node``, grouped by priority (§5.3.1, §5.3.2).

    Every candidate is semantically checked and degree-pruned. Groups, best first:
    green position, green chunk, green global, yellow position, yellow chunk, yellow
    global swaps (green: lowers ``node``'s total degree in its congested direction).
    Partners in ``exclude`` are skipped. Chunk swaps are not offered when the pattern has
    one chunk (they equal global swaps).

    Returns
    -------
    list of 6 lists of ``(Swap, new pattern)``
    """
    n = p.ranks
    partners = [y for y in range(n) if y != node and y not in exclude]
    raw: list[Swap] = [s for s in space.position_swaps(node)
                       if (s.b if s.a == node else s.a) not in exclude]
    if p.chunks > 1:
        node_chunks = np.unique(p.chunk[(p.src == node) | (p.dst == node)])
        raw += [Swap("chunk", node, y, int(c)) for c in node_chunks for y in partners]
    raw += [Swap("global", node, y) for y in partners]
    raw = list(dict.fromkeys(raw))
    if not raw:
        return [[] for _ in range(6)]
    news = [apply_swap(p, s) for s in raw]
    # Relabelings of an AllReduce need no re-check: every rank starts with its own
    # contribution to every segment and must end with all of them, so renaming a rank
    # everywhere (global) or within one independent chunk maps a correct pattern to a
    # correct one (the batch check of them all is what made a 128-server leader step
    # slow: docs/tuning.md, REACT).
    relabel = p.collective == "allreduce"
    ok = np.array([relabel and s.kind != "position" for s in raw], bool)
    # semantic re-check of the other candidates in one batch (same segment layout)
    todo = np.flatnonzero(~ok).tolist()
    same_segs = [i for i in todo if news[i].seg_idx is p.seg_idx]
    other = sorted(set(todo) - set(same_segs))
    if same_segs:
        ok[same_segs] = semantic_ok_batch(p, np.stack([news[i].src for i in same_segs]),
                                          np.stack([news[i].dst for i in same_segs]))
    for i in other:
        ok[i] = semantic_ok_batch(news[i], news[i].src[None], news[i].dst[None])[0]
    groups: list[list[tuple[Swap, Pattern]]] = [[] for _ in range(6)]
    for s, q, good in zip(raw, news, ok):
        if not good or not is_viable(p, q, s):
            continue
        if q.signature() == p.signature():
            continue
        green = lowers_degree(p, q, node, incoming, outgoing)
        groups[(0 if green else 3) + KINDS.index(s.kind)].append((s, q))
    return groups
