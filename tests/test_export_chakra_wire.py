"""The columnar Chakra traces and their wire bytes against a node-by-node reference.

The reference is the straightforward form the columns replace: a record per node
built in a Python loop over the task graph (or the LLM plan's traffic), encoded one
``et_def_pb2.Node`` message at a time through mlc-chakra's own ``encodeMessage``. The
columnar traces must give the same records and the same bytes, file for file.
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("chakra.schema.protobuf.et_def_pb2")

from chakra.schema.protobuf import et_def_pb2 as pb  # noqa: E402
from chakra.src.third_party.utils.protolib import encodeMessage  # noqa: E402

from topoopt.cluster import GPUS, Cluster, Job  # noqa: E402
from topoopt.config import load_config  # noqa: E402
from topoopt.estimate import FLOW_ALLREDUCE, FLOW_MP, build_iteration  # noqa: E402
from topoopt.export import chakra_wire  # noqa: E402
from topoopt.export.chakra import (  # noqa: E402
    ChakraTraces,
    encode_chakra_traces,
    operator_chakra_traces,
    task_flops,
)
from topoopt.export.chakra_llm import llm_chakra_traces, llm_plan_flops  # noqa: E402
from topoopt.export.plan_dir import write_plan  # noqa: E402
from topoopt.fabrics import direct_connect  # noqa: E402
from topoopt.llm import LLMParallel, llm_traffic  # noqa: E402
from topoopt.planners.llm import plan_llm  # noqa: E402
from topoopt.planners.planner import plan  # noqa: E402
from topoopt.plans.check import strategy_of  # noqa: E402
from topoopt.plans.common import cluster_job_of, read_plan, rings_of, routes_of, topology_of  # noqa: E402
from topoopt.plans.replay import flow_endpoints  # noqa: E402
from topoopt.workloads import model_of  # noqa: E402
from topoopt.workloads.gpt import transformer_shape  # noqa: E402

LLM_CLUSTER = Cluster(servers=8, nics=4, link_bandwidth=100e9, gpus_per_server=4,
                      gpu=GPUS["H100"], intra_server_bandwidth=GPUS["H100"].nvlink_bandwidth,
                      compute_efficiency=0.52)


def reference_bytes(ranks: int, nodes, groups) -> dict[str, bytes]:
    """One protobuf message per record, as mlc-chakra's tools write them."""
    out = {}
    for rank, recs in enumerate(nodes):
        buf = io.BytesIO()
        encodeMessage(buf, pb.GlobalMetadata(version="0.0.4"))
        for nid, (name, kind, attrs, deps, dur) in enumerate(recs):
            node = pb.Node(id=nid, name=name, type=pb.NodeType.Value(kind),
                           duration_micros=dur, data_deps=deps)
            for k, v in attrs.items():
                if isinstance(v, bool):
                    node.attr.add(name=k, bool_val=v)
                elif k == "num_ops":
                    node.attr.add(name=k, uint64_val=int(v))
                elif k == "comm_type":
                    node.attr.add(name=k, int64_val=pb.CollectiveCommType.Value(v))
                elif isinstance(v, str):
                    node.attr.add(name=k, string_val=v)
                elif isinstance(v, float):
                    node.attr.add(name=k, double_val=v)
                else:
                    node.attr.add(name=k, int64_val=int(v))
            encodeMessage(buf, node)
        out[f"chakra/et.{rank}.et"] = buf.getvalue()
    out["chakra/comm_groups.json"] = (json.dumps(groups, indent=1, sort_keys=True)
                                      + "\n").encode()
    return out


def reference_operator_records(doc: dict):
    """A record per node of the plan's task graph, graph node by graph node."""
    cluster, job = cluster_job_of(doc)
    model = model_of(job)
    fabric = direct_connect(topology_of(doc), routes_of(doc), optics="patch_panel",
                            name="topoopt", rings=rings_of(doc))
    graph = build_iteration(model, strategy_of(doc["strategy"]), cluster, job, fabric,
                            rings_of(doc), mp_flows="pair")
    flops = task_flops(graph, model, job.global_batch(cluster))
    servers, t, nf = cluster.servers, graph.tasks, graph.flow_kind.size
    count, routes = graph.counts(), graph.flow_routes()
    recs: list[list[list]] = [[] for _ in range(servers)]
    where: dict[int, dict[int, int]] = {}

    def add(node, rank, name, kind, attrs, dur=0):
        where.setdefault(node, {})[rank] = len(recs[rank])
        recs[rank].append([name, kind, attrs, [], dur])

    for i in range(t):
        add(i, int(graph.task_server[i]), f"task{i}", "COMP_NODE",
            {"is_cpu_op": False, "num_ops": int(round(flops[i]))},
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
    return (tuple(tuple((n, k, a, tuple(sorted(set(d))), u) for n, k, a, d, u in rank)
                  for rank in recs), groups)


def reference_llm_records(doc: dict):
    """A record per node of an LLM plan, server pair by server pair."""
    cluster, job = cluster_job_of(doc)
    t = llm_traffic(transformer_shape(model_of(job)), LLMParallel.from_dict(doc["llm"]["parallel"]),
                    cluster.servers, cluster.gpus_per_server, job.global_batch(cluster),
                    job.dtype_bytes)
    n = cluster.servers
    compute = float(doc["llm"]["fabrics"]["topoopt"]["iteration"]["compute"])
    flops = llm_plan_flops(doc) / n
    recs = [[("compute", "COMP_NODE", {"is_cpu_op": False, "num_ops": int(round(flops))},
              (), int(round(compute * 1e6)))] for _ in range(n)]
    tag = 0
    for kind, matrix in (("pp", t.pp_steps * (t.pp_step + t.pp_step.T)),
                         ("ep", t.micro_batches * t.ep_steps_per_micro_batch * t.ep_step)):
        m = np.array(matrix, dtype=float)
        np.fill_diagonal(m, 0.0)
        for s, d in zip(*np.nonzero(m)):
            s, d = int(s), int(d)
            nbytes = float(m[s, d])
            attrs = {"comm_src": s, "comm_dst": d, "comm_tag": tag,
                     "comm_size": int(round(nbytes))}
            recs[s].append((f"{kind}_send{tag}", "COMM_SEND_NODE",
                            {**attrs, "topoopt_wire_bytes": nbytes}, (0,), 0))
            recs[d].append((f"{kind}_recv{tag}", "COMM_RECV_NODE",
                            {**attrs, "topoopt_wire_bytes": 0.0}, (0,), 0))
            tag += 1
    groups: dict[str, list[int]] = {}
    for g in t.dp_groups:
        members = sorted(int(x) for x in g.members)
        k = len(members)
        if k < 2:
            continue
        pg = str(len(groups) + 1)
        groups[pg] = members
        for r in members:
            recs[r].append((f"dp_allreduce{pg}", "COMM_COLL_NODE",
                            {"comm_type": "ALL_REDUCE", "pg_name": pg,
                             "comm_size": int(round(g.network_bytes / (2 * (k - 1)))),
                             "topoopt_wire_bytes": g.network_bytes / k}, (0,), 0))
    return tuple(tuple(r) for r in recs), groups


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    cfg = load_config(Path(__file__).parents[1] / "configs/dlrm-16.toml")  # rings of 8
    dlrm = plan(cfg.cluster, cfg.job, budget=2, rounds=1, chains=1, seed=0,
                baselines=("ideal",))
    moe = Job("mixtral-8x7b", 2, "bf16", size={"layers": 4, "seq": 512})
    dense = Job("llama3-8b", 2, "bf16", size={"layers": 4, "seq": 512})
    plans = {"dlrm": dlrm,
             "dense": plan_llm(LLM_CLUSTER, dense, top=1, fixed={"tp": 4, "pp": 2}),
             "moe": plan_llm(LLM_CLUSTER, moe, top=1, fixed={"tp": 1, "pp": 2, "ep": 8})}
    out = {}
    for name, p in plans.items():
        d = tmp_path_factory.mktemp(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_plan(p, d, exports=False, plots=False, report=False)
        out[name] = read_plan(d)
    return out


def test_operator_traces_are_the_reference_node_for_node(docs):
    want, groups = reference_operator_records(docs["dlrm"])
    traces = operator_chakra_traces(docs["dlrm"])
    kinds = {rec[1] for rank in want for rec in rank}
    assert kinds == {"COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE"}
    assert any(rec[0].startswith("barrier") for rank in want for rec in rank)
    assert traces.records() == want
    assert traces.groups == groups
    assert encode_chakra_traces(traces) == reference_bytes(16, want, groups)


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_llm_traces_are_the_reference_node_for_node(docs, name):
    want, groups = reference_llm_records(docs[name])
    names = {rec[0].rstrip("0123456789") for rank in want for rec in rank}
    assert {"compute", "pp_send", "pp_recv"} <= names
    assert name == "dense" or {"ep_send", "ep_recv", "dp_allreduce"} <= names
    traces = llm_chakra_traces(docs[name])
    assert traces.records() == want
    assert encode_chakra_traces(traces) == reference_bytes(8, want, groups)


EDGES = (
    ("", "COMP_NODE", {"num_ops": 2 ** 64 - 1, "is_cpu_op": True}, (), 0),
    ("n" * 200, "COMM_COLL_NODE", {"comm_type": "ALL_GATHER", "pg_name": "g" * 300,
                                  "comm_size": -5, "topoopt_wire_bytes": -0.0}, (0,), 2 ** 40),
    ("é", "COMM_SEND_NODE", {"comm_src": 0, "comm_dst": 1, "comm_tag": 2 ** 63 - 1,
                             "comm_size": 0, "topoopt_wire_bytes": 1e300}, (1, 0), 127),
    ("x", "INVALID_NODE", {"pg_name": "", "is_cpu_op": False}, (), 128),
)


def test_edge_values_encode_as_protobuf_does(monkeypatch):
    many = [(f"c{i}", "COMP_NODE", {"num_ops": i * 1000}, tuple(range(i)), i) for i in range(200)]
    nodes = (EDGES, (), tuple(many), EDGES[:1])
    groups = {"1": [0, 2], "2": [1]}
    want = reference_bytes(4, nodes, groups)
    traces = ChakraTraces.from_records(4, nodes, groups)
    assert traces.records() == nodes
    assert encode_chakra_traces(traces) == want
    monkeypatch.setattr(chakra_wire, "_CHUNK", 3)   # ranks encoded a few at a time
    assert encode_chakra_traces(traces) == want


def test_records_with_conflicting_attribute_orders_are_refused():
    nodes = ((("a", "COMP_NODE", {"x": 1, "y": 2}, (), 0),
              ("b", "COMP_NODE", {"y": 1, "x": 2}, (), 0)),)
    with pytest.raises(ValueError, match="order"):
        ChakraTraces.from_records(1, nodes, {})
    with pytest.raises(ValueError, match="types"):
        ChakraTraces.from_records(1, ((("a", "COMP_NODE", {"x": 1}, (), 0),
                                       ("b", "COMP_NODE", {"x": 1.5}, (), 0)),), {})
