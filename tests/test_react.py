"""REACT: §4.3 numbers, detection, safe transforms, critical paths, estimator, the loop."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topoopt.collectives import (
    build_pattern,
    check_pattern,
    double_binary_tree_allreduce,
    multi_ring_allreduce,
    recursive_doubling_allgather,
    ring_allreduce,
)
from topoopt.errors import ConfigError
from topoopt.react.analytical import alpha_beta_time, dual_tree_example_time, max_min_rates
from topoopt.react.critical import critical_paths
from topoopt.react.detection import detect_congestion
from topoopt.react.execution import BatchResult, StarFluidExecutor
from topoopt.react.fct_model import FctHistory, estimate_fcts
from topoopt.react.loop import ReactParams, leader_init, leader_step, run_react
from topoopt.react.transforms import (
    PositionSpace,
    Swap,
    apply_swap,
    candidate_swaps,
    position_classes,
)

US = 1e-6


# ---------------------------------------------------------------- §4.3 analytical model
def test_section_4_3_numbers():
    p = double_binary_tree_allreduce(16, size=2e6)
    clean = alpha_beta_time(p, 4 * US, 100e9)
    congested = alpha_beta_time(p, 4 * US, 100e9, congest={3: 2})
    swapped = alpha_beta_time(apply_swap(p, Swap("chunk", 3, 2, chunk=1)), 4 * US, 100e9,
                              congest={3: 2})
    assert clean.phase_end[0] == pytest.approx(576 * US)
    assert congested.phase_end[0] == pytest.approx(656 * US)
    assert swapped.phase_end[0] == pytest.approx(576 * US)


@pytest.mark.parametrize("alpha", [0.0, 1 * US, 4 * US, 20 * US])
@pytest.mark.parametrize("bandwidth", [25e9, 100e9, 400e9])
@pytest.mark.parametrize("size", [1e5, 2e6, 64e6])
def test_section_4_3_general_formula(alpha, bandwidth, size):
    p = double_binary_tree_allreduce(16, size=size)
    for extra in range(0, 6):
        got = alpha_beta_time(p, alpha, bandwidth, congest={3: extra}).phase_end[0]
        assert got == pytest.approx(dual_tree_example_time(alpha, bandwidth, size, extra),
                                    rel=1e-9)
    beta_s = size * 8 / bandwidth
    assert dual_tree_example_time(alpha, bandwidth, size, 0) == pytest.approx(
        4 * alpha + 3.5 * beta_s)
    assert dual_tree_example_time(alpha, bandwidth, size, 4) == pytest.approx(
        4 * alpha + (3 + 4 / 2) * beta_s)


def test_ring_on_a_switch_is_the_closed_form():
    n, S = 8, 8e6
    r = alpha_beta_time(ring_allreduce(np.random.default_rng(1).permutation(n), size=S),
                        US, 100e9)
    assert r.makespan == pytest.approx(2 * (n - 1) / n * S * 8 / 100e9 + 2 * (n - 1) * US)


def test_max_min_textbook():
    # two flows share resource 0 (cap 2); flow 0 is also on resource 1 (cap 0.5)
    rates = max_min_rates(np.array([[0, 1], [0, 2]]), np.array([2.0, 0.5, 9.0]),
                          np.array([0, 0, 0]))
    assert rates.tolist() == pytest.approx([0.5, 1.5])
    # one external flow on resource 2 takes an equal share with flow 1
    rates = max_min_rates(np.array([[0, 2], [1, 2]]), np.array([9.0, 9.0, 3.0]),
                          np.array([0, 0, 1]))
    assert rates.tolist() == pytest.approx([1.0, 1.0])


# ---------------------------------------------------------------- detection
def test_detection_flags_steady_congestion_and_not_a_clean_flow():
    p = double_binary_tree_allreduce(8, size=20e6)
    clean = StarFluidExecutor(noise=0.03, seed=1).run(p, 6)
    assert not detect_congestion(p, clean.fct).congested.any()
    hot = StarFluidExecutor(ext_in={3: 2}, noise=0.03, seed=1).run(p, 6)
    c = detect_congestion(p, hot.fct)
    into3 = p.dst == 3
    assert c.steady[into3].all()
    assert not c.steady[(p.src != 3) & (p.dst != 3)].any()
    assert not c.erratic.any()


def test_detection_flags_erratic_flows():
    p = ring_allreduce(range(4), size=4096)
    fct = np.full((6, p.edges_count), 1e-3)
    fct[[1, 4], 5] = 3e-3                        # slow in two epochs of six only
    c = detect_congestion(p, fct)
    assert c.erratic[5] and c.erratic.sum() == 1 and not c.steady[5]


# ---------------------------------------------------------------- transforms
def test_fig1_viable_swaps_for_congested_node_3():
    p = double_binary_tree_allreduce(16, size=2e6)
    groups = candidate_swaps(p, PositionSpace.of(p), 3, incoming=True, outgoing=False)
    green_chunk = {s.b for s, _ in groups[1] if s.chunk == 1}
    viable = {s.b for g in groups for s, _ in g if s.kind == "chunk" and s.chunk == 1}
    assert 2 in green_chunk                       # the paper's pick
    assert not viable & {4, 12}                   # red: would receive 4 flows at once
    assert {1, 5, 9, 13} <= viable - green_chunk  # yellow: still 2 incoming flows


def test_position_classes_match_the_structure():
    tree = double_binary_tree_allreduce(8, size=64)
    classes = position_classes(tree)
    leaves = {(a, b) for a in (1, 3, 5, 7) for b in (1, 3, 5, 7) if a < b}
    assert classes[(0, 0)] == leaves              # tree 0's leaves are interchangeable
    rd = recursive_doubling_allgather(8, size=8 * 64)
    classes_rd = position_classes(rd)
    halves = {(a, b) for a in range(8) for b in range(a + 1, 8) if (a < 4) == (b < 4)}
    assert classes_rd[(0, 3)] == halves           # Fig. 9b: two swappable sets at the end
    assert classes_rd[(0, 2)] == {(a, a + 1) for a in range(0, 8, 2)}  # same pair block


@st.composite
def pattern_and_swaps(draw):
    kind = draw(st.sampled_from(["tree", "ring", "rd-allgather", "multi-ring"]))
    n = draw(st.integers(2, 12))
    if kind == "multi-ring":
        perms = draw(st.lists(st.permutations(list(range(n))), min_size=1, max_size=3))
        p = multi_ring_allreduce(perms, size=4 * n * len(perms) * 2)
    else:
        p = build_pattern(kind, n, size=4 * n * 4)
    picks = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 10 ** 6)),
                          min_size=1, max_size=5))
    return p, picks


@settings(max_examples=25, deadline=None)
@given(pattern_and_swaps())
def test_no_offered_transform_breaks_semantics(case):
    p, picks = case
    space = PositionSpace.of(p)
    for node, choice in picks:
        groups = candidate_swaps(p, space, node)
        offered = [x for g in groups for x in g]
        for swap, q in offered:
            check_pattern(q)
        if offered:
            swap, p = offered[choice % len(offered)]
            space = space.after(swap)
    check_pattern(p)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["tree", "ring", "multi-ring"]), st.integers(2, 12),
       st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11), st.integers(0, 3)),
                max_size=8))
def test_permutation_swaps_keep_allreduce_correct(kind, n, swaps):
    p = (multi_ring_allreduce([list(range(n)), list(range(n))[::-1]], size=4 * n * 4)
         if kind == "multi-ring" else build_pattern(kind, n, size=4 * n * 4))
    for a, b, c in swaps:
        a, b = a % n, b % n
        if a == b:
            continue
        p = apply_swap(p, Swap("global", a, b) if c == 3 else
                       Swap("chunk", a, b, chunk=c % p.chunks))
        check_pattern(p)


def test_global_swap_of_rd_allgather_relabels_owned_segments():
    p = recursive_doubling_allgather(8, size=8 * 64)
    q = apply_swap(p, Swap("global", 0, 5))
    check_pattern(q)
    assert q.edge_segments(int(np.flatnonzero((q.src == 5) & (q.step == 0))[0])) == (5,)


# ---------------------------------------------------------------- critical paths
def test_critical_path_matches_networkx_longest_path():
    rng = np.random.default_rng(3)
    p = double_binary_tree_allreduce(10, size=4096)
    w = rng.uniform(1, 5, size=(3, p.edges_count))
    paths, lengths = critical_paths(p, w)
    for i in range(3):
        best = 0.0
        for c in range(p.chunks):
            g = nx.DiGraph()
            for t in range(p.steps):
                for r in range(p.ranks):
                    g.add_edge((t, r), (t + 1, r), weight=0.0)
            for e in np.flatnonzero(p.chunk == c):
                g.add_edge((p.step[e], p.src[e]), (p.step[e] + 1, p.dst[e]), weight=w[i, e])
            best = max(best, nx.dag_longest_path_length(g))
        assert lengths[i] == pytest.approx(best)
        assert w[i, paths[i]].sum() == pytest.approx(best)
        assert np.all(np.diff(p.step[paths[i]]) >= 1)


# ---------------------------------------------------------------- estimator
def test_estimator_scales_seen_pairs_and_uses_median_for_unseen():
    p = ring_allreduce(range(4), size=4 * 4 * 1000)
    fct = np.full((6, p.edges_count), 1e-3)
    fct[:, p.src == 2] = 2e-3                     # 2's uplink slow
    h = FctHistory.empty().add(p, fct, 0, 60)
    est = estimate_fcts(h, p)
    assert est[p.src == 2] == pytest.approx(2e-3) and est[p.src != 2] == pytest.approx(1e-3)
    q = apply_swap(p, Swap("global", 1, 3))       # pairs 0->3, 3->2, 2->1, 1->0 unseen
    est_q = estimate_fcts(h, q)
    assert est_q[q.src == 2] == pytest.approx(2e-3)   # endpoint evidence: 2 is slow
    assert est_q[q.src == 1] == pytest.approx(1e-3)   # 1->0: median of degree-1 flows
    # 0->3: 3 only ever received from slow 2, so it may be slow too (pessimistic)
    assert est_q[q.src == 0] == pytest.approx(2e-3)


def test_estimator_history_forgets_old_epochs():
    p = ring_allreduce(range(3), size=48)
    h = FctHistory.empty()
    for b in range(4):
        h = h.add(p, np.ones((6, p.edges_count)), 6 * b, keep=12)
    assert h.epoch.min() == 12 and len(h) == 12 * p.edges_count


# ---------------------------------------------------------------- feedback loop
def test_loop_reverts_a_harmful_swap():
    p = double_binary_tree_allreduce(8, size=20e6)
    state = leader_init(p, ReactParams(seed=1))
    slow = StarFluidExecutor(ext_in={3: 2}).run(p, 6)
    state, d1 = leader_step(state, slow.fct, slow.epoch_time)
    assert d1.swaps and d1.pattern.signature() != p.signature()
    # the next batch (on the new pattern) is observed 20% slower: revert
    worse = StarFluidExecutor(ext_in={3: 2}).run(d1.pattern, 6)
    state, d2 = leader_step(state, worse.fct, slow.epoch_time * 1.2)
    assert d2.reverted
    # back on p, and any new transforms are new ones (the reverted swaps are tabu)
    from topoopt.react.transforms import apply_swaps
    assert apply_swaps(p, d2.swaps).signature() == d2.pattern.signature()
    assert not set(d2.swaps) & set(d1.swaps)
    assert state.tabu and {s for s, _ in state.tabu} == set(d1.swaps)


def test_loop_keeps_a_good_swap_and_is_pure():
    p = double_binary_tree_allreduce(8, size=20e6)
    state = leader_init(p, ReactParams(seed=1))
    slow = StarFluidExecutor(ext_in={3: 2}).run(p, 6)
    s1, d1 = leader_step(state, slow.fct, slow.epoch_time)
    again, d_again = leader_step(state, slow.fct, slow.epoch_time)
    assert d_again.pattern.signature() == d1.pattern.signature()   # same inputs, same output
    assert state.pattern is p and state.pending is None            # inputs untouched
    better = StarFluidExecutor(ext_in={3: 2}).run(d1.pattern, 6)
    s2, d2 = leader_step(s1, better.fct, better.epoch_time)
    assert d2.kept and not d2.reverted
    assert better.epoch_time.mean() < slow.epoch_time.mean() / 1.05


def test_loop_alleviates_congestion_and_leaves_a_clean_network_alone():
    p = double_binary_tree_allreduce(8, size=20e6)
    base = run_react(StarFluidExecutor(ext_in={3: 2}, noise=0.02), p, 60, enabled=False)
    tuned = run_react(StarFluidExecutor(ext_in={3: 2}, noise=0.02), p, 60)
    assert tuned.epoch_time[24:].mean() < 0.85 * base.epoch_time[24:].mean()
    check_pattern(tuned.final)
    clean = run_react(StarFluidExecutor(noise=0.02), p, 60)
    assert clean.changes == ()


def test_fake_executor_drives_the_loop():
    """Any executor works: a stub whose flows into rank 2 are 3x slower."""

    class Stub:
        epoch = 0

        def run(self, pattern, epochs):
            fct = np.where(pattern.dst == 2, 3e-3, 1e-3) * np.ones((epochs, 1))
            start = np.zeros_like(fct)
            paths, lengths = critical_paths(pattern, fct)
            self.epoch += epochs
            return BatchResult(start, fct, lengths)

    p = ring_allreduce(range(6), size=6 * 4 * 100)
    run = run_react(Stub(), p, 30, ReactParams(seed=2))
    assert run.epoch_time.shape == (30,)
    check_pattern(run.final)


def test_too_large_patterns_skip_position_classes(monkeypatch):
    from topoopt.react import transforms

    p = double_binary_tree_allreduce(8, size=20e6)
    assert transforms.position_work(p) < transforms.POSITION_WORK_LIMIT
    assert not PositionSpace.of(p).skipped and PositionSpace.of(p).classes
    monkeypatch.setattr(transforms, "POSITION_WORK_LIMIT", transforms.position_work(p) - 1)
    space = PositionSpace.of(p)
    assert space.skipped and space.classes == {}
    assert not PositionSpace.of(p, with_positions=False).skipped
    # the loop still tunes, with chunk and global swaps only, and says so
    done = []
    run = run_react(StarFluidExecutor(ext_in={3: 2}, noise=0.02), p, 30, progress=done.append)
    assert run.positions_skipped and done == [6, 12, 18, 24, 30]
    assert run.changes and all("t" not in s.split("@")[-1]      # no "@c{chunk}t{step}"
                               for _, swaps, _ in run.changes for s in swaps)
    check_pattern(run.final)


def test_params_from_config_table():
    assert ReactParams.from_mapping({"batch": 4, "epsilon": 0.1}).batch == 4
    with pytest.raises(ConfigError):
        ReactParams.from_mapping({"batches": 4})
    with pytest.raises(ConfigError):
        ReactParams(delta1=1.5)
