"""RCollective: run any collective pattern with torch.distributed, timing every flow.

REACT §6.1, Algorithm 2, on point-to-point ``isend``/``irecv``.

A pattern is executed literally (:mod:`topoopt.collectives.ten`): each chunk sub-graph
runs in its own thread (the CPU stand-in for the paper's per-chunk CUDA streams), going
through the rank's steps of that chunk in order; a step posts all of the rank's sends and
receives of that chunk, waits for them, then reduces or copies what arrived. Chunks are
independent, so this asynchronous schedule equals the pattern's global step order. Large
flows are cut into pieces, each chunk into as many sub-chunks, and a chunk's pieces run on
a few threads (lanes) one after another, so a rank forwards one piece while the next
arrives with a bounded number in flight (:func:`~topoopt.react.runtime.schedule.
piece_lanes`). On
backends where p2p from several threads is not safe (NCCL), ``threads=False`` runs the
global step order in one thread instead, posting each step's operations as one
``batch_isend_irecv`` group. (The NCCL path is written to the same contract but has not
been run here: these machines have no GPU.)

Timing. Every flow gets three clock readings (``time.perf_counter``, CLOCK_MONOTONIC on
Linux): when its sender posted the ``isend``, when its receiver posted the ``irecv`` and
when the receive completed. On gloo an ``irecv`` only reports completion from ``wait()``
(``is_completed()`` stays False until then), so completion is read right after
``wait()`` returns; when a step has several receives each is waited in its own pool
thread, so one slow flow does not delay the reading of another. The flow's completion
time is ``done - max(send posted, recv posted)`` (:func:`topoopt.react.runtime.tuner.
assemble_batch`), which leaves out the time one end waited for the other.

The p2p tag of a flow is its edge index: flows between the same two ranks in
concurrently running chunks never match each other's messages.
"""

from __future__ import annotations

import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from topoopt._require import require_int
from topoopt.collectives.ten import Pattern
from topoopt.errors import ConfigError
from topoopt.react.runtime.schedule import (
    LocalSchedule,
    Step,
    local_schedule,
    piece_lanes,
    pipeline_depth,
    split_chunks,
)

__all__ = ["FlowTimes", "RCollective", "all_reduce", "all_gather_into_tensor", "all_gather",
           "default_collective", "clock"]

#: The clock of every timing record.
clock = time.perf_counter


@dataclass
class FlowTimes:
    """One rank's clock readings of one collective call (seconds of :data:`clock`).

    Attributes
    ----------
    begin, end : float
        When the call started and returned on this rank.
    send_post, recv_post, recv_done : ndarray, shape (E,)
        Per flow: when this rank posted its send (it is the source), posted its receive
        and saw the receive complete (it is the destination); NaN where this rank is
        not that endpoint.
    """

    begin: float
    end: float
    send_post: np.ndarray
    recv_post: np.ndarray
    recv_done: np.ndarray

    @classmethod
    def empty(cls, edges: int) -> "FlowTimes":
        nan = lambda: np.full(edges, np.nan)  # noqa: E731
        return cls(np.nan, np.nan, nan(), nan(), nan())

    @property
    def duration(self) -> float:
        """This rank's time in the call."""
        return self.end - self.begin

    def to_array(self) -> np.ndarray:
        """``[begin, end, send_post..., recv_post..., recv_done...]``, shape (3E + 2,)."""
        return np.concatenate([[self.begin, self.end], self.send_post, self.recv_post,
                               self.recv_done])

    @classmethod
    def from_array(cls, a: np.ndarray) -> "FlowTimes":
        a = np.asarray(a, float)
        E = (a.shape[0] - 2) // 3
        return cls(float(a[0]), float(a[1]), a[2:2 + E], a[2 + E:2 + 2 * E], a[2 + 2 * E:])


def _timed_wait(work, stream=None) -> float:
    """Wait for a receive and read the clock; on a GPU, once its data is on the device."""
    work.wait()
    if stream is not None:
        stream.synchronize()
    return clock()


class RCollective:
    """Executes collective patterns on one process group and times every flow.

    Parameters
    ----------
    group : ProcessGroup, optional
        The data-path group (default: the default group). Pattern ranks are group ranks.
    threads : bool, optional
        One thread per chunk sub-graph (default on gloo) or the global step order in
        the calling thread (default on other backends, e.g. NCCL).
    batched : bool, optional
        Post each global step's sends and receives as one ``batch_isend_irecv`` group
        (default on NCCL; needs ``threads=False``).
    piece_bytes : float, optional
        With ``threads``, flows are cut into pieces of about this many bytes, each
        chunk into as many independent sub-chunks (:func:`~topoopt.react.runtime.
        schedule.split_chunks`), so that a rank forwards one piece while the next
        arrives (2 MiB; 0: whole flows). Flow times stay per flow of the pattern:
        posted when its first piece is, done when its last piece is.
    max_threads : int, optional
        With ``threads``, the pieces of a chunk run on ``max_threads // chunks`` lanes
        (at least one per chunk), each going through its pieces one after another
        (:func:`~topoopt.react.runtime.schedule.piece_lanes`): at most that many
        pieces of a chunk are in flight and the pieces of a lane share one scratch
        area, so neither the threads nor the scratch grow with the buffer (32).

    Examples
    --------
    Inside every rank of an initialised gloo group of 4::

        rc = RCollective()
        p = double_binary_tree_allreduce(4, size=4 * x.numel())
        times = rc.all_reduce(x, p)      # x now holds the sum over ranks
        times.recv_done - times.recv_post

    References
    ----------
    REACT §6.1 and Appendix B.1, Algorithm 2.
    """

    def __init__(self, group=None, *, threads: bool | None = None,
                 batched: bool | None = None, piece_bytes: float = 2 << 20,
                 max_threads: int = 32) -> None:
        if not dist.is_initialized():
            raise ConfigError("torch.distributed", "not initialised",
                              "call torch.distributed.init_process_group first")
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        backend = str(dist.get_backend(group)).lower()
        self.threads = (backend == "gloo") if threads is None else bool(threads)
        # NCCL posts a step's p2p ops as one group (batch_isend_irecv); gloo one by one
        self._batched = (backend == "nccl") if batched is None else bool(batched)
        if self._batched and self.threads:
            raise ConfigError("batched", True, "batched p2p needs threads=False (one "
                              "group per global step)")
        self.piece_bytes = float(piece_bytes) if self.threads else 0.0
        self.max_threads = require_int("max_threads", max_threads, minimum=1)
        self._peers = [r if group is None else dist.get_global_rank(group, r)
                       for r in range(self.size)]
        self._schedules: "weakref.WeakKeyDictionary[Pattern, tuple]" = \
            weakref.WeakKeyDictionary()
        self._scratch: dict = {}
        self._scratch_gen = 0
        self._bound: "weakref.WeakKeyDictionary[Pattern, tuple]" = weakref.WeakKeyDictionary()
        self._stream: Any = None               # the CUDA stream of a GPU buffer
        # p2p straight on the process group: torch.distributed.isend/irecv re-check the
        # group and ranks in Python on every call (pattern ranks are group ranks)
        pg = dist.group.WORLD if group is None else group
        if pg is None:
            raise ConfigError("torch.distributed", "no default group",
                              "call torch.distributed.init_process_group first")
        self._send, self._recv = pg.send, pg.recv
        self._chunk_pool: ThreadPoolExecutor | None = None
        self._wait_pool: ThreadPoolExecutor | None = None
        self._sizes = [0, 0]
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ set-up
    def schedule(self, pattern: Pattern) -> LocalSchedule:
        """This rank's compiled part of ``pattern`` (cached per pattern object); with
        pieces, of the pattern cut into sub-chunks (edge ``e * pieces + k`` is piece
        ``k`` of edge ``e``, ``pieces = schedule.edges // pattern.edges_count``)."""
        return self._compiled(pattern)[0]

    def _compiled(self, pattern: Pattern) -> tuple[LocalSchedule, list[list[int]]]:
        """The schedule and its lanes (sub-chunk ids per thread, in order)."""
        have = self._schedules.get(pattern)
        if have is None:
            if pattern.ranks != self.size:
                raise ConfigError("pattern.ranks", pattern.ranks,
                                  f"must equal the group size {self.size}")
            pieces = pipeline_depth(pattern, self.piece_bytes) if self.threads else 1
            s = local_schedule(split_chunks(pattern, pieces), self.rank)
            lanes = (piece_lanes(pattern.chunks, pieces, self.max_threads) if self.threads
                     else [[c] for c in range(pattern.chunks)])
            have = self._schedules[pattern] = (s, lanes)
        return have

    def _scratch_for(self, sched: LocalSchedule, lanes: list[list[int]], like) -> dict:
        """Scratch per sub-chunk: the sub-chunks of a lane run one after another and
        share one area, the largest any of them needs; the areas are slices of one arena
        per dtype and device, grown only when a schedule needs more in all. A swap moves
        scratch between chunks (a rank that becomes a tree's inner node needs room
        there, a new leaf none) without allocating, so its first call does not fault in
        fresh pages; with lanes the arena stays the same from a few MB of buffer on."""
        key = (like.dtype, like.device)
        need = [max((sched.scratch[c] for c in lane), default=0) for lane in lanes]
        total = sum(need)
        arena = self._scratch.get(key)
        if arena is None or arena.numel() < total:
            arena = torch.empty(total, dtype=like.dtype, device=like.device)
            self._scratch[key] = arena
            self._scratch_gen += 1
            self._bound.clear()                  # drop views of the old arena
        out, o = {}, 0
        for lane, n in zip(lanes, need):
            for c in lane:
                out[c] = arena[o:o + sched.scratch[c]]
            o += n
        return out

    def _pools(self, sched: LocalSchedule, lanes: int):
        """Thread pools sized for ``sched``: one thread per lane, one per concurrent wait."""
        chunks = lanes
        waits = max(sched.max_recvs, 1) * (chunks if self.threads else 1)
        with self._lock:
            if self.threads and chunks > self._sizes[0]:
                if self._chunk_pool is not None:
                    self._chunk_pool.shutdown(wait=True)
                self._chunk_pool = ThreadPoolExecutor(chunks, thread_name_prefix="rcoll-chunk")
                self._sizes[0] = chunks
            if waits > self._sizes[1]:
                if self._wait_pool is not None:
                    self._wait_pool.shutdown(wait=True)
                self._wait_pool = ThreadPoolExecutor(waits, thread_name_prefix="rcoll-wait")
                self._sizes[1] = waits
        return self._chunk_pool, self._wait_pool

    def close(self) -> None:
        """Stop the worker threads (the object can still be used; they restart)."""
        with self._lock:
            for pool in (self._chunk_pool, self._wait_pool):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._chunk_pool = self._wait_pool = None
            self._sizes = [0, 0]

    # ------------------------------------------------------------------ execution
    def _bind(self, pattern: Pattern, sched: LocalSchedule, lanes: list[list[int]],
              buf) -> list:
        """Per lane, the steps of its sub-chunks in order with their tensor views of
        ``buf`` and scratch made once (cached per pattern for the last buffer: a
        training loop reduces the same gradient buffer every iteration, so a call
        slices nothing)."""
        key = (buf.data_ptr(), buf.numel(), buf.dtype, buf.device, self._scratch_gen)
        have = self._bound.get(pattern)
        if have is not None and have[0] == key:
            return have[1]                  # same arena generation: it is still big enough
        scratch = self._scratch_for(sched, lanes, buf)
        key = key[:-1] + (self._scratch_gen,)           # the arena may have grown
        bound = [[_bind_step(st, buf, scratch[c]) for c in lane for st in sched.chunks[c]]
                 for lane in lanes]
        self._bound[pattern] = (key, bound)
        return bound

    def _step(self, steps: Sequence[_BoundStep], rec: FlowTimes,
              wait_pool: ThreadPoolExecutor) -> None:
        """Post every send and receive of ``steps``, wait, then apply what arrived."""
        sends: list[Any] = []                      # torch.distributed Work handles
        recvs: list[tuple[int, Any]] = []          # (edge, Work; None until batched)
        ops: list[Any] = []
        send_post, recv_post = rec.send_post, rec.recv_post
        for st in steps:
            for edge, peer, data, parts in st.sends:
                if parts is not None:
                    torch.cat(parts, out=data)
                send_post[edge] = clock()
                if self._batched:
                    ops.append(dist.P2POp(dist.isend, data, self._peers[peer],
                                          self.group, edge))
                else:
                    sends.append(self._send([data], peer, edge))
            for edge, peer, target in st.recvs:
                recv_post[edge] = clock()
                if self._batched:
                    ops.append(dist.P2POp(dist.irecv, target, self._peers[peer],
                                          self.group, edge))
                    recvs.append((edge, None))
                else:
                    recvs.append((edge, self._recv([target], peer, edge)))
        if ops:
            # NCCL: one group per step, or two ranks sending to each other deadlock
            works = dist.batch_isend_irecv(ops)
            k = sum(len(st.sends) for st in steps)
            sends = works[:k]
            recvs = [(e, w) for (e, _), w in zip(recvs, works[k:])]
        stream = self._stream
        if recvs:
            # every receive but the last waits in a pool thread, so each completion is
            # read when it happens; the last one is waited here (one hand-off fewer)
            futures = [(e, wait_pool.submit(_timed_wait, w, stream)) for e, w in recvs[:-1]]
            e, w = recvs[-1]
            rec.recv_done[e] = _timed_wait(w, stream)
            for e, f in futures:
                rec.recv_done[e] = f.result()
        for w in sends:
            w.wait()
        for st in steps:
            for target, piece, reduce in st.apply:
                if reduce:
                    target.add_(piece)
                else:
                    target.copy_(piece)

    def _chunk(self, steps, rec, wait_pool) -> None:
        for st in steps:
            self._step((st,), rec, wait_pool)

    def run(self, buffer, pattern: Pattern) -> FlowTimes:
        """Execute ``pattern`` on ``buffer`` in place (the pattern's buffer semantics).

        Parameters
        ----------
        buffer : torch.Tensor
            Contiguous, ``pattern.elements`` elements, any dtype; viewed as 1-D.
        pattern : Pattern
            The same pattern on every rank of the group.

        Returns
        -------
        FlowTimes
            This rank's clock readings.
        """
        if not buffer.is_contiguous():
            raise ConfigError("tensor", "non-contiguous", "pass a contiguous tensor")
        buf = buffer.view(-1)
        if buf.numel() != pattern.elements:
            raise ConfigError("tensor.numel", buf.numel(),
                              f"must equal the pattern's {pattern.elements} elements "
                              "(build the pattern with size = numel x itemsize)")
        sched, lanes = self._compiled(pattern)
        bound = self._bind(pattern, sched, lanes, buf)
        chunk_pool, wait_pool = self._pools(sched, len(lanes))
        self._stream = torch.cuda.current_stream(buf.device) if buf.is_cuda else None
        rec = FlowTimes.empty(sched.edges)
        rec.begin = clock()
        if self.threads:
            futures = [chunk_pool.submit(self._chunk, steps, rec, wait_pool)
                       for steps in bound if steps]
            errors = []
            for f in futures:          # wait for all before raising: no thread left behind
                try:
                    f.result()
                except Exception as exc:  # noqa: BLE001 - re-raised below
                    errors.append(exc)
            if errors:
                raise errors[0]
        else:
            for steps in _lockstep(bound):
                self._step(steps, rec, wait_pool)
        rec.end = clock()
        return _per_flow(rec, pattern.edges_count)

    def all_reduce(self, tensor, pattern: Pattern) -> FlowTimes:
        """Sum ``tensor`` over the group in place with an AllReduce pattern
        (like ``torch.distributed.all_reduce(tensor)``)."""
        if pattern.collective != "allreduce":
            raise ConfigError("pattern", pattern.name, "all_reduce needs an AllReduce pattern")
        return self.run(tensor, pattern)

    def all_gather_into_tensor(self, output, input, pattern: Pattern) -> FlowTimes:
        """Gather every rank's ``input`` into ``output`` with an AllGather pattern
        (like ``torch.distributed.all_gather_into_tensor``: rank r's input lands in the
        segments it owns, ``owners[j] == j`` for the built-in patterns)."""
        if pattern.collective != "allgather":
            raise ConfigError("pattern", pattern.name,
                              "all_gather needs an AllGather pattern")
        sched = self.schedule(pattern)
        inp = input.reshape(-1)
        if inp.numel() != sched.own_size:
            raise ConfigError("input.numel", inp.numel(),
                              f"rank {self.rank} owns {sched.own_size} elements of the "
                              "pattern's output")
        if not output.is_contiguous():
            raise ConfigError("output", "non-contiguous", "pass a contiguous tensor")
        out = output.view(-1)
        if out.numel() != pattern.elements:
            raise ConfigError("output.numel", out.numel(),
                              f"must equal the pattern's {pattern.elements} elements")
        o = 0
        for a, b in sched.own:
            out[a:b].copy_(inp[o:o + b - a])
            o += b - a
        return self.run(out, pattern)

    def all_gather(self, tensor_list: list, tensor, pattern: Pattern) -> FlowTimes:
        """Like ``torch.distributed.all_gather(tensor_list, tensor)``: ``tensor_list[r]``
        receives rank r's ``tensor`` (the segments r owns, in segment order)."""
        if len(tensor_list) != self.size:
            raise ConfigError("tensor_list", len(tensor_list),
                              f"give one tensor per rank ({self.size})")
        out = torch.empty(pattern.elements, dtype=tensor.dtype, device=tensor.device)
        rec = self.all_gather_into_tensor(out, tensor, pattern)
        owners = pattern.owners
        for r, t in enumerate(tensor_list):
            segs = np.flatnonzero(owners == r)
            parts = [out[int(pattern.segments[j, 0]):int(pattern.segments[j, 1])]
                     for j in segs]
            data = torch.cat(parts) if parts else out[:0]
            if t.numel() != data.numel():
                raise ConfigError(f"tensor_list[{r}].numel", t.numel(),
                                  f"rank {r} contributes {data.numel()} elements")
            t.copy_(data.view_as(t))
        return rec


def _per_flow(rec: FlowTimes, edges: int) -> FlowTimes:
    """Fold the times of pieces (edge ``e * K + k``) into flows: first post, last arrival."""
    if rec.send_post.shape[0] == edges:
        return rec
    fold = lambda a, op: op.reduce(a.reshape(edges, -1), axis=1)  # noqa: E731 NaN-aware
    return FlowTimes(rec.begin, rec.end, fold(rec.send_post, np.fmin),
                     fold(rec.recv_post, np.fmin), fold(rec.recv_done, np.fmax))


@dataclass(frozen=True)
class _BoundStep:
    """A :class:`Step` with its tensors: ``sends`` (edge, peer, data, parts to pack into
    data or None), ``recvs`` (edge, peer, target) and ``apply`` (buffer view, scratch
    view, reduce) for after the step."""

    step: int
    sends: tuple
    recvs: tuple
    apply: tuple


def _bind_step(st: Step, buf, sc) -> _BoundStep:
    # gloo moves real tensors: complex data travels as (re, im) pairs
    wire = torch.view_as_real if buf.is_complex() else (lambda t: t)
    sends: list[tuple] = []
    for x in st.sends:
        if x.offset < 0:
            a, b = x.ranges[0]
            sends.append((x.edge, x.peer, wire(buf[a:b]), None))
        else:
            sends.append((x.edge, x.peer, wire(sc[x.offset:x.offset + x.size]),
                          [wire(buf[a:b]) for a, b in x.ranges]))
    recvs: list[tuple] = []
    apply: list[tuple] = []
    for x in st.recvs:
        if x.offset < 0:
            a, b = x.ranges[0]
            recvs.append((x.edge, x.peer, wire(buf[a:b])))
            continue
        recvs.append((x.edge, x.peer, wire(sc[x.offset:x.offset + x.size])))
        o = x.offset
        for a, b in x.ranges:
            apply.append((buf[a:b], sc[o:o + b - a], x.reduce))
            o += b - a
    return _BoundStep(st.step, tuple(sends), tuple(recvs), tuple(apply))


def _lockstep(bound: list) -> list[list[_BoundStep]]:
    """Bound steps grouped by global step (:func:`~topoopt.react.runtime.schedule.
    lockstep_order` on bound steps)."""
    groups: dict[int, list[_BoundStep]] = {}
    for steps in bound:
        for st in steps:
            groups.setdefault(st.step, []).append(st)
    return [groups[t] for t in sorted(groups)]


_DEFAULT: dict = {}


def default_collective(group=None) -> RCollective:
    """The shared :class:`RCollective` of ``group`` (created on first use)."""
    key = id(group) if group is not None else None
    rc = _DEFAULT.get(key)
    if rc is None or rc.group is not group:
        rc = _DEFAULT[key] = RCollective(group)
    return rc


def all_reduce(tensor, pattern: Pattern, group=None) -> FlowTimes:
    """``torch.distributed.all_reduce(tensor)`` (sum) executed with ``pattern``."""
    return default_collective(group).all_reduce(tensor, pattern)


def all_gather_into_tensor(output, input, pattern: Pattern, group=None) -> FlowTimes:
    """``torch.distributed.all_gather_into_tensor(output, input)`` executed with ``pattern``."""
    return default_collective(group).all_gather_into_tensor(output, input, pattern)


def all_gather(tensor_list: list, tensor, pattern: Pattern, group=None) -> FlowTimes:
    """``torch.distributed.all_gather(tensor_list, tensor)`` executed with ``pattern``."""
    return default_collective(group).all_gather(tensor_list, tensor, pattern)
