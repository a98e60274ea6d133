"""Fabrics: structure, ECMP routing against networkx, random paths, direct-connect, expanders."""

from collections import Counter

import networkx as nx
import numpy as np
import pytest

from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError, PlanCheckError, TopoOptError
from topoopt.fabrics import (
    Fabric,
    check_fabric,
    direct_connect,
    expander,
    fat_tree,
    ideal_switch,
    star,
)
from topoopt.fabrics.catalog import FABRICS, build_fabric
from topoopt.netsim import Workload, simulate
from topoopt.strategy import hybrid
from topoopt.topology import Routes, Topology, check_topology
from topoopt.topology.expander import expander_topology
from topoopt.workloads import model_of

G = 1e9


def _graph(f: Fabric) -> nx.MultiDiGraph:
    g = nx.MultiDiGraph()
    for i, (u, v) in enumerate(zip(f.src, f.dst)):
        g.add_edge(int(u), int(v), key=i)
    return g


def _route_conserves(f: Fabric, s: int, t: int, links, weights) -> None:
    """The weights form a unit flow from s to t (what enters a node leaves it)."""
    net = np.zeros(f.nodes)
    np.add.at(net, f.src[links], -weights)
    np.add.at(net, f.dst[links], weights)
    expect = np.zeros(f.nodes)
    expect[s], expect[t] = -1, 1
    assert net == pytest.approx(expect, abs=1e-12)


# --- switched fabrics -----------------------------------------------------------------

def test_ideal_switch_and_star():
    f = ideal_switch(8, 400 * G, 1e-6)
    check_fabric(f)
    assert f.links == 16 and f.nodes == 9 and f.server_bandwidth == 400 * G
    r = f.route([0, 3], [5, 3])
    assert r.row(0)[0].tolist() == [0, 13] and len(r.row(1)[0]) == 0
    assert f.path_latency([0], [5])[0] == pytest.approx(2e-6)
    s = star(3, [10 * G, 20 * G, 30 * G])
    assert s.capacity.tolist() == [10 * G, 20 * G, 30 * G] * 2
    with pytest.raises(ConfigError):
        star(3, [10 * G, 0, 1])


@pytest.mark.parametrize("k", [4, 6, 8])
def test_full_fat_tree_structure(k):
    n = k ** 3 // 4
    f = fat_tree(n, 10 * G)
    check_fabric(f)
    half = k // 2
    assert f.info == {"k": k, "oversubscription": 1, "pods": k, "edge": k * half,
                      "aggregation": k * half, "core": half * half}
    assert f.links == 2 * 3 * n          # server, edge-agg, agg-core layers of n cables
    deg_out = np.bincount(f.src, minlength=f.nodes)
    assert np.all(deg_out[n:] == k)      # every switch uses all k ports
    # ECMP path counts: same ToR 1, same pod k/2, other pod (k/2)^2
    assert len(f.paths(0, 1)) == 1
    assert len(f.paths(0, half)) == half
    other = f.paths(0, n - 1)
    assert len(other) == half * half and all(len(p) == 6 for p, _ in other)
    assert sum(w for _, w in other) == pytest.approx(1.0)


def test_oversubscribed_fat_tree_halves_tor_uplinks():
    f = fat_tree(128, 400 * G, oversubscription=2)
    check_fabric(f)
    assert f.name == "oversub" and f.info["aggregation"] == 16 and f.info["core"] == 8
    tors = np.unique(f.attach)
    up = np.array([np.sum((f.src == t) & (f.dst >= 128)) for t in tors])
    down = np.array([np.sum((f.src == t) & (f.dst < 128)) for t in tors])
    assert np.all(down == 4) and np.all(up == 2)
    with pytest.raises(ConfigError):
        fat_tree(16, 1e9, k=6, oversubscription=2)


def test_partial_fat_tree_drops_empty_switches():
    f = fat_tree(20, 10 * G)   # k = 4 holds 16 < 20, so k = 6 with 20 of 54 servers
    check_fabric(f)
    assert f.info["k"] == 6 and f.info["edge"] == 7 and f.info["pods"] == 3
    small = fat_tree(3, 10 * G, k=6)  # one ToR: no aggregation, no core
    assert small.info["aggregation"] == 0 and small.info["core"] == 0
    assert small.nodes == 4


def _all_pairs(n):
    s, t = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    keep = s != t
    return s[keep], t[keep]


@pytest.mark.parametrize("build", [lambda: fat_tree(16, 10 * G),
                                   lambda: fat_tree(54, 10 * G, oversubscription=1),
                                   lambda: expander(24, 3, 10 * G, seed=5)])
def test_ecmp_matches_networkx_shortest_paths(build):
    f = build()
    g = _graph(f)
    s, t = _all_pairs(f.servers)
    r = f.route(s, t)
    simple = nx.DiGraph(g)
    for i in range(0, s.size, 7):
        links, weights = r.row(i)
        _route_conserves(f, s[i], t[i], links, weights)
        a, b = int(f.attach[s[i]]), int(f.attach[t[i]])
        paths = list(nx.all_shortest_paths(simple, a, b)) if a != b else [[a]]
        assert len(f.paths(int(s[i]), int(t[i]))) == len(paths)
        # equal share per shortest path: weight of link (u, v) = share of paths using it
        use = Counter()
        for p in paths:
            for u, v in zip(p, p[1:]):
                use[(u, v)] += 1 / len(paths)
        got = {(int(f.src[l]), int(f.dst[l])): w for l, w in zip(links, weights)
               if f.src[l] >= f.servers or f.kind == "direct"}
        if f.kind == "switched":
            got = {k: v for k, v in got.items() if k[1] >= f.servers}
        assert got == pytest.approx(dict(use))


def test_random_single_paths_are_shortest_seeded_and_uniform():
    f = fat_tree(16, 10 * G)
    s = np.zeros(4000, np.int64)
    t = np.full(4000, 15)
    r = f.route(s, t, random=True, seed=11)
    assert np.all(np.diff(r.ptr) == 6)
    for i in range(0, 4000, 500):
        links, w = r.row(i)
        _route_conserves(f, 0, 15, links, w)
    counts = Counter(tuple(r.row(i)[0]) for i in range(4000))
    assert len(counts) == 4 and min(counts.values()) > 850   # 4 paths, ~1000 each
    (one_path, weight), = f.paths(0, 15, random=True, seed=4)
    assert weight == 1 and len(one_path) == 6 and f.src[one_path[0]] == 0
    assert np.array_equal(f.dst[one_path[:-1]], f.src[one_path[1:]])   # consecutive links
    again = f.route(s, t, random=True, seed=11)
    other = f.route(s, t, random=True, seed=12)
    assert np.array_equal(r.link, again.link) and not np.array_equal(r.link, other.link)


# --- direct-connect -------------------------------------------------------------------

def _ring(n, ports=1, stride=1):
    return Topology(n, ports, tuple((i, 0, (i + stride) % n, 0) for i in range(n)), 100 * G)


def test_direct_connect_bundles_parallel_links_and_forwards_by_host():
    links = ((0, 0, 1, 0), (0, 1, 1, 1), (1, 0, 2, 0), (2, 0, 0, 0), (1, 1, 0, 1),
             (2, 1, 1, 2), (0, 2, 2, 2))
    f = direct_connect(Topology(3, 3, links, 100 * G))
    check_fabric(f)
    pair = np.flatnonzero((f.src == 0) & (f.dst == 1))
    assert f.capacity[pair].tolist() == [200 * G] and f.info["bundled"] == 1
    # host-based forwarding: 0 -> 2 on a ring 0->1->2->3->0 takes 2 hops; a flow on
    # 1 -> 2 halves the relayed flow's rate on that hop.
    ring = direct_connect(_ring(4))
    w = Workload()
    a = w.add_flows(12.5e6, ring.route([0], [2]))[0]
    b = w.add_flows(12.5e6, ring.route([1], [2]))[0]
    res = simulate(ring, w)
    assert res.tx_end[a] == pytest.approx(2e-3) and res.tx_end[b] == pytest.approx(2e-3)
    assert res.finish[a] - res.tx_end[a] == pytest.approx(2e-6)   # two hops of latency


def test_direct_connect_explicit_routes_and_fallback():
    topo = Topology(4, 2, tuple((i, 0, (i + 1) % 4, 0) for i in range(4))
                    + tuple((i, 1, (i + 3) % 4, 1) for i in range(4)), 100 * G)
    routes = Routes({(0, 2): (((0, 1, 2), 0.25), ((0, 3, 2), 0.75))})
    f = direct_connect(topo, routes)
    paths = f.paths(0, 2)
    assert [w for _, w in paths] == [0.25, 0.75]
    links, weights = f.route([0], [2]).row(0)
    assert sorted(weights.tolist()) == [0.25, 0.25, 0.75, 0.75]
    _route_conserves(f, 0, 2, links, weights)
    # random mode keeps the explicit routes; other pairs fall back to ECMP
    assert np.array_equal(f.route([0], [2], random=True).link, f.route([0], [2]).link)
    links, weights = f.route([1], [3]).row(0)
    assert weights.sum() == pytest.approx(2.0) and len(f.paths(1, 3)) == 2
    with pytest.raises(PlanCheckError):
        direct_connect(topo, Routes({(0, 2): (((0, 2), 1.0),)}))   # no link 0 -> 2


def test_unreachable_pair_raises():
    topo = Topology(4, 1, ((0, 0, 1, 0), (1, 0, 0, 0), (2, 0, 3, 0), (3, 0, 2, 0)), G)
    f = direct_connect(topo)
    with pytest.raises(TopoOptError, match="no path from server 0 to server 2"):
        f.route([0], [2])
    with pytest.raises(PlanCheckError, match="strongly connected"):
        check_fabric(f)


# --- expander ------------------------------------------------------------------------

@pytest.mark.parametrize("n,d", [(2, 1), (5, 1), (8, 3), (16, 4), (64, 8)])
def test_expander_topology_is_d_regular_strongly_connected(n, d):
    topo = expander_topology(n, d, 100 * G, seed=2)
    check_topology(topo)
    assert all(topo.out_degree(i) == d and topo.in_degree(i) == d for i in range(n))
    g = topo.simple_graph()
    assert nx.is_strongly_connected(g)
    if d < n - 1:
        assert g.number_of_edges() == n * d   # no parallel links
    assert topo == expander_topology(n, d, 100 * G, seed=2)
    assert topo.links != expander_topology(n, d, 100 * G, seed=3).links or n == 2


def test_expander_diameter_is_small():
    g = expander_topology(128, 4, G, seed=0).simple_graph()
    # a 4-regular digraph on 128 nodes needs >= 4 hops (1+4+16+64 < 128); random
    # ones stay close to that bound
    assert 4 <= nx.diameter(g) <= 8


def test_expander_rejects_bad_sizes():
    with pytest.raises(ConfigError):
        expander_topology(1, 2, G)
    with pytest.raises(ConfigError):
        expander_topology(8, 0, G)


# --- catalog and checker --------------------------------------------------------------

def test_catalog_builds_every_fabric_for_a_cluster():
    cluster = Cluster(servers=16, nics=4, link_bandwidth=100 * G)
    job = Job("dlrm", batch_per_gpu=64, size={"tables": 8, "rows": 10_000})
    model = model_of(job)
    for name in FABRICS:
        f = build_fabric(name, cluster, job=job, model=model, strategy=hybrid(model, 16))
        check_fabric(f)
        assert f.servers == 16
    topo = build_fabric("topoopt", cluster, job=job, model=model, strategy=hybrid(model, 16))
    assert topo.kind == "direct" and topo.optics == "patch_panel" and topo.info["rings"]
    with pytest.raises(ConfigError, match="needs the job"):
        build_fabric("topoopt", cluster)
    assert build_fabric("ideal", cluster).server_bandwidth == 400 * G
    assert build_fabric("oversub", cluster).server_bandwidth == 400 * G
    assert 100 * G < build_fabric("fattree", cluster).server_bandwidth < 400 * G
    with pytest.raises(ConfigError, match="fabric"):
        build_fabric("torus", cluster)


def test_check_fabric_rejects_broken_fabrics():
    f = ideal_switch(4, G)
    bad = f.with_capacity(np.where(np.arange(f.links) == 2, 0.0, f.capacity))
    with pytest.raises(PlanCheckError, match="capacities"):
        check_fabric(bad)
    loop = Fabric("x", 2, 3, [0, 2, 1, 2, 2], [2, 0, 2, 1, 2], np.ones(5), np.zeros(5),
                  "switched", "none", 1.0, [2, 2], [0, 2], [1, 3])
    with pytest.raises(PlanCheckError, match="self-loop"):
        check_fabric(loop)


@pytest.mark.parametrize("by_hand", [True, False])   # the product without scipy, or by it
@pytest.mark.parametrize("build", [lambda: fat_tree(16, 10 * G), lambda: ideal_switch(6, G),
                                   lambda: expander(12, 3, G, seed=1)])
def test_coupled_route_equals_the_share_weighted_sum_of_member_routes(build, by_hand,
                                                                       monkeypatch):
    import topoopt.fabrics.fabric as fabric_mod
    monkeypatch.setattr(fabric_mod, "_SMALL_COUPLED", 1 << 20 if by_hand else 0)
    f = build()
    rng = np.random.default_rng(0)
    m = 40
    src = rng.integers(0, f.servers, m)
    dst = rng.integers(0, f.servers, m)
    group = rng.integers(0, 5, m)
    share = rng.uniform(0.1, 1.0, m)
    got, lat = f.coupled_route(src, dst, group, share, 5)
    expect = np.zeros((5, f.links))
    r = f.route(src, dst)
    for i in range(m):
        links, weights = r.row(i)
        expect[group[i], links] += share[i] * weights
    dense = np.zeros((5, f.links))
    for g in range(5):
        links, weights = got.row(g)
        dense[g, links] = weights
    assert dense == pytest.approx(expect)
    pl = f.path_latency(src, dst)
    assert lat == pytest.approx([pl[group == g].max(initial=0.0) for g in range(5)])
