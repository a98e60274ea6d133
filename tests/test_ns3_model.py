"""The ns-3 backend's pure-Python side (no ns-3 needed): cables, address planes, the
wire model of the flow-level simulator, settings and the missing-extra message."""

import numpy as np
import pytest
from click.testing import CliRunner

from topoopt.collectives import ring_allreduce
from topoopt.errors import ConfigError, TopoOptError
from topoopt.fabrics import direct_connect, expander, fat_tree, star
from topoopt.netsim import Workload, simulate
from topoopt.netsim.ns3 import Ns3Config, PathPlanes, network_spec, plane_address
from topoopt.netsim.ns3.session import DagBuilder
from topoopt.netsim.wire import WireModel, ack_routes, reverse_link_ids, wire_workload
from topoopt.react.flowsim import BackgroundFlows, EcmpRouter, SimulatedExecutor
from topoopt.topology.topology import Topology


def _ring_topology(n: int, both: bool = True) -> Topology:
    links = [(i, 0, (i + 1) % n, 0) for i in range(n)]
    if both:
        links += [(i, 1, (i - 1) % n, 1) for i in range(n)]
    return Topology(n, 2 if both else 1, tuple(links), 100e9, 1e-6)


@pytest.mark.parametrize("fabric", [star(5, [10e9, 20e9, 30e9, 40e9, 50e9]),
                                    fat_tree(16, 100e9),
                                    fat_tree(32, 100e9, oversubscription=2),
                                    expander(12, 3, 100e9, seed=1),
                                    direct_connect(_ring_topology(6, both=False))])
def test_every_link_is_one_cable_end_with_its_rate(fabric):
    s = network_spec(fabric)
    c, e = s.link_cable, s.link_end
    rate = np.where(e == 0, s.rate_ab[c], s.rate_ba[c])
    assert np.array_equal(rate, fabric.capacity)
    assert np.array_equal(s.delay[c], fabric.latency)
    # a cable carries at most one link per direction
    assert len(set(zip(c.tolist(), e.tolist()))) == fabric.links
    rev = reverse_link_ids(fabric.src, fabric.dst)
    # a link and its reverse share a cable; a one-way fibre gets its own (back unrouted)
    assert s.cables == fabric.links - int((rev >= 0).sum()) // 2
    assert np.array_equal(s.queue[:fabric.servers] == 0, np.ones(fabric.servers, bool))


def test_planes_are_in_trees_and_spread_ecmp_paths():
    f = fat_tree(16, 100e9)                       # k = 4: 4 paths between pods
    pp = PathPlanes(f.src, f.dst)
    rev = reverse_link_ids(f.src, f.dst)
    paths = [np.asarray(p) for p, _ in f.paths(0, 15)]
    planes = [pp.pin(0, 15, p, rev[p[::-1]]) for p in paths]
    assert len(paths) == 4 and sorted(planes) == [0, 1, 2, 3]
    assert pp.pin(0, 15, paths[2], rev[paths[2][::-1]]) == planes[2]      # stable
    # each (destination, plane) is an in-tree: one next hop per node, leading to it
    for (d, k), tree in pp.maps.items():
        for node in tree:
            seen, u = set(), node
            while u != d:
                assert u not in seen
                seen.add(u)
                u = int(f.dst[tree[u]])
    addresses, routes = pp.drain()
    assert sorted(addresses) == [(0, k) for k in range(4)] + [(15, k) for k in range(4)]
    assert len(routes) == len(set(routes)) and pp.drain() == ([], [])
    assert plane_address(15, 3) == (10 << 24) | (103 << 16) | 15
    with pytest.raises(TopoOptError):
        pp.pin(0, 15, paths[0][:-1], rev[paths[0][::-1]])      # does not reach 15


def test_wire_model_single_flow_and_ack_load():
    m = WireModel()
    f = star(2, 100e9)
    w = Workload()
    w.add_flows([4e6], f.route([0], [1]))
    r = simulate(f, wire_workload(w.compile(), f, [0], [1], m))
    packets = np.ceil(4e6 / 1448)
    assert r.finish[0] == pytest.approx((4e6 + packets * 54) * 8 / 100e9 + 2e-6)
    # two opposite flows: each link carries one flow's data and the other's ACKs
    w = Workload()
    w.add_flows([4e6, 4e6], f.route([0, 1], [1, 0]))
    r = simulate(f, wire_workload(w.compile(), f, [0, 1], [1, 0], m))
    data = 4e6 + packets * 54
    assert r.finish[0] == pytest.approx((data + m.ack_weight * data) * 8 / 100e9 + 2e-6,
                                        rel=1e-6)
    assert r.link_bytes.sum() == pytest.approx(2 * 2 * data * (1 + m.ack_weight))


def test_ack_routes_fall_back_to_the_fabric_on_one_way_fibres():
    f = direct_connect(_ring_topology(4, both=False))        # 0->1->2->3->0 only
    fwd = f.route([0], [1])
    back = ack_routes(f, fwd, [0], [1])
    hops = [(int(f.src[x]), int(f.dst[x])) for x in back.link]
    assert sorted(hops) == [(1, 2), (2, 3), (3, 0)]


def test_wire_executor_keeps_flow_ids_and_adds_overheads():
    place = range(6)
    p = ring_allreduce(range(6), size=6e6)
    fluid = SimulatedExecutor(star(6, 100e9), place).run(p, 1)
    wired = SimulatedExecutor(star(6, 100e9), place, wire=WireModel()).run(p, 1)
    assert wired.fct.shape == fluid.fct.shape
    ratio = wired.epoch_time[0] / fluid.epoch_time[0]
    assert 1.03 < ratio < 1.07      # 3.7% headers + ~1.8% ACKs, latency not scaled
    bg = [BackgroundFlows(6, 0, 2)]
    slow = SimulatedExecutor(star(7, 100e9), place, bg, wire=WireModel()).run(p, 1)
    assert slow.epoch_time[0] > 1.5 * wired.epoch_time[0]   # 2 external flows into rank 0


def test_ns3_executor_draws_the_flow_level_ports():
    f = fat_tree(128, 100e9, k=8)
    router = EcmpRouter(f, 4, seed=3)
    src, dst = np.array([0, 20, 40]), np.array([127, 100, 60])
    routes = router.routes(0, src, dst, epoch=5)
    choice = np.random.default_rng([3, 0, 5, 7]).integers(0, 4, size=3)  # (seed, job, epoch)
    assert np.array_equal(router.epoch_choices(0, 5, 3), choice)
    for e in range(3):
        want = np.sort(router.connections(0, e, int(src[e]), int(dst[e]))[choice[e]])
        assert np.array_equal(np.sort(routes.row(e)[0]), want)


def test_dag_builder_validates():
    b = DagBuilder()
    ids = b.add_flows([0, 1], [1e6, 2e6])
    with pytest.raises(TopoOptError):
        b.add_flows([0], [-1.0])
    b.add_dependencies(ids[0], ids[0])
    with pytest.raises(TopoOptError):
        b.build()


def test_ns3_config_rejects_bad_settings():
    assert Ns3Config(mtu=9000).mss == 8948
    with pytest.raises(ConfigError, match="ns3.red_max"):
        Ns3Config(red_min=60, red_max=32)
    with pytest.raises(ConfigError, match="ns3.mtu"):
        Ns3Config(mtu=100)


def test_cli_without_ns3_says_how_to_install(monkeypatch):
    from topoopt.cli import main
    from topoopt.netsim.ns3 import worker

    monkeypatch.setattr(worker, "ns3_available", lambda: False)
    r = CliRunner().invoke(main, ["react", "simulate", "--backend", "ns3", "--epochs", "2",
                                  "--warmup", "0"])
    assert r.exit_code == 2 and "pip install 'topoopt[packet]'" in r.output
    assert "Traceback" not in r.output

