"""``chakra/et.<rank>.et``: a plan's iteration as MLCommons Chakra execution traces.

One trace per server rank (ASTRA-sim reads ``<prefix>.<rank>.et``, astra-sim
``astra-sim/workload/Workload.cc`` line 29), written through the ``mlc-chakra``
package's protobuf classes (``chakra.schema.protobuf.et_def_pb2``) in its
length-delimited framing (``chakra.src.third_party.utils.protolib.encodeMessage``):
a ``GlobalMetadata`` then the nodes. The source is the task graph the estimator runs
for the TopoOpt shard (:func:`topoopt.estimate.build_iteration`, one MP flow per
server pair):

* a compute task -> ``COMP_NODE`` on its server, ``duration_micros`` (ASTRA-sim
  reads microseconds, ``Workload.cc`` line 218);
* an MP flow -> ``COMM_SEND_NODE`` on its source and ``COMM_RECV_NODE`` on its
  destination, with ``comm_src``, ``comm_dst``, ``comm_tag`` (the flow's number, the
  same on both ends) and ``comm_size`` in bytes (``Workload.cc`` lines 395-429);
* an AllReduce ring flow -> ``COMM_COLL_NODE`` with ``comm_type = ALL_REDUCE`` on
  every ring member, ``pg_name`` its group's communicator id (``comm_groups.json``,
  read by ``Workload::initialize_comm_groups``, ``Workload.cc`` lines 75-99),
  ``comm_size`` = the ring's message bytes (hop bytes x k / (2(k - 1)));
* a barrier -> a zero-time ``COMP_NODE`` on every rank.

Every node also carries ``topoopt_wire_bytes``: the bytes it puts on the wire (an
AllReduce member's share, hop bytes x hops / k), so the traces of a rank sum to what
the plan's ``breakdown`` says for the fabric. Dependencies are the task graph's edges
between nodes on the same rank (``data_deps``); the exchange across ranks is what the
sends, receives and collectives carry. A compute node's ``num_ops`` is its FLOPs (the
chakra schema's field, read by ASTRA-sim's roofline model): a forward task's
operators' forward FLOPs per sample x the samples of its server
(global batch / dp / mp, :func:`topoopt.compute.op_time`'s share), a backward task's
backward FLOPs; weight updates and barriers 0. Summed over the ranks they give the
model's FLOPs per iteration (global batch x forward and backward FLOPs per sample).
An LLM plan's traces come from :mod:`topoopt.export.chakra_llm`.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from topoopt.errors import PlanCheckError
from topoopt.estimate import FLOW_ALLREDUCE, FLOW_MP, IterationGraph, build_iteration
from topoopt.fabrics import direct_connect
from topoopt.model import Model
from topoopt.plans.check import strategy_of
from topoopt.plans.common import cluster_job_of, read_plan, rings_of, routes_of, topology_of
from topoopt.plans.replay import flow_endpoints, plan_inputs
from topoopt.workloads import model_of

__all__ = ["CHAKRA_DIR", "COMM_GROUPS", "ChakraTraces", "task_flops", "chakra_traces",
           "encode_chakra_traces", "operator_chakra_traces", "operator_plan_flops",
           "write_chakra_traces", "read_chakra_trace",
           "check_chakra_traces"]

CHAKRA_DIR = "chakra"
COMM_GROUPS = "chakra/comm_groups.json"
_VERSION = "0.0.4"  # the GlobalMetadata version ASTRA-sim's feeder accepts


@dataclass(frozen=True)
class ChakraTraces:
    """Per rank, the node records ``(name, type, attrs, deps, duration_us)``, and the
    communicator groups (id -> ranks). A compute node's FLOPs are its ``num_ops``
    attribute."""

    ranks: int
    nodes: tuple[tuple[tuple[str, str, dict, tuple[int, ...], int], ...], ...]
    groups: dict[str, list[int]]


def _pb() -> Any:
    from chakra.schema.protobuf import et_def_pb2  # type: ignore[import-untyped]  # optional
    return et_def_pb2


def task_flops(graph: IterationGraph, model: Model, global_batch: int) -> np.ndarray:
    """FLOPs of each compute task of ``graph`` (see the module docstring).

    Raises
    ------
    PlanCheckError
        The graph's tasks are not laid out by segment (forward, backward in reverse
        order, updates) as :class:`~topoopt.estimate.builder.IterationGraphBuilder` does.
    """
    fwd, bwd, servers = [], [], []
    for seg in graph.segments:
        per = global_batch / seg.config.dp / seg.config.mp
        fwd.append(sum(model.operators[o].fwd_flops for o in seg.ops) * per)
        bwd.append(sum(model.operators[o].bwd_flops for o in seg.ops) * per)
        servers.append(list(seg.config.servers))
    flops = [f for f, srv in zip(fwd, servers) for _ in srv]
    flops += [b for b, srv in zip(bwd[::-1], servers[::-1]) for _ in srv]
    order = [s for srv in servers for s in srv] + [s for srv in servers[::-1] for s in srv]
    if graph.tasks < len(order) or graph.task_server[:len(order)].tolist() != order:
        raise PlanCheckError("the task graph is not laid out by segment; cannot give its "
                             "tasks FLOPs")
    return np.array(flops + [0.0] * (graph.tasks - len(order)))


def chakra_traces(graph: IterationGraph, fabric: Any, servers: int,
                  flops: np.ndarray | None = None) -> ChakraTraces:
    """The Chakra node records of ``graph`` per server rank (see the module docstring).

    Parameters
    ----------
    graph : IterationGraph
        Built with ``mp_flows="pair"`` (one MP flow per server pair).
    fabric : Fabric
        The fabric the graph is routed on (flow endpoints come from its links).
    servers : int
    flops : ndarray, optional
        FLOPs per compute task (:func:`task_flops`), written as ``num_ops``.

    Returns
    -------
    ChakraTraces
    """
    t, nf = graph.tasks, graph.flow_kind.size
    count = graph.counts()
    routes = graph.flow_routes()
    recs: list[list[list]] = [[] for _ in range(servers)]
    where: dict[int, dict[int, int]] = {}  # graph node -> rank -> local id

    def add(node: int, rank: int, name: str, kind: str, attrs: dict, dur: int = 0) -> None:
        where.setdefault(node, {})[rank] = len(recs[rank])
        recs[rank].append([name, kind, attrs, [], dur])

    for i in range(t):
        attrs: dict[str, Any] = {"is_cpu_op": False}
        if flops is not None:
            attrs["num_ops"] = int(round(flops[i]))
        add(i, int(graph.task_server[i]), f"task{i}", "COMP_NODE", attrs,
            int(round(graph.task_duration[i] * 1e6)))
    groups: dict[str, list[int]] = {}
    ring_of = iter(graph.ring_orders)
    for f in range(nf):
        node, nbytes = t + f, float(graph.flow_bytes[f]) * int(count[f])
        if graph.flow_kind[f] == FLOW_MP:
            s, d = flow_endpoints(fabric, routes.link[routes.ptr[f]:routes.ptr[f + 1]])
            attrs = {"comm_src": s, "comm_dst": d, "comm_tag": f,
                     "comm_size": int(round(nbytes)), "topoopt_wire_bytes": nbytes}
            add(node, s, f"send{f}", "COMM_SEND_NODE", dict(attrs))
            add(node, d, f"recv{f}", "COMM_RECV_NODE", {**attrs, "topoopt_wire_bytes": 0.0})
        elif graph.flow_kind[f] == FLOW_ALLREDUCE:
            ring = tuple(int(r) for r in next(ring_of))
            members = sorted(ring)
            pg = next((k for k, v in groups.items() if v == members), str(len(groups) + 1))
            groups[pg] = members
            k, hops = len(ring), int(graph.hop_count[f])
            size = nbytes * k / (2 * (k - 1)) if k > 1 else 0.0
            for r in ring:
                add(node, r, f"allreduce{f}", "COMM_COLL_NODE",
                    {"comm_type": "ALL_REDUCE", "pg_name": pg, "comm_size": int(round(size)),
                     "topoopt_wire_bytes": nbytes * hops / k})
    for b in range(graph.barriers):
        for r in range(servers):
            add(t + nf + b, r, f"barrier{b}", "COMP_NODE", {"is_cpu_op": False})
    for before, after in zip(graph.dep_before.tolist(), graph.dep_after.tolist()):
        for rank, local in where.get(after, {}).items():
            dep = where.get(before, {}).get(rank)
            if dep is not None:
                recs[rank][local][3].append(dep)
    nodes = tuple(tuple((n, k, a, tuple(sorted(set(d))), u) for n, k, a, d, u in rank)
                  for rank in recs)
    return ChakraTraces(servers, nodes, groups)


def _attr_field(name: str, value: Any) -> str:
    """The ``AttributeProto`` field that carries ``name``'s ``value``."""
    if isinstance(value, bool):
        return "bool_val"
    if name == "num_ops":  # ASTRA-sim reads it as uint64 (Workload.cc line 253)
        return "uint64_val"
    if isinstance(value, str) and name != "comm_type":
        return "string_val"
    if isinstance(value, float):
        return "double_val"
    return "int64_val"


def encode_chakra_traces(traces: ChakraTraces) -> dict[str, bytes]:
    """``chakra/et.<rank>.et`` bytes per rank, and ``chakra/comm_groups.json``."""
    from chakra.src.third_party.utils.protolib import encodeMessage  # type: ignore[import-untyped]
    pb = _pb()
    node_type = {k: pb.NodeType.Value(k) for k in pb.NodeType.keys()}
    comm_type = {k: pb.CollectiveCommType.Value(k) for k in pb.CollectiveCommType.keys()}
    out: dict[str, bytes] = {}
    for rank, nodes in enumerate(traces.nodes):
        buf = io.BytesIO()
        encodeMessage(buf, pb.GlobalMetadata(version=_VERSION))
        for nid, (name, kind, attrs, deps, dur) in enumerate(nodes):
            node = pb.Node(id=nid, name=name, type=node_type[kind], duration_micros=dur,
                           data_deps=deps)
            add = node.attr.add
            for k, v in attrs.items():   # fields filled in place: no message copied
                field = _attr_field(k, v)
                value = (comm_type[v] if k == "comm_type" else
                         v if field in ("bool_val", "string_val", "double_val") else int(v))
                add(name=k, **{field: value})
            encodeMessage(buf, node)
        out[f"{CHAKRA_DIR}/et.{rank}.et"] = buf.getvalue()
    out[COMM_GROUPS] = (json.dumps(traces.groups, indent=1, sort_keys=True) + "\n").encode()
    return out


def operator_chakra_traces(doc: dict) -> ChakraTraces:
    """The Chakra node records of an operator plan's TopoOpt shard iteration, from its
    ``plan.json`` document (the task graph :func:`topoopt.estimate.build_iteration`
    builds for the plan's strategy, topology, routes and rings; one MP flow per server
    pair), compute nodes with their FLOPs (:func:`task_flops`)."""
    cluster, job = cluster_job_of(doc)
    model = model_of(job)
    fabric = direct_connect(topology_of(doc), routes_of(doc), optics="patch_panel",
                            name="topoopt", rings=rings_of(doc))
    graph = build_iteration(model, strategy_of(doc["strategy"]), cluster, job, fabric,
                            rings_of(doc), mp_flows="pair")
    return chakra_traces(graph, fabric, cluster.servers,
                         task_flops(graph, model, job.global_batch(cluster)))


def operator_plan_flops(doc: dict) -> float:
    """Training FLOPs of one iteration of an operator plan's model: global batch x the
    forward and backward FLOPs per sample of every operator (whatever the strategy)."""
    cluster, job = cluster_job_of(doc)
    return job.global_batch(cluster) * sum(op.fwd_flops + op.bwd_flops
                                           for op in model_of(job).operators)


def write_chakra_traces(plan_dir: str | Path, out: str | Path | None = None) -> list[Path]:
    """Write the Chakra traces of the TopoOpt shard's iteration of the operator plan in
    ``plan_dir`` (:func:`operator_chakra_traces`).

    Parameters
    ----------
    plan_dir : path
        A plan folder (an operator plan: ``plan.json`` with a strategy).
    out : path, optional
        Folder to write ``chakra/`` into (default ``plan_dir``).

    Returns
    -------
    list of Path
        The files written.

    References
    ----------
    MLCommons Chakra schema, ``et_def.proto`` (package ``mlc-chakra`` 1.0.0);
    ASTRA-sim ``astra-sim/workload/Workload.cc`` (commit 518bd51).
    """
    plan_inputs(plan_dir)  # an operator plan, checked
    doc = read_plan(plan_dir)
    files = encode_chakra_traces(operator_chakra_traces(doc))
    base = Path(out if out is not None else plan_dir)
    paths = []
    for rel, data in sorted(files.items()):
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(data)
        paths.append(base / rel)
    return paths


def read_chakra_trace(path: str | Path) -> tuple[Any, list[Any]]:
    """Read one ``.et`` file with chakra's own decoder: ``(GlobalMetadata, nodes)``."""
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd
    pb = _pb()
    handle = openFileRd(str(path))
    try:
        meta = pb.GlobalMetadata()
        decodeMessage(handle, meta)
        nodes = []
        node = pb.Node()
        while decodeMessage(handle, node):
            nodes.append(node)
            node = pb.Node()
    finally:
        handle.close()
    return meta, nodes


def _attrs(node: Any) -> dict[str, Any]:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


def check_chakra_traces(directory: str | Path, ranks: int, wire_bytes: float | None = None,
                        flops: float | None = None) -> dict[str, float]:
    """Read ``chakra/et.*.et`` back and check them; return the summed wire bytes
    (``mp``, ``allreduce``) and FLOPs (``flops``).

    Checks: one trace per rank, every rank's ``data_deps`` acyclic and pointing at
    existing nodes, every send has exactly one receive (same tag, ends and size) on
    its destination, every collective's ``pg_name`` in ``comm_groups.json`` holding
    that rank, and (``wire_bytes``, ``flops``) the wire bytes and the compute nodes'
    ``num_ops`` adding up to the plan's.

    Raises
    ------
    PlanCheckError
        Naming the first violation.
    """
    directory = Path(directory)
    groups = json.loads((directory / COMM_GROUPS).read_text(encoding="utf-8"))
    pb = _pb()
    sends, recvs = {}, {}
    total = {"mp": 0.0, "allreduce": 0.0, "flops": 0.0}
    for rank in range(ranks):
        rel = f"{CHAKRA_DIR}/et.{rank}.et"
        if not (directory / rel).is_file():
            raise PlanCheckError(f"{rel} is missing")
        _, nodes = read_chakra_trace(directory / rel)
        ids = {n.id for n in nodes}
        indeg = {n.id: 0 for n in nodes}
        succ: dict[int, list[int]] = {n.id: [] for n in nodes}
        for n in nodes:
            for d in n.data_deps:
                if d not in ids:
                    raise PlanCheckError(f"{rel}: node {n.id} depends on missing node {d}")
                succ[d].append(n.id)
                indeg[n.id] += 1
            a = _attrs(n)
            if n.type == pb.COMP_NODE:
                total["flops"] += float(a.get("num_ops", 0))
            elif n.type == pb.COMM_SEND_NODE:
                sends[(a["comm_tag"])] = (rank, a["comm_src"], a["comm_dst"], a["comm_size"])
                total["mp"] += a["topoopt_wire_bytes"]
            elif n.type == pb.COMM_RECV_NODE:
                recvs[(a["comm_tag"])] = (rank, a["comm_src"], a["comm_dst"], a["comm_size"])
            elif n.type == pb.COMM_COLL_NODE:
                if rank not in groups.get(a["pg_name"], []):
                    raise PlanCheckError(f"{rel}: node {n.id} in group {a['pg_name']} "
                                         "that does not hold this rank")
                total["allreduce"] += a["topoopt_wire_bytes"]
        ready = [i for i, v in indeg.items() if v == 0]
        seen = 0
        while ready:
            i = ready.pop()
            seen += 1
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    ready.append(j)
        if seen != len(nodes):
            raise PlanCheckError(f"{rel}: the dependencies have a cycle")
    for tag, (rank, s, d, size) in sends.items():
        got = recvs.get(tag)
        if rank != s or got is None or got != (d, s, d, size):
            raise PlanCheckError(f"send {tag} from rank {s} to {d} has no matching receive")
    if len(recvs) != len(sends):
        raise PlanCheckError(f"{len(recvs) - len(sends)} receives have no send")
    if wire_bytes is not None:
        got_total = total["mp"] + total["allreduce"]
        if not np.isclose(got_total, wire_bytes, rtol=1e-9):
            raise PlanCheckError(f"the traces carry {got_total:.6g} bytes, the plan "
                                 f"{wire_bytes:.6g}")
    if flops is not None and not np.isclose(total["flops"], flops, rtol=1e-6):
        raise PlanCheckError(f"the traces' compute nodes carry {total['flops']:.6g} FLOPs, "
                             f"the plan's model {flops:.6g}")
    return total
