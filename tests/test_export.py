"""Exports (issue 5 item 5): every file parsed back and cross-checked against the plan."""

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topoopt.cluster import Cluster
from topoopt.errors import ConfigError, PlanCheckError
from topoopt.export import (
    ExportSkipped,
    check_exports,
    check_msccl_algo,
    check_msccl_allreduce,
    check_patch_panel,
    cross_connects,
    format_msccl_xml,
    format_patch_panel,
    format_polatis_netconf,
    nccl_ring,
    ocs_layout,
    parse_msccl_xml,
    parse_polatis_netconf,
    parse_scpi,
    parse_sonic_ocs,
    parse_tl1,
    plan_msccl_allreduce,
    rank_order,
    render_exports,
    ring_allreduce_algo,
    simulate_msccl,
    write_exports,
)
from topoopt.export.bundle import OCS_FORMATS
from topoopt.export.msccl import MscclStep, MscclThreadBlock
from topoopt.export.ocs import check_cross_connects, check_ocs_port_map, format_ocs_port_map
from topoopt.export.patch_panel import panel_port, parse_patch_panel
from topoopt.export.rank_order import check_rank_order
from topoopt.export.scpi import format_scpi
from topoopt.export.sonic_ocs import format_sonic_ocs
from topoopt.export.tl1 import format_tl1
from topoopt.topology.topology import Topology
from topoopt.workloads import model_of


def ring_plan(n, strides, d=None, gpus=2, mp_pairs=(), ports=None):
    """Ring permutations i -> i + p, ring r on NIC port ports[r] of every server, plus
    full-duplex MP links on a port no ring uses; rings = {all servers: ring orders}."""
    d = d or len(strides) + (1 if mp_pairs else 0)
    ports = ports or list(range(len(strides)))
    links, labels, orders = [], [], []
    for r, p in enumerate(strides):
        for i in range(n):
            links.append((i, ports[r], (i + p) % n, ports[r]))
            labels.append(f"ring:p={p}")
        orders.append(tuple((p * i) % n for i in range(n)))
    mp_port = min(set(range(d)) - set(ports), default=None)
    for a, b in mp_pairs:
        links += [(a, mp_port, b, mp_port), (b, mp_port, a, mp_port)]
        labels += ["mp", "mp"]
    topo = Topology(n, d, tuple(links), 100e9, labels=tuple(labels))
    cluster = Cluster(servers=n, nics=d, link_bandwidth=100e9, gpus_per_server=gpus)
    return topo, {tuple(range(n)): tuple(orders)}, cluster


# ------------------------------------------------------------------ port maps


def test_panel_port_map_documented_values():
    assert panel_port(0, 0, "TX", nics=4) == ("TX01", 1)
    assert panel_port(0, 0, "RX", nics=4) == ("RX01", 1)
    assert panel_port(35, 3, "TX", nics=4) == ("TX01", 144)      # e = 143, last of panel 1
    assert panel_port(36, 0, "RX", nics=4) == ("RX02", 1)        # e = 144, first of panel 2


def test_ocs_layout_single_unit_polatis_and_sonic_numbers():
    lay = ocs_layout(16, 4, 320)
    assert (lay.rails_per_unit, lay.units) == (4, 1)
    assert lay.ingress(0, 0) == (0, 1) and lay.egress(0, 0) == (0, 321)
    assert lay.ingress(15, 3) == (0, 64) and lay.egress(15, 3) == (0, 384)
    # ingress/egress -> NIC is the inverse map
    for s in range(16):
        for p in range(4):
            assert lay.tx_of(*lay.ingress(s, p)) == (s, p)
            assert lay.rx_of(*lay.egress(s, p)) == (s, p)
    assert lay.tx_of(0, 65) is None  # cabled to nothing


def test_ocs_layout_splits_rails_over_units():
    lay = ocs_layout(100, 4, 320)              # 400 NIC ports > 320: 3 rails per unit
    assert (lay.rails_per_unit, lay.units) == (3, 2)
    assert lay.ingress(7, 2) == (0, 2 * 100 + 7 + 1)
    assert lay.ingress(7, 3) == (1, 8) and lay.egress(7, 3) == (1, 328)
    with pytest.raises(PlanCheckError, match="do not fit"):
        ocs_layout(400, 1, 320)


def test_port_map_csv_is_a_bijection_and_reads_back():
    lay = ocs_layout(10, 3, 16)                # 1 rail per unit -> 3 units
    text = format_ocs_port_map(lay)
    check_ocs_port_map(text, lay)
    rows = text.splitlines()[1:]
    assert len(rows) == 10 * 3 * 2
    assert len({tuple(r.split(",")[4:6]) for r in rows}) == len(rows)   # no port twice
    bad = text.replace("server-003,3,1,TX,ocs1,4,4A", "server-003,3,1,TX,ocs1,5,5A")
    with pytest.raises(PlanCheckError):
        check_ocs_port_map(bad, lay)


# ------------------------------------------------------------------ patch panel


def test_patch_panel_rows_and_cross_check():
    topo, _, _ = ring_plan(6, [1, 5], mp_pairs=[(0, 3)])
    text = format_patch_panel(topo)
    cords = parse_patch_panel(text)
    assert len(cords) == len(topo.links)
    assert [c.link for c in cords] == list(topo.links)
    c = cords[0]   # server 0 port 0 TX -> server 1 port 0 RX, d = 3
    assert (c.a_panel, c.a_panel_port, c.b_panel, c.b_panel_port) == ("TX01", 1, "RX01", 4)
    check_patch_panel(text, topo)
    lines = text.splitlines()
    with pytest.raises(PlanCheckError, match="used by patch cords"):
        check_patch_panel("\n".join(lines + [lines[1]]), topo)          # a row twice
    with pytest.raises(PlanCheckError, match="missing links"):
        check_patch_panel("\n".join(lines[:-1]), topo)                  # a row missing
    moved = lines[1].replace("RX01,4,", "RX01,5,")
    with pytest.raises(PlanCheckError, match="is not on"):
        check_patch_panel("\n".join([lines[0], moved] + lines[2:]), topo)


# ------------------------------------------------------------------ OCS formats


def test_ocs_formats_agree_and_are_bijective():
    topo, _, _ = ring_plan(8, [1, 3], mp_pairs=[(0, 4), (2, 6)])
    lay = ocs_layout(8, 3, 320)
    cc = cross_connects(topo, lay)
    assert len(cc) == len(topo.links)
    readers = [parse_polatis_netconf(format_polatis_netconf(cc)), parse_scpi(format_scpi(cc)),
               parse_tl1(format_tl1(cc)), parse_sonic_ocs(format_sonic_ocs(cc, 320), 320)]
    for pairs in readers:
        assert sorted(pairs) == sorted((c.ingress, c.egress) for c in cc)
        check_cross_connects({0: pairs}, topo, lay)
        assert len({i for i, _ in pairs}) == len({e for _, e in pairs}) == len(pairs)
    # link 0 is server 0 port 0 TX -> server 1 port 0 RX: ingress 1, egress 320 + 2
    assert (cc[0].ingress, cc[0].egress) == (1, 322)


def test_ocs_vendor_syntax():
    topo, _, _ = ring_plan(4, [1])
    cc = cross_connects(topo, ocs_layout(4, 1, 320))
    assert format_scpi(cc).splitlines()[0] == ":oxc:swit:conn:add (@1),(@322)"
    assert format_tl1(cc).splitlines()[:2] == ["ENT-PATCH::1,322:1:;", "ENT-PATCH::2,323:2:;"]
    xml = format_polatis_netconf(cc)
    assert '<cross-connects xmlns="http://www.polatis.com/yang/optical-switch">' in xml
    assert "<pair>" in xml and "<target>" in xml and "<running/>" in xml
    sonic = json.loads(format_sonic_ocs(cc, 320))
    assert sonic["OCS_CROSS_CONNECT"]["1A-2B"] == {"a_side": "1A", "b_side": "2B"}
    assert sonic["OCS_PORT"]["2B"]["state"] == "normal"
    # the pre-2017-08-04 list name is read too
    old = xml.replace("<pair>", "<pairs>").replace("</pair>", "</pairs>")
    assert parse_polatis_netconf(old) == parse_polatis_netconf(xml)


def test_ocs_checks_catch_corruption():
    topo, _, _ = ring_plan(5, [1, 2])
    lay = ocs_layout(5, 2, 320)
    cc = cross_connects(topo, lay)
    pairs = [(c.ingress, c.egress) for c in cc]
    with pytest.raises(PlanCheckError, match="egress port .* used twice"):
        check_cross_connects({0: pairs + [(pairs[0][0] + 50, pairs[0][1])]}, topo, lay)
    with pytest.raises(PlanCheckError, match="do not match"):
        check_cross_connects({0: pairs[:-1]}, topo, lay)
    swapped = [(pairs[0][0], pairs[1][1]), (pairs[1][0], pairs[0][1])] + pairs[2:]
    with pytest.raises(PlanCheckError, match="do not match"):
        check_cross_connects({0: swapped}, topo, lay)
    with pytest.raises(PlanCheckError, match="SCPI line 1"):
        parse_scpi(":oxc:swit:conn:add (@1,2),(@322,323)\n")
    with pytest.raises(PlanCheckError, match="tag 1 used twice"):
        parse_tl1("ENT-PATCH::1,322:1:;\nENT-PATCH::2,323:1:;\n")
    sonic = json.loads(format_sonic_ocs(cc, 320))
    sonic["OCS_CROSS_CONNECT"]["1A-9B"] = sonic["OCS_CROSS_CONNECT"].pop("1A-2B")
    with pytest.raises(PlanCheckError, match="is not a_side-b_side"):
        parse_sonic_ocs(json.dumps(sonic), 320)
    sonic = json.loads(format_sonic_ocs(cc, 320))
    sonic["OCS_PORT"]["1A"]["state"] = "powered_off_typo"
    with pytest.raises(PlanCheckError, match="state"):
        parse_sonic_ocs(json.dumps(sonic), 320)
    with pytest.raises(PlanCheckError, match="cross-connects"):
        parse_polatis_netconf(format_polatis_netconf(cc).replace("optical-switch", "other"))


def test_multi_unit_ocs_and_links_across_units(tmp_path):
    # 12 servers x 4 ports on 16-port units: 1 rail per unit, 4 units
    topo, rings, cluster = ring_plan(12, [1, 5, 7], d=4, mp_pairs=[(0, 6)])
    paths = write_exports(tmp_path, topo, rings, cluster, ocs_ports=16)
    assert {p.name for p in paths} >= {f"ocs{u}.{s}" for u in range(4) for s in OCS_FORMATS}
    assert "ocs/ocs3.tl1" in check_exports(tmp_path, topo, rings, cluster, ocs_ports=16)
    # one ring on ports 0 -> 1 cannot be a cross-connect when ports 0 and 1 sit on two units
    links = tuple((i, 0, (i + 1) % 4, 1) for i in range(4))
    bad = Topology(4, 2, links, 100e9)
    with pytest.raises(PlanCheckError, match="cannot span two OCS units"):
        cross_connects(bad, ocs_layout(4, 2, 4))
    out = tmp_path / "skip"
    with pytest.warns(ExportSkipped, match="cannot span"):
        paths = write_exports(out, bad, {(0, 1, 2, 3): ((0, 1, 2, 3),)},
                              Cluster(servers=4, nics=2, link_bandwidth=1e9), ocs_ports=4)
    assert not (out / "ocs").exists() and (out / "patch_panel.csv").exists()
    with pytest.raises(PlanCheckError, match="cannot span"):
        write_exports(tmp_path / "strict", bad, {}, Cluster(servers=4, nics=2, link_bandwidth=1e9),
                      ocs_ports=4, ocs=True)
    assert not (tmp_path / "strict").exists()


# ------------------------------------------------------------------ rank order / NCCL


def test_nccl_node_ring_model():
    # ranks laid out host by host: NCCL rings the hosts in file order
    assert nccl_ring((2, 0, 1), (0, 1, 2), gpus_per_server=4) == (2, 0, 1)
    # a subgroup's communicator sorts its ranks: hosts in the order the file lists them
    assert nccl_ring((5, 3, 0, 4, 1, 2), (0, 1, 3), gpus_per_server=2) == (3, 0, 1)


def test_rank_order_follows_first_ring_of_largest_group():
    rings = {(0, 1, 2, 3, 4, 5): ((0, 5, 4, 3, 2, 1), (0, 2, 4, 1, 3, 5)), (6, 7): ((6, 7),)}
    order = rank_order(8, rings)
    assert order == (0, 5, 4, 3, 2, 1, 6, 7)
    check_rank_order(order, 8, rings, gpus_per_server=8)
    assert nccl_ring(order, (0, 1, 2, 3, 4, 5), 8) == (0, 5, 4, 3, 2, 1)
    with pytest.raises(PlanCheckError, match="NCCL would ring"):
        check_rank_order((0, 1, 2, 3, 4, 5, 6, 7), 8, rings, gpus_per_server=8)
    with pytest.raises(PlanCheckError, match="each of the 8 servers"):
        check_rank_order((0, 5, 4, 3, 2, 1, 6), 8, rings, gpus_per_server=8)
    assert rank_order(3, {}) == (0, 1, 2)


# ------------------------------------------------------------------ MSCCL


def one_hot_allreduce(algo):
    """GPU g's chunk x is e_g scaled by a distinct prime: the sum is exact and names
    every contribution and its chunk."""
    primes = [p for p in range(2, 2000) if all(p % q for q in range(2, int(p**0.5) + 1))]
    chunks = algo.nchunksperloop
    inputs = np.zeros((algo.ngpus, chunks, algo.ngpus), dtype=np.int64)
    for g in range(algo.ngpus):
        inputs[g, :, g] = primes[:chunks]
    for inplace in (False, True):
        out = simulate_msccl(algo, inputs, inplace=inplace)
        assert (out == np.array(primes[:chunks])[None, :, None]).all()


def test_msccl_ring_allreduce_small_known_schedule():
    algo = ring_allreduce_algo([(0, 1, 2, 3)])
    assert (algo.ngpus, algo.nchannels, algo.nchunksperloop) == (4, 1, 4)
    tb = algo.gpus[0].tbs[0]
    assert (tb.send, tb.recv, tb.chan) == (1, 3, 0)
    assert [s.type for s in tb.steps] == ["s", "rrs", "rrs", "rrcs", "rcs", "rcs", "r"]
    assert [s.srcoff for s in tb.steps[:4]] == [0, 3, 2, 1]     # reduce-scatter chunks
    assert [s.dstoff for s in tb.steps[3:]] == [1, 0, 3, 2]     # all-gather chunks
    one_hot_allreduce(algo)


@pytest.mark.parametrize("k,rings,max_steps", [(2, 1, 64), (5, 2, 64), (9, 3, 6), (40, 1, 64)])
def test_msccl_all_rings_at_once_is_an_allreduce(k, rings, max_steps):
    strides = [p for p in range(1, k) if math.gcd(p, k) == 1][:rings]
    orders = [tuple((p * i) % k for i in range(k)) for p in strides]
    algo = ring_allreduce_algo(orders, max_steps=max_steps)
    segments = math.ceil((2 * k - 1 - max_steps) / (max_steps - 1)) + 1 if 2 * k - 1 > max_steps else 1
    assert algo.nchannels == len(orders) * segments
    assert algo.nchunksperloop == len(orders) * k
    assert max(len(tb.steps) for tb in algo.gpus[0].tbs) <= max_steps
    check_msccl_algo(algo, max_steps=max_steps)
    one_hot_allreduce(algo)
    check_msccl_allreduce(algo)
    again = parse_msccl_xml(format_msccl_xml(algo))
    assert again.gpus == algo.gpus and again.nchannels == algo.nchannels


def test_msccl_xml_obeys_mscclparser_rules():
    algo = ring_allreduce_algo([(0, 2, 1)])
    text = format_msccl_xml(algo)
    assert text.startswith("<algo ") and "\t" not in text and "<?xml" not in text
    for attr in ("name=", "proto=", "nchannels=", "nchunksperloop=", "ngpus=", "coll=",
                 "inplace=", "outofplace=", "minBytes=", "maxBytes="):
        assert attr in text.splitlines()[0]
    with pytest.raises(PlanCheckError, match="start with <algo"):
        parse_msccl_xml('<?xml version="1.0"?>\n' + text)
    with pytest.raises(PlanCheckError, match="not an element"):
        parse_msccl_xml(text.replace("    <tb", "\t<tb"))
    with pytest.raises(PlanCheckError, match="not an element"):
        parse_msccl_xml(text.replace('cnt="1"', "cnt='1'", 1))
    with pytest.raises(PlanCheckError, match="missing attribute hasdep"):
        parse_msccl_xml(text.replace(' hasdep="0"/>', "/>", 1))
    with pytest.raises(PlanCheckError, match="closes"):
        parse_msccl_xml(text.replace("</tb>", "</gpu>", 1))


def test_msccl_checks_catch_broken_schedules():
    algo = ring_allreduce_algo([(0, 1, 2, 3)])
    gpu0 = algo.gpus[0]
    tb = gpu0.tbs[0]

    def with_steps(steps, tb_=tb):
        g = gpu0.__class__(gpu0.id, gpu0.i_chunks, gpu0.o_chunks, gpu0.s_chunks,
                           (MscclThreadBlock(tb_.id, tb_.send, tb_.recv, tb_.chan, tuple(steps)),))
        return algo.__class__(**{**algo.__dict__, "gpus": (g,) + algo.gpus[1:]})

    dropped = with_steps(tb.steps[:-1])                         # one receive missing
    with pytest.raises(PlanCheckError, match="gpu 3 sends 6 messages to gpu 0 on channel 0, which receives 5"):
        check_msccl_algo(dropped)
    wrong = list(tb.steps)
    wrong[1] = MscclStep(1, "rrs", "i", 0, "i", 0)              # reduce chunk 0 twice
    with pytest.raises(PlanCheckError, match="without the sum"):
        check_msccl_allreduce(with_steps(wrong))
    dep = list(tb.steps)
    dep[0] = MscclStep(0, "s", "i", 0, "i", 0, depid=0, deps=1)
    with pytest.raises(PlanCheckError, match="depends on missing step"):
        check_msccl_algo(with_steps(dep))
    oob = list(tb.steps)
    oob[2] = MscclStep(2, "rrs", "i", 9, "i", 9)
    with pytest.raises(PlanCheckError, match="outside"):
        check_msccl_algo(with_steps(oob))


def test_msccl_cut_dependency_needs_hasdep():
    algo = ring_allreduce_algo([tuple(range(6))], max_steps=6)      # 11 ops -> 3 segments
    tb0, tb1 = algo.gpus[0].tbs[:2]
    assert tb0.steps[-1].type == "rrc" and tb0.steps[-1].hasdep == 1
    assert (tb1.steps[0].type, tb1.steps[0].depid, tb1.steps[0].deps) == ("s", 0, len(tb0.steps) - 1)
    assert tb0.chan != tb1.chan and (tb0.send, tb0.recv) == (tb1.send, tb1.recv)
    no_flag = tb0.steps[:-1] + (MscclStep(**{**tb0.steps[-1].__dict__, "hasdep": 0}),)
    gpu0 = algo.gpus[0]
    g = gpu0.__class__(0, gpu0.i_chunks, gpu0.o_chunks, 0,
                       (MscclThreadBlock(0, tb0.send, tb0.recv, 0, no_flag),) + gpu0.tbs[1:])
    broken = algo.__class__(**{**algo.__dict__, "gpus": (g,) + algo.gpus[1:]})
    with pytest.raises(PlanCheckError, match='hasdep="1"'):
        check_msccl_algo(broken)
    with pytest.raises(PlanCheckError, match="deadlocks"):
        simulate_msccl(broken, np.ones((6, 6, 1), dtype=np.int64))


def test_msccl_limits():
    k = 128
    orders = [tuple((p * i) % k for i in range(k)) for p in (1, 3, 5, 7, 9, 11, 13)]
    with pytest.raises(PlanCheckError, match="needs 35 channels"):
        ring_allreduce_algo(orders)                     # 7 rings x 5 segments > 32
    algo = ring_allreduce_algo(orders[:2])
    assert algo.nchannels == 10 and max(len(t.steps) for t in algo.gpus[0].tbs) == 64


def test_msccl_gpu_granularity_matches_rank_order(tmp_path):
    topo, rings, cluster = ring_plan(5, [1, 2], gpus=2)
    algo, ranks = plan_msccl_allreduce(rings, cluster.gpus_per_server, "gpu")
    assert algo.ngpus == 10 and ranks[:3] == ((0, 0), (0, 1), (1, 0))
    check_msccl_allreduce(algo)
    write_exports(tmp_path, topo, rings, cluster, msccl_granularity="gpu")
    check_exports(tmp_path, topo, rings, cluster)


# ------------------------------------------------------------------ the whole directory


def test_write_and_check_exports(tmp_path):
    topo, rings, cluster = ring_plan(8, [1, 3], mp_pairs=[(0, 4), (1, 5)])
    rings[(0, 1, 2, 3)] = ((0, 2, 1, 3),)
    names = [f"gpu-node-{i}" for i in range(8)]
    paths = write_exports(tmp_path, topo, rings, cluster, names=names)
    rel = sorted(str(p.relative_to(tmp_path)) for p in paths)
    assert rel == sorted(["patch_panel.csv", "rank_order.txt", "hostfile", "msccl_allreduce.xml",
                          "ocs/port_map.csv"] + [f"ocs/ocs0.{s}" for s in OCS_FORMATS])
    assert sorted(check_exports(tmp_path, topo, rings, cluster, names=names)) == rel
    assert (tmp_path / "rank_order.txt").read_text().splitlines()[:2] == ["gpu-node-0", "gpu-node-1"]
    assert (tmp_path / "hostfile").read_text().splitlines()[0] == "gpu-node-0 slots=2"
    # a corrupted OCS file is caught
    scpi = tmp_path / "ocs" / "ocs0.scpi"
    scpi.write_text(scpi.read_text().replace("(@1),", "(@2),", 1))
    with pytest.raises(PlanCheckError):
        check_exports(tmp_path, topo, rings, cluster, names=names)


def test_exports_are_deterministic():
    topo, rings, cluster = ring_plan(6, [1, 5], mp_pairs=[(0, 3)])
    a = render_exports(topo, rings, cluster).files
    b = render_exports(topo, rings, cluster).files
    assert a == b


@pytest.mark.parametrize("mutate,error", [
    (lambda t: Topology(t.servers, t.ports, t.links + ((0, 0, 3, 1),), t.link_bandwidth),
     "already transmits"),                                   # port 0 of server 0 twice
    (lambda t: Topology(t.servers, t.ports, t.links + ((2, 1, 2, 1),), t.link_bandwidth),
     "to itself"),
    (lambda t: Topology(t.servers + 1, t.ports, t.links, t.link_bandwidth), "cluster has"),
])
def test_bad_topology_raises_before_writing(tmp_path, mutate, error):
    topo, rings, cluster = ring_plan(6, [1, 5])
    out = tmp_path / "plan"
    with pytest.raises(PlanCheckError, match=error):
        write_exports(out, mutate(topo), rings, cluster)
    assert not out.exists()


def test_bad_rings_and_names_raise_before_writing(tmp_path):
    topo, rings, cluster = ring_plan(6, [1])
    out = tmp_path / "plan"
    with pytest.raises(PlanCheckError, match="Hamiltonian"):
        write_exports(out, topo, {tuple(range(6)): ((0, 1, 2, 3, 4, 4),)}, cluster)
    with pytest.raises(PlanCheckError, match="sorted tuple"):
        write_exports(out, topo, {(3, 1): ((1, 3),)}, cluster)
    with pytest.raises(ConfigError, match="names"):
        write_exports(out, topo, rings, cluster, names=["a"] * 6)
    with pytest.raises(ConfigError, match="names"):
        write_exports(out, topo, rings, cluster, names=["a b"] + [f"h{i}" for i in range(5)])
    with pytest.raises(PlanCheckError, match="needs 33 channels"):
        write_exports(out, topo, {tuple(range(6)): (tuple(range(6)),) * 33}, cluster, msccl=True)
    assert not out.exists()


def test_msccl_skipped_with_a_warning_when_over_the_limits(tmp_path):
    # 40 servers, GPU granularity with 8 GPUs: rings of 320 ranks need 11 segments each
    topo, rings, cluster = ring_plan(40, [1, 3, 7], gpus=8)
    with pytest.warns(ExportSkipped, match="msccl_allreduce.xml not written"):
        write_exports(tmp_path, topo, rings, cluster, msccl_granularity="gpu")
    assert not (tmp_path / "msccl_allreduce.xml").exists()
    check_exports(tmp_path, topo, rings, cluster)


# ------------------------------------------------------------------ properties


@st.composite
def ring_topologies(draw):
    n = draw(st.integers(3, 11))
    coprime = [p for p in range(1, n) if math.gcd(p, n) == 1]
    strides = draw(st.lists(st.sampled_from(coprime), min_size=1, max_size=3))
    d = len(strides) + draw(st.integers(0, 1))
    ports = draw(st.permutations(range(d)))[:len(strides)]
    mp = []
    if d > len(strides) and n >= 4:
        free = draw(st.permutations(range(n)))
        mp = [(free[2 * i], free[2 * i + 1]) for i in range(draw(st.integers(0, n // 2)))]
    gpus = draw(st.integers(1, 3))
    return ring_plan(n, strides, d=d, gpus=gpus, mp_pairs=mp, ports=ports)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=ring_topologies(), granularity=st.sampled_from(["server", "gpu"]))
def test_property_every_export_reads_back(tmp_path_factory, plan, granularity):
    topo, rings, cluster = plan
    out = tmp_path_factory.mktemp("plan")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportSkipped)
        write_exports(out, topo, rings, cluster, msccl_granularity=granularity)
    checked = check_exports(out, topo, rings, cluster)
    assert "msccl_allreduce.xml" in checked and "ocs/ocs0.sonic.json" in checked
    order = rank_order(topo.servers, rings)
    members, orders = next(iter(rings.items()))
    assert nccl_ring(order, members, cluster.gpus_per_server) == orders[0]


@st.composite
def scrambled_topologies(draw):
    """Valid topologies whose links join different port indices at their two ends."""
    n = draw(st.integers(2, 9))
    d = draw(st.integers(1, 4))
    tx_port = [draw(st.permutations(range(d))) for _ in range(n)]
    rx_port = [draw(st.permutations(range(d))) for _ in range(n)]
    links = []
    for r in range(d):
        perm = draw(st.permutations(range(n)))
        keep = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        links += [(i, tx_port[i][r], perm[i], rx_port[perm[i]][r])
                  for i in range(n) if perm[i] != i and keep[i]]
    return Topology(n, d, tuple(links), 1e9, labels=tuple(f"l{i}" for i in range(len(links))))


@settings(max_examples=40, deadline=None)
@given(topo=scrambled_topologies())
def test_property_align_ports_to_rails(topo):
    from topoopt.export import align_ports_to_rails
    from topoopt.topology.topology import check_topology

    aligned = align_ports_to_rails(topo)
    check_topology(aligned)
    assert all(pa == pb for _, pa, _, pb in aligned.links)
    assert [(a, b) for a, _, b, _ in aligned.links] == [(a, b) for a, _, b, _ in topo.links]
    assert aligned.labels == topo.labels
    # one rail per unit: every aligned link is a cross-connect, the original may not be
    lay = ocs_layout(topo.servers, topo.ports, topo.servers)
    cc = cross_connects(aligned, lay)
    check_cross_connects({u: [(c.ingress, c.egress) for c in cc if c.unit == u]
                          for u in range(lay.units)}, aligned, lay)


def test_topology_finder_plan_exports(tmp_path):
    """A real TopologyFinder plan (DLRM hybrid, n = 16, d = 4) exports and checks back."""
    from topoopt.cluster import Job
    from topoopt.finder.topology_finder import topology_finder
    from topoopt.strategy import hybrid
    from topoopt.traffic import derive_traffic

    cluster = Cluster(servers=16, nics=4, link_bandwidth=100e9, gpus_per_server=4)
    job = Job("dlrm", batch_per_gpu=128, size={"tables": 16, "rows": 1_000_000, "dim": 128})
    model = model_of(job)
    traffic = derive_traffic(model, hybrid(model, 16), 16, job.global_batch(cluster),
                             job.dtype_bytes)
    plan = topology_finder(traffic, 16, 4, 100e9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportSkipped)
        write_exports(tmp_path, plan.topology, plan.rings, cluster, ocs_ports=32)
    checked = check_exports(tmp_path, plan.topology, plan.rings, cluster, ocs_ports=32)
    assert "ocs/ocs1.scpi" in checked and "msccl_allreduce.xml" in checked
