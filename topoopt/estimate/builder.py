"""The builder of iteration task graphs (FlexNet, TopoOpt §5): strategy -> graph.

:class:`IterationGraphBuilder` turns a strategy into an
:class:`~topoopt.estimate.iteration_graph.IterationGraph`. The MCMC planner builds
thousands of graphs that differ in one operator or one segment, so everything that
depends only on a segment's config, an edge's pair of configs or a route is computed
once per builder and kept: segment compute times
(:class:`~topoopt.estimate.segments.EstimateCache`), configs' servers and positions,
edges' transfer templates and AllReduce templates (:mod:`~topoopt.estimate.templates`),
route classes (:mod:`~topoopt.estimate.routes`). A graph is then these pieces placed
at its segments' node offsets (:meth:`IterationGraphBuilder.build`, step by step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from topoopt._require import require_choice
from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError
from topoopt.estimate.bounds import GraphBounds
from topoopt.estimate.checks import check_estimate_inputs
from topoopt.estimate.iteration_graph import FLOW_ALLREDUCE, IterationGraph
from topoopt.estimate.mp_flows import (
    Barriers,
    DependencyList,
    FlowTable,
    add_mp_pass,
    backward_transfers,
    forward_transfers,
    placeholder,
)
from topoopt.estimate.routes import RouteCache
from topoopt.estimate.segments import EstimateCache, Segment, fuse_operators
from topoopt.estimate.templates import (
    UPD,
    AllReduceTemplate,
    ConfigInfo,
    ConfigTable,
    Fused,
    PairTemplate,
    allreduce_template,
)
from topoopt.fabrics.fabric import Fabric
from topoopt.model import Model
from topoopt.strategy import OpConfig, Strategy

__all__ = ["MP_FLOWS", "IterationGraphBuilder", "build_iteration"]

#: Granularities of MP flows (see :class:`IterationGraphBuilder`).
MP_FLOWS = ("auto", "pair", "coflow")
Rings = Mapping[tuple[int, ...], Sequence[Sequence[int]]]


class _TaskLayout(NamedTuple):
    """The compute tasks of a graph: per segment, ``sizes`` positions (servers) and the
    node of its first forward, backward and update task; per task, its server and
    seconds."""

    sizes: np.ndarray
    fwd_base: np.ndarray
    bwd_base: np.ndarray
    upd_base: np.ndarray
    has_update: np.ndarray
    tasks: int
    server: np.ndarray
    duration: np.ndarray
    #: (segments, n): each server's position in each segment, -1 where unused.
    position: np.ndarray
    #: Per position over all segments, its forward and its backward task.
    fwd_nodes: np.ndarray
    bwd_nodes: np.ndarray


@dataclass(slots=True)
class _ForwardGroup:
    """Edges whose forward transfers are one pattern into one consumer: the number of
    the group, its first edge (an index into :class:`_Transfers`), its producers."""

    number: int
    first: int
    producers: list[int]


@dataclass(slots=True)
class _Transfers:
    """The MP edges of a graph that carry transfers, in edge order: their templates,
    (producer, consumer) segments, scales (activation / producer ``mp``), forward
    groups and whether each is its group's first; and the templates of every segment
    pair joined by an edge."""

    pairs: dict[tuple[int, int], PairTemplate] = field(default_factory=dict)
    groups: dict[tuple, _ForwardGroup] = field(default_factory=dict)
    plans: list[PairTemplate] = field(default_factory=list)
    segs: list[tuple[int, int]] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    first: list[bool] = field(default_factory=list)


class IterationGraphBuilder:
    """Task graphs of many strategies of one job on one fabric.

    Per fused segment (:func:`~topoopt.estimate.segments.fuse_operators`) and server: a
    forward task, a backward task and, for segments with parameters, a weight-update
    task, each on the server's GPUs (one resource per server; forward before
    backward). MP transfers (:func:`topoopt.traffic.edge_transfers`) join the
    producer's forward task on the source to the consumer's forward task on the
    destination, and their gradients the consumers' backward to the producer's
    backward the other way; transfers of one stage (consumer segment forward, producer
    segment backward) between the same two servers are one flow. Each AllReduce shard
    (segment x parameter shard) runs as one coupled flow per ring (bytes per hop
    ``2(g-1)/g x S / rings``, latency ``2(g-1)`` x the slowest hop), after the backward
    of that segment on every member (``overlap=True``) or after all backward tasks
    (``overlap=False``); each member's update waits for it. A shard with several rings
    waits for its members through one zero-time barrier, and its members' updates wait
    for the rings through another. Producer segments with one config that feed one
    consumer segment with one config (DLRM's 64 tables, the interaction) send the same
    pattern of transfers: their flows wait for the producers' tasks on each source
    through one zero-time barrier per source (``mp_barriers``), a dependency per
    producer and per flow instead of one per (producer, flow) pair. On the way back,
    such a producer whose one consumer sends it the same gradients as another's is that
    producer's alias: the other's flows stand for its own (counted with
    ``merge_flows``, their bytes added as coflows) and end in one barrier per
    destination that both producers' backward tasks wait for.

    Parameters
    ----------
    model, cluster, job
    fabric : Fabric
        With ``cluster.servers`` servers.
    rings : Mapping, optional
        AllReduce group members (sorted tuple) -> ring orders (default:
        ``fabric.info["rings"]``, else one ring in member order); the group's bytes
        are split evenly over them.
    overlap : bool
        Overlap AllReduce with the rest of the backward pass.
    mp_flows : {"auto", "pair", "coflow"}
        ``"pair"``: one max-min flow per (stage, source, destination) -- exact at
        flow level. ``"coflow"``: the transfers a task releases at once (one
        source to many destinations, e.g. an embedding's output) are one coupled
        flow whose rate is split over them in proportion to their bytes, so they
        end together -- an approximation (a slow destination slows the group).
        ``"auto"`` (default): pairs on a single switch (Ideal Switch, star: two
        links per route, cheap and exact), coflows elsewhere, where per-pair flows
        over uneven multi-hop routes end at thousands of distinct times
        (measurements: ``docs/tuning.md``).
    cache : EstimateCache, optional
    random_paths : bool
        One seeded random shortest path per flow instead of ECMP (routes then are
        drawn per graph, not cached).
    seed : int
    merge_flows : bool
        With per-pair MP flows, one flow node for identical flows
        (:attr:`IterationGraph.flow_count`): where the blocks of flows of two segments
        (a consumer's forward, a producer's backward) match pair by pair in route,
        bytes and predecessors -- the gradients the backward of a DLRM interaction
        sends to each of 64 tables sharded over every server -- their flows start
        together and share every rate, so one node runs them, exactly. The planner's
        engine sets it; the default keeps one node per flow.
    mp_barriers : bool
        Join a consumer's producers that share a config through one barrier per
        source, and alias their gradients (see above; the same times, to 1e-12 with
        coflows, on a graph with far fewer dependencies). ``False`` keeps a
        dependency per (producer task, flow) and a flow per (producer, pair).
    """

    #: Route entries and coflow routes kept before every route-derived cache is dropped,
    #: and config entries before the per-config caches are (memory bounds on long runs).
    route_limit = 5_000_000
    coflow_limit = 50_000
    config_limit = 100_000
    #: Bytes of MP edge templates kept before they are dropped: a template is a few
    #: arrays per transfer, so at 1024 servers a count alone let them reach gigabytes.
    template_bytes = 1 << 27

    def __init__(self, model: Model, cluster: Cluster, job: Job, fabric: Fabric,
                 rings: Rings | None = None, overlap: bool = True, mp_flows: str = "auto",
                 cache: EstimateCache | None = None, random_paths: bool = False,
                 seed: int = 0, merge_flows: bool = False, mp_barriers: bool = True) -> None:
        require_choice("mp_flows", mp_flows, MP_FLOWS)
        if mp_flows == "auto":
            one_switch = fabric.kind == "switched" and fabric.nodes == fabric.servers + 1
            mp_flows = "pair" if one_switch else "coflow"
        if fabric.servers != cluster.servers:
            raise ConfigError("fabric", fabric.servers, f"has {fabric.servers} servers but the "
                              f"cluster has {cluster.servers}")
        self.model, self.cluster, self.job, self.fabric = model, cluster, job, fabric
        self.rings = rings if rings is not None else fabric.info.get("rings")
        self.overlap, self.mp_flows = overlap, mp_flows
        self.random_paths, self.seed = random_paths, seed
        self.merge_flows = merge_flows
        self.mp_barriers = mp_barriers
        self.cache = cache if cache is not None else EstimateCache(model, cluster, job)
        self.n = cluster.servers
        self._edge_u = np.array([u for u, _ in model.edges], np.int64).reshape(-1)
        self._edge_v = np.array([v for _, v in model.edges], np.int64).reshape(-1)
        self.dtype_bytes = job.dtype_bytes
        self.configs = ConfigTable(self.n)
        self._last_fused: tuple[tuple[OpConfig, ...], Fused] | None = None
        # keyed by config tokens (ConfigTable): equal configs share an entry
        self._pairs: dict[tuple[int, int], PairTemplate] = {}
        self._pair_bytes = 0
        self._allreduces: dict[int, AllReduceTemplate] = {}
        self.bounds = GraphBounds(self)
        self.reset_routes()

    # -- the caches -------------------------------------------------------------------
    def reset_routes(self) -> None:
        """Drop every route-derived cache (the route classes start afresh)."""
        self.routes = RouteCache(self.fabric, self.random_paths, self.seed)
        self._allreduces.clear()
        self.bounds.reset_routes()

    def reset_configs(self) -> None:
        """Drop every per-config cache (the configs are numbered afresh)."""
        self.configs.clear()
        self._last_fused = None
        self._pairs.clear()
        self._pair_bytes = 0
        self._allreduces.clear()
        self.bounds.reset_configs()

    @property
    def over_limits(self) -> bool:
        """Whether the route caches have grown past their bounds (see :meth:`build`)."""
        return (self.routes.store.entries > self.route_limit
                or self.routes.coflows > self.coflow_limit)

    def fused(self, strategy: Strategy) -> Fused:
        """``fuse_operators`` of ``strategy`` and its configs, the last one kept: the
        search asks for a candidate's bounds and then, if they pass, its graph."""
        key = strategy.configs
        if self._last_fused is None or self._last_fused[0] != key:
            segs, seg_of = fuse_operators(self.model, strategy, self.cluster, self.job,
                                          self.cache)
            info = [self.configs.info(s.config) for s in segs]
            self._last_fused = (key, Fused(segs, seg_of, info))
        return self._last_fused[1]

    def pair(self, iu: ConfigInfo, iv: ConfigInfo) -> PairTemplate:
        """What an edge from config ``iu`` to ``iv`` adds to a graph apart from its
        segments' node offsets and its activation (cached per config pair)."""
        key = (iu.token, iv.token)
        hit = self._pairs.get(key)
        if hit is None:
            if self._pair_bytes > self.template_bytes:
                self._pairs.clear()
                self._pair_bytes = 0
            hit = self._pairs[key] = PairTemplate(*self.cache.pattern(iu.config, iv.config),
                                                  iu.position, iv.position, self.n)
            self._pair_bytes += hit.nbytes
        return hit

    def allreduce(self, cfg: OpConfig) -> AllReduceTemplate:
        """The AllReduce of a config's parameter shards, as a template (cached, but
        drawn anew with ``random_paths``)."""
        info = self.configs.info(cfg)
        hit = self._allreduces.get(info.token)
        if hit is None:
            hit = allreduce_template(cfg, info.position, self.rings, self.overlap,
                                     self.routes.ring)
            if not self.random_paths:
                self._allreduces[info.token] = hit
        return hit

    # -- the bounds -------------------------------------------------------------------
    def lower_bound(self, strategy: Strategy) -> float:
        """A lower bound on ``strategy``'s iteration time on this fabric, without building
        its graph: the busiest server's compute (its tasks run one at a time), and the
        bytes a server must send or receive -- its MP transfers and its share of every
        ring AllReduce, ``2(k-1)/k`` of its shard -- over the capacity of its links (host
        forwarding only adds bytes)."""
        return self.bounds.server_bound(strategy)

    def link_bound(self, strategy: Strategy) -> float:
        """A lower bound on ``strategy``'s iteration time, before its graph is built:
        the busiest link's bits over its capacity, :func:`~topoopt.netsim.dag.
        link_load_bound` of the graph (the same MP transfers on their pairs' routes,
        the same rings) computed from a traffic matrix instead.

        Forwarded traffic piled onto a few fibres (a TopoOpt shard, an Expander) shows
        here. Needs the fabric's own routes (``random_paths=False``).

        Raises
        ------
        ValueError
            With ``random_paths``: each graph draws its own paths.
        """
        return self.bounds.link_bound(strategy)

    def critical_path_bound(self, strategy: Strategy) -> float:
        """A lower bound on ``strategy``'s iteration time, before its graph is built: the
        longest chain of dependencies, each task for its duration and each transfer at
        the rate its route gives it alone (servers and links shared by nothing else).

        Forward over the segments in order, then backward, each position of a segment
        gets the earliest time its task can start: after the earliest of its
        producers' tasks has run (``min`` over their positions, which keeps it a bound
        and cheap) plus the slowest transfer into it, and plus all the bytes it
        receives over its server's ingress; a position sharing a server with a
        producer waits for it with no transfer. A backward task follows its own
        forward. An AllReduce ring starts when its group's backward tasks are all done
        (all backward tasks with ``overlap=False``) and runs at its route's rate; the
        updates follow. Where the other bounds see only the busiest server or link,
        this one sees the pipeline's depth. Needs the fabric's own routes
        (``random_paths=False``).

        Raises
        ------
        ValueError
            With ``random_paths``: each graph draws its own paths.
        """
        return self.bounds.critical_path_bound(strategy)

    # -- the graph --------------------------------------------------------------------
    def build(self, strategy: Strategy) -> IterationGraph:
        """The task graph of ``strategy`` (see the class docstring).

        Steps: lay out the compute tasks; list the MP edges' transfers by forward
        group; find the producers whose gradients alias another's; join producers of
        a group through barriers; add the MP flows of both passes, then the AllReduce
        rings; number the barriers after the flows.
        """
        model = self.model
        if len(strategy.configs) != len(model.operators):
            raise ConfigError("strategy", len(strategy.configs),
                              f"needs one config per operator ({len(model.operators)})")
        if self.over_limits:
            self.reset_routes()
        if len(self.configs) + len(self._pairs) > self.config_limit:
            self.reset_configs()
        fused = self.fused(strategy)
        layout = self._lay_out_tasks(fused)
        deps = DependencyList()        # the graph's dependencies, in this order ...
        late = DependencyList()        # ... then these (barriers, AllReduce)
        deps.add(layout.fwd_nodes, layout.bwd_nodes)
        barriers = Barriers(0 if self.overlap else 1)   # barrier 0: the global one
        edges = self._transfers(fused)
        aliases, backward_kept = self._aliases(edges, fused)
        g_base, g_sign = self._join_producers(edges, fused, layout, barriers, late)
        if edges.pairs:
            pairs = sorted(edges.pairs)
            deps.add(*PairTemplate.shared_deps(pairs, [edges.pairs[x] for x in pairs],
                                               layout.fwd_base, layout.bwd_base))
        flows = FlowTable(layout.tasks)
        if edges.plans:
            self._add_mp_flows(edges, aliases, backward_kept, g_base, g_sign, layout, flows,
                               barriers, deps)
        ring_orders = self._add_allreduce(fused, layout, flows, barriers, late)
        if not self.overlap:           # every backward task -> the global barrier
            late.add(layout.bwd_nodes, np.full(layout.bwd_nodes.size, placeholder(0)))
        # updates of segments without AllReduce follow their own backward
        plain = layout.has_update.copy()
        plain[[g for g, s in enumerate(fused.segments) if _has_allreduce(s)]] = False
        for g in np.flatnonzero(plain).tolist():
            k = int(layout.sizes[g])
            deps.add(layout.bwd_base[g] + np.arange(k), layout.upd_base[g] + np.arange(k))
        deps.before += late.before
        deps.after += late.after
        dep_b, dep_a = deps.arrays()
        Barriers.resolve(dep_b, layout.tasks + flows.count)
        Barriers.resolve(dep_a, layout.tasks + flows.count)
        f = flows.arrays()
        return IterationGraph(layout.tasks, layout.server, layout.duration, f.route_class,
                              f.nbytes, f.latency, f.kind, f.hops, barriers.count, dep_b,
                              dep_a, self.routes.store.view(), fused.segments,
                              tuple(ring_orders), f.flow_count if flows.merged else None)

    def _lay_out_tasks(self, fused: Fused) -> _TaskLayout:
        """Node ids of the compute tasks: forward tasks by segment, backward tasks in
        reverse segment order, then the updates of segments that have one."""
        segs, info = fused.segments, fused.info
        nseg = len(segs)
        sizes = np.fromiter((x.servers.size for x in info), np.int64, nseg)
        total = int(sizes.sum())
        ends = np.cumsum(sizes)
        fwd_base = ends - sizes
        rev_sizes = sizes[::-1]
        bwd_base = np.empty(nseg, np.int64)
        bwd_base[::-1] = total + np.cumsum(rev_sizes) - rev_sizes
        times = np.array([(s.fwd, s.bwd, s.update) for s in segs]).reshape(nseg, 3)
        fwd_t, bwd_t, upd_t = times.T
        has_update = upd_t > 0
        upd_sizes = np.where(has_update, sizes, 0)
        upd_base = 2 * total + np.cumsum(upd_sizes) - upd_sizes
        tasks = 2 * total + int(upd_sizes.sum())
        srv = np.concatenate([x.servers for x in info]) if nseg else np.empty(0, np.int64)
        seg_idx = np.repeat(np.arange(nseg), sizes)
        upd_sel = has_update[seg_idx]
        # backward tasks: the segments' blocks in reverse order
        server = np.concatenate([srv, *[x.servers for x in reversed(info)], srv[upd_sel]])
        duration = np.concatenate([fwd_t[seg_idx], np.repeat(bwd_t[::-1], sizes[::-1]),
                                   upd_t[seg_idx][upd_sel]])
        position = (np.stack([x.position for x in info]) if nseg
                    else np.empty((0, self.n), np.int64))
        fwd_nodes = np.arange(total)
        bwd_nodes = bwd_base[seg_idx] + (fwd_nodes - fwd_base[seg_idx])
        return _TaskLayout(sizes, fwd_base, bwd_base, upd_base, has_update, tasks, server,
                           duration, position, fwd_nodes, bwd_nodes)

    def _transfers(self, fused: Fused) -> _Transfers:
        """The edges across segments that carry transfers, grouped for the forward
        pass: edges into one consumer from producers of one config, with one consumer
        config, are one pattern (with ``mp_barriers``; else an edge is a group). Per
        edge only scalars are decided here; its transfers come from its config pair's
        cached template."""
        segs, info = fused.segments, fused.info
        seg_of = fused.segment_of
        gu_of, gv_of = seg_of[self._edge_u], seg_of[self._edge_v]
        cross = np.flatnonzero((gu_of >= 0) & (gu_of != gv_of))
        activation = self.cache.activation
        edge_u = self._edge_u
        out = _Transfers()
        for e, gu, gv in zip(cross.tolist(), gu_of[cross].tolist(), gv_of[cross].tolist()):
            plan = out.pairs.get((gu, gv))
            if plan is None:
                plan = out.pairs[(gu, gv)] = self.pair(info[gu], info[gv])
            tensor = activation[edge_u[e]]
            if tensor <= 0 or plan.size == 0:     # no transfer (as edge_transfers has it)
                continue
            key = (gv, info[gu].token, info[gv].token) if self.mp_barriers else (e,)
            group = out.groups.get(key)
            if group is None:
                group = out.groups[key] = _ForwardGroup(len(out.groups), len(out.plans), [gu])
                out.first.append(True)
            else:
                group.producers.append(gu)
                out.first.append(False)
            out.group.append(group.number)
            out.plans.append(plan)
            out.segs.append((gu, gv))
            out.scale.append(tensor / segs[gu].config.mp)
        return out

    def _aliases(self, edges: _Transfers, fused: Fused
                 ) -> tuple[dict[int, list[int]], list[bool]]:
        """``(aliases, kept)``: a producer whose one consumer sends it the same gradients
        as another producer's (DLRM's tables of one config) is that producer's alias:
        its flows are the other's, counted twice (per-pair flows) or twice as large
        (coflows). ``aliases``: producer -> its aliases; ``kept[i]``: whether edge ``i``
        sends its own gradients."""
        kept = [True] * len(edges.plans)
        if not (self.mp_barriers and not self.random_paths
                and (self.mp_flows == "coflow" or self.merge_flows)):
            return {}, kept
        info = fused.info
        outs = [0] * len(info)           # edges with transfers out of each segment
        for gu, _ in edges.segs:
            outs[gu] += 1
        aliases: dict[int, list[int]] = {}
        firsts: dict[tuple, int] = {}
        for i, (gu, gv) in enumerate(edges.segs):
            if outs[gu] == 1:
                # equal configs, equal activation per shard: equal transfers
                key = (gv, info[gu].token, info[gv].token, edges.scale[i])
                rep = firsts.get(key)
                if rep is not None:
                    aliases[rep].append(gu)
                    kept[i] = False
                    continue
                firsts[key] = gu
                aliases[gu] = []
        return {r: al for r, al in aliases.items() if al}, kept

    def _join_producers(self, edges: _Transfers, fused: Fused, layout: _TaskLayout,
                        barriers: Barriers, late: DependencyList
                        ) -> tuple[np.ndarray, np.ndarray]:
        """``(base, sign)`` per forward group: its transfers wait for node ``base + sign
        x position`` -- its one producer's task, or, for several producers, a barrier
        per position of their (shared) config that each producer's task precedes."""
        groups = edges.groups
        g_base = np.empty(len(groups), np.int64)
        g_sign = np.ones(len(groups), np.int64)
        joins: dict[tuple, int] = {}     # (producer segments, config) -> first barrier
        for group in groups.values():
            gu = edges.segs[group.first][0]
            producers = tuple(sorted(set(group.producers)))
            if len(producers) == 1:
                g_base[group.number] = layout.fwd_base[gu]
                continue
            size = int(layout.sizes[gu])
            key = (producers, fused.info[gu].token)
            first = joins.get(key)
            if first is None:
                first = joins[key] = barriers.reserve(size)
                bars = placeholder(first + np.arange(size))
                # each producer's tasks -> the barriers (producer by producer)
                late.add((layout.fwd_base[list(producers)][:, None]
                          + np.arange(size)).ravel(), np.tile(bars, len(producers)))
            g_base[group.number], g_sign[group.number] = placeholder(first), -1
        return g_base, g_sign

    def _add_mp_flows(self, edges: _Transfers, aliases: dict[int, list[int]],
                      backward_kept: list[bool], g_base: np.ndarray, g_sign: np.ndarray,
                      layout: _TaskLayout, flows: FlowTable, barriers: Barriers,
                      deps: DependencyList) -> None:
        """The MP flows of the forward pass (a group's transfers once, its bytes summed
        over its edges) and of the backward pass (aliased edges left out)."""
        nn = self.n * self.n
        fwd = forward_transfers(edges.plans, [gv for _, gv in edges.segs], edges.scale,
                                edges.group, edges.first, g_base, g_sign, nn)
        bwd = backward_transfers(edges.plans, edges.segs, edges.scale, backward_kept,
                                 layout.bwd_base, nn)
        consumers = ({gv for _, gv in edges.pairs}, {gu for gu, _ in edges.pairs})
        coflows = self.mp_flows == "coflow"
        merge = self.merge_flows and not self.random_paths
        add_mp_pass(flows, self.routes, coflows, merge, *fwd, layout.fwd_base, layout.position,
                    len(consumers[0]), None, barriers, layout.sizes, deps)
        add_mp_pass(flows, self.routes, coflows, merge, *bwd, layout.bwd_base, layout.position,
                    len(consumers[1]), aliases, barriers, layout.sizes, deps)

    def _add_allreduce(self, fused: Fused, layout: _TaskLayout, flows: FlowTable,
                       barriers: Barriers, late: DependencyList) -> list[tuple[int, ...]]:
        """Per segment with an AllReduce, its config's template placed at the segment's
        nodes (backward and update tasks, rings, barriers); the rings' orders."""
        segs = fused.segments
        ar = [(g, self.allreduce(s.config)) for g, s in enumerate(segs) if _has_allreduce(s)]
        ring_orders: list[tuple[int, ...]] = []
        if not ar:
            return ring_orders
        ar_g = np.fromiter((g for g, _ in ar), np.int64, len(ar))
        plans = [p for _, p in ar]
        for p in plans:
            ring_orders.extend(p.orders)
        packed = [p.packed for p in plans]
        nring, nbars, tlen = np.array([(p.ring_class.size, p.barriers, p.before_type.size)
                                       for p in plans], np.int64).T
        shard_bytes = np.array([segs[g].params / segs[g].config.mp * self.dtype_bytes
                                for g, _ in ar])
        ring_seg = np.repeat(np.arange(len(ar)), nring)
        ring_int = np.concatenate([x.ring_ints for x in packed], axis=1)
        frac, nr, lat = np.concatenate([x.ring_floats for x in packed], axis=1)
        ids = flows.add(ring_int[0], frac * shard_bytes[ring_seg] / nr, lat, FLOW_ALLREDUCE,
                        ring_int[1])
        dep_seg = np.repeat(np.arange(len(ar)), tlen)
        ring_off = ids[0] + np.cumsum(nring) - nring
        bar_off = barriers.reserve(int(nbars.sum())) + np.cumsum(nbars) - nbars
        # a template's node (kind, index) is bases[its segment, kind] + index; a barrier's
        # index is negated, its base a placeholder
        bases = np.stack([layout.bwd_base[ar_g], layout.upd_base[ar_g], ring_off,
                          placeholder(bar_off), np.full(len(ar), placeholder(0))], axis=1)
        bt, bi, at, ai = np.concatenate([x.deps for x in packed], axis=1)
        tb = bases[dep_seg, bt] + bi
        ta = bases[dep_seg, at] + ai
        no_upd = ~layout.has_update[ar_g]
        if no_upd.any():
            keep = ~(no_upd[dep_seg] & (at == UPD))
            tb, ta = tb[keep], ta[keep]
        late.add(tb, ta)
        return ring_orders


def _has_allreduce(seg: Segment) -> bool:
    """Whether a segment's parameters are replicated (an AllReduce per shard)."""
    return seg.params > 0 and seg.config.dp >= 2


def build_iteration(model: Model, strategy: Strategy, cluster: Cluster, job: Job,
                    fabric: Fabric, rings: Rings | None = None, overlap: bool = True,
                    cache: EstimateCache | None = None, random_paths: bool = False,
                    seed: int = 0, mp_flows: str = "auto") -> IterationGraph:
    """The task graph of one training iteration (FlexNet, TopoOpt §5), built once.

    Parameters are those of :class:`IterationGraphBuilder`; keep a builder to build
    many strategies' graphs with its caches.

    Returns
    -------
    IterationGraph

    Raises
    ------
    TypeError, ConfigError
        An argument of the wrong type, or a strategy that does not fit the model or
        the cluster.
    """
    check_estimate_inputs(model, strategy, cluster, job, fabric, seed)
    return IterationGraphBuilder(model, cluster, job, fabric, rings, overlap, mp_flows, cache,
                                 random_paths, seed).build(strategy)
