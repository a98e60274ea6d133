"""Flow-level simulator: closed forms, max-min fairness, conservation, failures, background."""

import numpy as np
import pytest
from scipy.optimize import linprog

from topoopt.netsim import (
    NO_RESOURCE,
    Background,
    CapacityChange,
    FlowRoutes,
    Network,
    Simulation,
    SimulationError,
    Workload,
    degrade,
    max_min_rates,
    simulate,
)
from topoopt.netsim.engine import _DELIVER, _DONE, _QUEUED, _RUN, _WAIT

G = 1e9
US = 1e-6


def one_link(bandwidth=100 * G, latency=1 * US):
    return Network(np.array([bandwidth]), np.array([latency]))


# --- closed forms -------------------------------------------------------------------

def test_one_flow_one_link_is_size_over_bandwidth_plus_latency():
    w = Workload()
    f = w.add_flow(25e6, [0])
    r = simulate(one_link(), w)
    assert r.finish[f] == pytest.approx(25e6 * 8 / (100 * G) + 1 * US, rel=1e-12)
    assert r.tx_end[f] == pytest.approx(2e-3, rel=1e-12)
    assert r.makespan == pytest.approx(r.finish[f])


@pytest.mark.parametrize("k", [2, 3, 7])
def test_k_flows_sharing_a_link_each_get_b_over_k(k):
    assert max_min_rates(np.array([100 * G]), np.arange(k), np.zeros(k, np.int64),
                         np.ones(k), k) == pytest.approx(np.full(k, 100 * G / k))
    w = Workload()
    ids = w.add_flows(1e6, FlowRoutes.uniform(np.zeros((k, 1), np.int64)))
    r = simulate(one_link(latency=0.0), w)
    # all at B/k until they end together: k x size / B
    assert r.finish[ids] == pytest.approx(np.full(k, k * 8e6 / (100 * G)), rel=1e-12)
    assert r.throughput[ids] == pytest.approx(np.full(k, 100 * G / k), rel=1e-12)
    assert r.events == 1  # simultaneous completions are one event


def test_unequal_flows_release_bandwidth_when_they_finish():
    # 1 MB and 3 MB on 8 Mbit/s... scaled: B = 8e6 bit/s = 1 MB/s.
    w = Workload()
    a = w.add_flow(1e6, [0])
    b = w.add_flow(3e6, [0])
    r = simulate(one_link(8e6, 0.0), w)
    assert r.finish[a] == pytest.approx(2.0)   # 0.5 MB/s each for 2 s
    assert r.finish[b] == pytest.approx(4.0)   # then 2 MB left at 1 MB/s


def test_parking_lot_max_min_by_hand():
    # Links A (cap 1) and B (cap 2). Flow 0 crosses A and B, flow 1 only A,
    # flows 2 and 3 only B. A splits 1 between flows 0 and 1: 1/2 each; B has
    # 2 - 1/2 = 3/2 left for flows 2 and 3: 3/4 each.
    rates = max_min_rates(np.array([1.0, 2.0]), np.array([0, 0, 1, 2, 3]),
                          np.array([0, 1, 0, 1, 1]), np.ones(5), 4)
    assert rates == pytest.approx([0.5, 0.5, 0.75, 0.75])


def test_classic_parking_lot_long_flow_gets_half():
    # L links of capacity 1 in a row; one flow crosses all, one flow per link.
    L = 5
    ef = np.concatenate([np.zeros(L, np.int64), np.arange(1, L + 1)])
    el = np.concatenate([np.arange(L), np.arange(L)])
    assert max_min_rates(np.ones(L), ef, el, np.ones(2 * L), L + 1) == pytest.approx(
        np.full(L + 1, 0.5))


def _lp_max_min(cap, ef, el, ew, nflows):
    """Independent reference: max-min fair rates by successive linear programs."""
    A = np.zeros((cap.size, nflows))
    np.add.at(A, (el, ef), ew)
    fixed = np.full(nflows, np.nan)
    while np.isnan(fixed).any():
        free = np.flatnonzero(np.isnan(fixed))
        # maximise t subject to r_f >= t (free), r_f = fixed (frozen), A r <= cap
        nv = nflows + 1
        c = np.zeros(nv)
        c[-1] = -1
        A_ub = [np.concatenate([A[i], [0]]) for i in range(cap.size)]
        b_ub = list(cap)
        for f in free:
            row = np.zeros(nv)
            row[f], row[-1] = -1, 1
            A_ub.append(row)
            b_ub.append(0)
        bounds = [(fixed[f], fixed[f]) if not np.isnan(fixed[f]) else (0, None)
                  for f in range(nflows)] + [(0, None)]
        t = -linprog(c, A_ub=np.array(A_ub), b_ub=b_ub, bounds=bounds).fun
        # a free flow that cannot exceed t while the others keep >= t is bottlenecked
        for f in free:
            c2 = np.zeros(nv)
            c2[f] = -1
            b2 = [(fixed[g], fixed[g]) if not np.isnan(fixed[g]) else (t, None)
                  for g in range(nflows)] + [(0, None)]
            best = -linprog(c2, A_ub=np.array(A_ub[:cap.size]), b_ub=b_ub[:cap.size],
                            bounds=b2).fun
            if best <= t * (1 + 1e-7) + 1e-9:
                fixed[f] = t
    return fixed


@pytest.mark.parametrize("seed", range(6))
def test_max_min_matches_successive_linear_programs(seed):
    rng = np.random.default_rng(seed)
    links, flows = 5, 7
    cap = rng.uniform(1, 10, links)
    ef, el, ew = [], [], []
    for f in range(flows):
        ls = rng.choice(links, size=rng.integers(1, 4), replace=False)
        ef += [f] * ls.size
        el += ls.tolist()
        ew += rng.choice([0.5, 1.0, 2.0], ls.size).tolist()
    ef, el, ew = map(np.asarray, (ef, el, ew))
    got = max_min_rates(cap, ef, el, ew.astype(float), flows)
    assert got == pytest.approx(_lp_max_min(cap, ef, el, ew, flows), rel=1e-6)
    load = np.bincount(el, weights=ew * got[ef], minlength=links)
    assert np.all(load <= cap * (1 + 1e-9))


def test_multipath_weights_split_a_flow_over_parallel_links():
    net = Network(np.array([10 * G, 10 * G]), np.zeros(2))
    w = Workload()
    f = w.add_flow(10e6, [0, 1], [0.5, 0.5])
    r = simulate(net, w)
    assert r.throughput[f] == pytest.approx(20 * G)
    assert r.link_bytes == pytest.approx([5e6, 5e6])


# --- conservation and determinism ----------------------------------------------------

def _random_workload(seed, links=12, flows=60):
    rng = np.random.default_rng(seed)
    w = Workload()
    lists, weights = [], []
    for _ in range(flows):
        ls = rng.choice(links, size=rng.integers(1, 5), replace=False)
        lists.append(ls)
        weights.append(rng.choice([0.25, 0.5, 1.0], ls.size))
    routes = FlowRoutes.from_lists(lists, weights)
    sizes = rng.uniform(1e3, 1e7, flows)
    fl = w.add_flows(sizes, routes, release=rng.uniform(0, 1e-3, flows))
    tasks = w.add_tasks(rng.uniform(0, 1e-4, 20), rng.integers(0, 3, 20))
    # a random DAG: edges from lower to higher node ids only
    nodes = np.concatenate([fl, tasks])
    a = rng.integers(0, nodes.size, 80)
    b = rng.integers(0, nodes.size, 80)
    keep = a < b
    w.add_dependencies(nodes[a[keep]], nodes[b[keep]])
    cap = rng.uniform(1, 100, links) * G
    return Network(cap, rng.uniform(0, 2e-6, links)), w, routes, sizes, fl


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_conservation_bytes_on_links_equal_bytes_sent(seed):
    net, w, routes, sizes, fl = _random_workload(seed)
    r = simulate(net, w)
    owner = np.repeat(np.arange(len(routes)), np.diff(routes.ptr))
    expect = np.bincount(routes.link, weights=routes.weight * sizes[owner],
                         minlength=net.links)
    assert r.link_bytes == pytest.approx(expect, rel=1e-6, abs=1e-3)
    assert np.all(np.isfinite(r.finish)) and np.all(r.finish >= r.start)
    # no flow beats its bottleneck link alone
    single = np.array([8 * sizes[i] / net.capacity[routes.row(i)[0]].min() *
                       routes.row(i)[1][net.capacity[routes.row(i)[0]].argmin()]
                       for i in range(len(routes))])
    assert np.all(r.tx_end[fl] - r.start[fl] >= single * (1 - 1e-9))


def test_dependencies_and_releases_are_respected():
    net, w, routes, sizes, fl = _random_workload(3)
    c = w.compile()
    r = simulate(net, w)
    assert np.all(r.start[c.dep_after] >= r.finish[c.dep_before] - 1e-12)
    assert np.all(r.start >= c.release - 1e-12)


def test_determinism_same_input_same_output():
    a = simulate(*_random_workload(7)[:2])
    b = simulate(*_random_workload(7)[:2])
    assert np.array_equal(a.finish, b.finish) and np.array_equal(a.start, b.start)
    assert a.events == b.events
    c = simulate(*_random_workload(8)[:2])
    assert not np.array_equal(a.finish, c.finish)


# --- tasks ------------------------------------------------------------------------

def test_tasks_on_one_resource_run_one_at_a_time_by_priority():
    w = Workload()
    a = w.add_task(2.0, resource=0, priority=5)
    b = w.add_task(1.0, resource=0, priority=1)
    c = w.add_task(3.0, resource=1)
    d = w.add_task(4.0)  # no resource: runs at once
    r = simulate(Network(np.ones(1), np.zeros(1)), w)
    assert (r.start[b], r.finish[b], r.start[a], r.finish[a]) == (0, 1, 1, 3)
    assert (r.start[c], r.finish[c], r.start[d], r.finish[d]) == (0, 3, 0, 4)


def test_task_flow_task_chain():
    w = Workload()
    t1 = w.add_task(1e-3, resource=0)
    f = w.add_flow(12.5e6, [0], after=[t1])     # 1 ms at 100 Gbps + 1 us
    t2 = w.add_task(2e-3, resource=1, after=[f])
    r = simulate(one_link(), w)
    assert r.start[f] == pytest.approx(1e-3)
    assert r.finish[t2] == pytest.approx(1e-3 + 1e-3 + 1e-6 + 2e-3)


def test_release_time_and_t0():
    w = Workload()
    f = w.add_flow(12.5e6, [0], release=5e-3)
    g = w.add_flow(12.5e6, [0], release=0.0)
    r = simulate(one_link(latency=0.0), w, t0=2e-3)
    assert r.start[g] == pytest.approx(2e-3) and r.finish[g] == pytest.approx(3e-3)
    assert r.start[f] == pytest.approx(5e-3) and r.finish[f] == pytest.approx(6e-3)
    assert r.makespan == pytest.approx(4e-3)


def test_zero_size_flow_takes_the_latency_and_empty_workload():
    w = Workload()
    f = w.add_flow(0.0, [0])
    assert simulate(one_link(latency=3 * US), w).finish[f] == pytest.approx(3 * US)
    assert simulate(one_link(), Workload()).makespan == 0.0


def test_barrier_task_without_resource():
    w = Workload()
    xs = [w.add_task(d, resource=i) for i, d in enumerate([1.0, 3.0, 2.0])]
    bar = w.add_task(0.0, after=xs)
    after = w.add_task(1.0, resource=0, after=[bar])
    r = simulate(Network(np.ones(1), np.zeros(1)), w)
    assert r.finish[bar] == 3.0 and r.finish[after] == 4.0


# --- gray failures and background flows ---------------------------------------------

def test_gray_failure_by_hand():
    # 100 Mbit at 100 Gbps: 0.5 ms at full rate (50 Mbit), then 50 Gbps for the
    # other 50 Mbit (1 ms): last byte out at 1.5 ms, delivered 1 us later.
    w = Workload()
    f = w.add_flow(12.5e6, [0])
    r = simulate(one_link(), w, capacity_changes=[CapacityChange(0.5e-3, 0, 50 * G)])
    assert r.tx_end[f] == pytest.approx(1.5e-3) and r.finish[f] == pytest.approx(1.501e-3)
    # degraded during [0.5, 1.0) ms only: 25 Mbit in that half ms, 25 Mbit left at
    # full rate (0.25 ms): out at 1.25 ms.
    r = simulate(one_link(), w, capacity_changes=degrade(0, 50 * G, 100 * G, 0.5e-3, 1.0e-3))
    assert r.tx_end[f] == pytest.approx(1.25e-3)


def test_dead_link_stalls_until_repaired_else_raises():
    w = Workload()
    f = w.add_flow(12.5e6, [0])
    with pytest.raises(SimulationError, match="link 0 has capacity 0"):
        simulate(one_link(), w, capacity_changes=[CapacityChange(0.0, 0, 0.0)])
    r = simulate(one_link(latency=0), w, capacity_changes=degrade(0, 0.0, 100 * G, 0, 2e-3))
    assert r.finish[f] == pytest.approx(3e-3)


def test_dependency_cycle_raises():
    w = Workload()
    a = w.add_task(1.0, resource=0)
    b = w.add_task(1.0, resource=0, after=[a])
    w.add_dependencies(b, a)
    with pytest.raises(SimulationError, match="cycle"):
        simulate(Network(np.ones(1), np.zeros(1)), w)


def test_background_flow_by_hand():
    net = one_link(latency=0.0)
    w = Workload()
    f = w.add_flow(12.5e6, [0])  # 100 Mbit
    # greedy competitor: 50 Gbps each, 2 ms
    r = simulate(net, w, background=[Background((0,))])
    assert r.finish[f] == pytest.approx(2e-3)
    assert r.background_bytes == pytest.approx([12.5e6])
    assert r.link_bytes == pytest.approx([25e6])
    # constant 20 Gbps sender: the flow gets 80 Gbps, 1.25 ms
    r = simulate(net, w, background=[Background((0,), rate=20 * G)])
    assert r.finish[f] == pytest.approx(1.25e-3)
    # on 0.4 ms / off 0.6 ms: 20 Mbit in [0, 0.4), 60 Mbit in [0.4, 1.0) -> 80 Mbit;
    # then on again: 20 Mbit more at 50 Gbps takes 0.4 ms -> 1.4 ms.
    r = simulate(net, w, background=[Background((0,), on=0.4e-3, off=0.6e-3)])
    assert r.finish[f] == pytest.approx(1.4e-3)
    assert r.background_bytes == pytest.approx([(20e6 + 20e6) / 8])
    # a source that starts late only bites from then on
    r = simulate(net, w, background=[Background((0,), start=0.5e-3, stop=0.7e-3)])
    # 50 Mbit by 0.5 ms, 10 Mbit in [0.5, 0.7), 40 Mbit at full rate: 1.1 ms
    assert r.finish[f] == pytest.approx(1.1e-3)


def test_reject_bad_inputs():
    w = Workload()
    w.add_flow(1.0, [3])
    with pytest.raises(Exception, match="outside"):
        simulate(one_link(), w)
    with pytest.raises(Exception, match="rate"):
        Background((0,), rate=-1.0)
    with pytest.raises(Exception, match="capacity"):
        Network(np.array([-1.0]), np.zeros(1))
    w = Workload()
    w.add_tasks([-1.0], NO_RESOURCE)
    with pytest.raises(Exception, match="duration"):
        simulate(one_link(), w)


@pytest.mark.parametrize("n", [5, 70_000])
def test_successor_lists_match_a_stable_sort_of_the_sources(n):
    from topoopt.netsim.dag import successor_lists
    rng = np.random.default_rng(n)
    before = rng.integers(0, n, 3 * n)
    after = rng.integers(0, n, 3 * n)
    ptr, succ = successor_lists(before, after, n)
    order = np.argsort(before, kind="stable")       # numpy's merge sort: the reference
    assert np.array_equal(succ, after[order])
    assert np.array_equal(np.diff(ptr), np.bincount(before, minlength=n))
    assert ptr[0] == 0 and ptr[-1] == before.size


# --- Simulation, method by method ----------------------------------------------------
# Byte counts are chosen so that the times are exact in binary (8 Gbit/s links).


def eight_gbps(links=1, latency=0.0):
    return Network(np.full(links, 8e9), np.full(links, latency))


def test_simulation_starts_the_nodes_without_predecessors_at_t0():
    w = Workload()
    f = w.add_flow(1e9, [0])
    empty = w.add_flow(1e9, [], latency=0.25)           # no link: delivered at once
    a = w.add_task(0.5, resource=0)
    b = w.add_task(0.5, resource=0)                     # waits for a on resource 0
    later = w.add_task(0.5, after=[a])
    sim = Simulation(eight_gbps(), w, t0=2.0)
    assert sim.now == 2.0 and sim.events == 0 and sim.rates_stale
    assert sim.active.tolist() == [0]                   # f's local id, transmitting
    assert sim.remaining_bits[0] == 8e9
    assert sim.start[[f, empty, a]].tolist() == [2.0, 2.0, 2.0]
    assert sim.tx_end[empty] == 2.0 and sim.timer[empty] == 2.25
    assert sim.phase[[f, empty, a, b, later]].tolist() == [_RUN, _DELIVER, _RUN, _QUEUED, 0]
    assert sim.busy.tolist() == [True] and np.isnan(sim.start[b])
    assert sim.pending[later] == 1


def test_solve_rates_shares_a_link_max_min_and_only_when_stale():
    w = Workload()
    w.add_flow(1e9, [0, 1])
    w.add_flow(1e9, [0])
    w.add_flow(1e9, [1, 2])
    net = Network(np.array([8e9, 8e9, 2e9]), np.zeros(3))
    sim = Simulation(net, w)
    sim._solve_rates()
    # link 2 caps flow 2 at 2 Gbit/s; flows 0 and 1 split link 0
    assert sim.rate[:3].tolist() == [4e9, 4e9, 2e9]
    assert sim.load.tolist() == [8e9, 6e9, 2e9]
    assert not sim.rates_stale
    sim.rate[:] = 0.0
    sim._solve_rates()                                  # not stale: nothing recomputed
    assert sim.rate.tolist() == [0.0, 0.0, 0.0]


def test_next_event_time_is_the_earliest_of_its_sources():
    w = Workload()
    w.add_flow(1e9, [0])                                # 1 s at 8 Gbit/s
    w.add_task(0.75)                                    # timer at 0.75 s
    sim = Simulation(eight_gbps(), w, [], [CapacityChange(0.5, 0, 4e9)])
    sim._solve_rates()
    assert sim._next_event_time(0.25) == 0.25           # the pause comes first
    assert sim._next_event_time(np.inf) == 0.5          # then the capacity change
    sim.next_change = 1
    assert sim._next_event_time(np.inf) == 0.75         # then the task's end
    sim.timed = sim.timed[:0]
    assert sim._next_event_time(np.inf) == 1.0          # then the flow's last byte


def test_next_event_time_reports_a_flow_stuck_on_a_dead_link():
    w = Workload()
    w.add_flow(1e9, [0])
    sim = Simulation(Network(np.zeros(1), np.zeros(1)), w)
    sim._solve_rates()
    with pytest.raises(SimulationError, match="link 0 has capacity 0"):
        sim._next_event_time(np.inf)


def test_advance_to_transmits_at_the_current_rates():
    w = Workload()
    w.add_flow(1e9, [0])
    sim = Simulation(eight_gbps(), w)
    sim._solve_rates()
    sim._advance_to(0.25)
    assert sim.now == 0.25 and sim.events == 1 and sim.eps == pytest.approx(0.25e-9)
    assert sim.remaining_bits[0] == 6e9                 # 8 Gbit - 0.25 s x 8 Gbit/s
    assert sim.link_bytes.tolist() == [0.25e9]
    assert sim.flow_bytes_left().tolist() == [0.75e9]


def test_end_transmissions_hands_sent_flows_to_delivery():
    w = Workload()
    a = w.add_flow(1e9, [0], latency=0.5)
    b = w.add_flow(1e9, [1], latency=0.5)
    sim = Simulation(eight_gbps(2), w)
    sim.remaining_bits[:] = [1e-7, 100.0]   # a: within rate x eps + 1e-6 = 8 bits of sent
    sim.rate[:] = 8e9
    sim.rates_stale = False
    sim._end_transmissions(1.0, 1e-9)
    assert sim.active.tolist() == [1] and sim.rates_stale
    assert sim.tx_end[a] == 1.0 and np.isnan(sim.tx_end[b])
    assert sim.phase[a] == _DELIVER and sim.timer[a] == 1.5
    assert sim.rate[0] == 0.0 and sim.remaining_bits[0] == 0.0


def test_apply_capacity_changes_applies_those_due_in_time_order():
    w = Workload()
    w.add_flow(1e9, [0])
    changes = [CapacityChange(2.0, 0, 1e9), CapacityChange(1.0, 0, 2e9)]
    sim = Simulation(eight_gbps(), w, [], changes)
    assert not sim._apply_capacity_changes(0.5, 1e-9)
    assert sim._apply_capacity_changes(1.0, 1e-9)
    assert sim.capacity.tolist() == [2e9] and sim.next_change == 1
    assert sim._apply_capacity_changes(3.0, 1e-9)
    assert sim.capacity.tolist() == [1e9] and sim.next_change == 2


def test_toggle_backgrounds_switches_a_flow_on_and_off():
    w = Workload()
    w.add_flow(1e9, [0])
    bg = Background((0,), start=0.5, stop=1.5)
    sim = Simulation(eight_gbps(), w, [bg])
    assert sim.bg_on.tolist() == [False] and sim.bg_next.tolist() == [0.5]
    sim.rates_stale = False
    sim._toggle_backgrounds(0.5, 1e-9)
    assert sim.bg_on.tolist() == [True] and sim.active.tolist() == [0, 1]
    assert sim.rates_stale and sim.bg_next.tolist() == [1.5]
    sim._toggle_backgrounds(1.5, 1e-9)
    assert sim.bg_on.tolist() == [False] and sim.active.tolist() == [0]
    assert sim.bg_next.tolist() == [np.inf]


def test_dispatch_starts_the_lowest_priority_then_node_id_per_idle_resource():
    w = Workload()
    blocker = w.add_task(1.0)
    ids = [w.add_task(0.5, resource=0, priority=p, after=[blocker]) for p in (2, 1, 1)]
    other = w.add_task(0.5, resource=1, after=[blocker])
    sim = Simulation(eight_gbps(), w)
    sim._ready(np.array(ids + [other]), 0.25, 1e-9)     # all queue, two resources
    assert sim.start[ids[1]] == 0.25 and sim.start[other] == 0.25
    assert np.isnan(sim.start[[ids[0], ids[2]]]).all()
    sim._dispatch([0, 1], 0.5)                          # both busy: nothing starts
    assert np.isnan(sim.start[ids[2]])
    sim.busy[0] = False
    sim._dispatch([0], 0.75)                            # priority 1, node id order
    assert sim.start[ids[2]] == 0.75 and np.isnan(sim.start[ids[0]])
    assert sim.timer[ids[2]] == 1.25 and sim.phase[ids[2]] == _RUN


def test_ready_waits_for_the_release_time():
    w = Workload()
    now = w.add_task(0.5)
    later = w.add_task(0.5, release=2.0)
    sim = Simulation(eight_gbps(), w)
    assert sim.phase[later] == _WAIT and sim.timer[later] == 2.0
    assert sim.start[now] == 0.0 and np.isnan(sim.start[later])


@pytest.mark.parametrize("fan_out", [1, 40])      # few successors: unique; many: bincount
def test_complete_makes_ready_the_successors_with_no_predecessor_left(fan_out):
    w = Workload()
    a = w.add_task(1.0)
    b = w.add_task(2.0)
    both = [w.add_task(0.5, after=[a, b]) for _ in range(fan_out)]
    only_a = w.add_task(0.5, after=[a])
    sim = Simulation(eight_gbps(), w)
    sim.timed = sim.timed[:0]
    sim._complete(np.array([a]), np.array([1.0]), 1.0, 1e-9)
    assert sim.finish[a] == 1.0 and sim.phase[a] == _DONE and sim.done == 1
    assert sim.start[only_a] == 1.0 and sim.pending[both].tolist() == [1] * fan_out
    sim._complete(np.array([b]), np.array([2.0]), 2.0, 1e-9)
    assert sim.start[both].tolist() == [2.0] * fan_out and sim.done == 2


def test_fire_timers_runs_round_after_round_at_one_time():
    w = Workload()
    a = w.add_task(1.0)
    b = w.add_task(0.0, after=[a])                       # ends when it starts
    c = w.add_task(0.0, after=[b])
    d = w.add_task(1.0, after=[c])
    sim = Simulation(eight_gbps(), w)
    sim._fire_timers(1.0, 1e-9)
    assert sim.finish[[a, b, c]].tolist() == [1.0, 1.0, 1.0]
    assert sim.start[d] == 1.0 and np.isnan(sim.finish[d]) and sim.timer[d] == 2.0


def test_run_pauses_at_until_and_goes_on_to_the_same_result():
    w = Workload()
    f = w.add_flow(1e9, [0])
    t = w.add_task(0.5, after=[f])
    whole = simulate(eight_gbps(), w)
    sim = Simulation(eight_gbps(), w)
    assert sim.run(0.25) and sim.now == 0.25
    paused = sim.result()
    assert paused.stopped_at == 0.25 and paused.remaining[f] == 0.75e9
    assert np.isnan(paused.finish[t])
    assert not sim.run()
    done = sim.result()
    assert np.isnan(done.stopped_at) and done.remaining is None
    assert done.finish.tolist() == whole.finish.tolist() == [1.0, 1.5]
    assert done.events == whole.events + 1              # the pause was an event


def test_stops_yields_each_checkpoint_reached_with_work_left():
    w = Workload()
    w.add_flow(1e9, [0])                                # 1 s: done at 1.25
    sim = Simulation(eight_gbps(), w, t0=0.25)
    reached = list(sim.stops(iter([0.0, 0.25, 0.5, 0.75, 1.0, 2.0])))
    assert reached == [0.5, 0.75, 1.0]                  # not after t0: skipped; 2.0: done
    assert sim.done == 1 and sim.result().finish.tolist() == [1.25]
