"""Per-rank schedules of a collective pattern: what one rank sends, receives and adds (REACT §6.1).

RCollective never interprets a :class:`~topoopt.collectives.Pattern` while it runs: it
first compiles, once per (pattern, rank), the rank's part of the TEN into a
:class:`LocalSchedule` -- per chunk sub-graph, the rank's steps in order, each with the
element ranges to send to whom and what to do with what arrives -- and then executes that
literally (the contract of :mod:`topoopt.collectives.ten`). Compiling is pure Python and
numpy, so it is tested without torch.

Buffers a step needs beside the user's tensor live in one scratch array per chunk (steps
of a chunk run one after another, so they reuse it): a receive that reduces, or a copy
whose range the rank also sends in the same step, lands in scratch and is applied after
the step; a send of several non-adjacent ranges is packed into scratch first. A copy
that nothing else touches in its step is received straight into the buffer.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from topoopt._require import require_int
from topoopt.collectives.ten import Pattern, PatternError

__all__ = ["Transfer", "Step", "LocalSchedule", "local_schedule", "check_local_schedules",
           "split_chunks", "pipeline_depth", "piece_lanes",
           "lockstep_order", "pattern_fingerprint"]


@dataclass(frozen=True)
class Transfer:
    """One flow as seen by one of its endpoints.

    Attributes
    ----------
    edge : int
        Flow id (edge index of the pattern); also the p2p tag.
    peer : int
        The other endpoint (group rank).
    ranges : tuple of (start, stop)
        Element ranges of the buffer the flow carries, in segment order (adjacent
        segments merged).
    size : int
        Elements carried.
    reduce : bool
        Receiver adds (True) or copies (False).
    offset : int
        Where the flow's data sits in the chunk's scratch array, or -1 when it is sent
        from / received into the buffer directly (one range, nothing else touching it).
    """

    edge: int
    peer: int
    ranges: tuple[tuple[int, int], ...]
    size: int
    reduce: bool
    offset: int = -1


@dataclass(frozen=True)
class Step:
    """One rank's part of one (step, chunk) of the TEN."""

    step: int
    chunk: int
    sends: tuple[Transfer, ...]
    recvs: tuple[Transfer, ...]
    scratch: int


@dataclass(frozen=True)
class LocalSchedule:
    """Rank ``rank``'s whole part of a pattern.

    Attributes
    ----------
    rank, ranks, elements, edges : int
        This rank, n, buffer length, E.
    collective : str
    chunks : tuple of tuple of Step
        ``chunks[c]``: the rank's steps of chunk ``c`` in step order (may be empty).
    scratch : tuple of int
        Elements of scratch per chunk (max over its steps).
    own : tuple of (start, stop)
        AllGather: the ranges this rank contributes (segments it owns, in segment
        order); empty for AllReduce.
    """

    rank: int
    ranks: int
    elements: int
    edges: int
    collective: str
    chunks: tuple[tuple[Step, ...], ...]
    scratch: tuple[int, ...]
    own: tuple[tuple[int, int], ...]

    @property
    def own_size(self) -> int:
        """Elements this rank contributes to an AllGather."""
        return sum(b - a for a, b in self.own)

    @property
    def max_recvs(self) -> int:
        """Most receives of one step (sizes the pool that times concurrent receives)."""
        return max((len(s.recvs) for steps in self.chunks for s in steps), default=0)


def _ranges(p: Pattern, segs) -> tuple[tuple[int, int], ...]:
    """Element ranges of segment ids ``segs`` (in that order), adjacent ones merged."""
    out: list[list[int]] = []
    for j in segs:
        a, b = int(p.segments[j, 0]), int(p.segments[j, 1])
        if out and out[-1][1] == a:
            out[-1][1] = b
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def _overlaps(r1, r2) -> bool:
    return any(a < d and c < b for a, b in r1 for c, d in r2)


def local_schedule(pattern: Pattern, rank: int) -> LocalSchedule:
    """Compile ``rank``'s part of ``pattern`` (Algorithm 2's ``LocalGraph``).

    Parameters
    ----------
    pattern : Pattern
        A pattern that passes :func:`topoopt.collectives.check_pattern`.
    rank : int
        Group rank in ``0..n-1``.

    Returns
    -------
    LocalSchedule

    Examples
    --------
    >>> from topoopt.collectives import ring_allreduce
    >>> s = local_schedule(ring_allreduce([0, 1, 2], size=24), 0)
    >>> [(st.step, [t.peer for t in st.sends], [t.peer for t in st.recvs])
    ...  for st in s.chunks[0]]
    [(0, [1], []), (2, [], [2]), (3, [1], [])]

    References
    ----------
    REACT §6.1 and Appendix B.1 (Algorithm 2).
    """
    require_int("rank", rank, minimum=0, maximum=pattern.ranks - 1)
    mine = np.flatnonzero((pattern.src == rank) | (pattern.dst == rank))
    by_key: dict[tuple[int, int], list[int]] = {}
    for e in mine.tolist():
        by_key.setdefault((int(pattern.chunk[e]), int(pattern.step[e])), []).append(e)
    C = pattern.chunks
    chunks: list[list[Step]] = [[] for _ in range(C)]
    scratch = [0] * C
    for (c, t), edges in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        send_e = [e for e in edges if pattern.src[e] == rank]
        recv_e = [e for e in edges if pattern.dst[e] == rank]
        rng = {e: _ranges(pattern, pattern.edge_segments(e)) for e in edges}
        sent = tuple(r for e in send_e for r in rng[e])
        offset = 0
        recvs = []
        for e in recv_e:
            size = sum(b - a for a, b in rng[e])
            red = bool(pattern.reduce[e])
            direct = not red and len(rng[e]) == 1 and not _overlaps(rng[e], sent)
            recvs.append(Transfer(e, int(pattern.src[e]), rng[e], size, red,
                                  -1 if direct else offset))
            if not direct:
                offset += size
        sends = []
        for e in send_e:
            size = sum(b - a for a, b in rng[e])
            packed = len(rng[e]) > 1
            sends.append(Transfer(e, int(pattern.dst[e]), rng[e], size,
                                  bool(pattern.reduce[e]), offset if packed else -1))
            if packed:
                offset += size
        chunks[c].append(Step(t, c, tuple(sends), tuple(recvs), offset))
        scratch[c] = max(scratch[c], offset)
    own: tuple[tuple[int, int], ...] = ()
    if pattern.collective == "allgather" and pattern.owners is not None:
        own = _ranges(pattern, np.flatnonzero(pattern.owners == rank).tolist())
    return LocalSchedule(rank, pattern.ranks, pattern.elements, pattern.edges_count,
                         pattern.collective, tuple(tuple(s) for s in chunks),
                         tuple(scratch), own)


def check_local_schedules(pattern: Pattern, schedules) -> None:
    """Raise :class:`PatternError` unless the n schedules execute exactly ``pattern``.

    Every edge must be sent once, by its source, and received once, by its destination,
    with the edge's ranges, size and op; each rank's steps of a chunk must be in
    increasing step order; scratch slices must fit and not overlap within a step.
    """
    E = pattern.edges_count
    sent = np.zeros(E, np.int64)
    got = np.zeros(E, np.int64)
    if len(schedules) != pattern.ranks:
        raise PatternError(f"need {pattern.ranks} schedules, got {len(schedules)}")
    for r, s in enumerate(schedules):
        if s.rank != r or s.edges != E or s.elements != pattern.elements:
            raise PatternError(f"schedule {r} does not belong to this pattern")
        for c, steps in enumerate(s.chunks):
            order = [st.step for st in steps]
            if order != sorted(set(order)):
                raise PatternError(f"rank {r} chunk {c}: steps out of order {order}")
            for st in steps:
                used: list[tuple[int, int]] = []
                for kind, items in (("send", st.sends), ("recv", st.recvs)):
                    for x in items:
                        e = x.edge
                        want_peer = pattern.dst[e] if kind == "send" else pattern.src[e]
                        me = pattern.src[e] if kind == "send" else pattern.dst[e]
                        if (me != r or x.peer != want_peer or pattern.step[e] != st.step
                                or pattern.chunk[e] != c
                                or x.ranges != _ranges(pattern, pattern.edge_segments(e))
                                or x.size != sum(b - a for a, b in x.ranges)
                                or x.reduce != bool(pattern.reduce[e])):
                            raise PatternError(f"rank {r}: {kind} of edge {e} does not "
                                               "match the pattern")
                        (sent if kind == "send" else got)[e] += 1
                        if x.offset >= 0:
                            used.append((x.offset, x.offset + x.size))
                if any(b > st.scratch for _, b in used) or _self_overlap(used):
                    raise PatternError(f"rank {r} step {st.step}: scratch slices clash")
    bad = np.flatnonzero((sent != 1) | (got != 1))
    if bad.size:
        raise PatternError(f"edge {bad[0]} is sent {sent[bad[0]]} and received "
                           f"{got[bad[0]]} times (want 1 and 1)")


def _self_overlap(ranges) -> bool:
    ranges = sorted(ranges)
    return any(ranges[i][1] > ranges[i + 1][0] for i in range(len(ranges) - 1))


def lockstep_order(schedule: LocalSchedule) -> list[list[Step]]:
    """The rank's steps grouped by global step (all chunks of step t together).

    The single-threaded schedule (backends without concurrent p2p from threads, e.g.
    NCCL): at step t post every send and receive of every chunk, wait for all, apply.
    It is the global step order of :mod:`topoopt.collectives.ten`, deadlock free since
    every rank posts all of a step's operations before waiting.
    """
    groups: dict[int, list[Step]] = {}
    for steps in schedule.chunks:
        for st in steps:
            groups.setdefault(st.step, []).append(st)
    return [groups[t] for t in sorted(groups)]


def pattern_fingerprint(pattern: Pattern) -> int:
    """A 31-bit checksum of everything a runtime executes (ranks, segments, edges)."""
    h = 0
    for a in (pattern.segments, pattern.step, pattern.src, pattern.dst, pattern.chunk,
              pattern.reduce, pattern.seg_ptr, pattern.seg_idx):
        h = zlib.crc32(np.ascontiguousarray(a).tobytes(), h)
    h = zlib.crc32(f"{pattern.collective}/{pattern.ranks}/{pattern.elements}".encode(), h)
    return h & 0x7FFFFFFF


def split_chunks(pattern: Pattern, pieces: int) -> Pattern:
    """``pattern`` with every chunk cut into ``pieces`` independent sub-chunks (pipelining).

    Segment ``j`` becomes ``pieces`` consecutive sub-segments ``j * pieces + k``; edge
    ``e`` becomes edges ``e * pieces + k`` (same step, endpoints and op) carrying the
    ``k``-th sub-segment of each of its segments, in sub-chunk ``chunk * pieces + k``.
    Every element is reduced and copied along exactly the same edges as before, so the
    result is the same collective; but a rank can forward piece ``k`` of a flow while
    piece ``k + 1`` is still arriving, as NCCL and gloo pipeline their rings and trees
    (without it a tree waits for a whole flow at every level).

    Parameters
    ----------
    pattern : Pattern
    pieces : int
        Sub-chunks per chunk, at most the smallest segment's element count.

    Returns
    -------
    Pattern
        Edge ``e * pieces + k`` is piece ``k`` of ``pattern``'s edge ``e``.

    References
    ----------
    NCCL pipelines each channel's ring and tree in slices of a chunk (Jeaugey, "Massively
    scale your deep learning training with NCCL 2.4", 2019).
    """
    K = int(pieces)
    seg_len = pattern.segments[:, 1] - pattern.segments[:, 0]
    require_int("pieces", K, minimum=1, maximum=max(int(seg_len.min()) if seg_len.size else 1, 1))
    if K == 1:
        return pattern
    cuts = pattern.segments[:, :1] + (seg_len[:, None] * np.arange(K + 1)) // K
    segs = np.stack([cuts[:, :-1], cuts[:, 1:]], axis=-1).reshape(-1, 2)
    if pattern.edges_count and np.any(np.diff(pattern.step) < 0):
        raise PatternError("split_chunks needs edges in non-decreasing step order")
    edges = []
    for e in range(pattern.edges_count):
        segs_e = pattern.edge_segments(e)
        t, a, b, c = (int(pattern.step[e]), int(pattern.src[e]), int(pattern.dst[e]),
                      int(pattern.chunk[e]))
        red, ph = bool(pattern.reduce[e]), int(pattern.phase[e])
        edges += [(t, a, b, c * K + k, tuple(j * K + k for j in segs_e), red, ph)
                  for k in range(K)]
    owners = None if pattern.owners is None else np.repeat(pattern.owners, K)
    return Pattern.from_edges(pattern.name, pattern.collective, pattern.ranks, segs, edges,
                              itemsize=pattern.itemsize, owners=owners,
                              phase_names=pattern.phase_names, sort=False)


def pipeline_depth(pattern: Pattern, piece_bytes: float, max_subchunks: int = 4096) -> int:
    """Pieces per chunk for :func:`split_chunks`: flows cut into pieces of about
    ``piece_bytes``, at most ``max_subchunks`` sub-chunks in all, never more pieces than
    the smallest segment has elements.

    The pieces do not each get a thread: RCollective runs a chunk's pieces on a few
    lanes (:func:`piece_lanes`), so the piece size stays the same at any buffer size."""
    if pattern.edges_count == 0 or piece_bytes <= 0:
        return 1
    want = int(np.ceil(float(pattern.nbytes.max()) / piece_bytes))
    seg_len = int((pattern.segments[:, 1] - pattern.segments[:, 0]).min())
    cap = max(max_subchunks // max(pattern.chunks, 1), 1)
    return max(1, min(want, cap, seg_len))


def piece_lanes(chunks: int, pieces: int, max_threads: int = 32) -> list[list[int]]:
    """Sub-chunks of :func:`split_chunks` grouped into lanes, one thread each.

    Lane ``(c, j)`` runs pieces ``j, j + W, j + 2W, ...`` of chunk ``c`` one after the
    other, ``W = min(pieces, max_threads // chunks)`` lanes per chunk: at most ``W``
    pieces of a chunk are in flight, and the pieces of one lane can share one scratch
    area (the next starts only when the previous has finished). Deadlock free for any
    ``W``: piece ``k`` waits only on pieces ``< k`` of its chunk and on earlier steps of
    itself, so the smallest unfinished (piece, step) can always proceed on both of its
    endpoints.

    Parameters
    ----------
    chunks : int
        Chunks of the pattern before splitting.
    pieces : int
        Pieces per chunk (sub-chunk ``c * pieces + k`` is piece ``k`` of chunk ``c``).
    max_threads : int, optional
        Lanes in all, at least one per chunk.

    Returns
    -------
    list of list of int
        Sub-chunk ids per lane, in execution order.

    References
    ----------
    gloo's ring AllReduce likewise keeps a fixed number of segments in flight with a
    fixed scratch, whatever the buffer size (``gloo/allreduce.cc``, ``ring``).
    """
    lanes = max(1, min(int(pieces), int(max_threads) // max(int(chunks), 1)))
    return [list(range(c * pieces + j, (c + 1) * pieces, lanes))
            for c in range(chunks) for j in range(lanes)]
