"""Congestion detection from flow completion times only (REACT §5.2)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topoopt.collectives.ten import Pattern, flow_degrees

__all__ = ["Congestion", "detect_congestion", "throughputs"]


@dataclass(frozen=True)
class Congestion:
    """Per-flow verdicts over one batch of epochs.

    Attributes
    ----------
    steady : ndarray of bool, shape (E,)
        ``p90(b_f) < mean(b_F(k_f)) x (1 - delta1)``: slow in most epochs compared with
        the flows of the same degree.
    erratic : ndarray of bool, shape (E,)
        ``std(b_f) / mean(b_f) > delta2``: slow in some epochs only (ECMP collisions,
        spine-ToR congestion).
    degree : ndarray, shape (E,)
        k_f, max of in- and out-degree of the flow in the TEN.
    """

    steady: np.ndarray
    erratic: np.ndarray
    degree: np.ndarray

    @property
    def congested(self) -> np.ndarray:
        """Steady or erratic."""
        return self.steady | self.erratic

    def any(self) -> bool:
        return bool(self.congested.any())


def throughputs(pattern: Pattern, fct: np.ndarray) -> np.ndarray:
    """Observed throughput b_f (bytes/s) per epoch and flow, shape (B, E)."""
    fct = np.asarray(fct, float)
    return pattern.nbytes[None, :] / np.maximum(fct, 1e-15)


def detect_congestion(pattern: Pattern, fct: np.ndarray, delta1: float = 0.2,
                      delta2: float = 0.15) -> Congestion:
    """Flag steady and erratic congestion per flow (REACT §5.2, Eq. 1 and 2).

    Parameters
    ----------
    pattern : Pattern
        The pattern the FCTs were measured on (gives bytes and degrees).
    fct : array, shape (B, E)
        Flow completion times of the last batch of B epochs.
    delta1, delta2 : float
        Thresholds (defaults from the paper).

    Returns
    -------
    Congestion

    Examples
    --------
    >>> from topoopt.collectives import ring_allreduce
    >>> p = ring_allreduce(range(4), size=4096)
    >>> fct = np.full((6, p.edges_count), 1e-3); fct[:, 0] = 2e-3
    >>> bool(detect_congestion(p, fct).steady[0]), int(detect_congestion(p, fct).steady.sum())
    (True, 1)
    """
    b = throughputs(pattern, fct)
    k = flow_degrees(pattern)
    steady = np.zeros(pattern.edges_count, bool)
    p90 = np.percentile(b, 90, axis=0)
    for deg in np.unique(k):
        same = k == deg
        steady[same] = p90[same] < b[:, same].mean() * (1.0 - delta1)
    mean = b.mean(axis=0)
    erratic = b.std(axis=0) / np.maximum(mean, 1e-300) > delta2
    return Congestion(steady, erratic, k)
