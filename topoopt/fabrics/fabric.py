"""The Fabric type: servers, switches and directed links, with ECMP or random-path routing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from topoopt._frozen import FrozenDict
from topoopt.errors import PlanCheckError, TopoOptError
from topoopt.fabrics._router import _CoreRouter
from topoopt.netsim.maxmin import gather_rows, sum_by_key
from topoopt.netsim.workload import FlowRoutes, couple_routes

__all__ = ["Fabric", "check_fabric", "KINDS", "OPTICS"]

#: ``switched``: servers hang off switches by one up- and one downlink each;
#: ``direct``: servers are the routers (host-based forwarding, no switches).
KINDS = ("switched", "direct")
#: What connects a direct fabric's ports: nothing (fixed cables), patch panels, OCSes,
#: or SiP-ML's silicon-photonic wavelengths on a fibre ring.
OPTICS = ("none", "patch_panel", "ocs", "sip")

#: Coflow members up to which coupled_route multiplies by hand, not by scipy.sparse.
_SMALL_COUPLED = 4096


@dataclass(frozen=True, eq=False)
class Fabric:
    """A network of servers ``0..n-1`` and switches ``n..nodes-1`` joined by directed links.

    Link ``i`` goes from node ``src[i]`` to node ``dst[i]`` with ``capacity[i]``
    bits/s and ``latency[i]`` seconds; the arrays are what the flow simulator
    (:func:`topoopt.netsim.simulate`) takes as a network. Every server enters the
    network at one routing node, ``attach[s]``: its switch (through link
    ``uplink[s]``, and leaves it by ``downlink[s]``) in a switched fabric, or
    itself in a direct one, where servers forward for each other (host-based
    forwarding, TopoOpt §3: a relayed flow loads every hop's link).

    Routing between servers (:meth:`route`, :meth:`paths`): the explicit routes
    given at build time (TopoOpt's), otherwise ECMP over all shortest paths
    (fewest hops) between the two routing nodes, each path carrying an equal
    share; or, with ``random=True``, one shortest path per flow drawn uniformly
    with a seed. Routes are computed lazily per pair of routing nodes and cached.

    Attributes
    ----------
    name : str
        ``"ideal"``, ``"fattree"``, ``"oversub"``, ``"expander"``, ``"star"``,
        ``"topoopt"``...
    servers : int
    nodes : int
        Servers plus switches.
    src, dst : ndarray of int64, shape (L,)
    capacity, latency : ndarray of float64, shape (L,)
    kind : str
        One of :data:`KINDS`.
    optics : str
        One of :data:`OPTICS` (what the cost model adds per port).
    server_bandwidth : float
        Total NIC bandwidth of one server, bits/s (d x B, or d x B' for the
        cost-equivalent Fat-tree).
    attach, uplink, downlink : ndarray of int64, shape (n,)
        Routing node of each server and its access links (-1 in a direct fabric).
    info : Mapping
        Builder parameters (``k``, ``ports``, ``port_bandwidth``...), for reports
        and the cost model.
    """

    name: str
    servers: int
    nodes: int
    src: np.ndarray
    dst: np.ndarray
    capacity: np.ndarray
    latency: np.ndarray
    kind: str
    optics: str
    server_bandwidth: float
    attach: np.ndarray
    uplink: np.ndarray
    downlink: np.ndarray
    info: Mapping[str, Any] = field(default_factory=dict)
    explicit: Mapping[tuple[int, int], tuple[tuple[np.ndarray, float], ...]] = \
        field(default_factory=dict, repr=False)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, dt in (("src", np.int64), ("dst", np.int64), ("capacity", float),
                         ("latency", float), ("attach", np.int64), ("uplink", np.int64),
                         ("downlink", np.int64)):
            arr = np.array(getattr(self, name), dtype=dt)
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "info", FrozenDict(self.info))
        if not hasattr(self.explicit, "link_arrays"):    # (arrays stay arrays)
            object.__setattr__(self, "explicit", FrozenDict(self.explicit))

    @property
    def links(self) -> int:
        """Number of directed links L."""
        return int(self.src.size)

    # -- routing ------------------------------------------------------------------
    def release_routes(self) -> None:
        """Drop the routing tables :meth:`route` and :meth:`paths` keep (shortest-path
        layers, the routed pairs' store): memory back for a fabric not in use. They
        are computed again when asked, the same routes (a pair's route depends on the
        fabric alone, not on what was routed before)."""
        self._cache.clear()

    @property
    def routes_nbytes(self) -> int:
        """Bytes of the routing tables :meth:`release_routes` would drop (0 when none
        are held): what keeping this fabric's routes warm costs."""
        core = self._cache.get("core")
        return core.nbytes if core is not None else 0

    def _core(self) -> "_CoreRouter":
        core = self._cache.get("core")
        if core is None:
            core = _CoreRouter(self)
            self._cache["core"] = core
        return core

    def route(self, src, dst, random: bool = False, seed: int | None = 0) -> FlowRoutes:
        """Routes of flows ``src[i] -> dst[i]`` (server ids) as a :class:`FlowRoutes`.

        Parameters
        ----------
        src, dst : array_like of int
        random : bool
            One uniformly drawn shortest path per flow instead of ECMP (explicit
            routes given at build time still win).
        seed : int, optional
            Seed of the random draw.

        Returns
        -------
        FlowRoutes
            One row per flow; a flow from a server to itself has an empty route.
        """
        src, dst = self._server_ids("route", src, dst)
        core = self._core()
        a, b = self.attach[src], self.attach[dst]
        same = src == dst
        if random:
            core_routes = core.random_paths(a, b, np.random.default_rng(seed))
            if core.explicit_row.any():  # explicit routes win over the random draw
                rows = core.row_of[core.local[a], core.local[b]]
                fixed = (rows >= 0) & ~same
                fixed[fixed] = core.explicit_row[rows[fixed]]
                if fixed.any():
                    core_routes = _merge_rows(core_routes, core.rows(np.maximum(rows, 0)), fixed)
        else:
            core_routes = core.rows(core.pair_rows(a, b))
        up = np.where(same, -1, self.uplink[src])
        down = np.where(same, -1, self.downlink[dst])
        core_routes = _blank(core_routes, same)
        return _with_access(core_routes, up, down)

    def _server_ids(self, caller: str, src, dst) -> tuple[np.ndarray, np.ndarray]:
        """``src`` and ``dst`` as flat int64 arrays of one length, checked to be servers."""
        src = np.asarray(src, np.int64).ravel()
        dst = np.asarray(dst, np.int64).ravel()
        if src.shape != dst.shape:
            raise TopoOptError(f"{caller}: src and dst need the same length")
        n = self.servers
        if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
            raise TopoOptError(f"{caller}: server ids must be in 0..{n - 1}")
        return src, dst

    def link_bytes(self, src, dst, nbytes) -> np.ndarray:
        """Bytes on each link when flow ``i`` sends ``nbytes[i]`` from ``src[i]`` to
        ``dst[i]`` on its route (ECMP shares of it on a split route).

        The same sums as ``np.bincount`` of :meth:`route`'s entries with each flow's
        bytes times the entry's weight, without making those rows: the route store's
        own are read, so a traffic matrix of every pair costs no copy of every pair's
        routes. Each link's terms are added in the order of the flows.

        Parameters
        ----------
        src, dst : array_like of int
            Server ids.
        nbytes : array_like of float

        Returns
        -------
        ndarray of float, shape (links,)
        """
        src, dst = self._server_ids("link_bytes", src, dst)
        nbytes = np.asarray(nbytes, float).ravel()
        if nbytes.shape != src.shape:
            raise TopoOptError("link_bytes: src, dst and nbytes need the same length")
        off = src != dst                # a server's bytes to itself cross no link
        src, dst, nbytes = src[off], dst[off], nbytes[off]
        core = self._core()
        load = core.row_bytes(core.pair_rows(self.attach[src], self.attach[dst]), nbytes)
        # an access link is on no core route: its sum is added to an exact 0
        for access, end in ((self.uplink, src), (self.downlink, dst)):
            acc = access[end]
            use = acc >= 0
            if use.any():
                load += np.bincount(acc[use], weights=nbytes[use], minlength=self.links)
        return load

    def coupled_route(self, src, dst, group, share, groups: int, random: bool = False,
                      seed: int | None = 0) -> tuple[FlowRoutes, np.ndarray]:
        """Routes of flows merged into ``groups`` coupled flows (coflows).

        Flow ``i`` (``src[i] -> dst[i]``) belongs to coupled flow ``group[i]`` and
        carries ``share[i]`` of its rate, so coupled flow ``g`` loads link ``l``
        with ``sum_i share[i] x weight_i[l]``. With ECMP the routing-node part is one
        sparse product, (groups x routing-node pairs) shares times the pairs' route
        rows, so a Fat-tree's long ECMP routes are expanded once per ToR pair, not
        once per flow; with ``random=True`` each flow takes its own drawn path
        (:meth:`route`) and the rows are merged per group.

        Returns
        -------
        routes : FlowRoutes
            One row per group.
        latency : ndarray
            Per group, the largest member path latency (weight x link latency summed).
        """
        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        group = np.asarray(group, np.int64)
        share = np.asarray(share, float)
        if random:
            r = self.route(src, dst, random=True, seed=seed)
            owner = np.repeat(np.arange(len(r)), np.diff(r.ptr))
            path_lat = np.bincount(owner, weights=self.latency[r.link] * r.weight,
                                   minlength=len(r))
            return couple_routes(r, path_lat, group, share, groups, self.links)
        core = self._core()
        local = src != dst
        rows = core.pair_rows(self.attach[src], self.attach[dst])
        mat, row_lat = core.matrix()
        w = np.where(local, share, 0.0)
        L = self.links
        if src.size <= _SMALL_COUPLED:
            # the same product by hand: scipy's sparse set-up costs more than a few
            # hundred members' rows
            pair, inv = np.unique(group * mat.shape[0] + rows, return_inverse=True)
            pair_w = np.bincount(inv.ravel(), weights=w, minlength=pair.size)
            g_of, r_of = np.divmod(pair, mat.shape[0])
            idx, counts = gather_rows(mat.indptr, r_of)
            keys = [np.repeat(g_of, counts) * L + mat.indices[idx]]
            vals = [np.repeat(pair_w, counts) * mat.data[idx]]
        else:
            core_part = (csr_matrix((w, (group, rows)), shape=(groups, mat.shape[0]))
                         @ mat).tocoo()
            keys, vals = [core_part.row.astype(np.int64) * L + core_part.col], [core_part.data]
        flow_lat = row_lat[rows]
        for access, end in ((self.uplink, src), (self.downlink, dst)):
            acc = access[end]
            use = (acc >= 0) & local
            if use.any():
                keys.append(group[use] * L + acc[use])
                vals.append(share[use])
                flow_lat = flow_lat + np.where(use, self.latency[np.maximum(acc, 0)], 0.0)
        ukey, weight = sum_by_key(np.concatenate(keys), np.concatenate(vals), groups * L)
        ptr = np.zeros(groups + 1, np.int64)
        np.cumsum(np.bincount(ukey // L, minlength=groups), out=ptr[1:])
        lat = np.zeros(groups)
        np.maximum.at(lat, group, np.where(local, flow_lat, 0.0))
        return FlowRoutes(ptr, ukey % L, weight), lat

    def paths(self, src: int, dst: int, random: bool = False, seed: int | None = 0
              ) -> list[tuple[np.ndarray, float]]:
        """The paths of ``src -> dst`` as ``[(link ids, weight), ...]``, weights summing to 1.

        Explicit routes if given, else every shortest path with an equal weight
        (ECMP), or with ``random=True`` one shortest path drawn with ``seed``
        (weight 1). Not for hot loops: use :meth:`route`.
        """
        src, dst = int(src), int(dst)
        if not (0 <= src < self.servers and 0 <= dst < self.servers):
            raise TopoOptError(f"paths: server ids must be in 0..{self.servers - 1}")
        if src == dst:
            return [(np.empty(0, np.int64), 1.0)]
        if random:
            links, weights = self.route([src], [dst], random=True, seed=seed).row(0)
            if np.allclose(weights, 1.0):
                head = dict(zip(self.src[links].tolist(), links.tolist()))
                node, order = src, []
                while node != dst:  # put the links in path order
                    order.append(head[node])
                    node = int(self.dst[head[node]])
                return [(np.array(order, np.int64), 1.0)]
        core = self._core()
        a, b = int(self.attach[src]), int(self.attach[dst])
        inner = core.enumerate(a, b)
        up = [self.uplink[src]] if self.uplink[src] >= 0 else []
        down = [self.downlink[dst]] if self.downlink[dst] >= 0 else []
        return [(np.array(up + list(p) + down, np.int64), w) for p, w in inner]

    def path_latency(self, src, dst) -> np.ndarray:
        """Expected latency of ``src[i] -> dst[i]``: sum over the route of weight x link latency."""
        r = self.route(src, dst)
        owner = np.repeat(np.arange(len(r)), np.diff(r.ptr))
        return np.bincount(owner, weights=self.latency[r.link] * r.weight, minlength=len(r))

    def with_capacity(self, capacity: np.ndarray, name: str | None = None) -> "Fabric":
        """A copy with other link capacities (e.g. degraded links); routes are shared."""
        cap = np.asarray(capacity, float)
        if cap.shape != self.capacity.shape:
            raise TopoOptError("with_capacity: one capacity per link")
        return Fabric(name or self.name, self.servers, self.nodes, self.src, self.dst, cap,
                      self.latency, self.kind, self.optics, self.server_bandwidth, self.attach,
                      self.uplink, self.downlink, self.info, self.explicit, self._cache)


def _blank(r: FlowRoutes, rows: np.ndarray) -> FlowRoutes:
    """Drop the entries of the flagged rows."""
    if not rows.any():
        return r
    counts = np.diff(r.ptr)
    keep = np.repeat(~rows, counts)
    counts = np.where(rows, 0, counts)
    return FlowRoutes(np.concatenate([[0], np.cumsum(counts)]), r.link[keep], r.weight[keep])


def _merge_rows(base: FlowRoutes, other: FlowRoutes, take_other: np.ndarray) -> FlowRoutes:
    """Row ``i`` from ``other`` where ``take_other[i]``, else from ``base``."""
    cb, co = np.diff(base.ptr), np.diff(other.ptr)
    counts = np.where(take_other, co, cb)
    kb = np.repeat(~take_other, cb)
    ko = np.repeat(take_other, co)
    owner = np.concatenate([np.repeat(np.arange(take_other.size), cb)[kb],
                            np.repeat(np.arange(take_other.size), co)[ko]])
    order = np.argsort(owner, kind="stable")
    link = np.concatenate([base.link[kb], other.link[ko]])[order]
    weight = np.concatenate([base.weight[kb], other.weight[ko]])[order]
    return FlowRoutes(np.concatenate([[0], np.cumsum(counts)]), link, weight)


def _with_access(core: FlowRoutes, up: np.ndarray, down: np.ndarray) -> FlowRoutes:
    """Prepend each flow's uplink and append its downlink (when >= 0), weight 1."""
    has_up, has_down = up >= 0, down >= 0
    if not has_up.any() and not has_down.any():
        return core
    cc = np.diff(core.ptr)
    counts = cc + has_up + has_down
    ptr = np.concatenate([[0], np.cumsum(counts)])
    total = int(ptr[-1])
    link = np.empty(total, np.int64)
    weight = np.ones(total)
    first = ptr[:-1]
    link[first[has_up]] = up[has_up]
    core_start = first + has_up
    idx, _ = gather_rows(core.ptr, np.arange(cc.size))
    pos = np.repeat(core_start - core.ptr[:-1], cc) + idx
    link[pos] = core.link
    weight[pos] = core.weight
    last = ptr[1:] - 1
    link[last[has_down]] = down[has_down]
    return FlowRoutes(ptr, link, weight)


def check_fabric(fabric: Fabric) -> None:
    """Raise :class:`PlanCheckError` unless ``fabric`` is well formed.

    Checks array shapes, node ids in range, no self-loop, capacities finite and
    > 0, latencies >= 0, servers attached by existing access links (switched) or
    to themselves (direct), and that every server reaches every other.
    """
    n, nodes, L = fabric.servers, fabric.nodes, fabric.links
    if fabric.kind not in KINDS:
        raise PlanCheckError(f"fabric kind {fabric.kind!r} not in {KINDS}")
    if fabric.optics not in OPTICS:
        raise PlanCheckError(f"fabric optics {fabric.optics!r} not in {OPTICS}")
    for name in ("dst", "capacity", "latency"):
        if getattr(fabric, name).shape != (L,):
            raise PlanCheckError(f"fabric.{name} needs one entry per link ({L})")
    for name in ("attach", "uplink", "downlink"):
        if getattr(fabric, name).shape != (n,):
            raise PlanCheckError(f"fabric.{name} needs one entry per server ({n})")
    if L and (min(fabric.src.min(), fabric.dst.min()) < 0
              or max(fabric.src.max(), fabric.dst.max()) >= nodes):
        raise PlanCheckError(f"a link joins a node outside 0..{nodes - 1}")
    if np.any(fabric.src == fabric.dst):
        raise PlanCheckError(f"link {int(np.flatnonzero(fabric.src == fabric.dst)[0])} "
                             "is a self-loop")
    if np.any(~np.isfinite(fabric.capacity) | (fabric.capacity <= 0)):
        raise PlanCheckError("link capacities must be finite and > 0 bits/s")
    if np.any(~np.isfinite(fabric.latency) | (fabric.latency < 0)):
        raise PlanCheckError("link latencies must be finite and >= 0 s")
    servers = np.arange(n)
    if fabric.kind == "direct":
        if not np.array_equal(fabric.attach, servers) or np.any(fabric.uplink >= 0) \
                or np.any(fabric.downlink >= 0):
            raise PlanCheckError("a direct fabric attaches each server to itself, no access links")
    else:
        up, down = fabric.uplink, fabric.downlink
        if np.any(up < 0) or np.any(down < 0) or max(up.max(), down.max()) >= L:
            raise PlanCheckError("every server of a switched fabric needs an up- and a downlink")
        if not (np.array_equal(fabric.src[up], servers)
                and np.array_equal(fabric.dst[up], fabric.attach)
                and np.array_equal(fabric.src[down], fabric.attach)
                and np.array_equal(fabric.dst[down], servers)):
            raise PlanCheckError("uplink/downlink of a server must join it to its attach switch")
        if np.any(fabric.attach < n):
            raise PlanCheckError("a switched fabric attaches servers to switches (ids >= n)")
    core = fabric._core()
    att = core.local[fabric.attach]
    # every server reaches every other iff their routing nodes share one strong component
    _, label = connected_components(core.adj, directed=True, connection="strong")
    if np.unique(label[att]).size > 1:
        raise PlanCheckError(f"fabric {fabric.name!r} is not strongly connected")
