"""Blossom maximum-weight matching on an MP demand matrix (TopoOpt §4 Step 3)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import rustworkx as rx

__all__ = ["max_weight_matching", "max_weight_matching_edges", "matching_weight", "sparsify_top_k"]

#: Above this many candidate edges the matching runs on each node's heaviest edges.
DENSE_EDGE_LIMIT = 40_000


def sparsify_top_k(weights: np.ndarray, k: int) -> np.ndarray:
    """Keep, for every node, its ``k`` heaviest positive edges (union over both ends).

    Returns a symmetric copy of ``weights`` with the other entries set to 0.
    """
    n = weights.shape[0]
    k = min(k, n - 1)
    top = np.argpartition(-weights, k - 1, axis=1)[:, :k]
    keep = np.zeros_like(weights, dtype=bool)
    keep[np.repeat(np.arange(n), k), top.ravel()] = True
    keep |= keep.T
    return np.where(keep, weights, 0)


def max_weight_matching(weights: np.ndarray, method: str = "rustworkx",
                        top_k: int | None = 32) -> list[tuple[int, int]]:
    """A maximum-weight matching of the graph whose edges are the positive entries.

    Parameters
    ----------
    weights : ndarray of int, shape (n, n)
        Symmetric non-negative integer weights; ``weights[u, v] > 0`` is an edge.
        Integers keep both backends exact (rustworkx requires them).
    method : {"rustworkx", "networkx"}
        rustworkx's Blossom is the fast one; networkx's is the reference the tests
        compare against.
    top_k : int or None
        When the graph has more than ``DENSE_EDGE_LIMIT`` edges, match only over each
        node's ``top_k`` heaviest edges (an exact matching of a complete graph of
        1,024 nodes takes long). None = always exact.

    Returns
    -------
    list of (u, v)
        Matched pairs with ``u < v``, sorted.

    References
    ----------
    .. [1] J. Edmonds, "Paths, trees, and flowers", 1965; Z. Galil, "Efficient
       algorithms for finding maximum matching in graphs", 1986 (both backends).

    Examples
    --------
    >>> w = np.array([[0, 5, 1], [5, 0, 4], [1, 4, 0]])
    >>> max_weight_matching(w)
    [(0, 1)]
    """
    w = np.asarray(weights)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"weights must be a square matrix, got shape {w.shape}")
    if not np.issubdtype(w.dtype, np.integer):
        raise ValueError("weights must be integers (scale and round demands first)")
    if np.any(w != w.T) or np.any(w < 0):
        raise ValueError("weights must be symmetric and non-negative")
    n = w.shape[0]
    iu, iv = np.nonzero(np.triu(w, 1))
    if top_k is not None and iu.size > DENSE_EDGE_LIMIT:
        iu, iv = np.nonzero(np.triu(sparsify_top_k(w, top_k), 1))
    return max_weight_matching_edges(n, iu, iv, w[iu, iv], method)


def max_weight_matching_edges(n: int, iu: np.ndarray, iv: np.ndarray, weights: np.ndarray,
                              method: str = "rustworkx") -> list[tuple[int, int]]:
    """:func:`max_weight_matching` of the graph given by its edges, exactly (no top-k).

    Parameters
    ----------
    n : int
        Nodes.
    iu, iv, weights : numpy.ndarray
        Edges ``iu[i] - iv[i]`` (``iu < iv``, row-major order as ``np.nonzero`` of the
        upper triangle gives them) of positive integer weight.
    method : {"rustworkx", "networkx"}

    Returns
    -------
    list of (u, v)
        Matched pairs with ``u < v``, sorted; for the same edges in the same order, what
        :func:`max_weight_matching` returns for their dense matrix.
    """
    iu, iv = np.asarray(iu), np.asarray(iv)
    vals = np.asarray(weights).tolist()
    if method == "rustworkx":
        g = rx.PyGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from(list(zip(iu.tolist(), iv.tolist(), vals)))
        pairs = rx.max_weight_matching(g, max_cardinality=False, weight_fn=int)
    elif method == "networkx":
        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_weighted_edges_from(zip(iu.tolist(), iv.tolist(), vals))
        pairs = nx.max_weight_matching(g, maxcardinality=False)
    else:
        raise ValueError(f"method must be 'rustworkx' or 'networkx', got {method!r}")
    return sorted((min(a, b), max(a, b)) for a, b in pairs)


def matching_weight(weights: np.ndarray, pairs) -> int:
    """Total weight of a matching."""
    return int(sum(int(weights[u, v]) for u, v in pairs))
