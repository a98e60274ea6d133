"""REACT on a planned shard: the class executor against the general simulator, the
direct-connect-aware transforms and their safety, the shard tuner, its scenarios."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.collectives import (
    PatternError,
    build_pattern,
    check_pattern,
    flow_dependencies,
    multi_ring_allreduce,
)
from topoopt.collectives.ten import Pattern
from topoopt.errors import ConfigError
from topoopt.fabrics import fat_tree, star
from topoopt.react.classsim import ClassExecutor, simulate_classes
from topoopt.react.flowsim import BackgroundFlows, SimulatedExecutor, pattern_workload
from topoopt.react.loop import ReactParams
from topoopt.react.scenarios import Scenario, group_shard, load_plan, run_scenario, shard_scenario
from topoopt.react.shard import (
    Resplit,
    RingSwap,
    RingSwitch,
    RouteMove,
    ShardLayout,
    ShardModel,
    check_shard_config,
    estimate,
    resplit_weights,
    ring_times,
    run_shard_react,
    shard_candidates,
    shard_fabric,
    shard_leader_init,
    shard_leader_step,
)
from topoopt.react.transforms import Swap, apply_swap
from topoopt.topology.topology import Topology

B = 100e9


def stride_topology(n: int, strides, spare=()) -> Topology:
    """A shard of stride rings (one port each), plus spare stride fibres on more ports."""
    all_s = list(strides) + list(spare)
    links = tuple((i, k, (i + s) % n, k) for k, s in enumerate(all_s) for i in range(n))
    labels = tuple(f"{'ring' if k < len(strides) else 'spare'}:p={s}"
                   for k, s in enumerate(all_s) for _ in range(n))
    return Topology(n, len(all_s), links, B, 1e-6, labels)


def rings_of_strides(n: int, strides):
    return [tuple((i * s) % n for i in range(n)) for s in strides]


def write_plan(path, topo: Topology, rings, routes=()) -> str:
    every = list(range(topo.servers))
    doc = {"format": "topoopt.plan/1",
           "topology": {"servers": topo.servers, "ports": topo.ports,
                        "link_bandwidth": topo.link_bandwidth,
                        "link_latency": topo.link_latency,
                        "links": [list(x) for x in topo.links], "labels": list(topo.labels)},
           "rings": [{"order": list(r), "members": every, "direct": True} for r in rings],
           "routes": list(routes)}
    (path / "plan.json").write_text(json.dumps(doc))
    return f"plan:{path}"


# --------------------------------------------------------------- the class executor
def _same(fabric, pattern, background=(), placement=None, epochs=2):
    place = range(pattern.ranks) if placement is None else placement
    a = SimulatedExecutor(fabric, place, background).run(pattern, epochs)
    ex = ClassExecutor(fabric, place, background)
    b = ex.run(pattern, epochs)
    scale = float(a.finish.max())
    np.testing.assert_allclose(b.start, a.start, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(b.finish, a.finish, rtol=0, atol=1e-9 * scale)
    return ex.stats


def test_class_executor_equals_the_general_simulator_on_small_plans():
    n = 8
    topo = stride_topology(n, (1, 3, 5))
    clean = shard_fabric(topo)
    dirty = shard_fabric(topo, tx={(1, 0): 30e9})
    rings = rings_of_strides(n, (1, 3, 5))
    p = multi_ring_allreduce(rings, 6e6)
    stats = _same(clean, p)
    assert stats["shared"] == 0 and stats["general"] == 0 and stats["cached"] == 1
    assert _same(dirty, p)["shared"] == 0                      # a slow fibre is still alone
    assert _same(dirty, multi_ring_allreduce(rings, 6e6, weights=[0.3, 1, 1]))["shared"] == 0
    # background on fibres, forwarded hops after swaps: shared flows through max-min
    assert _same(dirty, p, (BackgroundFlows(0, 6, 2),))["shared"] > 0
    assert _same(dirty, apply_swap(p, Swap("global", 2, 6)), (BackgroundFlows(3, 4),),
                 epochs=3)["shared"] > 0
    # a chunk swap forwards hops over fibres the other rings use: shared flows
    assert _same(dirty, apply_swap(p, Swap("chunk", 1, 4, chunk=0)))["shared"] > 0


def test_class_executor_equals_the_general_simulator_on_switched_fabrics():
    _same(star(12, B), build_pattern("tree", 8, 20e6), (BackgroundFlows(2, 9, 2),))
    ft = fat_tree(128, B, 1e-6, k=8)
    place = [0, 17, 34, 51, 68, 85, 102, 119]
    _same(ft, build_pattern("rd-allgather", 8, 20e6),
          (BackgroundFlows(17, 99, 2), BackgroundFlows(85, 70, 4)), place, epochs=3)


def test_simulate_classes_resolves_a_clean_shard_without_max_min():
    n = 8
    topo = stride_topology(n, (1, 3))
    fabric = shard_fabric(topo)
    p = multi_ring_allreduce(rings_of_strides(n, (1, 3)), 8e6)
    w, _ = pattern_workload(p, {})
    import dataclasses
    w = dataclasses.replace(w, routes=fabric.route(p.src, p.dst))
    r = simulate_classes(fabric, w, (), p.step, p.chunk * n + p.src, p.chunk * n + p.dst)
    assert (r.exclusive, r.shared, r.events, r.general) == (p.edges_count, 0, 0, False)
    per_step = 8e6 / 2 / n * 8 / B + 1e-6                         # one fibre per hop
    assert r.makespan == pytest.approx(2 * (n - 1) * per_step, rel=1e-9)


def test_vectorized_dependencies_equal_the_step_order_definition():
    from topoopt.react.transforms import apply_swap as swap

    pats = [build_pattern(c, n, 1e6) for c in ("tree", "ring", "rd-allgather") for n in (2, 5, 8)]
    pats.append(swap(build_pattern("tree", 16, 1e6), Swap("position", 3, 5, 0, 2)))
    pats.append(multi_ring_allreduce([list(range(6)), [0, 5, 4, 3, 2, 1]], 1e6))
    for p in pats:
        ptr, idx = flow_dependencies(p)
        for e in range(p.edges_count):          # the latest earlier step of each endpoint
            want = set()
            for r in (p.src[e], p.dst[e]):
                mine = np.flatnonzero((p.chunk == p.chunk[e]) & (p.step < p.step[e])
                                      & ((p.src == r) | (p.dst == r)))
                if mine.size:
                    want |= set(mine[p.step[mine] == p.step[mine].max()].tolist())
            assert set(idx[ptr[e]:ptr[e + 1]].tolist()) == want


# --------------------------------------------------------------- layout and model
def _layout(n=12, strides=(1, 5, 7), spare=(), size=12e6, optics="patch_panel", owned=(),
            tx=None):
    topo = stride_topology(n, strides, spare)
    layout = ShardLayout.of(topo, rings_of_strides(n, strides), size, optics=optics,
                            owned=owned)
    return layout, shard_fabric(topo, None, optics, tx)


def _observe(layout, fabric, config=None, background=()):
    config = layout.initial() if config is None else config
    ex = ClassExecutor(fabric, range(layout.n), background)
    r = ex.run(layout.pattern(config), 6)
    return ShardModel().observe(layout, config, r.fct, 0), r


def test_ring_time_estimate_is_exact_on_a_shard_it_has_seen():
    layout, fabric = _layout(tx={(3, 1): 30e9})
    model, r = _observe(layout, fabric)
    times, rates, _ = ring_times(layout, layout.initial(), model)
    assert times.max() == pytest.approx(r.epoch_time[0], rel=1e-3)
    assert rates[1].min() == pytest.approx(30e9, rel=1e-6) and rates[0].min() == pytest.approx(B)
    # a re-split's time is predicted before it runs
    w = resplit_weights(layout, rates, _)
    c = Resplit(tuple(w)).apply(layout.initial())
    ex = ClassExecutor(fabric, range(layout.n))
    real = ex.run(layout.pattern(c), 1).epoch_time[0]
    assert ring_times(layout, c, model)[0].max() == pytest.approx(real, rel=0.01)


def test_resplit_gives_each_ring_bytes_in_proportion_to_its_slowest_fibre():
    layout, fabric = _layout(size=400e6, tx={(3, 1): 30e9})      # bandwidth-bound
    model, _ = _observe(layout, fabric)
    _, rates, lats = ring_times(layout, layout.initial(), model)
    w = resplit_weights(layout, rates, lats)
    assert w / w.max() == pytest.approx([1, 0.3, 1], rel=0.01)


# --------------------------------------------------------------- transforms are safe
def test_every_transform_passes_the_semantic_checker():
    owned = (BackgroundFlows(0, 6, 2),)
    layout, fabric = _layout(strides=(1, 5), spare=(7,), optics="ocs", owned=owned,
                             tx={(0, 0): 30e9})
    config = layout.initial()
    model, _ = _observe(layout, fabric, config, layout.owned_flows(config, fabric))
    cands = shard_candidates(layout, config, model, rings=[0, 1], nodes=[0, 1, 6],
                             links=list(range(fabric.links)), rng=np.random.default_rng(0),
                             swaps=40)
    kinds = {t.kind for t in cands}
    assert kinds == {"resplit", "switch", "swap", "route"}
    assert any(isinstance(t, RingSwitch) and t.reconfigure for t in cands)
    assert any(isinstance(t, RingSwitch) and not t.reconfigure and t.stride == 7 for t in cands)
    for t in cands:
        c = t.apply(config)
        p = check_shard_config(layout, c)                        # raises if not correct
        assert p.chunks == 2 and p.size == layout.pattern(config).size
        for u, v in zip(c.routes[0], c.routes[0][1:]):
            assert (u, v) in {(a, b) for a, _, b, _ in layout.topology_of(c).links}


def test_a_resplit_that_ignores_a_degraded_ring_is_caught():
    layout, fabric = _layout(tx={(3, 1): 30e9})
    p = layout.pattern(layout.initial())
    # dropping the degraded ring's flows (its chunk is then never reduced)
    keep = np.flatnonzero(p.chunk != 1)
    rows = [(p.step[e], p.src[e], p.dst[e], p.chunk[e], p.edge_segments(e), p.reduce[e],
             p.phase[e]) for e in keep]
    dropped = Pattern.from_edges(p.name, p.collective, p.ranks, p.segments, rows,
                                 phase_names=p.phase_names)
    with pytest.raises(PatternError, match="not correct"):
        check_pattern(dropped)
    # the rebuilt split moves the bytes instead, and is correct
    check_pattern(layout.pattern(Resplit((0.5, 1e-3, 0.5)).apply(layout.initial())))
    # a split that ignores the degraded ring (its share kept or raised) is estimated no
    # better, and the loop reverts it when it runs slower
    model, r = _observe(layout, fabric)
    c = layout.initial()
    worse = Resplit((0.2, 0.6, 0.2)).apply(c)
    assert estimate(layout, c, worse, model, 60) > r.epoch_time.mean()
    state = shard_leader_init(layout)
    state, _ = shard_leader_step(state, r.fct, r.epoch_time)
    from dataclasses import replace

    from topoopt.react.shard import _Pending
    state = replace(state, config=worse, pending=_Pending(c, float(r.epoch_time.mean()),
                                                          (Resplit(worse.weights),)))
    ex = ClassExecutor(fabric, range(layout.n))
    r2 = ex.run(layout.pattern(worse), 6)
    state, dec = shard_leader_step(state, r2.fct, r2.epoch_time)
    assert dec.reverted and dec.config == c


def test_ring_switch_to_spare_fibres_and_ocs_costs():
    layout, fabric = _layout(strides=(1, 5), spare=(7,), tx={(0, 0): 30e9})
    run = run_shard_react(ClassExecutor(fabric, range(12)), layout, 24)
    assert any("p=7" in " ".join(sw) for _, sw, _ in run.changes)
    clean = ClassExecutor(shard_fabric(layout.topology), range(12)).run(
        layout.pattern(layout.initial()), 1).epoch_time[0]
    assert run.epoch_time[-6:].mean() == pytest.approx(clean, rel=0.02)
    # on an OCS the dirty port stays with the ring's ports: re-wiring cannot help
    ocs, world = _layout(strides=(1, 5), optics="ocs", tx={(0, 0): 30e9})
    model, _ = _observe(ocs, world)
    c = ocs.initial()
    sw = RingSwitch(0, 7, tuple((i * 7) % 12 for i in range(12)), reconfigure=True)
    est = estimate(ocs, c, sw.apply(c), model, 60)
    assert est >= ring_times(ocs, c, model)[0].max() + ocs.reconfiguration / 60 - 1e-9
    topo = ocs.topology_of(sw.apply(c))
    assert sorted((a, b) for a, pa, b, _ in topo.links if pa == 0) == \
        sorted((u, (u + 7) % 12) for u in range(12))
    ex = ClassExecutor(world, range(12))
    ex.run(ocs.pattern(c), 1)
    ex.reconfigure(shard_fabric(topo, None, "ocs", {(0, 0): 30e9}), ocs.reconfiguration)
    r = ex.run(ocs.pattern(sw.apply(c)), 2)
    assert r.epoch_time[0] == pytest.approx(r.epoch_time[1] + ocs.reconfiguration)


def test_route_move_takes_owned_traffic_off_a_degraded_fibre():
    # 0 -> 6 is planned over fibre 0 -> 5 (ring p=5) then 5 -> 6; the spare p=2 fibres
    # give a path that no ring uses
    owned = (BackgroundFlows(0, 6, 2),)
    n = 12
    topo = stride_topology(n, (1, 5), spare=(2,))
    layout = ShardLayout.of(topo, rings_of_strides(n, (1, 5)), 12e6, owned=owned)
    c = layout.initial()
    c = RouteMove(0, (0, 5, 6)).apply(c)
    world = shard_fabric(topo, tx={(0, 1): 30e9})
    state = shard_leader_init(layout, c)
    ex = ClassExecutor(world, range(n))
    ex.set_background(layout.owned_flows(c, world))
    r = ex.run(layout.pattern(c), 6)
    state, dec = shard_leader_step(state, r.fct, r.epoch_time)
    moves = [t for t in dec.transforms if isinstance(t, RouteMove)]
    assert moves and all(5 not in t.path[1:2] for t in moves)
    ex.set_background(layout.owned_flows(dec.config, world))
    assert ex.run(layout.pattern(dec.config), 1).epoch_time[0] < 0.7 * r.epoch_time.mean()


def test_swaps_that_leave_the_fibres_are_priced_with_forwarding():
    layout, fabric = _layout(tx={(3, 1): 30e9})
    model, _ = _observe(layout, fabric)
    c = layout.initial()
    swap = RingSwap(0, 3, 8)                            # ring p=1: hops 2->8, 8->4, ...
    est = estimate(layout, c, swap.apply(c), model, 60)
    real = ClassExecutor(fabric, range(12)).run(layout.pattern(swap.apply(c)), 1)
    assert est == pytest.approx(real.epoch_time[0], rel=0.35)
    assert est > ring_times(layout, c, model)[0][0]     # forwarded hops share fibres


# --------------------------------------------------------------- the tuner end to end
def test_tuner_recovers_a_slow_fibre_and_costs_nothing_when_clean(tmp_path):
    # four rings, one fibre at 30%: re-splitting bytes 1 : 1 : 1 : 0.3 gives 4 / 3.3 =
    # 1.21x the healthy time (without REACT that ring's 30% sets the pace: ~3.3x)
    n = 12
    spec = write_plan(tmp_path, stride_topology(n, (1, 5, 7, 11)),
                      rings_of_strides(n, (1, 5, 7, 11)))
    base = Scenario(collective="plan", fabric=spec, nodes=n, size=60e6, epochs=30,
                    warmup=12, congested=1, capacity=30e9)
    healthy = run_scenario(Scenario(**{**base.__dict__, "kind": "none"}))
    assert healthy.changes == () and healthy.improvement == 0.0
    hurt = run_scenario(Scenario(**{**base.__dict__, "kind": "failures"}))
    h = healthy.mean("baseline")
    assert hurt.mean("baseline") > 2.5 * h
    assert hurt.mean("react") < 1.25 * h
    assert "resplit" in hurt.changes[0][1][0]


@pytest.mark.parametrize("kind", ["nic", "slow-server", "forwarded", "external"])
def test_shard_scenarios_run_and_never_make_it_worse(tmp_path, kind):
    n = 12
    spec = write_plan(tmp_path, stride_topology(n, (1, 5), spare=(2, 3)),
                      rings_of_strides(n, (1, 5)))
    sc = Scenario(collective="plan", fabric=spec, nodes=n, size=24e6, epochs=24, warmup=12,
                  kind=kind, congested=1, p=2, capacity=30e9 if kind != "nic" else 50e9)
    ss = shard_scenario(sc)
    assert (kind == "forwarded") == bool(ss.layout.owned)
    res = run_scenario(sc)
    clean = run_scenario(Scenario(**{**sc.__dict__, "kind": "none"})).mean("baseline")
    if kind == "external":      # its ECMP path may stay on spare fibres
        assert res.mean("baseline") >= clean
    else:
        assert res.mean("baseline") > clean
    assert res.improvement >= -0.01


def test_cli_simulate_plan_failures_table(tmp_path):
    n = 12
    spec = write_plan(tmp_path, stride_topology(n, (1, 5, 7)), rings_of_strides(n, (1, 5, 7)))
    r = CliRunner().invoke(main, ["react", "simulate", "--collective", "plan", "--fabric",
                                  spec, "--nodes", str(n), "--scenario", "failures",
                                  "--capacity", "30Gbps", "--epochs", "18", "--warmup", "6"])
    assert r.exit_code == 0, r.output
    assert "without REACT" in r.output and "with REACT" in r.output
    assert "resplit" in r.output
    r = CliRunner().invoke(main, ["react", "simulate", "--fabric", "star", "--scenario",
                                  "forwarded"])
    assert r.exit_code == 2 and "plan" in r.output and "Traceback" not in r.output


def test_params_reach_the_tuner(tmp_path):
    layout, fabric = _layout(tx={(3, 1): 30e9})
    run = run_shard_react(ClassExecutor(fabric, range(12)), layout, 24,
                          ReactParams(max_rounds=1), enabled=False)
    assert run.changes == ()
    # the slow fibre is there from the start: the tuner acts after its first batch of B
    # epochs, unless no transform gains epsilon
    run = run_shard_react(ClassExecutor(fabric, range(12)), layout, 24, ReactParams(batch=4))
    assert run.changes and run.changes[0][0] == 4
    run = run_shard_react(ClassExecutor(fabric, range(12)), layout, 24,
                          ReactParams(epsilon=1e3))
    assert run.changes == ()


def test_a_group_over_part_of_the_shard_runs_on_its_members_fibres(tmp_path):
    # two 6-server halves, each with its own stride rings (1 and 5), as a plan of two
    # data-parallel stages has; the widest group is the first half
    half = stride_topology(6, (1, 5))
    links = half.links + tuple((a + 6, pa, b + 6, pb) for a, pa, b, pb in half.links)
    topo = Topology(12, 2, links, B, 1e-6, half.labels * 2)
    rings = rings_of_strides(6, (1, 5))
    doc = {"format": "topoopt.plan/1",
           "topology": {"servers": 12, "ports": 2, "link_bandwidth": B, "link_latency": 1e-6,
                        "links": [list(x) for x in topo.links], "labels": list(topo.labels)},
           "rings": [{"order": [s + 6 for s in r], "members": list(range(6, 12))}
                     for r in rings],
           "routes": []}
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    sub, sub_rings, _, members = group_shard(*load_plan(tmp_path))
    assert members == tuple(range(6, 12)) and sub.servers == 6
    assert sorted(sub.links) == sorted(half.links) and sub_rings == [list(r) for r in rings]
    r = CliRunner().invoke(main, ["react", "simulate", "--collective", "plan", "--fabric",
                                  f"plan:{tmp_path}", "--scenario", "failures", "--capacity",
                                  "30Gbps", "--epochs", "18", "--warmup", "6"])
    assert r.exit_code == 0, r.output                      # --nodes: the group's 6
    assert "with REACT" in r.output
    # a ring hop that is no fibre between the members is refused by name
    doc["rings"][0]["order"] = [6, 8, 7, 9, 10, 11]
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="not a fibre between its members"):
        group_shard(*load_plan(tmp_path))
