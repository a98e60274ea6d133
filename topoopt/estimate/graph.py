"""The task graph of one training iteration (FlexNet, TopoOpt §5): the one builder.

:class:`IterationGraphBuilder` turns a strategy into an :class:`IterationGraph`:
arrays of compute tasks, flows and dependencies that either engine runs (the DAG
engine, :meth:`IterationGraph.dag`, or the general simulator,
:meth:`IterationGraph.workload`; :mod:`topoopt.estimate.iteration` chooses). The MCMC
planner builds thousands of graphs that differ in one operator or one segment, so
everything that depends only on a segment's config, an edge's pair of configs or a
route is computed once per builder and kept: segment compute times
(:class:`~topoopt.estimate.segments.EstimateCache`), the local positions two configs
share, AllReduce templates with their ring routes, coflow routes and per-pair routes.
Routes are *route classes* (one row per distinct route), which lets the simulator
solve max-min per class (flows of one class freeze together).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, Sequence

import numpy as np
from scipy.sparse import csr_matrix

from topoopt._require import require_choice
from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError
from topoopt.estimate._cp_kernel import critical_path
from topoopt.estimate._mp_kernel import merge_transfers
from topoopt.estimate.segments import EstimateCache, Segment, fuse_operators
from topoopt.fabrics.fabric import Fabric
from topoopt.model import Model
from topoopt.netsim.dag import DagArrays, successor_lists
from topoopt.netsim.maxmin import gather_rows
from topoopt.netsim.workload import NO_RESOURCE, FlowRoutes, Workload
from topoopt.strategy import OpConfig, Strategy
from topoopt.topology.topology import check_ring

__all__ = ["FLOW_MP", "FLOW_ALLREDUCE", "MP_FLOWS", "IterationGraph", "IterationGraphBuilder",
           "build_iteration", "ring_flow_routes"]

#: Flow kinds in :attr:`IterationGraph.flow_kind`.
FLOW_MP, FLOW_ALLREDUCE = 0, 1
#: Granularities of MP flows (see :class:`IterationGraphBuilder`).
MP_FLOWS = ("auto", "pair", "coflow")
Rings = Mapping[tuple[int, ...], Sequence[Sequence[int]]]

#: :meth:`IterationGraphBuilder._add_mp` merges a pass's transfers through a dense table
#: of (consumer segment, source, destination) while the table has at most this many
#: entries per transfer (or at most ``_DENSE_MIN``) and at most ``_DENSE_MAX`` in all,
#: else by sorting them (the table is scanned whole; both give the same arrays). Build
#: ms per call over ~100 search candidates each, 2 / 8 / 32 / 64 / 256 per transfer:
#: DLRM-128 Ideal Switch 5.9 / 5.5 / 5.2 / 5.1 / 5.8, Fat-tree 10.6 / 9.6 / 9.5 / 9.1 /
#: 9.7, Expander 9.1 / 8.7 / 9.1 / 8.5 / 9.3, TopoOpt 12.4 / 11.1 / 11.2 / 10.8 / 11.1;
#: BERT-128 Ideal Switch 24.9 / 18.8 / 17.4 / 18.4 / 20.1, Fat-tree 29.1 / 23.6 / 21.7 /
#: 24.5 / 23.2; a DLRM-16 pass's table (a few thousand entries) merges in 16 us, its
#: sort in 42.
_DENSE_PER_TRANSFER = 32
_DENSE_MIN, _DENSE_MAX = 1 << 16, 1 << 22
#: ``merge_flows`` looks for identical blocks in a pass of at least this many pair flows
#: (below it the search for them costs more than it saves).
_MERGE_MIN = 4096
#: Node kinds of an AllReduce dependency template (:class:`_ARPlan`).
_BWD, _UPD, _RING, _BAR, _GLOBAL = range(5)


@dataclass(frozen=True, eq=False)
class IterationGraph:
    """One iteration's task graph as arrays.

    Nodes ``0 .. tasks-1`` are compute tasks (forward tasks by segment, backward tasks
    in reverse segment order, then weight updates), the next ``len(flow_kind)`` nodes
    are flows (MP forward, MP backward, AllReduce rings), and the last ``barriers``
    nodes are zero-time barriers. On a server, ready tasks run in node-id order.

    Attributes
    ----------
    tasks : int
    task_server, task_duration : ndarray
        Of the compute tasks.
    flow_class : ndarray of int
        Route of each flow: a row of ``routes``.
    flow_bytes : ndarray
        Bytes per flow (an AllReduce ring: bytes per hop, ``hop_count`` hops).
    flow_latency : ndarray
        Seconds from a flow's last byte sent to its delivery.
    flow_kind : ndarray of int8
        :data:`FLOW_MP` or :data:`FLOW_ALLREDUCE`.
    hop_count : ndarray of int
        1 for MP, the ring length for AllReduce.
    barriers : int
    dep_before, dep_after : ndarray of int
        Node ``dep_after[i]`` starts after node ``dep_before[i]`` has finished.
    routes : FlowRoutes
        The route classes.
    segments : tuple of Segment
    ring_orders : tuple of tuple of int
        The ring of every AllReduce flow, in flow order.
    flow_count : ndarray of int, optional
        Identical flows each flow stands for (``merge_flows`` of
        :class:`IterationGraphBuilder`: same route class, bytes and predecessors, so
        the same times; the flow precedes all their successors); ``None``: one each.
    """

    tasks: int
    task_server: np.ndarray
    task_duration: np.ndarray
    flow_class: np.ndarray
    flow_bytes: np.ndarray
    flow_latency: np.ndarray
    flow_kind: np.ndarray
    hop_count: np.ndarray
    barriers: int
    dep_before: np.ndarray
    dep_after: np.ndarray
    routes: FlowRoutes = field(repr=False)
    segments: tuple[Segment, ...] = field(repr=False)
    ring_orders: tuple[tuple[int, ...], ...] = field(repr=False)
    flow_count: np.ndarray | None = field(default=None, repr=False)

    @property
    def nodes(self) -> int:
        return self.tasks + self.flow_kind.size + self.barriers

    @property
    def task_nodes(self) -> np.ndarray:
        return np.arange(self.tasks)

    @property
    def flow_nodes(self) -> np.ndarray:
        return self.tasks + np.arange(self.flow_kind.size)

    def counts(self) -> np.ndarray:
        """:attr:`flow_count`, ones where it is ``None``."""
        if self.flow_count is None:
            return np.ones(self.flow_kind.size, np.int64)
        return self.flow_count

    def flow_routes(self) -> FlowRoutes:
        """One route row per flow (the classes expanded)."""
        idx, counts = gather_rows(self.routes.ptr, self.flow_class)
        ptr = np.zeros(counts.size + 1, np.int64)
        np.cumsum(counts, out=ptr[1:])
        return FlowRoutes(ptr, self.routes.link[idx], self.routes.weight[idx])

    @cached_property
    def dag(self) -> DagArrays:
        """The graph as the DAG engine (:func:`topoopt.netsim.dag.run_dag`) runs it."""
        n, t, nf = self.nodes, self.tasks, self.flow_kind.size
        is_flow = np.zeros(n, bool)
        is_flow[t:t + nf] = True
        local = np.zeros(n, np.int64)
        local[t:t + nf] = np.arange(nf)
        node_res = np.full(n, -1, np.int64)
        node_res[:t] = self.task_server
        node_dur = np.zeros(n)
        node_dur[:t] = self.task_duration
        succ_ptr, succ = successor_lists(np.asarray(self.dep_before, np.int64),
                                         np.asarray(self.dep_after, np.int64), n)
        return DagArrays(n, is_flow, local, self.flow_nodes, 8.0 * self.flow_bytes,
                         self.flow_latency, self.flow_class, self.routes, node_res, node_dur,
                         succ_ptr, succ,
                         np.bincount(self.dep_after, minlength=n), None, self.flow_count)

    @cached_property
    def workload(self) -> Workload:
        """The graph as a :class:`~topoopt.netsim.Workload` for the general simulator
        (:func:`topoopt.netsim.simulate`, the reference engine); a flow standing for
        ``k`` identical flows becomes ``k`` flows, each with its dependencies."""
        count = self.counts()
        routes = self.flow_routes()
        nbytes, latency = self.flow_bytes, self.flow_latency
        before, after = self.dep_before, self.dep_after
        if (count != 1).any():
            t, nf = self.tasks, count.size
            copy = np.repeat(np.arange(nf), count)
            idx, counts = gather_rows(routes.ptr, copy)
            routes = FlowRoutes(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                                routes.link[idx], routes.weight[idx])
            nbytes, latency = nbytes[copy], latency[copy]
            # node -> its first new id and its copies
            first = np.arange(self.nodes, dtype=np.int64)
            copies = np.ones(self.nodes, np.int64)
            first[t:t + nf] = t + np.cumsum(count) - count
            first[t + nf:] += int(count.sum()) - nf
            copies[t:t + nf] = count
            per = copies[before] * copies[after]
            k = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
            ca = np.repeat(copies[after], per)
            before = np.repeat(first[before], per) + k // ca
            after = np.repeat(first[after], per) + k % ca
        w = Workload()
        w.add_tasks(self.task_duration, self.task_server)
        w.add_flows(nbytes, routes, latency=latency)
        if self.barriers:
            w.add_tasks(np.zeros(self.barriers), NO_RESOURCE)
        w.add_dependencies(before, after)
        return w


@dataclass(frozen=True)
class _ARPlan:
    """A config's AllReduce: its rings (route class, latency, length, bytes factor
    ``2(k-1)/k`` and rings per shard) and the dependencies between its members'
    backward/update tasks, rings and barriers as (kind, index) pairs."""

    orders: tuple[tuple[int, ...], ...]
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

    @cached_property
    def packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ring ints, ring floats, dependencies)`` as one array each, for
        :meth:`IterationGraphBuilder.build` to join many plans in few calls: rows
        (class, length); (factor, count, latency); (before kind, signed before
        index, after kind, signed after index), a barrier's index negated (its node
        is ``-1 - number``, a placeholder)."""
        sign_b = np.where((self.before_type == _BAR) | (self.before_type == _GLOBAL), -1, 1)
        sign_a = np.where((self.after_type == _BAR) | (self.after_type == _GLOBAL), -1, 1)
        return (np.stack([self.ring_class, self.ring_length]),
                np.stack([self.ring_factor, self.ring_count, self.ring_latency]),
                np.stack([self.before_type, sign_b * self.before_index, self.after_type,
                          sign_a * self.after_index]))


class _PairPlan:
    """What an MP edge from config ``cu`` to ``cv`` adds to a graph, apart from its
    segments' node offsets and its activation: its forward transfers (the pattern of
    :meth:`~topoopt.estimate.segments.EstimateCache.pattern`) and the positions both
    configs share (a dependency without a transfer).

    ``ints`` rows, per transfer: forward key ``src x n + dst``, backward key
    ``dst x n + src``, position of ``src`` in ``cu``, position of ``dst`` in ``cv``.
    ``shared`` rows, per shared server twice: the dependencies' before and after
    positions, ``[lu, lv]`` and ``[lv, lu]``."""

    __slots__ = ("cu", "cv", "overlap", "ints", "size", "lu", "lv", "shared")

    def __init__(self, cu: OpConfig, cv: OpConfig, src: np.ndarray, dst: np.ndarray,
                 overlap: np.ndarray, pu: np.ndarray, pv: np.ndarray, lu: np.ndarray,
                 lv: np.ndarray, n: int) -> None:
        self.cu, self.cv, self.overlap = cu, cv, overlap
        self.size = int(overlap.size)
        self.ints = np.stack([src * n + dst, dst * n + src, pu[src], pv[dst]])
        self.lu, self.lv = lu, lv
        self.shared = np.stack([np.concatenate([lu, lv]), np.concatenate([lv, lu])])

    @staticmethod
    def shared_deps(pairs: list[tuple[int, int]], plans: list["_PairPlan"],
                    fwd_base: np.ndarray, bwd_base: np.ndarray, before: list,
                    after: list) -> None:
        """Append the same-server dependencies of segment ``pairs`` (their plans):
        per pair, producer forward -> consumer forward and consumer backward ->
        producer backward on every server both use, pair after pair."""
        m = np.fromiter((p.lu.size for p in plans), np.int64, len(plans))
        pu, pv = np.array(pairs, np.int64).T
        local = np.concatenate([p.shared for p in plans], axis=1)
        reps = np.repeat(m, 2)
        before.append(np.repeat(np.stack([fwd_base[pu], bwd_base[pv]], axis=1).ravel(), reps)
                      + local[0])
        after.append(np.repeat(np.stack([fwd_base[pv], bwd_base[pu]], axis=1).ravel(), reps)
                     + local[1])


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


def ring_flow_routes(fabric: Fabric, orders: Sequence[Sequence[int]], random: bool = False,
                     seed: int | None = 0) -> tuple[FlowRoutes, np.ndarray]:
    """One coupled flow per ring: its route is every hop's route (weights summed
    where hops share a link); its latency is the slowest hop's.

    Returns
    -------
    routes : FlowRoutes
        One row per ring.
    hop_latency : ndarray
        Largest hop path latency per ring, seconds.
    """
    hops_src = np.concatenate([np.asarray(o, np.int64) for o in orders])
    hops_dst = np.concatenate([np.roll(np.asarray(o, np.int64), -1) for o in orders])
    owner = np.repeat(np.arange(len(orders)), [len(o) for o in orders])
    return fabric.coupled_route(hops_src, hops_dst, owner, np.ones(owner.size), len(orders),
                                random=random, seed=seed)


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
        links per route, cheap and exact), coflows elsewhere. Measured on
        DLRM-128 (hybrid): equal iteration times to 1e-15 on the Ideal Switch and
        the Fat-tree; on an expander per-pair flows over uneven multi-hop routes end
        at thousands of distinct times (10,848 events, ~100 s) against 65 events and
        0.04 s with coflows, iteration times within 0.05%.
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
        together and share every rate, so one node runs them, exactly (DLRM-128 on
        the Ideal Switch, tables sharded over every server: a graph of a million
        flows becomes one of 40 thousand). The planner's engine sets it; the default
        keeps one node per flow.
    mp_barriers : bool
        Join a consumer's producers that share a config through one barrier per
        source, and alias their gradients (see above; the same times, to 1e-12 with
        coflows: 64 tables sharded over every server of DLRM-128 and a data-parallel
        interaction make, on the Ideal Switch, a graph of 0.14 million dependencies
        instead of 2.2 million, built in 7 ms instead of 100). ``False`` keeps a dependency per (producer
        task, flow) and a flow per (producer, pair), the check.
    """

    #: Route entries and coflow routes kept before every route-derived cache is dropped,
    #: and config entries before the per-config caches are (memory bounds on long runs).
    route_limit = 5_000_000
    coflow_limit = 50_000
    config_limit = 100_000

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
        self._last_fused: tuple | None = None   # (configs, fuse_operators of them)
        self._last_loads: tuple | None = None   # (configs, _mp_loads of them)
        self._patterns: dict = {}  # (id(cu), id(cv)) -> [cu, cv, server, link loads]
        self._cfg: dict = {}       # id(cfg) -> (cfg, servers array, pos row, token)
        self._tokens: dict = {}    # cfg -> its number (by value)
        self._common: dict = {}    # (id(cu), id(cv)) -> _PairPlan
        self._ar: dict = {}        # id(cfg) -> (cfg, AllReduce template)
        self._ar_load: dict = {}   # id(cfg) -> (cfg, link bytes per shard byte)
        self._every = None         # (pairs, their routes), for the two bounds below
        self._pairs_csr = None     # (links x pairs) routes, for link_bound
        self._rate = None          # (n, n) bits/s a pair's flow can reach alone
        self._cp: dict = {}        # (id(cu), id(cv)) -> (cu, cv, pool offset)
        self._ar_cp: dict = {}     # id(cfg) -> (cfg, (pool offset, rings))
        self._cp_pool = np.empty(1024)   # pattern and ring vectors of critical_path_bound
        self._cp_used = 0
        n = self.n
        src, dst, cap = fabric.src, fabric.dst, fabric.capacity
        self._out_bps = np.bincount(src[src < n], weights=cap[src < n], minlength=n)
        self._in_bps = np.bincount(dst[dst < n], weights=cap[dst < n], minlength=n)
        self.reset_routes()

    def reset_routes(self) -> None:
        """Drop every route-derived cache (the route classes start afresh)."""
        self.routes = _RouteStore()
        self._rings: dict = {}      # ring order -> (class, hop latency)
        self._coflows: dict = {}    # member (src, dst, share) bytes -> (class, latency)
        self._pairs = np.full(self.n * self.n, -1, np.int64)
        self._pair_lat = np.zeros(self.n * self.n)
        self._ar.clear()
        self._ar_load.clear()
        self._cp.clear()
        self._ar_cp.clear()
        self._cp_used = 0

    @property
    def over_limits(self) -> bool:
        """Whether the route caches have grown past their bounds (see :meth:`build`)."""
        return self.routes.entries > self.route_limit or len(self._coflows) > self.coflow_limit

    # -- cached pieces --------------------------------------------------------------
    def _config(self, cfg: OpConfig):
        """(cfg, its servers, each server's position or -1, a number per distinct
        config: equal configs built apart get the same)."""
        hit = self._cfg.get(id(cfg))
        if hit is None or hit[0] is not cfg:
            srv = np.asarray(cfg.servers, np.int64)
            pos = np.full(self.n, -1, np.int64)
            pos[srv] = np.arange(srv.size)
            token = self._tokens.setdefault(cfg, len(self._tokens))
            hit = self._cfg[id(cfg)] = (cfg, srv, pos, token)
        return hit

    def _pair(self, cu: OpConfig, cv: OpConfig) -> "_PairPlan":
        """What an edge from config ``cu`` to ``cv`` adds to a graph apart from its
        segments' node offsets and its activation (cached per config pair)."""
        key = (id(cu), id(cv))
        hit = self._common.get(key)
        if hit is None or hit.cu is not cu or hit.cv is not cv:
            pu = self._config(cu)[2]
            pv = self._config(cv)[2]
            common = np.flatnonzero((pu >= 0) & (pv >= 0))
            hit = self._common[key] = _PairPlan(cu, cv, *self.cache.pattern(cu, cv), pu, pv,
                                                pu[common], pv[common], self.n)
        return hit

    def _shared(self, cu: OpConfig, cv: OpConfig):
        """Local positions (in u, in v) of the servers both configs use."""
        hit = self._pair(cu, cv)
        return hit.lu, hit.lv

    def _ring(self, order: tuple[int, ...]):
        hit = None if self.random_paths else self._rings.get(order)
        if hit is None:
            routes, lat = ring_flow_routes(self.fabric, [order], self.random_paths, self.seed)
            hit = (int(self.routes.add(routes)[0]), float(lat[0]))
            if not self.random_paths:
                self._rings[order] = hit
        return hit

    def _allreduce(self, cfg: OpConfig) -> _ARPlan:
        """The AllReduce of a config's parameter shards, as a template (cached)."""
        hit = self._ar.get(id(cfg))
        if hit is not None and hit[0] is cfg:
            return hit[1]
        pos = self._config(cfg)[2]
        orders_out, cls, lat, glen, frac = [], [], [], [], []
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
                orders_out.append(order)
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
        plan = _ARPlan(tuple(orders_out), i64(cls), np.asarray(lat, float), i64(glen),
                       np.asarray([f for f, _ in frac]), np.asarray([r for _, r in frac], float),
                       nbar, i64(bt), i64(bi), i64(at), i64(ai))
        if not self.random_paths:
            self._ar[id(cfg)] = (cfg, plan)
        return plan

    def _ar_link_bytes(self, cfg: OpConfig) -> np.ndarray:
        """Bytes the AllReduce of ``cfg``'s shards puts on each link, per shard byte
        (its rings' per-hop bytes over their routes, as :meth:`build` sends them)."""
        hit = self._ar_load.get(id(cfg))
        if hit is not None and hit[0] is cfg:
            return hit[1]
        plan = self._allreduce(cfg)
        routes = self.routes.view()
        idx, counts = gather_rows(routes.ptr, plan.ring_class)
        per_hop = np.repeat(plan.ring_factor / plan.ring_count, counts)
        load = np.bincount(routes.link[idx], weights=per_hop * routes.weight[idx],
                           minlength=self.fabric.capacity.size)
        self._ar_load[id(cfg)] = (cfg, load)
        return load

    def _every_pair(self) -> tuple[np.ndarray, FlowRoutes]:
        """``(pairs, routes)``: the pairs ``s * n + d`` with ``s != d`` and their routes
        (routed once, for the two bounds that read them)."""
        if self._every is None:
            n = self.n
            pairs = np.flatnonzero(np.arange(n * n) // n != np.arange(n * n) % n)
            self._every = (pairs, self.fabric.route(pairs // n, pairs % n))
        return self._every

    def _pair_routes(self):
        """Every (source, destination) pair's route as a sparse (links x pairs) matrix."""
        if self._pairs_csr is None:
            n = self.n
            pairs, r = self._every_pair()
            ptr = np.zeros(n * n + 1, np.int64)
            ptr[1:][pairs] = np.diff(r.ptr)
            np.cumsum(ptr, out=ptr)
            # stored transposed (links x pairs): a traffic matrix's link loads in one product
            self._pairs_csr = csr_matrix((r.weight, r.link, ptr),
                                         shape=(n * n, self.fabric.capacity.size)).T.tocsr()
        return self._pairs_csr

    def link_bound(self, strategy: Strategy) -> float:
        """A lower bound on ``strategy``'s iteration time, before its graph is built:
        the busiest link's bits over its capacity, :func:`~topoopt.netsim.dag.
        link_load_bound` of the graph (the same MP transfers on their pairs' routes,
        the same rings) computed from a traffic matrix instead.

        Forwarded traffic piled onto a few fibres (a TopoOpt shard, an Expander) shows
        here; on DLRM-16's TopoOpt shard, half the candidates the search builds are
        rejected by it. Needs the fabric's own routes (``random_paths=False``).

        Raises
        ------
        ValueError
            With ``random_paths``: each graph draws its own paths.
        """
        if self.random_paths:
            raise ValueError("link_bound needs the fabric's routes (random_paths=False)")
        segs, _ = self._fused(strategy)
        cap = self.fabric.capacity
        load = self._mp_loads(strategy, links=True)[1].copy()
        for seg in segs:
            cfg = seg.config
            if seg.params > 0 and cfg.dp >= 2:
                load += self._ar_link_bytes(cfg) * (seg.params / cfg.mp * self.dtype_bytes)
        live = cap > 0
        if not live.any():
            return 0.0
        return float((8.0 * load[live] / cap[live]).max())

    def _pair_classes(self, src: np.ndarray, dst: np.ndarray):
        if self.random_paths:
            r = self.fabric.route(src, dst, random=True, seed=self.seed)
            return self.routes.add(r), _row_latency(self.fabric, r)
        key = src * self.n + dst
        cls = self._pairs[key]
        miss = cls < 0
        if miss.any():
            new = np.unique(key[miss])
            r = self.fabric.route(new // self.n, new % self.n)
            self._pair_lat[new] = _row_latency(self.fabric, r)
            self._pairs[new] = self.routes.add(r)
            cls = self._pairs[key]
        return cls, self._pair_lat[key]

    def _coflow_classes(self, src, dst, member, share, groups: int):
        """Route class and latency of each coflow (members' (src, dst, share) as key)."""
        if self.random_paths:
            routes, lat = self.fabric.coupled_route(src, dst, member, share, groups,
                                                    random=True, seed=self.seed)
            return self.routes.add(routes), lat
        order = np.argsort(member, kind="stable")
        edges = (24 * np.concatenate([[0], np.cumsum(np.bincount(member, minlength=groups))])
                 ).tolist()
        # one (src, dst, share bits) row per member, a coflow's rows one bytes key
        rows = np.empty((order.size, 3), np.int64)
        rows[:, 0] = src[order]
        rows[:, 1] = dst[order]
        rows[:, 2] = np.asarray(share, float)[order].view(np.int64)
        blob = rows.tobytes()
        cls = np.empty(groups, np.int64)
        lat = np.empty(groups)
        missing, keys = [], []
        get = self._coflows.get
        for g in range(groups):
            key = blob[edges[g]:edges[g + 1]]
            hit = get(key)
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
            routes, mlat = self.fabric.coupled_route(src[take], dst[take], renum[member[take]],
                                                     share[take], miss.size)
            new = self.routes.add(routes)
            cls[miss] = new
            lat[miss] = mlat
            for k, c, x in zip(keys, new.tolist(), mlat.tolist()):
                self._coflows[k] = (c, x)
        return cls, lat

    # -- a bound ----------------------------------------------------------------------
    def _fused(self, strategy: Strategy):
        """``fuse_operators`` of ``strategy``, the last one kept: the search asks for a
        candidate's bound and then, if it passes, its graph."""
        key = strategy.configs
        if self._last_fused is None or self._last_fused[0] != key:
            self._last_fused = (key, fuse_operators(self.model, strategy, self.cluster,
                                                    self.job, self.cache))
        return self._last_fused[1]

    def _mp_loads(self, strategy: Strategy, links: bool = False):
        """``(bytes each server sends, bytes on each link or None)`` of ``strategy``'s MP
        transfers, both passes: per (producer config, consumer config) pattern
        (:meth:`~topoopt.estimate.segments.EstimateCache.pattern`), its loads per unit
        scaled by its edges' activations; the last strategy's kept (its two bounds)."""
        key = strategy.configs
        last = self._last_loads
        if last is not None and last[0] == key:
            scale, server, link = last[1:]
        else:
            segs, seg_of = self._fused(strategy)
            scale = {}
            for u, v in self.model.edges:
                gu, gv = int(seg_of[u]), int(seg_of[v])
                tensor = self.cache.activation[u]
                if gu < 0 or gu == gv or tensor <= 0:
                    continue
                cu, cv = segs[gu].config, segs[gv].config
                k = (id(cu), id(cv))
                hit = scale.get(k)
                # the edge's bytes: the pattern's overlaps x (tensor / mp), as edge() has
                scale[k] = (cu, cv, tensor / cu.mp + (hit[2] if hit is not None else 0.0))
            server, link = np.zeros(self.n), None
            for cu, cv, x in scale.values():
                server += x * self._pattern_loads(cu, cv, False)[0]
        if links and link is None:
            link = np.zeros(self.fabric.capacity.size)
            for cu, cv, x in scale.values():
                link += x * self._pattern_loads(cu, cv, True)[1]
        self._last_loads = (key, scale, server, link)
        return server, link

    def _pattern_loads(self, cu: OpConfig, cv: OpConfig, links: bool):
        """Per unit of scale, the bytes each server sends (forward and gradients) and,
        with ``links``, each link carries, for the transfer pattern of (cu, cv)."""
        key = (id(cu), id(cv))
        hit = self._patterns.get(key)
        if hit is None or hit[0] is not cu or hit[1] is not cv:
            if len(self._patterns) >= self.config_limit:
                self._patterns.clear()
            src, dst, overlap = self.cache.pattern(cu, cv)
            n = self.n
            hit = [cu, cv, np.bincount(src, overlap, n) + np.bincount(dst, overlap, n), None]
            self._patterns[key] = hit
        if links and hit[3] is None:
            src, dst, overlap = self.cache.pattern(cu, cv)   # (memoized)
            n = self.n
            matrix = np.bincount(np.concatenate([src * n + dst, dst * n + src]),
                                 weights=np.concatenate([overlap, overlap]), minlength=n * n)
            hit[3] = self._pair_routes() @ matrix
        return hit[2], hit[3]

    def _pair_rate(self) -> tuple[np.ndarray, np.ndarray]:
        """``(rate, latency)``, each ``(n, n)``: the most bits/s a flow from server ``s``
        to ``d`` can get on its route, ``min(capacity / weight)`` over its links
        (``inf`` on the diagonal, and where a link of the route is down: the
        simulation reports such a flow), and the route's latency."""
        if self._rate is None:
            n = self.n
            off, r = self._every_pair()
            rate = np.full(n * n, np.inf)
            latency = np.zeros(n * n)
            latency[off] = _row_latency(self.fabric, r)
            rate[off] = _alone_rate(self.fabric.capacity, r.link, r.weight, np.diff(r.ptr))
            self._rate = (rate.reshape(n, n), latency.reshape(n, n))
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

    def _cp_pattern(self, cu: OpConfig, cv: OpConfig) -> int:
        """Per unit of scale, the transfer pattern of (cu, cv) as the critical path
        sees it, pooled (its offset): per position of ``cv``, the slowest transfer into
        it alone (seconds, ``-inf`` where none), the bytes into it, ``0`` where it
        shares a server with ``cu`` (a dependency with no transfer) else ``-inf``, and
        the least latency of a transfer into it; then the same four per position of
        ``cu`` for the gradients back."""
        key = (id(cu), id(cv))
        hit = self._cp.get(key)
        if hit is None or hit[0] is not cu or hit[1] is not cv:
            src, dst, overlap = self.cache.pattern(cu, cv)
            pu, pv = self._config(cu)[2], self._config(cv)[2]
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
            lu, lv = self._shared(cu, cv)
            near_u, near_v = np.full(ku, -np.inf), np.full(kv, -np.inf)
            near_u[lu] = 0.0
            near_v[lv] = 0.0
            at = self._pooled(slow_f, np.bincount(pv[dst], overlap, kv), near_v,
                              np.where(np.isfinite(late_f), late_f, 0.0),
                              slow_b, np.bincount(pu[src], overlap, ku), near_u,
                              np.where(np.isfinite(late_b), late_b, 0.0))
            hit = self._cp[key] = (cu, cv, at)
        return hit[2]

    def _cp_allreduce(self, cfg: OpConfig) -> tuple[int, int]:
        """``(offset, rings)`` of ``cfg``'s AllReduce rings in the pool: each ring's
        seconds per shard byte alone on its route, then their latencies, then their
        replica groups."""
        hit = self._ar_cp.get(id(cfg))
        if hit is None or hit[0] is not cfg:
            plan = self._allreduce(cfg)
            routes = self.routes.view()
            idx, counts = gather_rows(routes.ptr, plan.ring_class)
            rate = _alone_rate(self.fabric.capacity, routes.link[idx], routes.weight[idx],
                               counts)
            group = np.repeat(np.arange(cfg.mp), _rings_per_group(plan.ring_count))
            at = self._pooled(8.0 * plan.ring_factor / plan.ring_count / rate,
                              plan.ring_latency, group.astype(float))
            hit = self._ar_cp[id(cfg)] = (cfg, (at, plan.ring_class.size))
        return hit[1]

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
        this one sees the pipeline's depth: in a DLRM-16 plan's descents it rejects
        four in ten of the candidates the other bounds let through to be built and then
        stopped by the simulation. Needs the fabric's own routes
        (``random_paths=False``).

        Raises
        ------
        ValueError
            With ``random_paths``: each graph draws its own paths.
        """
        if self.random_paths:
            raise ValueError("critical_path_bound needs the fabric's routes "
                             "(random_paths=False)")
        if len(self._cp) + len(self._ar_cp) > self.config_limit:
            self._cp.clear()
            self._ar_cp.clear()
            self._cp_used = 0
        segs, seg_of = self._fused(strategy)
        nseg = len(segs)
        activation = self.cache.activation
        # (producer segment, consumer segment) -> scale: the edges between two segments
        # are one flow per pair, their bytes added
        scale: dict[tuple[int, int], float] = {}
        for u, v in self.model.edges:
            gu, gv = int(seg_of[u]), int(seg_of[v])
            if gu < 0 or gu == gv:
                continue
            x = max(activation[u], 0.0) / segs[gu].config.mp
            scale[(gu, gv)] = scale.get((gu, gv), 0.0) + x
        pairs = list(scale)
        pat = [self._cp_pattern(segs[gu].config, segs[gv].config) for gu, gv in pairs]
        ar_off = np.full(nseg, -1, np.int64)
        ar_rings = np.zeros(nseg, np.int64)
        for g, seg in enumerate(segs):
            if seg.params > 0 and seg.config.dp >= 2:
                ar_off[g], ar_rings[g] = self._cp_allreduce(seg.config)
        i64 = (lambda it: np.fromiter(it, np.int64, nseg))
        configs = [seg.config for seg in segs]
        link = np.array(pairs, np.int64).reshape(-1, 2)
        total = critical_path(
            i64(len(c.servers) for c in configs), np.array([x.fwd for x in segs]),
            np.array([x.bwd for x in segs]), np.array([x.update for x in segs]),
            i64(c.mp for c in configs), i64(c.dp for c in configs),
            np.concatenate([self._config(c)[1] for c in configs]), self._in_bps,
            np.ascontiguousarray(link[:, 0]), np.ascontiguousarray(link[:, 1]),
            np.fromiter(scale.values(), float, len(pairs)), np.asarray(pat, np.int64),
            self._cp_pool, ar_off, ar_rings,
            np.array([x.params / x.config.mp * self.dtype_bytes for x in segs]), self.overlap)
        # (1 - 1e-9): the simulation adds in another order; a bound must not pass it
        return float(total) * (1.0 - 1e-9)

    def lower_bound(self, strategy: Strategy) -> float:
        """A lower bound on ``strategy``'s iteration time on this fabric, without building
        its graph: the busiest server's compute (its tasks run one at a time), and the
        bytes a server must send or receive -- its MP transfers and its share of every
        ring AllReduce, ``2(k-1)/k`` of its shard -- over the capacity of its links (host
        forwarding only adds bytes)."""
        n = self.n
        segs, seg_of = self._fused(strategy)
        srvs = [self._config(seg.config)[1] for seg in segs]
        where = np.concatenate(srvs) if segs else np.empty(0, np.int64)
        count = np.fromiter((s.size for s in srvs), np.int64, len(srvs))
        # per server, its segments' terms summed in segment order (bincount adds in input
        # order, as a loop of ``x[servers] += term`` would)
        compute = np.bincount(where, np.repeat(
            [seg.fwd + seg.bwd + seg.update for seg in segs], count), n)
        nbytes = np.bincount(where, np.repeat(
            [2.0 * (c.dp - 1) / c.dp * seg.params / c.mp * self.dtype_bytes
             if seg.params > 0 and c.dp >= 2 else 0.0
             for seg, c in ((seg, seg.config) for seg in segs)], count), n)
        # MP: forward to the consumer, and the gradient back
        sent = recv = nbytes + self._mp_loads(strategy)[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            wire = np.maximum(np.where(self._out_bps > 0, sent * 8 / self._out_bps, 0.0),
                              np.where(self._in_bps > 0, recv * 8 / self._in_bps, 0.0))
        # (1 - 1e-12): the simulator sums in another order; a bound must not pass it
        return float(max(compute.max(initial=0.0), wire.max(initial=0.0))) * (1.0 - 1e-12)

    # -- the graph ------------------------------------------------------------------
    def build(self, strategy: Strategy) -> IterationGraph:
        """The task graph of ``strategy`` (see the class docstring)."""
        model, n = self.model, self.n
        if len(strategy.configs) != len(model.operators):
            raise ConfigError("strategy", len(strategy.configs),
                              f"needs one config per operator ({len(model.operators)})")
        if self.over_limits:
            self.reset_routes()
        if len(self._cfg) + len(self._common) > self.config_limit:
            self._cfg.clear()
            self._common.clear()
            self._tokens.clear()
        segs, seg_of = self._fused(strategy)
        nseg = len(segs)
        info = [self._config(s.config) for s in segs]
        sizes = np.fromiter((x[1].size for x in info), np.int64, nseg)
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
        ntask = 2 * total + int(upd_sizes.sum())
        srv = np.concatenate([x[1] for x in info]) if nseg else np.empty(0, np.int64)
        seg_idx = np.repeat(np.arange(nseg), sizes)
        upd_sel = has_update[seg_idx]
        # backward tasks: the segments' blocks in reverse order
        res = np.concatenate([srv, *[x[1] for x in reversed(info)], srv[upd_sel]])
        dur = np.concatenate([fwd_t[seg_idx], np.repeat(bwd_t[::-1], sizes[::-1]),
                              upd_t[seg_idx][upd_sel]])
        pos_mat = np.stack([x[2] for x in info]) if nseg else np.empty((0, n), np.int64)
        fwd_all = np.arange(total)
        bwd_all = bwd_base[seg_idx] + (fwd_all - fwd_base[seg_idx])
        before = [fwd_all]
        after = [bwd_all]

        # MP transfers and same-server data dependencies between segments. Per edge
        # across segments, only its grouping is decided here (scalars); its transfers
        # come from its config pair's cached plan (_pair), all edges' arrays put
        # together once and offset by their segments' nodes.
        gu_of, gv_of = seg_of[self._edge_u], seg_of[self._edge_v]
        cross = np.flatnonzero((gu_of >= 0) & (gu_of != gv_of))
        activation = self.cache.activation
        edge_u = self._edge_u
        seg_pairs: dict[tuple[int, int], _PairPlan] = {}
        # forward transfers by (consumer, producer config, consumer config): one pattern
        fwd: dict[tuple, list] = {}      # key -> [first edge, producer segments]
        t_plans: list[_PairPlan] = []    # per edge with transfers (edge order) ...
        t_seg: list[tuple[int, int]] = []
        t_scale: list = []
        t_group: list[int] = []          # ... its forward group
        t_first: list[bool] = []         # ... the first of its group
        outs = [0] * nseg                # edges with transfers out of each segment
        for e, gu, gv in zip(cross.tolist(), gu_of[cross].tolist(), gv_of[cross].tolist()):
            cu = segs[gu].config
            plan = seg_pairs.get((gu, gv))
            if plan is None:
                plan = seg_pairs[(gu, gv)] = self._pair(cu, segs[gv].config)
            tensor = activation[edge_u[e]]
            if tensor <= 0:     # no transfer (as edge_transfers has it)
                continue
            if plan.size == 0:
                continue
            key = (gv, info[gu][3], info[gv][3]) if self.mp_barriers else (e,)
            group = fwd.get(key)
            if group is None:
                group = fwd[key] = [len(t_plans), [gu]]
                t_first.append(True)
            else:
                group[1].append(gu)
                t_first.append(False)
            t_group.append(len(fwd) - 1 if t_first[-1] else t_group[group[0]])
            t_plans.append(plan)
            t_seg.append((gu, gv))
            t_scale.append(tensor / cu.mp)
            outs[gu] += 1
        # Backward: a producer whose one consumer sends it the same gradients as another
        # producer's (DLRM's tables of one config) is that producer's alias: its flows
        # are the other's, counted twice (per-pair flows) or twice as large (coflows).
        aliases: dict[int, list[int]] = {}
        alias_ok = (self.mp_barriers and not self.random_paths
                    and (self.mp_flows == "coflow" or self.merge_flows))
        firsts: dict[tuple, int] = {}
        b_keep = [True] * len(t_plans)
        if alias_ok:
            for i, (gu, gv) in enumerate(t_seg):
                if outs[gu] == 1:
                    # equal configs, equal activation per shard: equal transfers
                    akey = (gv, info[gu][3], info[gv][3], t_scale[i])
                    rep = firsts.get(akey)
                    if rep is not None:
                        aliases[rep].append(gu)
                        b_keep[i] = False
                        continue
                    firsts[akey] = gu
                    aliases[gu] = []
        aliases = {r: al for r, al in aliases.items() if al}
        # placeholders -1 - i for barrier i (numbered once the flows are counted);
        # barrier 0: the global one (overlap=False)
        nbar = 0 if self.overlap else 1
        bar_b: list[np.ndarray] = []
        bar_a: list[np.ndarray] = []
        joins: dict[tuple, int] = {}     # (producer segments, config) -> first barrier
        # a group's transfers wait for its producer's task, or for a barrier per
        # position of the producers' (shared) config: node base + sign x position
        g_base = np.empty(len(fwd), np.int64)
        g_sign = np.ones(len(fwd), np.int64)
        for i, gus in fwd.values():
            number, gu = t_group[i], t_seg[i][0]
            producers = tuple(sorted(set(gus)))
            if len(producers) == 1:
                g_base[number] = fwd_base[gu]
                continue
            size = int(sizes[gu])
            jkey = (producers, info[gu][3])
            first = joins.get(jkey)
            if first is None:
                first = joins[jkey] = nbar
                nbar += size
                bars = -1 - (first + np.arange(size))
                # each producer's tasks -> the barriers (producer by producer)
                bar_b.append((fwd_base[list(producers)][:, None] + np.arange(size)).ravel())
                bar_a.append(np.tile(bars, len(producers)))
            g_base[number], g_sign[number] = -1 - first, -1
        pairs = sorted(seg_pairs)
        if pairs:
            _PairPlan.shared_deps(pairs, [seg_pairs[x] for x in pairs], fwd_base, bwd_base,
                                  before, after)

        # Flows: MP (forward, backward), then AllReduce rings; barriers after them.
        flows = _Flows(ntask)
        if t_plans:
            nn = n * n
            lens = np.fromiter((p.size for p in t_plans), np.int64, len(t_plans))
            tg = np.array(t_seg, np.int64)
            ints = np.concatenate([p.ints for p in t_plans], axis=1)
            # the transfers' bytes, bit for bit as EstimateCache.edge: overlap x scale
            nbytes = (np.concatenate([p.overlap for p in t_plans])
                      * np.repeat(np.array(t_scale, float), lens))
            grp = np.array(t_group, np.int64)
            is_first = np.array(t_first)
            first = np.repeat(is_first, lens)
            f_keys = (np.repeat(tg[:, 1] * nn, lens) + ints[0])[first]
            f_pred = (np.repeat(g_base[grp], lens)
                      + np.repeat(g_sign[grp], lens) * ints[2])[first]
            if len(fwd) == len(t_plans):
                f_bytes = nbytes
            else:   # summed over a group's edges in edge order (as the old loop did)
                f_lens = lens[is_first]
                f_start = np.cumsum(f_lens) - f_lens
                t_start = np.cumsum(lens) - lens
                at = np.repeat(f_start[grp] - t_start, lens) + np.arange(nbytes.size)
                f_bytes = np.bincount(at, weights=nbytes, minlength=f_keys.size)
            if not all(b_keep):
                keep = np.array(b_keep)
                elem = np.repeat(keep, lens)
                ints, nbytes = ints[:, elem], nbytes[elem]
                lens, tg = lens[keep], tg[keep]
            b_keys = np.repeat(tg[:, 0] * nn, lens) + ints[1]
            b_pred = np.repeat(bwd_base[tg[:, 1]], lens) + ints[3]
            consumers = [{gv for _, gv in seg_pairs}, {gu for gu, _ in seg_pairs}]
            nbar = self._add_mp(flows, f_keys, f_bytes, f_pred, fwd_base, pos_mat, before,
                                after, len(consumers[0]), None, nbar, sizes)
            nbar = self._add_mp(flows, b_keys, nbytes, b_pred, bwd_base, pos_mat, before,
                                after, len(consumers[1]), aliases, nbar, sizes)

        # AllReduce: per segment, its config's template instantiated at the segment's
        # node ids (backward and update tasks, rings, barriers).
        ar = [(g, self._allreduce(s.config)) for g, s in enumerate(segs)
              if s.params > 0 and s.config.dp >= 2]
        late_b: list[np.ndarray] = bar_b
        late_a: list[np.ndarray] = bar_a
        ring_orders: list[tuple[int, ...]] = []
        ar_g = np.fromiter((g for g, _ in ar), np.int64, len(ar))
        if ar:
            plans = [p for _, p in ar]
            for p in plans:
                ring_orders.extend(p.orders)
            packed = [p.packed for p in plans]
            nring, nbars, tlen = np.array([(p.ring_class.size, p.barriers, p.before_type.size)
                                           for p in plans], np.int64).T
            shard_bytes = np.array([segs[g].params / segs[g].config.mp * self.dtype_bytes
                                    for g, _ in ar])
            ring_seg = np.repeat(np.arange(len(ar)), nring)
            ring_int = np.concatenate([x[0] for x in packed], axis=1)
            frac, nr, lat = np.concatenate([x[1] for x in packed], axis=1)
            ids = flows.add(ring_int[0], frac * shard_bytes[ring_seg] / nr, lat,
                            FLOW_ALLREDUCE, ring_int[1])
            dep_seg = np.repeat(np.arange(len(ar)), tlen)
            ring_off = ids[0] + np.cumsum(nring) - nring
            bar_off = nbar + np.cumsum(nbars) - nbars   # barrier numbers, ids set below
            nbar += int(nbars.sum())
            bases = np.stack([bwd_base[ar_g], upd_base[ar_g], ring_off,
                              -1 - bar_off, np.full(len(ar), -1)], axis=1)
            # barriers get placeholders -1 - number (fixed once the flows are counted)
            bt, bi, at, ai = np.concatenate([x[2] for x in packed], axis=1)
            tb = bases[dep_seg, bt] + bi
            ta = bases[dep_seg, at] + ai
            no_upd = ~has_update[ar_g]
            if no_upd.any():
                keep = ~(no_upd[dep_seg] & (at == _UPD))
                tb, ta = tb[keep], ta[keep]
            late_b.append(tb)
            late_a.append(ta)
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
        nf = flows.count
        dep_b = np.concatenate(before + late_b)
        dep_a = np.concatenate(after + late_a)
        # placeholder -1 - i -> barrier i, numbered after the flows
        for dep in (dep_b, dep_a):
            neg = dep < 0
            dep[neg] = ntask + nf - 1 - dep[neg]
        *flow_arrays, count = flows.arrays()
        return IterationGraph(ntask, res, dur, *flow_arrays, nbar, dep_b, dep_a,
                              self.routes.view(), segs, tuple(ring_orders),
                              count if flows.merged else None)

    def _add_mp(self, flows: "_Flows", keys: np.ndarray, nbytes: np.ndarray, preds: np.ndarray,
                succ_base: np.ndarray, pos_mat: np.ndarray, before: list, after: list,
                consumers: int, aliases: dict | None, nbar: int, seg_sizes: np.ndarray) -> int:
        """MP flows of one pass: transfers merged per (consumer segment, src, dst), as
        pairs or as coflows, with their dependencies (each distinct one once).

        ``aliases``: consumer segment -> segments whose flows are its own (see
        :meth:`build`); its flows then end in one barrier per destination that all of
        them wait for. Returns the barriers numbered so far (from ``nbar``)."""
        n = self.n
        nn = n * n
        if consumers * nn <= min(max(_DENSE_PER_TRANSFER * keys.size, _DENSE_MIN),
                                 _DENSE_MAX):
            uk, inv, sizes, k_of, p_of = merge_transfers(keys, nbytes, preds, nn,
                                                         succ_base.size)
        else:   # a sparse or huge table (scanned whole, it costs more than a sort)
            uk, inv, _ = _group(keys)
            sizes = np.bincount(inv, weights=nbytes)
            k_of, p_of = _distinct_pairs(inv, preds)
        g, rest = uk // nn, uk % nn
        src, dst = rest // n, rest % n
        succs = succ_base[g] + pos_mat[g, dst]
        mult = None
        if aliases:
            mult = np.ones(uk.size, np.int64)
            for r, al in aliases.items():
                sel = g == r
                mult[sel] += len(al)
                # the flows into each of r's tasks end in a barrier its aliases share
                size = int(seg_sizes[r])
                bars = -1 - (nbar + np.arange(size))
                succs[sel] = bars[pos_mat[r, dst[sel]]]
                before.append(np.tile(bars, len(al) + 1))
                after.append((succ_base[[r, *al]][:, None] + np.arange(size)).ravel())
                nbar += size
        if self.mp_flows == "coflow":
            if mult is not None:
                sizes = sizes * mult
            co, member, first = _coflow_groups(k_of, p_of, uk.size)
            tot = np.bincount(member, weights=sizes, minlength=co.size)
            share = sizes / np.where(tot[member] > 0, tot[member], 1.0)
            cls, lat = self._coflow_classes(src, dst, member, share, co.size)
            ids = flows.add(cls, tot, lat, FLOW_MP, np.ones(co.size, np.int64))
            # members of a coflow share their predecessors: one member's pairs say them
            is_first = np.zeros(uk.size, bool)
            is_first[first] = True
            take = is_first[k_of]
            p_of, k_of = p_of[take], member[k_of[take]]
            flow_of_succ = member
        else:
            cls, lat = self._pair_classes(src, dst)
            flow_of_succ = np.arange(uk.size)
            count = mult
            if self.merge_flows and not self.random_paths and uk.size >= _MERGE_MIN:
                flow_of_succ, count = _identical_blocks(g, rest, sizes, k_of, p_of, mult)
            if count is None:
                ids = flows.add(cls, sizes, lat, FLOW_MP, np.ones(uk.size, np.int64))
            else:
                keep = count > 0
                ids = np.zeros(uk.size, np.int64)
                ids[keep] = flows.add(cls[keep], sizes[keep], lat[keep], FLOW_MP,
                                      np.ones(int(keep.sum()), np.int64), count[keep])
                take = keep[k_of]     # a merged block's predecessors are its first's
                k_of, p_of = k_of[take], p_of[take]
        before.extend([p_of, ids[flow_of_succ]])
        after.extend([ids[k_of], succs])
        return nbar


def _alone_rate(cap: np.ndarray, link: np.ndarray, weight: np.ndarray,
                counts: np.ndarray) -> np.ndarray:
    """Per route row (``counts[i]`` consecutive entries of ``link``/``weight``), the
    most bits/s a flow gets on it alone, ``min(capacity / weight)``; ``inf`` for a row
    with no link or a link down (a flow there is stuck, which the simulation says)."""
    rate = np.full(counts.size, np.inf)
    has = counts > 0
    if has.any():
        with np.errstate(divide="ignore"):
            per = cap[link] / weight
        low = np.minimum.reduceat(per, (np.cumsum(counts) - counts)[has])
        rate[has] = np.where(low > 0, low, np.inf)
    return rate


def _rings_per_group(ring_count: np.ndarray) -> np.ndarray:
    """Rings of each replica group, from each ring's ``ring_count`` (a group's ``r``
    rings each say ``r``, groups in order)."""
    out, k = [], 0
    while k < ring_count.size:
        r = int(ring_count[k])
        out.append(r)
        k += r
    return np.asarray(out, np.int64)


class _Flows:
    """The flows of a graph being built, numbered from ``first``."""

    def __init__(self, first: int) -> None:
        self.first, self.count = first, 0
        self.parts: list[tuple] = []
        self.merged = False     # some flow stands for several

    def add(self, cls, nbytes, lat, kind: int, hops, count=None) -> np.ndarray:
        at = self.first + self.count
        ids = np.arange(at, at + cls.size, dtype=np.int64)
        self.count += cls.size
        if count is None:
            count = np.ones(cls.size, np.int64)
        else:
            self.merged = True
        self.parts.append((cls, nbytes, lat, np.full(cls.size, kind, np.int8), hops, count))
        return ids

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(class, bytes, latency, kind, hops, count) per flow."""
        dtypes = (np.int64, float, float, np.int8, np.int64, np.int64)
        if not self.parts:
            return tuple(np.empty(0, dt) for dt in dtypes)
        return tuple(np.concatenate([p[i] for p in self.parts]).astype(dt, copy=False)
                     for i, dt in enumerate(dtypes))


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
    """
    return IterationGraphBuilder(model, cluster, job, fabric, rings, overlap, mp_flows, cache,
                                 random_paths, seed).build(strategy)


def _row_latency(fabric: Fabric, routes: FlowRoutes) -> np.ndarray:
    """Per route row, the weighted sum of its link latencies."""
    owner = np.repeat(np.arange(len(routes)), np.diff(routes.ptr))
    return np.bincount(owner, weights=fabric.latency[routes.link] * routes.weight,
                       minlength=len(routes))


def _distinct_pairs(inv: np.ndarray, preds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (merged flow, predecessor) pairs, sorted by flow, then predecessor
    (what :func:`~topoopt.estimate._mp_kernel.merge_transfers` returns, by sorting)."""
    low = min(int(preds.min()), 0) if preds.size else 0    # barrier placeholders < 0
    width = int(preds.max()) + 1 - low if preds.size else 1
    pairs = np.sort(inv * width + (preds - low))
    if pairs.size:
        pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))]
    return pairs // width, pairs % width + low


def _identical_blocks(seg: np.ndarray, pair: np.ndarray, sizes: np.ndarray, k_of: np.ndarray,
                      p_of: np.ndarray, weight: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray | None]:
    """Merge the flow blocks of segments that match flow by flow.

    The merged flows of one pass are sorted by segment, then by (source, destination)
    ``pair``; ``(k_of, p_of)`` are their distinct (flow, predecessor task) pairs, sorted
    by flow. Two segments' blocks match when they list the same pairs with the same
    bytes and the same predecessors: their flows then start together on the same
    routes and end together, so the first block's flows stand for the others'.

    ``weight``: the flows each flow already stands for (default one each).

    Returns
    -------
    flow_of : ndarray of int
        Per flow, the flow that stands for it (itself if kept).
    count : ndarray of int or None
        Per flow, the flows it stands for (0 if merged away); ``weight`` when no two
        blocks match.
    """
    cut = np.flatnonzero(seg[1:] != seg[:-1]) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [seg.size]])
    pstart = np.searchsorted(k_of, starts)
    pend = np.searchsorted(k_of, ends)
    # only blocks whose length and predecessor count another block shares can match
    shape = list(zip((ends - starts).tolist(), (pend - pstart).tolist()))
    common: dict = {}
    for b, key in enumerate(shape):
        common.setdefault(key, []).append(b)
    flow_of = None
    count = weight
    for blocks in common.values():
        if len(blocks) < 2:
            continue
        first: dict = {}
        for b in blocks:
            a, e, pa, pe = int(starts[b]), int(ends[b]), int(pstart[b]), int(pend[b])
            key = (pair[a:e].tobytes(), sizes[a:e].tobytes(), (k_of[pa:pe] - a).tobytes(),
                   p_of[pa:pe].tobytes())
            r = first.setdefault(key, b)
            if r == b:
                continue
            if flow_of is None:
                flow_of = np.arange(seg.size)
                count = (np.ones(seg.size, np.int64) if weight is None
                         else weight.copy())
            ra = int(starts[r])
            flow_of[a:e] = np.arange(ra, ra + e - a)
            count[ra:ra + e - a] += count[a:e]
            count[a:e] = 0
    if flow_of is None:
        return np.arange(seg.size), weight
    return flow_of, count


def _coflow_groups(k_of: np.ndarray, p_of: np.ndarray, keys: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group merged MP flows into coflows: flows with exactly the same predecessor tasks.

    ``(k_of[i], p_of[i])`` are the distinct (merged flow, predecessor task) pairs,
    sorted by flow, then task. Returns ``(group labels, member, first)`` with
    ``member[k]`` the coflow of merged flow ``k`` and ``first[c]`` coflow ``c``'s
    lowest member. Grouping by the exact predecessor set keeps the coflow graph
    acyclic whenever the per-pair graph is (a coflow then waits for nothing its
    members did not already wait for); grouping by the first predecessor alone made
    cycles when a consumer read two producer segments on one server.
    """
    # (predecessors < 0 are barrier placeholders: sets get ids from max(0, width) up)
    width = max(int(p_of.max()) + 1, 0) if p_of.size else 1
    count = np.bincount(k_of, minlength=keys)
    sig = np.empty(keys, np.int64)
    single = count == 1
    sig[k_of[single[k_of]]] = p_of[single[k_of]]
    multi = np.flatnonzero(~single & (count > 0))
    if multi.size:
        # several predecessors: one id per distinct set (rows of a padded matrix,
        # compared exactly), numbered after every task id
        row = np.full(keys, -1, np.int64)
        row[multi] = np.arange(multi.size)
        take = row[k_of] >= 0
        first = np.concatenate(([0], np.cumsum(count)))[:-1]
        col = np.arange(k_of.size) - first[k_of]
        mat = np.full((multi.size, int(count[multi].max())), -1, np.int64)
        mat[row[k_of[take]], col[take]] = p_of[take]
        sig[multi] = width + _row_ranks(mat)
    return _group(sig)


def _row_ranks(mat: np.ndarray) -> np.ndarray:
    """Per row of an int matrix, the rank of its value among the distinct rows in
    lexicographic order (``np.unique(mat, axis=0, return_inverse=True)[1]``, eight times
    faster: rows compared as bytes, only the distinct ones sorted by value)."""
    mat = np.ascontiguousarray(mat)
    rows = mat.view(np.dtype((np.void, mat.itemsize * mat.shape[1]))).ravel()
    _, first, inv = np.unique(rows, return_index=True, return_inverse=True)
    order = np.lexsort(mat[first].T[::-1])
    rank = np.empty(order.size, np.int64)
    rank[order] = np.arange(order.size)
    return rank[inv.ravel()]


def _group(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(keys, return_index=True, return_inverse=True)`` by one stable
    argsort: (distinct keys, inverse, first index of each)."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    new = np.empty(sk.size, bool)
    new[:1] = True
    np.not_equal(sk[1:], sk[:-1], out=new[1:])
    inv = np.empty(keys.size, np.int64)
    inv[order] = np.cumsum(new) - 1
    return sk[new], inv, order[new]
