"""The LLM planner: degree search against brute force, fabrics, TopologyFinder's groups,
plan.json written and checked."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from test_plan_interface import refusal_of_tampered

from topoopt import plan
from topoopt.cli import main
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.errors import ConfigError
from topoopt.export.bundle import ExportSkipped
from topoopt.export.plan_dir import check_plan_dir, write_plan
from topoopt.fabrics.catalog import build_fabric
from topoopt.fabrics.direct import direct_connect
from topoopt.finder.topology_finder import check_topology_plan, topology_finder
from topoopt.llm import (
    LLMParallel,
    finder_traffic,
    ideal_comm_times,
    llm_iteration,
    llm_traffic,
    memory_per_gpu,
)
from topoopt.llm.fabric import fabric_comm_times
from topoopt.planners.llm import enumerate_parallel, plan_llm, rank_parallel
from topoopt.plans.llm import (
    LLMPlan,
    check_llm_plan_document,
    launch_order,
    launch_preserves_traffic,
    llm_plan_to_json,
    placement,
)
from topoopt.workloads import build_model
from topoopt.workloads.gpt import transformer_shape

SMALL = Cluster(servers=4, nics=4, link_bandwidth=100e9, gpus_per_server=4, gpu=GPUS["H100"],
                intra_server_bandwidth=GPUS["H100"].nvlink_bandwidth, compute_efficiency=0.52)
JOB = Job("llama3-8b", 2, "bf16", size={"layers": 4, "seq": 512})
MOE = Job("mixtral-8x7b", 2, "bf16", size={"layers": 4, "seq": 512})


def test_degree_choice_matches_brute_force_on_the_ideal_switch_fabric():
    """Every parallelism, ZeRO-1 off and on, timed on the Ideal Switch *fabric* (routed
    links, not the closed form); the search's choice is the fastest that fits."""
    for job in (JOB, MOE):
        shape = transformer_shape(build_model(job.model, job.size))
        fabric = build_fabric("ideal", SMALL)
        batch = job.global_batch(SMALL)
        best = None
        for par in enumerate_parallel(shape, SMALL, batch):
            for zero1 in (False, True):
                p = replace(par, zero1=zero1)
                if not memory_per_gpu(shape, p, batch, 2, SMALL.gpu.memory).fits:
                    continue
                t = llm_traffic(shape, p, 4, 4, batch, 2)
                it = llm_iteration(shape, p, SMALL, batch, "bf16", t,
                                   fabric_comm_times(t, fabric))
                key = (it.total, p.zero1, p.label())
                if best is None or key < best[0]:
                    best = (key, p)
        ranked, _ = rank_parallel(shape, SMALL, job)
        assert ranked[0].ideal.total == pytest.approx(best[0][0], rel=1e-9)
        assert ranked[0].parallel == best[1]


@pytest.mark.parametrize("par", [LLMParallel(4, 2, 2, micro_batches=4),
                                 LLMParallel(2, 2, 4, ep=2, micro_batches=2),
                                 LLMParallel(1, 4, 4, ep=4, micro_batches=8,
                                             order="tp-pp-dp")])
def test_routed_ideal_switch_equals_closed_form(par):
    shape = transformer_shape(build_model(MOE.model, MOE.size))
    t = llm_traffic(shape, par, 4, 4, 16, 2)
    assert fabric_comm_times(t, build_fabric("ideal", SMALL)) == pytest.approx(
        ideal_comm_times(t, SMALL))


@pytest.mark.parametrize("model, par", [
    ("gpt3-175b", LLMParallel(8, 32, 4, micro_batches=64)),       # 32 groups of 4 servers
    ("mixtral-8x7b", LLMParallel(8, 4, 32, ep=4, micro_batches=32)),  # 4 + 16 overlapping
])
def test_topology_finder_serves_dozens_of_dp_groups(model, par):
    shape = transformer_shape(build_model(model))
    t = llm_traffic(shape, par, 128, 8, 1024, 2)
    traffic = finder_traffic(t)
    assert len(traffic.allreduce) >= 20
    tp = topology_finder(traffic, 128, 8, 400e9, 1e-6)
    check_topology_plan(tp, traffic)          # a Hamiltonian ring per group, routes valid
    assert set(tp.rings) == {g.members for g in traffic.allreduce}
    for members, orders in tp.rings.items():
        for order in orders:
            assert sorted(order) == list(members)
    out = np.bincount([a for a, _, _, _ in tp.topology.links], minlength=128)
    assert out.max() <= 8
    # and the iteration on the shard it built is no faster than on the Ideal Switch
    c = Cluster(servers=128, nics=8, link_bandwidth=400e9, gpus_per_server=8, gpu=GPUS["H100"])
    fab = direct_connect(tp.topology, tp.routes, rings=tp.rings)
    on_shard = fabric_comm_times(t, fab, tp.rings)
    ideal = ideal_comm_times(t, c)
    assert on_shard.dp >= ideal.dp * (1 - 1e-9) and on_shard.pp_step >= ideal.pp_step


def test_nothing_fits_is_one_line_naming_what_to_change():
    c = Cluster(servers=2, nics=8, link_bandwidth=400e9, gpus_per_server=8, gpu=GPUS["H100"])
    with pytest.raises(ConfigError) as err:
        plan_llm(c, Job("llama3-405b", 1, "bf16"))
    msg = str(err.value)
    assert err.value.field == "cluster.servers" and "\n" not in msg
    assert "add servers" in msg and "GB" in msg


def test_plan_dispatches_and_the_ideal_switch_bounds_every_fabric():
    p = plan(SMALL, JOB)
    assert isinstance(p, LLMPlan)
    times = p.iteration_time_s
    assert set(times) == {"topoopt", "ideal", "fattree", "oversub", "expander"}
    assert times["ideal"] <= min(times.values())
    assert p.fabric("topoopt").topology_plan is not None
    assert llm_plan_to_json(p) == llm_plan_to_json(plan(SMALL, JOB))   # deterministic


def test_plan_folder_round_trip_and_tampering(tmp_path):
    p = plan_llm(SMALL, MOE, top=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExportSkipped)   # MSCCL when no DP ring crosses servers
        write_plan(p, tmp_path, plots=False)
    assert "plan.json" in check_plan_dir(tmp_path, simulate=False)
    doc = json.loads((tmp_path / "plan.json").read_text())
    check_llm_plan_document(doc)
    # the launch order of rank_order.txt is the one the placement is stated in
    hosts = (tmp_path / "rank_order.txt").read_text().split()
    order = launch_order(p.topology_plan.rings, SMALL.servers)
    assert hosts == [f"server-{i:03d}" for i in order]
    assert doc["llm"]["placement"] == placement(p.parallel, 4, order)
    assert set(doc["llm"]["fabrics"]["topoopt"]["network_bytes"]) == {"tp", "pp", "ep", "dp"}
    for path, value in ((("iteration_time_s", "topoopt"), 1.0),
                        (("llm", "parallel", "micro_batches"), 3),
                        (("llm", "fabrics", "ideal", "iteration", "mfu"), 0.9),
                        (("llm", "placement", "stages"), [[0]])):
        assert "\n" not in refusal_of_tampered(doc, path, value, check_llm_plan_document)


SMALL_TOML = """
[cluster]
servers = 4
nics = 4
link_bandwidth = "100Gbps"
gpus_per_server = 4
gpu = "H100"
compute_efficiency = 0.52

[job]
model = "mixtral-8x7b"
batch_per_gpu = 2
precision = "bf16"
size = { layers = 4, seq = 512 }

[plan]
parallel = { ep = 2 }
"""


def test_cli_plan_check_and_traffic_of_an_llm_job(tmp_path):
    cfg = tmp_path / "moe.toml"
    cfg.write_text(SMALL_TOML)
    out = tmp_path / "plan"
    r = CliRunner().invoke(main, ["plan", str(cfg), "-o", str(out), "--quiet", "--no-plots"])
    assert r.exit_code == 0, r.output
    assert "ep2" in r.output and "MFU" in r.output
    doc = json.loads((out / "plan.json").read_text())
    assert all(f["parallel"]["ep"] == 2 for f in doc["llm"]["fabrics"].values())
    assert doc["llm"]["search"]["fixed"] == {"ep": 2}
    r = CliRunner().invoke(main, ["plan", "--check", str(out)])
    assert r.exit_code == 0 and r.output.startswith("ok"), r.output
    r = CliRunner().invoke(main, ["traffic", str(cfg)])
    assert r.exit_code == 0, r.output
    assert "ep2" in r.output and "stages" in r.output
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL_TOML.replace("{ ep = 2 }", "{ ep = 3 }"))
    r = CliRunner().invoke(main, ["plan", str(bad), "-o", str(tmp_path / "x"), "--quiet"])
    assert r.exit_code == 2 and "plan.parallel" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_launch_order_must_map_the_traffic_onto_itself():
    shape = transformer_shape(build_model("llama3-8b", {"layers": 8, "seq": 256}))
    one_ring = llm_traffic(shape, LLMParallel(8, 1, 8, micro_batches=2), 8, 8, 16, 2)
    staged = llm_traffic(shape, LLMParallel(8, 2, 4, micro_batches=2), 8, 8, 16, 2)
    stride3 = (0, 3, 6, 1, 4, 7, 2, 5)
    assert launch_preserves_traffic(one_ring, stride3)            # one group: any order
    assert not launch_preserves_traffic(staged, stride3)          # stages torn apart
    assert not launch_preserves_traffic(staged, (1, 0, 2, 3, 4, 5, 6, 7))  # one stage only
    assert launch_preserves_traffic(staged, (1, 0, 3, 2, 5, 4, 7, 6))     # both stages
    assert launch_preserves_traffic(staged, (2, 3, 0, 1, 6, 7, 4, 5))   # replicas swapped
    assert launch_order({(0, 1, 2, 3): ((0, 2, 1, 3),)}, 6) == (0, 2, 1, 3, 4, 5)
