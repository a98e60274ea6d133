"""Direct-connect fabrics: servers wired port to port (TopoOpt shards, expanders)."""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import numpy as np

from topoopt._require import require_choice
from topoopt.errors import PlanCheckError
from topoopt.fabrics.fabric import OPTICS, Fabric
from topoopt.netsim.maxmin import gather_rows, row_runs
from topoopt.topology.expander import expander_topology
from topoopt.topology.topology import RouteArrays, Routes, Topology, check_routes, check_topology

__all__ = ["direct_connect", "expander", "LinkPaths"]

#: Up to this many server pairs (n^2: 4,096 servers) a direct fabric's router reads its
#: explicit routes' hop links from a dense table (int32, 64 MB at most, made for the
#: read); above, by a binary search of the links.
_TABLE_ENTRIES = 1 << 24


def direct_connect(topology: Topology, routes: Routes | None = None,
                   optics: str = "patch_panel", name: str = "topoopt",
                   rings: Mapping[tuple[int, ...], Sequence[Sequence[int]]] | None = None
                   ) -> Fabric:
    """A fabric from a direct-connect topology, with host-based forwarding.

    Servers are the only nodes. The parallel links from one server to another are
    bundled into one link of their summed bandwidth (a flow may use all of them,
    as if striped). A flow relayed by other servers loads the link of every hop
    (TopoOpt §3, "host-based forwarding"; the bandwidth tax of §5.4).

    Parameters
    ----------
    topology : Topology
        From the TopologyFinder (or :func:`expander_topology`); must pass
        :func:`check_topology`.
    routes : Routes, optional
        Paths per server pair with traffic fractions (TopoOpt's coin-change and
        k-shortest-path routing). Pairs it lacks, or all pairs when None, use ECMP
        over the shortest paths (fewest hops).
    optics : str
        ``"patch_panel"``, ``"ocs"`` or ``"none"`` (fixed cables); only the cost
        model reads it.
    name : str
    rings : Mapping, optional
        The plan's AllReduce ring orders (group members -> orders), kept in
        ``info["rings"]``: :func:`topoopt.estimate.estimate_iteration` uses them
        when it is given no rings of its own.

    Returns
    -------
    Fabric
        ``kind = "direct"``; ``info`` has ``ports`` (d), ``port_bandwidth`` (B),
        ``bundled`` (links merged into bundles) and ``rings`` when given.

    Raises
    ------
    PlanCheckError
        Invalid topology or routes.

    Examples
    --------
    >>> ring = Topology(4, 1, tuple((i, 0, (i + 1) % 4, 0) for i in range(4)), 100e9)
    >>> f = direct_connect(ring)
    >>> [len(p) for p, _ in f.paths(0, 3)]      # 0 -> 1 -> 2 -> 3
    [3]
    """
    check_topology(topology)
    require_choice("optics", optics, OPTICS)
    if routes is not None:
        check_routes(topology, routes)
    n = topology.servers
    pairs = np.array([(a, b) for a, _, b, _ in topology.links], np.int64).reshape(-1, 2)
    uniq, count = np.unique(pairs, axis=0, return_counts=True)
    explicit = _explicit(routes, uniq, n) if routes is not None and len(routes) else {}
    none = np.full(n, -1, np.int64)
    fabric = Fabric(name=name, servers=n, nodes=n, src=uniq[:, 0], dst=uniq[:, 1],
                    capacity=count * float(topology.link_bandwidth),
                    latency=np.full(uniq.shape[0], float(topology.link_latency)),
                    kind="direct", optics=optics,
                    server_bandwidth=topology.ports * float(topology.link_bandwidth),
                    attach=np.arange(n), uplink=none, downlink=none,
                    info={"ports": topology.ports, "port_bandwidth": topology.link_bandwidth,
                          "bundled": int(len(topology.links) - uniq.shape[0]),
                          **({"rings": rings} if rings is not None else {})},
                    explicit=explicit)
    if uniq.shape[0] == 0 and n > 1:
        raise PlanCheckError("the topology has no links")
    return fabric


class LinkPaths(Mapping):
    """A direct fabric's explicit routes, ``(src, dst) -> ((bundled-link ids,
    fraction), ...)`` in the routes' order, kept as arrays: the routes'
    :class:`~topoopt.topology.topology.RouteArrays` (shared with the plan), the ends
    of the bundled links and, unless it is theirs, the pairs' order. A pair's
    tuple is built when it is looked up, and a hop's link when it is read (a link per
    hop would be another 0.35 GB for a ring-like 1024-server shard); as Python objects
    every pair of a plan (n^2 of them for a job whose tables span the shard) would cost
    a fabric hundreds of bytes each (docs/limits.md, "Memory of a DLRM plan").

    Parameters
    ----------
    arr : RouteArrays
        Every hop ``u -> v`` of its paths is one of the links.
    ends : ndarray of int64
        ``u * n + v`` of every bundled link ``u -> v``, ascending: link ``i`` is the
        ``i``-th.
    n : int
        Servers.
    order : ndarray of int, optional
        Pair indices of ``arr`` in the order the mapping iterates them (default
        ``arr``'s own).
    """

    def __init__(self, arr: RouteArrays, ends: np.ndarray, n: int,
                 order: np.ndarray | None = None) -> None:
        if order is not None and np.array_equal(order, np.arange(arr.src.size)):
            order = None
        self.arr, self.order, self.n = arr, order, int(n)
        self.ends = np.asarray(ends, np.int64)
        self._hash: int | None = None

    def _links(self, starts: np.ndarray, table: np.ndarray | None = None) -> np.ndarray:
        """The links (int64) of the hops that start at node indices ``starts``, from
        ``table`` (:meth:`_table`) or by a search of :attr:`ends`."""
        nodes = self.arr.nodes
        key = nodes[starts].astype(np.int64) * self.n + nodes[starts + 1]
        found = table[key] if table is not None else np.searchsorted(self.ends, key)
        return found.astype(np.int64)

    def _table(self) -> np.ndarray | None:
        """The link of ``u -> v`` at ``u * n + v`` (int32), for reading many hops; None
        above :data:`_TABLE_ENTRIES` (the search is used instead)."""
        if self.n * self.n > _TABLE_ENTRIES:
            return None
        table = np.full(self.n * self.n, -1, np.int32)
        table[self.ends] = np.arange(self.ends.size, dtype=np.int32)
        return table

    def _index(self, key: object) -> int:
        if not isinstance(key, tuple) or len(key) != 2:
            return -1
        try:
            s, t = int(key[0]), int(key[1])
        except (TypeError, ValueError):
            return -1
        if not (0 <= s < 2 ** 31 and 0 <= t < 2 ** 31):
            return -1
        return int(self.arr.find(np.array([s]), np.array([t]))[0])

    def _order(self) -> np.ndarray:
        return np.arange(self.arr.src.size) if self.order is None else self.order

    def __getitem__(self, key: tuple[int, int]) -> tuple[tuple[np.ndarray, float], ...]:
        i = self._index(key)
        if i < 0:
            raise KeyError(key)
        nptr, fraction, out = self.arr.node_ptr, self.arr.fraction, []
        for j in range(int(self.arr.path_ptr[i]), int(self.arr.path_ptr[i + 1])):
            out.append((self._links(np.arange(int(nptr[j]), int(nptr[j + 1]) - 1)),
                        float(fraction[j])))
        return tuple(out)

    def __contains__(self, key: object) -> bool:
        return self._index(key) >= 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = self._order()
        return zip(self.arr.src[order].tolist(), self.arr.dst[order].tolist())

    def __len__(self) -> int:
        return int(self.arr.src.size)

    def __hash__(self) -> int:
        if self._hash is None:   # (the links are a function of the nodes and the table)
            self._hash = hash((self.arr.src.tobytes(), self.arr.dst.tobytes(),
                               self._order().tobytes(), self.arr.node_ptr.tobytes(),
                               self.arr.nodes.tobytes(), self.ends.tobytes(),
                               self.arr.fraction.tobytes()))
        return self._hash

    def __repr__(self) -> str:
        return f"<explicit routes of {len(self)} pairs as arrays>"

    def link_arrays(self) -> tuple[np.ndarray, ...]:
        """``(src, dst, paths per pair, hops per path, fraction per path, links)`` in
        the mapping's order: what iterating its items gives, without the tuples."""
        return next(self.link_chunks(None))

    def link_chunks(self, hops: int | None) -> Iterator[tuple[np.ndarray, ...]]:
        """:meth:`link_arrays` in runs of pairs of about ``hops`` hops each (at least
        one pair; all in one for None): their concatenation is :meth:`link_arrays`'s,
        and no array is as large as the whole table's hops."""
        arr, order, table = self.arr, self._order(), self._table()
        hop_ptr = arr.node_ptr - np.arange(arr.node_ptr.size)
        upto = hop_ptr[arr.path_ptr[order + 1]] - hop_ptr[arr.path_ptr[order]]
        upto = np.concatenate([[0], np.cumsum(upto)])   # hops before each pair, in order
        # (an empty table: one empty run)
        runs = (row_runs(upto, hops) if hops is not None and order.size
                else iter([(0, order.size)]))
        for lo, hi in runs:
            idx = order[lo:hi]
            paths, per_pair = gather_rows(arr.path_ptr, idx)
            at, plen = gather_rows(hop_ptr, paths)
            at += np.repeat(paths, plen)           # hop index -> its first node's
            yield (arr.src[idx], arr.dst[idx], per_pair, plen, arr.fraction[paths],
                   self._links(at, table))


def _explicit(routes: Routes, uniq: np.ndarray, n: int) -> LinkPaths:
    """The explicit routes of :func:`direct_connect` as a :class:`LinkPaths` over
    ``routes``' arrays and the ends of the bundled links ``uniq`` (sorted); the routes
    passed :func:`check_routes`, so every hop is one of them."""
    arr = routes.arrays()
    if routes.array_backed:
        index = None        # the routes iterate in their arrays' order
    else:
        keys = np.array(list(routes.paths), np.int64).reshape(-1, 2)
        index = arr.find(keys[:, 0], keys[:, 1]).astype(np.int64)
    return LinkPaths(arr, uniq[:, 0] * n + uniq[:, 1], n, index)


def expander(servers: int, ports: int, link_bandwidth: float, link_latency: float = 1e-6,
             seed: int = 0) -> Fabric:
    """The Expander baseline of TopoOpt §5: a random d-regular direct-connect graph
    (:func:`topoopt.topology.expander.expander_topology`), fixed cables, ECMP
    over shortest paths with host-based forwarding."""
    topo = expander_topology(servers, ports, link_bandwidth, link_latency, seed)
    return direct_connect(topo, None, optics="none", name="expander")
