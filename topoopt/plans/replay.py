"""A plan on ns-3: one training iteration replayed with TCP flows, next to its prediction.

:func:`replay_iteration` runs the estimator's task graph of a strategy on a fabric
in ns-3; :func:`validate_plan` does it for every fabric a written plan compared
(``topoopt validate DIR``), :func:`plan_inputs` being the thin reader of
``DIR/plan.json`` it needs.

:func:`replay_iteration` takes the FlexNet task graph that
:func:`topoopt.estimate.build_iteration` builds for a strategy on a fabric (forward,
backward and update tasks per server, MP transfers, AllReduce rings) and runs it in
ns-3: compute tasks are delays on their server (one at a time, in the estimator's
priority order); every MP transfer is a TCP flow from its source to its destination
server; every AllReduce ring -- one coupled fluid flow in the estimator (a pipelined
ring: all hops carry their bytes at once, at the rate of the slowest) -- becomes
either one TCP flow per hop, all started together, the ring done when its slowest
hop is (``ring_mode="hops"``; optimistic where hops are uneven: a fast hop does not
wait for a slow one), or the ring AllReduce algorithm itself, ``2(g-1)`` steps of
``S/g`` bytes per hop, each step waiting for the previous one at both ends
(``ring_mode="steps"``, :func:`topoopt.collectives.ring_allreduce`; what NCCL runs
without its chunk pipelining, pessimistic by the per-step synchronization). A transfer whose fabric
route spreads over several paths (ECMP, or a TopoOpt route with traffic fractions) is
split into one flow per path carrying the path's share (``ecmp="split"``, what the
fluid model assumes), or sent whole on one path drawn by its weight (``ecmp="hash"``,
what per-flow ECMP hashing does). The iteration runs ``iterations`` times back to
back on the same connections and the last one is reported (training repeats it, so
TCP is warm).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from topoopt._require import require_choice, require_int
from topoopt.cluster import Cluster, Job
from topoopt.collectives import flow_dependencies, ring_allreduce
from topoopt.errors import ConfigError, PlanCheckError, TopoOptError
from topoopt.estimate import (
    FLOW_ALLREDUCE,
    EstimateCache,
    IterationEstimate,
    IterationGraph,
    build_iteration,
    summarize,
)
from topoopt.fabrics import direct_connect
from topoopt.fabrics.catalog import build_fabric
from topoopt.fabrics.fabric import Fabric
from topoopt.model import Model
from topoopt.netsim import SimResult, simulate
from topoopt.netsim.ns3.config import Ns3Config
from topoopt.netsim.ns3.session import DagBuilder, Ns3Network
from topoopt.netsim.ns3.worker import Ns3Worker, require_ns3
from topoopt.netsim.wire import WireModel, wire_workload
from topoopt.plans.check import check_plan_document, strategy_of
from topoopt.plans.common import cluster_job_of, read_plan, rings_of, routes_of, topology_of
from topoopt.plans.llm import is_llm_document
from topoopt.strategy import Strategy
from topoopt.workloads import model_of

__all__ = ["IterationReplay", "replay_iteration", "iteration_dag",
           "flow_endpoints", "PlanInputs", "plan_inputs", "plan_fabric", "validate_plan"]



@dataclass(frozen=True)
class IterationReplay:
    """The same iteration predicted at flow level and measured on ns-3.

    Attributes
    ----------
    flow, packet : IterationEstimate
        Flow-level (the estimator's model, per-pair MP flows) and ns-3.
    flow_wall, packet_wall : float
        Wall-clock seconds of each (ns-3: the simulation itself, worker start excluded).
    flows : int
        TCP flows per iteration in ns-3.
    """

    flow: IterationEstimate
    packet: IterationEstimate
    flow_wall: float
    packet_wall: float
    flows: int

    @property
    def error(self) -> float:
        """Relative error of the flow-level iteration time against ns-3."""
        return self.flow.total / self.packet.total - 1.0


def flow_endpoints(fabric: Fabric, links: np.ndarray) -> tuple[int, int]:
    """Source and destination server of a flow from the links of its route (all paths):
    the one node that only sends, and the one that only receives."""
    s = set(np.asarray(fabric.src)[links].tolist())
    d = set(np.asarray(fabric.dst)[links].tolist())
    a, b = s - d, d - s
    if len(a) != 1 or len(b) != 1:
        raise TopoOptError("a flow route does not lead from one server to another")
    return a.pop(), b.pop()


def _paths(fabric: Fabric, s: int, d: int, ecmp: str, key: int) -> list[tuple[np.ndarray, float]]:
    options = fabric.paths(s, d)
    if ecmp == "split" or len(options) == 1:
        return options
    w = np.array([f for _, f in options], float)
    u = (zlib.crc32(np.int64(key).tobytes()) % 1_000_003) / 1_000_003
    i = int(np.searchsorted(np.cumsum(w) / w.sum(), u, side="right"))
    return [(options[min(i, len(options) - 1)][0], 1.0)]


def iteration_dag(graph: IterationGraph, fabric: Fabric, network: Ns3Network,
                  ecmp: str = "split", ring_mode: str = "hops"):
    """The ns-3 DAG of an iteration graph.

    Returns
    -------
    dag : Dag
        Nodes ``0..N-1`` are the graph's nodes (a flow becomes a zero-time join after
        its TCP flows), TCP flows follow.
    sub_of : ndarray, shape (N,)
        Per graph node, the index of its first TCP flow in the DAG (-1 for tasks), and
        ``sub_end`` one past its last.
    sub_end : ndarray, shape (N,)
    """
    require_choice("ecmp", ecmp, ("split", "hash"))
    require_choice("ring_mode", ring_mode, ("hops", "steps"))
    w = graph.workload.compile()
    N = w.nodes
    b = DagBuilder()
    durations = np.zeros(N)
    resources = np.full(N, -1, np.int64)
    prio = np.zeros(N)
    durations[w.task_node] = w.task_duration
    resources[w.task_node] = w.task_resource
    prio[w.task_node] = w.task_priority
    prio[w.flow_node] = w.flow_node.astype(float)
    b.add_tasks(durations, resources, prio)          # ids 0..N-1, flows as joins
    orders = {int(node): order for node, order in
              zip(graph.flow_nodes[graph.flow_kind == FLOW_ALLREDUCE], graph.ring_orders)}
    sub_of = np.full(N, -1, np.int64)
    sub_end = np.full(N, -1, np.int64)
    preds: dict[int, list[int]] = {}
    for bef, aft in zip(w.dep_before.tolist(), w.dep_after.tolist()):
        preds.setdefault(aft, []).append(bef)
    routes = w.routes
    for fi, node in enumerate(w.flow_node.tolist()):
        size = float(w.flow_size[fi])
        hop_deps = None
        if node in orders:
            o = orders[node]
            if ring_mode == "steps" and len(o) > 1:
                g = len(o)
                pat = ring_allreduce(range(g), size=size * g / (2.0 * (g - 1)))
                hops = list(zip(np.asarray(o)[pat.src].tolist(), np.asarray(o)[pat.dst].tolist()))
                hop_bytes = pat.nbytes.astype(float) / size if size > 0 else np.zeros(len(hops))
                ptr, idx = flow_dependencies(pat)
                hop_deps = (idx, np.repeat(np.arange(len(hops)), np.diff(ptr)))
            else:
                hops = list(zip(o, o[1:] + o[:1]))
                hop_bytes = np.ones(len(hops))
        else:
            links = routes.link[routes.ptr[fi]:routes.ptr[fi + 1]]
            hops = [flow_endpoints(fabric, links)] if links.size else []
            hop_bytes = np.ones(len(hops))
        conns, nbytes, owner = [], [], []
        for h, (s, d) in enumerate(hops):
            for p, (path, frac) in enumerate(_paths(fabric, s, d, ecmp, node * 131 + h)):
                conns.append(network.connection(s, d, path, key=("iter", node, h, p)))
                nbytes.append(size * hop_bytes[h] * frac)
                owner.append(h)
        if not conns:
            continue
        ids = b.add_flows(conns, nbytes)
        sub_of[node], sub_end[node] = ids[0], ids[-1] + 1
        b.add_dependencies(ids, node)
        hop_of = np.asarray(owner)
        first = np.ones(len(hops), bool)
        if hop_deps is not None:     # a step waits for the flows of the previous one
            idx, after = hop_deps
            for h_before, h_after in zip(idx.tolist(), after.tolist()):
                b.add_dependencies(ids[hop_of == h_before][:, None],
                                   ids[hop_of == h_after][None, :])
            first[np.unique(after)] = False
        starters = ids[first[hop_of]]
        for q in preds.get(node, ()):
            b.add_dependencies(q, starters)
    b.add_dependencies(w.dep_before, w.dep_after)
    return b.build(), sub_of, sub_end


def replay_iteration(model: Model, strategy: Strategy, cluster: Cluster, job: Job, fabric: Fabric,
                     rings: Mapping[tuple[int, ...], Sequence[Sequence[int]]] | None = None,
                     overlap: bool = True, config: Ns3Config = Ns3Config(),
                     worker: Ns3Worker | None = None, iterations: int = 2,
                     ecmp: str = "split", ring_mode: str = "hops", wire=None,
                     limit: float = 60.0) -> IterationReplay:
    """Run one iteration of ``strategy`` on ``fabric`` at flow level and on ns-3.

    Parameters
    ----------
    model, strategy, cluster, job, fabric, rings, overlap
        As for :func:`topoopt.estimate.estimate_iteration` (MP transfers as one flow
        per pair, the estimator's exact flow-level mode).
    config : Ns3Config
    worker : Ns3Worker, optional
    iterations : int
        Iterations run back to back in ns-3; the last is reported.
    ecmp : {"split", "hash"}
        Multipath routes as one TCP flow per path, or one flow on a weighted draw.
    ring_mode : {"hops", "steps"}
        An AllReduce ring as concurrent hop flows or as the step-by-step algorithm.
    wire : topoopt.netsim.wire.WireModel, optional
        Packet overheads in the flow-level run (see :mod:`topoopt.netsim.wire`).
    limit : float
        Simulated seconds an iteration may take in ns-3.

    Returns
    -------
    IterationReplay
    """
    require_int("iterations", iterations, minimum=1)
    cache = EstimateCache(model, cluster, job)
    graph = build_iteration(model, strategy, cluster, job, fabric, rings, overlap, cache,
                            mp_flows="pair")
    t = time.perf_counter()
    work = graph.workload.compile()
    if wire is not None:
        ends = _workload_ends(graph, fabric)
        work = wire_workload(work, fabric, ends[:, 0], ends[:, 1], wire)
    flow_res = simulate(fabric, work, check=False)
    flow_wall = time.perf_counter() - t
    if wire is not None:   # drop the ACK companions again
        n = graph.workload.nodes
        flow_res = SimResult(flow_res.start[:n], flow_res.finish[:n], flow_res.tx_end[:n],
                             flow_res.is_flow[:n], flow_res.size[:n], flow_res.t0,
                             float(np.nanmax(flow_res.finish[:n])) - flow_res.t0,
                             flow_res.events, flow_res.link_bytes, flow_res.background_bytes)
    flow_est = summarize(graph, flow_res.start, flow_res.finish, flow_res.events, fabric.name)

    network = Ns3Network(fabric, config, worker)
    dag, sub_of, sub_end = iteration_dag(graph, fabric, network, ecmp, ring_mode)
    wall0 = network.wall
    res = network.run([dag] * iterations, limit=limit)[-1]
    if res is None:  # run() answers None only for a None DAG
        raise TopoOptError("ns-3 returned no result for the iteration")
    n = graph.workload.nodes
    start, finish = res.start[:n].copy(), res.finish[:n].copy()
    fl = np.flatnonzero(sub_of >= 0)
    for node in fl.tolist():
        start[node] = res.start[sub_of[node]:sub_end[node]].min()
    packet_est = summarize(graph, start, finish, 0, fabric.name)
    return IterationReplay(flow_est, packet_est, flow_wall, network.wall - wall0,
                           int(dag.size - n))


def _workload_ends(graph: IterationGraph, fabric: Fabric) -> np.ndarray:
    """Source and destination server per flow of the compiled workload (for ACK routes;
    a ring's flow goes from its first member to its second)."""
    w = graph.workload.compile()
    orders = {int(node): o for node, o in
              zip(graph.flow_nodes[graph.flow_kind == FLOW_ALLREDUCE], graph.ring_orders)}
    out = np.zeros((w.flow_node.size, 2), np.int64)
    r = w.routes
    for fi, node in enumerate(w.flow_node.tolist()):
        if node in orders:
            out[fi] = orders[node][:2] if len(orders[node]) > 1 else (orders[node][0],) * 2
        else:
            links = r.link[r.ptr[fi]:r.ptr[fi + 1]]
            out[fi] = flow_endpoints(fabric, links) if links.size else (0, 0)
    return out


@dataclass(frozen=True)
class PlanInputs:
    """What a replay needs from a plan: the job, every fabric's strategy, the shard."""

    cluster: Any
    job: Any
    model: Any
    strategies: Mapping[str, Any]
    topology: Any
    routes: Any
    rings: Mapping[tuple[int, ...], tuple[tuple[int, ...], ...]]
    predicted: Mapping[str, float]
    seed: int


def plan_inputs(directory: str | Path) -> PlanInputs:
    """Read ``DIR/plan.json`` (validated by :func:`topoopt.plans.check_plan_document`).

    Raises
    ------
    TopoOptError
        ``DIR`` holds an LLM plan: the replay runs an operator strategy's task graph,
        which an LLM plan (a parallelism, :class:`~topoopt.plans.LLMPlan`) does not have.
    PlanCheckError
        ``plan.json`` is not a valid plan.
    """
    doc = read_plan(directory)
    if is_llm_document(doc):
        raise TopoOptError(f"validate: {directory} holds an LLM plan; the ns-3 replay needs an "
                           "operator strategy's task graph, which LLM plans do not have; check "
                           f"it with topoopt plan --check {directory}, or run its rings with "
                           f"topoopt react simulate --fabric plan:{directory}")
    check_plan_document(doc)
    cluster, job = cluster_job_of(doc)
    strategies = {"topoopt": strategy_of(doc["strategy"])}
    for name, entry in doc.get("fabrics", {}).items():
        strategies[name] = strategy_of(entry["strategy"])
    return PlanInputs(cluster=cluster, job=job, model=model_of(job), strategies=strategies,
                      topology=topology_of(doc), routes=routes_of(doc), rings=rings_of(doc),
                      predicted={k: float(v) for k, v in doc["iteration_time_s"].items()},
                      seed=int(doc.get("search", {}).get("fabric_seed", 0)))


def plan_fabric(inputs: PlanInputs, name: str):
    """The fabric ``name`` of a plan: the TopoOpt shard, or a catalog baseline."""
    if name == "topoopt":
        return direct_connect(inputs.topology, inputs.routes, optics="patch_panel",
                              name="topoopt", rings=inputs.rings)
    return build_fabric(name, inputs.cluster, seed=inputs.seed, job=inputs.job,
                        model=inputs.model, strategy=inputs.strategies.get(name))


def validate_plan(directory: str | Path, fabrics: Sequence[str] | None = None,
                  config: Ns3Config = Ns3Config(), worker: Ns3Worker | None = None,
                  iterations: int = 2, ring_mode: str = "hops", ecmp: str = "split",
                  wire: bool = True, progress=None) -> list[dict]:
    """Replay the plan's iteration on each fabric at flow level and on ns-3.

    Parameters
    ----------
    directory : path
        Holds ``plan.json``.
    fabrics : sequence of str, optional
        Default: every fabric the plan has a predicted time for.
    config : Ns3Config
    worker : Ns3Worker, optional
    iterations, ring_mode, ecmp
        See :func:`replay_iteration`.
    wire : bool
        Include packet overheads (headers, ACKs; :mod:`topoopt.netsim.wire`) in the
        flow-level column.
    progress : callable, optional
        Called with each row as it is done.

    Returns
    -------
    list of dict
        Per fabric: ``fabric``, ``predicted_s`` (plan.json), ``flow_s``, ``ns3_s``,
        ``error`` (flow / ns-3 - 1), ``predicted_error``, ``flow_wall_s``,
        ``ns3_wall_s``, ``flows`` and the breakdowns.
    """
    inputs = plan_inputs(directory)  # first: an LLM plan is refused with or without ns-3
    require_ns3()
    names = list(fabrics) if fabrics else list(inputs.predicted)
    for n in names:
        if n not in inputs.strategies:
            raise ConfigError("--fabric", n, f"the plan has {', '.join(inputs.strategies)}")
    model = None
    if wire:
        model = WireModel(mtu=config.mtu)
    rows = []
    for name in names:
        fabric = plan_fabric(inputs, name)
        if fabric.servers != inputs.cluster.servers:
            raise PlanCheckError(f"fabric {name} has {fabric.servers} servers, the plan "
                                 f"{inputs.cluster.servers}")
        rings = inputs.rings if name == "topoopt" else None
        r = replay_iteration(inputs.model, inputs.strategies[name], inputs.cluster,
                             inputs.job, fabric, rings=rings, config=config, worker=worker,
                             iterations=iterations, ecmp=ecmp, ring_mode=ring_mode,
                             wire=model)
        pred = inputs.predicted.get(name, float("nan"))
        row = {"fabric": name, "predicted_s": pred, "flow_s": r.flow.total,
               "ns3_s": r.packet.total, "error": r.error,
               "predicted_error": pred / r.packet.total - 1.0,
               "flow_wall_s": r.flow_wall, "ns3_wall_s": r.packet_wall, "flows": r.flows,
               "flow": r.flow.to_json(), "ns3": r.packet.to_json()}
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows
