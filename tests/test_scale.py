"""Plans at scale: a strategy and its shard's rings, groups and routes always agree."""

import numpy as np
import pytest
from test_topology_finder import make_traffic

from topoopt import Cluster, Job
from topoopt.errors import PlanCheckError
from topoopt.finder.topology_finder import check_topology_plan, extend_plan, topology_finder
from topoopt.planners.alternating import (
    _descend_splits,
    _Shard,
    _traffic,
    split_topologies,
    start_strategy,
)
from topoopt.planners.moves import MoveSet
from topoopt.planners.space import StrategySpace
from topoopt.planners.structure import structured_strategies
from topoopt.workloads import model_of


def test_extended_plan_carries_the_new_traffics_group_bytes():
    # a plan built for one strategy's traffic, kept for another whose groups have the
    # same members but other bytes (an operator moved between groups) and a new MP
    # pair: the extended plan's groups carry the new bytes (plan.json's group_bytes,
    # which `plan --check` compares with the strategy's AllReduce traffic)
    n = 8
    mp = np.zeros((n, n))
    mp[0, 5] = 3e6
    before = make_traffic(n, [(range(n), 4e8), ((0, 2, 4, 6), 1e8)], mp)
    plan = topology_finder(before, n, 4, 100e9)
    mp2 = mp.copy()
    mp2[1, 6] = 7e6
    after = make_traffic(n, [(range(n), 5e8), ((0, 2, 4, 6), 2e7)], mp2)
    with pytest.raises(PlanCheckError, match="bytes"):
        check_topology_plan(plan, after)     # stale bytes are refused
    ext = extend_plan(plan, after)
    check_topology_plan(ext, after)
    assert {g.members: g.bytes for g in ext.groups} == {
        g.members: g.network_bytes for g in after.allreduce}
    assert (1, 6) in ext.routes                # the new MP pair is routed
    assert ext.topology == plan.topology       # the links stay
    assert extend_plan(ext, after) == ext      # fitting twice changes nothing


def _dlrm_shard(servers: int, tables: int):
    cluster = Cluster(servers=servers, nics=4, link_bandwidth=100e9)
    job = Job("dlrm", 128, size={"tables": tables, "rows": 100_000, "dim": 64, "bag": 20,
                                 "bottom_layers": 2, "bottom_width": 256,
                                 "top_layers": 2, "top_width": 512})
    model = model_of(job)
    space = StrategySpace.build(model, cluster, job)
    return _Shard(model, cluster, job, space, 0, {})


def test_a_descent_on_another_split_keeps_a_topology_fitted_to_its_strategy():
    # the 256-server traceback ("0->129 carries bytes but is not a link and has no
    # route"): a round's best, descended on another degree split's topology, moved to
    # a strategy with MP pairs and groups that topology was not built for; the pair
    # kept must carry routes and rings for the strategy it is kept with
    p = _dlrm_shard(16, 8)
    start = start_strategy(p.model, p.cluster, p.job, p.space)
    splits = split_topologies(p.model, start, p.cluster, p.job)
    (plan0, t0), others = splits[0], splits[1:]
    moveset = MoveSet(p.space, tuple(structured_strategies(p.model, p.space)))
    strategy, plan, t = _descend_splits(p, moveset, start, plan0, t0 * 1e3,
                                        [(sp, tp) for sp, tp in others], 200)
    assert strategy.configs != start.configs   # else the test proves nothing
    traffic = _traffic(p.model, strategy, p.cluster, p.job)
    check_topology_plan(plan, traffic)
    assert t == pytest.approx(p.cost(plan)(strategy), rel=1e-12)   # timed as kept


def test_a_kept_cost_with_the_shared_cache_times_as_a_fresh_one():
    # the alternation keeps one cost per plan and one EstimateCache for every plan:
    # the same plan gives the same cost back, and each strategy on each plan takes
    # exactly the time a fresh IterationCost of its own gives (the old path)
    from topoopt.estimate import EstimateCache
    from topoopt.planners.alternating import topoopt_fabric
    from topoopt.planners.cost import IterationCost

    p0 = _dlrm_shard(16, 8)
    p = _Shard(p0.model, p0.cluster, p0.job, p0.space, 0, {},
               EstimateCache(p0.model, p0.cluster, p0.job))
    start = start_strategy(p.model, p.cluster, p.job, p.space)
    layouts = [lay.strategy for lay in structured_strategies(p.model, p.space)][:6]
    plans = [plan for plan, _ in split_topologies(p.model, start, p.cluster, p.job,
                                                  cost_of=p.cost)]
    assert len(plans) >= 2
    for plan in plans:
        assert p.cost(plan) is p.cost(plan)
        assert p.cost(plan).cache is p.cache
        for s in [start, *layouts]:
            fresh = IterationCost(p.model, p.cluster, p.job, topoopt_fabric(plan), plan.rings)
            assert p.cost(plan)(s) == fresh(s)


def test_the_plan_summary_names_the_skipped_exports(tmp_path):
    # 512 servers do not fit the default OCS's ports: the summary says what was not
    # written and why, on stdout with the rest of it, not only in a note line
    from click.testing import CliRunner
    from test_bad_input import tiny_config, to_toml

    from topoopt.cli import main

    (tmp_path / "c.toml").write_text(to_toml(tiny_config(servers=2)))
    r = CliRunner().invoke(main, ["plan", str(tmp_path / "c.toml"), "-o", str(tmp_path / "o"),
                                  "--quiet", "--workers", "1", "--no-plots", "--no-report"])
    assert r.exit_code == 0, r.output
    assert "skipped   msccl_allreduce.xml not written: " in r.stdout


def test_a_256_server_plan_passes_its_check():
    # the smallest effort that still searches (4 moves, one round, one chain) on a
    # 256-server shard, beside the Ideal Switch: the plan.json it gives passes
    # `plan --check` (every field checked or derived again), so the strategy and the
    # shard's rings, groups and routes agree at this size (~20 s of CPU)
    from topoopt import plan
    from topoopt.traffic import derive_traffic

    cluster = Cluster(servers=256, nics=4, link_bandwidth=100e9)
    job = Job("dlrm", 128, size={"tables": 8, "rows": 1_000_000, "dim": 64, "bag": 20,
                                 "bottom_layers": 2, "bottom_width": 256,
                                 "top_layers": 2, "top_width": 512})
    p = plan(cluster, job, budget=4, rounds=1, chains=1, baselines=("ideal",))
    p.check()
    traffic = derive_traffic(p.model, p.strategy, 256, job.global_batch(cluster),
                             job.dtype_bytes)
    check_topology_plan(p.topology_plan, traffic)
    assert p.topology_plan.topology.servers == 256
    assert p.iteration_time_s["ideal"] <= p.iteration_time_s["topoopt"]
    assert p.iteration_time_s["topoopt"] <= p.search.start_time * (1 + 1e-12)


def test_strategy_search_above_its_bound_is_refused_up_front():
    # cluster.servers goes to 2048 for LLM jobs; a DLRM plan (the MCMC strategy search)
    # stops at MAX_SEARCH_SERVERS, naming the field, before any work
    from topoopt.errors import ConfigError
    from topoopt.planners.alternating import MAX_SEARCH_SERVERS
    from topoopt.planners.planner import plan

    cluster = Cluster(servers=MAX_SEARCH_SERVERS + 2, nics=4, link_bandwidth=100e9)
    job = Job("dlrm", 128, size={"tables": 8, "rows": 1000, "dim": 64, "bag": 20})
    with pytest.raises(ConfigError, match="cluster.servers"):
        plan(cluster, job, budget=1)
    with pytest.raises(ConfigError, match="cluster.servers"):
        Cluster(servers=4096, nics=8, link_bandwidth=400e9)
    assert Cluster(servers=2048, nics=8, link_bandwidth=400e9).servers == 2048


def test_dp_matrix_is_the_sum_of_its_rings():
    # dp_matrix gathers every ring hop into one array: the same as adding one
    # ring_matrix per ring order (bytes split evenly), with rings given and not
    from topoopt.llm.parallel import LLMParallel
    from topoopt.llm.traffic import llm_traffic
    from topoopt.traffic import ring_matrix
    from topoopt.workloads import build_model
    from topoopt.workloads.gpt import transformer_shape

    s = transformer_shape(build_model("gpt3-175b"))
    t = llm_traffic(s, LLMParallel(8, 8, 16, micro_batches=96), 128, 8, 1536, 2)
    rng = np.random.default_rng(0)
    rings = {g.members: tuple(tuple(int(x) for x in rng.permutation(g.members))
                              for _ in range(1 + i % 3)) for i, g in enumerate(t.dp_groups)}
    for given in (None, rings):
        want = np.zeros((128, 128))
        for g in t.dp_groups:
            orders = (given or {}).get(g.members, [g.members])
            for order in orders:
                want += ring_matrix(order, g.ring_bytes_per_pair / len(orders), 128)
        assert np.array_equal(t.dp_matrix(given), want)
