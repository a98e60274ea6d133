"""Pattern builders: ring, multi-ring, NCCL double binary tree, recursive doubling.

Ring and multi-ring AllReduce, NCCL's double binary tree AllReduce and
recursive-doubling AllGather (REACT Appendix A.1), each as a :class:`Pattern`."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from topoopt._require import require_int, require_positive
from topoopt.collectives.ten import Pattern, split_elements
from topoopt.errors import ConfigError

__all__ = ["ring_allreduce", "multi_ring_allreduce", "nccl_btree", "nccl_dtree",
           "double_binary_tree_allreduce", "recursive_doubling_allgather",
           "build_pattern", "PATTERNS"]

#: Names accepted by :func:`build_pattern` (and ``topoopt react ... --collective``).
PATTERNS = ("tree", "ring", "rd-allgather")


def _elements(size: float, itemsize: int, parts: int) -> int:
    require_positive("size", size)
    require_int("itemsize", itemsize, minimum=1)
    elements = int(size) // itemsize
    if elements < parts:
        raise ConfigError("size", size, f"must hold at least {parts} elements of "
                          f"{itemsize} bytes (one per segment)")
    return elements


def _ring_order(order: Sequence[int], n: int | None = None) -> list[int]:
    order = [int(r) for r in order]
    m = len(order) if n is None else n
    if len(order) < 2 or sorted(order) != list(range(m)):
        raise ConfigError("ring", order, f"must visit each rank 0..{m - 1} exactly once "
                          "(at least 2 ranks)")
    return order


def _ring_edges(order: list[int], seg0: int, chunk_of, step0: int = 0):
    """Reduce-scatter then all-gather around ``order`` on segments ``seg0..seg0+n-1``.

    Position ``p`` sends segment ``(p - t) mod n`` at reduce-scatter step ``t`` (the
    receiver adds); after ``n-1`` steps position ``p`` holds the full segment ``p+1``,
    and at all-gather step ``u`` it sends segment ``(p + 1 - u) mod n`` (copy).
    """
    n = len(order)
    for t in range(n - 1):
        for p in range(n):
            j = (p - t) % n
            yield (step0 + t, order[p], order[(p + 1) % n], chunk_of(j), (seg0 + j,), True, 0)
    for u in range(n - 1):
        for p in range(n):
            j = (p + 1 - u) % n
            yield (step0 + n - 1 + u, order[p], order[(p + 1) % n], chunk_of(j),
                   (seg0 + j,), False, 1)


def ring_allreduce(order: Sequence[int], size: float = 2 ** 20, itemsize: int = 4) -> Pattern:
    """Ring AllReduce on any ring order: reduce-scatter + all-gather, 2(n-1) steps of S/n.

    The buffer is split into n segments; each segment is its own chunk sub-graph (the
    red path of REACT Fig. 9a), travelling once around the ring adding, then once more
    copying.

    Parameters
    ----------
    order : sequence of int
        The ring: rank ``order[p]`` sends to ``order[p+1]`` (and the last to the first).
        A permutation of ``0..n-1``, n >= 2.
    size : float
        Bytes of the AllReduce vector.
    itemsize : int
        Bytes per element.

    Returns
    -------
    Pattern
        ``2(n-1)`` steps, ``n`` chunks, phases ``reduce-scatter``, ``all-gather``.

    Examples
    --------
    >>> p = ring_allreduce([0, 2, 1, 3], size=4096)
    >>> p.steps, p.chunks, int(p.nbytes[0])
    (6, 4, 1024)

    References
    ----------
    REACT Appendix A.1; Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms".
    """
    order = _ring_order(order)
    n = len(order)
    elements = _elements(size, itemsize, n)
    return Pattern.from_edges("ring", "allreduce", n, split_elements(elements, n),
                              _ring_edges(order, 0, lambda j: j), itemsize=itemsize,
                              phase_names=("reduce-scatter", "all-gather"))


def multi_ring_allreduce(rings: Sequence[Sequence[int]], size: float = 2 ** 20,
                         itemsize: int = 4, weights: Sequence[float] | None = None
                         ) -> Pattern:
    """The multi-ring AllReduce of a TopoOpt plan: the buffer split across the rings.

    Ring ``k`` AllReduces its share of the buffer (``weights[k]`` of it, equal shares by
    default) by reduce-scatter + all-gather along its own order; all rings run at once.
    Each ring is one chunk sub-graph (chunk ``k``), so a chunk-local swap re-orders one
    planned ring only.

    Parameters
    ----------
    rings : sequence of sequence of int
        Ring orders, each a permutation of the same ranks ``0..n-1`` (TopoOpt's
        ``i -> (i + p) mod n`` rings are ``[0, p, 2p, ...]``).
    size, itemsize : see :func:`ring_allreduce`.
    weights : sequence of float, optional
        Share of the buffer per ring (normalized); default equal.

    Returns
    -------
    Pattern
        ``2(n-1)`` steps, ``len(rings)`` chunks of ``n`` segments each.

    Examples
    --------
    >>> p = multi_ring_allreduce([[0, 1, 2, 3], [0, 3, 2, 1]], size=8192)
    >>> p.chunks, len(p.segments)
    (2, 8)
    """
    if not rings:
        raise ConfigError("rings", rings, "give at least one ring order")
    n = len(rings[0])
    orders = [_ring_order(r, n) for r in rings]
    k = len(orders)
    w = np.ones(k) if weights is None else np.asarray(weights, float)
    if w.shape != (k,) or np.any(~np.isfinite(w)) or np.any(w <= 0):
        raise ConfigError("weights", weights, f"give {k} positive shares, one per ring")
    elements = _elements(size, itemsize, n * k)
    # element share per ring, rounded so they sum exactly and each ring gets >= n elements
    share = np.floor(w / w.sum() * elements).astype(np.int64)
    share[: elements - share.sum()] += 1
    if share.min() < n:
        raise ConfigError("size", size, "too small to give every ring one element per rank")
    bounds = np.concatenate([[0], np.cumsum(share)])
    segments = np.concatenate([split_elements(share[i], n, bounds[i]) for i in range(k)])
    # the edges of _ring_edges for every ring, as arrays: (ring, step, position)
    o = np.asarray(orders, np.int64)                        # (k, n)
    t = np.arange(2 * (n - 1))
    pos = np.arange(n)
    ring, step, p = (a.ravel() for a in np.meshgrid(np.arange(k), t, pos, indexing="ij"))
    rs = step < n - 1
    j = np.where(rs, p - step, p + 1 - (step - (n - 1))) % n
    return Pattern.from_arrays("multi-ring", "allreduce", n, segments, step=step,
                               src=o[ring, p], dst=o[ring, (p + 1) % n], chunk=ring,
                               segment=ring * n + j, reduce=rs, phase=np.where(rs, 0, 1),
                               itemsize=itemsize,
                               phase_names=("reduce-scatter", "all-gather"))


# ----------------------------------------------------------------- NCCL double binary tree
def nccl_btree(nranks: int) -> np.ndarray:
    """Parent of every rank in NCCL's binary tree (``ncclGetBtree``), -1 for the root 0.

    Facts from NCCL's ``src/graph/trees.cc``: with ``bit`` the lowest set bit of rank
    ``r > 0``, the parent is ``(r ^ bit) | (bit << 1)``, or ``r ^ bit`` when that is out of
    range; rank 0 is the root and its only child is the largest power of two below
    ``nranks``. Leaves are the odd ranks. For 14 ranks::

        0---------------8
                 ______/ \\______
                4               12
              /   \\            /  \\
            2       6       10     \\
           / \\     / \\     /  \\     \\
          1   3   5   7   9   11    13

    Examples
    --------
    >>> nccl_btree(6).tolist()
    [-1, 2, 4, 2, 0, 4]
    """
    nranks = require_int("nranks", nranks, minimum=1)
    r = np.arange(nranks)
    bit = r & -r                                  # lowest set bit (0 for rank 0)
    up = (r ^ bit) | (bit << 1)
    up = np.where(up >= nranks, r ^ bit, up)
    up[0] = -1
    return up


def nccl_dtree(nranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Parents in NCCL 2.8+'s double binary tree (``ncclGetDtree``).

    Tree 0 is :func:`nccl_btree` (root 0, odd leaves). Tree 1 mirrors it
    (``r -> n-1-r``, root ``n-1``, even leaves) when ``nranks`` is even, and shifts it by
    one rank (``r -> (r+1) mod n``, root 1) when ``nranks`` is odd, so that every rank is
    a leaf in at least one tree.

    Returns
    -------
    parent0, parent1 : ndarray, shape (nranks,)
        Parent rank, -1 at the root.

    Examples
    --------
    >>> [p.tolist() for p in nccl_dtree(4)]
    [[-1, 2, 0, 2], [1, 3, 1, -1]]

    References
    ----------
    NCCL ``src/graph/trees.cc`` (diagrams for 12 and 13 ranks); Sanders, Speck & Träff,
    "Two-tree algorithms for full bandwidth broadcast, reduction and scan" (2009).
    """
    p0 = nccl_btree(nranks)
    r = np.arange(nranks)
    if nranks % 2 == 1:                           # shift: tree1(r) = tree0(r-1) + 1
        q = p0[(r - 1) % nranks]
        p1 = np.where(q < 0, -1, (q + 1) % nranks)
    else:                                         # mirror: tree1(r) = n-1-tree0(n-1-r)
        q = p0[nranks - 1 - r]
        p1 = np.where(q < 0, -1, nranks - 1 - q)
    return p0, p1


def _tree_edges(parent: np.ndarray, chunk: int, seg: int):
    """Reduce up the tree as early as possible, then broadcast down (one segment).

    A rank sends its partial sum to its parent at step = its height (leaves at 0); the
    root (height R) holds the sum at time R and the value moves down one level per step.
    """
    n = len(parent)
    children: list[list[int]] = [[] for _ in range(n)]
    root = int(np.flatnonzero(parent < 0)[0])
    for r in range(n):
        if parent[r] >= 0:
            children[int(parent[r])].append(r)
    order, depth = [root], {root: 0}
    for r in order:                               # BFS order from the root
        for c in children[r]:
            depth[c] = depth[r] + 1
            order.append(c)
    height: dict[int, int] = {}
    for r in reversed(order):
        height[r] = 1 + max((height[c] for c in children[r]), default=-1)
    R = height[root]
    for r in order:
        if r != root:
            yield (height[r], r, int(parent[r]), chunk, (seg,), True, 0)
            yield (R + depth[r] - 1, int(parent[r]), r, chunk, (seg,), False, 1)


def double_binary_tree_allreduce(nranks: int, size: float = 2 ** 20,
                                 itemsize: int = 4) -> Pattern:
    """NCCL's double binary tree AllReduce: half the buffer reduced and broadcast on each tree.

    Chunk 0 (the first half of the buffer) goes up tree 0 of :func:`nccl_dtree` and back
    down; chunk 1 (second half) does the same on tree 1. Reduce edges add, broadcast
    edges copy. For 16 ranks this is REACT Fig. 1/2: 4 reduce steps, 4 broadcast steps.

    Parameters
    ----------
    nranks : int
        n >= 2.
    size, itemsize : see :func:`ring_allreduce`.

    Returns
    -------
    Pattern
        Phases ``reduce`` and ``broadcast``; ``2 x depth`` steps.

    Examples
    --------
    >>> p = double_binary_tree_allreduce(16, size=2_000_000)
    >>> p.steps, p.chunks, int(p.nbytes[0])
    (8, 2, 1000000)
    """
    nranks = require_int("nodes", nranks, minimum=2)
    elements = _elements(size, itemsize, 2)
    p0, p1 = nccl_dtree(nranks)
    edges = list(_tree_edges(p0, 0, 0)) + list(_tree_edges(p1, 1, 1))
    return Pattern.from_edges("nccl-tree", "allreduce", nranks, split_elements(elements, 2),
                              edges, itemsize=itemsize, phase_names=("reduce", "broadcast"))


# ----------------------------------------------------------------- recursive doubling
def recursive_doubling_allgather(nranks: int, size: float = 2 ** 20,
                                 itemsize: int = 4) -> Pattern:
    """Recursive-doubling AllGather; step s exchanges with rank XOR 2^s, doubling sizes.

    Segment ``j`` (``size / n`` bytes) is rank ``j``'s contribution. For a power of two
    n, at step ``s`` rank ``r`` sends every segment it holds (its aligned block of
    ``2^s`` ranks) to ``r ^ 2^s``: log2(n) steps, sizes ``2^s size / n``.

    Extension for n not a power of two (documented choice, as MPICH does for
    recursive-doubling AllReduce): with ``m`` the largest power of two below n, each
    extra rank ``m + i`` (``i < n - m``) first copies its segment to rank ``i``
    (step 0); ranks ``0..m-1`` then run recursive doubling, rank ``i`` carrying the
    segments of both ``i`` and ``m + i``; a last step copies the ``n - 1`` segments an
    extra rank lacks from ``i`` to ``m + i``. That is ``log2(m) + 2`` steps.

    Parameters
    ----------
    nranks : int
        n >= 2.
    size : float
        Bytes of the gathered output buffer (n contributions of ``size / n``).
    itemsize : int

    Returns
    -------
    Pattern
        One chunk; AllGather with ``owners[j] = j``.

    Examples
    --------
    >>> p = recursive_doubling_allgather(8, size=8192)
    >>> p.steps, sorted(set(p.nbytes.tolist()))
    (3, [1024, 2048, 4096])

    References
    ----------
    REACT Appendix A.1; Thakur, Rabenseifner & Gropp, "Optimization of collective
    communication operations in MPICH" (2005).
    """
    n = require_int("nodes", nranks, minimum=2)
    elements = _elements(size, itemsize, n)
    m = 1 << (n.bit_length() - 1)
    extra = n - m
    pre = 1 if extra else 0
    held = {r: [r] + ([m + r] if r < extra else []) for r in range(m)}
    edges: list[tuple[int, int, int, int, tuple[int, ...], bool, int]] = []
    if extra:
        edges += [(0, m + i, i, 0, (m + i,), False, 0) for i in range(extra)]
    s = 0
    while (1 << s) < m:
        for r in range(m):
            edges.append((pre + s, r, r ^ (1 << s), 0, tuple(sorted(held[r])), False, 0))
        held = {r: held[r] + held[r ^ (1 << s)] for r in range(m)}
        s += 1
    if extra:
        last = pre + s
        for i in range(extra):
            edges.append((last, i, m + i, 0, tuple(j for j in range(n) if j != m + i),
                          False, 0))
    return Pattern.from_edges("rd-allgather", "allgather", n, split_elements(elements, n),
                              edges, itemsize=itemsize, owners=np.arange(n),
                              phase_names=("all-gather",))


def build_pattern(collective: str, nodes: int, size: float = 2 ** 20,
                  itemsize: int = 4, order: Sequence[int] | None = None) -> Pattern:
    """A named pattern: ``tree`` (NCCL double binary tree AllReduce), ``ring`` (ring
    AllReduce on ``order``, default ``0..n-1``) or ``rd-allgather``."""
    if collective == "tree":
        return double_binary_tree_allreduce(nodes, size, itemsize)
    if collective == "ring":
        require_int("nodes", nodes, minimum=2)
        return ring_allreduce(range(nodes) if order is None else order, size, itemsize)
    if collective == "rd-allgather":
        return recursive_doubling_allgather(nodes, size, itemsize)
    raise ConfigError("collective", collective, f"use one of {', '.join(PATTERNS)}")

