"""Routes as arrays (RouteArrays) and the fast route builders against their references.

The fast paths (``implementation="fast"``, ``k_shortest_route_arrays``, the array LP, the
vectorized checks and metrics) must give the same routes as the tuple-per-path reference
implementations -- or, for the LP, the same optimum -- on random cases.
"""

import pickle
from itertools import islice

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog
from test_topology_finder import make_traffic, random_traffic

from topoopt.errors import PlanCheckError
from topoopt.finder.topology_finder import check_topology_plan, extend_plan, topology_finder
from topoopt.routing.kshortest import (
    equal_cost_path_arrays,
    equal_cost_paths,
    hop_distances,
    k_shortest_paths,
    k_shortest_route_arrays,
    k_shortest_routes,
    neighbour_table,
)
from topoopt.routing.lp import min_max_load_routes
from topoopt.routing.metrics import link_loads, route_traffic, topology_metrics
from topoopt.strategy import hybrid
from topoopt.topology.topology import RouteArrays, Routes, Topology, check_routes
from topoopt.traffic import derive_traffic
from topoopt.workloads import build_model


def random_topology(n, d, seed):
    """d rings through random orders (one port each): a random d-regular digraph."""
    rng = np.random.default_rng(seed)
    links = []
    for port in range(d):
        order = rng.permutation(n).tolist()
        links += [(a, port, order[(i + 1) % n], port) for i, a in enumerate(order)]
    return Topology(n, d, tuple(links), 1e9)


def all_pairs(n):
    return [(s, t) for s in range(n) for t in range(n) if s != t]


def dlrm_traffic(n):
    model = build_model("dlrm", {"tables": n, "rows": 1000})
    return derive_traffic(model, hybrid(model, n), n, n * 4 * 64, 4)


# --- the container ------------------------------------------------------------------------

@st.composite
def route_dicts(draw):
    """Arbitrary (not necessarily valid) route mappings with int node paths."""
    n = draw(st.integers(2, 9))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                          unique=True, max_size=12))
    out = {}
    for s, t in pairs:
        opts = draw(st.lists(st.tuples(st.lists(st.integers(0, n - 1), min_size=1,
                                                max_size=5).map(tuple),
                                       st.floats(0.01, 1.0)), min_size=1, max_size=4))
        out[s, t] = tuple((((s,) + p[1:-1] + (t,)) if len(p) > 1 else (s,), f)
                          for p, f in opts)
    return out


@settings(max_examples=300, deadline=None)
@given(route_dicts(), route_dicts())
def test_route_arrays_round_trip_and_merge(a, b):
    ra, rb = Routes(a), Routes(b)
    arr = ra.arrays()
    fast = Routes.from_arrays(arr)
    assert fast == ra and ra == fast and hash(fast) == hash(ra)
    assert dict(fast.paths.items()) == a and dict(fast.paths) == a
    assert list(fast.paths) == sorted(a) and len(fast) == len(a)
    for pair, opts in a.items():
        assert pair in fast and fast[pair] == opts
    assert (99, 99) not in fast and "x" not in fast.paths
    back = pickle.loads(pickle.dumps(fast))
    assert back == ra and back.arrays() == arr
    assert pickle.loads(pickle.dumps(ra)) == ra
    merged = ra.merge(rb)
    assert merged == Routes({**a, **b})
    assert merged.arrays() == Routes({**a, **b}).arrays()   # spliced as sorted from scratch
    assert Routes.from_arrays(arr).merge(Routes.from_arrays(rb.arrays())) == merged
    # dropping zero fractions keeps the rest in order
    zero = np.where(np.arange(arr.fraction.size) % 2 == 0, 0.0, arr.fraction)
    kept = arr.reweighted(zero)
    want = {p: tuple(o for j, o in enumerate(opts, start=int(arr.path_ptr[i]))
                     if j % 2 == 1)
            for i, (p, opts) in enumerate(sorted(a.items()))}
    assert kept.to_dict() == want


def test_route_arrays_refuse_unsorted_pairs_and_bad_offsets():
    with pytest.raises(ValueError, match="sorted"):
        RouteArrays([1, 0], [0, 1], [0, 1, 2], [0, 2, 4], [1, 0, 0, 1], [1.0, 1.0])
    with pytest.raises(ValueError, match="inconsistent"):
        RouteArrays([0], [1], [0, 2], [0, 2], [0, 1], [1.0])


# --- k shortest paths ---------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(st.integers(3, 16), st.integers(1, 4), st.integers(0, 10_000), st.integers(1, 5),
       st.integers(1, 50))
def test_equal_cost_path_arrays_equal_the_reference_and_networkx(n, d, seed, k, chunk):
    topo = random_topology(n, d, seed)
    pairs = all_pairs(n)
    src, dst = np.array(pairs).T
    dist, nbr = hop_distances(topo), neighbour_table(topo)
    path_ptr, node_ptr, nodes = equal_cost_path_arrays(nbr, dist, src, dst, k, chunk=chunk)
    ref = equal_cost_paths(nbr, dist, src, dst, k)
    g = topo.simple_graph()
    for i, (s, t) in enumerate(pairs):
        got = [tuple(nodes[node_ptr[j]:node_ptr[j + 1]].tolist())
               for j in range(path_ptr[i], path_ptr[i + 1])]
        assert got == ref[s, t]
        # the first k shortest paths in lexicographic order (independent reference)
        assert got == sorted(map(tuple, nx.all_shortest_paths(g, s, t)))[:k]


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 12), st.integers(1, 3), st.integers(0, 10_000), st.integers(1, 4),
       st.sampled_from([0, 1, None]))
def test_k_shortest_route_arrays_equal_the_tuple_routes(n, d, seed, k, extra):
    topo = random_topology(n, d, seed)
    pairs = all_pairs(n)
    rng = np.random.default_rng(seed)
    pairs = [pairs[i] for i in rng.permutation(len(pairs))[:max(1, len(pairs) // 2)]]
    fast = k_shortest_route_arrays(topo, [p[0] for p in pairs], [p[1] for p in pairs], k,
                                   extra)
    assert fast.to_dict() == k_shortest_routes(topo, pairs, k, extra)
    if extra is None:  # all k: the lengths of networkx's k shortest simple paths
        g = topo.simple_graph()
        for s, t in pairs[:5]:
            ref = islice(nx.shortest_simple_paths(g, s, t), k)
            assert [len(p) for p, _ in Routes(fast)[s, t]] == [len(p) for p in ref]


# --- the finder ---------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(random_traffic(), st.integers(1, 4), st.sampled_from([0, 1, None]))
def test_finder_fast_equals_reference(case, k, extra):
    traffic, d, seed = case
    n = traffic.servers
    kw = dict(k_paths=k, max_extra_hops=extra, seed=seed % 1000)
    fast = topology_finder(traffic, n, d, 100e9, **kw)
    ref = topology_finder(traffic, n, d, 100e9, implementation="reference", **kw)
    assert fast == ref
    assert fast.routes == ref.routes and dict(fast.routes.paths.items()) == \
        dict(ref.routes.paths.items())
    check_topology_plan(fast, traffic)


@pytest.mark.parametrize("d", [4, 8])
def test_finder_fast_equals_reference_on_dlrm(d):
    traffic = dlrm_traffic(48)
    fast = topology_finder(traffic, 48, d, 100e9)
    ref = topology_finder(traffic, 48, d, 100e9, implementation="reference")
    assert fast == ref and len(fast.routes) >= 48 * 47
    a = topology_metrics(fast.topology, traffic, fast.rings, fast.routes)
    b = topology_metrics(ref.topology, traffic, ref.rings, ref.routes)
    assert (a.bandwidth_tax, a.mp_hops) == (b.bandwidth_tax, b.mp_hops)
    assert np.array_equal(a.link_load, b.link_load)


def test_finder_refuses_unknown_implementation():
    traffic = dlrm_traffic(8)
    with pytest.raises(ValueError, match="implementation"):
        topology_finder(traffic, 8, 2, 100e9, implementation="numba")


# --- the LP -------------------------------------------------------------------------------

def highs_min_max_load(topo, demand, cands, background):
    """The first LP, formulated independently and solved by HiGHS (scipy)."""
    pairs = sorted(demand)
    hops = sorted({(a, b) for a, _, b, _ in topo.links})
    row = {h: i for i, h in enumerate(hops)}
    mult = np.zeros(len(hops))
    for a, _, b, _ in topo.links:
        mult[row[a, b]] += 1
    cols = [(p, path) for p in pairs for path in cands[p]]
    a_ub = np.zeros((len(hops), len(cols) + 1))
    a_eq = np.zeros((len(pairs), len(cols) + 1))
    for j, (p, path) in enumerate(cols):
        for h in zip(path, path[1:]):
            a_ub[row[h], j] += demand[p]
        a_eq[pairs.index(p), j] = 1.0
    used = a_ub[:, :-1].any(axis=1)  # links no candidate uses do not bound U
    a_ub[:, -1] = -mult
    b_ub = -np.array([background.get(h, 0.0) for h in hops])
    res = linprog(np.r_[np.zeros(len(cols)), 1.0], A_ub=a_ub[used], b_ub=b_ub[used],
                  A_eq=a_eq, b_eq=np.ones(len(pairs)), bounds=(0, None), method="highs")
    assert res.status == 0
    return res.fun


def loads(topo, demand, routes, background):
    mult = {}
    for a, _, b, _ in topo.links:
        mult[a, b] = mult.get((a, b), 0) + 1
    load = {h: background.get(h, 0.0) for h in mult}
    tax = 0.0
    for p, opts in routes.items():
        for path, f in opts:
            tax += demand[p] * f * (len(path) - 1)
            for h in zip(path, path[1:]):
                load[h] += demand[p] * f
    return max(load[h] / mult[h] for h in load), tax


@settings(max_examples=15, deadline=None)
@given(st.integers(5, 14), st.integers(2, 3), st.integers(0, 10_000), st.booleans())
def test_lp_fast_has_the_reference_optimum(n, d, seed, with_background):
    topo = random_topology(n, d, seed)
    rng = np.random.default_rng(seed)
    pairs = [p for p in all_pairs(n) if rng.random() < 0.6] or [(0, 1)]
    demand = {p: float(rng.uniform(1, 10)) for p in pairs}
    demand[pairs[0]] = 0.0  # a pair without demand is left out
    background = {(a, b): float(rng.uniform(0, 20)) for a, _, b, _ in topo.links[:n]} \
        if with_background else {}
    dist, nbr = hop_distances(topo), neighbour_table(topo)
    cands = {p: k_shortest_paths(nbr, dist, p[0], p[1], 4, 2) for p in demand}
    fast, best = min_max_load_routes(topo, demand, cands, background)
    ref, ref_best = min_max_load_routes(topo, demand, cands, background, method="reference")
    assert best == pytest.approx(ref_best, rel=1e-6)
    live = {p: v for p, v in demand.items() if v > 0}
    assert best == pytest.approx(highs_min_max_load(topo, live, cands, background), rel=1e-6)
    assert set(fast) == set(ref) == set(live)
    check_routes(topo, Routes(fast))
    fast_max, fast_tax = loads(topo, demand, fast, background)
    ref_max, ref_tax = loads(topo, demand, ref, background)
    assert fast_max <= best * (1 + 2e-6) + 1e-9
    assert ref_max <= ref_best * (1 + 2e-6) + 1e-9
    assert fast_tax == pytest.approx(ref_tax, rel=1e-6)  # the same tie-break optimum


def test_lp_rejects_paths_off_the_topology():
    topo = random_topology(6, 1, 0)
    with pytest.raises(ValueError, match="not a link"):
        min_max_load_routes(topo, {(0, 1): 1.0}, {(0, 1): [(0, 1)] if (0, 1) not in
                                                  {(a, b) for a, _, b, _ in topo.links}
                                                  else [(0, 2, 1)]})
    with pytest.raises(ValueError, match="no candidate"):
        min_max_load_routes(topo, {(0, 1): 1.0}, {(0, 1): []})


def test_finder_lp_fast_matches_reference():
    traffic = dlrm_traffic(16)
    fast = topology_finder(traffic, 16, 3, 100e9, routing="lp")
    ref = topology_finder(traffic, 16, 3, 100e9, routing="lp", implementation="reference")
    assert fast.topology == ref.topology and fast.rings == ref.rings
    assert fast.mp_max_load == pytest.approx(ref.mp_max_load, rel=1e-6)
    assert set(fast.routes.paths) == set(ref.routes.paths)
    check_topology_plan(fast, traffic)


# --- checks and metrics against the per-pair loops ---------------------------------------

def loop_check_routes(topology, routes, tol=1e-9):
    """The per-pair checker (what check_routes was before vectorizing; it now runs only
    to name a violation the vectorized check found): the reference."""
    from topoopt.topology.topology import _check_routes_by_pair

    _check_routes_by_pair(topology, routes, tol)


def outcome(check, topo, routes):
    try:
        check(topo, routes)
    except PlanCheckError as e:
        return str(e)
    return None


@settings(max_examples=60, deadline=None)
@given(st.integers(4, 10), st.integers(1, 3), st.integers(0, 10_000),
       st.sampled_from(["none", "endpoint", "repeat", "nolink", "fraction", "sum", "empty",
                        "outside"]))
def test_check_routes_agrees_with_the_loop(n, d, seed, corrupt):
    topo = random_topology(n, d, seed)
    rng = np.random.default_rng(seed)
    pairs = all_pairs(n)
    paths = k_shortest_routes(topo, [pairs[i] for i in rng.permutation(len(pairs))[:8]], 3,
                              None)
    pair = sorted(paths)[int(rng.integers(len(paths)))]
    opts = [list(o) for o in paths[pair]]
    path = list(opts[0][0])
    if corrupt == "endpoint":
        opts[0][0] = tuple(path[:-1]) if len(path) > 2 else (path[0], path[0])
    elif corrupt == "repeat":
        opts[0][0] = tuple(path[:1] + path)
    elif corrupt == "nolink":
        missing = [v for v in range(n) if v != pair[0] and not any(
            a == pair[0] and b == v for a, _, b, _ in topo.links)]
        opts[0][0] = (pair[0], missing[0], pair[1]) if missing and missing[0] != pair[1] \
            else (pair[0], n + 3, pair[1])
    elif corrupt == "fraction":
        opts[0][1] = 0.0
    elif corrupt == "sum":
        opts[0][1] += 0.01
    elif corrupt == "empty":
        opts = []
    elif corrupt == "outside":
        opts[0][0] = (pair[0], -1, pair[1])
    bad = dict(paths)
    bad[pair] = tuple(tuple(o) for o in opts)
    for routes in (Routes(bad), Routes.from_arrays(Routes(bad).arrays())) if opts else \
            (Routes(bad),):
        want = outcome(loop_check_routes, topo, routes)
        assert outcome(check_routes, topo, routes) == want
        assert (want is None) == (corrupt == "none")


def loop_link_loads(topology, matrix, routes):
    n = topology.servers
    pair_load = np.zeros((n, n))
    for u, v in zip(*np.nonzero(matrix)):
        nbytes = float(matrix[u, v])
        if (int(u), int(v)) in routes:
            for path, frac in routes[int(u), int(v)]:
                p = np.asarray(path)
                np.add.at(pair_load, (p[:-1], p[1:]), nbytes * frac)
        else:
            pair_load[u, v] += nbytes
    links = np.array([(a, b) for a, _, b, _ in topology.links])
    mult = np.zeros((n, n))
    np.add.at(mult, (links[:, 0], links[:, 1]), 1.0)
    return pair_load[links[:, 0], links[:, 1]] / mult[links[:, 0], links[:, 1]]


def loop_mp_hops(traffic, routes):
    carried = 0.0
    for u, v in zip(*np.nonzero(traffic.mp)):
        pair = (int(u), int(v))
        hops = sum(f * (len(p) - 1) for p, f in routes[pair]) if pair in routes else 1.0
        carried += traffic.mp[u, v] * hops
    return carried / traffic.mp_bytes if traffic.mp_bytes > 0 else 0.0


@settings(max_examples=30, deadline=None)
@given(random_traffic())
def test_metrics_are_the_loops_floats(case):
    traffic, d, seed = case
    n = traffic.servers
    plan = topology_finder(traffic, n, d, 100e9, seed=seed % 1000)
    matrix = traffic.matrix(plan.rings)
    for routes in (plan.routes, Routes(dict(plan.routes.paths.items()))):
        assert np.array_equal(link_loads(plan.topology, matrix, routes),
                              loop_link_loads(plan.topology, matrix, routes))
        m = topology_metrics(plan.topology, traffic, plan.rings, routes)
        assert m.mp_hops == loop_mp_hops(traffic, routes)


@settings(max_examples=30, deadline=None)
@given(random_traffic(), st.integers(1, 3))
def test_route_traffic_and_extend_plan(case, k):
    traffic, d, seed = case
    n = traffic.servers
    topo = random_topology(n, d, seed) if n > 2 else \
        Topology(2, 1, ((0, 0, 1, 0), (1, 0, 0, 0)), 1e9)
    routes = route_traffic(topo, traffic, None, k)
    # reference: k-shortest tuple routes for MP pairs and ring hops that are not links,
    # ring bytes of a pair that is a link staying on the link
    matrix = traffic.matrix(None)
    direct = {(a, b) for a, _, b, _ in topo.links}
    need = {(int(u), int(v)) for u, v in zip(*np.nonzero(traffic.mp))}
    need |= {(int(u), int(v)) for u, v in zip(*np.nonzero(matrix)) if (u, v) not in direct}
    want = {}
    for pair, opts in k_shortest_routes(topo, need, k).items():
        ring = matrix[pair] - traffic.mp[pair]
        if pair in direct and ring > 0:
            agg = {p: f * traffic.mp[pair] for p, f in opts}
            agg[pair] = agg.get(pair, 0.0) + ring
            total = sum(agg.values())
            opts = tuple((p, b / total) for p, b in sorted(agg.items()))
        want[pair] = opts
    assert routes == Routes(want)
    # a plan for other traffic, extended: its routes kept, the new pairs routed
    other = make_traffic(n, [], np.where(np.eye(n) > 0, 0.0, 1.0))
    plan = topology_finder(other, n, d, 100e9, k_paths=k)
    ext = extend_plan(plan, traffic)
    check_topology_plan(ext, traffic)
    for pair, opts in plan.routes.paths.items():
        assert ext.routes[pair] == opts


def test_direct_connect_loads_array_routes_like_tuple_routes():
    from topoopt.fabrics import direct_connect

    traffic = dlrm_traffic(24)
    plan = topology_finder(traffic, 24, 4, 100e9)
    tuples = Routes(dict(reversed(list(plan.routes.paths.items()))))  # another order
    for routes in (plan.routes, tuples):
        fabric = direct_connect(plan.topology, routes)
        assert list(fabric.explicit) == list(routes.paths)
        links = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(fabric.src, fabric.dst))}
        for pair, opts in routes.paths.items():
            got = fabric.explicit[pair]
            assert [f for _, f in got] == [f for _, f in opts]
            for (ids, _), (path, _) in zip(got, opts):
                assert ids.dtype == np.int64
                assert ids.tolist() == [links[h] for h in zip(path, path[1:])]
        a, b = 0, 5
        assert sorted(fabric.paths(a, b), key=lambda x: x[1]) == \
            sorted(direct_connect(plan.topology, tuples).paths(a, b), key=lambda x: x[1])


def test_route_nodes_are_int32_and_refused_beyond_it():
    # a plan's largest arrays: server ids as int32, never wrapped silently
    arr = RouteArrays([0], [2], [0, 1], [0, 3], np.array([0, 1, 2], np.int64), [1.0])
    assert arr.nodes.dtype == np.int32 and arr.nodes.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="route nodes"):
        RouteArrays([0], [2], [0, 1], [0, 3], np.array([0, 2**31, 2], np.int64), [1.0])
    ring = Topology(4, 1, tuple((i, 0, (i + 1) % 4, 0) for i in range(4)), 100e9)
    routed = k_shortest_route_arrays(ring, [0, 1], [3, 3], 2)
    assert routed.nodes.dtype == np.int32
    assert routed.entry(0) == (((0, 1, 2, 3), 1.0),)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=6), min_size=1,
                max_size=8))
def test_revisits_agrees_with_a_set_per_path(paths):
    from topoopt.topology._route_kernel import revisits

    nodes = np.array([x for p in paths for x in p], np.int32)
    node_ptr = np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.int64)
    want = any(len(set(p)) != len(p) for p in paths)
    assert revisits(nodes, node_ptr, 7) == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=6), min_size=0,
                max_size=8),
       st.sets(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=30))
def test_unlinked_hop_agrees_with_a_loop_over_hops(paths, links):
    from topoopt.topology._route_kernel import unlinked_hop

    n = 7
    nodes = np.array([x for p in paths for x in p], np.int32)
    node_ptr = np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.int64)
    hops = [(u, v) for p in paths for u, v in zip(p, p[1:])]
    linked = np.zeros(n * n, bool)
    for u, v in links:
        linked[u * n + v] = True
    assert unlinked_hop(nodes, node_ptr, linked, n) == any(h not in links for h in hops)


def test_a_large_side_merged_into_a_small_one_keeps_the_other_sides_routes():
    """``merge`` splices the smaller side into the larger either way round; ``other``
    wins for the pairs both route."""
    big = {(s, t): (((s, t), 1.0),) for s in range(6) for t in range(6) if s != t}
    small = {(0, 1): (((0, 2, 1), 1.0),), (5, 4): (((5, 3, 4), 0.5), ((5, 2, 4), 0.5))}
    for a, b in ((big, small), (small, big)):
        merged = Routes(a).merge(Routes(b))
        assert merged.arrays() == Routes({**a, **b}).arrays()
