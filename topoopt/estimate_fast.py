"""Fast path of the iteration estimator: the task graph of :func:`topoopt.estimate.build_iteration`
assembled from pieces cached across strategies and run on the lean DAG engine.

The MCMC planner evaluates thousands of strategies that differ in one operator or one
segment (TopoOpt §4, FlexFlow's search). Everything that depends only on a segment's
config, an edge's pair of configs or a route is computed once per fabric and kept:
segment compute times (:class:`~topoopt.estimate.EstimateCache`), the local
positions shared by two configs, AllReduce rings and their coupled routes, coflow
routes (:meth:`~topoopt.fabrics.Fabric.coupled_route`) and per-pair routes. Routes are
registered as *route classes* (one row per distinct route), which lets the simulator
solve max-min per class and memoize it (:class:`~topoopt.netsim.dag.RateMemo`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix

from topoopt._require import require_choice
from topoopt.errors import ConfigError
from topoopt.estimate import (FLOW_ALLREDUCE, FLOW_MP, EstimateCache, IterationEstimate,
                              _busy, _coflow_groups, _group, fuse_operators, ring_flow_routes)
from topoopt.netsim.dag import DagArrays, HorizonExceeded, RateMemo, run_dag
from topoopt.netsim.maxmin import gather_rows, sum_by_key
from topoopt.netsim.workload import FlowRoutes
from topoopt.strategy import Strategy
from topoopt.topology.topology import check_ring

__all__ = ["FastEstimator", "FastGraph"]


#: Node kinds of an AllReduce dependency template (:class:`_ARPlan`).
_BWD, _UPD, _RING, _BAR, _GLOBAL = range(5)


@dataclass(frozen=True)
class _ARPlan:
    """A config's AllReduce: its rings (route class, latency, length, bytes factor
    ``2(k-1)/k`` and rings per shard) and the dependencies between its members'
    backward/update tasks, rings and barriers as (kind, index) pairs."""

    ring_class: np.ndarray
    ring_latency: np.ndarray
    ring_length: np.ndarray
    ring_factor: np.ndarray
    ring_count: np.ndarray
    barriers: int
    before_type: np.ndarray
    before_index: np.ndarray
    after_type: np.ndarray
    after_index: np.ndarray


class _RouteStore:
    """Route classes: a growing CSR of distinct routes (rows never move or change)."""

    def __init__(self) -> None:
        self.ptr = np.zeros(1025, np.int64)
        self.link = np.empty(4096, np.int64)
        self.weight = np.empty(4096)
        self.rows = 0
        self._view: FlowRoutes | None = None

    @property
    def entries(self) -> int:
        return int(self.ptr[self.rows])

    def add(self, routes: FlowRoutes) -> np.ndarray:
        """Append the rows of ``routes``; return their class ids."""
        k, e = len(routes), routes.link.size
        r0, e0 = self.rows, self.entries
        while r0 + k + 1 > self.ptr.size:
            self.ptr = np.concatenate([self.ptr, np.zeros(self.ptr.size, np.int64)])
        while e0 + e > self.link.size:
            self.link = np.concatenate([self.link, np.empty(self.link.size, np.int64)])
            self.weight = np.concatenate([self.weight, np.empty(self.weight.size)])
        self.ptr[r0 + 1:r0 + k + 1] = e0 + routes.ptr[1:]
        self.link[e0:e0 + e] = routes.link
        self.weight[e0:e0 + e] = routes.weight
        self.rows += k
        self._view = None
        return np.arange(r0, r0 + k, dtype=np.int64)

    def view(self) -> FlowRoutes:
        if self._view is None:
            e = self.entries
            self._view = FlowRoutes(self.ptr[:self.rows + 1], self.link[:e], self.weight[:e])
        return self._view


@dataclass(frozen=True)
class FastGraph:
    """One strategy's task graph as the DAG engine runs it, plus what the summary needs.

    Attributes
    ----------
    dag : DagArrays
    tasks : int
        Compute tasks (the first ``tasks`` nodes; barriers come after the flows).
    task_server, task_duration : ndarray
        Of the compute tasks.
    flow_kind, flow_bytes, hop_count : ndarray
        Per flow (node ids ``dag.flow_node``), as in
        :class:`~topoopt.estimate.IterationGraph`.
    segments : tuple of Segment
    """

    dag: DagArrays
    tasks: int
    task_server: np.ndarray
    task_duration: np.ndarray
    flow_kind: np.ndarray
    flow_bytes: np.ndarray
    hop_count: np.ndarray
    segments: tuple


class FastEstimator:
    """Iteration times of many strategies of one job on one fabric.

    Builds the same task graph as :func:`topoopt.estimate.build_iteration` (same
    tasks, flows, routes, sizes and latencies; tasks numbered alike, so each server
    runs ready tasks in the same order) and simulates it with
    :func:`topoopt.netsim.dag.run_dag`. Two rewrites that change no time: flows
    that share a route are one route class, and an AllReduce shard with several
    rings waits for its members' backward tasks through one zero-time barrier (and
    its members' updates wait for the rings through another) instead of every ring
    depending on every member.

    Parameters
    ----------
    model, cluster, job
    fabric : Fabric
    rings : Mapping, optional
        AllReduce group members -> ring orders (default: ``fabric.info["rings"]``,
        else one ring in member order).
    overlap : bool
    mp_flows : {"auto", "pair", "coflow"}
        As :func:`~topoopt.estimate.build_iteration`.
    cache : EstimateCache, optional

    Examples
    --------
    >>> from topoopt.cluster import Cluster, Job
    >>> from topoopt.fabrics import ideal_switch
    >>> from topoopt.strategy import data_parallel
    >>> job = Job("ncf", batch_per_gpu=128)
    >>> from topoopt.workloads import model_of
    >>> model = model_of(job)
    >>> cluster = Cluster(servers=4, nics=4, link_bandwidth=100e9)
    >>> fast = FastEstimator(model, cluster, job, ideal_switch(4, 400e9))
    >>> est = fast.estimate(data_parallel(model, 4))
    >>> est.total >= est.compute > 0
    True
    """

    #: Route entries and coflow routes kept before every route-derived cache is dropped,
    #: and config entries before the per-config caches are (memory bounds on long runs).
    route_limit = 5_000_000
    coflow_limit = 50_000
    config_limit = 100_000

    def __init__(self, model, cluster, job, fabric,
                 rings: Mapping[tuple[int, ...], Sequence[Sequence[int]]] | None = None,
                 overlap: bool = True, mp_flows: str = "auto",
                 cache: EstimateCache | None = None) -> None:
        require_choice("mp_flows", mp_flows, ("auto", "pair", "coflow"))
        if mp_flows == "auto":
            one_switch = fabric.kind == "switched" and fabric.nodes == fabric.servers + 1
            mp_flows = "pair" if one_switch else "coflow"
        if fabric.servers != cluster.servers:
            raise ConfigError("fabric", fabric.servers, f"has {fabric.servers} servers but the "
                              f"cluster has {cluster.servers}")
        self.model, self.cluster, self.job, self.fabric = model, cluster, job, fabric
        self.rings = rings if rings is not None else fabric.info.get("rings")
        self.overlap, self.mp_flows = overlap, mp_flows
        self.cache = cache if cache is not None else EstimateCache(model, cluster, job)
        self.n = cluster.servers
        self.dtype_bytes = job.dtype_bytes
        self._cfg: dict = {}       # id(cfg) -> (cfg, servers array, pos row)
        self._common: dict = {}    # (id(cu), id(cv)) -> (cu, cv, local idx in u, in v)
        self._ar: dict = {}        # id(cfg) -> (cfg, shards)
        self._reset_routes()

    def _reset_routes(self) -> None:
        self.routes = _RouteStore()
        self.memo = RateMemo()
        self._rings: dict = {}      # ring order -> (class, hop latency)
        self._coflows: dict = {}    # member (src, dst, share) bytes -> (class, latency)
        self._pairs = np.full(self.n * self.n, -1, np.int64)
        self._pair_lat = np.zeros(self.n * self.n)
        self._ar.clear()
        self._core_rows = None      # the fabric's route store as a sparse matrix

    # -- cached pieces --------------------------------------------------------------
    def _config(self, cfg):
        hit = self._cfg.get(id(cfg))
        if hit is None or hit[0] is not cfg:
            srv = np.asarray(cfg.servers, np.int64)
            pos = np.full(self.n, -1, np.int64)
            pos[srv] = np.arange(srv.size)
            hit = self._cfg[id(cfg)] = (cfg, srv, pos)
        return hit

    def _shared(self, cu, cv):
        """Local positions (in u, in v) of the servers both configs use."""
        key = (id(cu), id(cv))
        hit = self._common.get(key)
        if hit is None or hit[0] is not cu or hit[1] is not cv:
            pu = self._config(cu)[2]
            pv = self._config(cv)[2]
            common = np.flatnonzero((pu >= 0) & (pv >= 0))
            hit = self._common[key] = (cu, cv, pu[common], pv[common])
        return hit[2], hit[3]

    def _ring(self, order: tuple[int, ...]):
        hit = self._rings.get(order)
        if hit is None:
            routes, lat = ring_flow_routes(self.fabric, [order])
            hit = self._rings[order] = (int(self.routes.add(routes)[0]), float(lat[0]))
        return hit

    def _allreduce(self, cfg) -> _ARPlan:
        """The AllReduce of a config's parameter shards, as a template (cached)."""
        hit = self._ar.get(id(cfg))
        if hit is not None and hit[0] is cfg:
            return hit[1]
        _, _, pos = self._config(cfg)
        cls, lat, glen, frac = [], [], [], []
        bt, bi, at, ai = [], [], [], []   # dependency template: (type, index) pairs
        nbar = 0
        for b in range(cfg.mp):
            members = tuple(sorted(cfg.replicas(b)))
            orders = (self.rings or {}).get(members, (members,))
            if not orders:
                raise ConfigError("rings", members, "every AllReduce group needs a ring")
            k, r, first = len(members), len(orders), len(cls)
            for order in orders:
                order = tuple(int(x) for x in order)
                check_ring(order, members)
                c, hop_lat = self._ring(order)
                cls.append(c)
                lat.append(2 * (len(order) - 1) * hop_lat)
                glen.append(len(order))
                frac.append((2.0 * (k - 1) / k, r))
            local = pos[np.asarray(members, np.int64)].tolist()
            rings = list(range(first, first + r))
            if not self.overlap:     # rings after the global barrier
                bt += [_GLOBAL] * r
                bi += [0] * r
                at += [_RING] * r
                ai += rings
            elif r == 1:
                bt += [_BWD] * k
                bi += local
                at += [_RING] * k
                ai += [first] * k
            else:                    # members -> barrier -> rings
                bt += [_BWD] * k + [_BAR] * r
                bi += local + [nbar] * r
                at += [_BAR] * k + [_RING] * r
                ai += [nbar] * k + rings
                nbar += 1
            if r == 1:               # rings -> members' updates
                bt += [_RING] * k
                bi += [first] * k
                at += [_UPD] * k
                ai += local
            else:
                bt += [_RING] * r + [_BAR] * k
                bi += rings + [nbar] * k
                at += [_BAR] * r + [_UPD] * k
                ai += [nbar] * r + local
                nbar += 1
        i64 = (lambda x: np.asarray(x, np.int64))
        plan = _ARPlan(i64(cls), np.asarray(lat, float), i64(glen),
                       np.asarray([f for f, _ in frac]), np.asarray([r for _, r in frac], float),
                       nbar, i64(bt), i64(bi), i64(at), i64(ai))
        self._ar[id(cfg)] = (cfg, plan)
        return plan

    def _pair_classes(self, src: np.ndarray, dst: np.ndarray):
        key = src * self.n + dst
        cls = self._pairs[key]
        miss = cls < 0
        if miss.any():
            new = np.unique(key[miss])
            r = self.fabric.route(new // self.n, new % self.n)
            owner = np.repeat(np.arange(len(r)), np.diff(r.ptr))
            self._pair_lat[new] = np.bincount(owner, weights=self.fabric.latency[r.link]
                                              * r.weight, minlength=len(r))
            self._pairs[new] = self.routes.add(r)
            cls = self._pairs[key]
        return cls, self._pair_lat[key]

    def _coflow_classes(self, src, dst, member, share, groups: int):
        """Route class and latency of each coflow (members' (src, dst, share) as key)."""
        order = np.argsort(member, kind="stable")
        edges = np.concatenate([[0], np.cumsum(np.bincount(member, minlength=groups))]).tolist()
        s_b, d_b, w_b = src[order].tobytes(), dst[order].tobytes(), share[order].tobytes()
        cls = np.empty(groups, np.int64)
        lat = np.empty(groups)
        missing, keys = [], []
        for g in range(groups):
            a, b = 8 * edges[g], 8 * edges[g + 1]
            key = (s_b[a:b], d_b[a:b], w_b[a:b])
            hit = self._coflows.get(key)
            if hit is None:
                missing.append(g)
                keys.append(key)
            else:
                cls[g], lat[g] = hit
        if missing:
            miss = np.asarray(missing, np.int64)
            renum = np.full(groups, -1, np.int64)
            renum[miss] = np.arange(miss.size)
            take = renum[member] >= 0
            routes, mlat = self._coupled(src[take], dst[take], renum[member[take]],
                                         share[take], miss.size)
            new = self.routes.add(routes)
            cls[miss] = new
            lat[miss] = mlat
            for k, c, x in zip(keys, new.tolist(), mlat.tolist()):
                self._coflows[k] = (c, x)
        return cls, lat

    def _coupled(self, src, dst, group, share, groups: int):
        """:meth:`Fabric.coupled_route` as a sparse product, (groups x routing-node pairs)
        shares times the pairs' route rows, plus the access links, summed in a dense
        (group, link) table. Same rows and latencies (sums in another order, ~1e-16),
        without sorting every (group, pair) entry."""
        f = self.fabric
        core = f._core()
        local = src != dst
        rows = core.pair_rows(f.attach[src], f.attach[dst])
        store = core._store()
        if self._core_rows is None or self._core_rows[0] is not store:
            ptr, links, weights = store
            owner = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
            lat = np.bincount(owner, weights=f.latency[links] * weights, minlength=ptr.size - 1)
            mat = csr_matrix((weights, links, ptr), shape=(ptr.size - 1, f.links))
            self._core_rows = (store, mat, lat)
        _, mat, row_lat = self._core_rows
        w = np.where(local, share, 0.0)
        core_part = (csr_matrix((w, (group, rows)), shape=(groups, mat.shape[0])) @ mat).tocoo()
        L = f.links
        keys, vals = [core_part.row.astype(np.int64) * L + core_part.col], [core_part.data]
        flow_lat = row_lat[rows]
        for access, end in ((f.uplink, src), (f.downlink, dst)):
            acc = access[end]
            use = (acc >= 0) & local
            if use.any():
                keys.append(group[use] * L + acc[use])
                vals.append(share[use])
                flow_lat = flow_lat + np.where(use, f.latency[np.maximum(acc, 0)], 0.0)
        ukey, weight = sum_by_key(np.concatenate(keys), np.concatenate(vals), groups * L)
        ptr = np.zeros(groups + 1, np.int64)
        np.cumsum(np.bincount(ukey // L, minlength=groups), out=ptr[1:])
        lat = np.zeros(groups)
        np.maximum.at(lat, group, np.where(local, flow_lat, 0.0))
        return FlowRoutes(ptr, ukey % L, weight), lat

    # -- the graph ------------------------------------------------------------------
    def graph(self, strategy: Strategy) -> FastGraph:
        """The task graph of ``strategy`` (see the class docstring)."""
        model, n = self.model, self.n
        if len(strategy.configs) != len(model.operators):
            raise ConfigError("strategy", len(strategy.configs),
                              f"needs one config per operator ({len(model.operators)})")
        if self.routes.entries > self.route_limit or len(self._coflows) > self.coflow_limit:
            self._reset_routes()
        if len(self._cfg) + len(self._common) > self.config_limit:
            self._cfg.clear()
            self._common.clear()
        segs, seg_of = fuse_operators(model, strategy, self.cluster, self.job, self.cache)
        nseg = len(segs)
        info = [self._config(s.config) for s in segs]
        sizes = np.fromiter((x[1].size for x in info), np.int64, nseg)
        total = int(sizes.sum())
        ends = np.cumsum(sizes)
        fwd_base = ends - sizes
        rev_sizes = sizes[::-1]
        bwd_base = np.empty(nseg, np.int64)
        bwd_base[::-1] = total + np.cumsum(rev_sizes) - rev_sizes
        has_update = np.fromiter((s.update > 0 for s in segs), bool, nseg)
        upd_sizes = np.where(has_update, sizes, 0)
        upd_base = 2 * total + np.cumsum(upd_sizes) - upd_sizes
        ntask = 2 * total + int(upd_sizes.sum())
        srv = np.concatenate([x[1] for x in info]) if nseg else np.empty(0, np.int64)
        seg_idx = np.repeat(np.arange(nseg), sizes)
        fwd_t = np.array([s.fwd for s in segs])
        bwd_t = np.array([s.bwd for s in segs])
        upd_t = np.array([s.update for s in segs])
        upd_sel = has_update[seg_idx]
        res = np.concatenate([srv, _reverse_blocks(srv, sizes), srv[upd_sel]])
        dur = np.concatenate([fwd_t[seg_idx], _reverse_blocks(bwd_t[seg_idx], sizes),
                              upd_t[seg_idx][upd_sel]])
        pos_mat = np.stack([x[2] for x in info]) if nseg else np.empty((0, n), np.int64)
        fwd_all = np.arange(total)
        bwd_all = bwd_base[seg_idx] + (fwd_all - fwd_base[seg_idx])
        before = [fwd_all]
        after = [bwd_all]

        # MP transfers and same-server data dependencies between segments.
        f_keys, f_bytes, f_pred, b_keys, b_bytes, b_pred = [], [], [], [], [], []
        seg_pairs = set()
        cache, cluster, job = self.cache, self.cluster, self.job
        for e, (u, v) in enumerate(model.edges):
            gu, gv = int(seg_of[u]), int(seg_of[v])
            if gu < 0 or gu == gv:
                continue
            seg_pairs.add((gu, gv))
            src, dst, nbytes = cache.edge(model, e, u, segs[gu].config, segs[gv].config,
                                          cluster, job)
            if src.size == 0:
                continue
            f_keys.append((gv * n + src) * n + dst)
            f_bytes.append(nbytes)
            f_pred.append(fwd_base[gu] + info[gu][2][src])
            b_keys.append((gu * n + dst) * n + src)
            b_bytes.append(nbytes)
            b_pred.append(bwd_base[gv] + info[gv][2][dst])
        for gu, gv in sorted(seg_pairs):
            lu, lv = self._shared(segs[gu].config, segs[gv].config)
            if lu.size:
                before += [fwd_base[gu] + lu, bwd_base[gv] + lv]
                after += [fwd_base[gv] + lv, bwd_base[gu] + lu]

        # Flows: MP (forward, backward), then AllReduce rings; barriers after them.
        fl_class, fl_bytes, fl_lat, fl_kind, fl_hops = [], [], [], [], []
        nflow = [0]

        def add_flows(cls, nbytes, lat, kind, hops):
            ids = ntask + nflow[0] + np.arange(cls.size)
            nflow[0] += cls.size
            fl_class.append(cls)
            fl_bytes.append(nbytes)
            fl_lat.append(lat)
            fl_kind.append(np.full(cls.size, kind, np.int8))
            fl_hops.append(hops)
            return ids

        def add_mp(keys, nbytes, preds, succ_base):
            if not keys:
                return
            keys = np.concatenate(keys)
            uk, inv = _group(keys)
            sizes_ = np.bincount(inv, weights=np.concatenate(nbytes))
            g, rest = uk // (n * n), uk % (n * n)
            src, dst = rest // n, rest % n
            preds = np.concatenate(preds)
            succs = succ_base[g] + pos_mat[g, dst]
            if self.mp_flows == "coflow":
                co, member = _coflow_groups(inv, preds, uk.size)
                tot = np.bincount(member, weights=sizes_, minlength=co.size)
                share = sizes_ / np.where(tot[member] > 0, tot[member], 1.0)
                cls, lat = self._coflow_classes(src, dst, member, share, co.size)
                ids = add_flows(cls, tot, lat, FLOW_MP, np.ones(co.size, np.int64))
                inv, flow_of_succ = member[inv], member
            else:
                cls, lat = self._pair_classes(src, dst)
                ids = add_flows(cls, sizes_, lat, FLOW_MP, np.ones(uk.size, np.int64))
                flow_of_succ = np.arange(uk.size)
            before.extend([preds, ids[flow_of_succ]])
            after.extend([ids[inv], succs])

        add_mp(f_keys, f_bytes, f_pred, fwd_base)
        add_mp(b_keys, b_bytes, b_pred, bwd_base)

        # AllReduce: per segment, its config's template instantiated at the segment's
        # node ids (backward and update tasks, rings, barriers).
        ar = [(g, self._allreduce(s.config)) for g, s in enumerate(segs)
              if s.params > 0 and s.config.dp >= 2]
        nbar = 0 if self.overlap else 1   # barrier 0: the global one (overlap=False)
        if ar:
            ar_g = np.fromiter((g for g, _ in ar), np.int64, len(ar))
            plans = [p for _, p in ar]
            nring = np.fromiter((p.ring_class.size for p in plans), np.int64, len(ar))
            nbars = np.fromiter((p.barriers for p in plans), np.int64, len(ar))
            shard_bytes = np.array([segs[g].params / segs[g].config.mp * self.dtype_bytes
                                    for g, _ in ar])
            ring_seg = np.repeat(np.arange(len(ar)), nring)
            frac = np.concatenate([p.ring_factor for p in plans])
            nr = np.concatenate([p.ring_count for p in plans])
            ids = add_flows(np.concatenate([p.ring_class for p in plans]),
                            frac * shard_bytes[ring_seg] / nr,
                            np.concatenate([p.ring_latency for p in plans]), FLOW_ALLREDUCE,
                            np.concatenate([p.ring_length for p in plans]))
            tlen = np.fromiter((p.before_type.size for p in plans), np.int64, len(ar))
            dep_seg = np.repeat(np.arange(len(ar)), tlen)
            ring_off = ids[0] + np.cumsum(nring) - nring
            bar_off = nbar + np.cumsum(nbars) - nbars   # barrier numbers, ids set below
            nbar += int(nbars.sum())
            bases = np.stack([bwd_base[ar_g], upd_base[ar_g], ring_off,
                              -1 - bar_off, np.full(len(ar), -1)], axis=1)
            bt = np.concatenate([p.before_type for p in plans])
            at = np.concatenate([p.after_type for p in plans])
            # barriers get placeholders -1 - number (fixed once the flows are counted)
            sign_b = np.where((bt == _BAR) | (bt == _GLOBAL), -1, 1)
            sign_a = np.where((at == _BAR) | (at == _GLOBAL), -1, 1)
            tb = bases[dep_seg, bt] + sign_b * np.concatenate([p.before_index for p in plans])
            ta = bases[dep_seg, at] + sign_a * np.concatenate([p.after_index for p in plans])
            no_upd = ~has_update[ar_g]
            if no_upd.any():
                keep = ~(no_upd[dep_seg] & (at == _UPD))
                tb, ta = tb[keep], ta[keep]
            late_b, late_a = [tb], [ta]
        else:
            ar_g = np.empty(0, np.int64)
            late_b, late_a = [], []
        if not self.overlap:
            late_b.append(bwd_all)
            late_a.append(np.full(bwd_all.size, -1))
        # Updates of segments without AllReduce follow their own backward.
        plain = has_update.copy()
        plain[ar_g] = False
        for g in np.flatnonzero(plain).tolist():
            k = int(sizes[g])
            before.append(bwd_base[g] + np.arange(k))
            after.append(upd_base[g] + np.arange(k))

        nf = nflow[0]
        nodes = ntask + nf + nbar
        if late_b:
            lb = np.concatenate(late_b)
            la = np.concatenate(late_a)
            # placeholder -1 - i -> barrier i, numbered after the flows
            lb = np.where(lb < 0, ntask + nf - 1 - lb, lb)
            la = np.where(la < 0, ntask + nf - 1 - la, la)
            before.append(lb)
            after.append(la)
        dep_b = np.concatenate(before)
        dep_a = np.concatenate(after)

        cat = (lambda xs, dt: np.concatenate(xs).astype(dt, copy=False) if xs
               else np.empty(0, dt))
        flow_class = cat(fl_class, np.int64)
        flow_bytes = cat(fl_bytes, float)
        flow_lat = cat(fl_lat, float)
        is_flow = np.zeros(nodes, bool)
        is_flow[ntask:ntask + nf] = True
        local = np.zeros(nodes, np.int64)
        local[ntask:ntask + nf] = np.arange(nf)
        node_res = np.full(nodes, -1, np.int64)
        node_res[:ntask] = res
        node_dur = np.zeros(nodes)
        node_dur[:ntask] = dur
        # stable sort of the dependency sources (radix sort when ids fit 16 bits)
        order = np.argsort(dep_b.astype(np.uint16) if nodes <= 1 << 16 else dep_b,
                           kind="stable")
        succ_ptr = np.zeros(nodes + 1, np.int64)
        np.cumsum(np.bincount(dep_b, minlength=nodes), out=succ_ptr[1:])
        dag = DagArrays(nodes, is_flow, local, ntask + np.arange(nf), 8.0 * flow_bytes,
                        flow_lat, flow_class, self.routes.view(), node_res, node_dur,
                        succ_ptr, dep_a[order], np.bincount(dep_a, minlength=nodes), None)
        return FastGraph(dag, ntask, res, dur, cat(fl_kind, np.int8), flow_bytes,
                         cat(fl_hops, np.int64), segs)

    # -- results --------------------------------------------------------------------
    def estimate(self, strategy: Strategy) -> IterationEstimate:
        """Simulated iteration of ``strategy`` (as :func:`topoopt.estimate.estimate_iteration`)."""
        graph = self.graph(strategy)
        start, finish, _, events = run_dag(self.fabric.capacity, graph.dag, self.memo)
        return self.summarize(graph, start, finish, events)

    def total(self, strategy: Strategy) -> float:
        """Simulated iteration seconds of ``strategy``."""
        return self.bounded_total(strategy)[0]

    def bounded_total(self, strategy: Strategy, bound: float = math.inf
                      ) -> tuple[float, bool]:
        """``(seconds, exact)``: the iteration time of ``strategy``, or -- when it is
        sure to exceed ``bound`` -- a lower bound above ``bound`` found by stopping the
        simulation there (``exact`` False)."""
        graph = self.graph(strategy)
        try:
            _, finish, _, _ = run_dag(self.fabric.capacity, graph.dag, self.memo, bound)
        except HorizonExceeded as past:
            return past.time, False
        return _makespan(finish), True

    def summarize(self, graph: FastGraph, start: np.ndarray, finish: np.ndarray,
                  events: int) -> IterationEstimate:
        """The :class:`IterationEstimate` of a simulated :class:`FastGraph`."""
        busy = np.bincount(graph.task_server, weights=graph.task_duration)
        compute = float(busy.max()) if busy.size else 0.0
        fn = graph.dag.flow_node
        mp_sel = fn[graph.flow_kind == FLOW_MP]
        ar = graph.flow_kind == FLOW_ALLREDUCE
        ar_sel = fn[ar]
        total = _makespan(finish)
        return IterationEstimate(
            total=total, compute=compute,
            mp=_busy(start[mp_sel], finish[mp_sel]),
            allreduce=_busy(start[ar_sel], finish[ar_sel]),
            exposed_communication=max(total - compute, 0.0), fabric=self.fabric.name,
            flows=int(fn.size), tasks=graph.tasks, events=events,
            mp_bytes=float(graph.flow_bytes[graph.flow_kind == FLOW_MP].sum()),
            allreduce_bytes=float((graph.flow_bytes[ar] * graph.hop_count[ar]).sum()))


def _makespan(finish: np.ndarray) -> float:
    done = finish[np.isfinite(finish)]
    return float(done.max()) if done.size else 0.0


def _reverse_blocks(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``values`` split in blocks of ``sizes``, blocks in reverse order (each kept as is)."""
    if values.size == 0:
        return values
    idx, _ = gather_rows(np.concatenate([[0], np.cumsum(sizes)]), np.arange(sizes.size)[::-1])
    return values[idx]
