"""Iteration time of a strategy on a fabric: the FlexNet task graph of one training
iteration (TopoOpt §5), run on the flow-level simulator.

Contract (the MCMC planner calls this thousands of times):
``estimate_iteration(model, strategy, cluster, job, fabric, rings=None, overlap=True,
...) -> IterationEstimate`` (frozen: ``total`` seconds and the breakdown ``compute``,
``mp``, ``allreduce``, ``exposed_communication``). ``rings`` maps an AllReduce
group's member tuple (sorted) to a tuple of ring orders; the group's bytes are split
evenly over them; default one ring in member order (or the fabric's own rings,
``fabric.info["rings"]``, when it carries a TopoOpt plan). ``mp_flows`` picks exact
per-pair MP flows or faster coupled "coflows" (default: pairs on a single switch,
coflows elsewhere; see :func:`build_iteration`). Reusable pieces:
:func:`fuse_operators`, :class:`EstimateCache` (per-operator compute times and
per-edge transfers memoized across strategies), :func:`build_iteration` (the task
graph) and :func:`summarize`.

Two paths give the same estimate (times to ~1e-12 relative, same counts):
``reference=True`` is :func:`build_iteration` + :func:`topoopt.netsim.simulate`, the
specification; the default is :class:`topoopt.estimate_fast.FastEstimator` (the same
graph from cached pieces, on :func:`topoopt.netsim.dag.run_dag`), which the MCMC
planner keeps per fabric (:class:`planners.mcmc.IterationCost`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import numpy as np

from topoopt._require import require_choice
from topoopt.compute import op_time
from topoopt.errors import ConfigError
from topoopt.netsim import FlowRoutes, SimResult, Workload, simulate
from topoopt.strategy import OpConfig, Strategy
from topoopt.topology.topology import check_ring
from topoopt.traffic import edge_transfers

__all__ = ["IterationEstimate", "IterationGraph", "EstimateCache", "Segment", "fuse_operators",
           "build_iteration", "summarize", "estimate_iteration", "ring_flow_routes",
           "FLOW_MP", "FLOW_ALLREDUCE"]

#: Flow kinds in :attr:`IterationGraph.flow_kind`.
FLOW_MP, FLOW_ALLREDUCE = 0, 1


@dataclass(frozen=True)
class IterationEstimate:
    """Predicted time of one training iteration and where it goes.

    Attributes
    ----------
    total : float
        Seconds from the first forward task to the last weight update.
    compute : float
        Busy time of the busiest server's GPUs (forward + backward + update).
    mp : float
        Time during which at least one MP transfer is in flight.
    allreduce : float
        Time during which at least one AllReduce ring is in flight.
    exposed_communication : float
        ``total - compute``: time the busiest server waits for the network.
    fabric : str
    flows, tasks, events : int
        Size of the simulated task graph and the simulator's event count.
    mp_bytes, allreduce_bytes : float
        Bytes of MP transfers and of ring AllReduce (all hops) in the iteration.
    """

    total: float
    compute: float
    mp: float
    allreduce: float
    exposed_communication: float
    fabric: str = ""
    flows: int = 0
    tasks: int = 0
    events: int = 0
    mp_bytes: float = 0.0
    allreduce_bytes: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Segment:
    """A chain of consecutive operators with one parallel config, run as one task
    per server (fused: no MP between them, and only the chain ends talk outside).

    Attributes
    ----------
    ops : tuple of int
        Operator indices, in order.
    config : OpConfig
    fwd, bwd : float
        Seconds per server (sum over the chain).
    update : float
        Seconds per server of the weight update (0 when nothing is updated densely).
    params : int
        Parameters of the chain (elements).
    """

    ops: tuple[int, ...]
    config: OpConfig
    fwd: float
    bwd: float
    update: float
    params: int


class EstimateCache:
    """Memo of the per-operator pieces that do not change when a strategy changes
    elsewhere: compute times keyed by (op, config) and MP transfers keyed by
    (edge, producer config, consumer config). One cache per (model, cluster, job)."""

    def __init__(self, model, cluster, job) -> None:
        self.key = (id(model), cluster, job)
        self.times: dict = {}
        self.transfers: dict = {}
        self.consumers = _consumers(model)

    # Keys use the configs' identities (hashing a config hashes its server tuple);
    # the cached entry keeps the config alive, so its id cannot be reused.
    #: Entries kept per memo before it is cleared (bounds memory on long searches).
    limit = 200_000

    def op_time(self, model, i: int, cfg: OpConfig, cluster, job) -> tuple[float, float]:
        hit = self.times.get((i, id(cfg)))
        if hit is None or hit[0] is not cfg:
            if len(self.times) >= self.limit:
                self.times.clear()
            t = op_time(model.operators[i], cfg, cluster, job.precision, job.dtype_bytes,
                        job.global_batch(cluster))
            hit = (cfg, t, _update_time(model.operators[i], cfg, cluster, job))
            self.times[(i, id(cfg))] = hit
        return hit[1]

    def update_time(self, model, i: int, cfg: OpConfig, cluster, job) -> float:
        self.op_time(model, i, cfg, cluster, job)
        return self.times[(i, id(cfg))][2]

    def edge(self, model, e: int, u: int, cu: OpConfig, cv: OpConfig, cluster, job):
        key = (e, id(cu), id(cv))
        hit = self.transfers.get(key)
        if hit is None or hit[0] is not cu or hit[1] is not cv:
            if len(self.transfers) >= self.limit:
                self.transfers.clear()
            tensor = model.operators[u].out_elems * job.global_batch(cluster) * job.dtype_bytes
            hit = (cu, cv, edge_transfers(cu, cv, tensor))
            self.transfers[key] = hit
        return hit[2]


def _consumers(model) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in model.operators]
    for u, v in model.edges:
        out[u].append(v)
    return out


def _update_time(op, cfg: OpConfig, cluster, job) -> float:
    """SGD update: read weights and gradients, write weights, over HBM. Embedding
    shards that are not replicated are updated sparsely inside their backward."""
    if op.params == 0 or (op.kind == "embedding" and cfg.dp == 1):
        return 0.0
    rate = cluster.gpu.hbm_bandwidth / 8 * cluster.gpus_per_server * cluster.memory_efficiency
    return 3.0 * op.params / cfg.mp * job.dtype_bytes / rate


def fuse_operators(model, strategy: Strategy, cluster, job, cache: EstimateCache | None = None
                   ) -> tuple[tuple[Segment, ...], np.ndarray]:
    """Group the operators into fused segments.

    Operator ``v`` joins the segment of the operator ``u`` before it when ``v``'s
    only input is ``u``, ``u``'s only consumer is ``v``, both have the same config
    and that config has ``mp = 1`` (so no transfer between them). Operators of kind
    ``input`` (data loaders) get no segment.

    Returns
    -------
    segments : tuple of Segment
        In topological order.
    segment_of : ndarray of int, shape (operators,)
        Segment index per operator (-1 for inputs).
    """
    cache = cache or EstimateCache(model, cluster, job)
    ops, cfgs = model.operators, strategy.configs
    pos = {op.name: i for i, op in enumerate(ops)}
    consumers = cache.consumers
    seg_of = np.full(len(ops), -1, np.int64)
    groups: list[list[int]] = []
    for v, op in enumerate(ops):
        if op.kind == "input":
            continue
        if groups:
            last = groups[-1][-1]
            if (len(op.inputs) == 1 and pos[op.inputs[0]] == last and consumers[last] == [v]
                    and cfgs[last] == cfgs[v] and cfgs[v].mp == 1):
                groups[-1].append(v)
                seg_of[v] = len(groups) - 1
                continue
        groups.append([v])
        seg_of[v] = len(groups) - 1
    segments = []
    for g in groups:
        cfg = cfgs[g[0]]
        fb = [cache.op_time(model, i, cfg, cluster, job) for i in g]
        segments.append(Segment(tuple(g), cfg, float(sum(f for f, _ in fb)),
                                float(sum(b for _, b in fb)),
                                float(sum(cache.update_time(model, i, cfg, cluster, job)
                                          for i in g)),
                                int(sum(ops[i].params for i in g))))
    return tuple(segments), seg_of


@dataclass(frozen=True)
class IterationGraph:
    """The task graph of one iteration, ready for :func:`topoopt.netsim.simulate`.

    Attributes
    ----------
    workload : Workload
    flow_nodes : ndarray
        Node ids of the flows.
    flow_kind : ndarray of int8
        :data:`FLOW_MP` or :data:`FLOW_ALLREDUCE` per flow.
    flow_bytes : ndarray
        Bytes per flow (a ring flow: bytes per hop; ``hop_count`` hops).
    hop_count : ndarray
        Hops per flow (1 for MP, the ring length for AllReduce).
    task_nodes, task_server, task_duration : ndarray
    segments : tuple of Segment
    """

    workload: Workload
    flow_nodes: np.ndarray
    flow_kind: np.ndarray
    flow_bytes: np.ndarray
    hop_count: np.ndarray
    task_nodes: np.ndarray
    task_server: np.ndarray
    task_duration: np.ndarray
    segments: tuple[Segment, ...] = field(repr=False)


def ring_flow_routes(fabric, orders: Sequence[Sequence[int]], random: bool = False,
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
    r = fabric.route(hops_src, hops_dst, random=random, seed=seed)
    counts = np.diff(r.ptr)
    hop_of_entry = np.repeat(np.arange(len(r)), counts)
    hop_lat = np.bincount(hop_of_entry, weights=fabric.latency[r.link] * r.weight,
                          minlength=len(r))
    ring_lat = np.zeros(len(orders))
    np.maximum.at(ring_lat, owner, hop_lat)
    key = owner[hop_of_entry] * fabric.links + r.link
    uk, inv = np.unique(key, return_inverse=True)
    weight = np.bincount(inv, weights=r.weight)
    ring = uk // fabric.links
    ptr = np.concatenate([[0], np.cumsum(np.bincount(ring, minlength=len(orders)))])
    return FlowRoutes(ptr, uk % fabric.links, weight), ring_lat


def build_iteration(model, strategy: Strategy, cluster, job, fabric,
                    rings: Mapping[tuple[int, ...], Sequence[Sequence[int]]] | None = None,
                    overlap: bool = True, cache: EstimateCache | None = None,
                    random_paths: bool = False, seed: int = 0, mp_flows: str = "auto"
                    ) -> IterationGraph:
    """Build the task graph of one training iteration (FlexNet, TopoOpt §5).

    Per fused segment (:func:`fuse_operators`) and server: a forward task, a
    backward task and, for segments with parameters, a weight-update task, each on
    the server's GPUs (one resource per server; forward before backward). MP
    transfers (:func:`topoopt.traffic.edge_transfers`) join the producer's
    forward task on the source to the consumer's forward task on the destination,
    and their gradients the consumers' backward to the producer's backward the
    other way; transfers of one stage (consumer segment forward, producer segment
    backward) between the same two servers are one flow. Each AllReduce shard
    (segment x parameter shard) runs as one coupled flow per ring (bytes per hop
    ``2(g-1)/g x S / rings``, latency ``2(g-1)`` x the slowest hop), after the
    backward of that segment on every member (``overlap=True``) or after all
    backward tasks (``overlap=False``); each member's update waits for it.

    Parameters
    ----------
    model, strategy, cluster, job
    fabric : Fabric
    rings : Mapping, optional
        Members (sorted tuple) -> ring orders; default one ring in member order.
    overlap : bool
        Overlap AllReduce with the rest of the backward pass.
    cache : EstimateCache, optional
    random_paths : bool
        One random shortest path per flow instead of ECMP.
    seed : int
    mp_flows : {"auto", "pair", "coflow"}
        ``"pair"``: one max-min flow per (stage, source, destination) -- exact at
        flow level. ``"coflow"``: the transfers a task releases at once (one
        source to many destinations, e.g. an embedding's output) are one coupled
        flow whose rate is split over them in proportion to their bytes, so they
        end together -- an approximation (a slow destination slows the group).
        ``"auto"`` (default): pairs on a single switch (Ideal Switch, star: two
        links per route, cheap and exact), coflows elsewhere. Measured on
        DLRM-128 (hybrid): equal iteration times to 1e-15 on the Ideal Switch and
        the Fat-tree (2x faster on the Fat-tree, 680k route entries per pass with
        pairs); on an expander per-pair flows over uneven multi-hop routes end at
        thousands of distinct times (10,848 events, ~100 s) against 65 events and
        0.04 s with coflows, iteration times within 0.05%. Use ``"pair"`` where
        exactness matters more than speed (placements with very uneven paths).

    Returns
    -------
    IterationGraph
    """
    require_choice("mp_flows", mp_flows, ("auto", "pair", "coflow"))
    if mp_flows == "auto":
        one_switch = fabric.kind == "switched" and fabric.nodes == fabric.servers + 1
        mp_flows = "pair" if one_switch else "coflow"
    n = cluster.servers
    if fabric.servers != n:
        raise ConfigError("fabric", fabric.servers,
                          f"has {fabric.servers} servers but the cluster has {n}")
    if len(strategy.configs) != len(model.operators):
        raise ConfigError("strategy", len(strategy.configs),
                          f"needs one config per operator ({len(model.operators)})")
    cache = cache or EstimateCache(model, cluster, job)
    if rings is None:
        rings = fabric.info.get("rings")
    segs, seg_of = fuse_operators(model, strategy, cluster, job, cache)
    nseg = len(segs)
    sizes = np.array([len(s.config.servers) for s in segs], np.int64)
    pos = np.full((nseg, n), -1, np.int64)
    for g, s in enumerate(segs):
        pos[g, list(s.config.servers)] = np.arange(len(s.config.servers))
    # Node ids: forward tasks by segment, backward tasks in reverse, then updates.
    total = int(sizes.sum())
    fwd_base = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rev = np.arange(nseg)[::-1]
    bwd_base = np.empty(nseg, np.int64)
    bwd_base[rev] = total + np.concatenate([[0], np.cumsum(sizes[rev])[:-1]])
    has_update = np.array([s.update > 0 for s in segs])
    upd_sizes = np.where(has_update, sizes, 0)
    upd_base = 2 * total + np.concatenate([[0], np.cumsum(upd_sizes)[:-1]])
    dur = np.empty(2 * total + int(upd_sizes.sum()))
    res = np.empty(dur.size, np.int64)
    for g, s in enumerate(segs):
        k = sizes[g]
        srv = np.asarray(s.config.servers, np.int64)
        dur[fwd_base[g]:fwd_base[g] + k] = s.fwd
        res[fwd_base[g]:fwd_base[g] + k] = srv
        dur[bwd_base[g]:bwd_base[g] + k] = s.bwd
        res[bwd_base[g]:bwd_base[g] + k] = srv
        if has_update[g]:
            dur[upd_base[g]:upd_base[g] + k] = s.update
            res[upd_base[g]:upd_base[g] + k] = srv
    w = Workload()
    task_nodes = w.add_tasks(dur, res)
    seg_idx = np.repeat(np.arange(nseg), sizes)
    local_idx = np.arange(total) - np.repeat(fwd_base, sizes)
    fwd_all = fwd_base[seg_idx] + local_idx
    bwd_all = bwd_base[seg_idx] + local_idx
    w.add_dependencies(fwd_all, bwd_all)  # backward after forward on each server

    # MP transfers between segments, and local (same-server) data dependencies.
    f_keys, f_bytes, f_pred = [], [], []
    b_keys, b_bytes, b_pred = [], [], []
    seg_pairs = set()
    for e, (u, v) in enumerate(model.edges):
        gu, gv = seg_of[u], seg_of[v]
        if gu < 0 or gu == gv:
            continue
        seg_pairs.add((int(gu), int(gv)))
        src, dst, nbytes = cache.edge(model, e, u, segs[gu].config, segs[gv].config,
                                      cluster, job)
        if src.size == 0:
            continue
        f_keys.append((gv * n + src) * n + dst)
        f_bytes.append(nbytes)
        f_pred.append(fwd_base[gu] + pos[gu, src])
        b_keys.append((gu * n + dst) * n + src)
        b_bytes.append(nbytes)
        b_pred.append(bwd_base[gv] + pos[gv, dst])
    deps_b: list[np.ndarray] = []
    deps_a: list[np.ndarray] = []
    for gu, gv in sorted(seg_pairs):
        common = np.flatnonzero((pos[gu] >= 0) & (pos[gv] >= 0))
        if common.size:
            deps_b += [fwd_base[gu] + pos[gu, common], bwd_base[gv] + pos[gv, common]]
            deps_a += [fwd_base[gv] + pos[gv, common], bwd_base[gu] + pos[gu, common]]

    flow_nodes, flow_kind, flow_bytes, hop_count = [], [], [], []

    def add_mp(keys, nbytes, preds, succ_base):
        if not keys:
            return
        keys = np.concatenate(keys)
        uk, inv = _group(keys)
        sizes_ = np.bincount(inv, weights=np.concatenate(nbytes))
        g, rest = uk // (n * n), uk % (n * n)
        src, dst = rest // n, rest % n
        preds = np.concatenate(preds)
        succs = succ_base[g] + pos[g, dst]
        if mp_flows == "coflow":
            # One coupled flow per group of transfers released by the same tasks.
            co, member = _coflow_groups(inv, preds, uk.size)
            total = np.bincount(member, weights=sizes_, minlength=co.size)
            share = sizes_ / np.where(total[member] > 0, total[member], 1.0)
            if random_paths:
                routes, lat = _couple(fabric.route(src, dst, random=True, seed=seed), member,
                                      sizes_, co.size, fabric)
            else:
                routes, lat = fabric.coupled_route(src, dst, member, share, co.size)
            sizes_ = total
            nodes = w.add_flows(sizes_, routes, latency=lat)
            inv, flow_of_succ = member[inv], member
        else:
            routes = fabric.route(src, dst, random=random_paths, seed=seed)
            nodes = w.add_flows(sizes_, routes)
            flow_of_succ = np.arange(uk.size)
        # (a repeated predecessor edge is harmless: it is counted and released twice)
        deps_b.extend([preds, nodes[flow_of_succ]])
        deps_a.extend([nodes[inv], succs])
        flow_nodes.append(nodes)
        flow_kind.append(np.full(nodes.size, FLOW_MP, np.int8))
        flow_bytes.append(sizes_)
        hop_count.append(np.ones(nodes.size, np.int64))

    add_mp(f_keys, f_bytes, f_pred, fwd_base)
    add_mp(b_keys, b_bytes, b_pred, bwd_base)

    # AllReduce: one coupled flow per ring per (segment, shard).
    barrier = None
    if not overlap:
        barrier = int(w.add_task(0.0))
        w.add_dependencies(bwd_all, barrier)
    orders, ring_bytes, ring_seg, ring_members = [], [], [], []
    for g, s in enumerate(segs):
        cfg = s.config
        if s.params == 0 or cfg.dp < 2:
            continue
        shard_bytes = s.params / cfg.mp * job.dtype_bytes
        for b in range(cfg.mp):
            members = tuple(sorted(cfg.replicas(b)))
            ring_orders = (rings or {}).get(members, (members,))
            if not ring_orders:
                raise ConfigError("rings", members, "every AllReduce group needs a ring")
            per_ring = 2.0 * (len(members) - 1) / len(members) * shard_bytes / len(ring_orders)
            for order in ring_orders:
                order = tuple(int(x) for x in order)
                check_ring(order, members)
                orders.append(order)
                ring_bytes.append(per_ring)
                ring_seg.append(g)
                ring_members.append(np.asarray(members, np.int64))
    if orders:
        routes, hop_lat = ring_flow_routes(fabric, orders, random=random_paths, seed=seed)
        glen = np.array([len(o) for o in orders])
        nodes = w.add_flows(np.asarray(ring_bytes), routes, latency=2 * (glen - 1) * hop_lat)
        rs = np.asarray(ring_seg)
        mem = np.concatenate(ring_members)
        mem_ring = np.repeat(np.arange(len(orders)), glen)
        mem_seg = rs[mem_ring]
        if overlap:
            w.add_dependencies(bwd_base[mem_seg] + pos[mem_seg, mem], nodes[mem_ring])
        else:
            w.add_dependencies(barrier, nodes)
        upd = has_update[mem_seg]
        w.add_dependencies(nodes[mem_ring[upd]], upd_base[mem_seg[upd]] + pos[mem_seg[upd],
                                                                              mem[upd]])
        flow_nodes.append(nodes)
        flow_kind.append(np.full(nodes.size, FLOW_ALLREDUCE, np.int8))
        flow_bytes.append(np.asarray(ring_bytes))
        hop_count.append(glen)
    # Updates of segments without AllReduce follow their own backward.
    ar_segs = set(ring_seg)
    for g in np.flatnonzero(has_update):
        if g not in ar_segs:
            k = sizes[g]
            w.add_dependencies(bwd_base[g] + np.arange(k), upd_base[g] + np.arange(k))

    if deps_b:
        w.add_dependencies(np.concatenate(deps_b), np.concatenate(deps_a))
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.empty(0, dt))
    return IterationGraph(w, cat(flow_nodes, np.int64), cat(flow_kind, np.int8),
                          cat(flow_bytes, float), cat(hop_count, np.int64), task_nodes,
                          res, dur, segs)


def _coflow_groups(inv: np.ndarray, preds: np.ndarray, keys: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Group merged MP flows into coflows: flows with exactly the same predecessor tasks.

    ``inv[i]`` is the merged flow of transfer ``i`` and ``preds[i]`` the task that
    releases it. Returns ``(group labels, member)`` with ``member[k]`` the coflow of
    merged flow ``k``. Grouping by the exact predecessor set keeps the coflow graph
    acyclic whenever the per-pair graph is (a coflow then waits for nothing its
    members did not already wait for); grouping by the first predecessor alone made
    cycles when a consumer read two producer segments on one server.
    """
    pairs = np.unique(inv * (int(preds.max()) + 1) + preds) if preds.size else preds
    width = int(preds.max()) + 1 if preds.size else 1
    k_of, p_of = pairs // width, pairs % width
    count = np.bincount(k_of, minlength=keys)
    sig = np.empty(keys, np.int64)
    single = count == 1
    sig[k_of[single[k_of]]] = p_of[single[k_of]]
    if not single.all():
        # several predecessors: one id per distinct set, numbered after every task id
        multi: dict[tuple[int, ...], int] = {}
        starts = np.concatenate(([0], np.cumsum(count)))
        for k in np.flatnonzero(~single).tolist():
            key = tuple(p_of[starts[k]:starts[k + 1]].tolist())
            sig[k] = width + multi.setdefault(key, len(multi))
    return _group(sig)


def _group(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` by one stable argsort."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    new = np.empty(sk.size, bool)
    new[:1] = True
    np.not_equal(sk[1:], sk[:-1], out=new[1:])
    inv = np.empty(keys.size, np.int64)
    inv[order] = np.cumsum(new) - 1
    return sk[new], inv


def _couple(routes: FlowRoutes, member: np.ndarray, sizes: np.ndarray, groups: int, fabric
            ) -> tuple[FlowRoutes, np.ndarray]:
    """Merge flows into coupled flows: each member's link weights scaled by its
    share of the group's bytes; latency = the slowest member's path latency."""
    counts = np.diff(routes.ptr)
    flow = np.repeat(np.arange(counts.size), counts)
    lat = np.bincount(flow, weights=fabric.latency[routes.link] * routes.weight,
                      minlength=counts.size)
    group_lat = np.zeros(groups)
    np.maximum.at(group_lat, member, lat)
    total = np.bincount(member, weights=sizes, minlength=groups)
    share = sizes / np.where(total[member] > 0, total[member], 1.0)
    key = member[flow] * fabric.links + routes.link
    if groups * fabric.links <= 1 << 23:  # dense (group, link) table: no sort
        dense = np.bincount(key, weights=routes.weight * share[flow],
                            minlength=groups * fabric.links)
        uk = np.flatnonzero(dense)
        weight = dense[uk]
    else:
        uk, inv = _group(key)
        weight = np.bincount(inv, weights=routes.weight * share[flow])
    grp = uk // fabric.links
    ptr = np.concatenate([[0], np.cumsum(np.bincount(grp, minlength=groups))])
    return FlowRoutes(ptr, uk % fabric.links, weight), group_lat


def _busy(intervals_start: np.ndarray, intervals_end: np.ndarray) -> float:
    """Length of the union of intervals."""
    if intervals_start.size == 0:
        return 0.0
    order = np.argsort(intervals_start, kind="stable")
    s, e = intervals_start[order], intervals_end[order]
    reach = np.maximum.accumulate(e)
    # a new block starts where the start passes everything seen before
    new = np.concatenate([[True], s[1:] > reach[:-1]])
    block = np.cumsum(new) - 1
    starts = s[new]
    ends = np.zeros(starts.size)
    np.maximum.at(ends, block, e)
    return float((ends - starts).sum())


def summarize(graph: IterationGraph, result: SimResult, fabric_name: str = "") -> IterationEstimate:
    """Turn a simulation of an :class:`IterationGraph` into an :class:`IterationEstimate`."""
    busy = np.bincount(graph.task_server[graph.task_server >= 0],
                       weights=graph.task_duration[graph.task_server >= 0])
    compute = float(busy.max()) if busy.size else 0.0
    fn = graph.flow_nodes
    mp_sel = fn[graph.flow_kind == FLOW_MP]
    ar_sel = fn[graph.flow_kind == FLOW_ALLREDUCE]
    total = result.makespan
    mp_bytes = float(graph.flow_bytes[graph.flow_kind == FLOW_MP].sum())
    ar = graph.flow_kind == FLOW_ALLREDUCE
    ar_bytes = float((graph.flow_bytes[ar] * graph.hop_count[ar]).sum())
    return IterationEstimate(
        total=total, compute=compute,
        mp=_busy(result.start[mp_sel], result.finish[mp_sel]),
        allreduce=_busy(result.start[ar_sel], result.finish[ar_sel]),
        exposed_communication=max(total - compute, 0.0), fabric=fabric_name,
        flows=int(fn.size), tasks=int(graph.task_nodes.size), events=result.events,
        mp_bytes=mp_bytes, allreduce_bytes=ar_bytes)


def estimate_iteration(model, strategy: Strategy, cluster, job, fabric,
                       rings: Mapping[tuple[int, ...], Sequence[Sequence[int]]] | None = None,
                       overlap: bool = True, cache: EstimateCache | None = None,
                       random_paths: bool = False, seed: int = 0, mp_flows: str = "auto",
                       reference: bool = False) -> IterationEstimate:
    """Simulate one training iteration of ``strategy`` on ``fabric``.

    Parameters
    ----------
    model : workloads.Model
    strategy : Strategy
    cluster : Cluster
    job : Job
    fabric : Fabric
        With ``cluster.servers`` servers.
    rings : Mapping, optional
        AllReduce group members (sorted tuple) -> tuple of ring orders.
    overlap : bool
        Start each AllReduce as soon as the backward of its operators is done
        (True) or only after the whole backward pass (False).
    cache : EstimateCache, optional
        Reuse per-operator pieces across calls (MCMC).
    random_paths : bool
        One seeded random shortest path per flow instead of ECMP.
    seed : int
    mp_flows : {"auto", "pair", "coflow"}
        MP flow granularity, see :func:`build_iteration`.
    reference : bool
        Run the reference path (:func:`build_iteration` + :func:`topoopt.netsim.simulate`)
        instead of the fast one (:class:`topoopt.estimate_fast.FastEstimator`, or for
        ``random_paths`` :func:`build_iteration` + :func:`topoopt.netsim.dag.simulate_dag`).
        Both give the same times to ~1e-12 relative and the same event count; the
        reference is the specification the fast path is tested against.

    Returns
    -------
    IterationEstimate

    Examples
    --------
    >>> from topoopt.cluster import Cluster, Job
    >>> from topoopt.fabrics import ideal_switch
    >>> from topoopt.strategy import data_parallel
    >>> job = Job("ncf", batch_per_gpu=128)
    >>> from topoopt.workloads import model_of
    >>> model = model_of(job)
    >>> cluster = Cluster(servers=4, nics=4, link_bandwidth=100e9)
    >>> est = estimate_iteration(model, data_parallel(model, 4), cluster, job,
    ...                          ideal_switch(4, 400e9))
    >>> est.total >= est.compute > 0
    True

    References
    ----------
    .. [1] TopoOpt §5, "FlexNet simulator" (the task graph of FlexFlow's simulator,
       made network-aware).
    """
    if reference or random_paths:
        graph = build_iteration(model, strategy, cluster, job, fabric, rings, overlap, cache,
                                random_paths, seed, mp_flows)
        if reference:
            result = simulate(fabric, graph.workload, check=False)
        else:
            from topoopt.netsim.dag import simulate_dag

            result = simulate_dag(fabric, graph.workload, check=False)
        return summarize(graph, result, fabric.name)
    from topoopt.estimate_fast import FastEstimator

    if len(strategy.configs) != len(model.operators):
        raise ConfigError("strategy", len(strategy.configs),
                          f"needs one config per operator ({len(model.operators)})")
    return FastEstimator(model, cluster, job, fabric, rings, overlap, mp_flows,
                         cache).estimate(strategy)
