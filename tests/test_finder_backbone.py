"""The backbone stride search: the bitset BFS against scipy, the bounded search against
the exhaustive reference."""

import importlib

import networkx as nx
import numpy as np
import pytest
from test_topology_finder import make_traffic

from topoopt.finder.backbone import (
    backbone_candidates,
    backbone_stride,
    backbone_stride_reference,
    mp_hop_bytes,
)
from topoopt.finder.perms import select_permutations, totient_perms
from topoopt.finder.topology_finder import is_strongly_connected, topology_finder

tf = importlib.import_module("topoopt.finder.topology_finder")


@pytest.mark.parametrize("seed", range(8))
def test_mp_hop_bytes_is_a_bfs_from_every_source(seed):
    # random digraphs (some pairs unreachable, parallel links, self-loops), more than
    # 64 sources so the bitset spans several words; networkx gives the hop counts
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 90))
    m = int(rng.integers(0, 4 * n))
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    mp = np.where(rng.random((n, n)) < 0.3, rng.random((n, n)), 0.0)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(zip(src.tolist(), dst.tolist()))
    d = dict(nx.all_pairs_shortest_path_length(g))
    pairs = list(zip(*np.nonzero(mp)))
    if any(v not in d[u] for u, v in pairs):
        assert mp_hop_bytes(mp, src, dst, n) == np.inf
    else:
        want = sum(mp[u, v] * d[u][v] for u, v in pairs)
        assert mp_hop_bytes(mp, src, dst, n) == pytest.approx(want, rel=1e-12)


def _base(n, seed, d=4):
    """A TopologyFinder topology without a backbone: random AllReduce groups that do not
    span the shard and random MP demand."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    cut = int(rng.integers(2, n - 1))
    groups = [(tuple(int(s) for s in perm[:cut]), 4e9), (tuple(int(s) for s in perm[cut:]), 3e9)]
    mp = np.where(rng.random((n, n)) < 4 / n, rng.integers(1, 10, (n, n)) * 1e8, 0.0)
    np.fill_diagonal(mp, 0.0)
    t = make_traffic(n, groups, mp)
    layout = tf._build(t, n, d, 100e9, 1e-6, False, tf._decay_fn(0.5), seed, None,
                       "rustworkx", 2)
    return mp, layout.topology


@pytest.mark.parametrize("n,seed", [(8, 0), (12, 1), (17, 2), (24, 3), (32, 4), (45, 5),
                                    (64, 6), (96, 7)])
def test_fast_search_picks_the_exhaustive_stride(n, seed):
    mp, base = _base(n, seed)
    assert backbone_stride(mp, base, False, seed, limit=None) == \
        backbone_stride_reference(mp, base, False, seed)
    assert backbone_stride(mp, base, True, seed, limit=None) == \
        backbone_stride_reference(mp, base, True, seed)


@pytest.mark.parametrize("n", [8, 64, 130, 256, 1000, 2048])
def test_bounded_candidates(n):
    full = backbone_candidates(n, False, 0, None)
    assert sorted(full) == list(totient_perms(n))
    assert full[0] == select_permutations(n, 1, seed=0).strides[0]
    few = backbone_candidates(n, False, 0, 64)
    assert len(few) == min(64, len(full)) and len(set(few)) == len(few)
    assert few[0] == full[0] and set(few) <= set(full)
    assert 1 in few and max(full[1:]) in few or len(full) == 1


@pytest.mark.parametrize("n,seed", [(150, 0), (200, 1)])
def test_bounded_search_is_the_best_of_its_candidates(n, seed):
    # more strides than the bound: the pick is the cheapest of the bounded candidates
    # (scored by scipy here), so never worse than SelectPermutations' default stride
    mp, base = _base(n, seed)
    links = [(a, b) for a, _, b, _ in base.links]

    def cost(p):
        g = nx.DiGraph(links + [(i, (i + p) % n) for i in range(n)])
        return sum(mp[u, v] * nx.shortest_path_length(g, u, v) for u, v in zip(*np.nonzero(mp)))

    cands = backbone_candidates(n, False, seed, 16)
    pick = backbone_stride(mp, base, False, seed, limit=16)
    costs = {p: cost(p) for p in cands}
    assert costs[pick] == min(costs.values()) <= costs[cands[0]]


def test_backbone_connects_a_large_pipeline_shard():
    # 512 servers: two AllReduce halves, MP only inside each half (so the halves stay
    # apart without a backbone); the bounded search scores 64 of 256 strides
    n, h = 512, 256
    mp = np.zeros((n, n))
    idx = np.arange(0, n, 2)
    mp[idx, idx + 1] = mp[idx + 1, idx] = 1e8
    t = make_traffic(n, [(tuple(range(h)), 4e9), (tuple(range(h, n)), 4e9)], mp)
    plan = topology_finder(t, n, 4, 100e9, allreduce_degree=2)
    assert plan.backbone is not None
    assert plan.backbone.strides[0] in backbone_candidates(n, False, 0)
    assert is_strongly_connected(plan.topology)


def test_per_pair_tiebreak_above_the_dense_limit(monkeypatch):
    # shards above DENSE_TIEBREAK_MAX draw one tie-break per pair: still a valid,
    # seed-deterministic plan whose matchings link only pairs with demand
    n = 16
    rng = np.random.default_rng(0)
    mp = np.where(rng.random((n, n)) < 0.4, rng.integers(1, 4, (n, n)) * 1e8, 0.0)
    np.fill_diagonal(mp, 0.0)
    t = make_traffic(n, [(tuple(range(0, n, 2)), 4e9)], mp)
    dense = topology_finder(t, n, 4, 100e9, seed=5)
    monkeypatch.setattr(tf, "DENSE_TIEBREAK_MAX", 4)
    a, b = (topology_finder(t, n, 4, 100e9, seed=5) for _ in range(2))
    assert a.topology == b.topology and a.matching_rounds == b.matching_rounds
    tf.check_topology_plan(a, t)
    want = mp + mp.T
    for plan in (dense, a):
        assert all(want[u, v] > 0 for rnd in plan.matching_rounds for u, v in rnd)
