"""Alpha-beta cost of a pattern on one switch with fair sharing and external flows (REACT §4.3).

Every rank has one NIC into a non-blocking switch: an uplink and a downlink of
bandwidth ``1/beta``. Flows run as soon as their dependencies allow (each rank goes
through its steps of a chunk in order, :func:`topoopt.collectives.flow_dependencies`),
share every NIC link max-min fairly with each other and with ``p`` persistent external
flows, and arrive ``alpha`` after their last byte leaves. The time of a phase is when
its last flow arrives. For the 16-rank dual tree this gives the paper's numbers:
reduce phase ``4 alpha + 3.5 beta s`` (576 us), ``4 alpha + (3 + p/2) beta s`` with p external
flows into node 3 (656 us for p = 2), back to 576 us after swapping 3 and 2 in the
even-leaf tree (:func:`dual_tree_example_time`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from topoopt.collectives.ten import Pattern, flow_dependencies
from topoopt.netsim.maxmin import max_min_rates as progressive_filling

__all__ = ["FluidResult", "fluid_star", "alpha_beta_time", "dual_tree_example_time",
           "max_min_rates"]


@dataclass(frozen=True)
class FluidResult:
    """Per-flow start and arrival times (s) and per-phase end times."""

    start: np.ndarray
    finish: np.ndarray
    phase_names: tuple[str, ...]
    phase_end: np.ndarray

    @property
    def makespan(self) -> float:
        return float(self.finish.max())

    @property
    def fct(self) -> np.ndarray:
        return self.finish - self.start

    @property
    def phase_time(self) -> np.ndarray:
        """Duration of each phase: its end minus the previous phase's end."""
        return np.diff(np.concatenate([[0.0], self.phase_end]))


def max_min_rates(flow_res: np.ndarray, capacity: np.ndarray, external: np.ndarray
                  ) -> np.ndarray:
    """Max-min fair rates of star flows (two resources each) with external flows, by
    the simulator's progressive filling (:func:`topoopt.netsim.max_min_rates`).

    Parameters
    ----------
    flow_res : int array, shape (F, 2)
        The two resources (links) each flow crosses.
    capacity : array, shape (R,)
        Capacity of each resource.
    external : int array, shape (R,)
        Persistent external flows on each resource (each crosses only that resource,
        so it takes an equal share of whatever its link has left).

    Returns
    -------
    ndarray, shape (F,)

    Examples
    --------
    >>> flows = np.array([[0, 1], [0, 2]])
    >>> max_min_rates(flows, np.array([2.0, 0.5, 9.0]), np.zeros(3, int)).tolist()
    [0.5, 1.5]
    """
    # k external flows on one resource move in lockstep: one entry of weight k
    F = flow_res.shape[0]
    ext = np.flatnonzero(external > 0)
    entry_flow = np.concatenate([np.repeat(np.arange(F), 2), F + np.arange(ext.size)])
    entry_link = np.concatenate([flow_res.ravel(), ext])
    weight = np.concatenate([np.ones(2 * F), external[ext].astype(float)])
    return progressive_filling(capacity.astype(float), entry_flow, entry_link, weight,
                               F + ext.size)[:F]


def fluid_star(pattern: Pattern, bandwidth: float, alpha: float = 0.0,
               ext_in: Mapping[int, int] | None = None,
               ext_out: Mapping[int, int] | None = None,
               up_bandwidth: np.ndarray | None = None,
               down_bandwidth: np.ndarray | None = None) -> FluidResult:
    """Event-driven fluid execution of ``pattern`` on a star (one switch).

    Parameters
    ----------
    pattern : Pattern
    bandwidth : float
        NIC bandwidth in bits/s (``1/beta`` in bytes is ``bandwidth/8``).
    alpha : float
        Per-flow latency in seconds, added when the flow's last byte is sent.
    ext_in, ext_out : mapping rank -> p
        ``p`` persistent external flows into / out of a rank's NIC.
    up_bandwidth, down_bandwidth : array, shape (n,), optional
        Per-rank NIC bandwidth overrides (bits/s), e.g. a degraded link.

    Returns
    -------
    FluidResult
    """
    n, E = pattern.ranks, pattern.edges_count
    cap = np.empty(2 * n)
    cap[:n] = bandwidth if up_bandwidth is None else up_bandwidth
    cap[n:] = bandwidth if down_bandwidth is None else down_bandwidth
    cap = cap / 8.0
    ext = np.zeros(2 * n, np.int64)
    for r, p in (ext_out or {}).items():
        ext[int(r)] += int(p)
    for r, p in (ext_in or {}).items():
        ext[n + int(r)] += int(p)
    res = np.stack([pattern.src, n + pattern.dst], axis=1)
    ptr, idx = flow_dependencies(pattern)
    ndeps = np.diff(ptr).copy()
    dependents: list[list[int]] = [[] for _ in range(E)]
    for e in range(E):
        for d in idx[ptr[e]:ptr[e + 1]]:
            dependents[int(d)].append(e)
    remaining = pattern.nbytes.astype(float).copy()
    start = np.full(E, np.inf)
    finish = np.full(E, np.inf)
    ready_at = np.where(ndeps == 0, 0.0, np.inf)
    active = np.zeros(E, bool)
    now = 0.0
    arrivals: list[tuple[float, int]] = []      # (arrival time, flow) pending dependents
    done_tx = np.zeros(E, bool)
    while True:
        # start every flow that is ready by now
        newly = (~active) & (~done_tx) & (ready_at <= now + 1e-15) & ~np.isfinite(start)
        start[newly] = np.maximum(ready_at[newly], 0.0)
        active |= newly
        zero = active & (remaining <= 0)
        for e in np.flatnonzero(zero).tolist():
            active[e] = False
            done_tx[e] = True
            finish[e] = now + alpha
            arrivals.append((finish[e], int(e)))
        t_arr = min((a for a, _ in arrivals), default=np.inf)
        if active.any():
            act = np.flatnonzero(active)
            rate = max_min_rates(res[act], cap, ext)
            t_done = now + (remaining[act] / rate).min()
        else:
            t_done = np.inf
        nxt = min(t_arr, t_done)
        if not np.isfinite(nxt):
            break
        if active.any():
            remaining[act] -= rate * (nxt - now)
            fin = act[remaining[act] <= 1e-9 * np.maximum(pattern.nbytes[act], 1)]
            remaining[fin] = 0.0
        now = nxt
        keep = []
        for a, e in arrivals:
            if a <= now + 1e-15:
                for d in dependents[e]:
                    ndeps[d] -= 1
                    if ndeps[d] == 0:
                        ready_at[d] = a
            else:
                keep.append((a, e))
        arrivals = keep
    if not np.isfinite(finish).all():
        raise RuntimeError("fluid simulation left flows unfinished (dependency cycle?)")
    phase_end = np.array([finish[pattern.phase == k].max() if (pattern.phase == k).any()
                          else 0.0 for k in range(len(pattern.phase_names))])
    phase_end = np.maximum.accumulate(phase_end)
    return FluidResult(start, finish, pattern.phase_names, phase_end)


def alpha_beta_time(pattern: Pattern, alpha: float, bandwidth: float,
                    congest: Mapping[int, int] | None = None,
                    congest_out: Mapping[int, int] | None = None) -> FluidResult:
    """Analytical (alpha-beta, fair-sharing) time of every phase of ``pattern``.

    Parameters
    ----------
    pattern : Pattern
    alpha : float
        Link latency (s).
    bandwidth : float
        Link bandwidth, bits/s (``1/beta``).
    congest, congest_out : mapping rank -> p
        p external flows into (out of) the rank.

    Examples
    --------
    >>> from topoopt.collectives import double_binary_tree_allreduce
    >>> p = double_binary_tree_allreduce(16, size=2e6)
    >>> r = alpha_beta_time(p, 4e-6, 100e9, congest={3: 2})
    >>> round(r.phase_end[0] * 1e6)
    656
    """
    return fluid_star(pattern, bandwidth, alpha, ext_in=congest, ext_out=congest_out)


def dual_tree_example_time(alpha: float, bandwidth: float, size: float, p: int) -> float:
    """Closed form of the reduce phase of REACT §4.3 (16 ranks, p flows into node 3).

    ``4 alpha + (2 + max(p + 2, 3) + 1 + 1) beta s / 2 = 4 alpha + (3 + max(p, 1) / 2) beta s``:
    four latency terms; per chunk (``s/2``) the first step shares a downlink between two
    children, node 3's step shares it with ``p`` more flows, and its later steps run
    alone once the other subtree has finished. For p <= 1 this is the uncongested
    ``4 alpha + 3.5 beta s``. With ``alpha = 4 us``, 100 Gbps and ``s = 2 MB``: 576 us (p = 0)
    and 656 us (p = 2).
    """
    beta_s = size * 8.0 / bandwidth
    return 4 * alpha + (3 + max(p, 1) / 2) * beta_s
