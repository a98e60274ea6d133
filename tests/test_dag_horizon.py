"""A run with a horizon stops with a true lower bound on the makespan, past the horizon."""

from __future__ import annotations

import numpy as np
import pytest
from test_estimate_fast import layered_multihop_workload, random_workload

from topoopt.netsim import Workload
from topoopt.netsim import dag as dag_module
from topoopt.netsim.dag import WATCHED_LINKS, HorizonExceeded, dag_arrays, run_dag


def _workload(seed):
    rng = np.random.default_rng(seed)
    links = 6 if seed % 2 else 12
    cap = rng.choice([10e9, 25e9, 100e9], size=links)
    w = random_workload(rng, links) if seed % 2 else layered_multihop_workload(rng, links)
    return cap, dag_arrays(w.compile(), np.full(links, 1e-6))


@pytest.mark.parametrize("seed", range(16))
def test_a_run_past_its_horizon_reports_a_lower_bound_above_it(seed):
    cap, dag = _workload(seed)
    _, finish, _, _ = run_dag(cap, dag)
    makespan = float(np.nanmax(finish))
    for share in (0.2, 0.5, 0.8, 0.95, 0.99, 0.999, 1 - 1e-6):
        horizon = share * makespan
        with pytest.raises(HorizonExceeded) as stop:
            run_dag(cap, dag, horizon)
        assert horizon < stop.value.time <= makespan * (1 + 1e-12)
    # at or past the makespan the run is the one without a horizon
    for share in (1.0, 1.5):
        got = run_dag(cap, dag, share * makespan)
        np.testing.assert_array_equal(got[1], finish)


def test_the_busiest_link_stops_a_run_before_its_events_pass_the_horizon():
    # ten flows of 1..10 x 10 Mbit share one 100 Gbit/s link after a 1 ms task: the
    # first ends at 2 ms, the link needs 5.5 ms for all, so a 3 ms horizon is missed
    # at 1 ms already (one rate solve), with the whole link's time as the bound; the
    # next event alone (2 ms) would not even pass it
    w = Workload()
    t = w.add_task(1e-3, resource=0)
    for k in range(1, 11):
        w.add_flow(k * 1.25e6, [0], after=[t])
    dag = dag_arrays(w.compile(), np.zeros(1))
    cap = np.array([100e9])
    _, finish, _, _ = run_dag(cap, dag)
    assert float(np.nanmax(finish)) == pytest.approx(6.5e-3, rel=1e-9)
    with pytest.raises(HorizonExceeded) as stop:
        run_dag(cap, dag, 3e-3)
    assert stop.value.time == pytest.approx(6.5e-3, rel=2e-4) and stop.value.time <= 6.5e-3


def test_only_the_most_loaded_links_for_their_capacity_are_watched():
    rng = np.random.default_rng(3)
    links = 3 * WATCHED_LINKS
    w = Workload()
    for lk in range(links):
        w.add_flow(float(rng.integers(1, 100)) * 1e6, [lk])
    w.add_flow(5e6, [links])                        # a link of capacity 0: never watched
    dag = dag_arrays(w.compile(), np.zeros(links + 1))
    cap = np.append(rng.choice([10e9, 100e9], size=links), 0.0)
    bits = np.append(dag.flow_bits[:links], 0.0)
    r = dag.class_routes
    watch, watch_bits = dag_module._watched_links(cap, dag, dag.flow_class, r, 1.0)
    assert watch.size == WATCHED_LINKS and links not in watch
    time = np.where(cap > 0, bits / np.where(cap > 0, cap, 1), -1)
    assert np.min(time[watch]) >= np.sort(time)[-WATCHED_LINKS]
    np.testing.assert_allclose(watch_bits, bits[watch])
    none, _ = dag_module._watched_links(cap, dag, dag.flow_class, r, float("inf"))
    assert none.size == 0
