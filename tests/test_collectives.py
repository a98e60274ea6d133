"""TEN patterns: semantic check at n = 2..33, corruption caught, NCCL trees, JSON form."""

import json

import networkx as nx
import numpy as np
import pytest

from topoopt.collectives import (
    Pattern,
    PatternError,
    build_pattern,
    check_pattern,
    double_binary_tree_allreduce,
    flow_dependencies,
    multi_ring_allreduce,
    nccl_btree,
    nccl_dtree,
    pattern_from_json,
    pattern_to_json,
    recursive_doubling_allgather,
    ring_allreduce,
    semantic_ok,
)
from topoopt.errors import ConfigError

SIZES = range(2, 34)


def all_patterns(n, seed=0):
    rng = np.random.default_rng([seed, n])
    yield ring_allreduce(rng.permutation(n), size=4 * n * 3)
    yield double_binary_tree_allreduce(n, size=4 * 2 * 5)
    yield recursive_doubling_allgather(n, size=4 * n * 2)
    yield multi_ring_allreduce([rng.permutation(n), np.arange(n), rng.permutation(n)],
                               size=4 * n * 3 * 2, weights=[1, 2, 1])


@pytest.mark.parametrize("n", SIZES)
def test_every_pattern_passes_the_check(n):
    for p in all_patterns(n):
        check_pattern(p)


def corruptions(p: Pattern):
    """Ways to break a pattern that each must be caught."""
    e = p.edges_count // 2
    moved = (p.dst.copy(), p.src.copy())
    moved[0][e] = next((r for r in range(p.ranks) if r not in (p.dst[e], p.src[e])),
                       p.src[e])                           # n = 2: a self-loop
    yield "redirect", p.replace(dst=moved[0])
    keep = np.arange(p.edges_count) != e
    yield "drop", Pattern.from_edges(
        p.name, p.collective, p.ranks, p.segments,
        [(p.step[i], p.src[i], p.dst[i], p.chunk[i], p.edge_segments(i), p.reduce[i],
          p.phase[i]) for i in np.flatnonzero(keep)],
        itemsize=p.itemsize, owners=p.owners, phase_names=p.phase_names)
    if p.reduce.any():
        r = np.flatnonzero(p.reduce)[0]
        flipped = p.reduce.copy()
        flipped[r] = False
        yield "copy instead of reduce", Pattern(**{**p.__dict__, "reduce": flipped,
                                                   "_cache": {}})
    else:
        late = np.flatnonzero(p.step == p.steps - 1)[0]
        segs = p.seg_idx.copy()
        segs[p.seg_ptr[late]] = (segs[p.seg_ptr[late]] + 1) % len(p.segments)
        yield "wrong segment", p.replace(seg_idx=segs)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 16, 33])
def test_corrupted_patterns_fail(n):
    for p in all_patterns(n):
        for what, bad in corruptions(p):
            assert not semantic_ok(bad), (p.name, n, what)
            with pytest.raises(PatternError):
                check_pattern(bad)


def test_double_counting_is_caught():
    # the tree's reduce up to the root, sent twice: a sum would count it twice
    p = double_binary_tree_allreduce(4, size=64)
    e = int(np.flatnonzero(p.reduce)[-1])
    extra = (p.step[e] + 1, p.src[e], p.dst[e], p.chunk[e], p.edge_segments(e), True, 0)
    rows = [(p.step[i], p.src[i], p.dst[i], p.chunk[i], p.edge_segments(i), p.reduce[i],
             p.phase[i]) for i in range(p.edges_count)]
    twice = Pattern.from_edges("x", "allreduce", 4, p.segments, rows + [extra],
                               phase_names=p.phase_names)
    with pytest.raises(PatternError, match="counted twice"):
        check_pattern(twice)


# Parent maps read off the diagrams in the comments of NCCL's src/graph/trees.cc.
BTREE_14 = {8: 0, 4: 8, 12: 8, 2: 4, 6: 4, 10: 12, 13: 12, 1: 2, 3: 2, 5: 6, 7: 6,
            9: 10, 11: 10}
DTREE_12 = ({8: 0, 4: 8, 10: 8, 2: 4, 6: 4, 1: 2, 3: 2, 5: 6, 7: 6, 9: 10, 11: 10},
            {3: 11, 1: 3, 7: 3, 0: 1, 2: 1, 5: 7, 9: 7, 4: 5, 6: 5, 8: 9, 10: 9})
DTREE_13 = ({8: 0, 4: 8, 12: 8, 2: 4, 6: 4, 10: 12, 1: 2, 3: 2, 5: 6, 7: 6, 9: 10,
             11: 10},
            {9: 1, 5: 9, 0: 9, 3: 5, 7: 5, 11: 0, 2: 3, 4: 3, 6: 7, 8: 7, 10: 11, 12: 11})


def as_map(parent):
    return {r: int(p) for r, p in enumerate(parent) if p >= 0}


def test_nccl_trees_match_the_source_diagrams():
    assert as_map(nccl_btree(14)) == BTREE_14
    for n, (t0, t1) in ((12, DTREE_12), (13, DTREE_13)):
        p0, p1 = nccl_dtree(n)
        assert as_map(p0) == t0 and as_map(p1) == t1
    p0, p1 = nccl_dtree(14)                  # even: tree 1 mirrors tree 0
    assert as_map(p0) == BTREE_14
    assert as_map(p1) == {13 - r: 13 - p for r, p in BTREE_14.items()}


@pytest.mark.parametrize("n", SIZES)
def test_dtree_is_two_spanning_trees(n):
    for parent in nccl_dtree(n):
        g = nx.DiGraph([(int(p), r) for r, p in enumerate(parent) if p >= 0])
        g.add_nodes_from(range(n))
        assert nx.is_arborescence(g)
        leaves = {r for r in range(n) if g.out_degree(r) == 0}
        assert all(len(list(g.successors(r))) <= 2 for r in range(n))
        assert leaves
    # NCCL's intent: leaves of tree 0 are odd; tree 1's are even (mirror) or shifted
    p0, p1 = nccl_dtree(n)
    internal0 = set(p0[p0 >= 0].tolist())
    assert all(r % 2 == 0 for r in internal0)


def test_sixteen_rank_tree_is_react_fig1():
    p = double_binary_tree_allreduce(16, size=2_000_000)
    assert p.steps == 8 and p.phase_names == ("reduce", "broadcast")
    up1 = {(int(s), int(d)) for s, d, c, r in zip(p.src, p.dst, p.chunk, p.reduce)
           if c == 1 and r}
    assert {(1, 3), (5, 3), (3, 7), (11, 7), (7, 15)} <= up1      # even-leaf tree, root 15
    assert all(p.nbytes == 1_000_000)


def test_byte_counts_match_closed_forms():
    n, S = 8, 8 * 4096
    ring = ring_allreduce(range(n), size=S)
    assert ring.steps == 2 * (n - 1) and set(ring.nbytes.tolist()) == {S // n}
    rd = recursive_doubling_allgather(n, size=S)
    per_rank = np.bincount(rd.dst, weights=rd.nbytes, minlength=n)
    assert np.all(per_rank == (n - 1) * S // n)                       # each rank gets n-1 pieces
    assert [int(rd.nbytes[rd.step == s][0]) for s in range(3)] == [S // 8, S // 4, S // 2]
    rd6 = recursive_doubling_allgather(6, size=6 * 400)
    assert rd6.steps == 2 + 2                                        # log2(4) + pre + post


def test_multi_ring_has_one_chunk_per_ring_and_weights():
    p = multi_ring_allreduce([[0, 1, 2, 3], [0, 2, 1, 3]], size=4 * 300, weights=[2, 1])
    assert p.chunks == 2
    per_chunk = np.bincount(p.chunk, weights=p.nbytes)
    assert per_chunk[0] == pytest.approx(2 * per_chunk[1], rel=0.02)


def test_dependencies_follow_each_ranks_step_order():
    p = ring_allreduce(range(4), size=64)
    ptr, idx = flow_dependencies(p)
    assert ptr[1] == 0                                               # step 0: nothing to wait for
    for e in np.flatnonzero(p.step > 0):
        deps = idx[ptr[e]:ptr[e + 1]]
        assert all(p.step[d] < p.step[e] and p.chunk[d] == p.chunk[e] for d in deps)
        assert any(p.dst[d] == p.src[e] and p.step[d] == p.step[e] - 1 for d in deps)


def test_json_round_trip_and_refusals():
    for p in all_patterns(6):
        doc = json.loads(json.dumps(pattern_to_json(p)))
        q = pattern_from_json(doc)
        assert q.signature() == p.signature() and np.all(q.nbytes == p.nbytes)
        assert doc["edges"][0]["op"] in ("reduce", "copy")
    doc = pattern_to_json(ring_allreduce(range(3), size=48))
    doc["edges"][0]["dst"] = doc["edges"][0]["src"]
    with pytest.raises(PatternError):
        pattern_from_json(doc)
    with pytest.raises(PatternError):
        pattern_from_json("{not json")
    with pytest.raises(PatternError):
        pattern_from_json({"format": "other"})


def test_bad_inputs_are_refused():
    with pytest.raises(ConfigError):
        build_pattern("tree", 1)
    with pytest.raises(ConfigError):
        build_pattern("mesh", 4)
    with pytest.raises(ConfigError):
        ring_allreduce([0, 1, 1])
    with pytest.raises(ConfigError):
        ring_allreduce(range(8), size=8)                           # 2 elements for 8 segments
