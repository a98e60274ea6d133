"""How REACT runs a pattern: the executor interface and its results.

The feedback loop never looks inside an executor: it hands over a pattern, asks for B
epochs and gets back, per epoch, every flow's start and finish time (flow id = edge
index of the pattern) and the collective's time. The flow-level simulator
(:mod:`topoopt.react.flowsim`), ns-3 and ``torch.distributed`` runtimes implement the
same two-method protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

import numpy as np

from topoopt.collectives.ten import Pattern
from topoopt.react.analytical import fluid_star

__all__ = ["BatchResult", "PatternExecutor", "StarFluidExecutor"]


@dataclass(frozen=True)
class BatchResult:
    """Timings of ``B`` epochs of one pattern, seconds from each epoch's start.

    Attributes
    ----------
    start, finish : ndarray, shape (B, E)
        When each flow started sending and when its data arrived.
    epoch_time : ndarray, shape (B,)
        The collective's completion time in each epoch.
    """

    start: np.ndarray
    finish: np.ndarray
    epoch_time: np.ndarray

    @property
    def fct(self) -> np.ndarray:
        """Flow completion times, shape (B, E)."""
        return self.finish - self.start

    @classmethod
    def concat(cls, parts: list["BatchResult"]) -> "BatchResult":
        return cls(*(np.concatenate([getattr(p, k) for p in parts])
                     for k in ("start", "finish", "epoch_time")))


class PatternExecutor(Protocol):
    """Runs epochs of a collective pattern and reports per-flow timings.

    ``run(pattern, epochs)`` executes ``epochs`` consecutive epochs (the executor keeps
    its own clock, so time-varying congestion continues across calls) and returns a
    :class:`BatchResult`. ``epoch`` is the number of epochs run so far.
    """

    @property
    def epoch(self) -> int: ...

    def run(self, pattern: Pattern, epochs: int) -> BatchResult: ...


class StarFluidExecutor:
    """Ranks on one switch, flows fair-shared by the fluid model of :mod:`.analytical`.

    Deterministic and fast (no netsim needed): a test double and a quick what-if tool.
    Congestion is ``p`` persistent external flows into or out of a rank, optionally only
    from epoch ``start`` on.

    Parameters
    ----------
    bandwidth : float
        NIC bandwidth, bits/s.
    alpha : float
        Per-flow latency, seconds.
    ext_in, ext_out : mapping rank -> p
    start : int
        First epoch with external flows.
    noise : float
        Relative std of a multiplicative lognormal jitter on each FCT (0 = none).
    seed : int
    """

    def __init__(self, bandwidth: float = 100e9, alpha: float = 1e-6,
                 ext_in: Mapping[int, int] | None = None,
                 ext_out: Mapping[int, int] | None = None, start: int = 0,
                 noise: float = 0.0, seed: int = 0) -> None:
        self.bandwidth, self.alpha = bandwidth, alpha
        self.ext_in, self.ext_out = dict(ext_in or {}), dict(ext_out or {})
        self.start, self.noise, self.seed = start, noise, seed
        self.epoch = 0
        self._cache: dict = {}

    def run(self, pattern: Pattern, epochs: int) -> BatchResult:
        starts, finishes, times = [], [], []
        for _ in range(epochs):
            congested = self.epoch >= self.start
            key = (pattern.signature(), congested)
            if key not in self._cache:
                self._cache[key] = fluid_star(pattern, self.bandwidth, self.alpha,
                                              self.ext_in if congested else None,
                                              self.ext_out if congested else None)
            r = self._cache[key]
            start, finish = r.start.copy(), r.finish.copy()
            if self.noise:
                rng = np.random.default_rng([self.seed, self.epoch])
                finish = start + (finish - start) * rng.lognormal(0, self.noise, finish.shape)
            starts.append(start)
            finishes.append(finish)
            times.append(finish.max())
            self.epoch += 1
        return BatchResult(np.array(starts), np.array(finishes), np.array(times))
