"""Checkpoints of the flow simulator and the rest of a stopped workload (netsim.epochs)."""

from __future__ import annotations

import numpy as np
import pytest

from topoopt.cluster import Cluster, Job
from topoopt.errors import TopoOptError
from topoopt.estimate import build_iteration
from topoopt.fabrics import direct_connect
from topoopt.netsim import Network, Workload, simulate
from topoopt.netsim.epochs import merge_times, rest_of
from topoopt.strategy import hybrid
from topoopt.topology.expander import expander_topology
from topoopt.workloads import model_of


def _random_workload(rng, links=4, flows=30, tasks=30):
    w = Workload()
    nodes = []
    for _ in range(tasks + flows):
        if rng.random() < tasks / (tasks + flows):
            node = w.add_task(float(rng.uniform(1e-4, 1e-3)), resource=int(rng.integers(3)))
        else:
            path = rng.choice(links, size=int(rng.integers(1, 3)), replace=False)
            node = w.add_flow(float(rng.uniform(1e5, 1e6)), path.tolist(),
                              latency=float(rng.uniform(0, 2e-5)))
        if nodes and rng.random() < 0.7:
            w.add_dependencies(rng.choice(nodes, size=min(len(nodes), 2), replace=False),
                               node)
        nodes.append(node)
    return w


def _in_epochs(net, work, times):
    """Run ``work`` stopping at every time in ``times``, resuming each time."""
    start = np.full(work.nodes, np.nan)
    finish = np.full(work.nodes, np.nan)
    t0, stops = 0.0, 0
    for t in list(times) + [None]:
        kw = {} if t is None else {"checkpoints": [t], "on_checkpoint": lambda *_: True}
        res = simulate(net, work, t0=t0, **kw)
        merge_times(start, res.start)
        merge_times(finish, res.finish)
        if np.isnan(res.stopped_at):
            return start, finish, stops
        stops += 1
        work, t0 = rest_of(work, res), res.stopped_at


@pytest.mark.parametrize("seed", range(6))
def test_stopping_and_resuming_changes_nothing(seed):
    rng = np.random.default_rng(seed)
    net = Network(rng.uniform(1e9, 1e10, 4), np.zeros(4))
    work = _random_workload(rng).compile()
    whole = simulate(net, work)
    cuts = np.sort(rng.uniform(0, whole.makespan, 5))
    start, finish, stops = _in_epochs(net, work, cuts)
    assert stops == 5
    np.testing.assert_allclose(finish, whole.finish, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(start, whole.start, rtol=1e-9, atol=1e-15)


def test_iteration_graph_in_epochs_equals_one_run():
    cluster = Cluster(servers=8, nics=2, link_bandwidth=100e9)
    job = Job("dlrm", 32, size={"tables": 8, "rows": 10000, "top_layers": 2})
    model = model_of(job)
    fabric = direct_connect(expander_topology(8, 2, 100e9, 1e-6, seed=1), None)
    graph = build_iteration(model, hybrid(model, 8), cluster, job, fabric)
    work = graph.workload.compile()
    whole = simulate(fabric, work)
    start, finish, stops = _in_epochs(fabric, work, np.linspace(0, whole.makespan, 12)[1:-1])
    assert stops == 10
    np.testing.assert_allclose(finish, whole.finish, rtol=1e-9)
    assert np.nanmax(finish) == pytest.approx(whole.makespan, rel=1e-12)


def test_checkpoint_sees_the_bytes_left_and_can_let_go():
    net = Network(np.array([8e9, 8e9]), np.zeros(2))
    w = Workload()
    a = w.add_flow(1e9, [0], latency=0.0)          # 1 s alone
    b = w.add_flow(2e9, [1], latency=0.0)          # 2 s alone
    seen = []
    res = simulate(net, w, checkpoints=iter([0.25, 0.5, 1.5]),
                   on_checkpoint=lambda t, left: seen.append((t, left.tolist())) or t >= 1.5)
    assert [s[0] for s in seen] == [0.25, 0.5, 1.5]
    assert seen[0][1] == [0.75e9, 1.75e9] and seen[2][1] == [0.0, 0.5e9]
    assert res.stopped_at == 1.5 and res.finish[a] == 1.0 and np.isnan(res.finish[b])
    assert res.remaining[b] == 0.5e9 and res.remaining[a] == 0.0


def test_checkpoints_need_a_callback_and_default_runs_are_unchanged():
    net = Network(np.array([8e9]), np.zeros(1))
    w = Workload()
    w.add_flow(1e9, [0])
    with pytest.raises(TopoOptError, match="on_checkpoint"):
        simulate(net, w, checkpoints=[0.5])
    res = simulate(net, w)
    assert np.isnan(res.stopped_at) and res.remaining is None
    with pytest.raises(TopoOptError, match="did not stop"):
        rest_of(w.compile(), res)
