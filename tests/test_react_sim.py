"""REACT on the flow-level simulator: executors, scenarios, plans, the CLI."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.collectives import build_pattern, multi_ring_allreduce, ring_allreduce
from topoopt.errors import ConfigError
from topoopt.fabrics import fat_tree, star
from topoopt.react.analytical import fluid_star
from topoopt.react.execution import StarFluidExecutor
from topoopt.react.flowsim import BackgroundFlows, JobsExecutor, SimulatedExecutor, external_share
from topoopt.react.loop import run_react
from topoopt.react.scenarios import Scenario, run_scenario, run_two_jobs, scenario_setup


def test_ring_on_a_star_is_the_closed_form():
    n, S = 6, 6e6
    r = SimulatedExecutor(star(n, 100e9), range(n)).run(ring_allreduce(range(n), size=S), 2)
    per_step = S / n * 8 / 100e9 + 2e-6                     # two 1 us links per hop
    assert r.epoch_time == pytest.approx([2 * (n - 1) * per_step] * 2)


def test_simulator_agrees_with_the_analytical_fluid_model():
    """Two independent implementations: netsim on a star vs. the §4.3 fluid model."""
    p = build_pattern("tree", 8, 20e6)
    bg = [BackgroundFlows(8, 3, 2), BackgroundFlows(1, 9, 1)]    # 2 into rank 3, 1 out of 1
    sim = SimulatedExecutor(star(10, 100e9), range(8), bg).run(p, 1)
    ref = fluid_star(p, 100e9, 2e-6, ext_in={3: 2}, ext_out={1: 1})
    assert sim.epoch_time[0] == pytest.approx(ref.makespan, rel=1e-6)
    assert sim.finish[0] == pytest.approx(ref.finish, rel=1e-6)


def test_ecmp_draws_are_seeded_and_per_epoch():
    f = fat_tree(128, 100e9, k=8)
    place = [0, 20, 40, 60, 80, 100, 120, 127]
    p = build_pattern("rd-allgather", 8, 20e6)
    bg = [BackgroundFlows(1, 101, 4), BackgroundFlows(21, 61, 4)]
    a = SimulatedExecutor(f, place, bg, ports=4, seed=3).run(p, 8)
    b = SimulatedExecutor(f, place, bg, ports=4, seed=3).run(p, 8)
    assert np.array_equal(a.finish, b.finish)
    one = SimulatedExecutor(f, place, bg, ports=1, seed=3).run(p, 8)
    assert np.allclose(one.epoch_time, one.epoch_time[0])     # one path: every epoch alike


def test_transport_terms_off_are_the_plain_fluid_model():
    """share_jitter 0 and external_weight 1 are max-min; without external flows the
    weight changes nothing (p = 0)."""
    f = fat_tree(128, 100e9, k=8)
    place = [0, 20, 40, 60, 80, 100, 120, 127]
    p = build_pattern("tree", 8, 20e6)
    bg = [BackgroundFlows(1, 101, 4), BackgroundFlows(21, 61, 2)]
    old = SimulatedExecutor(f, place, bg, seed=2).run(p, 3)
    new = SimulatedExecutor(f, place, bg, seed=2, share_jitter=0.0, external_weight=1.0).run(p, 3)
    assert np.array_equal(old.finish, new.finish)
    alone = SimulatedExecutor(f, place, seed=2).run(p, 3)
    heavy = SimulatedExecutor(f, place, seed=2, external_weight=3.0).run(p, 3)
    assert np.array_equal(alone.finish, heavy.finish)
    with pytest.raises(ConfigError):
        SimulatedExecutor(f, place, bg, external_weight=0.0)
    with pytest.raises(ConfigError):
        Scenario(share_jitter=-0.1)


@pytest.mark.parametrize("p, w", [(1, 1.0), (2, 1.5), (4, 0.8)])
def test_external_weight_gives_the_job_flow_its_share_and_fills_the_port(p, w):
    """A job flow beside p external flows of weight w at its NIC gets 1 / (1 + p w) of
    it, and the shares add up to the port: share * (1 + p w) == 1."""
    S, C = 2e6, 100e9
    share = external_share(p, w)
    assert share * (1 + p * w) == pytest.approx(1.0)
    assert external_share(p) == pytest.approx(1 / (p + 1))
    r = SimulatedExecutor(star(3, C), [0, 1], [BackgroundFlows(0, 2, p)],
                          external_weight=w).run(build_pattern("rd-allgather", 2, S), 1)
    # flow 0 -> 1 shares 0's uplink; 1 -> 0 is alone (the external flows leave by 0's uplink)
    assert r.fct[0, 0] == pytest.approx(S / 2 * 8 / (C * share) + 2e-6)
    assert r.fct[0, 1] == pytest.approx(S / 2 * 8 / C + 2e-6)


def test_share_jitter_splits_a_port_unevenly_and_keeps_it_full():
    """Two jobs' flows into one server share its downlink in proportion to seeded
    weights: unequal, yet the link moves both in the time of their bytes at line rate."""
    S, C = 2e6, 100e9
    p = build_pattern("rd-allgather", 2, S)
    full = S * 8 / C + 2e-6                                  # two halves of S, one link

    def into_server_1(sigma):
        ex = JobsExecutor(star(3, C), [[0, 1], [2, 1]], share_jitter=sigma, seed=5)
        a, b = ex.run_many([p, p], 1)
        return np.array([a.fct[0, 0], b.fct[0, 0]])          # 0 -> 1 and 2 -> 1

    even, uneven = into_server_1(0.0), into_server_1(0.5)
    assert even == pytest.approx([full, full])
    assert uneven.max() == pytest.approx(full) and uneven.min() < 0.95 * full
    assert np.array_equal(uneven, into_server_1(0.5))        # seeded


def test_react_alleviates_incast_on_a_star_and_idles_when_clean():
    hot = run_scenario(Scenario(collective="tree", fabric="star", congested=2, p=4,
                                epochs=48, warmup=24, seed=1))
    assert hot.improvement > 0.1
    clean = run_scenario(Scenario(collective="tree", fabric="star", kind="none",
                                  epochs=36, warmup=6))
    assert clean.changes == () and clean.improvement == pytest.approx(0.0)


def test_fig5_scenario_draws_distinct_sources_outside_destinations():
    sc = Scenario(congested=4, p=2, seed=5)
    fabric, placement, bg, pattern = scenario_setup(sc)
    assert fabric.servers == 128 and len(set(placement.tolist())) == 8
    assert len({b.src for b in bg}) == 4
    assert all(b.src in placement and b.dst not in placement and b.count == 2 for b in bg)


def test_failures_and_spine_scenarios_slow_the_baseline_down():
    clean = run_scenario(Scenario(kind="none", epochs=12, warmup=0, seed=2))
    fail = run_scenario(Scenario(kind="failures", congested=40, capacity=30e9, epochs=12,
                                 warmup=0, seed=2))
    spine = run_scenario(Scenario(kind="spine", congested=8, p=4, epochs=12, warmup=0,
                                  seed=2))
    assert fail.mean("baseline") >= clean.mean("baseline")
    assert spine.mean("baseline") >= clean.mean("baseline")


def test_two_overlapping_jobs_share_servers():
    alone = run_two_jobs(0, nodes=4, epochs=12, react=(False, False))
    shared = run_two_jobs(2, nodes=4, epochs=12, react=(False, False))
    assert shared["baseline"][0] > alone["baseline"][0]      # the tree job suffers
    assert alone["react"] == alone["baseline"]


def test_plan_fabric_runs_the_plans_rings(tmp_path):
    # the 3-server ring is a partial AllReduce group's: the runtime takes the widest group
    n = 6
    links = [(i, 0, (i + 1) % n, 0) for i in range(n)] + \
            [(i, 1, (i - 1) % n, 1) for i in range(n)]
    every = list(range(n))
    plan = {"format": "topoopt.plan/1",
            "topology": {"servers": n, "ports": 2, "links": links,
                         "link_bandwidth": 100e9, "link_latency": 1e-6},
            "rings": [{"order": every, "members": every},
                      {"order": [0, 2, 4], "members": [0, 2, 4]},
                      {"order": [0, 5, 4, 3, 2, 1], "members": every}],
            "routes": []}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    sc = Scenario(collective="plan", fabric=f"plan:{tmp_path}", nodes=n, size=12e6,
                  kind="none", epochs=3, warmup=0)
    _, _, _, pattern = scenario_setup(sc)
    assert pattern.chunks == 2
    res = run_scenario(sc)
    # each ring has its own fibres: 2(n-1) steps of S/2/n plus one hop's latency
    per_step = 12e6 / 2 / n * 8 / 100e9 + 1e-6
    assert res.baseline == pytest.approx([2 * (n - 1) * per_step] * 3)
    assert pattern.signature() == multi_ring_allreduce(
        [list(range(n)), [0, 5, 4, 3, 2, 1]], 12e6).signature()


def test_plan_whose_rings_miss_servers_is_refused(tmp_path):
    n = 6
    links = [(i, 0, (i + 1) % n, 0) for i in range(n)]
    plan = {"format": "topoopt.plan/1",
            "topology": {"servers": n, "ports": 1, "links": links,
                         "link_bandwidth": 100e9, "link_latency": 1e-6},
            "rings": [{"order": [0, 2, 4], "members": [0, 2, 4]}], "routes": []}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    r = CliRunner().invoke(main, ["react", "simulate", "--collective", "plan", "--fabric",
                                  f"plan:{tmp_path}", "--nodes", str(n), "--epochs", "6",
                                  "--warmup", "0"])
    assert r.exit_code == 2 and "not a fibre between its members" in r.output
    assert "Traceback" not in r.output


def test_star_fluid_and_simulated_loops_agree_on_direction():
    p = build_pattern("tree", 8, 20e6)
    fluid = run_react(StarFluidExecutor(ext_in={3: 3}, alpha=2e-6), p, 36)
    assert fluid.epoch_time[-6:].mean() < fluid.epoch_time[:6].mean()
    # the same loop on the flow-level simulator: 3 external flows into rank 3
    sim = run_react(SimulatedExecutor(star(9, 100e9), range(8), [BackgroundFlows(8, 3, 3)]),
                    p, 36)
    assert sim.epoch_time[-6:].mean() < sim.epoch_time[:6].mean()
    assert sim.epoch_time == pytest.approx(fluid.epoch_time, rel=1e-6)


# ------------------------------------------------------------------------ CLI
def test_cli_simulate_prints_and_writes(tmp_path):
    out = tmp_path / "run.json"
    r = CliRunner().invoke(main, ["react", "simulate", "--fabric", "star", "--congested", "2",
                                  "--p", "4", "--epochs", "30", "--warmup", "12",
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "with REACT" in r.output and "algbw" in r.output
    doc = json.loads(out.read_text())
    assert len(doc["epoch_time_react_s"]) == 30 and "improvement" in doc


def test_cli_simulate_says_when_position_swaps_are_off(monkeypatch):
    from topoopt.react import transforms

    monkeypatch.setattr(transforms, "POSITION_WORK_LIMIT", 0)
    r = CliRunner().invoke(main, ["react", "simulate", "--fabric", "star", "--epochs", "12",
                                  "--warmup", "0"])
    assert r.exit_code == 0, r.output
    assert "position swaps off" in r.output
    assert "with REACT: 12/12 epochs" in r.output      # the progress line (stderr)


def test_cli_sweep_small_grid():
    r = CliRunner().invoke(main, ["react", "sweep", "--collective", "tree", "--p", "2",
                                  "--pairs", "1", "--seeds", "1", "--epochs", "12",
                                  "--fabric", "star"])
    assert r.exit_code == 0, r.output
    assert "mean gain" in r.output


def test_cli_simulate_bad_input_is_one_line():
    r = CliRunner().invoke(main, ["react", "simulate", "--fabric", "mesh"])
    assert r.exit_code == 2 and "fabric" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["react", "simulate", "--fabric", "plan:/nonexistent"])
    assert r.exit_code == 2 and "plan.json" in r.output


def test_run_sweep_runs_the_flow_backend_and_refuses_an_unknown_one():
    from topoopt.errors import ConfigError
    from topoopt.react.scenarios import Scenario, run_scenario
    from topoopt.react.sweep import run_sweep

    sc = Scenario(collective="tree", fabric="star", size=1e6, epochs=3, warmup=1)
    (got,) = run_sweep([sc], backend="flow")
    want = run_scenario(sc)
    assert (got.baseline == want.baseline).all() and (got.react == want.react).all()
    with pytest.raises(ConfigError, match="backend"):
        run_sweep([sc], backend="packets")


def test_run_sweep_timed_gives_the_same_results_with_their_costs():
    from topoopt.react.scenarios import Scenario
    from topoopt.react.sweep import run_sweep, run_sweep_timed

    scs = [Scenario(collective="tree", fabric="star", size=1e6, epochs=3, warmup=1, p=p)
           for p in (1, 2)]
    seen: list[int] = []
    timed = run_sweep_timed(scs, on_done=lambda i, run: seen.append(i))
    plain = run_sweep(scs)
    assert sorted(seen) == [0, 1]
    for run, want in zip(timed, plain):
        assert run.result.scenario == want.scenario
        assert (run.result.baseline == want.baseline).all()
        assert (run.result.react == want.react).all()
        assert run.wall_s > 0 and run.cpu_s >= 0
