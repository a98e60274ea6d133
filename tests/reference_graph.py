"""A slow, plainly written builder of one training iteration's task graph, for the tests.

:mod:`topoopt.estimate.graph` builds the task graph of FlexNet (TopoOpt §5) as arrays,
with caches, merged flows, barriers and aliases, because the planner builds thousands
of them. This module builds the same graph from its definition, in plain Python
(lists, dicts, dataclasses; no caches, no arrays, nothing from the fast builder or
``topoopt.estimate.segments``), so that ``tests/test_graph_reference.py`` can compare
the two on generated models, strategies and fabrics.

It reuses only lower layers the fast builder does not own: the model and strategy
types, the roofline compute time of one operator (:func:`topoopt.compute.op_time`),
a fabric's paths between two servers (:meth:`topoopt.fabrics.fabric.Fabric.paths`)
and the simulator the graph runs on (:class:`topoopt.netsim.Workload`).

The definition
--------------
Segments. Operators run fused: a non-input operator joins the segment before it when
that segment's last operator is its only input, it is that operator's only consumer,
both have the same config, and the config has ``mp = 1`` (no transfer can happen
between them). Operators of kind ``input`` (data loaders) get no segment. A segment's
forward and backward seconds are its operators' summed; its update seconds too, an
operator's update being the SGD read-read-write of its parameter shard over HBM, none
for an embedding that is not replicated (updated sparsely within its backward).

Tasks. Per segment and server of its config: a forward task, a backward task and,
when the update takes time, an update task. A server runs one task at a time, its
ready tasks in this order: forwards in segment order, backwards in reverse segment
order, updates in segment order.

Dependencies and MP transfers, per model edge ``u -> v`` across two segments
``gu -> gv``:

- on every server both configs use, ``fwd(gu) -> fwd(gv)`` and ``bwd(gv) -> bwd(gu)``
  (the server holds both; no transfer);
- producer cell ``(a, b)`` (sample part ``a`` of ``dp_u``, feature shard ``b`` of
  ``mp_u``) sends consumer cell ``(a', b')`` the samples they share:
  ``overlap(a/dp_u, a'/dp_v) x activation / mp_u`` bytes, where ``activation`` is
  ``u``'s output for the global batch; nothing between cells on one server, nothing
  when the activation is empty. The gradient goes back the same size.

One flow per stage and server pair: the forward of consumer segment ``gv`` receives
from server ``s`` one message carrying all its inputs' bytes from ``s`` (sent once
every producer task on ``s`` that contributes has finished; received by ``fwd(gv)`` on
the destination), the backward of producer segment ``gu`` one message per server
(sent once every consumer's backward there has finished; received by ``bwd(gu)``).
With ``mp_flows="coflow"`` the messages of one pass that wait for exactly the same
tasks are one coupled flow (a coflow): its bytes their sum, its route their routes
weighted by their share of the bytes, its latency the largest of theirs, and every
task that receives one of them waits for the coflow. ``"auto"`` means pairs on a
single switch, coflows elsewhere.

AllReduce, per segment with parameters and ``dp >= 2``, per parameter shard ``b``:
the replicas of ``b`` (sorted) all-reduce ``S = params / mp x dtype bytes`` over
their rings (``rings[members]``, else the fabric's ``info["rings"]``, else one ring in
member order), the bytes split evenly over the rings. A ring of ``k`` members is one
coupled flow over its ``k`` hops, ``2(k-1)/k x S / rings`` bytes per hop, its route
every hop's route added, its latency ``2(k-1)`` times the slowest hop's. It starts
after the backward of the segment on every member (``overlap``) or after every
backward task (no ``overlap``); each member's update waits for it. A segment's update
without AllReduce follows its own backward.

A path's latency is the sum of its links' latencies; a route's, weighted by the
paths' shares; a flow is delivered its latency after its last byte is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from topoopt.cluster import Cluster, Job
from topoopt.compute import op_time
from topoopt.fabrics.fabric import Fabric
from topoopt.model import Model, Operator
from topoopt.netsim import FlowRoutes, Workload
from topoopt.strategy import OpConfig, Strategy

__all__ = ["RefTask", "RefFlow", "RefGraph", "reference_graph", "reference_workload"]


@dataclass(frozen=True)
class RefTask:
    """A compute task: ``kind`` (``"fwd"``, ``"bwd"``, ``"upd"``) of segment ``ops``
    on ``server``, ``duration`` seconds; ``order`` ranks it among its server's ready
    tasks (lower first)."""

    kind: str
    ops: tuple[int, ...]
    server: int
    duration: float
    order: int

    @property
    def label(self) -> tuple[str, tuple[int, ...], int]:
        return (self.kind, self.ops, self.server)


@dataclass(frozen=True)
class RefFlow:
    """A flow: ``kind`` (``"mp"`` or ``"allreduce"``), ``nbytes`` per hop over
    ``hops`` hops (1 for MP), ``route`` as sorted ``(link, weight)`` pairs,
    ``latency`` seconds; ``parts`` the (src, dst, bytes) messages or ring hops it
    carries."""

    kind: str
    nbytes: float
    hops: int
    route: tuple[tuple[int, float], ...]
    latency: float
    parts: tuple = ()


@dataclass
class RefGraph:
    """Tasks (nodes ``0 .. len(tasks)-1``), then flows, and dependencies
    ``(before, after)`` between node ids."""

    segments: list[tuple[tuple[int, ...], OpConfig]]
    tasks: list[RefTask] = field(default_factory=list)
    flows: list[RefFlow] = field(default_factory=list)
    deps: list[tuple[int, int]] = field(default_factory=list)

    def flow_node(self, j: int) -> int:
        return len(self.tasks) + j


# -- definitions ------------------------------------------------------------------------

def segments_of(model: Model, strategy: Strategy) -> list[tuple[tuple[int, ...], OpConfig]]:
    """The fused segments ``(operators, config)`` in operator order (see the module
    docstring)."""
    ops = model.operators
    index = {op.name: i for i, op in enumerate(ops)}
    consumers: dict[int, list[int]] = {i: [] for i in range(len(ops))}
    for v, op in enumerate(ops):
        for name in op.inputs:
            consumers[index[name]].append(v)
    segments: list[list[int]] = []
    for v, op in enumerate(ops):
        if op.kind == "input":
            continue
        cfg = strategy.configs[v]
        if segments and len(op.inputs) == 1:
            u = index[op.inputs[0]]
            if (segments[-1][-1] == u and consumers[u] == [v] and cfg.mp == 1
                    and strategy.configs[u] == cfg):
                segments[-1].append(v)
                continue
        segments.append([v])
    return [(tuple(s), strategy.configs[s[0]]) for s in segments]


def update_seconds(op: Operator, cfg: OpConfig, cluster: Cluster, job: Job) -> float:
    """SGD update of one parameter shard: read weights and gradients, write weights, at
    the server's HBM rate; none without parameters or for an embedding with ``dp = 1``."""
    if op.params == 0 or (op.kind == "embedding" and cfg.dp == 1):
        return 0.0
    hbm_bytes_per_s = (cluster.gpu.hbm_bandwidth / 8 * cluster.gpus_per_server
                       * cluster.memory_efficiency)
    return 3.0 * op.params / cfg.mp * job.dtype_bytes / hbm_bytes_per_s


def cell_transfers(producer: OpConfig, consumer: OpConfig, activation: float
                   ) -> list[tuple[int, int, float]]:
    """``(src, dst, bytes)`` of one activation from producer to consumer cells (see the
    module docstring); exact fractions, rounded once."""
    out = []
    for a in range(producer.dp):
        for b in range(producer.mp):
            src = producer.servers[a * producer.mp + b]
            for a2 in range(consumer.dp):
                lo = max(Fraction(a, producer.dp), Fraction(a2, consumer.dp))
                hi = min(Fraction(a + 1, producer.dp), Fraction(a2 + 1, consumer.dp))
                if hi <= lo:
                    continue
                for b2 in range(consumer.mp):
                    dst = consumer.servers[a2 * consumer.mp + b2]
                    if src != dst:
                        out.append((src, dst, float((hi - lo) * Fraction(activation)
                                                    / producer.mp)))
    return out


def pair_route(fabric: Fabric, src: int, dst: int) -> tuple[dict[int, float], float]:
    """``({link: weight}, latency)`` of ``src -> dst``: the fabric's paths, each link
    weighted by the share of the paths crossing it; the paths' latencies weighted the
    same."""
    route: dict[int, float] = {}
    latency = 0.0
    for links, share in fabric.paths(src, dst):
        for link in links.tolist():
            route[link] = route.get(link, 0.0) + share
            latency += share * float(fabric.latency[link])
    return route, latency


def _sorted_route(route: dict[int, float]) -> tuple[tuple[int, float], ...]:
    return tuple(sorted(route.items()))


# -- the builder ------------------------------------------------------------------------

Tasks = dict[tuple[int, int], int]   # (segment, server) -> task node


def reference_graph(model: Model, strategy: Strategy, cluster: Cluster, job: Job,
                    fabric: Fabric, rings=None, overlap: bool = True,
                    mp_flows: str = "auto") -> RefGraph:
    """The task graph of one iteration of ``strategy`` (see the module docstring)."""
    if mp_flows == "auto":
        one_switch = fabric.kind == "switched" and fabric.nodes == fabric.servers + 1
        mp_flows = "pair" if one_switch else "coflow"
    if rings is None:
        rings = fabric.info.get("rings") or {}
    graph = RefGraph(segments_of(model, strategy))
    fwd, bwd, upd = _add_tasks(graph, model, cluster, job)
    fwd_msgs, bwd_msgs = _add_mp_dependencies(graph, model, cluster, job, fwd, bwd)
    _add_mp_flows(graph, fabric, fwd_msgs, fwd, mp_flows)
    _add_mp_flows(graph, fabric, bwd_msgs, bwd, mp_flows)
    _add_allreduce(graph, model, job, fabric, rings, overlap, bwd, upd)
    return graph


def _add_tasks(graph: RefGraph, model: Model, cluster: Cluster, job: Job
               ) -> tuple[Tasks, Tasks, Tasks]:
    """Forward, backward and update tasks per segment and server; forward before
    backward."""
    ops, segs = model.operators, graph.segments
    batch = job.global_batch(cluster)
    fwd: Tasks = {}
    bwd: Tasks = {}
    upd: Tasks = {}
    nseg = len(segs)
    for g, (members, cfg) in enumerate(segs):
        f = b = u = 0.0
        for v in members:
            tf, tb = op_time(ops[v], cfg, cluster, job.precision, job.dtype_bytes, batch,
                             job.attention)
            f += tf
            b += tb
            u += update_seconds(ops[v], cfg, cluster, job)
        for s in cfg.servers:
            for tasks, kind, duration, order in ((fwd, "fwd", f, g),
                                                 (bwd, "bwd", b, 2 * nseg - 1 - g),
                                                 (upd, "upd", u, 2 * nseg + g)):
                if kind != "upd" or u > 0:
                    graph.tasks.append(RefTask(kind, members, s, duration, order))
                    tasks[g, s] = len(graph.tasks) - 1
    for key, node in fwd.items():
        graph.deps.append((node, bwd[key]))
    return fwd, bwd, upd


Messages = dict[tuple[int, int, int], list]   # (stage segment, src, dst) -> [bytes, preds]


def _add_mp_dependencies(graph: RefGraph, model: Model, cluster: Cluster, job: Job,
                         fwd: Tasks, bwd: Tasks) -> tuple[Messages, Messages]:
    """Same-server dependencies per edge across segments; the messages of each pass
    per (receiving segment, source, destination) with their bytes and the tasks
    they wait for."""
    ops, segs = model.operators, graph.segments
    index = {op.name: i for i, op in enumerate(ops)}
    seg_of = {v: g for g, (members, _) in enumerate(segs) for v in members}
    batch = job.global_batch(cluster)
    fwd_msgs: Messages = {}
    bwd_msgs: Messages = {}
    for v, op in enumerate(ops):
        for name in op.inputs:
            u = index[name]
            if ops[u].kind == "input" or seg_of[u] == seg_of[v]:
                continue
            gu, gv = seg_of[u], seg_of[v]
            cu, cv = segs[gu][1], segs[gv][1]
            for s in cu.servers:
                if s in cv.servers:
                    graph.deps.append((fwd[gu, s], fwd[gv, s]))
                    graph.deps.append((bwd[gv, s], bwd[gu, s]))
            activation = float(ops[u].out_elems) * (batch * job.dtype_bytes)
            if activation <= 0:
                continue
            for s, d, nbytes in cell_transfers(cu, cv, activation):
                m = fwd_msgs.setdefault((gv, s, d), [0.0, set()])
                m[0] += nbytes
                m[1].add(fwd[gu, s])
                m = bwd_msgs.setdefault((gu, d, s), [0.0, set()])
                m[0] += nbytes
                m[1].add(bwd[gv, d])
    return fwd_msgs, bwd_msgs


def _add_mp_flows(graph: RefGraph, fabric: Fabric, msgs: Messages, receiver: Tasks,
                  mp_flows: str) -> None:
    """One pass's messages as flows: one each (``"pair"``), or one coflow per set of
    tasks they wait for."""
    # (src, dst, bytes, tasks waited for, receiving task) per message
    items = [(s, d, m[0], frozenset(m[1]), receiver[g, d])
             for (g, s, d), m in sorted(msgs.items())]
    if mp_flows == "pair":
        for s, d, nbytes, preds, to in items:
            route, latency = pair_route(fabric, s, d)
            _add_flow(graph, RefFlow("mp", nbytes, 1, _sorted_route(route), latency,
                                     ((s, d, nbytes),)), preds, [to])
        return
    groups: dict[frozenset, list] = {}
    for item in items:
        groups.setdefault(item[3], []).append(item)
    for preds, members in groups.items():
        total = sum(x[2] for x in members)
        coupled: dict[int, float] = {}
        slowest = 0.0
        for s, d, nbytes, _, _ in members:
            route, latency = pair_route(fabric, s, d)
            for link, w in route.items():
                coupled[link] = coupled.get(link, 0.0) + nbytes / total * w
            slowest = max(slowest, latency)
        _add_flow(graph, RefFlow("mp", total, 1, _sorted_route(coupled), slowest,
                                 tuple((x[0], x[1], x[2]) for x in members)),
                  preds, sorted({x[4] for x in members}))


def _add_allreduce(graph: RefGraph, model: Model, job: Job, fabric: Fabric, rings,
                   overlap: bool, bwd: Tasks, upd: Tasks) -> None:
    """Ring flows per parameter shard of each replicated segment with parameters;
    the updates of the other segments after their own backward."""
    every_bwd = sorted(bwd.values())
    for g, (ops, cfg) in enumerate(graph.segments):
        params = sum(model.operators[v].params for v in ops)
        if params == 0 or cfg.dp < 2:
            for s in cfg.servers:
                if (g, s) in upd:
                    graph.deps.append((bwd[g, s], upd[g, s]))
            continue
        shard = params / cfg.mp * job.dtype_bytes
        for b in range(cfg.mp):
            members = tuple(sorted(cfg.replicas(b)))
            orders = rings.get(members, (members,))
            k = len(members)
            for order in orders:
                coupled: dict[int, float] = {}
                slowest = 0.0
                for i, s in enumerate(order):
                    route, latency = pair_route(fabric, int(s),
                                                int(order[(i + 1) % len(order)]))
                    for link, w in route.items():
                        coupled[link] = coupled.get(link, 0.0) + w
                    slowest = max(slowest, latency)
                flow = RefFlow("allreduce", 2.0 * (k - 1) / k * shard / len(orders), len(order),
                               _sorted_route(coupled), 2 * (len(order) - 1) * slowest,
                               tuple(int(x) for x in order))
                # the updates wait for the rings (so for the backward through them)
                _add_flow(graph, flow, [bwd[g, m] for m in members] if overlap else every_bwd,
                          [upd[g, m] for m in members if (g, m) in upd])


def _add_flow(graph: RefGraph, flow: RefFlow, preds, succs) -> None:
    graph.flows.append(flow)
    node = graph.flow_node(len(graph.flows) - 1)
    graph.deps.extend((p, node) for p in preds)
    graph.deps.extend((node, s) for s in succs)


def reference_workload(graph: RefGraph) -> Workload:
    """The graph as a workload for :func:`topoopt.netsim.simulate`: tasks on their
    servers in their order, flows as one row each, then the dependencies (node ids as
    in :class:`RefGraph`)."""
    w = Workload()
    for t in graph.tasks:
        w.add_task(t.duration, t.server, priority=float(t.order))
    if graph.flows:
        routes = FlowRoutes.from_lists([[link for link, _ in f.route] for f in graph.flows],
                                       [[w_ for _, w_ in f.route] for f in graph.flows])
        w.add_flows([f.nbytes for f in graph.flows], routes,
                    latency=[f.latency for f in graph.flows])
    if graph.deps:
        w.add_dependencies([a for a, _ in graph.deps], [b for _, b in graph.deps])
    return w
