"""The planner: MCMC finds brute-force optima, plans are deterministic, valid and exported."""

import itertools
import json
import re

import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.cluster import Cluster, Job
from topoopt.errors import PlanCheckError
from topoopt.executor import make_executor
from topoopt.export.plan_dir import check_plan_dir, write_plan
from topoopt.fabrics import ideal_switch
from topoopt.interrupt import graceful_interrupt, stop_requested
from topoopt.planners.alternating import start_strategy
from topoopt.planners.cost import IterationCost
from topoopt.planners.mcmc import mcmc_search
from topoopt.planners.planner import plan
from topoopt.planners.space import StrategySpace, op_configs
from topoopt.plans import plan_to_json
from topoopt.strategy import Strategy
from topoopt.workloads import model_of

SMALL_DLRM = {"tables": 8, "rows": 200_000, "dim": 64, "bag": 20, "bottom_layers": 2,
              "bottom_width": 256, "top_layers": 2, "top_width": 512}


def tiny_job():
    # two parameterized operators the search can move, on a data loader input
    ops = [{"name": "x", "kind": "input", "out_elems": 512},
           {"name": "emb", "kind": "embedding", "params": 4_000_000, "fwd_flops": 2000,
            "out_elems": 256, "mem_elems": 2000, "inputs": ["x"]},
           {"name": "fc", "kind": "dense", "params": 30_000_000, "fwd_flops": 6e7,
            "out_elems": 1024, "inputs": ["emb"]}]
    return Job("custom", batch_per_gpu=32, operators=tuple(ops))


def tiny_search():
    """The tiny job on 4 servers under an Ideal Switch: cluster, job, model, strategy
    space and iteration cost (the set-up of the search tests)."""
    cluster = Cluster(servers=4, nics=2, link_bandwidth=25e9)
    job = tiny_job()
    model = model_of(job)
    space = StrategySpace.build(model, cluster, job)
    return cluster, job, model, space, IterationCost(model, cluster, job,
                                                     ideal_switch(4, cluster.server_bandwidth))


@pytest.mark.parametrize("servers", [4, 8])
def test_mcmc_finds_the_brute_force_optimum(servers):
    cluster = Cluster(servers=servers, nics=2, link_bandwidth=25e9)
    job = tiny_job()
    model = model_of(job)
    space = StrategySpace.build(model, cluster, job)
    cost = IterationCost(model, cluster, job, ideal_switch(servers, cluster.server_bandwidth))
    fixed = space.configs[0]
    assert len(fixed) == 1
    best = min(cost(Strategy((fixed[0], a, b)))
               for a, b in itertools.product(space.configs[1], space.configs[2]))
    start = start_strategy(model, cluster, job, space)
    found = mcmc_search(space, cost, start, budget=400, seed=1)
    assert found.best_time == pytest.approx(best, rel=1e-12)
    assert found.best_time <= found.start_time


def test_alternation_starts_from_the_best_seed():
    # MCMC on a fixed topology is myopic; a seed strategy on its own topology that
    # beats the start must be where the first round begins, and the result can
    # be no worse than any seed on its TopologyFinder topology
    from topoopt.planners.alternating import alternating_optimization, best_topology

    cluster = Cluster(servers=8, nics=2, link_bandwidth=25e9)
    job = tiny_job()
    model = model_of(job)
    space = StrategySpace.build(model, cluster, job)
    start = start_strategy(model, cluster, job, space)
    fixed, emb, fc = start.configs
    candidates = [Strategy((fixed, emb, b)) for b in space.configs[2]] + \
                 [Strategy((fixed, a, fc)) for a in space.configs[1]]
    timed = sorted((best_topology(model, c, cluster, job, 0, {})[1], i)
                   for i, c in enumerate(candidates))
    best_t, best = timed[0][0], candidates[timed[0][1]]
    worst = candidates[timed[-1][1]]
    start_t = best_topology(model, start, cluster, job, 0, {})[1]
    assert best_t < start_t  # else the test proves nothing
    for budget in (0, 20):
        found = alternating_optimization(model, cluster, job, start, rounds=1, budget=budget,
                                         seeds={"worst": worst, "best": best})
        assert found.origin == "best"
        assert found.time <= best_t * (1 + 1e-12)
        assert found.start is start and found.start_time == pytest.approx(start_t)
    plain = alternating_optimization(model, cluster, job, start, rounds=1, budget=0,
                                     seeds={"same": start})
    assert plain.origin == "start" and plain.time == pytest.approx(start_t)


def test_space_configs_are_valid():
    from topoopt.workloads.layers import dense
    for cfg in op_configs(dense("fc", 64, 64, ()), 12, 96):
        assert len(set(cfg.servers)) == len(cfg.servers) == cfg.dp * cfg.mp
        assert 96 % cfg.dp == 0 and 12 % len(cfg.servers) == 0
        assert cfg.servers[0] % len(cfg.servers) == 0


SMALL_BERT = {"layers": 2, "hidden": 512, "heads": 8, "seq": 64, "vocab": 8000}


def small_plan(seed=0, executor=None, budget=30):
    # small enough to plan in seconds, large enough that data parallelism (and so
    # AllReduce rings) wins over putting everything on one server
    cluster = Cluster(servers=8, nics=2, link_bandwidth=100e9)
    job = Job("bert", batch_per_gpu=16, size=SMALL_BERT)
    return plan(cluster, job, budget=budget, rounds=2, seed=seed, executor=executor)


@pytest.fixture(scope="module")
def planned():
    return small_plan()


def test_plan_never_worse_than_its_start(planned):
    topoopt = planned.fabric("topoopt")
    assert topoopt.estimate.total <= planned.search.start_time * (1 + 1e-9)
    for f in planned.fabrics:
        assert f.estimate.total <= f.start_time * (1 + 1e-9), f.name
    assert [f.name for f in planned.fabrics] == ["topoopt", "ideal", "fattree", "oversub",
                                                 "expander"]
    ideal = planned.fabric("ideal")
    assert ideal.cost.total > topoopt.cost.total  # §5.2: Ideal Switch costs ~3.2x


def test_plan_json_is_deterministic_and_executor_independent(planned, tmp_path):
    a = json.dumps(plan_to_json(planned), sort_keys=True)
    assert json.dumps(plan_to_json(small_plan()), sort_keys=True) == a
    with make_executor(2) as pool:
        assert json.dumps(plan_to_json(small_plan(executor=pool)), sort_keys=True) == a


def test_written_plan_checks_and_exports_match(planned, tmp_path):
    out = tmp_path / "plan"
    paths = write_plan(planned, out, plots=False)
    assert (out / "plan.json") in paths
    doc = json.loads((out / "plan.json").read_text())
    for key in ("topology", "rings", "iteration_time_s", "cost", "strategy", "search"):
        assert key in doc
    assert doc["rings"], "the small BERT plan should all-reduce over rings"
    checked = check_plan_dir(out)
    assert "patch_panel.csv" in checked and "msccl_allreduce.xml" in checked
    # every link once in the patch panel, no port twice
    links = {tuple(link) for link in doc["topology"]["links"]}
    assert len(links) == len(doc["topology"]["links"])
    tx = [(a, pa) for a, pa, _, _ in links]
    rx = [(b, pb) for _, _, b, pb in links]
    assert len(set(tx)) == len(tx) and len(set(rx)) == len(rx)
    # the same plan written twice is byte-identical
    again = tmp_path / "again"
    write_plan(planned, again, plots=False)
    for p in out.rglob("*"):
        if p.is_file():
            assert (again / p.relative_to(out)).read_bytes() == p.read_bytes(), p.name


def test_plan_files_get_the_usual_permissions(planned, tmp_path):
    """Every file of a plan folder is readable by others as any new file would be (the
    umask's permissions), not private like a temporary file."""
    import os

    old = os.umask(0o022)
    try:
        write_plan(planned, tmp_path / "plan", plots=False)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "plan").rglob("*")
             if p.is_file()}
    assert modes and set(modes.values()) == {0o644}, modes


@pytest.mark.parametrize("corrupt, message", [
    (lambda d: d["topology"]["links"].append(list(d["topology"]["links"][0])), "already"),
    (lambda d: d["rings"][0]["order"].pop(), "Hamiltonian"),
    (lambda d: d["strategy"][3].update(servers=[0, 0]), "strategy"),
    (lambda d: d["iteration_time_s"].update(topoopt=-1), "topoopt"),
])
def test_check_names_the_first_violation(planned, tmp_path, corrupt, message):
    out = tmp_path / "plan"
    write_plan(planned, out, exports=False, plots=False)
    doc = json.loads((out / "plan.json").read_text())
    corrupt(doc)
    (out / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(PlanCheckError, match=message):
        check_plan_dir(out)
    result = CliRunner().invoke(main, ["plan", "--check", str(out)])
    assert result.exit_code == 1 and message in result.output
    assert "Traceback" not in result.output


def test_cli_plan_and_check(tmp_path):
    cfg = tmp_path / "small.toml"
    size = "\n".join(f"{k} = {v}" for k, v in SMALL_DLRM.items())
    cfg.write_text("[cluster]\nservers = 8\nnics = 2\nlink_bandwidth = '100Gbps'\n"
                   f"[job]\nmodel = 'dlrm'\nbatch_per_gpu = 32\n[job.size]\n{size}\n"
                   "[plan]\nbudget = 10\nrounds = 1\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["plan", str(cfg), "-o", str(out), "--no-plots",
                                       "--quiet"])
    assert result.exit_code == 0, result.output
    assert "topoopt" in result.output and "fattree" in result.output
    # every fabric's search: how it stopped, the chains' spread then and at the end;
    # a search that converged stopped with its chains within the tolerance (1%)
    ends = re.findall(r"(converged|budget) at (\d+\.\d{3}), spread \d+\.\d{3}", result.output)
    assert len(ends) == 5
    assert all(float(at) <= 1.01 for stop, at in ends if stop == "converged")
    check = CliRunner().invoke(main, ["plan", "--check", str(out)])
    assert check.exit_code == 0 and check.output.startswith("ok")


@pytest.mark.parametrize("extra, field", [
    ("[plan]\nbudget = -1\n", "plan.budget"),
    ("[plan]\nbugdet = 5\n", "plan.bugdet"),
    ("[plan]\nrouting = 'ospf'\n", "plan.routing"),
    ("[plan]\nbaselines = ['torus']\n", "plan.baselines"),
])
def test_cli_plan_bad_settings(tmp_path, extra, field):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[cluster]\nservers = 8\nnics = 2\nlink_bandwidth = '100Gbps'\n"
                   "[job]\nmodel = 'ncf'\nbatch_per_gpu = 8\n[job.size]\ntables = 2\n"
                   "rows = 100\ntop_layers = 1\ntop_width = 16\n" + extra)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["plan", str(cfg), "-o", str(out), "--quiet"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1].startswith(f"error: {field}")
    assert not out.exists()


def test_cli_plan_needs_output_and_config(tmp_path):
    assert CliRunner().invoke(main, ["plan"]).exit_code == 2
    assert CliRunner().invoke(main, ["plan", "configs/dlrm-16.toml"]).exit_code == 2
    missing = CliRunner().invoke(main, ["plan", "--check", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "does not exist" in missing.output


@pytest.mark.slow
def test_ray_executor_gives_the_same_plan(planned, monkeypatch):
    pytest.importorskip("ray", reason="Ray not installed: pip install 'topoopt[ray]'")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with make_executor(2, ray=True) as ray_exec:
        got = small_plan(executor=ray_exec)
    assert json.dumps(plan_to_json(got), sort_keys=True) == \
        json.dumps(plan_to_json(planned), sort_keys=True)


def test_stop_keeps_the_best_so_far():
    cluster, job, model, space, cost = tiny_search()
    start = start_strategy(model, cluster, job, space)
    calls = iter(range(10_000))
    found = mcmc_search(space, cost, start, budget=1000, seed=0,
                        stop=lambda: next(calls) >= 25)
    assert found.interrupted and found.moves == 25
    assert space.contains(found.best) and found.best_time == cost(found.best)


def test_ctrl_c_requests_a_graceful_stop():
    import os
    import signal

    # whatever was there before comes back (SIG_IGN under nohup, Python's default else)
    before = signal.getsignal(signal.SIGINT)
    with graceful_interrupt():
        assert not stop_requested()
        os.kill(os.getpid(), signal.SIGINT)
        assert stop_requested()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C interrupts for real
    assert signal.getsignal(signal.SIGINT) is before


def test_chains_may_begin_at_any_start_but_none_below_the_fastest(planned, tmp_path):
    # the chains begin from the best screened basin bottoms, so chain 0 need not be the
    # one at the fastest start (the README's DLRM-16 plan, seed 0); none may begin
    # faster than every start
    out = tmp_path / "plan"
    write_plan(planned, out, exports=False, plots=False, report=False)
    doc = json.loads((out / "plan.json").read_text())
    search = doc["fabrics"]["ideal"]["search"]
    assert len(search["chains"]) >= 2
    search["chains"].reverse()
    slow = max(search["chains"], key=lambda c: c["start_time_s"])
    slow["start_time_s"] *= 1.5        # began at a slower start: still a start's time
    (out / "plan.json").write_text(json.dumps(doc))
    check_plan_dir(out)
    fastest = min(r["time_s"] for r in search["starts"])
    search["chains"][0]["start_time_s"] = 0.5 * fastest
    search["chains"][0]["best_time_s"] = min(search["chains"][0]["best_time_s"], 0.5 * fastest)
    (out / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(PlanCheckError, match="faster than the fastest of its starts"):
        check_plan_dir(out)


def test_check_refuses_a_number_too_long_to_read(tmp_path):
    # JSON has no limit on an integer's digits; Python reads at most 4300 of them
    (tmp_path / "plan.json").write_text('{"format": 1' + "0" * 5000 + "}\n")
    r = CliRunner().invoke(main, ["plan", "--check", str(tmp_path)])
    assert r.exit_code == 1 and "too long to read" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_lower_bounds_are_marked_and_checked(planned, tmp_path):
    # plan.json marks each start or screened time that is only a lower bound; a marked
    # time is below the strategy's time; --check refuses a mark that is not a boolean
    # or one on the first row (the strategy a search began with, always timed in full)
    out = tmp_path / "plan"
    write_plan(planned, out, exports=False, plots=False, report=False)
    doc = json.loads((out / "plan.json").read_text())
    rows = [r for f in doc["fabrics"].values() if "search" in f for r in f["search"]["starts"]]
    rows += doc["search"]["screened"]
    assert all(isinstance(r["lower_bound"], bool) for r in rows)
    marked = {r["strategy"] for r in doc["fabrics"]["ideal"]["search"]["starts"]
              if r["lower_bound"]}
    assert marked == set(planned.fabric("ideal").search.bounded)
    check_plan_dir(out)
    for bad, match in ((1, "must be true or false"), (True, "the first row")):
        doc["search"]["screened"][0]["lower_bound"] = bad
        (out / "plan.json").write_text(json.dumps(doc))
        with pytest.raises(PlanCheckError, match=match):
            check_plan_dir(out)
