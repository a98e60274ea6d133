"""pair_hops against scipy's BFS, including graphs of several weak components (pairs
between them are never searched) and long rings (many levels)."""

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from topoopt.finder.hops import pair_hops


def _reference(src, dst, n, s, t, unreachable):
    adj = csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    dist = shortest_path(adj, unweighted=True, directed=True)
    d = dist[s, t]
    return np.where(np.isfinite(d), d, unreachable).astype(np.int64)


@pytest.mark.parametrize("seed", range(12))
def test_random_digraphs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 200))
    m = int(rng.integers(1, 3 * n))
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    k = int(rng.integers(1, 300))
    s, t = rng.integers(0, n, k), rng.integers(0, n, k)
    assert (pair_hops(src, dst, n, s, t, -3) == _reference(src, dst, n, s, t, -3)).all()


@pytest.mark.parametrize("seed", range(6))
def test_rings_of_groups_and_pairs_across_them(seed):
    # the shape of Step 3: one ring per group (the DP rings), pipeline pairs between
    # groups, and a few matched links joining some groups (others stay apart)
    rng = np.random.default_rng(seed)
    groups, size = int(rng.integers(2, 6)), int(rng.integers(20, 150))
    n = groups * size
    src, dst = [], []
    for g in range(groups):
        members = rng.permutation(np.arange(g * size, (g + 1) * size))
        src.append(members)
        dst.append(np.roll(members, -1))
    a = rng.integers(0, n - size, int(rng.integers(0, 6)))
    src, dst = np.concatenate(src + [a, a + size]), np.concatenate(dst + [a + size, a])
    s = np.arange(n - size)
    s, t = np.r_[s, s + size], np.r_[s + size, s]
    assert (pair_hops(src, dst, n, s, t, -1) == _reference(src, dst, n, s, t, -1)).all()


def test_no_links_and_self_pairs():
    s, t = np.array([0, 1, 2]), np.array([0, 2, 1])
    assert pair_hops(np.zeros(0, int), np.zeros(0, int), 3, s, t, -1).tolist() == [0, -1, -1]
