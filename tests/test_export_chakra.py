"""Chakra execution traces of a plan, read back with mlc-chakra's own reader and jsonizer."""

from __future__ import annotations

import json
import subprocess
import sys

import networkx as nx
import pytest

pytest.importorskip("chakra.schema.protobuf.et_def_pb2")

from topoopt.cluster import Cluster, Job  # noqa: E402
from topoopt.errors import PlanCheckError  # noqa: E402
from topoopt.export.chakra import check_chakra_traces, read_chakra_trace, write_chakra_traces  # noqa: E402
from topoopt.export.plan_dir import write_plan  # noqa: E402
from topoopt.planners.planner import plan  # noqa: E402


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    cluster = Cluster(servers=8, nics=2, link_bandwidth=100e9)
    job = Job("dlrm", batch_per_gpu=64)
    p = plan(cluster, job, budget=10, rounds=1, chains=1, seed=0, baselines=("ideal",))
    write_plan(p, out, exports=False, plots=False, report=False)
    write_chakra_traces(out)
    return out, json.loads((out / "plan.json").read_text())


def test_traces_add_up_to_the_plan(planned):
    out, doc = planned
    b = doc["breakdown"]["topoopt"]
    total = check_chakra_traces(out, doc["cluster"]["servers"],
                                b["mp_bytes"] + b["allreduce_bytes"])
    assert total["mp"] == pytest.approx(b["mp_bytes"], rel=1e-9)
    assert total["allreduce"] == pytest.approx(b["allreduce_bytes"], rel=1e-9)


def test_each_rank_is_a_dag_and_sends_meet_receives(planned):
    out, doc = planned
    sends, recvs = set(), set()
    for rank in range(doc["cluster"]["servers"]):
        meta, nodes = read_chakra_trace(out / f"chakra/et.{rank}.et")
        assert meta.version
        g = nx.DiGraph()
        g.add_nodes_from(n.id for n in nodes)
        g.add_edges_from((d, n.id) for n in nodes for d in n.data_deps)
        assert nx.is_directed_acyclic_graph(g)
        for n in nodes:
            a = {x.name: x for x in n.attr}
            if n.type in (5, 6):  # COMM_SEND_NODE, COMM_RECV_NODE
                key = (a["comm_tag"].int64_val, a["comm_src"].int64_val,
                       a["comm_dst"].int64_val, a["comm_size"].int64_val)
                (sends if n.type == 5 else recvs).add(key)
                assert rank == (key[1] if n.type == 5 else key[2])
    assert sends == recvs


def test_chakra_jsonizer_reads_them(planned, tmp_path):
    out, _ = planned
    target = tmp_path / "et0.json"
    subprocess.run([sys.executable, "-m", "chakra.src.jsonizer.jsonizer", "--input_filename",
                    str(out / "chakra/et.0.et"), "--output_filename", str(target)], check=True)
    text = target.read_text()
    assert '"version"' in text and "COMP_NODE" in text


def test_a_lost_receive_is_found(planned, tmp_path):
    out, doc = planned
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(out / "chakra", bad / "chakra")
    for rank in range(doc["cluster"]["servers"]):
        _, nodes = read_chakra_trace(bad / f"chakra/et.{rank}.et")
        if any(n.type == 6 for n in nodes):
            (bad / f"chakra/et.{rank}.et").write_bytes(b"")
            break
    else:
        pytest.skip("the plan has no MP transfers")
    with pytest.raises(PlanCheckError, match="receive"):
        check_chakra_traces(bad, doc["cluster"]["servers"])
