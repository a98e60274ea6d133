"""The lazy core router against dense all-pairs tables: distances, path counts, routes."""

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from topoopt.errors import PlanCheckError
from topoopt.fabrics import Fabric, _router, check_fabric, direct_connect, expander, fat_tree
from topoopt.topology import Routes, Topology

G = 1e9


def _dense(core) -> tuple[np.ndarray, np.ndarray]:
    """All-pairs hops (scipy) and shortest-path counts (sum over in-links, parallel
    links counted apart), by brute force over the whole core graph."""
    c = core.c
    adj = csr_matrix((np.ones(core.u.size), (core.u, core.v)), shape=(c, c))
    D = shortest_path(adj, method="D", unweighted=True)
    sigma = np.eye(c)
    for s in range(c):
        for t in np.argsort(D[s], kind="stable"):
            if t == s or not np.isfinite(D[s, t]):
                continue
            into = np.flatnonzero((core.v == t) & (D[s, core.u] == D[s, t] - 1))
            sigma[s, t] = sigma[s, core.u[into]].sum()
    return D, sigma


def _reference_row(core, D, sigma, s: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """ECMP route of (s, t): links on a shortest path, weight sigma[s,u] sigma[v,t] / sigma[s,t]."""
    on = D[s, core.u] + 1 + D[core.v, t] == D[s, t]
    e = np.flatnonzero(on)
    return core.link_id[e], sigma[s, core.u[e]] * sigma[core.v[e], t] / sigma[s, t]


def _reference_random(core, D, sigma, s: np.ndarray, t: np.ndarray, rng) -> list[list[int]]:
    """The random walk of the dense router, one pair at a time, same draws in the same order."""
    hops = D[s, t].astype(np.int64)
    out_links = [np.flatnonzero(core.u == x) for x in range(core.c)]
    paths = [[] for _ in s]
    cur = s.copy()
    for k in range(int(hops.max()) if hops.size else 0):
        live = np.flatnonzero(k < hops)
        draws = rng.random(live.size)
        for i, r in zip(live, draws):
            cand = out_links[cur[i]]
            head = core.v[cand]
            w = np.where(D[head, t[i]] == D[cur[i], t[i]] - 1, sigma[head, t[i]], 0.0)
            cum = np.cumsum(w)
            e = cand[int((cum < r * cum[-1]).sum())]
            paths[i].append(int(core.link_id[e]))
            cur[i] = core.v[e]
    return paths


def _parallel_direct(n: int, seed: int) -> Fabric:
    """A random strongly connected direct fabric with some parallel links."""
    rng = np.random.default_rng(seed)
    src = list(range(n)) + rng.integers(0, n, 3 * n).tolist()
    dst = [(i + 1) % n for i in range(n)] + rng.integers(0, n, 3 * n).tolist()
    keep = [(a, b) for a, b in zip(src, dst) if a != b]
    keep += keep[:4]                      # parallel copies of the first links
    s, d = np.array(keep).T
    ar = np.arange(n)
    return Fabric("par", n, n, s, d, np.full(s.size, G), np.full(s.size, 1e-6), "direct",
                  "none", G, ar, np.full(n, -1), np.full(n, -1))


def _explicit_ring(n: int) -> Fabric:
    topo = Topology(n, 2, tuple((i, 0, (i + 1) % n, 0) for i in range(n))
                    + tuple((i, 1, (i + 3) % n, 1) for i in range(n)), 100 * G)
    routes = Routes({(0, 4): (((0, 1, 4), 0.25), ((0, 3, 4), 0.75)),
                     (1, 5): (((1, 4, 5), 1.0),)})
    return direct_connect(topo, routes)


def _long_ring(n: int) -> Fabric:
    """A two-way ring with a chord every 40 nodes: a BFS of ~n/4 thin layers, like a
    pipeline's chain of stages."""
    s = [i for i in range(n)] + [(i + 1) % n for i in range(n)] + list(range(0, n, 40))
    d = [(i + 1) % n for i in range(n)] + [i for i in range(n)] + [(i + n // 2) % n
                                                                   for i in range(0, n, 40)]
    s, d = np.array(s), np.array(d)
    ar = np.arange(n)
    return Fabric("long", n, n, s, d, np.full(s.size, G), np.full(s.size, 1e-6), "direct",
                  "none", G, ar, np.full(n, -1), np.full(n, -1))


BUILDS = {
    "fattree": lambda: fat_tree(16, 10 * G),
    "oversub": lambda: fat_tree(20, 10 * G, oversubscription=2),
    "expander": lambda: expander(24, 3, 10 * G, seed=5),
    "parallel": lambda: _parallel_direct(13, 1),
    "explicit": lambda: _explicit_ring(9),
    "long": lambda: _long_ring(150),
}


def _built(name, seed):
    """The fabric, its core router, the dense hop and path-count tables, and a rng."""
    f = BUILDS[name]()
    core = f._core()
    D, sigma = _dense(core)
    return f, core, D, sigma, np.random.default_rng(seed)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_lazy_tables_and_routes_match_dense(name):
    f, core, D, sigma, rng = _built(name, 0)
    n = f.servers
    a = rng.integers(0, n, 60)
    b = rng.integers(0, n, 60)
    r = f.route(a, b)                                 # computes only these pairs' tables
    assert core.from_.size <= np.unique(f.attach[a]).size
    assert core.to.size <= np.unique(f.attach[b]).size
    rows = core.from_.slots(np.arange(core.c))
    cols = core.to.slots(np.arange(core.c))
    np.testing.assert_array_equal(core.from_.dist[rows], D)
    np.testing.assert_array_equal(core.from_.count[rows], sigma)
    np.testing.assert_array_equal(core.to.dist[cols], D.T)
    np.testing.assert_array_equal(core.to.count[cols], sigma.T)
    for i, (x, y) in enumerate(zip(a.tolist(), b.tolist())):
        links, weights = r.row(i)
        s, t = int(core.local[f.attach[x]]), int(core.local[f.attach[y]])
        if x == y:
            assert links.size == 0
            continue
        if (x, y) in f.explicit:
            continue
        ref_links, ref_w = _reference_row(core, D, sigma, s, t)
        up = [f.uplink[x]] if f.uplink[x] >= 0 else []
        down = [f.downlink[y]] if f.downlink[y] >= 0 else []
        np.testing.assert_array_equal(links, np.array(up + ref_links.tolist() + down))
        np.testing.assert_array_equal(weights, np.r_[np.ones(len(up)), ref_w,
                                                     np.ones(len(down))])
    for x, y in [(0, n - 1), (1, n // 2)]:           # enumerate: every shortest path, equal
        paths = f.paths(x, y)
        if (x, y) not in f.explicit and x != y:
            s, t = int(core.local[f.attach[x]]), int(core.local[f.attach[y]])
            assert len(paths) == sigma[s, t]


@pytest.mark.parametrize("thin", [1, 16, 10 ** 12])
@pytest.mark.parametrize("name", ["expander", "fattree", "long"])
def test_thin_and_wide_bfs_layers_give_the_same_tables(name, thin, monkeypatch):
    """Every layer pushed as sparse entries (1), the default switch, or every layer after
    the roots' as a dense product: the brute-force tables, to the bit."""
    monkeypatch.setattr(_router, "_THIN_LAYER", thin)
    f, core, D, sigma, _ = _built(name, 0)
    rows = core.from_.slots(np.arange(core.c))
    np.testing.assert_array_equal(core.from_.dist[rows], D)
    np.testing.assert_array_equal(core.from_.count[rows], sigma)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_random_paths_match_dense_walk(name):
    f, core, D, sigma, rng = _built(name, 1)
    a = f.attach[rng.integers(0, f.servers, 80)]
    b = f.attach[rng.integers(0, f.servers, 80)]
    got = core.random_paths(a, b, np.random.default_rng(7))
    want = _reference_random(core, D, sigma, core.local[a], core.local[b],
                             np.random.default_rng(7))
    for i, path in enumerate(want):
        np.testing.assert_array_equal(got.row(i)[0], path)


def test_check_fabric_finds_one_way_fabric():
    n = 4
    src, dst = np.array([0, 1, 2]), np.array([1, 2, 3])   # a path, not a ring
    ar = np.arange(n)
    f = Fabric("line", n, n, src, dst, np.full(3, G), np.full(3, 1e-6), "direct", "none",
               G, ar, np.full(n, -1), np.full(n, -1))
    with pytest.raises(PlanCheckError, match="not strongly connected"):
        check_fabric(f)
    check_fabric(_parallel_direct(9, 2))


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_paths_on_a_fresh_router_count_the_shortest_paths(name):
    f = BUILDS[name]()
    core = f._core()
    D, sigma = _dense(core)
    for x, y in [(0, f.servers - 1), (2, 1)]:          # before any route: tables start empty
        paths = f.paths(x, y)
        assert sum(w for _, w in paths) == pytest.approx(1.0)
        if (x, y) not in f.explicit:
            s, t = int(core.local[f.attach[x]]), int(core.local[f.attach[y]])
            assert len(paths) == sigma[s, t]
            assert all(len(p) == D[s, t] + (f.uplink[x] >= 0) + (f.downlink[y] >= 0)
                       for p, _ in paths)


def test_explicit_routes_loaded_in_chunks_equal_one_block(monkeypatch):
    # a TopologyFinder shard's explicit routes, loaded a few links at a time: the same
    # store (rows, links, weights) and the same row per pair as in one block
    from topoopt import fabrics
    from topoopt.cluster import Cluster, Job
    from topoopt.planners.alternating import plan_topology, topoopt_fabric
    from topoopt.strategy import hybrid
    from topoopt.workloads import model_of

    job = Job("dlrm", batch_per_gpu=16, size={"tables": 8, "rows": 10_000, "dim": 32,
                                               "bag": 4})
    model = model_of(job)
    cluster = Cluster(servers=16, nics=4, link_bandwidth=100 * G, link_latency=1e-6)
    plan = plan_topology(model, hybrid(model, 16), cluster, job)   # tables MP: routes
    whole = topoopt_fabric(plan)._core()
    monkeypatch.setattr(fabrics._router, "_EXPLICIT_CHUNK", 7)
    chunked = topoopt_fabric(plan)._core()
    assert len(chunked._links) > 5 * len(whole._links)        # many blocks
    for a, b in zip(whole._store(), chunked._store()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(whole.row_of, chunked.row_of)
    np.testing.assert_array_equal(whole.explicit_row, chunked.explicit_row)


def test_the_route_matrix_shares_the_stores_arrays_and_is_counted_once():
    # the store's link ids in 4 bytes are the matrix's indices (scipy copies int64 ones
    # to int32): routes_nbytes, what keeps a topology warm, counts the routes once
    fabric = expander(64, 4, 100 * G)
    src, dst = np.divmod(np.arange(64 * 64), 64)
    fabric.route(src, dst)
    core = fabric._core()
    mat, _ = core.matrix()
    ptr, links, weights = core._store()
    assert links.dtype == np.int32
    assert np.shares_memory(mat.indices, links) and np.shares_memory(mat.data, weights)
    layers = sum(x.dist.nbytes + x.count.nbytes for x in (core.from_, core.to))
    held = (ptr, links, weights, mat.indptr, core.row_of, core.explicit_row)
    assert fabric.routes_nbytes == sum(a.nbytes for a in held) + layers
