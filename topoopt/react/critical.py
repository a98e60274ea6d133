"""Critical paths of a TEN weighted by flow completion times (REACT §5.4.1)."""

from __future__ import annotations

import numpy as np

from topoopt.collectives.ten import Pattern

__all__ = ["critical_paths"]


def critical_paths(pattern: Pattern, weights: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Longest path through the TEN for each weight vector.

    A path moves forward in time inside one chunk sub-graph: along a flow edge
    ``(t, src) -> (t+1, dst)`` (weight = that flow's completion time) or by staying on the
    same rank (``(t, r) -> (t+1, r)``, weight 0). The critical path of a weighting is the
    heaviest such path over all chunks; on ties a flow edge is preferred to waiting.

    Parameters
    ----------
    pattern : Pattern
    weights : array, shape (W, E) or (E,)
        E.g. the FCTs of each epoch of a batch plus their mean (W = B + 1).

    Returns
    -------
    paths : list of W int arrays
        Edge indices of each critical path, in time order.
    lengths : ndarray, shape (W,)
        Their total weight.

    Examples
    --------
    >>> from topoopt.collectives import ring_allreduce
    >>> p = ring_allreduce(range(3), size=48)
    >>> paths, lengths = critical_paths(p, np.ones(p.edges_count))
    >>> len(paths[0]), float(lengths[0])
    (4, 4.0)
    """
    w = np.atleast_2d(np.asarray(weights, float))
    W, n, T = w.shape[0], pattern.ranks, pattern.steps
    best_len = np.full(W, -np.inf)
    best_path: list[np.ndarray] = [np.zeros(0, np.int64)] * W
    rows = np.arange(W)[:, None]
    for c in range(pattern.chunks):
        sel = np.flatnonzero(pattern.chunk == c)
        st, sr, ds = pattern.step[sel], pattern.src[sel], pattern.dst[sel]
        bounds = np.searchsorted(st, np.arange(T + 1))
        dist = np.zeros((W, n))
        back = np.full((T, W, n), -1, np.int64)
        for t in range(T):
            lo, hi = bounds[t], bounds[t + 1]
            if lo == hi:
                continue
            e = sel[lo:hi]
            cand = dist[:, sr[lo:hi]] + w[:, e]                  # (W, Et)
            new = dist.copy()
            np.maximum.at(new, (rows, ds[lo:hi][None, :].repeat(W, 0)), cand)
            hit = cand >= new[:, ds[lo:hi]]                       # edges achieving the max
            ww, jj = np.nonzero(hit[:, ::-1])                     # reversed: first edge wins
            jj = hit.shape[1] - 1 - jj
            back[t, ww, ds[lo:hi][jj]] = e[jj]
            dist = new
        end = dist.argmax(axis=1)
        length = dist[np.arange(W), end]
        for i in np.flatnonzero(length > best_len):
            r, path = int(end[i]), []
            for t in range(T - 1, -1, -1):
                f = back[t, i, r]
                if f >= 0:
                    path.append(int(f))
                    r = int(pattern.src[f])
            best_path[i] = np.array(path[::-1], np.int64)
            best_len[i] = length[i]
    return best_path, best_len
