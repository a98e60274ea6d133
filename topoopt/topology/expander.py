"""Random d-regular directed expanders on server ports (the Expander baseline of TopoOpt §5)."""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from topoopt._require import require_int, require_positive
from topoopt.errors import TopoOptError
from topoopt.topology.topology import Topology

__all__ = ["expander_topology", "random_derangement"]


def random_derangement(forbidden: np.ndarray, rng: np.random.Generator,
                       repairs: int | None = None) -> np.ndarray | None:
    """A random permutation ``p`` with ``forbidden[i, p[i]]`` False for every ``i``.

    Draws a uniform permutation, then repairs forbidden positions by random swaps
    that leave both swapped positions allowed (a randomized local search; the
    result is close to, not exactly, uniform over the allowed permutations).

    Parameters
    ----------
    forbidden : ndarray of bool, shape (n, n)
        Put True on the diagonal to forbid fixed points.
    rng : numpy.random.Generator
    repairs : int, optional
        Swap attempts before giving up (default ``50 n``).

    Returns
    -------
    ndarray of int, or None when no allowed permutation was found.
    """
    n = forbidden.shape[0]
    p = rng.permutation(n)
    rows = np.arange(n)
    for _ in range(repairs if repairs is not None else 50 * n):
        bad = np.flatnonzero(forbidden[rows, p])
        if bad.size == 0:
            return p
        i = int(bad[rng.integers(bad.size)])
        j = int(rng.integers(n))
        if not forbidden[i, p[j]] and not forbidden[j, p[i]]:
            p[i], p[j] = p[j], p[i]
    return p if not forbidden[rows, p].any() else None


def expander_topology(servers: int, ports: int, link_bandwidth: float,
                      link_latency: float = 1e-6, seed: int = 0, tries: int = 200) -> Topology:
    """A random d-regular directed expander: the union of ``ports`` random derangements.

    Port ``k`` of every server carries permutation ``p_k``: the transmitter of
    ``(i, k)`` goes to the receiver of ``(p_k[i], k)``. So every port transmits
    once and receives once and every server has in- and out-degree ``d``: the same
    hardware model as a TopoOpt shard (a patch panel or OCS wires each port's TX
    and RX strands independently, TopoOpt §4), which makes the comparison fair.
    Permutations avoid fixed points and repeat no server pair (no parallel
    links) when the first ``tries / 2`` draws manage it (in practice whenever
    ``ports < servers``; later draws allow parallel links). The whole draw is
    repeated until the graph is strongly connected (for ``d = 1`` the one
    permutation is drawn as a random Hamiltonian cycle, the only strongly
    connected kind). A union of random permutations is an expander with high
    probability (the permutation model of random regular graphs [1]).

    Why directed permutations and not an undirected random regular graph with both
    directions on one port: the undirected model needs ``n x d`` even and a
    matching of ports, and would waste the freedom the optical layer gives; the
    permutation model is defined for every ``n >= 2`` and ``d >= 1``.

    Parameters
    ----------
    servers : int
        n >= 2.
    ports : int
        d >= 1.
    link_bandwidth : float
        Bits/s per link.
    link_latency : float
        Seconds.
    seed : int
        Seeds the draw; the same seed gives the same topology.
    tries : int
        Draws before giving up on strong connectivity.

    Returns
    -------
    Topology
        ``n x d`` links labelled ``"expander"``; passes :func:`check_topology`.

    Raises
    ------
    ConfigError
        Invalid sizes.
    TopoOptError
        No strongly connected draw within ``tries`` (only for tiny odd cases).

    Examples
    --------
    >>> t = expander_topology(16, 4, 100e9, seed=1)
    >>> len(t.links), t.out_degree(0), t.in_degree(0)
    (64, 4, 4)

    References
    ----------
    .. [1] J. Friedman, "A proof of Alon's second eigenvalue conjecture and related
       problems", Memoirs of the AMS 195(910), 2008 (random 2d-regular graphs from
       d random permutations are near-Ramanujan expanders w.h.p.).
    .. [2] A. Singla et al., "Jellyfish: Networking Data Centers Randomly", NSDI 2012;
       TopoOpt §5 "Expander" baseline.
    """
    n = require_int("servers", servers, minimum=2)
    d = require_int("ports", ports, minimum=1)
    require_positive("link_bandwidth", link_bandwidth)
    require_positive("link_latency", link_latency, allow_zero=True)
    rng = np.random.default_rng(seed)
    for attempt in range(tries):
        strict = attempt < tries // 2  # later draws may repeat pairs (parallel links)
        forbidden = np.eye(n, dtype=bool)
        perms = []
        for _k in range(d):
            p: np.ndarray | None
            if d == 1:  # one permutation is strongly connected only as one n-cycle
                order = rng.permutation(n)
                p = np.empty(n, np.int64)
                p[order] = np.roll(order, -1)
            else:
                p = random_derangement(forbidden if strict else np.eye(n, dtype=bool), rng)
            if p is None:
                break
            perms.append(p)
            forbidden[np.arange(n), p] = True
        if len(perms) < d:
            continue
        src = np.tile(np.arange(n), d)
        dst = np.concatenate(perms)
        graph = csr_matrix((np.ones(src.size), (src, dst)), shape=(n, n))
        if connected_components(graph, directed=True, connection="strong")[0] == 1:
            links = tuple((int(i), k, int(perms[k][i]), k) for k in range(d) for i in range(n))
            return Topology(n, d, links, float(link_bandwidth), float(link_latency),
                            labels=("expander",) * len(links))
    raise TopoOptError(f"no strongly connected {d}-regular expander on {n} servers in "
                       f"{tries} draws; use more ports or another seed")
