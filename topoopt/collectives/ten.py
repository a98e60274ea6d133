"""Collective patterns as time-expanded networks (TEN), with their JSON form (REACT §5.1).

A :class:`Pattern` is the contract between pattern builders, the semantic check, REACT's
transforms and every runtime that executes a pattern (flow-level simulator, ns-3,
``torch.distributed``). It says, per edge, exactly which part of the user's buffer is
sent and what the receiver does with it, so that executing it literally yields the
collective.

Execution semantics (what :func:`topoopt.collectives.check_pattern` simulates with one-hot
bit vectors, and what a runtime must do):

* Every rank ``r`` holds one buffer of ``elements`` items of ``itemsize`` bytes. The
  buffer is partitioned into **segments** (element ranges ``[start, stop)``).
  AllReduce: at the start every rank's buffer is its input vector; at the end every
  segment of every rank must hold the sum over all ranks. AllGather: the buffer is the
  output tensor; at the start rank ``owners[j]`` holds its own contribution in segment
  ``j`` and nothing else is valid; at the end every rank must hold ``owners[j]``'s
  contribution in segment ``j`` for every ``j`` (``torch.distributed.all_gather_into_tensor``
  layout for the built-in patterns: ``owners[j] == j``).
* An edge ``(step t, src, dst, chunk c, segments, op)`` is one flow from vertex
  ``(t, src)`` to vertex ``(t+1, dst)``: ``src`` sends the listed segments of its buffer
  as they are at the *start* of step ``t``; ``dst`` receives them into scratch space and
  after the step either **reduces** (``dst[seg] += data``) or **copies**
  (``dst[seg] = data``). Several reduces into one ``(dst, seg)`` in one step are all
  added; a copy must be the only write to its ``(dst, seg)`` in its step. A rank never
  sends a segment it holds no valid data for.
* **Chunks** are independent sub-graphs: chunk ``c``'s edges only carry chunk ``c``'s
  segments and chunks' segment sets are disjoint. A runtime may therefore run chunks
  concurrently (one stream per chunk, RCollective §6.1) and, within a chunk, let each
  rank go through its steps in order, blocking at the end of each step on its own sends
  and receives of that chunk (Algorithm 2). That asynchronous schedule gives the same
  result as the global step order above.

Edges are stored as numpy arrays (structure of arrays) in non-decreasing step order
(builders sort by ``(step, chunk, src, dst)``); the edge index is the flow id used for
completion-time arrays everywhere (``fct[epoch, edge]``). Transforms only rename
endpoints (and, for AllGather, segment ids), so edge indices survive them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from topoopt.errors import TopoOptError

__all__ = ["Pattern", "Edge", "PatternError", "split_elements", "degrees", "flow_degrees",
           "flow_dependencies", "COLLECTIVES", "FORMAT"]

#: Collectives a pattern can implement.
COLLECTIVES = ("allreduce", "allgather")
#: The ``format`` tag of the JSON form.
FORMAT = "topoopt.pattern/1"


class PatternError(TopoOptError):
    """A collective pattern is malformed or does not implement its collective."""


class Edge(NamedTuple):
    """One flow of a pattern, for people and simple tools (the arrays are the API)."""

    index: int  # type: ignore[assignment]  # the flow id; shadows tuple.index on purpose
    step: int
    src: int
    dst: int
    chunk: int
    segments: tuple[int, ...]
    nbytes: int
    reduce: bool
    phase: str


def _frozen(a, dtype) -> np.ndarray:
    out = np.array(a, dtype=dtype, copy=True)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class Pattern:
    """A collective pattern as a TEN: vertices ``(t, rank)``, edges ``(t, src) -> (t+1, dst)``.

    Build it with a pattern builder (:mod:`topoopt.collectives.patterns`) or
    :meth:`from_edges`; check it with :func:`topoopt.collectives.check_pattern`.

    Attributes
    ----------
    name : str
        What built it (``"ring"``, ``"nccl-tree"``, ``"rd-allgather"``, ``"multi-ring"``).
    collective : str
        ``"allreduce"`` or ``"allgather"``.
    ranks : int
        n; ranks are ``0..n-1``.
    itemsize : int
        Bytes per buffer element (4 for fp32).
    elements : int
        Buffer length in elements (AllGather: the output buffer).
    segments : ndarray, shape (S, 2)
        ``[start, stop)`` element range of each segment; together a partition of the buffer.
    owners : ndarray, shape (S,), or None
        AllGather only: the rank whose contribution segment ``j`` is.
    step, src, dst, chunk : ndarray, shape (E,)
        Per edge.
    reduce : ndarray of bool, shape (E,)
        True: the receiver adds; False: it copies.
    seg_ptr, seg_idx : ndarray
        CSR list of segments per edge: edge ``e`` carries ``seg_idx[seg_ptr[e]:seg_ptr[e+1]]``.
    phase : ndarray, shape (E,)
        Index into ``phase_names`` (e.g. ``reduce``/``broadcast``).
    phase_names : tuple of str
    """

    name: str
    collective: str
    ranks: int
    itemsize: int
    elements: int
    segments: np.ndarray
    owners: np.ndarray | None
    step: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    chunk: np.ndarray
    reduce: np.ndarray
    seg_ptr: np.ndarray
    seg_idx: np.ndarray
    phase: np.ndarray
    phase_names: tuple[str, ...] = ("all",)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_edges(cls, name: str, collective: str, ranks: int, segments: np.ndarray,
                   edges: Iterable[tuple], *, itemsize: int = 4,
                   owners: Sequence[int] | np.ndarray | None = None,
                   phase_names: Sequence[str] = ("all",), sort: bool = True) -> "Pattern":
        """Build a pattern from ``(step, src, dst, chunk, segments, reduce, phase)`` tuples.

        With ``sort`` (default) edges are sorted by ``(step, chunk, src, dst)``;
        otherwise they keep their order, which must have non-decreasing steps.
        ``segments`` is an ``(S, 2)`` array of element ranges (see :func:`split_elements`).
        """
        rows = [(int(t), int(s), int(d), int(c), tuple(int(x) for x in segs),
                 bool(red), int(ph)) for t, s, d, c, segs, red, ph in edges]
        if sort:
            rows.sort(key=lambda r: (r[0], r[3], r[1], r[2]))
        segs = np.asarray(segments, dtype=np.int64).reshape(-1, 2)
        counts = [len(r[4]) for r in rows]
        ptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        idx = [x for r in rows for x in r[4]]
        col = (lambda k: [r[k] for r in rows])
        return cls(name=name, collective=collective, ranks=int(ranks),
                   itemsize=int(itemsize),
                   elements=int(segs[:, 1].max()) if len(segs) else 0,
                   segments=_frozen(segs, np.int64),
                   owners=None if owners is None else _frozen(owners, np.int64),
                   step=_frozen(col(0), np.int64), src=_frozen(col(1), np.int64),
                   dst=_frozen(col(2), np.int64), chunk=_frozen(col(3), np.int64),
                   reduce=_frozen(col(5), bool), seg_ptr=_frozen(ptr, np.int64),
                   seg_idx=_frozen(idx, np.int64), phase=_frozen(col(6), np.int64),
                   phase_names=tuple(phase_names))

    @classmethod
    def from_arrays(cls, name: str, collective: str, ranks: int, segments: np.ndarray, *,
                    step, src, dst, chunk, segment, reduce, phase, itemsize: int = 4,
                    owners: Sequence[int] | np.ndarray | None = None,
                    phase_names: Sequence[str] = ("all",)) -> "Pattern":
        """Build a pattern of one-segment edges from arrays (the vectorized twin of
        :meth:`from_edges`, same sort by ``(step, chunk, src, dst)``)."""
        step, src, dst, chunk = (np.asarray(a, np.int64) for a in (step, src, dst, chunk))
        order = np.lexsort((dst, src, chunk, step))
        segs = np.asarray(segments, dtype=np.int64).reshape(-1, 2)
        E = order.size
        return cls(name=name, collective=collective, ranks=int(ranks), itemsize=int(itemsize),
                   elements=int(segs[:, 1].max()) if len(segs) else 0,
                   segments=_frozen(segs, np.int64),
                   owners=None if owners is None else _frozen(owners, np.int64),
                   step=_frozen(step[order], np.int64), src=_frozen(src[order], np.int64),
                   dst=_frozen(dst[order], np.int64), chunk=_frozen(chunk[order], np.int64),
                   reduce=_frozen(np.asarray(reduce, bool)[order], bool),
                   seg_ptr=_frozen(np.arange(E + 1), np.int64),
                   seg_idx=_frozen(np.asarray(segment, np.int64)[order], np.int64),
                   phase=_frozen(np.asarray(phase, np.int64)[order], np.int64),
                   phase_names=tuple(phase_names))

    def replace(self, *, src=None, dst=None, seg_idx=None, name=None) -> "Pattern":
        """The same pattern with new endpoints / segment ids (edge indices unchanged)."""
        return Pattern(
            name=self.name if name is None else name, collective=self.collective,
            ranks=self.ranks, itemsize=self.itemsize, elements=self.elements,
            segments=self.segments, owners=self.owners, step=self.step,
            src=self.src if src is None else _frozen(src, np.int64),
            dst=self.dst if dst is None else _frozen(dst, np.int64),
            chunk=self.chunk, reduce=self.reduce, seg_ptr=self.seg_ptr,
            seg_idx=self.seg_idx if seg_idx is None else _frozen(seg_idx, np.int64),
            phase=self.phase, phase_names=self.phase_names)

    # ---------------------------------------------------------------- derived sizes
    @property
    def edges_count(self) -> int:
        """E, the number of flows."""
        return int(self.step.shape[0])

    @property
    def steps(self) -> int:
        """T: edges use steps ``0..T-1``; vertices exist at times ``0..T``."""
        return int(self.step.max()) + 1 if self.step.size else 0

    @property
    def chunks(self) -> int:
        """C: chunk ids are ``0..C-1``."""
        return int(self.chunk.max()) + 1 if self.chunk.size else 0

    @property
    def size(self) -> int:
        """Buffer size in bytes."""
        return self.elements * self.itemsize

    @property
    def segment_bytes(self) -> np.ndarray:
        """Bytes of each segment, shape (S,)."""
        return (self.segments[:, 1] - self.segments[:, 0]) * self.itemsize

    @property
    def nbytes(self) -> np.ndarray:
        """Bytes carried by each edge, shape (E,)."""
        if "nbytes" not in self._cache:
            per = self.segment_bytes[self.seg_idx]
            owner = np.repeat(np.arange(self.edges_count), np.diff(self.seg_ptr))
            out = np.bincount(owner, weights=per, minlength=self.edges_count)
            out = np.rint(out).astype(np.int64)
            out.setflags(write=False)
            self._cache["nbytes"] = out
        return self._cache["nbytes"]

    def edge_segments(self, e: int) -> tuple[int, ...]:
        """Segment ids carried by edge ``e``."""
        return tuple(int(x) for x in self.seg_idx[self.seg_ptr[e]:self.seg_ptr[e + 1]])

    def chunk_segments(self, c: int) -> np.ndarray:
        """Sorted segment ids used by chunk ``c``."""
        sel = np.repeat(self.chunk, np.diff(self.seg_ptr)) == c
        return np.unique(self.seg_idx[sel])

    def edges(self) -> Iterator[Edge]:
        """Iterate the edges as :class:`Edge` tuples, in index order."""
        nb = self.nbytes
        for e in range(self.edges_count):
            yield Edge(e, int(self.step[e]), int(self.src[e]), int(self.dst[e]),
                       int(self.chunk[e]), self.edge_segments(e), int(nb[e]),
                       bool(self.reduce[e]), self.phase_names[int(self.phase[e])])

    def signature(self) -> tuple:
        """Hashable identity of the edges' endpoints and segments, the segments' element
        ranges included (for caches, equality: a re-split moves bytes, not edges)."""
        return (self.name, self.collective, self.ranks, self.elements,
                self.src.tobytes(), self.dst.tobytes(), self.seg_idx.tobytes(),
                self.segments.tobytes())

    def __repr__(self) -> str:
        return (f"Pattern({self.name!r}, {self.collective}, ranks={self.ranks}, "
                f"steps={self.steps}, chunks={self.chunks}, edges={self.edges_count}, "
                f"size={self.size}B)")


def split_elements(elements: int, parts: int, start: int = 0) -> np.ndarray:
    """Split ``[start, start+elements)`` into ``parts`` contiguous, nearly equal ranges.

    The first ``elements % parts`` ranges get one element more (like ``numpy.array_split``).

    Returns
    -------
    ndarray, shape (parts, 2)
        ``[start, stop)`` per part.

    Examples
    --------
    >>> split_elements(10, 3).tolist()
    [[0, 4], [4, 7], [7, 10]]
    """
    size, extra = divmod(int(elements), int(parts))
    lengths = np.full(parts, size, dtype=np.int64)
    lengths[:extra] += 1
    stops = start + np.cumsum(lengths)
    return np.stack([stops - lengths, stops], axis=1)


def degrees(pattern: Pattern) -> tuple[np.ndarray, np.ndarray]:
    """Per-vertex in- and out-degree over all chunks.

    Returns
    -------
    indeg, outdeg : ndarray, shape (T+1, n)
        ``outdeg[t, r]`` = edges leaving ``(t, r)`` (flows ``r`` sends at step ``t``);
        ``indeg[t, r]`` = edges arriving at ``(t, r)`` (flows ``r`` receives at step ``t-1``).
    """
    T, n = pattern.steps, pattern.ranks
    outdeg = np.zeros((T + 1) * n, np.int64)
    indeg = np.zeros((T + 1) * n, np.int64)
    np.add.at(outdeg, pattern.step * n + pattern.src, 1)
    np.add.at(indeg, (pattern.step + 1) * n + pattern.dst, 1)
    return indeg.reshape(T + 1, n), outdeg.reshape(T + 1, n)


def flow_degrees(pattern: Pattern) -> np.ndarray:
    """k_f of every flow: max of its source's out-degree and its destination's in-degree
    at its step (REACT §5.2), shape (E,)."""
    indeg, outdeg = degrees(pattern)
    return np.maximum(outdeg[pattern.step, pattern.src],
                      indeg[pattern.step + 1, pattern.dst])


def flow_dependencies(pattern: Pattern) -> tuple[np.ndarray, np.ndarray]:
    """Flows each flow waits for under the per-chunk, per-rank step order (Algorithm 2).

    A flow of chunk ``c`` at step ``t`` between ``src`` and ``dst`` starts once each of
    its two endpoints has finished its previous step of chunk ``c``: every chunk-``c``
    flow (sent or received) at that endpoint's latest earlier step. Earlier steps follow
    by transitivity.

    Returns
    -------
    ptr, idx : ndarray
        CSR: flow ``e`` depends on ``idx[ptr[e]:ptr[e+1]]`` (sorted, unique).
    """
    key = ("deps", pattern.ranks, pattern.step.tobytes(), pattern.src.tobytes(),
           pattern.dst.tobytes(), pattern.chunk.tobytes())
    if key in pattern._cache:
        return pattern._cache[key]
    E, n = pattern.edges_count, pattern.ranks
    # incidences (chunk, rank, step, edge), two per edge, sorted by (chunk, rank, step)
    edge = np.concatenate([np.arange(E), np.arange(E)])
    cr = np.concatenate([pattern.chunk * n + pattern.src, pattern.chunk * n + pattern.dst])
    st = np.concatenate([pattern.step, pattern.step])
    order = np.lexsort((edge, st, cr))
    edge, cr, st = edge[order], cr[order], st[order]
    # groups of equal (chunk, rank, step); each group's predecessor is the previous
    # group of the same (chunk, rank): that endpoint's latest earlier step
    new_group = np.ones(edge.size, bool)
    new_group[1:] = (cr[1:] != cr[:-1]) | (st[1:] != st[:-1])
    gstart = np.flatnonzero(new_group)
    gid = np.cumsum(new_group) - 1
    gsize = np.diff(np.append(gstart, edge.size))
    same_cr = np.zeros(gstart.size, bool)
    same_cr[1:] = cr[gstart[1:]] == cr[gstart[:-1]]
    prev = np.where(same_cr, np.arange(gstart.size) - 1, -1)[gid]       # per incidence
    has = prev >= 0
    counts = np.where(has, gsize[np.maximum(prev, 0)], 0)
    owner = np.repeat(edge, counts)
    first = np.repeat(gstart[np.maximum(prev, 0)], counts)
    offs = np.arange(owner.size) - np.repeat(np.cumsum(counts) - counts, counts)
    dep = edge[first + offs]
    pairs = np.sort(owner * E + dep)             # sorted unique (a sort beats np.unique's hash)
    pairs = pairs[np.concatenate([[True], pairs[1:] != pairs[:-1]])] if pairs.size else pairs
    ptr = np.zeros(E + 1, np.int64)
    np.cumsum(np.bincount(pairs // E, minlength=E), out=ptr[1:])
    idx = (pairs % E).astype(np.int64)
    pattern._cache[key] = (ptr, idx)
    return ptr, idx


# ---------------------------------------------------------------------------- JSON
