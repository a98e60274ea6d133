"""Lower bounds on a strategy's iteration time, before its graph is built.

The search rejects a candidate whose bound passes its acceptance threshold without
building or simulating its graph. :class:`GraphBounds` computes three, each below
the time the simulation would give on the same graph: the busiest server's compute
and bytes (:meth:`GraphBounds.server_bound`), the busiest link's bits
(:meth:`GraphBounds.link_bound`), and the longest chain of tasks and transfers
(:meth:`GraphBounds.critical_path_bound`). They read the builder's caches (fusion,
configs, AllReduce templates, route classes) and keep their own, keyed by the
configs' tokens (:class:`~topoopt.estimate.templates.ConfigTable`).
"""

from __future__ import annotations

import weakref
from typing import Iterable, NamedTuple, Protocol

import numpy as np

from topoopt.estimate.routes import RouteCache, alone_rate, row_latency
from topoopt.estimate.segments import EstimateCache
from topoopt.estimate.templates import (
    AllReduceTemplate,
    ConfigInfo,
    ConfigTable,
    Fused,
    PairTemplate,
)
from topoopt.fabrics.fabric import Fabric
from topoopt.model import Model
from topoopt.netsim.maxmin import gather_rows
from topoopt.strategy import OpConfig, Strategy

__all__ = ["GraphBounds", "BuilderCaches"]

#: Pairs routed at a time for the pairs' alone rates (:meth:`GraphBounds._pair_rate`).
_RATE_PAIRS = 1 << 18


class _PatternLoads:
    """Per unit of scale, the bytes each server sends (forward and gradients) and,
    once asked for, each link carries, for one transfer pattern."""

    __slots__ = ("server", "link")

    def __init__(self, server: np.ndarray) -> None:
        self.server = server
        self.link: np.ndarray | None = None


class _StrategyLoads(NamedTuple):
    """The MP loads of the last strategy asked for (its bounds share them): per pair
    of config tokens, the scale of its pattern (the edges' activations over the
    producer's ``mp``, summed) and the two configs; the bytes each server sends and
    each link carries (once asked for)."""

    configs: tuple[OpConfig, ...]
    scales: dict[tuple[int, int], float]
    pairs: dict[tuple[int, int], tuple[OpConfig, OpConfig]]
    server: np.ndarray
    link: np.ndarray | None


class BuilderCaches(Protocol):
    """What the bounds read of their builder
    (:class:`~topoopt.estimate.builder.IterationGraphBuilder`)."""

    model: Model
    fabric: Fabric
    cache: EstimateCache
    configs: ConfigTable
    routes: RouteCache
    n: int
    dtype_bytes: int
    overlap: bool
    random_paths: bool
    config_limit: int

    def fused(self, strategy: Strategy) -> Fused: ...

    def pair(self, iu: ConfigInfo, iv: ConfigInfo) -> PairTemplate: ...

    def allreduce(self, cfg: OpConfig) -> AllReduceTemplate: ...


class GraphBounds:
    """The lower bounds of one :class:`~topoopt.estimate.builder.IterationGraphBuilder`
    (its methods ``lower_bound``, ``link_bound`` and ``critical_path_bound``)."""

    #: Bytes of pattern loads, and of the critical path's pool, kept before each is
    #: dropped (per pattern a vector per server and one per link: a count of patterns
    #: alone let them reach gigabytes at 1024 servers).
    held_bytes = 1 << 26

    def __init__(self, builder: BuilderCaches) -> None:
        # a proxy: the builder keeps its bounds, and a cycle between them would hold a
        # dropped builder's fabric and route classes until Python's cyclic collector ran
        self.builder = weakref.proxy(builder)
        fabric, n = builder.fabric, builder.n
        src, dst, cap = fabric.src, fabric.dst, fabric.capacity
        self.out_bps = np.bincount(src[src < n], weights=cap[src < n], minlength=n)
        self.in_bps = np.bincount(dst[dst < n], weights=cap[dst < n], minlength=n)
        self._last_loads: _StrategyLoads | None = None
        self._patterns: dict[tuple[int, int], _PatternLoads] = {}
        self._pattern_held = 0      # bytes of ``_patterns``
        self._ar_load: dict[int, np.ndarray] = {}     # token -> link bytes per shard byte
        self._rate: tuple[np.ndarray, np.ndarray] | None = None
        self._cp: dict[tuple[int, int], int] = {}      # token pair -> pool offset
        self._ar_cp: dict[int, tuple[int, int]] = {}   # token -> (pool offset, rings)
        self._cp_pool = np.empty(1024)   # pattern and ring vectors of the critical path
        self._cp_used = 0

    def reset_routes(self) -> None:
        """Drop what depends on the builder's route classes (and the pool)."""
        self._ar_load.clear()
        self._cp.clear()
        self._ar_cp.clear()
        self._cp_used = 0

    def reset_configs(self) -> None:
        """Drop what is keyed by config tokens (they are numbered afresh)."""
        self.reset_routes()
        self._patterns.clear()
        self._pattern_held = 0
        self._last_loads = None

    # -- the busiest server -----------------------------------------------------------
    def server_bound(self, strategy: Strategy) -> float:
        """The busiest server's compute (its tasks run one at a time), or the bytes a
        server must send or receive -- its MP transfers and its share of every ring
        AllReduce, ``2(k-1)/k`` of its shard -- over the capacity of its links (host
        forwarding only adds bytes), whichever is longer."""
        b = self.builder
        n = b.n
        fused = b.fused(strategy)
        segs = fused.segments
        srvs = [x.servers for x in fused.info]
        where = np.concatenate(srvs) if segs else np.empty(0, np.int64)
        count = np.fromiter((s.size for s in srvs), np.int64, len(srvs))
        # per server, its segments' terms summed in segment order (bincount adds in input
        # order, as a loop of ``x[servers] += term`` would)
        compute = np.bincount(where, np.repeat(
            [seg.fwd + seg.bwd + seg.update for seg in segs], count), n)
        nbytes = np.bincount(where, np.repeat(
            [2.0 * (c.dp - 1) / c.dp * seg.params / c.mp * b.dtype_bytes
             if seg.params > 0 and c.dp >= 2 else 0.0
             for seg, c in ((seg, seg.config) for seg in segs)], count), n)
        # MP: forward to the consumer, and the gradient back
        sent = recv = nbytes + self._mp_loads(strategy).server
        with np.errstate(divide="ignore", invalid="ignore"):
            wire = np.maximum(np.where(self.out_bps > 0, sent * 8 / self.out_bps, 0.0),
                              np.where(self.in_bps > 0, recv * 8 / self.in_bps, 0.0))
        # (1 - 1e-12): the simulator sums in another order; a bound must not pass it
        return float(max(compute.max(initial=0.0), wire.max(initial=0.0))) * (1.0 - 1e-12)

    def _mp_loads(self, strategy: Strategy, links: bool = False) -> _StrategyLoads:
        """The bytes each server sends and (with ``links``) each link carries in
        ``strategy``'s MP transfers, both passes: per (producer config, consumer
        config) pattern (:meth:`~topoopt.estimate.segments.EstimateCache.pattern`), its
        loads per unit scaled by its edges' activations; the last strategy's kept."""
        b = self.builder
        last = self._last_loads
        if last is None or last.configs != strategy.configs:
            segs, seg_of, info = b.fused(strategy)
            token = [x.token for x in info]
            scales: dict[tuple[int, int], float] = {}
            pairs: dict[tuple[int, int], tuple[OpConfig, OpConfig]] = {}
            for u, v in b.model.edges:
                gu, gv = int(seg_of[u]), int(seg_of[v])
                tensor = b.cache.activation[u]
                if gu < 0 or gu == gv or tensor <= 0:
                    continue
                k = (token[gu], token[gv])
                # the edge's bytes: the pattern's overlaps x (tensor / mp)
                x = tensor / segs[gu].config.mp
                hit = scales.get(k)
                if hit is None:
                    scales[k] = x
                    pairs[k] = (segs[gu].config, segs[gv].config)
                else:
                    scales[k] = x + hit
            server = np.zeros(b.n)
            for k, x in scales.items():
                server += x * self._pattern_loads(k, *pairs[k], False).server
            last = _StrategyLoads(strategy.configs, scales, pairs, server, None)
        if links and last.link is None:
            link = np.zeros(b.fabric.capacity.size)
            for k, x in last.scales.items():
                loads = self._pattern_loads(k, *last.pairs[k], True)
                assert loads.link is not None
                link += x * loads.link
            last = last._replace(link=link)
        self._last_loads = last
        return last

    def _pattern_loads(self, key: tuple[int, int], cu: OpConfig, cv: OpConfig,
                       links: bool) -> _PatternLoads:
        """Per unit of scale, the loads of the transfer pattern of (cu, cv), whose
        tokens are ``key``."""
        b = self.builder
        hit = self._patterns.get(key)
        if hit is None:
            if len(self._patterns) >= b.config_limit or self._pattern_held > self.held_bytes:
                self._patterns.clear()
                self._pattern_held = 0
            src, dst, overlap = b.cache.pattern(cu, cv)
            n = b.n
            hit = self._patterns[key] = _PatternLoads(np.bincount(src, overlap, n)
                                                      + np.bincount(dst, overlap, n))
            self._pattern_held += hit.server.nbytes
        if links and hit.link is None:
            src, dst, overlap = b.cache.pattern(cu, cv)   # (memoized)
            hit.link = self._pattern_link_loads(src, dst, overlap)
            self._pattern_held += hit.link.nbytes
        return hit

    def _pattern_link_loads(self, src: np.ndarray, dst: np.ndarray,
                            overlap: np.ndarray) -> np.ndarray:
        """Each link's bytes of a pattern (``overlap`` between ``src`` and ``dst``, both
        ways) on its pairs' routes (:meth:`~topoopt.fabrics.Fabric.link_bytes`), each
        pair's bytes summed first and the pairs taken in ascending order: the loads do
        not depend on the order in which the fabric routed its pairs."""
        n = self.builder.n
        keys = np.concatenate([src * n + dst, dst * n + src])
        pairs, inverse = np.unique(keys, return_inverse=True)
        nbytes = np.bincount(inverse, weights=np.concatenate([overlap, overlap]),
                             minlength=pairs.size)
        return self.builder.fabric.link_bytes(pairs // n, pairs % n, nbytes)

    # -- the busiest link -------------------------------------------------------------
    def link_bound(self, strategy: Strategy) -> float:
        """The busiest link's bits over its capacity, :func:`~topoopt.netsim.dag.
        link_load_bound` of the graph (the same MP transfers on their pairs' routes,
        the same rings) computed from a traffic matrix instead."""
        b = self.builder
        if b.random_paths:
            raise ValueError("link_bound needs the fabric's routes (random_paths=False)")
        segs = b.fused(strategy).segments
        cap = b.fabric.capacity
        link = self._mp_loads(strategy, links=True).link
        assert link is not None
        load = link.copy()
        for seg in segs:
            cfg = seg.config
            if seg.params > 0 and cfg.dp >= 2:
                load += self._ar_link_bytes(cfg) * (seg.params / cfg.mp * b.dtype_bytes)
        live = cap > 0
        if not live.any():
            return 0.0
        return float((8.0 * load[live] / cap[live]).max())

    def _ar_link_bytes(self, cfg: OpConfig) -> np.ndarray:
        """Bytes the AllReduce of ``cfg``'s shards puts on each link, per shard byte
        (its rings' per-hop bytes over their routes, as the graph sends them)."""
        b = self.builder
        token = b.configs.info(cfg).token
        hit = self._ar_load.get(token)
        if hit is not None:
            return hit
        plan = b.allreduce(cfg)
        routes = b.routes.store.view()
        idx, counts = gather_rows(routes.ptr, plan.ring_class)
        per_hop = np.repeat(plan.ring_factor / plan.ring_count, counts)
        load = np.bincount(routes.link[idx], weights=per_hop * routes.weight[idx],
                           minlength=b.fabric.capacity.size)
        self._ar_load[token] = load
        return load

    # -- the longest chain ------------------------------------------------------------
    def critical_path_bound(self, strategy: Strategy) -> float:
        """The longest chain of dependencies, each task for its duration and each
        transfer at the rate its route gives it alone (see
        :meth:`~topoopt.estimate.builder.IterationGraphBuilder.critical_path_bound`)."""
        b = self.builder
        if b.random_paths:
            raise ValueError("critical_path_bound needs the fabric's routes "
                             "(random_paths=False)")
        if (len(self._cp) + len(self._ar_cp) > b.config_limit
                or self._cp_pool.nbytes > self.held_bytes):
            self._cp.clear()
            self._ar_cp.clear()
            self._cp_used = 0
            self._cp_pool = np.empty(1024)
        segs, seg_of, info = b.fused(strategy)
        nseg = len(segs)
        activation = b.cache.activation
        # (producer segment, consumer segment) -> scale: the edges between two segments
        # are one flow per pair, their bytes added
        scale: dict[tuple[int, int], float] = {}
        for u, v in b.model.edges:
            gu, gv = int(seg_of[u]), int(seg_of[v])
            if gu < 0 or gu == gv:
                continue
            x = max(activation[u], 0.0) / segs[gu].config.mp
            scale[(gu, gv)] = scale.get((gu, gv), 0.0) + x
        pairs = list(scale)
        pat = [self._cp_pattern(info[gu], info[gv]) for gu, gv in pairs]
        ar_off = np.full(nseg, -1, np.int64)
        ar_rings = np.zeros(nseg, np.int64)
        for g, seg in enumerate(segs):
            if seg.params > 0 and seg.config.dp >= 2:
                ar_off[g], ar_rings[g] = self._cp_allreduce(seg.config)

        def i64(values: Iterable[int]) -> np.ndarray:
            return np.fromiter(values, np.int64, nseg)

        configs = [seg.config for seg in segs]
        link = np.array(pairs, np.int64).reshape(-1, 2)
        # numba is loaded on the first bound only (import topoopt stays light)
        from topoopt.estimate._cp_kernel import critical_path
        total = critical_path(
            i64(len(c.servers) for c in configs), np.array([x.fwd for x in segs]),
            np.array([x.bwd for x in segs]), np.array([x.update for x in segs]),
            i64(c.mp for c in configs), i64(c.dp for c in configs),
            np.concatenate([x.servers for x in info]), self.in_bps,
            np.ascontiguousarray(link[:, 0]), np.ascontiguousarray(link[:, 1]),
            np.fromiter(scale.values(), float, len(pairs)), np.asarray(pat, np.int64),
            self._cp_pool, ar_off, ar_rings,
            np.array([x.params / x.config.mp * b.dtype_bytes for x in segs]), b.overlap)
        # (1 - 1e-9): the simulation adds in another order; a bound must not pass it
        return float(total) * (1.0 - 1e-9)

    def _pair_rate(self) -> tuple[np.ndarray, np.ndarray]:
        """``(rate, latency)``, each ``(n, n)``: the most bits/s a flow from server ``s``
        to ``d`` can get on its route, ``min(capacity / weight)`` over its links
        (``inf`` on the diagonal, and where a link of the route is down: the
        simulation reports such a flow), and the route's latency."""
        if self._rate is None:
            fabric, n = self.builder.fabric, self.builder.n
            rate = np.full((n, n), np.inf)
            latency = np.zeros((n, n))
            # a block of sources at a time: their routes are a block's, not every pair's
            step = max(1, _RATE_PAIRS // n)
            for lo in range(0, n, step):
                s, d = np.divmod(np.arange(lo * n, min(n, lo + step) * n), n)
                s, d = s[s != d], d[s != d]
                r = fabric.route(s, d)
                latency[s, d] = row_latency(fabric, r)
                rate[s, d] = alone_rate(fabric.capacity, r.link, r.weight, np.diff(r.ptr))
            self._rate = (rate, latency)
        return self._rate

    def _pooled(self, *parts: np.ndarray) -> int:
        """Append ``parts`` to the critical path's pool; their offset."""
        k = sum(x.size for x in parts)
        if self._cp_used + k > self._cp_pool.size:
            grown = np.empty(max(2 * self._cp_pool.size, self._cp_used + k))
            grown[:self._cp_used] = self._cp_pool[:self._cp_used]
            self._cp_pool = grown
        at = self._cp_used
        self._cp_pool[at:at + k] = np.concatenate(parts)
        self._cp_used += k
        return at

    def _cp_pattern(self, iu: ConfigInfo, iv: ConfigInfo) -> int:
        """Per unit of scale, the transfer pattern of (cu, cv) as the critical path
        sees it, pooled (its offset): per position of ``cv``, the slowest transfer into
        it alone (seconds, ``-inf`` where none), the bytes into it, ``0`` where it
        shares a server with ``cu`` (a dependency with no transfer) else ``-inf``, and
        the least latency of a transfer into it; then the same four per position of
        ``cu`` for the gradients back."""
        b = self.builder
        cu, cv = iu.config, iv.config
        key = (iu.token, iv.token)
        hit = self._cp.get(key)
        if hit is not None:
            return hit
        src, dst, overlap = b.cache.pattern(cu, cv)
        pu, pv = iu.position, iv.position
        ku, kv = len(cu.servers), len(cv.servers)
        rate, latency = self._pair_rate()
        slow_f, slow_b = np.full(kv, -np.inf), np.full(ku, -np.inf)
        np.maximum.at(slow_f, pv[dst], 8.0 * overlap / rate[src, dst])
        np.maximum.at(slow_b, pu[src], 8.0 * overlap / rate[dst, src])
        # a transfer is delivered its route's latency after its last byte (a
        # coflow's, the largest of its members'): at least the least into each
        late_f, late_b = np.full(kv, np.inf), np.full(ku, np.inf)
        np.minimum.at(late_f, pv[dst], latency[src, dst])
        np.minimum.at(late_b, pu[src], latency[dst, src])
        shared = b.pair(iu, iv)
        near_u, near_v = np.full(ku, -np.inf), np.full(kv, -np.inf)
        near_u[shared.lu] = 0.0
        near_v[shared.lv] = 0.0
        at = self._cp[key] = self._pooled(
            slow_f, np.bincount(pv[dst], overlap, kv), near_v,
            np.where(np.isfinite(late_f), late_f, 0.0),
            slow_b, np.bincount(pu[src], overlap, ku), near_u,
            np.where(np.isfinite(late_b), late_b, 0.0))
        return at

    def _cp_allreduce(self, cfg: OpConfig) -> tuple[int, int]:
        """``(offset, rings)`` of ``cfg``'s AllReduce rings in the pool: each ring's
        seconds per shard byte alone on its route, then their latencies, then their
        replica groups."""
        b = self.builder
        token = b.configs.info(cfg).token
        hit = self._ar_cp.get(token)
        if hit is None:
            plan = b.allreduce(cfg)
            routes = b.routes.store.view()
            idx, counts = gather_rows(routes.ptr, plan.ring_class)
            rate = alone_rate(b.fabric.capacity, routes.link[idx], routes.weight[idx],
                              counts)
            group = np.repeat(np.arange(cfg.mp), _rings_per_group(plan.ring_count))
            at = self._pooled(8.0 * plan.ring_factor / plan.ring_count / rate,
                              plan.ring_latency, group.astype(float))
            hit = self._ar_cp[token] = (at, plan.ring_class.size)
        return hit


def _rings_per_group(ring_count: np.ndarray) -> np.ndarray:
    """Rings of each replica group, from each ring's ``ring_count`` (a group's ``r``
    rings each say ``r``, groups in order)."""
    out, k = [], 0
    while k < ring_count.size:
        r = int(ring_count[k])
        out.append(r)
        k += r
    return np.asarray(out, np.int64)
