"""Per-communicator exports of an LLM plan: communicators.json and msccl/{dp,edp}{j}.xml,
written into the plan folder, listed in plan.json and read back by plan --check."""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import replace

import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.errors import PlanCheckError, TopoOptError
from topoopt.export.communicators import (
    COMMUNICATORS,
    EP_SKIPPED,
    communicator_table,
    render_communicators,
)
from topoopt.export.msccl import format_msccl_xml, parse_msccl_xml, ring_allreduce_algo
from topoopt.export.plan_dir import check_plan_dir, check_plan_output, write_plan
from topoopt.llm import LLMParallel
from topoopt.planners.llm import plan_llm

CLUSTER = Cluster(servers=8, nics=4, link_bandwidth=100e9, gpus_per_server=4, gpu=GPUS["H100"],
                  intra_server_bandwidth=GPUS["H100"].nvlink_bandwidth,
                  compute_efficiency=0.52)
DENSE = Job("llama3-8b", 2, "bf16", size={"layers": 4, "seq": 512})
MOE = Job("mixtral-8x7b", 2, "bf16", size={"layers": 4, "seq": 512})
CASES = {"dense": (DENSE, {"tp": 4, "pp": 2}),            # 2 stages, DP rings of 4 servers
         "moe": (MOE, {"tp": 2, "pp": 1, "ep": 2}),       # 2 DP ranks per server, edp
         "moe-staged": (MOE, {"tp": 4, "pp": 2, "ep": 2})}  # dp and edp rings, EP skipped


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for name, (job, fixed) in CASES.items():
        p = plan_llm(CLUSTER, job, top=2, fixed=fixed)
        d = tmp_path_factory.mktemp(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_plan(p, d, plots=False, report=False)
        out[name] = d
    return out


def _docs(d):
    return (json.loads((d / "plan.json").read_text()),
            json.loads((d / COMMUNICATORS).read_text()))


def _planned_rings(doc):
    rings = {}
    for r in doc["rings"]:
        rings.setdefault(tuple(r["members"]), []).append(r["order"])
    return rings


def _cycle(a, b):
    a, b = list(a), list(b)
    return len(a) == len(b) and a[0] in b and a == b[b.index(a[0]):] + b[:b.index(a[0])]


@pytest.mark.parametrize("name", list(CASES))
def test_files_listed_and_checked(folders, name):
    d = folders[name]
    doc, comm = _docs(d)
    xmls = sorted(str(p.relative_to(d)) for p in (d / "msccl").glob("*.xml"))
    assert COMMUNICATORS in doc["files"] and xmls and set(xmls) <= set(doc["files"])
    checked = check_plan_dir(d, simulate=True)       # every XML simulated as an AllReduce
    assert COMMUNICATORS in checked and set(xmls) <= set(checked)
    assert comm["launch_order"] == [int(h.split("-")[1]) for h in
                                    (d / "rank_order.txt").read_text().split()]
    if name == "moe-staged":   # EP groups cross servers: no all-to-all XML, said why
        assert EP_SKIPPED in doc["skipped"] and EP_SKIPPED in comm["skipped"]
    else:
        assert EP_SKIPPED not in doc["skipped"]


@pytest.mark.parametrize("name", list(CASES))
def test_every_rank_once_per_kind(folders, name):
    doc, comm = _docs(folders[name])
    par = doc["llm"]["parallel"]
    gpus = CLUSTER.servers * CLUSTER.gpus_per_server
    sizes = {"tp": par["tp"], "pp": par["pp"], "dp": par["dp"], "ep": par["ep"],
             "edp": par["dp"] // par["ep"]}
    for kind, rows in comm["groups"].items():
        if not rows:
            assert kind == "ep" and par["ep"] == 1 or kind == "edp" and not 1 < par["ep"] < par["dp"]
            continue
        ranks = [r for row in rows for r in row["ranks"]]
        assert sorted(ranks) == list(range(gpus)), kind
        assert all(len(row["ranks"]) == sizes[kind] for row in rows), kind
        g = CLUSTER.gpus_per_server
        host = comm["launch_order"]
        for row in rows:
            assert row["servers"] == sorted({host[r // g] for r in row["ranks"]})
        if kind == "tp":
            assert all(len(row["servers"]) == 1 for row in rows)   # NVLink only


@pytest.mark.parametrize("name", list(CASES))
def test_each_dp_xml_rings_the_planned_rings(folders, name):
    d = folders[name]
    doc, comm = _docs(d)
    planned = _planned_rings(doc)
    g, host = CLUSTER.gpus_per_server, comm["launch_order"]
    seen = 0
    for kind in ("dp", "edp"):
        for row in comm["groups"][kind]:
            if len(row["servers"]) < 2:
                assert "msccl" not in row
                continue
            rings = planned[tuple(row["servers"])]
            assert row["rings"] == rings
            # NCCL with the communicator ranks in nccl_order rings the first planned ring
            nodes = list(dict.fromkeys(host[r // g] for r in row["nccl_order"]))
            assert nodes == rings[0] and sorted(row["nccl_order"]) == row["ranks"]
            algo = parse_msccl_xml((d / row["msccl"]).read_text())
            assert algo.ngpus == len(row["ranks"]) and algo.nchannels % len(rings) == 0
            segments = algo.nchannels // len(rings)
            server_of = [host[r // g] for r in sorted(row["ranks"])]   # new_group's ranks
            for chan in range(algo.nchannels):
                nxt = {gpu.id: tb.send for gpu in algo.gpus for tb in gpu.tbs
                       if tb.chan == chan}
                cycle, r = [], 0
                while r not in cycle:
                    cycle.append(r)
                    r = nxt[r]
                assert len(cycle) == algo.ngpus
                servers = list(dict.fromkeys(server_of[i] for i in cycle))
                assert _cycle(servers, rings[chan // segments]), (row, chan)
                # a server's GPUs of the group are consecutive on the ring
                runs = [s for i, s in enumerate(server_of[c] for c in cycle)
                        if i == 0 or s != server_of[cycle[i - 1]]]
                assert len(runs) - (runs[0] == runs[-1]) == len(rings[0])
            seen += 1
    assert seen


def test_launch_order_maps_ranks_to_servers():
    """The largest group's first ring 0 -> 2 -> 1 -> 3 launches server 2 on line 1:
    GPU ranks 4..7 run there, so new_group's sorted ranks already follow the ring."""
    cl = replace(CLUSTER, servers=4)
    par = LLMParallel(tp=4, pp=1, dp=4)
    rings = {(0, 1, 2, 3): ((0, 2, 1, 3), (0, 3, 1, 2))}
    t = communicator_table(par, rings, cl)
    assert t["launch_order"] == [0, 2, 1, 3]
    row = t["groups"]["dp"][1]
    assert row["ranks"] == [1, 5, 9, 13] and row["nccl_order"] == [1, 5, 9, 13]
    assert row["sorted_follows_ring"] is True
    files, skipped = render_communicators(par, rings, cl)
    assert sorted(files) == [COMMUNICATORS, "msccl/dp0.xml"] and not skipped
    # the second ring 0 -> 3 -> 1 -> 2 in communicator ranks (server order 0, 2, 1, 3)
    assert parse_msccl_xml(files["msccl/dp0.xml"]) == replace(
        ring_allreduce_algo([[0, 1, 2, 3], [0, 3, 2, 1]], name="topoopt_dp0"), comment="")
    # a ring the launch order does not follow: NCCL needs the split key
    cl6 = replace(CLUSTER, servers=6)
    rings2 = {(0, 1, 2): ((0, 1, 2),), (3, 4, 5): ((3, 5, 4),)}
    t2 = communicator_table(LLMParallel(tp=4, pp=2, dp=3), rings2, cl6)
    far = [row for row in t2["groups"]["dp"] if row["servers"] == [3, 4, 5]]
    assert len(far) == 4
    for row in far:
        on3, on4, on5 = row["ranks"]
        assert row["nccl_order"] == [on3, on5, on4] and row["sorted_follows_ring"] is False


def _tamper(src, dst, edit):
    shutil.copytree(src, dst)
    edit(dst)
    with pytest.raises(PlanCheckError) as err:
        check_plan_dir(dst, simulate=False)
    return str(err.value)


def test_tampered_communicator_files_are_refused(folders, tmp_path):
    src = folders["moe-staged"]
    _, comm = _docs(src)
    row = next(r for r in comm["groups"]["dp"] if "msccl" in r)
    xml = row["msccl"]

    def swap_order(d):
        c = json.loads((d / COMMUNICATORS).read_text())
        r = next(r for r in c["groups"]["dp"] if "msccl" in r)
        r["nccl_order"] = r["nccl_order"][::-1]
        (d / COMMUNICATORS).write_text(json.dumps(c))

    def other_ring(d):   # a valid AllReduce, but not along the planned ring
        algo = parse_msccl_xml((d / xml).read_text())
        k = algo.ngpus
        fake = ring_allreduce_algo([list(range(k))[::-1]] * (algo.nchunksperloop // k),
                                   name=algo.name)
        (d / xml).write_text(format_msccl_xml(fake))

    def drop_rank(d):
        c = json.loads((d / COMMUNICATORS).read_text())
        c["groups"]["tp"][0]["ranks"] = c["groups"]["tp"][0]["ranks"][1:]
        (d / COMMUNICATORS).write_text(json.dumps(c))

    def unlist(d):
        doc = json.loads((d / "plan.json").read_text())
        doc["files"].remove(xml)
        (d / "plan.json").write_text(json.dumps(doc))

    def unskip(d):
        doc = json.loads((d / "plan.json").read_text())
        del doc["skipped"][EP_SKIPPED]
        (d / "plan.json").write_text(json.dumps(doc))

    for i, (edit, names) in enumerate(((swap_order, COMMUNICATORS), (other_ring, xml),
                                       (drop_rank, COMMUNICATORS), (unlist, xml),
                                       (unskip, "skip"))):
        message = _tamper(src, tmp_path / str(i), edit)
        assert names in message and "\n" not in message, message
    # the command says it in one line, exit code 1 (a failed check, as for every export)
    d = tmp_path / "cli"
    shutil.copytree(src, d)
    other_ring(d)
    r = CliRunner().invoke(main, ["plan", "--check", str(d)])
    assert r.exit_code == 1 and xml in r.output and len(r.output.strip().splitlines()) == 1


def test_same_plan_same_bytes(folders, tmp_path):
    job, fixed = CASES["moe-staged"]
    p = plan_llm(CLUSTER, job, top=2, fixed=fixed)
    a = render_communicators(p.parallel, p.topology_plan.rings, p.cluster)
    b = render_communicators(p.parallel, p.topology_plan.rings, p.cluster)
    assert a == b
    src = folders["moe-staged"]
    assert a[0][COMMUNICATORS] == (src / COMMUNICATORS).read_text()


def test_a_users_communicators_json_is_refused_before_planning(tmp_path):
    (tmp_path / COMMUNICATORS).write_text("mine\n")
    check_plan_output(tmp_path, CLUSTER)                 # not an LLM plan: not its name
    with pytest.raises(TopoOptError, match=COMMUNICATORS):
        check_plan_output(tmp_path, CLUSTER, llm=True)
    p = plan_llm(CLUSTER, DENSE, top=1, fixed=CASES["dense"][1])
    with pytest.raises(TopoOptError, match=COMMUNICATORS):
        write_plan(p, tmp_path, plots=False, report=False)
    assert sorted(x.name for x in tmp_path.iterdir()) == [COMMUNICATORS]   # nothing written
    assert (tmp_path / COMMUNICATORS).read_text() == "mine\n"
