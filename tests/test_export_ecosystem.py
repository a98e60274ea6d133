"""Chakra traces, ASTRA-sim inputs and NCCL graph files, written by write_plan for an
operator (DLRM) and an LLM plan and read back: the traces with mlc-chakra's own
decoder, the NCCL graphs by NCCL's reader rules (NVIDIA/nccl master 5067397,
src/graph/search.cc and xml.cc lines cited in topoopt.export.nccl_graph), the ns-3
topology as astra-network-ns3's SetupNetwork reads it."""

from __future__ import annotations

import json
import shutil
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import networkx as nx
import pytest

pytest.importorskip("chakra.schema.protobuf.et_def_pb2")

from topoopt.cluster import GPUS, Cluster, Job  # noqa: E402
from topoopt.config import load_config  # noqa: E402
from topoopt.errors import (
    ConfigError,  # noqa: E402
    PlanCheckError,  # noqa: E402
)
from topoopt.export.astra_sim import parse_ns3_topology  # noqa: E402
from topoopt.export.chakra import ChakraTraces, encode_chakra_traces, read_chakra_trace  # noqa: E402
from topoopt.export.chakra_import import chakra_workload  # noqa: E402
from topoopt.export.msccl import parse_msccl_xml  # noqa: E402
from topoopt.export.nccl_graph import check_nccl_graph  # noqa: E402
from topoopt.export.plan_dir import check_plan_dir, write_plan  # noqa: E402
from topoopt.planners.llm import plan_llm  # noqa: E402
from topoopt.planners.planner import plan  # noqa: E402
from topoopt.workloads import model_of  # noqa: E402
from topoopt.workloads.gpt import transformer_shape  # noqa: E402

LLM_CLUSTER = Cluster(servers=8, nics=4, link_bandwidth=100e9, gpus_per_server=4,
                      gpu=GPUS["H100"], intra_server_bandwidth=GPUS["H100"].nvlink_bandwidth,
                      compute_efficiency=0.52)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    cfg = load_config(Path(__file__).parents[1] / "configs/dlrm-16.toml")  # DLRM-16, a short search: rings of 8
    dlrm = plan(cfg.cluster, cfg.job, budget=2, rounds=1, chains=1, seed=0,
                baselines=("ideal",))
    dense = Job("llama3-8b", 2, "bf16", size={"layers": 4, "seq": 512})
    llm = plan_llm(LLM_CLUSTER, dense, top=2, fixed={"tp": 4, "pp": 2})
    llm_dp = plan_llm(LLM_CLUSTER, dense, top=1, fixed={"tp": 4, "pp": 1})
    out = {}
    for name, p, runtime in (("dlrm", dlrm, "msccl-executor-nccl"),
                             ("llm", llm, "msccl-executor-nccl"),
                             ("dlrm-msccl", dlrm, "msccl"),
                             ("llm-dp", llm_dp, "msccl-executor-nccl"),
                             ("llm-dp-msccl", llm_dp, "msccl")):
        d = tmp_path_factory.mktemp(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_plan(p, d, plots=False, report=False, msccl_runtime=runtime)
        out[name] = d
    return out


def _doc(d):
    return json.loads((d / "plan.json").read_text())


@pytest.mark.parametrize("name", ["dlrm", "llm"])
def test_listed_and_checked(folders, name):
    d = folders[name]
    doc = _doc(d)
    n = doc["cluster"]["servers"]
    for rel in [f"chakra/et.{r}.et" for r in range(n)] + [
            "chakra/comm_groups.json", "astra_sim/system.json", "astra_sim/analytical.yml",
            "astra_sim/ns3/topology.txt", "astra_sim/ns3/config.txt", "nccl/launch.json",
            "mscclpp_allreduce.json"]:
        assert rel in doc["files"]
    checked = check_plan_dir(d, simulate=False)
    assert {"chakra/et.0.et", "nccl/launch.json", "mscclpp_allreduce.json"} <= set(checked)


@pytest.mark.parametrize("name", ["dlrm", "llm"])
def test_traces_carry_the_models_flops_and_the_plans_bytes(folders, name):
    d = folders[name]
    doc = _doc(d)
    c = doc["cluster"]
    flops = wire = 0.0
    for r in range(c["servers"]):
        _, nodes = read_chakra_trace(d / f"chakra/et.{r}.et")
        g = nx.DiGraph()
        g.add_nodes_from(x.id for x in nodes)
        g.add_edges_from((p, x.id) for x in nodes for p in x.data_deps)
        assert nx.is_directed_acyclic_graph(g)
        for x in nodes:
            a = {y.name: y for y in x.attr}
            if x.type == 4:  # COMP_NODE
                flops += a["num_ops"].uint64_val if "num_ops" in a else 0
            if "topoopt_wire_bytes" in a:
                wire += a["topoopt_wire_bytes"].double_val
    model = model_of(Job(**{k: v for k, v in doc["job"].items()
                            if k in ("model", "batch_per_gpu", "precision", "size")}))
    batch = c["servers"] * c["gpus_per_server"] * doc["job"]["batch_per_gpu"]
    if name == "dlrm":  # independent: global batch x FLOPs per sample of every operator
        want = batch * sum(op.fwd_flops + op.bwd_flops for op in model.operators)
        b = doc["breakdown"]["topoopt"]
        want_bytes = b["mp_bytes"] + b["allreduce_bytes"]
    else:  # 6 N-style FLOPs per token from the model's shape x tokens
        shape = transformer_shape(model)
        want = shape.training_flops_per_token() * batch * shape.seq
        want_bytes = sum(doc["llm"]["fabrics"]["topoopt"]["network_bytes"].values())
    assert flops == pytest.approx(want, rel=1e-6)
    assert wire == pytest.approx(want_bytes, rel=1e-9)


@pytest.mark.parametrize("name", ["dlrm", "llm"])
def test_ns3_topology_is_the_plans(folders, name):
    d = folders[name]
    doc = _doc(d)
    nodes, switches, links = parse_ns3_topology((d / "astra_sim/ns3/topology.txt").read_text())
    assert nodes == doc["cluster"]["servers"] and switches == []
    got = nx.Graph((a, b) for a, b, _, _ in links)
    want = nx.Graph((a, b) for a, _, b, _ in doc["topology"]["links"])
    assert nx.utils.graphs_equal(got, want)


@pytest.mark.parametrize("name", ["dlrm", "llm"])
def test_nccl_channels_use_the_planned_fibres(folders, name):
    d = folders[name]
    doc = _doc(d)
    c = doc["cluster"]
    tx = {(a, pa): b for a, pa, b, _ in doc["topology"]["links"]}
    launch = json.loads((d / "nccl/launch.json").read_text())
    assert launch["communicators"]
    for comm, env in launch["communicators"].items():
        for server, e in env.items():
            text = (d / e["NCCL_GRAPH_FILE"]).read_text()
            assert check_nccl_graph(text, c["gpus_per_server"], c["nics"]) >= 1
            assert e["NCCL_CROSS_NIC"] == "1"
            # each channel leaves through a NIC whose fibre reaches another server
            for ch in ET.fromstring(text).iter("channel"):
                out = int(list(ch)[-1].get("dev"), 16)
                assert tx.get((int(server), out)) is not None


_GOOD = ('<graphs version="1"><graph id="0" pattern="4" crossnic="1" nchannels="1" '
         'speedintra="20" speedinter="12" latencyinter="0" typeintra="NVL" typeinter="PIX" '
         'samechannels="0"><channel><net dev="0"/><gpu dev="0"/><gpu dev="1"/>'
         '<net dev="1"/></channel></graph></graphs>')


@pytest.mark.parametrize("edit, rule", [
    (('version="1"', 'version="2"'), "xml.cc line 1240"),
    (('pattern="4"', 'pattern="3"'), "pattern"),
    (('nchannels="1"', 'nchannels="2"'), "nchannels"),
    ((' samechannels="0"', ''), "samechannels"),
    (('typeinter="PIX"', 'typeinter="ETH"'), "kvDictLinkType"),
    (('<gpu dev="1"/>', '<gpu dev="1" rank="5"/>'), "rank"),
    (('<gpu dev="1"/>', '<gpu dev="9"/>'), "local GPUs"),
    (('crossnic="1"', 'crossnic="0"'), "crossnic"),
    (('<net dev="0"/><gpu', '<gpu'), "net, GPUs, net"),
])
def test_nccl_rules_refuse(edit, rule):
    assert check_nccl_graph(_GOOD, 2, 2) == 1
    with pytest.raises(PlanCheckError, match=rule):
        check_nccl_graph(_GOOD.replace(*edit), 2, 2)


def test_an_edited_trace_fails_the_check(folders, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(folders["llm"], bad)
    (bad / "chakra/et.1.et").write_bytes((bad / "chakra/et.0.et").read_bytes())
    with pytest.raises(PlanCheckError, match="chakra/et.1.et"):
        check_plan_dir(bad, simulate=False)


def test_msccl_runtime_option_is_written_and_checked(folders, tmp_path):
    legacy = parse_msccl_xml((folders["dlrm-msccl"] / "msccl_allreduce.xml").read_text())
    executor = parse_msccl_xml((folders["dlrm"] / "msccl_allreduce.xml").read_text())
    assert (executor.maxBytes, legacy.maxBytes, legacy.inplace) == (0, 2**40, 1)
    assert "msccl_allreduce.xml" in check_plan_dir(folders["dlrm-msccl"], simulate=False)
    bad = tmp_path / "bad"
    shutil.copytree(folders["dlrm-msccl"], bad)
    text = (bad / "msccl_allreduce.xml").read_text()
    (bad / "msccl_allreduce.xml").write_text(text.replace('minBytes="0"',
                                                          f'minBytes="{2**40}"', 1))
    with pytest.raises(PlanCheckError, match="maxBytes"):
        check_plan_dir(bad, simulate=False)


def test_an_llm_plans_msccl_files_follow_the_runtime_option(folders, tmp_path):
    """An LLM plan's per-communicator ``msccl/*.xml`` target the runtime asked for, as
    ``msccl_allreduce.xml`` does: microsoft/msccl never picks an algorithm with
    ``maxBytes="0"`` (topo.cc line 805), so those files must carry its byte range."""
    d = folders["llm-dp-msccl"]
    names = sorted(f for f in _doc(d)["files"] if f.startswith("msccl/"))
    assert names, "the data-parallel LLM plan writes no msccl/ file"
    for name in names:
        legacy = parse_msccl_xml((d / name).read_text())
        executor = parse_msccl_xml((folders["llm-dp"] / name).read_text())
        assert (legacy.maxBytes, legacy.inplace, executor.maxBytes) == (2**40, 1, 0)
    assert set(names) <= set(check_plan_dir(d, simulate=True))
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    text = (bad / names[0]).read_text()
    (bad / names[0]).write_text(text.replace('minBytes="0"', f'minBytes="{2**41}"', 1))
    with pytest.raises(PlanCheckError, match="minBytes|maxBytes"):
        check_plan_dir(bad, simulate=False)


def test_an_llm_trace_imports_as_its_data_parallel_workload(folders):
    with pytest.raises(ConfigError, match="point to point"):   # pp = 2: not data parallel
        chakra_workload(folders["llm"] / "chakra/et.0.et", samples=8)
    d = folders["llm-dp"]
    doc = _doc(d)
    c = doc["cluster"]
    samples = doc["job"]["batch_per_gpu"] * c["gpus_per_server"]
    model = chakra_workload(d / "chakra/et.0.et", samples=samples, dtype_bytes=2)
    shape = transformer_shape(model_of(Job(**{k: v for k, v in doc["job"].items() if k in
                                              ("model", "batch_per_gpu", "precision", "size")})))
    # every rank's FLOPs back, and the DP AllReduce's bytes as the gradients' parameters
    total = (model.fwd_flops + model.bwd_flops) * samples * c["servers"]
    assert total == pytest.approx(shape.training_flops_per_token() * samples * c["servers"]
                                  * shape.seq, rel=1e-6)
    groups = json.loads((d / "chakra/comm_groups.json").read_text())
    assert groups and model.params > 0


def _trace(tmp_path, nodes):
    files = encode_chakra_traces(ChakraTraces.from_records(1, (tuple(nodes),), {"1": [0]}))
    (tmp_path / "chakra").mkdir(exist_ok=True)
    (tmp_path / "chakra/et.0.et").write_bytes(files["chakra/et.0.et"])
    return tmp_path / "chakra/et.0.et"


COMP = ("fwd", "COMP_NODE", {"num_ops": 1000}, (), 5)
AR = ("ar", "COMM_COLL_NODE", {"comm_type": "ALL_REDUCE", "pg_name": "1", "comm_size": 400},
      (0,), 0)


@pytest.mark.parametrize("nodes, why", [
    ([COMP, ("ag", "COMM_COLL_NODE", {"comm_type": "ALL_GATHER", "pg_name": "1",
                                      "comm_size": 8}, (0,), 0)], "ALL_GATHER"),
    ([COMP, ("s", "COMM_SEND_NODE", {"comm_src": 0, "comm_dst": 1, "comm_tag": 0,
                                     "comm_size": 8}, (0,), 0)], "point to point"),
    ([COMP], "has none"),
    ([("fwd", "COMP_NODE", {}, (), 5), AR], "num_ops"),
])
def test_unusable_traces_are_refused_in_one_line(tmp_path, nodes, why):
    with pytest.raises(ConfigError, match=why) as info:
        chakra_workload(_trace(tmp_path, nodes), samples=4)
    assert "\n" not in str(info.value)


def test_a_tiny_trace_imports(tmp_path):
    model = chakra_workload(_trace(tmp_path, [COMP, AR]), samples=4)
    assert (model.fwd_flops, model.params) == (250.0, 100)
    with pytest.raises(ConfigError, match="existing"):
        chakra_workload(tmp_path / "missing.et", samples=4)
    (tmp_path / "junk.et").write_bytes(b"\xff" * 64)
    with pytest.raises(ConfigError, match="decode|nodes"):
        chakra_workload(tmp_path / "junk.et", samples=4)


def test_import_model_writes_a_chakra_trace_as_operators(tmp_path):
    """``topoopt import-model chakra:ET --samples N`` writes the trace's workload as a
    custom model that reads back with the same FLOPs and parameters; without
    ``--samples`` it is one line naming the option, exit 2, nothing written."""
    from click.testing import CliRunner

    from topoopt.cli import main
    from topoopt.workloads.custom import custom_model
    et = _trace(tmp_path, [COMP, AR])
    out = tmp_path / "m.toml"
    res = CliRunner().invoke(main, ["import-model", f"chakra:{et}", "-o", str(out)])
    assert res.exit_code == 2 and "--samples" in res.output and not out.exists()
    res = CliRunner().invoke(main, ["import-model", f"chakra:{et}", "--samples", "4", "-o",
                                    str(out)])
    assert res.exit_code == 0, res.output
    import tomllib
    job = tomllib.loads(out.read_text())["job"]
    model = custom_model("imported", job["operators"])
    assert (model.fwd_flops, model.params) == (250.0, 100)
