"""Shared clusters: many jobs at once (TopoOpt §5, Fig. 16)."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.errors import ConfigError
from topoopt.estimate import estimate_iteration
from topoopt.fabrics import fat_tree, placed_fabric
from topoopt.fabrics.catalog import build_fabric
from topoopt.multijob import (
    PlacedJob,
    load_cluster_config,
    parse_cluster_config,
    place_jobs,
    plan_jobs,
    run_iterations,
    simulate_cluster,
)
from topoopt.multijob.plans import job_key
from topoopt.multijob.simulation import build_jobs, job_seed
from topoopt.workloads import model_of

NCF = {"model": "ncf", "batch_per_gpu": 32,
       "size": {"tables": 4, "rows": 1000, "top_layers": 2}}


def _config(servers=16, nics=2, jobs=None, mix=None, **run):
    doc = {"cluster": {"servers": servers, "nics": nics, "link_bandwidth": "100Gbps",
                       "gpus_per_server": 1},
           "run": {"iterations": 2, **run},
           "plan": {"strategy": "hybrid"},
           "mix": mix or [{**NCF, "servers": servers, "count": 1}]}
    if jobs is not None:
        doc["run"]["jobs"] = jobs
    return parse_cluster_config(doc)


def _single(cfg, fabric, plans, **kw):
    """The single-job estimate of job 0 (the estimator's own fabric and seeds)."""
    spec = cfg.job_list()[0]
    jp = plans[job_key(spec.job, spec.servers)][fabric]
    model = model_of(spec.job)
    net = jp.shard if fabric == "topoopt" else build_fabric(fabric, cfg.cluster)
    return estimate_iteration(model, jp.strategy, jp.cluster, spec.job, net, **kw).total


@pytest.mark.parametrize("fabric,ecmp", [("fattree", "split"), ("fattree", "hash"),
                                         ("oversub", "split"), ("topoopt", "split")])
def test_a_one_job_cluster_is_the_single_job_simulation(fabric, ecmp):
    cfg = _config(fabrics=[fabric], ecmp=ecmp)
    plans = plan_jobs(cfg)
    run = simulate_cluster(cfg, fabric, plans)
    (job,) = run.jobs
    kw = {"random_paths": True, "seed": job_seed(cfg.seed, 0)} if ecmp == "hash" and \
        fabric != "topoopt" else {}
    single = _single(cfg, fabric, plans, **kw)
    assert job.alone == pytest.approx(single, rel=1e-9)
    assert job.measured.sum() >= cfg.iterations
    assert np.allclose(job.end - job.start, single, rtol=1e-9)   # every iteration alike
    assert run.mean == pytest.approx(single, rel=1e-9)


def test_a_planned_job_runs_its_plans_strategy_on_its_shard():
    cfg = parse_cluster_config({
        "cluster": {"servers": 4, "nics": 2, "link_bandwidth": "100Gbps"},
        "run": {"fabrics": ["topoopt", "fattree"], "iterations": 1, "ecmp": "split"},
        "plan": {"strategy": "plan", "budget": 10, "rounds": 1},
        "mix": [{**NCF, "servers": 4, "count": 1}]})
    plans = plan_jobs(cfg)
    for fabric in ("topoopt", "fattree"):    # the plan's shard, and its Fat-tree
        run = simulate_cluster(cfg, fabric, plans)
        planned = plans[job_key(cfg.job_list()[0].job, 4)][fabric].planned_s
        assert run.jobs[0].alone == pytest.approx(planned, rel=1e-9)


def test_jobs_on_topoopt_shards_do_not_disturb_each_other():
    mix = [{**NCF, "servers": 4, "count": 2},
           {"model": "vgg16", "batch_per_gpu": 8, "servers": 4, "count": 1}]
    cfg = _config(servers=12, mix=mix, fabrics=["topoopt"])
    plans = plan_jobs(cfg)
    run = simulate_cluster(cfg, "topoopt", plans, joint=True)       # one simulation
    assert run.groups == 1
    for job in run.jobs:
        spec = cfg.job_list()[job.index]
        jp = plans[job_key(spec.job, spec.servers)]["topoopt"]
        alone = estimate_iteration(model_of(spec.job), jp.strategy, jp.cluster, spec.job,
                                   jp.shard).total
        assert np.allclose(job.end - job.start, alone, rtol=1e-9)
    # and split per shard (the default): the same times
    split = simulate_cluster(cfg, "topoopt", plans)
    assert split.groups == 3
    for a, b in zip(run.jobs, split.jobs):
        assert np.allclose(a.end, b.end, rtol=1e-9)


def test_jobs_on_a_shared_oversubscribed_tree_slow_each_other_down():
    mix = [{"model": "vgg16", "batch_per_gpu": 8, "servers": 8, "count": 2}]
    cfg = _config(servers=16, nics=4, mix=mix, fabrics=["oversub"], ecmp="split",
                  placement="fragmented")
    plans = plan_jobs(cfg)
    run = simulate_cluster(cfg, "oversub", plans)
    assert run.groups == 1 and run.slowdown > 1.05
    assert all(j.mean > j.alone for j in run.jobs)


def test_independent_groups_give_the_joint_simulation_and_the_reference_engine_agrees():
    # k = 4 Fat-tree, pods of 4: contiguous jobs of 4 servers stay in their pods
    mix = [{**NCF, "servers": 4, "count": 2},
           {"model": "vgg16", "batch_per_gpu": 4, "servers": 2, "count": 2}]
    cfg = _config(servers=16, mix=mix, fabrics=["fattree"], ecmp="split")
    plans = plan_jobs(cfg)
    split = simulate_cluster(cfg, "fattree", plans)
    joint = simulate_cluster(cfg, "fattree", plans, joint=True)
    ref = simulate_cluster(cfg, "fattree", plans, joint=True, reference=True)
    assert split.groups > 1 and joint.groups == 1
    for a, b, c in zip(split.jobs, joint.jobs, ref.jobs):
        assert np.allclose(a.end, b.end, rtol=1e-9)
        assert np.allclose(b.end, c.end, rtol=1e-9)


def test_identical_jobs_on_a_shared_fabric_use_their_own_servers_links():
    # k = 4 Fat-tree, pods of 4 servers: two identical jobs, one per pod, split ECMP
    cfg = _config(servers=16, mix=[{**NCF, "servers": 4, "count": 2}], fabrics=["fattree"],
                  ecmp="split")
    plans = plan_jobs(cfg)
    _, jobs, _ = build_jobs(cfg, "fattree", plans)
    a, b = (set(j.links().tolist()) for j in jobs)
    assert not a & b                                 # pod 0's links, pod 1's links
    run = simulate_cluster(cfg, "fattree", plans, joint=True)
    for job in run.jobs:
        assert np.allclose(job.end - job.start, job.alone, rtol=1e-9)


def test_stacked_iterations_run_back_to_back_after_the_phase():
    f = fat_tree(8, 100e9)
    cfg = _config(servers=8, mix=[{**NCF, "servers": 8, "count": 1}])
    plans = plan_jobs(cfg.with_(fabrics=("fattree",)))
    _, jobs, cap = build_jobs(cfg.with_(fabrics=("fattree",)), "fattree", plans)
    g = jobs[0].graph
    [(start, end)], _ = run_iterations(cap, [PlacedJob(g, np.arange(8), 0, 0.25, 3)])
    [(_, one)], _ = run_iterations(cap, [PlacedJob(g, np.arange(8))])
    assert start[0] == 0.25
    assert np.allclose(np.diff(np.concatenate([[0.25], end])), one[0], rtol=1e-9)
    assert f.links == cap.size


def test_placement_policies():
    sizes = [3, 3, 2]
    for policy in ("contiguous", "random", "fragmented"):
        p = place_jobs(sizes, 12, policy, seed=4)
        flat = np.concatenate(p)
        assert [len(x) for x in p] == sizes and np.unique(flat).size == flat.size
        assert (place_jobs(sizes, 12, policy, seed=4)[0] == p[0]).all()   # seeded
    contiguous = place_jobs(sizes, 12)
    assert contiguous[1].tolist() == [3, 4, 5]
    frag = place_jobs([4, 4], 8, "fragmented")
    assert frag[0].tolist() == [0, 2, 4, 6]                # every other server
    with pytest.raises(ConfigError, match="need 9 servers"):
        place_jobs([5, 4], 8)


def test_placed_fabric_keeps_the_routes_of_the_shared_fabric():
    big = fat_tree(16, 100e9)
    servers = [3, 9, 14, 0]
    view = placed_fabric(big, servers)
    a, b = np.array([0, 1, 2, 3]), np.array([2, 0, 3, 1])
    r1, r2 = view.route(a, b), big.route(np.array(servers)[a], np.array(servers)[b])
    assert np.array_equal(r1.link, r2.link) and np.allclose(r1.weight, r2.weight)
    with pytest.raises(ConfigError, match="distinct servers"):
        placed_fabric(big, [1, 1])


def test_the_fig16_mix_and_config_errors(tmp_path):
    cfg = load_cluster_config("configs/cluster-fig16.toml")
    counts = [sum(s.name == m for s in cfg.with_(jobs=n).job_list())
              for n in (5, 27) for m in ("dlrm", "bert", "candle", "vgg16")]
    assert counts == [2, 2, 1, 0, 11, 8, 5, 3]
    assert sum(s.servers for s in cfg.job_list()) == 432             # 100% load
    with pytest.raises(ConfigError, match="need 448 servers"):
        cfg.with_(jobs=28)
    bad = [({"run": {"fabrics": ["torus"]}}, "run.fabrics"),
           ({"run": {"placement": "packed"}}, "run.placement"),
           ({"mix": [{**NCF, "share": 0.5}]}, "run.jobs"),
           ({"mix": [{**NCF, "share": 0.5, "count": 2}]}, "either share"),
           ({"mix": [{**NCF, "count": 1, "model": "gpt9"}]}, "mix\\[0\\].model"),
           ({"plan": {"strategy": "magic"}}, "plan.strategy")]
    for change, match in bad:
        doc = {"cluster": {"servers": 16, "nics": 2, "link_bandwidth": "100Gbps"},
               "mix": [{**NCF, "count": 1}], **change}
        with pytest.raises(ConfigError, match=match):
            parse_cluster_config(doc)


def _write(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


CLI_CONFIG = """
[cluster]
servers = 8
nics = 2
link_bandwidth = "100Gbps"
gpus_per_server = 1
[run]
fabrics = ["topoopt", "oversub"]
iterations = 1
[plan]
strategy = "hybrid"
[[mix]]
model = "ncf"
batch_per_gpu = 32
servers = 4
count = 2
size = { tables = 4, rows = 1000, top_layers = 2 }
"""


def test_cli_cluster_table_json_and_determinism(tmp_path):
    path = _write(tmp_path, CLI_CONFIG)
    outs = []
    for name in ("a.json", "b.json"):
        res = CliRunner().invoke(main, ["cluster", str(path), "--quiet", "--json",
                                        str(tmp_path / name), "--per-job"])
        assert res.exit_code == 0, res.output
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]
    doc = json.loads(outs[0])
    assert [f["fabric"] for f in doc["fabrics"]] == ["topoopt", "oversub"]
    assert doc["fabrics"][0]["slowdown"] == pytest.approx(1.0)
    assert "mean/topoopt" in res.output and "oversub" in res.output


def test_cli_cluster_bad_input_is_one_line(tmp_path):
    path = _write(tmp_path, CLI_CONFIG.replace("iterations = 1",
                                               'iterations = 1\nplacement = "packed"'))
    res = CliRunner().invoke(main, ["cluster", str(path), "--json", str(tmp_path / "o.json")])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "run.placement" in res.output
    assert not (tmp_path / "o.json").exists()
    res = CliRunner().invoke(main, ["cluster", str(tmp_path / "none.toml")])
    assert res.exit_code == 2 and "file not found" in res.output
