"""``chakra/et.<rank>.et``: a plan's iteration as MLCommons Chakra execution traces.

One trace per server rank (ASTRA-sim reads ``<prefix>.<rank>.et``, astra-sim
``astra-sim/workload/Workload.cc`` line 29): the bytes the ``mlc-chakra`` package's
protobuf classes (``chakra.schema.protobuf.et_def_pb2``) give in its length-delimited
framing (``chakra.src.third_party.utils.protolib.encodeMessage``), a
``GlobalMetadata`` then the nodes, written by columns of nodes rather than a message
per node (:mod:`topoopt.export.chakra_wire`). The source is the task graph the estimator runs
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
from pathlib import Path
from typing import Any

import numpy as np

from topoopt.errors import PlanCheckError, TopoOptError
from topoopt.estimate import FLOW_ALLREDUCE, FLOW_MP, IterationGraph, build_iteration
from topoopt.export.chakra_wire import ChakraTraces, TraceBuilder, encode_ranks, sorted_unique
from topoopt.fabrics import direct_connect
from topoopt.model import Model
from topoopt.plans.check import strategy_of
from topoopt.plans.common import cluster_job_of, read_plan, rings_of, routes_of, topology_of
from topoopt.plans.replay import plan_inputs
from topoopt.workloads import model_of

__all__ = ["CHAKRA_DIR", "COMM_GROUPS", "ChakraTraces", "task_flops", "chakra_traces",
           "encode_chakra_traces", "operator_chakra_traces", "operator_plan_flops",
           "write_chakra_traces", "read_chakra_trace",
           "check_chakra_traces"]

CHAKRA_DIR = "chakra"
COMM_GROUPS = "chakra/comm_groups.json"
_VERSION = "0.0.4"  # the GlobalMetadata version ASTRA-sim's feeder accepts


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
    nbytes = graph.flow_bytes.astype(float) * graph.counts()
    b = TraceBuilder(servers)
    attrs: dict[str, Any] = {"is_cpu_op": False}
    if flops is not None:
        attrs["num_ops"] = np.round(np.asarray(flops, float)[:t]).astype(np.int64)
    b.add(np.arange(t), graph.task_server, "COMP_NODE", "task", np.arange(t), attrs,
          np.round(graph.task_duration * 1e6).astype(np.int64))
    mp = np.flatnonzero(graph.flow_kind == FLOW_MP)
    src, dst = _route_ends(fabric, graph, mp)
    size = np.round(nbytes[mp]).astype(np.int64)
    for kind, name, rank, wire in (("COMM_SEND_NODE", "send", src, nbytes[mp]),
                                   ("COMM_RECV_NODE", "recv", dst, 0.0)):
        b.add(t + mp, rank, kind, name, mp,
              {"comm_src": src, "comm_dst": dst, "comm_tag": mp, "comm_size": size,
               "topoopt_wire_bytes": wire})
    groups = _add_rings(b, graph, nbytes)
    bar = np.arange(graph.barriers)
    b.add(np.repeat(t + nf + bar, servers), np.tile(np.arange(servers), bar.size),
          "COMP_NODE", "barrier", np.repeat(bar, servers), {"is_cpu_op": False})
    return b.build(graph.dep_before, graph.dep_after, groups)


def _route_ends(fabric: Any, graph: IterationGraph, flows: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Source and destination server of each of ``flows`` (as
    :func:`~topoopt.plans.replay.flow_endpoints` reads them from its route's links),
    found once per route class: flows of one class share their ends.

    Raises
    ------
    TopoOptError
        A route does not lead from one server to another.
    """
    cls, inv = np.unique(graph.flow_class[flows], return_inverse=True)
    ptr, link = graph.routes.ptr, graph.routes.link
    cnt = ptr[cls + 1] - ptr[cls]
    row = np.repeat(np.arange(cls.size), cnt)
    j = np.repeat(ptr[cls] - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
    s, d = np.asarray(fabric.src)[link[j]], np.asarray(fabric.dst)[link[j]]
    width = int(max(s.max(initial=0), d.max(initial=0))) + 1
    ks, kd = sorted_unique(row * width + s), sorted_unique(row * width + d)
    ends = []
    for only in (ks[~np.isin(ks, kd, assume_unique=True)],
                 kd[~np.isin(kd, ks, assume_unique=True)]):
        if (np.bincount(only // width, minlength=cls.size) != 1).any():
            raise TopoOptError("a flow route does not lead from one server to another")
        ends.append((only % width)[inv.ravel()])
    return ends[0], ends[1]


def _add_rings(b: TraceBuilder, graph: IterationGraph, nbytes: np.ndarray
               ) -> dict[str, list[int]]:
    """Add a ``COMM_COLL_NODE`` per AllReduce ring flow and member; return the groups."""
    ar = np.flatnonzero(graph.flow_kind == FLOW_ALLREDUCE)
    groups: dict[str, list[int]] = {}
    pg_of: dict[tuple[int, ...], str] = {}
    rings, pgs = [], []
    for ring in graph.ring_orders[:ar.size]:
        members = tuple(sorted(int(r) for r in ring))
        pg = pg_of.setdefault(members, str(len(pg_of) + 1))
        groups[pg] = list(members)
        rings.append(np.asarray(ring, np.int64))
        pgs.append(pg)
    k = np.array([r.size for r in rings], np.int64)
    hops = graph.hop_count[ar].astype(np.int64)
    nb = nbytes[ar]
    size = np.where(k > 1, nb * k / (2 * np.maximum(k - 1, 1)), 0.0)
    b.add(np.repeat(graph.tasks + ar, k), np.concatenate(rings + [np.zeros(0, np.int64)]),
          "COMM_COLL_NODE", "allreduce", np.repeat(ar, k),
          {"comm_type": "ALL_REDUCE", "pg_name": np.repeat(np.array(pgs, object), k),
           "comm_size": np.repeat(np.round(size).astype(np.int64), k),
           "topoopt_wire_bytes": np.repeat(nb * hops / k, k)})
    return groups


def encode_chakra_traces(traces: ChakraTraces) -> dict[str, bytes]:
    """``chakra/et.<rank>.et`` bytes per rank, and ``chakra/comm_groups.json``: the bytes
    mlc-chakra's protobuf classes and ``encodeMessage`` give
    (:func:`~topoopt.export.chakra_wire.encode_ranks`)."""
    from chakra.src.third_party.utils.protolib import encodeMessage  # type: ignore[import-untyped]
    pb = _pb()
    head = io.BytesIO()
    encodeMessage(head, pb.GlobalMetadata(version=_VERSION))
    node_type = {k: pb.NodeType.Value(k) for k in pb.NodeType.keys()}
    comm_type = {k: pb.CollectiveCommType.Value(k) for k in pb.CollectiveCommType.keys()}
    files = encode_ranks(traces, head.getvalue(), node_type, comm_type)
    out = {f"{CHAKRA_DIR}/et.{rank}.et": data for rank, data in enumerate(files)}
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
