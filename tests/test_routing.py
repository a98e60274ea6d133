"""Coin change against brute force, k-shortest paths against networkx, the LP against its bound."""

from itertools import combinations_with_replacement, islice

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sympy.utilities.iterables import multiset_permutations

from topoopt.finder.perms import totient_perms
from topoopt.routing.coin_change import (
    circulant_distances,
    coin_change,
    coin_change_orders,
    coin_change_table,
)
from topoopt.routing.kshortest import (
    equal_cost_paths,
    hop_distances,
    k_shortest_paths,
    k_shortest_routes,
    neighbour_table,
)
from topoopt.routing.lp import min_max_load_routes
from topoopt.topology.topology import Routes, Topology, check_routes


def brute_force_coins(offset, coins, n, limit=12):
    for count in range(limit + 1):
        for combo in combinations_with_replacement(sorted(set(coins)), count):
            if sum(combo) % n == offset % n:
                return count
    return None


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 30), st.data())
def test_coin_change_is_minimal_against_brute_force(n, data):
    cands = totient_perms(n)
    coins = data.draw(st.lists(st.sampled_from(cands), min_size=1, max_size=3, unique=True))
    table = coin_change_table(coins, n)
    for offset in range(n):
        got = coin_change(offset, coins, n, table)
        assert sum(got) % n == offset
        assert set(got) <= set(coins)
        want = brute_force_coins(offset, coins, n, limit=n)
        assert len(got) == want == table[0][offset]


def test_coin_change_known_values():
    assert coin_change(11, [1, 5], 12) == (5, 5, 1)
    assert coin_change(0, [1, 5], 12) == ()
    assert int(circulant_distances([1], 8).max()) == 7  # one ring: diameter n - 1
    with pytest.raises(ValueError):
        coin_change(1, [2], 4)  # 2 does not generate Z_4


def test_coin_orders_are_distinct_simple_paths():
    coins = coin_change(11, [1, 5], 12)
    orders = coin_change_orders(coins, 10)
    assert len(orders) == len(set(orders)) == 3  # 551, 515, 155
    for order in orders:
        sums = np.cumsum(order) % 12
        assert len(set(sums.tolist()) | {0}) == len(order) + 1  # no node visited twice
    assert coin_change_orders((1,) * 50, 4) == [(1,) * 50]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=7), st.integers(1, 40))
def test_coin_orders_are_sympys_multiset_permutations(coins, limit):
    # the largest-first order, then the other distinct orders in lexicographic order
    first = tuple(sorted(coins, reverse=True))
    rest = [tuple(o) for o in multiset_permutations(sorted(coins)) if tuple(o) != first]
    expected = [first] if len(set(coins)) == 1 else ([first] + rest)[:limit]
    assert coin_change_orders(coins, limit) == expected


def random_topology(n, d, seed):
    """d random permutations (no fixed points) as directed links: a random d-regular digraph."""
    rng = np.random.default_rng(seed)
    links = []
    for port in range(d):
        perm = rng.permutation(n)
        order = perm.tolist()
        for i, a in enumerate(order):  # a ring through a random order: no self loops
            b = order[(i + 1) % n]
            links.append((a, port, b, port))
    return Topology(n, d, tuple(links), 1e9)


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 12), st.integers(1, 3), st.integers(0, 10_000), st.integers(1, 5))
def test_k_shortest_lengths_match_networkx(n, d, seed, k):
    topo = random_topology(n, d, seed)
    g = topo.simple_graph()
    dist = hop_distances(topo)
    nbr = neighbour_table(topo)
    for s in range(n):
        for t in range(n):
            if s == t:
                continue
            ours = k_shortest_paths(nbr, dist, s, t, k)
            ref = list(islice(nx.shortest_simple_paths(g, s, t), k))
            assert [len(p) for p in ours] == [len(p) for p in ref]
            assert len(set(ours)) == len(ours)
            for p in ours:
                assert p[0] == s and p[-1] == t and len(set(p)) == len(p)
                assert all(g.has_edge(u, v) for u, v in zip(p, p[1:]))


@settings(max_examples=20, deadline=None)
@given(st.integers(3, 14), st.integers(1, 3), st.integers(0, 10_000), st.integers(1, 4))
def test_equal_cost_paths_are_shortest_paths(n, d, seed, k):
    topo = random_topology(n, d, seed)
    g = topo.simple_graph()
    dist = hop_distances(topo)
    pairs = [(s, t) for s in range(n) for t in range(n) if s != t]
    got = equal_cost_paths(neighbour_table(topo), dist, np.array([p[0] for p in pairs]),
                           np.array([p[1] for p in pairs]), k)
    for s, t in pairs:
        every = {tuple(p) for p in nx.all_shortest_paths(g, s, t)}
        assert len(got[s, t]) == min(k, len(every))
        assert set(got[s, t]) <= every


def test_routes_are_valid_and_networkx_agrees():
    topo = random_topology(10, 2, 3)
    pairs = [(0, 5), (3, 7), (9, 1)]
    for extra in (0, 1, None):
        fast = k_shortest_routes(topo, pairs, 3, extra)
        ref = k_shortest_routes(topo, pairs, 3, extra, method="networkx")
        check_routes(topo, Routes(fast))
        for pair in pairs:
            assert sorted(len(p) for p, _ in fast[pair]) == sorted(len(p) for p, _ in ref[pair])
            assert sum(f for _, f in fast[pair]) == pytest.approx(1.0)


def test_lp_balances_two_parallel_paths():
    # 0 -> 1 -> 3 and 0 -> 2 -> 3: the LP splits evenly, halving the max load
    links = ((0, 0, 1, 0), (1, 0, 3, 0), (0, 1, 2, 0), (2, 0, 3, 1))
    topo = Topology(4, 2, links, 1e9)
    demand = {(0, 3): 10.0}
    cands = {(0, 3): [(0, 1, 3), (0, 2, 3)]}
    routes, max_load = min_max_load_routes(topo, demand, cands)
    assert max_load == pytest.approx(5.0)
    assert sorted(f for _, f in routes[0, 3]) == pytest.approx([0.5, 0.5], rel=1e-5)


def test_lp_never_worse_than_even_split():
    topo = random_topology(12, 3, 7)
    rng = np.random.default_rng(1)
    pairs = [(int(a), int(b)) for a, b in rng.integers(0, 12, size=(40, 2)) if a != b]
    demand = {p: float(rng.uniform(1, 10)) for p in pairs}
    dist, nbr = hop_distances(topo), neighbour_table(topo)
    cands = {p: k_shortest_paths(nbr, dist, p[0], p[1], 4, 2) for p in demand}
    routes, best = min_max_load_routes(topo, demand, cands)
    check_routes(topo, Routes(routes))

    mult = {}
    for a, _, b, _ in topo.links:
        mult[a, b] = mult.get((a, b), 0) + 1

    def max_load(rts):  # bytes per link; parallel links share a server pair's load
        load = {}
        for p, opts in rts.items():
            for path, f in opts:
                for hop in zip(path, path[1:]):
                    load[hop] = load.get(hop, 0.0) + demand[p] * f / mult[hop]
        return max(load.values())

    even = {p: tuple((c, 1 / len(cs)) for c in cs) for p, cs in cands.items()}
    assert max_load(routes) == pytest.approx(best, rel=1e-5)
    assert best <= max_load(even) + 1e-9
