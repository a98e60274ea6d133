"""Packet-level checks on ns-3 (the ``packet`` extra): one flow, fair sharing, ECMP
pinning, host forwarding, tasks, external flows, a collective's bytes, REACT's executor.

All tests share one ns-3 worker process (importing ns-3 takes 10-30 s) and keep to a
few MB of traffic. Select them with ``pytest -m packet``.
"""

import itertools

import numpy as np
import pytest

from topoopt.netsim.ns3 import ns3_available

pytestmark = [pytest.mark.packet,
              pytest.mark.skipif(not ns3_available(),
                                 reason="ns-3 not installed: pip install 'topoopt[packet]'")]

from topoopt.collectives import build_pattern, ring_allreduce  # noqa: E402
from topoopt.fabrics import direct_connect, fat_tree, star  # noqa: E402
from topoopt.netsim.ns3 import DagBuilder, Ns3Config, Ns3Error, Ns3Network, Ns3Worker  # noqa
from topoopt.netsim.wire import WireModel  # noqa: E402
from topoopt.react.flowsim import BackgroundFlows, SimulatedExecutor  # noqa: E402
from topoopt.react.packetsim import Ns3Executor  # noqa: E402
from topoopt.topology.topology import Topology  # noqa: E402
from topoopt.workloads import model_of

B = 100e9
CFG = Ns3Config()
WIRE = WireModel()


def _wire_time(nbytes: float, rate: float = B) -> float:
    return float(WIRE.wire_bytes(nbytes)) * 8 / rate


@pytest.fixture(scope="session")
def worker():
    w = Ns3Worker()
    w.start()
    yield w
    w.close()


def _flows(net, conns, sizes, advance=0.0):
    b = DagBuilder()
    b.add_flows(conns, sizes)
    return net.run([b.build()], advance=advance)[0]


def test_one_flow_on_one_link_takes_its_wire_bytes(worker):
    f = star(2, B)
    net = Ns3Network(f, CFG, worker)
    c = net.connection(0, 1, f.paths(0, 1)[0][0])
    S = 3e6
    cold = _flows(net, [c], [S]).finish[0]
    warm = _flows(net, [c], [S]).finish[0]
    ideal = _wire_time(S) + 2e-6               # 1448 B of 1502 B per packet, two 1 us links
    assert warm == pytest.approx(ideal, rel=0.01)
    assert ideal < cold < ideal + 20e-6        # + handshake and slow start
    st = net.stats()
    assert st["conn_received"][c] == st["conn_sent"][c] == 2 * S
    up = f.uplink[0]
    assert st["link_bytes"][up] == pytest.approx(2 * (S + np.ceil(S / 1448) * 52), rel=0.01)
    assert st["link_drops"].sum() == 0


def test_two_flows_share_a_link_fairly(worker):
    f = star(3, B)
    net = Ns3Network(f, CFG, worker)
    a = net.connection(0, 2, f.paths(0, 2)[0][0])
    b = net.connection(1, 2, f.paths(1, 2)[0][0])
    S = 3e6
    _flows(net, [a, b], [1e6, 1e6])                     # warm both up
    r = _flows(net, [a, b], [S, S])
    alone = _wire_time(S)
    assert r.finish.max() == pytest.approx(2 * alone, rel=0.05)   # the link stays full
    assert r.finish.min() > 1.6 * alone                           # ...and is shared
    assert net.stats()["link_marks"].sum() > 0                    # by DCTCP's ECN


def test_ecmp_pins_flows_to_distinct_spines(worker):
    f = fat_tree(16, B)            # k = 4: 4 pods, 4 core switches, 4 paths between pods
    net = Ns3Network(f, CFG, worker)
    pairs = [(s, 15 - s) for s in range(4)]          # pod 0 -> pod 3
    options = [[p for p, _ in f.paths(s, d)] for s, d in pairs]
    assert all(len(o) == 4 for o in options)
    # one path each, no link shared: each flow crosses its own core switch
    spread = next(c for c in itertools.product(*options)
                  if len(np.unique(np.concatenate(c))) == sum(len(p) for p in c))
    cores = [int(f.dst[p[2]]) for p in spread]
    assert len(set(cores)) == 4
    S = 2e6
    conns = [net.connection(s, d, p, key=("spread", s)) for (s, d), p in zip(pairs, spread)]
    for _ in range(2):                                 # warm up: slow start, DCTCP's alpha
        _flows(net, conns, [S] * 4)
    r = _flows(net, conns, [S] * 4)
    assert r.finish.max() == pytest.approx(_wire_time(S) + 6e-6, rel=0.05)
    st = net.stats()
    for core in cores:           # every core switch forwarded its flow (both runs)
        assert st["link_bytes"][f.src == core].sum() > 3 * S
    # the same flows pinned through one core switch share its links: ~4x longer
    one = [net.connection(s, d, next(p for p in o if int(f.dst[p[2]]) == cores[0]),
                          key=("one", s)) for (s, d), o in zip(pairs, options)]
    _flows(net, one, [S] * 4)
    r1 = _flows(net, one, [S] * 4)
    assert r1.finish.max() > 3.5 * _wire_time(S)


def test_direct_connect_hosts_forward_along_pinned_paths(worker):
    n = 4
    topo = Topology(n, 1, tuple((i, 0, (i + 1) % n, 0) for i in range(n)), B, 1e-6)
    f = direct_connect(topo)                       # one-way ring: 0 -> 1 -> 2 -> 3 -> 0
    net = Ns3Network(f, CFG, worker)
    path = f.paths(0, 2)[0][0]
    c = net.connection(0, 2, path)
    S = 2e6
    _flows(net, [c], [S])
    r = _flows(net, [c], [S])
    assert r.finish[0] == pytest.approx(_wire_time(S) + 2e-6, rel=0.02)
    st = net.stats()
    assert st["link_bytes"][path].min() > 2 * S    # relayed by server 1
    # ACKs go 2 -> 3 -> 0 (no reverse fibre): tiny but present
    back = [int(np.flatnonzero((f.src == 2) & (f.dst == 3))[0])]
    assert 0 < st["link_bytes"][back[0]] < 0.05 * S


def test_tasks_wait_for_their_server_and_release_flows(worker):
    f = star(2, B)
    net = Ns3Network(f, CFG, worker)
    c = net.connection(0, 1, f.paths(0, 1)[0][0])
    b = DagBuilder()
    t1, t2 = b.add_tasks([100e-6, 50e-6], resource=[0, 0], priority=[1.0, 0.0])
    fl = b.add_flows([c], [1e6])
    b.add_dependencies([t1, t2], fl)
    r = net.run([b.build()])[0]
    assert r.start[t2] == pytest.approx(0) and r.start[t1] == pytest.approx(50e-6)
    assert r.start[fl] == pytest.approx(150e-6)
    assert r.finish[fl] > 150e-6 + _wire_time(1e6)


def test_a_degraded_link_and_an_external_flow(worker):
    f = star(3, B)
    net = Ns3Network(f, CFG, worker)
    c = net.connection(0, 1, f.paths(0, 1)[0][0])
    S = 2e6
    _flows(net, [c], [S])
    net.set_capacity(int(f.uplink[0]), 25e9)              # a gray failure
    _flows(net, [c], [S])
    assert _flows(net, [c], [S]).finish[0] == pytest.approx(_wire_time(S, 25e9), rel=0.02)
    net.set_capacity(int(f.uplink[0]), B)
    g = net.connection(2, 1, f.paths(2, 1)[0][0], key="greedy")
    net.set_greedy(g, True)                               # shares 1's downlink
    _flows(net, [c], [S], advance=CFG.background_settle)
    shared = _flows(net, [c], [S]).finish[0]
    assert shared == pytest.approx(2 * _wire_time(S), rel=0.15)
    st = net.stats()
    assert st["conn_received"][g] > S


def test_a_collectives_bytes_all_arrive_in_about_the_fluid_time(worker):
    n, S = 6, 1.2e6
    f = star(n, B)
    p = ring_allreduce(range(n), size=S)
    ex = Ns3Executor(f, range(n), ports=1, config=CFG, worker=worker)
    r = ex.run(p, 2)
    st = ex.network.stats()
    assert st["conn_received"].sum() == st["conn_sent"].sum() == 2 * p.nbytes.sum()
    assert np.all(r.finish >= r.start) and np.all(r.fct > 0)
    fluid = SimulatedExecutor(f, range(n), ports=1, wire=WIRE).run(p, 1).epoch_time[0]
    assert r.epoch_time[1] == pytest.approx(fluid, rel=0.05)


def test_react_executor_with_external_flows_and_ports(worker):
    p = build_pattern("tree", 4, 2e6)
    f = star(6, B)
    bg = [BackgroundFlows(4, 1, 2)]                    # two greedy flows into rank 1
    ns = Ns3Executor(f, range(4), bg, ports=1, seed=1, config=CFG, worker=worker)
    r = ns.run(p, 4)
    assert r.fct.shape == (4, p.edges_count) and ns.epoch == 4
    fl = SimulatedExecutor(f, range(4), bg, ports=1, seed=1, wire=WIRE).run(p, 1)
    # new flows take their share from established ones slowly (DCTCP): ns-3 is a bit slower
    assert r.epoch_time[1:].mean() == pytest.approx(fl.epoch_time[0], rel=0.2)
    into1 = p.dst == 1
    assert r.fct[1:, into1].mean() > 1.5 * r.fct[1:, ~into1].mean()
    four = Ns3Executor(f, range(4), bg, ports=4, seed=1, config=CFG, worker=worker)
    assert four.run(p, 2).fct.shape == (2, p.edges_count)
    assert len(four.network.conn_endpoints) > len(ns.network.conn_endpoints)


def test_a_replaced_network_refuses_to_run(worker):
    f = star(2, B)
    old = Ns3Network(f, CFG, worker)
    c = old.connection(0, 1, f.paths(0, 1)[0][0])
    _flows(old, [c], [1e5])
    new = Ns3Network(f, CFG, worker)
    _flows(new, [new.connection(0, 1, f.paths(0, 1)[0][0])], [1e5])
    with pytest.raises(Ns3Error, match="replaced"):
        _flows(old, [c], [1e5])


def _tiny_plan(directory):
    from topoopt.cluster import Cluster, Job
    from topoopt.export.plan_dir import write_plan
    from topoopt.planners.planner import plan

    cluster = Cluster(servers=4, nics=2, link_bandwidth=B)
    # a batch large enough that spreading the work beats running it all on one server:
    # with a small batch the best plan sends nothing and leaves ns-3 nothing to carry
    job = Job("dlrm", batch_per_gpu=4096, size={"tables": 4, "rows": 100000, "dim": 16,
                                                "bag": 4, "top_width": 512, "bottom_width": 64,
                                                "top_layers": 2, "bottom_layers": 2})
    p = plan(cluster, job, budget=10, rounds=1, seed=0, baselines=())
    write_plan(p, directory, exports=False, plots=False)
    return p


def test_validate_replays_a_plan_close_to_its_prediction(worker, tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from topoopt.cli import main
    from topoopt.netsim.ns3 import session

    p = _tiny_plan(tmp_path / "plan")
    monkeypatch.setattr(session, "default_worker", lambda: worker)
    out = tmp_path / "val.json"
    r = CliRunner().invoke(main, ["validate", str(tmp_path / "plan"), "--fabric", "topoopt",
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    row = json.loads(out.read_text())["fabrics"][0]
    assert row["fabric"] == "topoopt" and row["flows"] > 0
    predicted = p.fabric("topoopt").estimate.total
    assert row["predicted_s"] == pytest.approx(predicted)
    assert row["ns3_s"] == pytest.approx(predicted, rel=0.1)       # rings, MP, compute
    assert abs(row["error"]) < 0.05                                 # with wire overheads
    assert "topoopt" in r.output and "ns-3" in r.output


def test_replay_runs_rings_step_by_step(worker):
    from topoopt.cluster import Cluster, Job
    from topoopt.plans.replay import replay_iteration
    from topoopt.strategy import data_parallel

    cluster = Cluster(servers=4, nics=1, link_bandwidth=B)
    job = Job("dlrm", batch_per_gpu=16,       # ~5 MB of AllReduce, no MP
              size={"tables": 4, "rows": 1000, "dim": 16, "bag": 4, "top_width": 256,
                    "bottom_width": 128, "top_layers": 2, "bottom_layers": 2})
    model = model_of(job)
    f = star(4, B)
    dp = data_parallel(model, 4)
    hops = replay_iteration(model, dp, cluster, job, f, config=Ns3Config(mtu=9000),
                            worker=worker, wire=WireModel(mtu=9000))
    steps = replay_iteration(model, dp, cluster, job, f, config=Ns3Config(mtu=9000),
                             worker=worker, ring_mode="steps")
    assert hops.packet.allreduce_bytes == steps.packet.allreduce_bytes > 0
    assert hops.packet.total == pytest.approx(hops.flow.total, rel=0.1)
    assert steps.flows > hops.flows               # 2(g-1) steps of g flows vs g hops
    assert steps.packet.total >= hops.packet.total * 0.95


def test_react_simulate_cli_on_ns3(worker, tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from topoopt.cli import main
    from topoopt.netsim.ns3 import session

    monkeypatch.setattr(session, "default_worker", lambda: worker)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["react", "simulate", "--backend", "ns3", "--fabric", "star",
                                  "--collective", "tree", "--nodes", "4", "--size", "1MB",
                                  "--congested", "1", "--p", "2", "--epochs", "12",
                                  "--warmup", "6", "--mtu", "9000", "--json", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert len(doc["epoch_time_baseline_s"]) == len(doc["epoch_time_react_s"]) == 12
    assert doc["baseline"]["mean_s"] > 0 and "with REACT" in r.output


def test_shard_tuner_on_ns3_moves_bytes_off_a_slow_fibre_like_the_flow_level(worker):
    # a 6-server shard of two stride rings, one fibre at 30%: both backends re-split the
    # bytes away from the slow ring and gain about the same (flows of 4 MB: TCP's
    # per-flow start-up, which the fluid model lacks, is small next to them)
    from topoopt.react.classsim import ClassExecutor
    from topoopt.react.loop import ReactParams
    from topoopt.react.shard import ShardLayout, run_shard_react, shard_fabric

    n = 6
    links = tuple((i, k, (i + s) % n, k) for k, s in enumerate((1, 5)) for i in range(n))
    topo = Topology(n, 2, links, B, 1e-6)
    layout = ShardLayout.of(topo, [list(range(n)), [(5 * i) % n for i in range(n)]], 48e6)
    world = shard_fabric(topo, tx={(2, 0): 30e9})
    params = ReactParams(batch=3)
    gains = {}
    for name, make in (("flow", lambda: ClassExecutor(world, range(n), ports=1)),
                       ("ns3", lambda: Ns3Executor(world, range(n), ports=1,
                                                   config=Ns3Config(mtu=9000), worker=worker))):
        base = run_shard_react(make(), layout, 6, params, enabled=False).epoch_time[3:].mean()
        tuned = run_shard_react(make(), layout, 6, params)
        assert "resplit" in tuned.changes[0][1][0]
        gains[name] = base / tuned.epoch_time[3:].mean() - 1
    assert gains["flow"] > 1.0                  # 2 / 1.3 - 1 of the bytes' time, less latency
    assert gains["ns3"] == pytest.approx(gains["flow"], rel=0.1)
