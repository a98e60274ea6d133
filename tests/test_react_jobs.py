"""REACT with two jobs (REACT §7.3.3, Figs. 6-7) and the cooperative rules."""

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from topoopt.cli import main
from topoopt.collectives import build_pattern, check_pattern
from topoopt.errors import ConfigError
from topoopt.fabrics import leaf_spine
from topoopt.react.cooperative import CoopParams, coop_init, coop_step, environment_shift
from topoopt.react.execution import StarFluidExecutor
from topoopt.react.flowsim import JobsExecutor
from topoopt.react.jobs import TwoJobScenario, run_jobs, run_two_job_scenario, two_job_setup
from topoopt.react.loop import ReactParams, keeps_pending, leader_init, leader_step


def test_the_alibaba_like_clos():
    f = leaf_spine(48, 3, 15, 100e9)
    assert f.servers == 720 and f.info["oversubscription"] == 5.0
    assert f.links == 2 * (720 + 48 * 3)
    paths = f.paths(0, 719)
    assert len(paths) == 3 and all(len(p) == 4 for p, _ in paths)   # up, ToR-agg-ToR, down
    assert [len(p) for p, _ in f.paths(0, 14)] == [2]                 # same rack


def test_two_job_placements():
    for seed in range(3):
        _, (a, b), _ = two_job_setup(TwoJobScenario(setting="overlap", overlap=3, seed=seed))
        assert len(set(a) & set(b)) == 3 and len(set(a)) == len(set(b)) == 8
        _, (a, b), pats = two_job_setup(TwoJobScenario(setting="network", tors=2, seed=seed))
        assert not set(a) & set(b)                                    # network sharing only
        assert set(a // 15) == set(b // 15) and len(set(a // 15)) == 2
        assert [p.collective for p in pats] == ["allreduce", "allreduce"]
    with pytest.raises(ConfigError, match="tors"):
        TwoJobScenario(setting="network", tors=3)


def test_modes_off_is_the_plain_executor_and_jobs_interfere():
    sc = TwoJobScenario(setting="overlap", overlap=4, epochs=6, warmup=0, seed=1)
    fabric, placements, patterns = two_job_setup(sc)
    run = run_jobs(fabric, placements, patterns, ("off", "off"), 6, seed=1)
    ref = JobsExecutor(fabric, placements, seed=1).run_many(patterns, 6)
    for j in range(2):
        assert np.array_equal(run.epoch_time[j], ref[j].epoch_time)
    alone = JobsExecutor(fabric, placements[:1], seed=1).run_many(patterns[:1], 6)[0]
    assert run.epoch_time[0].mean() > alone.epoch_time.mean() * 1.05   # shared NICs


def test_cooperative_react_helps_both_jobs_that_share_a_server():
    sc = TwoJobScenario(setting="overlap", overlap=1, epochs=42, warmup=36, seed=0)
    r = run_two_job_scenario(sc, (("coop", "coop"),))
    assert r.improvement(("coop", "coop"), 0) > 0.05
    assert r.improvement(("coop", "coop"), 1) > 0.05
    for run in r.runs.values():
        for pats in run.patterns:
            for p in pats:
                check_pattern(p)


def test_keeps_pending_is_the_loops_own_test():
    p = build_pattern("tree", 8, 20e6)
    state = leader_init(p, ReactParams(seed=1))
    slow = StarFluidExecutor(ext_in={3: 2}).run(p, 6)
    state, d1 = leader_step(state, slow.fct, slow.epoch_time)
    assert d1.swaps
    for factor in (0.5, 0.96, 1.2):
        t = slow.epoch_time * factor
        _, dec = leader_step(state, slow.fct[:, :d1.pattern.edges_count], t)
        assert dec.kept == keeps_pending(state, float(t.mean()))
    # the same observation, judged against a baseline the network made 30% slower
    t = slow.epoch_time * 1.2
    assert not keeps_pending(state, float(t.mean()))
    assert keeps_pending(state, float(t.mean()), baseline_scale=1.3)


def test_environment_shift_is_the_control_flows_median_ratio():
    before = np.ones((6, 5))
    after = before * np.array([2.0, 2.0, 2.0, 9.0, 0.1])
    same = np.array([True, True, True, False, False])
    assert environment_shift(before, after, same) == pytest.approx(2.0)
    assert environment_shift(before, after, np.zeros(5, bool)) == 1.0


def test_a_shift_while_unchanged_holds_off_and_a_persistent_one_renews_the_budget():
    p = build_pattern("tree", 8, 20e6)
    state = coop_init(p, ReactParams(seed=2), CoopParams(seed=2))
    state = replace(state, leader=replace(state.leader, rounds=5))   # Emax rounds used up
    b = StarFluidExecutor(ext_in={3: 2}).run(p, 6)
    for _ in range(2):                                               # steady: nothing to do
        state, d = coop_step(state, b.fct, b.epoch_time)
        assert d.detail["coop_explore"] and not d.swaps and state.reference is None
    steady = state
    state, d = coop_step(steady, b.fct * 1.5, b.epoch_time * 1.5)   # the network shifts
    assert not d.detail["coop_explore"] and state.reference is not None
    state, d = coop_step(state, b.fct * 1.5, b.epoch_time * 1.5)    # ... and stays:
    assert d.detail["coop_renewed"] and d.swaps                      # explore again
    # a shift that goes away again (a neighbour's trial) renews nothing
    state, _ = coop_step(steady, b.fct * 1.5, b.epoch_time * 1.5)
    state, d = coop_step(state, b.fct, b.epoch_time)
    assert not d.detail["coop_renewed"] and not d.swaps and state.leader.rounds == 5


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["tree", "ring", "rd-allgather"]), st.integers(0, 2 ** 16),
       st.sampled_from([CoopParams(), CoopParams(stagger=False, backoff=False),
                        CoopParams(window=1, max_window=1, shift=0.0)]))
def test_the_cooperative_rule_never_breaks_the_collective(kind, seed, coop):
    """Whatever the FCTs, every pattern a cooperative leader emits passes the semantic
    checker (REACT App. A.3)."""
    p = build_pattern(kind, 8, 8e6)
    rng = np.random.default_rng(seed)
    state = coop_init(p, ReactParams(seed=seed % 997), CoopParams(**{**coop.__dict__,
                                                                     "seed": seed % 991}))
    for _ in range(8):
        cur = state.pattern
        fct = rng.lognormal(0.0, 0.5, (6, cur.edges_count)) * 1e-4
        hot = rng.random(cur.edges_count) < 0.2             # some flows much slower
        fct[:, hot] *= rng.uniform(1.5, 4.0)
        state, dec = coop_step(state, fct, fct.sum(axis=1))
        check_pattern(dec.pattern)
        assert dec.pattern is state.pattern


def test_cli_react_jobs(tmp_path):
    out = tmp_path / "jobs.json"
    res = CliRunner().invoke(main, ["react", "jobs", "--setting", "overlap", "--overlap", "2",
                                    "--seeds", "1", "--epochs", "12", "--modes",
                                    "react+off,coop+coop", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    assert [r["modes"] for r in rows] == [["react", "off"], ["coop", "coop"]]
    assert rows[0]["collectives"] == ["tree", "ring"] and rows[0]["overlap"] == 2
    bad = CliRunner().invoke(main, ["react", "jobs", "--modes", "react+magic"])
    assert bad.exit_code == 2 and "--modes" in bad.output and bad.output.count("\n") == 1
