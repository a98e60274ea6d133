"""The feedback loop's estimate of a transformed pattern from observed FCTs (REACT §5.4.1)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topoopt.collectives.ten import Pattern, flow_degrees

__all__ = ["FctHistory", "estimate_fcts", "estimate_paths"]


@dataclass(frozen=True)
class FctHistory:
    """Observed flows of the last ``H`` epochs: epoch, src, dst, degree, bytes, FCT.

    Immutable; :meth:`add` returns a new history (the leader is a pure function).
    """

    epoch: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    degree: np.ndarray
    nbytes: np.ndarray
    fct: np.ndarray

    @classmethod
    def empty(cls) -> "FctHistory":
        z = np.zeros(0, np.int64)
        return cls(z, z, z, z, np.zeros(0), np.zeros(0))

    def add(self, pattern: Pattern, fct: np.ndarray, first_epoch: int,
            keep: int) -> "FctHistory":
        """Append a batch (``fct`` shape (B, E), epochs ``first_epoch..``) and forget
        epochs older than ``keep`` before the newest."""
        fct = np.asarray(fct, float)
        B, E = fct.shape
        ep = np.repeat(np.arange(first_epoch, first_epoch + B), E)
        tile = lambda a: np.tile(a, B)  # noqa: E731
        new = [np.concatenate(x) for x in (
            (self.epoch, ep), (self.src, tile(pattern.src)), (self.dst, tile(pattern.dst)),
            (self.degree, tile(flow_degrees(pattern))),
            (self.nbytes, tile(pattern.nbytes.astype(float))), (self.fct, fct.ravel()))]
        cut = new[0] > first_epoch + B - 1 - keep
        return FctHistory(*(a[cut] for a in new))

    def __len__(self) -> int:
        return int(self.epoch.size)


def estimate_fcts(history: FctHistory, pattern: Pattern) -> np.ndarray:
    """Estimated FCT of every flow of ``pattern``, shape (E,).

    A flow from ``src`` to ``dst`` of ``b`` bytes and degree ``k`` (§5.2) is estimated
    from the observations of that pair, each scaled to ``b`` bytes and by
    ``max(1, k / k_obs)`` (more flows sharing an endpoint slow it down; fewer are not
    assumed to speed it up, since an observed slowdown is most often external
    congestion that a lower degree does not remove). A pair never observed gets the
    median per-byte time of the observed flows of degree ``k`` (§5.4.1), raised to what
    its endpoints showed: ``k`` times the per-byte, per-degree time of the fastest flow
    observed into ``dst`` or out of ``src`` (an endpoint is at least that slow; so a
    flow moved onto a congested node is not assumed fast).
    """
    deg = flow_degrees(pattern).astype(float)
    nb = pattern.nbytes.astype(float)
    if len(history) == 0:
        return nb * deg
    per_byte = history.fct / np.maximum(history.nbytes, 1.0)
    k_obs = np.maximum(history.degree, 1).astype(float)
    n = max(pattern.ranks, int(history.src.max()) + 1, int(history.dst.max()) + 1)
    key = history.src * n + history.dst
    counts = np.bincount(key, minlength=n * n)
    pair = pattern.src * n + pattern.dst
    seen = counts[pair] > 0
    est_unit = np.full(pattern.edges_count, np.nan)
    if seen.any():
        # mean over the pair's observations of per_byte * max(1, k / k_obs), grouped by k_obs
        kmax = int(max(k_obs.max(), deg.max())) + 1
        ks = np.arange(kmax, dtype=float)
        sums = np.bincount(key * kmax + k_obs.astype(np.int64), weights=per_byte,
                           minlength=n * n * kmax).reshape(n * n, kmax)
        rows = np.flatnonzero(seen)
        scale = np.maximum(1.0, deg[rows, None] / np.maximum(ks[None, :], 1.0))
        est_unit[rows] = (sums[pair[rows]] * scale).sum(axis=1) / counts[pair[rows]]
    if (~seen).any():
        norm = per_byte / k_obs
        # an endpoint is at least as slow as its fastest observed flow in that direction
        node_in = np.full(n, np.inf)
        node_out = np.full(n, np.inf)
        np.minimum.at(node_in, history.dst, norm)
        np.minimum.at(node_out, history.src, norm)
        node_in[~np.isfinite(node_in)] = 0.0
        node_out[~np.isfinite(node_out)] = 0.0
        overall = float(np.median(per_byte))
        for k in np.unique(deg[~seen]):
            same = history.degree == k
            med = float(np.median(per_byte[same])) if same.any() else overall
            sel = ~seen & (deg == k)
            est_unit[sel] = np.maximum.reduce([np.full(sel.sum(), med),
                                               k * node_in[pattern.dst[sel]],
                                               k * node_out[pattern.src[sel]]])
    return est_unit * nb


def estimate_paths(history: FctHistory, pattern: Pattern, paths: list[np.ndarray]) -> float:
    """Mean estimated time of the given critical paths (edge-index lists) on ``pattern``.

    Transforms keep edge indices, so the paths of the old pattern name the same flows,
    now between their new endpoints (§5.4.1 and its footnote 5).
    """
    est = estimate_fcts(history, pattern)
    return float(np.mean([est[p].sum() for p in paths])) if paths else 0.0
