"""topology_finder_accepting: the plan topology_finder gives, or None exactly when the
caller's ring check refuses that plan (the LLM planner's launch-order check, tried
early, against running TopologyFinder whole and checking after)."""

import importlib

import numpy as np
import pytest

from topoopt.cluster import Cluster, Job
from topoopt.fabrics.direct import direct_connect
from topoopt.finder.topology_finder import topology_finder, topology_finder_accepting
from topoopt.llm import finder_traffic, llm_iteration, llm_traffic
from topoopt.llm.fabric import fabric_comm_times
from topoopt.plans.llm import launch_order, launch_preserves_traffic
from topoopt.workloads import model_of
from topoopt.workloads.gpt import transformer_shape

llm = importlib.import_module("topoopt.planners.llm")


def _reference_split(task):
    """The planner's check after a whole TopologyFinder run (the path before the
    early check)."""
    shape, par, cluster, job = task.shape, task.parallel, task.cluster, task.job
    batch = job.global_batch(cluster)
    t = llm_traffic(shape, par, cluster.servers, cluster.gpus_per_server, batch,
                    job.dtype_bytes)
    plan = llm._member_ring_first(topology_finder(
        finder_traffic(t), cluster.servers, cluster.nics, cluster.link_bandwidth,
        cluster.link_latency, seed=task.seed, allreduce_degree=task.d_ar))
    if not launch_preserves_traffic(t, launch_order(plan.rings, cluster.servers)):
        return None, plan
    fabric = direct_connect(plan.topology, plan.routes, optics="patch_panel", name="topoopt",
                            rings=plan.rings)
    comm = fabric_comm_times(t, fabric, plan.rings)
    return llm_iteration(shape, par, cluster, batch, job.precision, t, comm), plan


@pytest.mark.parametrize("servers,nics,gpus", [(16, 4, 4), (32, 4, 2), (24, 6, 4)])
def test_early_launch_check_matches_the_whole_run(servers, nics, gpus):
    cluster = Cluster(servers=servers, nics=nics, link_bandwidth=100e9, gpus_per_server=gpus)
    job = Job("llama3-8b", 2, "bf16", size={"layers": 8, "seq": 512})
    shape = transformer_shape(model_of(job))
    ranked, _ = llm.rank_parallel(shape, cluster, job, llm.check_fixed(None))
    seen, kinds = set(), set()
    for cand in ranked:
        p = cand.parallel
        key = (p.tp, p.pp, p.dp, p.ep, p.order)
        if key in seen:
            continue
        seen.add(key)
        for task in llm._finder_tasks(shape, p, cluster, job, 0, {}):
            got = llm._topoopt_split(task)
            want, plan = _reference_split(task)
            kinds.add((want is None, plan.backbone is not None))
            assert (got is None) == (want is None)
            if got is not None:
                it, comm, found, d_ar = got
                assert it == want and found.topology == plan.topology
                assert found.rings == plan.rings and d_ar == plan.degree_allreduce
        if len(seen) >= 8:
            break
    assert {True, False} <= {refused for refused, _ in kinds}


def test_accepting_everything_is_topology_finder_and_nothing_is_none():
    cluster = Cluster(servers=16, nics=4, link_bandwidth=100e9, gpus_per_server=4)
    job = Job("llama3-8b", 2, "bf16", size={"layers": 8, "seq": 512})
    shape = transformer_shape(model_of(job))
    ranked, _ = llm.rank_parallel(shape, cluster, job, llm.check_fixed(None))
    t = finder_traffic(llm_traffic(shape, ranked[0].parallel, 16, 4, 32, 2))
    for d_ar in (None, 1, 4):
        plan = topology_finder(t, 16, 4, 100e9, allreduce_degree=d_ar)
        same = topology_finder_accepting(lambda rings: True, t, 16, 4, 100e9,
                                         allreduce_degree=d_ar)
        assert same == plan
        assert topology_finder_accepting(lambda rings: False, t, 16, 4, 100e9,
                                         allreduce_degree=d_ar) is None


def _member_order_first_reference(rings):
    """Every rotation of every order compared with the members (the O(k^2) check)."""
    out = {}
    for members, orders in rings.items():
        k = len(members)
        first = [i for i, o in enumerate(orders)
                 if any(tuple(o[(j + t) % k] for t in range(k)) == tuple(members)
                        for j in range(k))]
        if first:
            i = first[0]
            orders = (tuple(members),) + tuple(o for j, o in enumerate(orders) if j != i)
        out[members] = tuple(orders)
    return out


@pytest.mark.parametrize("seed", range(10))
def test_member_order_first_is_the_rotation_check(seed):
    rng = np.random.default_rng(seed)
    rings = {}
    for _ in range(4):
        k = int(rng.integers(1, 9))
        members = tuple(sorted(rng.choice(40, k, replace=False).tolist()))
        orders = []
        for _ in range(int(rng.integers(1, 4))):
            kind = rng.integers(3)
            if kind == 0:     # a rotation of the member order
                j = int(rng.integers(k))
                orders.append(members[j:] + members[:j])
            elif kind == 1:   # a reversed rotation (another ring)
                orders.append(tuple(reversed(members)))
            else:
                orders.append(tuple(rng.permutation(members).tolist()))
        rings[members] = tuple(orders)
    assert llm._member_order_first(rings) == _member_order_first_reference(rings)
