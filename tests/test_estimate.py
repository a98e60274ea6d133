"""Iteration-time estimator: ring AllReduce closed form, traffic agreement, overlap, fabrics."""

import pytest

from topoopt.cluster import Cluster, Job
from topoopt.compute import compute_times
from topoopt.errors import ConfigError, PlanCheckError
from topoopt.estimate import (
    EstimateCache,
    build_iteration,
    estimate_iteration,
    fuse_operators,
    ring_flow_routes,
)
from topoopt.fabrics import direct_connect, fat_tree, ideal_switch
from topoopt.fabrics.catalog import build_fabric
from topoopt.model import Model, Operator
from topoopt.netsim import Workload, simulate
from topoopt.strategy import OpConfig, Strategy, data_parallel, hybrid
from topoopt.topology import Topology
from topoopt.traffic import derive_traffic
from topoopt.workloads import model_of

G = 1e9


def one_layer(params=25_000_000):
    ops = (Operator("x", "input", out_elems=1024),
           Operator("fc", "dense", params=params, fwd_flops=2e6, bwd_flops=4e6, out_elems=1,
                    inputs=("x",)))
    return Model("one", ops)


@pytest.mark.parametrize("n", [2, 4, 16])
def test_ring_allreduce_closed_form_on_the_ideal_switch(n):
    S, bw, lat = 100e6, 400 * G, 1e-6
    f = ideal_switch(n, bw, lat)
    alpha = 2 * lat   # a hop crosses the uplink and the downlink
    routes, hop_lat = ring_flow_routes(f, [tuple(range(n))])
    assert hop_lat[0] == pytest.approx(alpha)
    w = Workload()
    node = w.add_flows(2 * (n - 1) / n * S, routes, latency=2 * (n - 1) * hop_lat)[0]
    expect = 2 * (n - 1) / n * S * 8 / bw + 2 * (n - 1) * alpha
    assert simulate(f, w).finish[node] == pytest.approx(expect, rel=1e-12)


def test_one_layer_data_parallel_iteration_by_hand():
    n = 8
    model = one_layer()
    cluster = Cluster(servers=n, nics=4, link_bandwidth=100 * G, link_latency=1e-6)
    job = Job("custom", batch_per_gpu=32)
    strat = data_parallel(model, n)
    est = estimate_iteration(model, strat, cluster, job, ideal_switch(n, 400 * G, 1e-6))
    fwd, bwd = compute_times(model, strat, cluster, job)[1]
    S = model.params * 4
    ar = 2 * (n - 1) / n * S * 8 / (400 * G) + 2 * (n - 1) * 2e-6
    hbm = cluster.gpu.hbm_bandwidth / 8 * cluster.gpus_per_server * cluster.memory_efficiency
    update = 3 * S / hbm
    assert est.total == pytest.approx(fwd + bwd + ar + update, rel=1e-9)
    assert est.compute == pytest.approx(fwd + bwd + update)
    assert est.allreduce == pytest.approx(ar) and est.mp == 0
    assert est.exposed_communication == pytest.approx(ar, rel=1e-9)
    assert est.allreduce_bytes == pytest.approx(2 * (n - 1) * S)


def test_several_rings_split_the_bytes():
    n = 6
    model = one_layer()
    cluster = Cluster(servers=n, nics=2, link_bandwidth=100 * G)
    job = Job("custom", batch_per_gpu=8)
    strat = data_parallel(model, n)
    f = ideal_switch(n, 200 * G)
    members = tuple(range(n))
    one = estimate_iteration(model, strat, cluster, job, f)
    two = estimate_iteration(model, strat, cluster, job, f,
                             rings={members: (members, (0, 2, 4, 1, 3, 5))})
    g = build_iteration(model, strat, cluster, job, f,
                        rings={members: (members, (0, 2, 4, 1, 3, 5))})
    assert g.flow_bytes.tolist() == pytest.approx([2 * (n - 1) / n * model.params * 4 / 2] * 2)
    # two half-size rings share every server link: same time as one ring
    assert two.total == pytest.approx(one.total, rel=1e-9)
    with pytest.raises(PlanCheckError):
        estimate_iteration(model, strat, cluster, job, f, rings={members: ((0, 1, 2),)})


def test_estimate_iteration_refuses_wrong_inputs_up_front():
    n = 4
    model = one_layer()
    cluster = Cluster(servers=n, nics=2, link_bandwidth=100 * G)
    job = Job("custom", batch_per_gpu=8)
    f = ideal_switch(n, 200 * G)
    wide = data_parallel(model, 2 * n)        # more servers than the cluster has
    with pytest.raises(ConfigError, match=r"strategy\[x\]\.servers.*0\.\.3"):
        estimate_iteration(model, wide, cluster, job, f)
    with pytest.raises(ConfigError, match=r"strategy\[fc\]\.servers.*distinct"):
        estimate_iteration(model, Strategy((OpConfig((0,), 1), OpConfig((1, 1), 2))),
                           cluster, job, f)
    with pytest.raises(ConfigError, match="one config per operator"):
        build_iteration(model, Strategy((OpConfig((0,), 1),)), cluster, job, f)
    with pytest.raises(ConfigError, match="fabric"):
        estimate_iteration(model, data_parallel(model, n), cluster, job, ideal_switch(2, G))
    with pytest.raises(TypeError, match="strategy must be a Strategy"):
        estimate_iteration(model, [OpConfig((0,), 1)] * 2, cluster, job, f)
    with pytest.raises(TypeError, match="fabric must be a Fabric"):
        estimate_iteration(model, data_parallel(model, n), cluster, job, "ideal")
    with pytest.raises(ConfigError, match="seed"):
        estimate_iteration(model, data_parallel(model, n), cluster, job, f, seed=1.5)


@pytest.fixture(scope="module")
def dlrm16():
    job = Job("dlrm", batch_per_gpu=128, size={"tables": 16, "rows": 1_000_000})
    cluster = Cluster(servers=16, nics=4, link_bandwidth=100 * G)
    model = model_of(job)
    return model, cluster, job


def test_fusion_of_dlrm(dlrm16):
    model, cluster, job = dlrm16
    segs, seg_of = fuse_operators(model, hybrid(model, 16), cluster, job)
    names = [[model.operators[i].name for i in s.ops] for s in segs]
    assert [f"bottom{i}" for i in range(8)] in names
    assert names[-1][0] == "interaction" and names[-1][-1] == "loss"
    assert sum(n[0].startswith("emb") for n in names) == 16
    assert seg_of[model.index("dense_input")] == -1
    assert sum(len(s.ops) for s in segs) == len(model.operators) - 2


def test_traffic_volumes_agree_with_the_traffic_model(dlrm16):
    model, cluster, job = dlrm16
    strat = hybrid(model, 16)
    t = derive_traffic(model, strat, 16, job.global_batch(cluster), job.dtype_bytes)
    for mode in ("pair", "coflow"):
        est = estimate_iteration(model, strat, cluster, job, ideal_switch(16, 400 * G),
                                 mp_flows=mode)
        assert est.mp_bytes == pytest.approx(t.mp_bytes)
        assert est.allreduce_bytes == pytest.approx(t.allreduce_bytes)
        assert est.total >= est.compute > 0 and est.mp > 0 and est.allreduce > 0
        assert est.exposed_communication == pytest.approx(est.total - est.compute)


def test_overlap_hides_allreduce_behind_backward(dlrm16):
    model, cluster, job = dlrm16
    strat = data_parallel(model, 16)
    f = ideal_switch(16, 400 * G)
    on = estimate_iteration(model, strat, cluster, job, f, overlap=True)
    off = estimate_iteration(model, strat, cluster, job, f, overlap=False)
    assert on.total < off.total
    # without overlap the rings start after the whole forward + backward pass
    fwd_bwd = compute_times(model, strat, cluster, job).sum()
    assert off.total >= (fwd_bwd + off.allreduce) * (1 - 1e-9)


def test_ideal_switch_is_the_fastest_fabric(dlrm16):
    model, cluster, job = dlrm16
    strat = hybrid(model, 16)
    cache = EstimateCache(model, cluster, job)
    times = {name: estimate_iteration(model, strat, cluster, job, build_fabric(name, cluster),
                                      cache=cache, mp_flows="coflow").total
             for name in ("ideal", "fattree", "oversub", "expander")}
    assert all(times["ideal"] <= t * (1 + 1e-9) for t in times.values())
    # the cost-equivalent Fat-tree has ~1/3 of the bandwidth: AllReduce-bound DLRM slows
    assert 2.0 < times["fattree"] / times["ideal"] < 4.0


def test_coflow_is_close_to_per_pair_flows(dlrm16):
    model, cluster, job = dlrm16
    strat = hybrid(model, 16)
    for f in (ideal_switch(16, 400 * G), fat_tree(16, 120 * G)):
        pair = estimate_iteration(model, strat, cluster, job, f, mp_flows="pair").total
        co = estimate_iteration(model, strat, cluster, job, f, mp_flows="coflow").total
        assert co == pytest.approx(pair, rel=0.05)


def test_deterministic_and_seeded_random_paths(dlrm16):
    model, cluster, job = dlrm16
    strat = hybrid(model, 16)
    f = fat_tree(16, 120 * G)
    a = estimate_iteration(model, strat, cluster, job, f, random_paths=True, seed=3)
    b = estimate_iteration(model, strat, cluster, job, f, random_paths=True, seed=3)
    assert a == b
    assert estimate_iteration(model, strat, cluster, job, f) == \
        estimate_iteration(model, strat, cluster, job, f, cache=EstimateCache(model, cluster, job))


def test_direct_connect_rings_from_the_fabric(dlrm16):
    model, cluster, job = dlrm16
    n = 16
    strat = data_parallel(model, n)
    # one ring of stride 1 per port pair: the ring order 0..15 maps onto direct links
    links = tuple((i, p, (i + 1) % n, p) for p in range(4) for i in range(n))
    f = direct_connect(Topology(n, 4, links, 100 * G))
    members = tuple(range(n))
    est = estimate_iteration(model, strat, cluster, job, f)
    strided = estimate_iteration(model, strat, cluster, job, f,
                                 rings={members: (tuple((3 * i) % n for i in range(n)),)})
    # the member-order ring rides the 4 bundled links directly (4 x B per hop), the
    # stride-3 ring is relayed over 3 hops each and shares links: slower
    assert strided.allreduce > 2.5 * est.allreduce


# --- the simulate command -----------------------------------------------------------

SMALL = """
[cluster]
servers = 8
nics = 2
link_bandwidth = "50Gbps"
gpus_per_server = 2

[job]
model = "dlrm"
batch_per_gpu = 32

[job.size]
tables = 4
rows = 10000
"""


def _cli(*args):
    from click.testing import CliRunner

    from topoopt.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_simulate_command_table_and_json(tmp_path):
    import json

    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL + "\n[cost]\nocs_port = 999\n")
    out = tmp_path / "out.json"
    result = _cli("simulate", str(cfg), "--json", str(out), "--prices")
    assert result.exit_code == 0, result.output
    for name in ("topoopt", "ideal", "fattree", "oversub", "expander"):
        assert name in result.output
    report = json.loads(out.read_text())
    rows = {r["name"]: r for r in report["fabrics"]}
    assert set(rows) == {"topoopt", "ideal", "fattree", "oversub", "expander"}
    assert rows["ideal"]["total"] <= min(r["total"] for r in rows.values()) * (1 + 1e-9)
    assert rows["fattree"]["cost"]["total"] == pytest.approx(rows["topoopt"]["cost"]["total"],
                                                             rel=1e-6)
    assert report["prices"]["ocs_port"] == 999
    assert report["prices"]["sources"]["ocs_port"] == "config [cost]"
    again = tmp_path / "again.json"
    _cli("simulate", str(cfg), "--json", str(again), "--prices")
    assert again.read_text() == out.read_text()   # same inputs + seed -> same output


def test_simulate_command_errors_are_one_line(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(SMALL + "\n[cost]\nswitchport = 3\n")
    result = _cli("simulate", str(cfg), "--fabric", "ideal")
    assert result.exit_code == 2
    assert "cost.switchport" in result.output and "Traceback" not in result.output
    result = _cli("simulate", str(tmp_path / "missing.toml"))
    assert result.exit_code == 2
