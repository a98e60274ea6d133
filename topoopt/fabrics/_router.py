"""The routing tables of a :class:`~topoopt.fabrics.fabric.Fabric`: shortest paths among
its routing nodes (ECMP weights or random draws) and its explicit routes, in one growing
store of per-pair routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Protocol

import numpy as np
from scipy.sparse import csr_matrix

from topoopt.errors import TopoOptError
from topoopt.netsim.engine import RoutedNetwork
from topoopt.netsim.maxmin import gather_rows, row_runs
from topoopt.netsim.workload import FlowRoutes

__all__: list[str] = []


class Routed(RoutedNetwork, Protocol):
    """What the router reads of its :class:`~topoopt.fabrics.fabric.Fabric` (which
    imports this module, so it is not imported here): a routed network, and where
    its servers attach and which routes are given."""

    @property
    def kind(self) -> str: ...
    @property
    def attach(self) -> np.ndarray: ...
    @property
    def explicit(self) -> Mapping[Any, Any]: ...
    @property
    def links(self) -> int: ...


@dataclass(frozen=True, eq=False)
class _Wiring:
    """What the router reads of its fabric, without the fabric: the fabric keeps its
    router (in its cache), and a router that kept the fabric would make a reference
    cycle, which only Python's cyclic collector frees -- seldom, in a process that makes
    few objects, so a dropped 1024-server topology's routes and tables (gigabytes)
    would stay held long after the last use."""

    name: str
    kind: str
    servers: int
    nodes: int
    links: int
    src: np.ndarray
    dst: np.ndarray
    attach: np.ndarray
    latency: np.ndarray
    explicit: Mapping[Any, Any]

    @classmethod
    def of(cls, fabric: Routed) -> "_Wiring":
        return cls(fabric.name, fabric.kind, fabric.servers, fabric.nodes, fabric.links,
                   fabric.src, fabric.dst, fabric.attach, fabric.latency, fabric.explicit)


_PAIR_CHUNK = 1 << 21  # entries of a (pairs x links) work array
#: A BFS layer holding under 1 / _THIN_LAYER of the (roots x nodes) table is pushed as
#: sparse entries, a wider one as a dense product (docs/tuning.md, "Thin BFS layers").
_THIN_LAYER = 16
#: Route entries handled at a time where every pair's could be: explicit routes
#: loaded (:meth:`_CoreRouter._load_explicit`) and link loads summed
#: (:meth:`_CoreRouter.row_bytes`).
_EXPLICIT_CHUNK = 1 << 22
#: Nodes per pair a walk of shortest-path DAGs is sized for, in its chunks of pairs.
_WALK_WIDTH = 16


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

    def __init__(self, fabric: Routed) -> None:
        self.fabric = _Wiring.of(fabric)
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
        # link ids in 4 bytes where they fit: the store's largest part, and the matrix's
        # int32 indices are then the store's own (scipy copies int64 ones that fit)
        self._link_dtype = np.int32 if fabric.links <= np.iinfo(np.int32).max else np.int64
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
        matrix = 0
        if self._matrix is not None:    # its data, and its indices where int32, the store's
            mat = self._matrix[0]
            matrix = mat.indptr.nbytes + sum(
                a.nbytes for a in (mat.indices, mat.data)
                if not any(np.may_share_memory(a, b) for b in (*self._links, *self._weights)))
        layers = sum(x.dist.nbytes + x.count.nbytes for x in (self.from_, self.to))
        return blocks + matrix + layers + self.row_of.nbytes + self.explicit_row.nbytes

    def _append_block(self, counts: np.ndarray, links: np.ndarray,
                      weights: np.ndarray) -> np.ndarray:
        """Add routes (rows) in one block; return their row ids."""
        first = self._rows
        self._ptr.append(self._entries + np.cumsum(counts, dtype=np.int64))
        self._rows += counts.size
        self._entries += int(counts.sum())
        self._links.append(np.asarray(links, self._link_dtype))
        self._weights.append(np.asarray(weights, float))
        self._flat = self._matrix = None    # (neither holds the old store)
        rows = np.arange(first, first + counts.size)
        grow = rows[-1] + 1 - self.explicit_row.size if rows.size else 0
        if grow > 0:
            self.explicit_row = np.concatenate([self.explicit_row, np.zeros(grow, bool)])
        return rows

    def _load_explicit(self, fabric: Routed) -> None:
        """Store the explicit routes: per pair, the weights of its paths summed per link."""
        if not len(fabric.explicit):
            return
        for part in _explicit_chunks(fabric.explicit, _EXPLICIT_CHUNK):
            self._load_explicit_block(fabric, *part)

    def _load_explicit_block(self, fabric: Routed, src: np.ndarray, dst: np.ndarray,
                             per_pair: np.ndarray, plen: np.ndarray, fracs: np.ndarray,
                             links: np.ndarray) -> None:
        """:meth:`_load_explicit` of some pairs (:func:`_explicit_arrays`' arrays)."""
        path_ptr = np.concatenate([[0], np.cumsum(per_pair)])
        link_ptr = np.concatenate([[0], np.cumsum(plen)])
        L = max(self.fabric.links, 1)
        # in chunks of pairs: the sort's temporaries are a few times the chunk's links,
        # not the whole table's (the blocks' rows follow on, as one block's would)
        pair_link = link_ptr[path_ptr]          # each pair's first link
        for lo, hi in row_runs(pair_link, _EXPLICIT_CHUNK):
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
                whole: np.ndarray = (np.empty(0, dtype) if not blocks else
                                     np.asarray(blocks[0] if len(blocks) == 1
                                                else np.concatenate(blocks), dtype))
                blocks[:] = [whole]     # the blocks go: one copy of the routes
                return whole
            self._flat = (join(self._ptr, np.int64), join(self._links, self._link_dtype),
                          join(self._weights, float))
        return self._flat

    def matrix(self) -> tuple[csr_matrix, np.ndarray]:
        """The route store as a sparse (rows x links) matrix of weights, and each row's
        latency (weight x link latency summed); rebuilt when the store has grown."""
        if self._matrix is None:
            ptr, links, weights = self._store()
            rows = ptr.size - 1
            lat = np.zeros(rows)
            # a run of rows of about _EXPLICIT_CHUNK entries at a time: each row's sum is
            # over its own entries in order either way, and the work arrays stay small
            for lo, hi in row_runs(ptr, _EXPLICIT_CHUNK):
                a, b = ptr[lo], ptr[hi]
                owner = np.repeat(np.arange(hi - lo), np.diff(ptr[lo:hi + 1]))
                lat[lo:hi] = np.bincount(owner, weights=self.fabric.latency[links[a:b]]
                                         * weights[a:b], minlength=hi - lo)
            mat = csr_matrix((weights, links, ptr), shape=(rows, self.fabric.links))
            self._matrix = (mat, lat)
        return self._matrix

    def row_bytes(self, rows: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Per link, the sum of ``nbytes[i]`` x the weight of the link on store row
        ``rows[i]``: gathered :data:`_EXPLICIT_CHUNK` entries at a time, so the work
        arrays stay a few times that, whatever the rows."""
        ptr, links, weights = self._store()
        load = np.zeros(self.fabric.links)
        gathered = np.concatenate([[0], np.cumsum(ptr[rows + 1] - ptr[rows])])
        for lo, hi in row_runs(gathered, _EXPLICIT_CHUNK):
            idx, c = gather_rows(ptr, rows[lo:hi])
            part = np.bincount(links[idx], weights=np.repeat(nbytes[lo:hi], c) * weights[idx],
                               minlength=load.size)
            load += part     # (onto 0.0 for the first: the same sums)
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


def _explicit_chunks(explicit: Mapping, hops: int) -> Iterator[tuple[np.ndarray, ...]]:
    """:func:`_explicit_arrays` in runs of pairs of about ``hops`` hops (an array-backed
    mapping: without its whole table of hop links at once; another: in one run)."""
    chunks = getattr(explicit, "link_chunks", None)
    if chunks is not None:
        yield from chunks(hops)
    else:
        yield _explicit_arrays(explicit)


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
        self.adj = csr_matrix(adj, copy=True)  # (from, to): pushes a thin one's entries
        self.adj.sort_indices()
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
        # A layer is pushed as entries while it is thin (on a long graph, a ring or a
        # pipeline's chain, most of the BFS's 10-100 layers) and as one dense product
        # once it is wide. Either way a node's count sums its in-neighbours' counts in
        # ascending order (sorted CSR indices), so the tables are the same to the bit.
        m, c = roots.size, self.c
        dist = np.full((m, c), np.inf)
        count = np.zeros((m, c))
        rows, cols, vals = np.arange(m), roots, np.ones(m)
        dist[rows, cols] = 0.0
        count[rows, cols] = 1.0
        frontier: np.ndarray | None = None     # dense, once a layer is wide
        k = 0
        while True:
            k += 1
            if frontier is None:
                layer = csr_matrix((vals, (rows, cols)), shape=(m, c))
                layer.sort_indices()
                pushed = (layer @ self.adj).tocoo()
                new = np.isinf(dist[pushed.row, pushed.col]) & (pushed.data > 0)
                rows, cols, vals = pushed.row[new], pushed.col[new], pushed.data[new]
                if not rows.size:
                    return dist, count
                dist[rows, cols] = k
                count[rows, cols] = vals
                if rows.size * _THIN_LAYER >= m * c:
                    frontier = np.zeros((m, c))
                    frontier[rows, cols] = vals
            else:
                wide = (self.adj_t @ frontier.T).T      # sum over in-links of the counts
                reached = (wide > 0) & np.isinf(dist)
                if not reached.any():
                    return dist, count
                dist[reached] = k
                frontier = np.where(reached, wide, 0.0)
                count[reached] = wide[reached]
                if np.count_nonzero(reached) * _THIN_LAYER < m * c:
                    rows, cols = np.nonzero(reached)
                    vals = wide[rows, cols]
                    frontier = None
