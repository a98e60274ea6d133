"""The Fabric type: servers, switches and directed links, with ECMP or random-path routing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from topoopt._frozen import FrozenDict
from topoopt.errors import PlanCheckError, TopoOptError
from topoopt.netsim.maxmin import gather_rows, sum_by_key
from topoopt.netsim.workload import FlowRoutes, couple_routes

__all__ = ["Fabric", "check_fabric", "KINDS", "OPTICS"]

#: ``switched``: servers hang off switches by one up- and one downlink each;
#: ``direct``: servers are the routers (host-based forwarding, no switches).
KINDS = ("switched", "direct")
#: What connects a direct fabric's ports: nothing (fixed cables), patch panels, OCSes,
#: or SiP-ML's silicon-photonic wavelengths on a fibre ring.
OPTICS = ("none", "patch_panel", "ocs", "sip")

_PAIR_CHUNK = 1 << 21  # entries of a (pairs x links) work array
#: Route entries handled at a time where every pair's could be: explicit routes
#: loaded (:meth:`_CoreRouter._load_explicit`) and link loads summed
#: (:meth:`_CoreRouter.row_bytes`).
_EXPLICIT_CHUNK = 1 << 22
#: Nodes per pair a walk of shortest-path DAGs is sized for, in its chunks of pairs.
_WALK_WIDTH = 16
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
        src = np.asarray(src, np.int64).ravel()
        dst = np.asarray(dst, np.int64).ravel()
        if src.shape != dst.shape:
            raise TopoOptError("route: src and dst need the same length")
        n = self.servers
        if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
            raise TopoOptError(f"route: server ids must be in 0..{n - 1}")
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
        src = np.asarray(src, np.int64).ravel()
        dst = np.asarray(dst, np.int64).ravel()
        nbytes = np.asarray(nbytes, float).ravel()
        if not src.shape == dst.shape == nbytes.shape:
            raise TopoOptError("link_bytes: src, dst and nbytes need the same length")
        n = self.servers
        if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
            raise TopoOptError(f"link_bytes: server ids must be in 0..{n - 1}")
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


class _CoreRouter:
    """Shortest-path routing among the routing nodes (switches, or servers when direct).

    Hop distances ``D`` and shortest-path counts ``sigma`` over the core graph
    (every link between two routing nodes) are computed lazily: the rows of the
    sources (``from_``) and the columns of the targets (``to``, a BFS on the
    reversed graph) that the routed pairs need, never the all-pairs tables (a
    plan's pairs mostly have explicit routes). Routes go to a growing CSR store of
    per-pair routes. ECMP weight of link ``u -> v`` on pair ``(s, t)``:
    ``sigma[s, u] sigma[v, t] / sigma[s, t]`` when ``D[s,u] + 1 + D[v,t] = D[s,t]``
    (the share of equally weighted shortest paths that cross it).
    """

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        # Routing nodes: every switch, plus the servers that route (direct fabrics).
        nodes = np.union1d(fabric.attach, np.arange(fabric.servers, fabric.nodes))
        core_mask = np.isin(fabric.src, nodes) & np.isin(fabric.dst, nodes)
        self.local = np.full(fabric.nodes, -1, np.int64)
        self.local[nodes] = np.arange(nodes.size)
        self.global_ = nodes
        c = nodes.size
        self.c = c
        self.link_id = np.flatnonzero(core_mask)
        self.u = self.local[fabric.src[core_mask]]
        self.v = self.local[fabric.dst[core_mask]]
        # link multiplicities: a path count counts parallel links separately
        adj = csr_matrix((np.ones(self.u.size), (self.u, self.v)), shape=(c, c))
        adj.sum_duplicates()
        self.adj = adj
        self.from_ = _Layers(adj)           # rows: D[s, :], sigma[s, :]
        self.to = _Layers(adj.T.tocsr())    # columns: D[:, t], sigma[:, t]
        self.row_of = np.full((c, c), -1, np.int64)
        self.explicit_row = np.zeros(0, bool)
        # the store: blocks of rows (each block's ptr offset by the rows before it),
        # joined into one block when read, so the routes are held once
        self._rows = self._entries = 0
        self._ptr: list[np.ndarray] = [np.zeros(1, np.int64)]
        self._links: list[np.ndarray] = []
        self._weights: list[np.ndarray] = []
        self._flat: tuple | None = None
        self._matrix: tuple | None = None
        self._out: tuple | None = None
        if fabric.explicit:
            self._load_explicit(fabric)

    @property
    def nbytes(self) -> int:
        """Bytes of its tables: the route store, its matrix, the pair -> row table and
        the shortest-path layers."""
        blocks = sum(a.nbytes for part in (self._ptr, self._links, self._weights)
                     for a in part)
        matrix = (self._matrix[0].indices.nbytes + self._matrix[0].indptr.nbytes
                  if self._matrix is not None else 0)
        layers = sum(x.dist.nbytes + x.count.nbytes for x in (self.from_, self.to))
        return blocks + matrix + layers + self.row_of.nbytes + self.explicit_row.nbytes

    def _append_block(self, counts: np.ndarray, links: np.ndarray,
                      weights: np.ndarray) -> np.ndarray:
        """Add routes (rows) in one block; return their row ids."""
        first = self._rows
        self._ptr.append(self._entries + np.cumsum(counts, dtype=np.int64))
        self._rows += counts.size
        self._entries += int(counts.sum())
        self._links.append(np.asarray(links, np.int64))
        self._weights.append(np.asarray(weights, float))
        self._flat = self._matrix = None    # (neither holds the old store)
        rows = np.arange(first, first + counts.size)
        grow = rows[-1] + 1 - self.explicit_row.size if rows.size else 0
        if grow > 0:
            self.explicit_row = np.concatenate([self.explicit_row, np.zeros(grow, bool)])
        return rows

    def _load_explicit(self, fabric: Fabric) -> None:
        """Store the explicit routes: per pair, the weights of its paths summed per link."""
        if not len(fabric.explicit):
            return
        src, dst, per_pair, plen, fracs, links = _explicit_arrays(fabric.explicit)
        path_ptr = np.concatenate([[0], np.cumsum(per_pair)])
        link_ptr = np.concatenate([[0], np.cumsum(plen)])
        L = max(self.fabric.links, 1)
        # in chunks of pairs: the sort's temporaries are a few times the chunk's links,
        # not the whole table's (the blocks' rows follow on, as one block's would)
        pair_link = link_ptr[path_ptr]          # each pair's first link
        lo = 0
        while lo < src.size:
            hi = int(np.searchsorted(pair_link, pair_link[lo] + _EXPLICIT_CHUNK,
                                     side="right")) - 1
            hi = min(max(hi, lo + 1), src.size)
            p0, p1 = path_ptr[lo], path_ptr[hi]
            l0, l1 = link_ptr[p0], link_ptr[p1]
            weights = np.repeat(fracs[p0:p1], plen[p0:p1])
            pair = np.repeat(np.repeat(np.arange(hi - lo), per_pair[lo:hi]), plen[p0:p1])
            key = pair * L + links[l0:l1]
            order = np.argsort(key, kind="stable")
            key = key[order]
            new = (np.concatenate([[True], key[1:] != key[:-1]]) if key.size
                   else key.astype(bool))
            grp = np.cumsum(new) - 1
            ukey = key[new]
            w = np.bincount(grp, weights=weights[order]) if key.size else np.empty(0)
            counts = np.bincount(ukey // L, minlength=hi - lo)
            rows = self._append_block(counts, ukey % L, w)
            self.row_of[self.local[fabric.attach[src[lo:hi]]],
                        self.local[fabric.attach[dst[lo:hi]]]] = rows
            self.explicit_row[rows] = True
            lo = hi

    def pair_rows(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Store rows of routing-node pairs (global ids), computing missing ones."""
        la, lb = self.local[a], self.local[b]
        rows = self.row_of[la, lb]
        miss = rows < 0
        if miss.any():
            key = np.unique(la[miss] * self.c + lb[miss])
            self._compute(key // self.c, key % self.c)
            rows = self.row_of[la, lb]
        return rows

    def _unreachable(self, s: np.ndarray, t: np.ndarray, hops: np.ndarray) -> None:
        """Raise unless every ``hops[i]`` (the distance ``s[i] -> t[i]``) is finite."""
        bad = ~np.isfinite(hops)
        if bad.any():
            f = self.fabric
            a, b = self.global_[s[bad][0]], self.global_[t[bad][0]]
            sa = np.flatnonzero(f.attach == a)[0]
            sb = np.flatnonzero(f.attach == b)[0]
            raise TopoOptError(f"fabric {f.name!r}: no path from server {sa} to server {sb}; "
                               "the topology is not strongly connected")

    def _compute(self, s: np.ndarray, t: np.ndarray) -> None:
        # the rows of the sources and the columns of the targets asked, nothing more
        rs, ct = self.from_.slots(s), self.to.slots(t)
        self._unreachable(s, t, self.to.dist[ct, s])
        same = s == t
        if same.any():
            self.row_of[s[same], t[same]] = self._append_block(
                np.zeros(int(same.sum()), np.int64), np.empty(0, np.int64), np.empty(0))
        s, t, rs, ct = s[~same], t[~same], rs[~same], ct[~same]
        # a direct fabric's shortest-path DAGs are thin (degree-d servers, a few per
        # hop): walk them; a Clos's spans most core links between two pods, where one
        # test per link of the core is cheaper
        walk = self.fabric.kind == "direct"
        step = max(1, _PAIR_CHUNK // max(self._out_table()[0].shape[1] * _WALK_WIDTH
                                         if walk else self.u.size, 1))
        Df, sf, Dt, st = self.from_.dist, self.from_.count, self.to.dist, self.to.count
        for lo in range(0, s.size, step):
            ps, pt = s[lo:lo + step], t[lo:lo + step]
            pr, pc = rs[lo:lo + step], ct[lo:lo + step]
            if walk:
                r, e = self._shortest_links(ps, pt, pc)
            else:       # D[s, u] + 1 + D[v, t] == D[s, t]
                r, e = np.nonzero(
                    (Df[pr][:, self.u] + 1 + Dt[pc][:, self.v]) == Df[pr, pt][:, None])
            w = sf[pr[r], self.u[e]] * st[pc[r], self.v[e]] / sf[pr[r], pt[r]]
            counts = np.bincount(r, minlength=ps.size)
            self.row_of[ps, pt] = self._append_block(counts, self.link_id[e], w)

    def _nearer(self, node: np.ndarray, col: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(cand, head, ok)``: each ``node[i]``'s out-links (core-link ids, a padded
        ``(len(node), width)`` table), their heads, and whether a link is real and its
        head one hop nearer the target whose column of the distances is ``col[i]``
        (``D[x, t] = to.dist[col, x]``)."""
        table, _ = self._out_table()
        Dt = self.to.dist
        cand = table[node]
        ok = cand >= 0
        head = np.where(ok, self.v[np.maximum(cand, 0)], 0)
        ok &= Dt[col[:, None], head] == (Dt[col, node] - 1)[:, None]
        return cand, head, ok

    def _shortest_links(self, s: np.ndarray, t: np.ndarray, ct: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
        """``(r, e)``: every core link ``e`` on a shortest ``s[r] -> t[r]`` path (those
        with ``D[s, u] + 1 + D[v, t] == D[s, t]``), sorted by pair, then link.

        Found by walking each pair's shortest-path DAG from its source, one hop at a
        time: from a node ``x`` on it, the out-links to a node one hop nearer ``t``.
        That visits the DAG's links (a few per hop), where testing every link of the
        core for every pair costs the whole core per pair."""
        c = self.c
        pair, node = np.arange(s.size), s
        found_r, found_e = [], []
        while pair.size:
            cand, _, ok = self._nearer(node, ct[pair])
            fr, fc = np.nonzero(ok)
            r, e = pair[fr], cand[fr, fc]
            found_r.append(r)
            found_e.append(e)
            nxt = self.v[e]
            on = nxt != t[r]
            key = np.unique(r[on] * c + nxt[on])   # each DAG node of a pair once
            pair, node = key // c, key % c
        r = np.concatenate(found_r) if found_r else np.empty(0, np.int64)
        e = np.concatenate(found_e) if found_e else np.empty(0, np.int64)
        order = np.lexsort((e, r))
        return r[order], e[order]

    def _store(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._flat is None:
            def join(blocks: list[np.ndarray], dtype: type) -> np.ndarray:
                whole = (np.empty(0, dtype) if not blocks else
                         np.asarray(blocks[0] if len(blocks) == 1 else np.concatenate(blocks),
                                    dtype))
                blocks[:] = [whole]     # the blocks go: one copy of the routes
                return whole
            self._flat = (join(self._ptr, np.int64), join(self._links, np.int64),
                          join(self._weights, float))
        return self._flat

    def matrix(self) -> tuple[csr_matrix, np.ndarray]:
        """The route store as a sparse (rows x links) matrix of weights, and each row's
        latency (weight x link latency summed); rebuilt when the store has grown."""
        if self._matrix is None:
            ptr, links, weights = self._store()
            owner = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
            lat = np.bincount(owner, weights=self.fabric.latency[links] * weights,
                              minlength=ptr.size - 1)
            mat = csr_matrix((weights, links, ptr), shape=(ptr.size - 1, self.fabric.links))
            self._matrix = (mat, lat)
        return self._matrix

    def row_bytes(self, rows: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Per link, the sum of ``nbytes[i]`` x the weight of the link on store row
        ``rows[i]``: gathered :data:`_EXPLICIT_CHUNK` entries at a time, so the work
        arrays stay a few times that, whatever the rows."""
        ptr, links, weights = self._store()
        load = np.zeros(self.fabric.links)
        counts = ptr[rows + 1] - ptr[rows]
        ends = np.cumsum(counts)
        lo = 0
        while lo < rows.size:
            hi = int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + _EXPLICIT_CHUNK,
                                     side="right"))
            hi = min(max(hi, lo + 1), rows.size)
            idx, c = gather_rows(ptr, rows[lo:hi])
            part = np.bincount(links[idx], weights=np.repeat(nbytes[lo:hi], c) * weights[idx],
                               minlength=load.size)
            load += part     # (onto 0.0 for the first: the same sums)
            lo = hi
        return load

    def rows(self, rows: np.ndarray) -> FlowRoutes:
        ptr, links, weights = self._store()
        idx, counts = gather_rows(ptr, rows)
        return FlowRoutes(np.concatenate([[0], np.cumsum(counts)]), links[idx], weights[idx])

    def _out_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Padded out-link table of the core graph: (c, max out-degree), -1 = none."""
        if self._out is None:
            order = np.argsort(self.u, kind="stable")
            deg = np.bincount(self.u, minlength=self.c)
            width = max(int(deg.max()) if deg.size else 0, 1)
            table = np.full((self.c, width), -1, np.int64)
            start = np.concatenate([[0], np.cumsum(deg)])[:-1]
            col = np.arange(order.size) - np.repeat(start, deg)
            table[self.u[order], col] = order
            self._out = (table, deg)
        return self._out

    def random_paths(self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator
                     ) -> FlowRoutes:
        """One shortest path per flow, uniform over the shortest paths of its pair."""
        s, t = self.local[a], self.local[b]
        ct = self.to.slots(t)
        Dt, st = self.to.dist, self.to.count   # D[x, t[i]] = Dt[ct[i], x]
        self._unreachable(s, t, Dt[ct, s])
        hops = Dt[ct, s].astype(np.int64)
        cur = s.copy()
        steps = int(hops.max()) if hops.size else 0
        chosen = np.full((s.size, max(steps, 1)), -1, np.int64)
        for k in range(steps):
            live = k < hops
            cl = ct[live]
            cand, head, ok = self._nearer(cur[live], cl)
            wgt = np.where(ok, st[cl[:, None], head], 0.0)
            cum = np.cumsum(wgt, axis=1)
            pick = (cum < rng.random(int(cum.shape[0]))[:, None] * cum[:, -1:]).sum(axis=1)
            e = cand[np.arange(cand.shape[0]), pick]
            chosen[live, k] = e
            cur[live] = self.v[e]
        counts = hops
        ptr = np.concatenate([[0], np.cumsum(counts)])
        keep = np.arange(chosen.shape[1])[None, :] < counts[:, None]
        links = self.link_id[chosen[keep]] if steps else np.empty(0, np.int64)
        return FlowRoutes(ptr, links, np.ones(links.size))

    def enumerate(self, a: int, b: int) -> list[tuple[tuple[int, ...], float]]:
        """Every path of a pair with its weight (explicit, or all shortest, equal)."""
        s, t = int(self.local[a]), int(self.local[b])
        row = self.row_of[s, t]
        if row >= 0 and self.explicit_row[row]:
            f = self.fabric
            at = self.local[f.attach]
            for x in np.flatnonzero(at == s).tolist():
                for y in np.flatnonzero(at == t).tolist():
                    if (x, y) in f.explicit:
                        return [(tuple(int(v) for v in p), float(w))
                                for p, w in f.explicit[x, y]]
        if s == t:
            return [((), 1.0)]
        slot = self.to.slots(np.array([t]))[0]   # before reading dist: it may grow
        col = self.to.dist[slot]                  # D[:, t]
        self._unreachable(np.array([s]), np.array([t]), col[[s]])
        table, deg = self._out_table()
        out: list[tuple[int, ...]] = []

        def walk(node: int, acc: list[int]) -> None:
            if node == t:
                out.append(tuple(int(self.link_id[e]) for e in acc))
                return
            for e in table[node, :deg[node]]:
                if col[self.v[e]] == col[node] - 1:
                    walk(int(self.v[e]), acc + [int(e)])

        walk(s, [])
        return [(p, 1.0 / len(out)) for p in out]


def _explicit_arrays(explicit: Mapping) -> tuple[np.ndarray, ...]:
    """``(src, dst, paths per pair, hops per path, fraction per path, links)`` of a
    fabric's explicit routes, in their order (an array-backed mapping gives them
    without building its tuples)."""
    arrays = getattr(explicit, "link_arrays", None)
    if arrays is not None:
        return arrays()
    items = list(explicit.items())
    paths = [p for _, options in items for p, _ in options]
    fracs = np.array([f for _, options in items for _, f in options], float)
    plen = np.fromiter((len(p) for p in paths), np.int64, len(paths))
    per_pair = np.fromiter((len(options) for _, options in items), np.int64, len(items))
    links = np.concatenate(paths).astype(np.int64) if paths else np.empty(0, np.int64)
    src = np.fromiter((s for (s, _), _ in items), np.int64, len(items))
    dst = np.fromiter((t for (_, t), _ in items), np.int64, len(items))
    return src, dst, per_pair, plen, fracs, links


class _Layers:
    """Hop distances and shortest-path counts from some roots, computed on demand.

    A breadth-first search from each root asked (in chunks of roots, layer by
    layer: the counts of a layer are the previous layer's counts pushed along
    ``adj``, whose entries are link multiplicities), cached per root. Over the
    transposed graph a root's row is a column of the original tables.
    """

    def __init__(self, adj: csr_matrix) -> None:
        self.adj_t = adj.T.tocsr()  # (to, from): one product pushes a frontier one hop
        self.c = adj.shape[0]
        self.slot = np.full(self.c, -1, np.int64)
        self.size = 0
        self.dist = np.empty((0, self.c))
        self.count = np.empty((0, self.c))

    def slots(self, roots: np.ndarray) -> np.ndarray:
        """Rows of ``dist``/``count`` holding ``roots``' tables, computing missing ones."""
        roots = np.asarray(roots, np.int64)
        new = np.unique(roots[self.slot[roots] < 0])
        if new.size:
            if self.size + new.size > self.dist.shape[0]:
                cap = min(self.c, max(2 * self.dist.shape[0], self.size + new.size))
                for name in ("dist", "count"):
                    grown = np.empty((cap, self.c))
                    grown[:self.size] = getattr(self, name)[:self.size]
                    setattr(self, name, grown)
            step = max(1, _PAIR_CHUNK // max(self.c, 1))
            for lo in range(0, new.size, step):
                part = new[lo:lo + step]
                at = slice(self.size, self.size + part.size)
                self.dist[at], self.count[at] = self._search(part)
                self.slot[part] = np.arange(at.start, at.stop)
                self.size += part.size
        return self.slot[roots]

    def _search(self, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m, c = roots.size, self.c
        dist = np.full((m, c), np.inf)
        count = np.zeros((m, c))
        idx = np.arange(m)
        dist[idx, roots] = 0.0
        count[idx, roots] = 1.0
        frontier = count.copy()
        k = 0
        while True:
            k += 1
            pushed = (self.adj_t @ frontier.T).T      # sum over in-links of the layer's counts
            reached = (pushed > 0) & np.isinf(dist)
            if not reached.any():
                return dist, count
            dist[reached] = k
            frontier = np.where(reached, pushed, 0.0)
            count[reached] = pushed[reached]


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
