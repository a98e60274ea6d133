"""Link loads read from the fabric's route store (``Fabric.link_bytes``, which the link
bound's pattern loads use) equal the sums over :meth:`Fabric.route`'s rows, to the bit,
whatever order the fabric routed its pairs in (``tests/test_estimate_fast.py`` checks the
bound against the graph's busiest link)."""

import numpy as np
import pytest

from tests.test_estimate_fast import random_strategies
from topoopt.cluster import Cluster, Job
from topoopt.errors import TopoOptError
from topoopt.estimate.graph import IterationGraphBuilder
from topoopt.fabrics import expander, fat_tree
from topoopt.planners.alternating import plan_topology, topoopt_fabric
from topoopt.strategy import hybrid
from topoopt.workloads import model_of

G = 1e9  # bits/s per Gbps
DLRM = {"tables": 8, "rows": 10_000, "dim": 32, "bag": 4}
N = 16


def _setup():
    job = Job("dlrm", batch_per_gpu=16, size=DLRM)
    model = model_of(job)
    cluster = Cluster(servers=N, nics=4, link_bandwidth=100 * G, link_latency=1e-6)
    plan = plan_topology(model, hybrid(model, N), cluster, job)    # tables MP: routes
    assert len(plan.routes)
    fabrics = {"expander": (expander(N, 4, 100 * G), None),     # ECMP: split routes
               "fattree": (fat_tree(N, cluster.server_bandwidth), None),
               "topoopt": (topoopt_fabric(plan), plan.rings)}
    return model, cluster, job, fabrics


def _dense(bounds, src, dst, overlap):
    """The loads summed over the routes of every pair with bytes, in pair order."""
    n = bounds.builder.n
    matrix = np.bincount(np.concatenate([src * n + dst, dst * n + src]),
                         weights=np.concatenate([overlap, overlap]), minlength=n * n)
    pairs = np.flatnonzero(matrix)
    r = bounds.builder.fabric.route(pairs // n, pairs % n)
    return np.bincount(r.link, weights=np.repeat(matrix[pairs], np.diff(r.ptr)) * r.weight,
                       minlength=bounds.builder.fabric.links)


@pytest.mark.parametrize("name", ["expander", "fattree", "topoopt"])
def test_pattern_loads_equal_the_sums_over_routed_rows_bit_for_bit(name):
    model, cluster, job, fabrics = _setup()
    fabric, rings = fabrics[name]
    builder = IterationGraphBuilder(model, cluster, job, fabric, rings)
    bounds = builder.bounds
    rng = np.random.default_rng(1)
    for size in (1, 3, 20, 200, 2000):       # few pairs, repeats, the diagonal, all pairs
        src = rng.integers(0, N, size)
        dst = rng.integers(0, N, size)
        overlap = rng.random(size) * 10.0 ** rng.integers(-3, 9, size)
        got = bounds._pattern_link_loads(src, dst, overlap)
        np.testing.assert_array_equal(got, _dense(bounds, src, dst, overlap))
    # the patterns the strategies' MP transfers make
    seen = 0
    for s in random_strategies(model, cluster, job, 12, seed=4):
        segs, seg_of, info = builder.fused(s)
        for u, v in model.edges:
            gu, gv = int(seg_of[u]), int(seg_of[v])
            if gu < 0 or gu == gv:
                continue
            src, dst, overlap = builder.cache.pattern(segs[gu].config, segs[gv].config)
            got = bounds._pattern_link_loads(src, dst, overlap)
            np.testing.assert_array_equal(got, _dense(bounds, src, dst, overlap))
            seen += 1
    assert seen > 0


@pytest.mark.parametrize("name", ["expander", "fattree", "topoopt"])
def test_link_bytes_do_not_depend_on_the_routing_order_or_the_chunks(name, monkeypatch):
    from topoopt.fabrics import _router as router_module
    fabric = _setup()[3][name][0]
    rng = np.random.default_rng(7)
    src, dst = rng.integers(0, N, 300), rng.integers(0, N, 300)
    nbytes = rng.random(300) * 1e6
    first = fabric.link_bytes(src, dst, nbytes)
    fabric.release_routes()
    order = rng.permutation(N * N)      # the pairs routed anew, in another order
    fabric.route(order // N, order % N)
    np.testing.assert_array_equal(fabric.link_bytes(src, dst, nbytes), first)
    # a few entries at a time: the same sums, up to the order of the chunks' partial sums
    monkeypatch.setattr(router_module, "_EXPLICIT_CHUNK", 5)
    np.testing.assert_allclose(fabric.link_bytes(src, dst, nbytes), first, rtol=1e-12)
    assert first.sum() > 0
    with pytest.raises(TopoOptError, match="same length"):
        fabric.link_bytes(src, dst[:3], nbytes)
