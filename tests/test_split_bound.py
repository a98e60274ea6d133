"""The route-free bound of a TopologyFinder topology and the splits it leaves unrouted."""

import math

import numpy as np
import pytest
from test_topology_finder import make_traffic

from topoopt import Cluster, Job
from topoopt.finder.topology_finder import draft_topology, topology_finder
from topoopt.planners.alternating import (
    SPLIT_RATIO,
    _traffic,
    plan_topology,
    split_topologies,
    start_strategy,
    topoopt_fabric,
)
from topoopt.planners.cost import IterationCost
from topoopt.planners.space import StrategySpace
from topoopt.planners.structure import structured_strategies
from topoopt.routing.kshortest import hop_distances
from topoopt.routing.metrics import mp_link_time_bound
from topoopt.topology.topology import Topology
from topoopt.workloads import model_of


def _ring(n, bandwidth=100e9):
    return Topology(n, 1, tuple((i, 0, (i + 1) % n, 0) for i in range(n)), bandwidth)


def test_the_bound_is_the_bytes_on_shortest_paths_over_all_links():
    topo = _ring(4)
    mp = np.zeros((4, 4))
    mp[0, 2] = 1e6          # two hops on a one-way ring of 4
    mp[3, 0] = 5e5          # one hop
    expected = 8 * (2 * 1e6 + 1 * 5e5) / (4 * 100e9)
    assert mp_link_time_bound(topo, mp) == pytest.approx(expected, rel=1e-12)
    assert mp_link_time_bound(topo, mp, hop_distances(topo)) == mp_link_time_bound(topo, mp)
    assert mp_link_time_bound(topo, np.zeros((4, 4))) == 0.0


def test_a_pair_without_a_path_has_no_finite_bound():
    topo = Topology(3, 1, ((0, 0, 1, 0), (1, 0, 0, 0)), 100e9)   # server 2 is cut off
    mp = np.zeros((3, 3))
    mp[0, 2] = 1.0
    assert mp_link_time_bound(topo, mp) == math.inf


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_draft_routed_is_topology_finders_plan(seed):
    # one group over the shard, or groups over parts of it (a backbone ring joins them)
    rng = np.random.default_rng(seed)
    n = 12
    mp = np.where(rng.random((n, n)) < 0.3, rng.random((n, n)) * 1e7, 0.0) * (1 - np.eye(n))
    groups = ([(range(n), 4e8)] if seed == 0 else
              [(rng.permutation(n)[:int(rng.integers(2, n))].tolist(), 1e8 * (1 + i))
               for i in range(2)])
    traffic = make_traffic(n, groups, mp)
    for d_ar in (None, 1, 2, 3):
        draft = draft_topology(traffic, n, 4, 100e9, seed=seed, allreduce_degree=d_ar)
        plan = topology_finder(traffic, n, 4, 100e9, seed=seed, allreduce_degree=d_ar)
        assert draft.topology == plan.topology
        assert draft.degree_allreduce == plan.degree_allreduce
        assert np.array_equal(draft.dist, hop_distances(plan.topology))
        assert draft.plan() == plan


def _shard(servers, link_bandwidth, tables):
    cluster = Cluster(servers=servers, nics=4, link_bandwidth=link_bandwidth,
                      gpus_per_server=4)
    job = Job("dlrm", 128, size={"tables": tables, "rows": 1_000_000, "dim": 128, "bag": 100})
    model = model_of(job)
    return model, cluster, job, StrategySpace.build(model, cluster, job)


def _strategies(model, cluster, job, space, names):
    layouts = {lay.name: lay.strategy for lay in structured_strategies(model, space)}
    return [start_strategy(model, cluster, job, space)] + [layouts[n] for n in names]


@pytest.mark.parametrize("servers, link_bandwidth", [(16, 100e9), (32, 10e9)])
def test_the_bound_is_below_the_simulated_time_on_every_split(servers, link_bandwidth):
    # every MP byte crosses at least its pair's hop distance in links, and the
    # simulator's rates keep each link within its capacity: whatever the routes, the
    # iteration cannot end before the links carried them (nor before the busiest did)
    model, cluster, job, space = _shard(servers, link_bandwidth, servers // 2)
    names = ["tables-dp+body-mp4", "tables-spread+body-dp", "tables-spread+body-mp2",
             "tables-spread+body-mp8", "tables-spread+body-stages4-mp2"]
    for s in _strategies(model, cluster, job, space, names):
        traffic = _traffic(model, s, cluster, job)
        for d_ar in range(1, cluster.nics + 1):
            draft = draft_topology(traffic, servers, cluster.nics, link_bandwidth,
                                   cluster.link_latency, allreduce_degree=d_ar)
            plan = draft.plan()
            cost = IterationCost(model, cluster, job, topoopt_fabric(plan), plan.rings)
            bound = draft.lower_bound()
            assert bound <= cost.lower_bound(s, links=True) * (1 + 1e-9)
            assert bound <= cost(s) * (1 + 1e-9)


def test_the_bound_is_most_of_the_time_when_mp_crosses_a_ring():
    # the body 8-way model parallel on one AllReduce port: its MP bytes are most of
    # what the links carry, so the bound is a large part of the time, not a token one
    model, cluster, job, space = _shard(16, 100e9, 8)
    s = _strategies(model, cluster, job, space, ["tables-spread+body-mp8"])[1]
    draft = draft_topology(_traffic(model, s, cluster, job), 16, 4, 100e9,
                           cluster.link_latency, allreduce_degree=1)
    plan = draft.plan()
    t = IterationCost(model, cluster, job, topoopt_fabric(plan), plan.rings)(s)
    assert 0.5 * t < draft.lower_bound() <= t


def _key(splits):
    return [(plan.degree_allreduce, t) for plan, t in splits]


@pytest.mark.parametrize("name, base_degree", [
    ("tables-spread+body-mp8", 2), ("tables-spread+body-mp2", 2),
    ("tables-spread+body-mp4", 3), ("tables-spread+body-stages8", 2)])
def test_only_splits_slower_than_the_ratio_are_left_unrouted(name, base_degree):
    # the kept list is the full one less splits whose time (known from the full run)
    # is above SPLIT_RATIO x the fastest: nothing best_topology or a descent would use
    model, cluster, job, space = _shard(32, 10e9, 16)
    s = _strategies(model, cluster, job, space, [name])[1]
    plan = plan_topology(model, s, cluster, job, allreduce_degree=base_degree)
    base = (plan, IterationCost(model, cluster, job, topoopt_fabric(plan), plan.rings)(s))
    full = _key(split_topologies(model, s, cluster, job, base=base, reference_time=math.inf))
    best = full[0][1]
    kept = _key(split_topologies(model, s, cluster, job, base=base))
    assert kept == [k for k in full if k in kept]          # same order, same times
    assert kept[0] == full[0]
    assert (base_degree, base[1]) in kept                 # Step 1's split stays
    assert all(t > SPLIT_RATIO * best for d, t in full if (d, t) not in kept)
    # a reference time above the fastest keeps more, never less
    ref = _key(split_topologies(model, s, cluster, job, base=base, reference_time=2 * best))
    assert set(kept) <= set(ref)
    assert all(t > SPLIT_RATIO * 2 * best for d, t in full if (d, t) not in ref)
    if name == "tables-spread+body-mp8":
        # its 3-port AllReduce split is far slower than the 1-port one (MP crosses rings)
        assert len(kept) < len(full)
