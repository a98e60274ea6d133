"""Direct-connect topologies on server ports, and routes over them, with their checkers."""

from __future__ import annotations

from collections.abc import ItemsView, KeysView, ValuesView
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import networkx as nx
import numpy as np

from topoopt._frozen import FrozenDict
from topoopt.errors import PlanCheckError

__all__ = ["Link", "Topology", "Routes", "RouteArrays", "check_topology", "check_routes",
           "check_ring"]

#: ``(server_a, port_a, server_b, port_b)``: one fibre strand from the transmitter of
#: ``server_a``'s port ``port_a`` to the receiver of ``server_b``'s port ``port_b``.
Link = tuple[int, int, int, int]


@dataclass(frozen=True)
class Topology:
    """A direct-connect topology: directed links between NIC ports of servers.

    Servers are numbered ``0..servers-1`` and each has ports ``0..ports-1``. A NIC
    port has a transmit and a receive strand, and a patch panel or OCS can send them
    to different servers: that is how one port per server carries a ring permutation
    ``i -> (i + p) mod n`` (TopoOpt §4). So a link is directed, from a port's
    transmitter to a port's receiver, and no port transmits twice or receives twice
    (DESIGN.md: "no port is used twice"). A full-duplex connection between two
    servers, as a Blossom matching edge makes, is two links on the same two ports.
    Parallel links between the same two servers are allowed.

    Attributes
    ----------
    servers : int
        n.
    ports : int
        d, NIC ports per server.
    links : tuple of Link
        ``(server_a, port_a, server_b, port_b)``: transmitter of ``(a, port_a)`` to
        receiver of ``(b, port_b)``, ``a != b``.
    link_bandwidth : float
        Bits/s per link.
    link_latency : float
        Seconds.
    labels : tuple of str
        Optional, one per link: why it exists (``"ring:p=5"``, ``"mp"``, ``"expander"``).
    """

    servers: int
    ports: int
    links: tuple[Link, ...]
    link_bandwidth: float
    link_latency: float = 1e-6
    labels: tuple[str, ...] = ()

    def graph(self) -> nx.MultiDiGraph:
        """Directed multigraph over servers; edge key = link index, attrs ``ports``."""
        g = nx.MultiDiGraph()
        g.add_nodes_from(range(self.servers))
        for i, (a, pa, b, pb) in enumerate(self.links):
            g.add_edge(a, b, key=i, ports=(pa, pb))
        return g

    def simple_graph(self) -> nx.DiGraph:
        """Directed graph over servers; edge attribute ``links`` = parallel link count."""
        g = nx.DiGraph()
        g.add_nodes_from(range(self.servers))
        for a, _, b, _ in self.links:
            if g.has_edge(a, b):
                g[a][b]["links"] += 1
            else:
                g.add_edge(a, b, links=1)
        return g

    def out_degree(self, server: int) -> int:
        """Transmitters of ``server`` in use."""
        return sum(a == server for a, _, _, _ in self.links)

    def in_degree(self, server: int) -> int:
        """Receivers of ``server`` in use."""
        return sum(b == server for _, _, b, _ in self.links)


def _segments(ptr: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` of a CSR pointer array: their new pointer and the flat gather index."""
    starts = ptr[idx]
    lens = ptr[idx + 1] - starts
    new_ptr = np.zeros(idx.size + 1, np.int64)
    np.cumsum(lens, out=new_ptr[1:])
    flat = np.repeat(starts - new_ptr[:-1], lens) + np.arange(new_ptr[-1], dtype=np.int64)
    return new_ptr, flat


def _positions(keys: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of the sorted keys ``new`` goes among the sorted ``keys``, and whether
    it is there already."""
    at = np.searchsorted(keys, new)
    return at, (at < keys.size) & (keys[np.minimum(at, keys.size - 1)] == new)


def _splice(base: RouteArrays, few: RouteArrays, take: np.ndarray, at: np.ndarray,
            drop: np.ndarray) -> RouteArrays:
    """``base``'s pairs with ``few``'s pairs ``take`` (ascending) put before ``base``'s
    pairs ``at``, dropping ``base``'s pair ``at[k]`` where ``drop[k]``: runs of each
    array copied whole (:func:`~topoopt.topology._route_kernel.splice_runs`)."""
    # numba is loaded with the first merge only (import topoopt stays light)
    from topoopt.topology._route_kernel import splice_runs
    pairs = ((np.r_[0, at + drop], np.r_[at, base.pairs]), (take, take + 1))

    def through(ptr_base: np.ndarray, ptr_few: np.ndarray, runs: tuple) -> tuple:
        (a, b), (c, d) = runs
        return (ptr_base[a], ptr_base[b]), (ptr_few[c], ptr_few[d])

    def spliced(mine: np.ndarray, theirs: np.ndarray, runs: tuple) -> np.ndarray:
        (a, b), (c, d) = runs
        out = np.empty(int((b - a).sum() + (d - c).sum()), mine.dtype)
        splice_runs(mine, theirs, a, b, c, d, out)
        return out

    paths = through(base.path_ptr, few.path_ptr, pairs)
    nodes = through(base.node_ptr, few.node_ptr, paths)
    counts = spliced(np.diff(base.path_ptr), np.diff(few.path_ptr), pairs)
    lens = spliced(np.diff(base.node_ptr), np.diff(few.node_ptr), paths)
    return RouteArrays(spliced(base.src, few.src, pairs), spliced(base.dst, few.dst, pairs),
                       np.r_[0, np.cumsum(counts)], np.r_[0, np.cumsum(lens)],
                       spliced(base.nodes, few.nodes, nodes),
                       spliced(base.fraction, few.fraction, paths))


@dataclass(frozen=True, eq=False)
class RouteArrays:
    """Routes in compressed sparse row form: ordered pairs -> paths -> nodes.

    Attributes
    ----------
    src, dst : ndarray of int64, shape (m,)
        The routed pairs, distinct and sorted by ``(src, dst)``.
    path_ptr : ndarray of int64, shape (m + 1,)
        The paths of pair ``i`` are ``path_ptr[i]:path_ptr[i + 1]``.
    node_ptr : ndarray of int64, shape (P + 1,)
        The nodes of path ``j`` are ``nodes[node_ptr[j]:node_ptr[j + 1]]``.
    nodes : ndarray of int32
        Servers (int32: a plan's largest arrays, at half the bytes of int64).
    fraction : ndarray of float64, shape (P,)
        Share of its pair's bytes per path.

    Notes
    -----
    The form the route builders produce (a million pairs at n = 1024 would take seconds
    as Python tuples) and that :func:`check_routes` and the metrics read;
    :class:`Routes` shows it as the usual mapping of tuples, built on access.
    """

    src: np.ndarray
    dst: np.ndarray
    path_ptr: np.ndarray
    node_ptr: np.ndarray
    nodes: np.ndarray
    fraction: np.ndarray

    def __post_init__(self) -> None:
        nodes = np.asarray(self.nodes)
        if nodes.size and nodes.dtype != np.int32 and (nodes.min() < -2**31
                                                       or nodes.max() >= 2**31):
            raise ValueError("route nodes must be servers in 0..2**31 - 1")
        for name, dt in (("src", np.int64), ("dst", np.int64), ("path_ptr", np.int64),
                         ("node_ptr", np.int64), ("nodes", np.int32),
                         ("fraction", np.float64)):
            arr = np.ascontiguousarray(getattr(self, name), dtype=dt).reshape(-1)
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        m, paths = self.src.size, self.fraction.size
        if (self.dst.size != m or self.path_ptr.size != m + 1
                or self.node_ptr.size != paths + 1 or self.path_ptr[0] != 0
                or self.path_ptr[-1] != paths or self.node_ptr[0] != 0
                or self.node_ptr[-1] != self.nodes.size
                or np.any(np.diff(self.path_ptr) < 0) or np.any(np.diff(self.node_ptr) < 0)):
            raise ValueError("inconsistent route arrays: need len(dst) = len(src) = m, "
                             "path_ptr of m + 1 and node_ptr of len(fraction) + 1 "
                             "non-decreasing offsets from 0 to the data lengths")
        if m and (min(self.src.min(), self.dst.min()) < 0
                  or max(self.src.max(), self.dst.max()) >= 2**31):
            raise ValueError("route pairs must be servers in 0..2**31 - 1")
        if m > 1 and np.any(np.diff(self.keys) <= 0):
            raise ValueError("route pairs must be distinct and sorted by (src, dst)")

    @property
    def pairs(self) -> int:
        return int(self.src.size)

    @property
    def keys(self) -> np.ndarray:
        """``src * 2**32 + dst``: ascending, one per pair."""
        if "_keys" not in self.__dict__:
            object.__setattr__(self, "_keys", (self.src << 32) + self.dst)
        return self.__dict__["_keys"]

    @property
    def path_pair(self) -> np.ndarray:
        """Index of the pair of every path."""
        return np.repeat(np.arange(self.pairs), np.diff(self.path_ptr))

    def find(self, src, dst) -> np.ndarray:
        """Index of each pair ``(src[i], dst[i])``, ``-1`` where not routed (vectorized)."""
        key = (np.asarray(src, np.int64) << 32) + np.asarray(dst, np.int64)
        keys = self.keys
        pos = np.searchsorted(keys, key)
        pos = np.minimum(pos, max(keys.size - 1, 0))
        hit = keys[pos] == key if keys.size else np.zeros(key.shape, bool)
        return np.where(hit, pos, -1)

    def entry(self, i: int) -> tuple[tuple[tuple[int, ...], float], ...]:
        """Pair ``i``'s ``((node_path, fraction), ...)`` as Python tuples."""
        nodes, nptr = self.nodes, self.node_ptr
        return tuple((tuple(nodes[nptr[j]:nptr[j + 1]].tolist()), float(self.fraction[j]))
                     for j in range(int(self.path_ptr[i]), int(self.path_ptr[i + 1])))

    def iter_items(self) -> Iterator[tuple[tuple[int, int], tuple]]:
        """Every ``((src, dst), ((node_path, fraction), ...))`` in pair order."""
        nodes, nptr = self.nodes.tolist(), self.node_ptr.tolist()
        options = list(zip([tuple(nodes[a:b]) for a, b in zip(nptr, nptr[1:])],
                           self.fraction.tolist()))
        pptr = self.path_ptr.tolist()
        for s, t, a, b in zip(self.src.tolist(), self.dst.tolist(), pptr, pptr[1:]):
            yield (s, t), tuple(options[a:b])

    def take(self, idx) -> RouteArrays:
        """The pairs ``idx`` (ascending pair indices)."""
        idx = np.asarray(idx, np.int64)
        path_ptr, paths = _segments(self.path_ptr, idx)
        node_ptr, flat = _segments(self.node_ptr, paths)
        return RouteArrays(self.src[idx], self.dst[idx], path_ptr, node_ptr, self.nodes[flat],
                           self.fraction[paths])

    def merge(self, other: RouteArrays) -> RouteArrays:
        """These routes with ``other``'s pairs added, replacing the pairs both have.

        Spliced (:func:`_splice`): the pairs of the smaller side are put between runs
        of the larger side's, copied whole, so the only array as large as the nodes is
        the result (a ring-like 1024-server shard's MP routes hold ~10^8 nodes and are
        merged with a few ring-hop pairs)."""
        if not other.pairs:
            return self
        if not self.pairs:
            return other
        if other.pairs <= self.pairs:   # all of other's, into these (replacing)
            at, hit = _positions(self.keys, other.keys)
            return _splice(self, other, np.arange(other.pairs), at, hit)
        at, hit = _positions(other.keys, self.keys)   # these that other lacks, into other's
        keep = np.flatnonzero(~hit)
        return _splice(other, self, keep, at[keep], np.zeros(keep.size, bool))

    def reweighted(self, fraction) -> RouteArrays:
        """The same paths with new fractions; paths whose fraction is 0 are dropped."""
        fraction = np.asarray(fraction, np.float64)
        keep = np.flatnonzero(fraction != 0)
        if keep.size == fraction.size:
            return RouteArrays(self.src, self.dst, self.path_ptr, self.node_ptr, self.nodes,
                               fraction)
        counts = np.bincount(self.path_pair[keep], minlength=self.pairs)
        node_ptr, flat = _segments(self.node_ptr, keep)
        return RouteArrays(self.src, self.dst, np.r_[0, np.cumsum(counts)], node_ptr,
                           self.nodes[flat], fraction[keep])

    @classmethod
    def from_mapping(cls, paths: Mapping) -> RouteArrays:
        """The arrays of a ``(src, dst) -> ((node_path, fraction), ...)`` mapping."""
        if isinstance(paths, _PathTable):
            return paths.arrays
        items = sorted(paths.items())
        m = len(items)
        src = np.fromiter((int(s) for (s, _), _ in items), np.int64, m)
        dst = np.fromiter((int(t) for (_, t), _ in items), np.int64, m)
        counts = np.fromiter((len(opts) for _, opts in items), np.int64, m)
        opts = [o for _, options in items for o in options]
        lens = np.fromiter((len(p) for p, _ in opts), np.int64, len(opts))
        nodes = np.fromiter((int(v) for p, _ in opts for v in p), np.int64, int(lens.sum()))
        frac = np.fromiter((float(f) for _, f in opts), np.float64, len(opts))
        return cls(src, dst, np.r_[0, np.cumsum(counts)], np.r_[0, np.cumsum(lens)], nodes, frac)

    def to_dict(self) -> dict:
        return dict(self.iter_items())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RouteArrays):
            return NotImplemented
        return all(np.array_equal(getattr(self, f), getattr(other, f))
                   for f in ("src", "dst", "path_ptr", "node_ptr", "nodes", "fraction"))

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self):
        return (RouteArrays, (self.src, self.dst, self.path_ptr, self.node_ptr, self.nodes,
                              self.fraction))


class _ItemsView(ItemsView):
    def __iter__(self):
        return self._mapping.arrays.iter_items()


class _ValuesView(ValuesView):
    def __iter__(self):
        return (opts for _, opts in self._mapping.arrays.iter_items())


class _PathTable(Mapping):
    """Read-only mapping view of :class:`RouteArrays`: tuples are built when asked for."""

    __slots__ = ("arrays",)

    def __init__(self, arrays: RouteArrays) -> None:
        self.arrays = arrays

    def _index(self, pair) -> int:
        try:
            s, t = pair
            si, ti = int(s), int(t)
            if si != s or ti != t:
                return -1
        except (TypeError, ValueError, OverflowError):
            return -1
        s, t = si, ti
        if not (0 <= s < 2**31 and 0 <= t < 2**31):
            return -1
        return int(self.arrays.find([s], [t])[0])

    def __getitem__(self, pair):
        i = self._index(pair)
        if i < 0:
            raise KeyError(pair)
        return self.arrays.entry(i)

    def __contains__(self, pair: object) -> bool:
        return self._index(pair) >= 0

    def __iter__(self):
        return zip(self.arrays.src.tolist(), self.arrays.dst.tolist())

    def __len__(self) -> int:
        return self.arrays.pairs

    def keys(self):
        return KeysView(self)

    def items(self):
        return _ItemsView(self)

    def values(self):
        return _ValuesView(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _PathTable):
            return self.arrays == other.arrays
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and dict(self.items()) == dict(other.items())

    def __hash__(self) -> int:  # as FrozenDict's, so equal mappings hash equal
        try:
            return hash(frozenset(self.items()))
        except TypeError:
            return hash(repr(sorted(self.items(), key=repr)))

    def __reduce__(self):
        return (_PathTable, (self.arrays,))

    def __repr__(self) -> str:
        return f"<routes of {len(self)} pairs as arrays>"


@dataclass(frozen=True)
class Routes:
    """Routes over a topology: per ordered server pair, paths with traffic fractions.

    Attributes
    ----------
    paths : Mapping
        ``(src, dst) -> ((node_path, fraction), ...)``; each node path starts at
        ``src``, ends at ``dst``, and the fractions sum to 1.

    Notes
    -----
    Built from a mapping (kept as given) or from :class:`RouteArrays`
    (:meth:`from_arrays`; ``paths`` is then a read-only view that builds a pair's
    tuples when it is looked up or iterated). Either way :meth:`arrays` gives the
    compressed form and ``paths`` the tuples; the two compare equal when their
    mappings do.
    """

    paths: Mapping[tuple[int, int], tuple[tuple[tuple[int, ...], float], ...]] = \
        field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.paths, RouteArrays):
            object.__setattr__(self, "paths", _PathTable(self.paths))
        elif not isinstance(self.paths, _PathTable):
            object.__setattr__(self, "paths", FrozenDict(self.paths))

    @classmethod
    def from_arrays(cls, arrays: RouteArrays) -> Routes:
        """Routes backed by ``arrays`` (no tuples built until asked for)."""
        return cls(_PathTable(arrays))

    def arrays(self) -> RouteArrays:
        """The routes as :class:`RouteArrays` (computed once for mapping-built routes)."""
        if isinstance(self.paths, _PathTable):
            return self.paths.arrays
        cached = self.__dict__.get("_arrays")
        if cached is None:
            cached = RouteArrays.from_mapping(self.paths)
            object.__setattr__(self, "_arrays", cached)
        return cached

    @property
    def array_backed(self) -> bool:
        """Whether the routes are :class:`RouteArrays` (:meth:`from_arrays`): then they
        iterate in the arrays' pair order."""
        return isinstance(self.paths, _PathTable)

    def merge(self, other: Routes) -> Routes:
        """These routes with ``other``'s added; ``other`` wins for pairs both route."""
        if not len(other):
            return self
        if not len(self):
            return other
        return Routes.from_arrays(self.arrays().merge(other.arrays()))

    def __getitem__(self, pair: tuple[int, int]):
        return self.paths[pair]

    def __contains__(self, pair: object) -> bool:
        return pair in self.paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_arrays", None)  # derived; rebuilt on demand
        return state


def check_topology(topology: Topology, max_ports: int | None = None) -> None:
    """Raise :class:`PlanCheckError` naming the first violated invariant.

    Checks: servers and ports in range (ports below ``max_ports``, default
    ``topology.ports``), no self-loop, no port transmitting twice or receiving twice,
    and one label per link when labels are given.
    """
    n, d = topology.servers, max_ports if max_ports is not None else topology.ports
    used: dict[tuple[str, int, int], int] = {}
    for i, link in enumerate(topology.links):
        if len(link) != 4:
            raise PlanCheckError(f"link {i} {link!r} is not (server_a, port_a, server_b, port_b)")
        a, pa, b, pb = link
        if a == b:
            raise PlanCheckError(f"link {i} {link!r} connects server {a} to itself")
        for end, s, p in (("transmits", a, pa), ("receives", b, pb)):
            if not 0 <= s < n:
                raise PlanCheckError(f"link {i} {link!r}: server {s} not in 0..{n - 1}")
            if not 0 <= p < d:
                raise PlanCheckError(f"link {i} {link!r}: port {p} not in 0..{d - 1}")
            if (end, s, p) in used:
                raise PlanCheckError(f"link {i} {link!r}: port {p} of server {s} already "
                                     f"{end} on link {used[end, s, p]}")
            used[end, s, p] = i
    if topology.labels and len(topology.labels) != len(topology.links):
        raise PlanCheckError(f"{len(topology.labels)} labels for {len(topology.links)} links")


def _routes_valid(topology: Topology, arr: RouteArrays, tol: float) -> bool:
    """Vectorized: whether every check of :func:`check_routes` passes."""
    n = topology.servers
    counts = np.diff(arr.path_ptr)
    lens = np.diff(arr.node_ptr)
    if np.any(counts < 1) or np.any(lens < 1) or np.any(~(arr.fraction > 0)):
        return False
    if arr.nodes.size and (arr.nodes.min() < 0 or arr.nodes.max() >= n):
        return False
    pair = arr.path_pair
    # the fractions of a pair summed in order, as the loop does
    total = np.bincount(pair, weights=arr.fraction, minlength=arr.pairs)
    if np.any(~(np.abs(total - 1.0) <= tol)):
        return False
    first, last = arr.nodes[arr.node_ptr[:-1]], arr.nodes[arr.node_ptr[1:] - 1]
    if np.any(first != arr.src[pair]) or np.any(last != arr.dst[pair]):
        return False
    # numba is loaded on the first check only (import topoopt stays light)
    from topoopt.topology._route_kernel import revisits, unlinked_hop
    if revisits(arr.nodes, arr.node_ptr, n):
        return False
    linked = np.zeros(n * n, bool)
    if topology.links:
        ends = np.array([(a, b) for a, _, b, _ in topology.links], np.int64)
        ok = (ends >= 0).all(axis=1) & (ends < n).all(axis=1)
        linked[ends[ok, 0] * n + ends[ok, 1]] = True
    return not unlinked_hop(arr.nodes, arr.node_ptr, linked, n)


def check_routes(topology: Topology, routes: Routes, tol: float = 1e-9) -> None:
    """Raise :class:`PlanCheckError` unless every route is a valid path of links.

    Each path must start at its pair's source, end at its destination, visit no
    server twice and only take hops ``u -> v`` that are links; fractions must be positive
    and sum to 1 per pair.

    Notes
    -----
    The checks run vectorized on :meth:`Routes.arrays`; only when one fails does the
    per-pair loop run, to name the first violation.
    """
    try:
        valid = _routes_valid(topology, routes.arrays(), tol)
    except (TypeError, ValueError, IndexError, OverflowError):
        valid = False  # not even well-formed: the loop says where
    if not valid:
        _check_routes_by_pair(topology, routes, tol)


def _check_routes_by_pair(topology: Topology, routes: Routes, tol: float) -> None:
    """:func:`check_routes` one pair at a time: slow, but names the first violation."""
    g = topology.simple_graph()
    for (src, dst), options in routes.paths.items():
        if not options:
            raise PlanCheckError(f"route {src}->{dst} has no path")
        total = 0.0
        for path, fraction in options:
            if fraction <= 0:
                raise PlanCheckError(f"route {src}->{dst} path {path} has fraction {fraction}")
            total += fraction
            if path[0] != src or path[-1] != dst:
                raise PlanCheckError(f"route {src}->{dst} path {path} does not join them")
            if len(set(path)) != len(path):
                raise PlanCheckError(f"route {src}->{dst} path {path} visits a server twice")
            for u, v in zip(path, path[1:]):
                if not g.has_edge(u, v):
                    raise PlanCheckError(f"route {src}->{dst} path {path}: no link {u}-{v}")
        if abs(total - 1.0) > tol:
            raise PlanCheckError(f"route {src}->{dst} fractions sum to {total}, not 1")


def check_ring(order: tuple[int, ...], members: tuple[int, ...]) -> None:
    """Raise :class:`PlanCheckError` unless ``order`` visits each member exactly once."""
    if sorted(order) != sorted(members) or len(set(order)) != len(order):
        raise PlanCheckError(f"ring {list(order)} is not a Hamiltonian cycle of {list(members)}")
