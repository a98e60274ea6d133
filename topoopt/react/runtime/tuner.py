"""RTuner: REACT's leader/worker loop over a separate gloo group (REACT §6.2, §6.3).

Every rank runs a tuner thread. After each batch of B epochs the rank hands the batch's
flow timings to its thread and goes on training; the threads gather the timings to the
leader (rank 0) over their own gloo process group -- separate sockets from the data
path, so control traffic never blocks a collective -- the leader runs the pure
:func:`topoopt.react.loop.leader_step` and broadcasts the next pattern, tagged with a
version number.

The data path adopts a pattern only when every rank has it: ranks keep running the old
pattern for ``slack`` epochs (the paper's 5), then agree with one tiny all-reduce on the
data group on which version each holds; only a unanimous new version is switched to.
A slow or dead leader, a broken control group or a pattern that fails its check
therefore only means "keep the current pattern"; waits are bounded by
``decision_timeout`` (once per stuck batch) and the control group's own timeout.
The leader keeps the pattern versions it handed out, so a batch measured on an older
pattern (its decision was not adopted) continues from that pattern's state.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import timedelta
from typing import Callable

import numpy as np

from topoopt._require import require_int, require_positive
from topoopt.collectives.ten import Pattern
from topoopt.react.execution import BatchResult
from topoopt.react.loop import Decision, ReactParams, leader_init, leader_step
from topoopt.react.runtime._torch import require_torch

__all__ = ["assemble_batch", "LeaderLogic", "RTuner", "boot_id"]

log = logging.getLogger("topoopt.react.runtime")


def boot_id() -> str:
    """This kernel's boot id: ranks with equal ids share CLOCK_MONOTONIC (one host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        import socket

        return "host:" + socket.gethostname()


def assemble_batch(records: np.ndarray, offsets: np.ndarray | None = None) -> BatchResult:
    """Flow start/finish times of a batch from every rank's clock readings.

    Parameters
    ----------
    records : array, shape (n, B, 3E + 2)
        ``records[r, b]`` is rank r's :meth:`FlowTimes.to_array` of epoch b: exactly
        one rank (the flow's source) has a send time for a flow and exactly one (its
        destination) has receive times, so no pattern is needed to read them.
    offsets : array, shape (n,), optional
        Rank r's clock minus the leader's (0 on one host).

    Returns
    -------
    BatchResult
        Per epoch, relative to the earliest rank's entry into the collective: a flow
        starts when both its ends have posted it (``max`` of the two post times) and
        finishes when its receiver saw it complete; the epoch time is the last rank's
        return minus the first rank's entry.

    Examples
    --------
    >>> from topoopt.collectives import ring_allreduce
    >>> p = ring_allreduce([0, 1], size=8)        # 2 ranks, 4 flows
    >>> E = p.edges_count
    >>> rec = np.full((2, 1, 3 * E + 2), np.nan)
    >>> rec[:, 0, :2] = [[0.0, 1.0], [0.1, 0.9]]  # begin, end per rank
    >>> for e in range(E):
    ...     s, d = p.src[e], p.dst[e]
    ...     rec[s, 0, 2 + e] = 0.2                 # sender posted
    ...     rec[d, 0, 2 + E + e] = 0.3             # receiver posted
    ...     rec[d, 0, 2 + 2 * E + e] = 0.5         # receive done
    >>> r = assemble_batch(rec)
    >>> r.fct.round(3).tolist(), r.epoch_time.tolist()
    ([[0.2, 0.2, 0.2, 0.2]], [1.0])
    """
    rec = np.asarray(records, float)
    n = rec.shape[0]
    if rec.ndim != 3 or (rec.shape[2] - 2) % 3:
        raise ValueError(f"records have shape {rec.shape}, need (n, B, 3E + 2)")
    E = (rec.shape[2] - 2) // 3
    off = np.zeros(n) if offsets is None else np.asarray(offsets, float)
    rec = rec - off[:, None, None]
    with np.errstate(invalid="ignore"):
        # one non-NaN value per flow and epoch across ranks: its endpoint's reading
        cols = np.fmax.reduce(rec, axis=0)                      # (B, 3E + 2)
    begin = np.nanmin(rec[:, :, 0], axis=0)                     # (B,)
    end = np.nanmax(rec[:, :, 1], axis=0)
    send_post, recv_post, done = (cols[:, 2:2 + E], cols[:, 2 + E:2 + 2 * E],
                                  cols[:, 2 + 2 * E:])
    if np.isnan(done).any() or np.isnan(send_post).any():
        raise ValueError("records miss a flow's send or receive time")
    start = np.maximum(send_post, recv_post) - begin[:, None]   # (B, E)
    finish = np.maximum(done - begin[:, None], start + 1e-9)    # clock granularity
    return BatchResult(start, finish, end - begin)


class LeaderLogic:
    """The leader's side of RTuner around :func:`leader_step`: numbered pattern versions.

    Version 0 is the initial pattern; every decision that changes the pattern gets the
    next number. For each version the leader keeps the state to continue from when a
    batch measured on that version arrives, so a decision the ranks did not adopt (slow
    leader, a rank without the decision) costs nothing but that batch.

    Parameters
    ----------
    pattern : Pattern
    params : ReactParams
    keep : int
        Versions remembered (older ones are forgotten; a batch on a forgotten version
        restarts the loop from that pattern).

    Examples
    --------
    >>> from topoopt.collectives import double_binary_tree_allreduce
    >>> from topoopt.react.execution import StarFluidExecutor
    >>> p = double_binary_tree_allreduce(8, size=20e6)
    >>> leader = LeaderLogic(p)
    >>> r = StarFluidExecutor(ext_in={2: 2}).run(p, 6)
    >>> v, q, d = leader.decide(0, r.fct, r.epoch_time)
    >>> v, len(d.swaps) > 0
    (1, True)
    """

    def __init__(self, pattern: Pattern, params: ReactParams = ReactParams(),
                 keep: int = 16) -> None:
        self.params = params
        self.keep = require_int("keep", keep, minimum=2)
        self.patterns: dict[int, Pattern] = {0: pattern}
        self.states = {0: leader_init(pattern, params)}
        self.next_version = 1

    def decide(self, version: int, fct: np.ndarray, epoch_time: np.ndarray
               ) -> tuple[int, Pattern, Decision]:
        """One leader step on a batch measured on pattern ``version``.

        Returns
        -------
        (version, pattern, decision)
            The version to run next (unchanged when the pattern is), its pattern and
            :func:`leader_step`'s decision.
        """
        state = self.states.get(version)
        if state is None:
            if version not in self.patterns:
                raise KeyError(f"unknown pattern version {version}")
            state = leader_init(self.patterns[version], self.params)
        new_state, dec = leader_step(state, fct, epoch_time)
        if dec.pattern.signature() == state.pattern.signature():
            v = version
        else:
            v = self.next_version
            self.next_version += 1
            self.patterns[v] = dec.pattern
        self.states[v] = new_state
        for old in sorted(self.patterns)[:-self.keep]:
            if old not in (v, version):
                self.patterns.pop(old, None)
                self.states.pop(old, None)
        return v, dec.pattern, dec


class RTuner:
    """The tuner thread of one rank (leader on group rank 0). Create on every rank.

    Parameters
    ----------
    pattern : Pattern
        The initial pattern (version 0), identical on every rank.
    group : ProcessGroup, optional
        The data-path group whose ranks take part (default: the default group).
    params : ReactParams
        REACT's parameters (the leader uses them; ``params.batch`` is B).
    control_timeout : float
        Seconds any control-group operation may take (gloo timeout of the separate
        group); past it the tuner stops for good and the job keeps its pattern.
    decide : callable, optional
        Replaces the leader's decision function ``decide(version, batch) -> (version,
        pattern, swaps, reverted)`` where ``batch`` is the assembled
        :class:`BatchResult` (tests use it to make a slow or failing leader).

    Attributes
    ----------
    timeouts : int
        Calls of :meth:`decision` that waited their whole timeout in vain (a slow or
        stuck leader costs one, not one per batch).
    error : BaseException or None
        Why the tuner stopped, once the control group failed.
    log : list of dict
        The leader's decisions, one entry per batch.

    Notes
    -----
    Creating it is collective (it creates the control group and measures clock
    offsets); afterwards only :meth:`submit`, :meth:`decision` and :meth:`close` are
    used, from the rank's main thread. Use it through
    :class:`topoopt.react.runtime.ReactCollective`, which handles slack and agreement.
    """

    def __init__(self, pattern: Pattern, group=None, *, params: ReactParams = ReactParams(),
                 control_timeout: float = 30.0,
                 decide: Callable | None = None) -> None:
        self.torch, self.dist = require_torch()
        dist = self.dist
        require_positive("control_timeout", control_timeout)
        self.pattern = pattern
        self.params = params
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        ranks = [r if group is None else dist.get_global_rank(group, r)
                 for r in range(self.size)]
        self.leader_global = ranks[0]
        self.is_leader = self.rank == 0
        # a separate gloo group: its own sockets and its own (short) timeout
        self.ctrl = dist.new_group(ranks=ranks, backend="gloo",
                                   timeout=timedelta(seconds=control_timeout))
        self.offsets = self._clock_offsets()
        self.leader = LeaderLogic(pattern, params) if self.is_leader else None
        self._decide = decide
        self._inbox: queue.Queue = queue.Queue()
        self._decisions: dict[int, dict] = {}
        self._cond = threading.Condition()
        self._working = -1          # batch the thread is on (-1: idle)
        self.timeouts = 0
        self.error: BaseException | None = None
        self.log: list[dict] = []   # leader: one entry per decision
        self._thread = threading.Thread(target=self._loop, name="rtuner", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ clocks
    def _clock_offsets(self) -> np.ndarray | None:
        """Each rank's clock minus the leader's (leader only; zeros on one host).

        Ranks on one kernel (same boot id) share CLOCK_MONOTONIC exactly. Otherwise the
        leader ping-pongs 5 times with each worker and keeps the minimum-RTT estimate
        ``t_worker - (t_send + t_back) / 2``.
        """
        from topoopt.react.runtime.collective import clock

        torch, dist = self.torch, self.dist
        ids: list = [None] * self.size
        dist.all_gather_object(ids, boot_id(), group=self.ctrl)
        if all(i == ids[0] for i in ids):
            return np.zeros(self.size) if self.is_leader else None
        buf = torch.zeros(1, dtype=torch.float64)
        offsets = np.zeros(self.size)
        for w in range(1, self.size):
            peer = dist.get_global_rank(self.ctrl, w)
            best = (np.inf, 0.0)
            for _ in range(5):
                if self.is_leader:
                    t0 = clock()
                    dist.send(buf, peer, group=self.ctrl)
                    dist.recv(buf, peer, group=self.ctrl)
                    t2 = clock()
                    if t2 - t0 < best[0]:
                        best = (t2 - t0, float(buf[0]) - (t0 + t2) / 2)
                elif self.rank == w:
                    dist.recv(buf, self.leader_global, group=self.ctrl)
                    buf[0] = clock()
                    dist.send(buf, self.leader_global, group=self.ctrl)
            offsets[w] = best[1]
        return offsets if self.is_leader else None

    # ------------------------------------------------------------------ main thread API
    @property
    def alive(self) -> bool:
        """False once the control group failed (the tuner then stays off)."""
        return self.error is None and self._thread.is_alive()

    def submit(self, batch: int, version: int, records: np.ndarray) -> None:
        """Hand over batch ``batch``'s timings ``(B, 3E + 2)`` measured on ``version``.

        Never blocks. Every rank must submit the same batches in the same order.
        """
        if self.alive:
            self._inbox.put((int(batch), int(version), np.ascontiguousarray(records, float)))

    def decision(self, batch: int, timeout: float) -> dict | None:
        """The leader's decision for ``batch``, waiting at most ``timeout`` seconds.

        Does not wait at all when the tuner is dead or still busy with an older batch
        (a stuck leader costs one timeout, not one per batch). ``None``: no decision.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while batch not in self._decisions:
                if not self.alive or (0 <= self._working < batch):
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    self.timeouts += 1
                    return None
                self._cond.wait(left)
            return self._decisions.pop(batch)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread after the batches already submitted (bounded wait)."""
        self._inbox.put(None)
        self._thread.join(timeout)
        if not self._thread.is_alive() and self.error is None:
            try:
                self.dist.destroy_process_group(self.ctrl)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass

    # ------------------------------------------------------------------ tuner thread
    def _leader_decision(self, batch: int, version: int, gathered: np.ndarray) -> dict:
        t0 = time.perf_counter()
        try:
            result = assemble_batch(gathered, self.offsets)
            if self._decide is not None:
                v, pattern, swaps, reverted = self._decide(version, result)
            else:
                assert self.leader is not None      # only the leader decides
                v, pattern, dec = self.leader.decide(version, result.fct, result.epoch_time)
                swaps, reverted = tuple(str(s) for s in dec.swaps), dec.reverted
        except Exception as exc:  # noqa: BLE001 - a failing leader keeps the pattern
            log.warning("RTuner leader failed on batch %d: %r", batch, exc)
            self.log.append({"batch": batch, "version": version, "error": repr(exc)})
            return {"batch": batch, "version": version, "keep": True}
        entry = {"batch": batch, "measured": version, "version": int(v),
                 "swaps": list(swaps), "reverted": bool(reverted),
                 "mean_epoch_time": float(np.mean(result.epoch_time)),
                 "decide_seconds": time.perf_counter() - t0}
        self.log.append(entry)
        if int(v) == version:
            return {"batch": batch, "version": version, "keep": True}
        return {"batch": batch, "version": int(v), "keep": False, "swaps": list(swaps),
                "reverted": bool(reverted), "src": pattern.src.copy(),
                "dst": pattern.dst.copy(), "seg_idx": pattern.seg_idx.copy()}

    def _loop(self) -> None:
        torch, dist = self.torch, self.dist
        while True:
            item = self._inbox.get()
            if item is None:
                return
            batch, version, rec = item
            with self._cond:
                self._working = batch
            try:
                flat = np.concatenate([[batch, version], rec.ravel()])
                t = torch.from_numpy(flat)
                gather = [torch.empty_like(t) for _ in range(self.size)] \
                    if self.is_leader else None
                dist.gather(t, gather, dst=self.leader_global, group=self.ctrl)
                obj: list = [None]
                if gather is not None:            # the leader
                    g = np.stack([x.numpy() for x in gather])
                    versions = set(g[:, 1].astype(int).tolist())
                    recs = g[:, 2:].reshape(self.size, rec.shape[0], rec.shape[1])
                    if len(versions) != 1:   # ranks disagree: cannot happen after agreement
                        obj[0] = {"batch": batch, "version": version, "keep": True}
                    else:
                        obj[0] = self._leader_decision(batch, version, recs)
                dist.broadcast_object_list(obj, src=self.leader_global, group=self.ctrl)
                with self._cond:
                    self._decisions[batch] = obj[0]
                    for old in [b for b in self._decisions if b < batch - 4]:
                        del self._decisions[old]
                    self._working = -1
                    self._cond.notify_all()
            except Exception as exc:  # noqa: BLE001 - control plane broken: tuner off
                log.warning("RTuner stopped on rank %d: %r", self.rank, exc)
                with self._cond:
                    self.error = exc
                    self._cond.notify_all()
                return
