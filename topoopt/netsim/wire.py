"""Packet overheads for the flow-level model: headers on the wire and ACKs on the way back.

The fluid model of :func:`topoopt.netsim.simulate` moves payload bytes at link rate.
A TCP flow on a real (or ns-3) link moves more: each full segment of ``mss`` payload
bytes is ``mtu + framing`` bytes on the wire (1448 of 1502 at MTU 1500: -3.6%), and
its receiver sends an ACK of ``ack_bytes`` every ``segments_per_ack`` segments back
along the reverse path (~1.8% of the data's bytes, in the other direction, which a
ring or an all-to-all fills with its own data). :func:`wire_workload` turns a flow
workload into one whose fluid times include both: sizes become wire bytes, and each
data flow gets an ACK companion -- a flow of its ACK bytes on its ACK path, started
with it, that nothing waits for. (ACKs are not a weight on the data flow's route: in
max-min sharing that would let a saturated reverse link freeze the data flow at the
fair share, whereas ACKs in ns-3 go first and only take their bytes.) External greedy
flows get rate-capped ACK companions (:func:`wire_backgrounds`). Calibrated against
ns-3 in ``benchmarks/calibrate_ns3.py``; the closed-form fluid model stays the
default of the simulator and of the REACT executors (``wire=None``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from topoopt._require import require_int
from topoopt.errors import ConfigError
from topoopt.netsim.engine import RoutedNetwork
from topoopt.netsim.maxmin import gather_rows
from topoopt.netsim.workload import Background, CompiledWorkload, FlowRoutes

__all__ = ["WireModel", "PACKET_WIRE", "reverse_link_ids", "ack_routes", "wire_workload",
           "wire_backgrounds"]


@dataclass(frozen=True)
class WireModel:
    """Per-packet overheads of a TCP/IP flow (defaults: ns-3's TCP over point-to-point).

    Attributes
    ----------
    mtu : int
        IP packet bytes of a full segment.
    header : int
        IP + TCP header bytes per segment (20 + 20 + 12 for timestamps).
    framing : int
        Link-layer bytes per packet (PPP: 2; Ethernet with preamble and gap: 38).
    ack_bytes : int
        Bytes of a pure ACK on the wire (header + framing).
    segments_per_ack : int
        Delayed ACKs: one per 2 segments.

    Examples
    --------
    >>> w = WireModel()
    >>> round(w.efficiency, 4), round(w.ack_weight, 4)
    (0.964, 0.018)
    >>> round(w.wire_bytes(1448e3))
    1502000
    """

    mtu: int = 1500
    header: int = 52
    framing: int = 2
    ack_bytes: int = 54
    segments_per_ack: int = 2

    def __post_init__(self) -> None:
        require_int("wire.mtu", self.mtu, minimum=68)
        require_int("wire.header", self.header, minimum=0)
        require_int("wire.framing", self.framing, minimum=0)
        require_int("wire.ack_bytes", self.ack_bytes, minimum=0)
        require_int("wire.segments_per_ack", self.segments_per_ack, minimum=1)
        if self.header >= self.mtu:
            raise ConfigError("wire.header", self.header, f"must be below the MTU ({self.mtu})")

    @property
    def mss(self) -> int:
        """Payload bytes per full segment."""
        return self.mtu - self.header

    @property
    def efficiency(self) -> float:
        """Payload share of the wire bytes of bulk data."""
        return self.mss / (self.mtu + self.framing)

    @property
    def ack_weight(self) -> float:
        """ACK bytes on the reverse path per wire byte of data."""
        return self.ack_bytes / (self.segments_per_ack * (self.mtu + self.framing))

    def wire_bytes(self, payload):
        """Bytes on the wire of ``payload`` bytes: full segments plus one partial one."""
        payload = np.asarray(payload, float)
        packets = np.ceil(payload / self.mss)
        return payload + packets * (self.header + self.framing)


#: The overheads of ns-3's TCP at MTU 1500 (the default of the packet backend).
PACKET_WIRE = WireModel()


def reverse_link_ids(src, dst) -> np.ndarray:
    """For every directed link ``u -> v`` the id of a link ``v -> u`` (-1 if none)."""
    src = np.asarray(src, np.int64)
    dst = np.asarray(dst, np.int64)
    if src.size == 0:
        return np.empty(0, np.int64)
    n = int(max(src.max(), dst.max())) + 1
    key = src * n + dst
    order = np.argsort(key, kind="stable")
    sk = key[order]
    want = dst * n + src
    pos = np.searchsorted(sk, want)
    pos = np.minimum(pos, sk.size - 1)
    return np.where(sk[pos] == want, order[pos], -1)


def ack_routes(fabric: RoutedNetwork, routes: FlowRoutes, src, dst) -> FlowRoutes:
    """Where each flow's ACKs go: the reverse of its route when every link has a
    reverse link, else the fabric's own ``dst -> src`` route (ECMP weights)."""
    rev = reverse_link_ids(fabric.src, fabric.dst)
    counts = np.diff(routes.ptr)
    flow = np.repeat(np.arange(counts.size), counts)
    r = rev[routes.link]
    bad = np.zeros(counts.size, bool)
    np.logical_or.at(bad, flow, r < 0)
    link = np.where(r >= 0, r, 0)
    out = FlowRoutes(routes.ptr.copy(), link, routes.weight.copy())
    if bad.any():
        idx = np.flatnonzero(bad)
        other = fabric.route(np.asarray(dst)[idx], np.asarray(src)[idx])
        out = _replace_rows(out, idx, other)
    return out


def _replace_rows(base: FlowRoutes, rows: np.ndarray, other: FlowRoutes) -> FlowRoutes:
    counts = np.diff(base.ptr).copy()
    counts[rows] = np.diff(other.ptr)
    parts_l, parts_w = [], []
    take = dict(zip(rows.tolist(), range(rows.size)))
    for i in range(counts.size):
        j = take.get(i)
        if j is None:
            parts_l.append(base.link[base.ptr[i]:base.ptr[i + 1]])
            parts_w.append(base.weight[base.ptr[i]:base.ptr[i + 1]])
        else:
            parts_l.append(other.link[other.ptr[j]:other.ptr[j + 1]])
            parts_w.append(other.weight[other.ptr[j]:other.ptr[j + 1]])
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.empty(0, dt))
    return FlowRoutes(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                      cat(parts_l, np.int64), cat(parts_w, float))


def wire_workload(work: CompiledWorkload, fabric: RoutedNetwork, src, dst,
                  model: WireModel = PACKET_WIRE) -> CompiledWorkload:
    """A workload with wire bytes for flow sizes and an ACK companion per flow.

    Parameters
    ----------
    work : CompiledWorkload
        Its flow routes index ``fabric``'s links.
    fabric : topoopt.fabrics.Fabric
    src, dst : array_like of int, shape (F,)
        Each flow's source and destination server (for ACK routes without reverse links).
    model : WireModel

    Returns
    -------
    CompiledWorkload
        The same nodes (ids kept) with sizes ``model.wire_bytes(size)``, followed by
        one companion flow per data flow with a non-empty route: ``model.ack_weight``
        x its wire bytes along :func:`ack_routes`, released by the same predecessors,
        with no successors.

    Examples
    --------
    >>> from topoopt.fabrics import star
    >>> from topoopt.netsim import Workload, simulate
    >>> f = star(2, 100e9)
    >>> w = Workload()
    >>> ids = w.add_flows([1448e3, 1448e3], f.route([0, 1], [1, 0]))
    >>> r = simulate(f, wire_workload(w.compile(), f, [0, 1], [1, 0]))
    >>> round(float(r.finish[0]) * 1e6, 1)      # 1.502 MB of data + 27 kB of ACKs
    124.3
    """
    back = ack_routes(fabric, work.routes, src, dst)
    has = np.diff(back.ptr) > 0
    fi = np.flatnonzero(has)
    wire = model.wire_bytes(work.flow_size)
    n, k = work.nodes, fi.size
    if k == 0:
        return dataclasses.replace(work, flow_size=wire)
    idx, counts = gather_rows(back.ptr, fi)
    comp_routes = FlowRoutes(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                             back.link[idx], np.ones(idx.size))
    comp_nodes = n + np.arange(k, dtype=np.int64)
    # companion of data node flow_node[f]: same predecessors
    comp_of = np.full(n, -1, np.int64)
    comp_of[work.flow_node[fi]] = comp_nodes
    hit = comp_of[work.dep_after] >= 0
    nf = work.flow_size.size
    return CompiledWorkload(
        nodes=n + k, is_flow=np.concatenate([work.is_flow, np.ones(k, bool)]),
        local=np.concatenate([work.local, nf + np.arange(k, dtype=np.int64)]),
        release=np.concatenate([work.release, work.release[work.flow_node[fi]]]),
        flow_node=np.concatenate([work.flow_node, comp_nodes]),
        flow_size=np.concatenate([wire, model.ack_weight * wire[fi]]),
        flow_latency=np.concatenate([work.flow_latency, np.full(k, np.nan)]),
        routes=FlowRoutes.concat([work.routes, comp_routes]),
        task_node=work.task_node, task_duration=work.task_duration,
        task_resource=work.task_resource, task_priority=work.task_priority,
        dep_before=np.concatenate([work.dep_before, work.dep_before[hit]]),
        dep_after=np.concatenate([work.dep_after, comp_of[work.dep_after[hit]]]))


def wire_backgrounds(backgrounds, fabric: RoutedNetwork, ends, model: WireModel = PACKET_WIRE) -> list:
    """External greedy flows plus their ACK companions.

    Each ``Background`` in ``backgrounds`` (``ends[i]`` = its source and destination
    servers) is kept and gets a companion on its ACK path, active when it is, capped at
    ``model.ack_weight`` x its bottleneck capacity shared by the external flows that
    leave the same link first (an upper bound of its ACK rate).
    """
    bgs = list(backgrounds)
    firsts = [b.links[0] for b in bgs]
    out = list(bgs)
    for b, (s, d) in zip(bgs, ends):
        fwd = FlowRoutes.from_lists([b.links])
        back = ack_routes(fabric, fwd, [s], [d])
        if back.link.size == 0:
            continue
        share = firsts.count(b.links[0])
        cap = float(np.min(np.asarray(fabric.capacity)[list(b.links)]))
        out.append(Background(tuple(back.link.tolist()), rate=model.ack_weight * cap / share,
                              start=b.start, stop=b.stop, on=b.on, off=b.off))
    return out
