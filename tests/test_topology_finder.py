"""TopologyFinder (TopoOpt §4): invariants over random traffic, and each step against a reference."""

import importlib
from itertools import combinations

import networkx as nx
import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from topoopt.errors import PlanCheckError
from topoopt.finder.degree import allocate_group_degrees, split_degree
from topoopt.finder.matching import matching_weight, max_weight_matching
from topoopt.finder.perms import ring_order, select_permutations, totient_perms
from topoopt.finder.topology_finder import check_topology_plan, topology_finder
from topoopt.routing.coin_change import coin_change
from topoopt.routing.metrics import path_length_stats, topology_metrics
from topoopt.strategy import data_parallel, hybrid
from topoopt.topology.topology import check_topology
from topoopt.traffic import AllReduceGroup, Traffic, Transfers, derive_traffic
from topoopt.workloads import build_model


def make_traffic(n, groups, mp):
    src, dst = np.nonzero(mp)
    transfers = Transfers(src, dst, mp[src, dst], np.zeros(src.size, np.int64),
                          np.zeros(src.size, np.int8))
    ar = tuple(AllReduceGroup(tuple(sorted(m)), float(b)) for m, b in groups)
    return Traffic(n, ar, mp, transfers)


# --- TotientPerms and SelectPermutations -------------------------------------------------

def test_totient_perms_of_12():
    assert totient_perms(12) == (1, 5, 7, 11)


@pytest.mark.parametrize("n", [2, 3, 7, 16, 30, 97, 128])
def test_totient_perms_count_and_primes(n):
    perms = totient_perms(n)
    assert len(perms) == sympy.totient(n)
    primes = totient_perms(n, primes_only=True)
    assert set(primes) <= set(perms) and 1 in primes
    assert all(p == 1 or sympy.isprime(p) for p in primes)
    assert primes == (1,) + tuple(p for p in sympy.primerange(2, n) if n % p)
    for p in perms:  # each stride is one Hamiltonian cycle
        assert sorted(ring_order(tuple(range(n)), p)) == list(range(n))


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 40), st.integers(1, 5))
def test_select_permutations_diameter_matches_networkx(n, m):
    sel = select_permutations(n, m)
    assert len(sel.strides) == m
    assert all(np.gcd(p, n) == 1 for p in sel.strides)
    g = nx.DiGraph()
    g.add_edges_from((i, (i + p) % n) for i in range(n) for p in sel.strides)
    assert nx.is_strongly_connected(g)
    assert sel.diameter == nx.diameter(g)
    lengths = dict(nx.all_pairs_shortest_path_length(g))
    mean = np.mean([lengths[u][v] for u in range(n) for v in range(n) if u != v])
    assert sel.mean_distance == pytest.approx(mean)


@pytest.mark.parametrize("n,m", [(12, 2), (16, 3), (25, 3), (30, 2)])
def test_select_permutations_fit_is_the_exact_l1_optimum(n, m):
    sel = select_permutations(n, m, refine=0)
    cands = totient_perms(n)
    target = np.array(sel.target)
    # brute force over all m-subsets, best matching of sorted subset to the target
    best = min(
        min(sum(abs(p - t) for p, t in zip(perm, target)) for perm in _perms(subset))
        for subset in combinations(cands, m))
    assert sel.l1 == pytest.approx(best)


def _perms(subset):
    from itertools import permutations
    return permutations(subset)


def test_refined_selection_never_worse():
    for n, m in [(64, 3), (128, 4), (128, 8)]:
        fit = select_permutations(n, m, refine=0)
        ref = select_permutations(n, m)
        assert (ref.diameter, ref.mean_distance) <= (fit.diameter, fit.mean_distance)


# --- degree split and Blossom -----------------------------------------------------------

def test_split_degree():
    assert split_degree(4, 10.0, 0.0) == 4        # no MP: everything to AllReduce
    assert split_degree(4, 0.0, 10.0) == 1        # at least one to AllReduce
    assert split_degree(8, 50.0, 50.0) == 4
    assert split_degree(4, 99.0, 1.0) == 3        # MP gets what rounding down leaves


def test_allocate_group_degrees_respects_every_server():
    budget = np.array([3, 3, 3, 3, 3, 3])
    groups = [range(6), range(3), (3, 4), (0, 5)]
    deg = allocate_group_degrees(groups, [10.0, 6.0, 1.0, 0.5], budget)
    use = np.zeros(6, int)
    for g, dk in zip(groups, deg):
        use[list(g)] += dk
    assert np.all(use <= budget)
    assert deg[0] >= 1 and deg[0] >= deg[2]
    # disjoint groups each get the whole budget
    assert allocate_group_degrees([(0, 1), (2, 3)], [1.0, 5.0], np.array([2] * 4)) == (2, 2)


def brute_force_matching_weight(w):
    n = w.shape[0]
    edges = [(u, v) for u in range(n) for v in range(u + 1, n) if w[u, v] > 0]
    best = 0
    for r in range(n // 2 + 1):
        for combo in combinations(edges, r):
            nodes = [x for e in combo for x in e]
            if len(nodes) == len(set(nodes)):
                best = max(best, sum(int(w[u, v]) for u, v in combo))
    return best


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 7), st.integers(0, 2**31), st.floats(0.2, 1.0))
def test_blossom_equals_brute_force(n, seed, density):
    rng = np.random.default_rng(seed)
    w = rng.integers(1, 100, size=(n, n)) * (rng.random((n, n)) < density)
    w = np.triu(w, 1)
    w = w + w.T
    want = brute_force_matching_weight(w)
    for method in ("rustworkx", "networkx"):
        pairs = max_weight_matching(w, method=method)
        nodes = [x for e in pairs for x in e]
        assert len(nodes) == len(set(nodes))
        assert matching_weight(w, pairs) == want


def test_rustworkx_and_networkx_agree_on_a_larger_graph():
    rng = np.random.default_rng(5)
    w = rng.integers(1, 2**40, size=(60, 60))
    w = np.triu(w, 1)
    w = w + w.T
    a = max_weight_matching(w, method="rustworkx")
    b = max_weight_matching(w, method="networkx")
    assert matching_weight(w, a) == matching_weight(w, b)


# --- the finder on random traffic -------------------------------------------------------

@st.composite
def random_traffic(draw):
    n = draw(st.integers(2, 14))
    d = draw(st.integers(1, 4))
    groups = []
    for _ in range(draw(st.integers(0, 3))):
        size = draw(st.integers(2, n))
        members = draw(st.permutations(range(n)))[:size]
        groups.append((tuple(members), draw(st.floats(0.0, 1e9))))
    seen, uniq = set(), []
    for m, b in groups:
        if tuple(sorted(m)) not in seen:
            seen.add(tuple(sorted(m)))
            uniq.append((m, b))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    density = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    mp = rng.uniform(1, 1e8, size=(n, n)) * (rng.random((n, n)) < density)
    np.fill_diagonal(mp, 0.0)
    return make_traffic(n, uniq, mp), d, seed


@settings(max_examples=60, deadline=None)
@given(random_traffic(), st.sampled_from([0.5, 0.0, 0.9]), st.booleans())
def test_finder_invariants(case, decay, primes_only):
    traffic, d, seed = case
    n = traffic.servers
    plan = topology_finder(traffic, n, d, 100e9, mp_decay=decay, primes_only=primes_only,
                           seed=seed % 1000, k_paths=3)
    check_topology_plan(plan, traffic)   # ports, rings, routes, connectivity
    topo = plan.topology
    check_topology(topo, max_ports=d)    # no server uses more than d ports
    for s in range(n):
        assert topo.out_degree(s) <= d and topo.in_degree(s) <= d
    # every port that can be used is: at most one server is left with free ports
    assert sum(topo.out_degree(s) < d for s in range(n)) <= 1
    for gp in plan.groups:
        for order in plan.rings[gp.members]:
            assert sorted(order) == list(gp.members)
    for (src, dst), opts in plan.routes.paths.items():
        assert sum(f for _, f in opts) == pytest.approx(1.0)
        assert all(p[0] == src and p[-1] == dst for p, _ in opts)


def test_no_mp_traffic_gives_all_degree_to_allreduce():
    m = build_model("ncf", {"tables": 2, "rows": 100, "top_layers": 1})
    t = derive_traffic(m, data_parallel(m, 8), 8, 8 * 4 * 16, 4)
    plan = topology_finder(t, 8, 3, 100e9)
    check_topology_plan(plan, t)
    assert plan.degree_allreduce == 3 and plan.degree_mp == 0 and plan.mp_links == 0
    assert all(lab.startswith("ring:") for lab in plan.topology.labels)
    assert not plan.routes  # every ring hop is a link
    assert topology_metrics(plan.topology, t, plan.rings, plan.routes).bandwidth_tax == 1.0


def test_dlrm_hybrid_builds_an_mp_subtopology():
    m = build_model("dlrm", {"tables": 16, "rows": 1000})
    t = derive_traffic(m, hybrid(m, 16), 16, 16 * 4 * 128, 4)
    plan = topology_finder(t, 16, 4, 100e9)
    check_topology_plan(plan, t)
    assert plan.degree_mp >= 1 and plan.mp_links > 0
    assert "mp" in plan.topology.labels
    # Blossom links pair distinct servers on one port each way (full duplex)
    mp = [l for l, lab in zip(plan.topology.links, plan.topology.labels) if lab == "mp"]
    assert {(a, pa, b, pb) for a, pa, b, pb in mp} == {(b, pb, a, pa) for a, pa, b, pb in mp}


def test_subgroup_rings_stay_inside_and_hosted_groups_use_coin_change():
    n = 12
    mp = np.zeros((n, n))
    groups = [(tuple(range(n)), 9e9), (tuple(range(0, n, 2)), 1e8), ((3, 5), 5e7)]
    t = make_traffic(n, groups, mp)
    plan = topology_finder(t, n, 3, 100e9)
    check_topology_plan(plan, t)
    by = {g.members: g for g in plan.groups}
    assert by[tuple(range(n))].degree == 3
    small = by[tuple(range(0, n, 2))]
    assert small.degree == 0 and small.host == tuple(range(n))
    strides = by[tuple(range(n))].selection.strides
    direct = {(a, b) for a, _, b, _ in plan.topology.links}
    for order in plan.rings[small.members]:
        for u, v in zip(order, order[1:] + order[:1]):
            if (u, v) in direct:
                continue
            # routed over the big group's rings with the fewest coins
            coins = coin_change((v - u) % n, strides, n)
            for path, _ in plan.routes[u, v]:
                assert len(path) - 1 == len(coins)


def test_disjoint_groups_get_a_backbone():
    n = 8
    t = make_traffic(n, [((0, 1, 2, 3), 1e9), ((4, 5, 6, 7), 1e9)], np.zeros((n, n)))
    plan = topology_finder(t, n, 2, 100e9)
    check_topology_plan(plan, t)
    assert plan.backbone is not None
    assert sum(lab.startswith("backbone") for lab in plan.topology.labels) == n
    assert [g.degree for g in plan.groups] == [1, 1]


def test_backbone_stride_carries_the_mp_demand_in_the_fewest_hop_bytes():
    # two halves, each its own AllReduce group, and a pipeline between them (i -> i + n/2)
    # plus heavy MP inside the first half: the stride-1 backbone would cross between the
    # halves at two links only
    from topoopt.finder.backbone import backbone_stride as _backbone_stride

    n, h = 32, 16
    mp = np.zeros((n, n))
    for i in range(h):
        mp[i, i + h] = mp[i + h, i] = 1e8          # the stage boundary
    for a in range(0, h, 2):
        mp[a, a + 1] = mp[a + 1, a] = 1e9          # tensor-parallel partners
    t = make_traffic(n, [(tuple(range(h)), 4e9), (tuple(range(h, n)), 4e9)], mp)
    plan = topology_finder(t, n, 4, 100e9, allreduce_degree=3)
    check_topology_plan(plan, t)
    p = plan.backbone.strides[0]
    assert p != 1
    # brute force over every stride on the topology built without a backbone
    tf = importlib.import_module("topoopt.finder.topology_finder")
    base = tf._build(t, n, 4, 100e9, 1e-6, False, tf._decay_fn(0.5), 0, None, "rustworkx",
                     3).topology
    links = [(a, b) for a, _, b, _ in base.links]

    def hop_bytes(q):
        g = nx.DiGraph(links + [(i, (i + q) % n) for i in range(n)])
        d = dict(nx.all_pairs_shortest_path_length(g))
        return sum(mp[u, v] * d[u][v] for u, v in zip(*np.nonzero(mp)))

    costs = {q: hop_bytes(q) for q in totient_perms(n)}
    assert _backbone_stride(mp, base, False, 0) == p
    assert costs[p] == min(costs.values()) < 0.75 * costs[1]


def test_group_of_two_and_uncovered_servers_use_all_ports():
    n = 6
    t = make_traffic(n, [((1, 4), 1e9)], np.zeros((n, n)))
    plan = topology_finder(t, n, 3, 100e9)
    check_topology_plan(plan, t)
    assert all(plan.topology.out_degree(s) == 3 for s in range(n))


def test_bad_inputs_are_refused():
    t = make_traffic(4, [((0, 1, 2, 3), 1.0)], np.zeros((4, 4)))
    with pytest.raises(ValueError):
        topology_finder(t, 5, 2, 1e9)
    with pytest.raises(ValueError):
        topology_finder(t, 4, 0, 1e9)
    with pytest.raises(ValueError):
        topology_finder(t, 4, 2, 1e9, routing="ecmp")


def test_checker_catches_a_broken_ring():
    t = make_traffic(6, [(tuple(range(6)), 1e9)], np.zeros((6, 6)))
    plan = topology_finder(t, 6, 2, 100e9)
    from dataclasses import replace
    bad = replace(plan, rings={tuple(range(6)): ((0, 1, 2, 3, 4, 4),)})
    with pytest.raises(PlanCheckError):
        check_topology_plan(bad, t)


def test_lp_routing_plan_is_valid():
    m = build_model("dlrm", {"tables": 8, "rows": 1000})
    t = derive_traffic(m, hybrid(m, 8), 8, 8 * 4 * 512, 4)
    ks = topology_finder(t, 8, 3, 100e9)
    lp = topology_finder(t, 8, 3, 100e9, routing="lp")
    check_topology_plan(lp, t)
    assert lp.topology == ks.topology

    def mp_max_load(plan):
        mult, load = {}, {}
        for a, _, b, _ in plan.topology.links:
            mult[a, b] = mult.get((a, b), 0) + 1
        for (u, v) in zip(*np.nonzero(t.mp)):
            opts = plan.routes[int(u), int(v)]
            for path, f in opts:
                for hop in zip(path, path[1:]):
                    load[hop] = load.get(hop, 0.0) + t.mp[u, v] * f / mult[hop]
        return max(load.values())

    assert lp.mp_max_load == pytest.approx(mp_max_load(lp), rel=1e-4)
    assert lp.mp_max_load <= mp_max_load(ks) * (1 + 1e-6)


def test_metrics_match_networkx():
    m = build_model("dlrm", {"tables": 16, "rows": 1000})
    t = derive_traffic(m, hybrid(m, 16), 16, 16 * 4 * 128, 4)
    plan = topology_finder(t, 16, 3, 100e9)
    diameter, apl = path_length_stats(plan.topology)
    g = plan.topology.simple_graph()
    assert diameter == nx.diameter(g)
    assert apl == pytest.approx(nx.average_shortest_path_length(g))
    mt = topology_metrics(plan.topology, t, plan.rings, plan.routes)
    # tax = carried / logical >= 1, and equals the bytes-weighted hop count
    assert mt.bandwidth_tax >= 1.0
    assert mt.link_load.sum() == pytest.approx(mt.bandwidth_tax * t.matrix(plan.rings).sum())
    assert mt.mp_hops >= 1.0
