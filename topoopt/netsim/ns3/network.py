"""A fabric as ns-3 sees it: point-to-point cables, and flows pinned to paths by address planes.

Pure Python (no ns-3 needed): the parent process plans everything here and the ns-3
worker only executes it.

Cables. A fabric's links are directed (:class:`topoopt.fabrics.Fabric`). A link and its
reverse with the same latency become one ns-3 point-to-point cable whose two devices
send at the two links' capacities; a link without a reverse (a TopoOpt fibre from one
server's port to another's) becomes a cable whose back direction is never routed.

Routing. Every route is a static /32 host route, so each flow follows exactly the
path chosen for it -- including host-based forwarding through other servers on a
direct-connect fabric (TopoOpt §3) and one of the equal-cost paths on a switched one
(REACT §7.3: "4 connections on 4 different ports", one used per epoch). ns-3 3.44 has
no per-flow ECMP hashing and its per-packet ECMP breaks DCTCP (docs/ns3-notes.md), so paths are
pinned with address planes: server ``s`` has one address per plane ``k``
(:func:`plane_address`); plane ``k`` of destination ``d`` is an in-tree (every node has
at most one next hop toward ``d``'s plane-``k`` address). :class:`PathPlanes` puts each
(data path, ACK path) pair in the first plane where both fit. Plane addresses carry a
/16 mask shared by all servers of that plane, so a sender's source address is its own
plane-``k`` address (ns-3 picks the interface address on the destination's subnet) and
the ACKs come back along the ACK path pinned in the same plane.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from topoopt.errors import PlanCheckError, TopoOptError
from topoopt.netsim.engine import RoutedNetwork
from topoopt.netsim.wire import reverse_link_ids

__all__ = ["NetworkSpec", "network_spec", "check_network_spec", "PathPlanes", "plane_address",
           "MAX_PLANES", "MAX_SERVERS", "QUEUE_SERVER", "QUEUE_SWITCH", "QUEUE_KINDS"]

#: Egress queue kinds (see :class:`NetworkSpec`).
QUEUE_SERVER, QUEUE_SWITCH = 0, 1
QUEUE_KINDS = (QUEUE_SERVER, QUEUE_SWITCH)
#: Planes per destination (second octet 100..255 of 10.x.y.z).
MAX_PLANES = 156
#: Servers addressable in one plane (the last two octets).
MAX_SERVERS = 1 << 16


def plane_address(server: int, plane: int) -> int:
    """The IPv4 address (as an int) of ``server`` in ``plane``: 10.(100+plane).hi.lo.

    Examples
    --------
    >>> import ipaddress
    >>> str(ipaddress.IPv4Address(plane_address(258, 1)))
    '10.101.1.2'
    """
    if not (0 <= plane < MAX_PLANES and 0 <= server < MAX_SERVERS):
        raise TopoOptError(f"plane address: plane {plane} or server {server} out of range")
    return (10 << 24) | ((100 + plane) << 16) | server


@dataclass(frozen=True)
class NetworkSpec:
    """Cables of a fabric for ns-3, and which cable end sends each directed link.

    Attributes
    ----------
    name : str
    nodes, servers : int
        ns-3 node ``i`` is fabric node ``i``; servers are ``0..servers-1``.
    a, b : ndarray of int64, shape (C,)
        Cable ends (nodes).
    rate_ab, rate_ba : ndarray of float, shape (C,)
        Bits/s sent from ``a`` to ``b`` and back.
    delay : ndarray of float, shape (C,)
        Propagation delay, seconds.
    link_cable, link_end : ndarray of int64, shape (L,)
        Fabric link ``l`` is sent by end ``link_end[l]`` (0 = ``a``) of cable ``link_cable[l]``.
    link_src, link_dst : ndarray of int64, shape (L,)
        The fabric's link endpoints (kept for routing).
    queue : ndarray of int8, shape (nodes,)
        The kind of a node's egress queues: :data:`QUEUE_SWITCH` (RED/ECN with ACK
        priority, REACT §7.3) or :data:`QUEUE_SERVER` (a server's NIC: per-flow fair
        queueing that marks ECN per flow when the flow's own packets wait longer than
        ``red_max`` packet times -- a host shares its NIC among its flows, and relays
        others' on a direct-connect fabric).
    """

    name: str
    nodes: int
    servers: int
    a: np.ndarray
    b: np.ndarray
    rate_ab: np.ndarray
    rate_ba: np.ndarray
    delay: np.ndarray
    link_cable: np.ndarray
    link_end: np.ndarray
    link_src: np.ndarray
    link_dst: np.ndarray
    queue: np.ndarray

    @property
    def cables(self) -> int:
        return int(self.a.size)

    @property
    def links(self) -> int:
        return int(self.link_cable.size)


def network_spec(fabric: RoutedNetwork) -> NetworkSpec:
    """The cables of ``fabric`` (same capacities and latencies), see the module docstring.

    Parameters
    ----------
    fabric : topoopt.fabrics.Fabric

    Returns
    -------
    NetworkSpec

    Examples
    --------
    >>> from topoopt.fabrics import star
    >>> s = network_spec(star(4, 100e9))
    >>> s.cables, s.links, s.link_end.tolist()
    (4, 8, [0, 0, 0, 0, 1, 1, 1, 1])
    """
    src = np.asarray(fabric.src, np.int64)
    dst = np.asarray(fabric.dst, np.int64)
    cap = np.asarray(fabric.capacity, float)
    lat = np.asarray(fabric.latency, float)
    rev = reverse_link_ids(src, dst)
    L = src.size
    cable = np.full(L, -1, np.int64)
    end = np.zeros(L, np.int64)
    a: list[int] = []
    b: list[int] = []
    rab: list[float] = []
    rba: list[float] = []
    dl: list[float] = []
    for i in range(L):
        if cable[i] >= 0:
            continue
        j = int(rev[i])
        paired = j >= 0 and cable[j] < 0 and lat[j] == lat[i]
        c = len(a)
        a.append(int(src[i]))
        b.append(int(dst[i]))
        rab.append(float(cap[i]))
        rba.append(float(cap[j]) if paired else float(cap[i]))
        dl.append(float(lat[i]))
        cable[i], end[i] = c, 0
        if paired:
            cable[j], end[j] = c, 1
    queue = np.full(int(fabric.nodes), QUEUE_SWITCH, np.int8)
    queue[:fabric.servers] = QUEUE_SERVER
    spec = NetworkSpec(str(fabric.name), int(fabric.nodes), int(fabric.servers),
                       np.array(a, np.int64), np.array(b, np.int64), np.array(rab),
                       np.array(rba), np.array(dl), cable, end, src.copy(), dst.copy(), queue)
    check_network_spec(spec)
    return spec


def check_network_spec(spec: NetworkSpec) -> None:
    """Raise :class:`PlanCheckError` unless every link maps to the end of a cable that
    joins the link's endpoints, with positive rates and non-negative delays."""
    C = spec.cables
    if spec.servers > MAX_SERVERS:
        raise PlanCheckError(f"ns-3 addressing holds at most {MAX_SERVERS} servers")
    for name in ("b", "rate_ab", "rate_ba", "delay"):
        if getattr(spec, name).shape != (C,):
            raise PlanCheckError(f"network spec: {name} needs one entry per cable ({C})")
    if np.any(spec.link_cable < 0) or np.any(spec.link_cable >= C):
        raise PlanCheckError("network spec: every link needs a cable")
    tx = np.where(spec.link_end == 0, spec.a[spec.link_cable], spec.b[spec.link_cable])
    rx = np.where(spec.link_end == 0, spec.b[spec.link_cable], spec.a[spec.link_cable])
    if not (np.array_equal(tx, spec.link_src) and np.array_equal(rx, spec.link_dst)):
        raise PlanCheckError("network spec: a link's cable end does not match its endpoints")
    if np.any(~(spec.rate_ab > 0)) or np.any(~(spec.rate_ba > 0)):
        raise PlanCheckError("network spec: cable rates must be > 0 bits/s")
    if spec.queue.shape != (spec.nodes,) or not np.isin(spec.queue, QUEUE_KINDS).all():
        raise PlanCheckError(f"network spec: queue needs one kind in {QUEUE_KINDS} per node")
    if np.any(~(spec.delay >= 0)):
        raise PlanCheckError("network spec: cable delays must be >= 0 s")
    if C and (min(spec.a.min(), spec.b.min()) < 0 or max(spec.a.max(), spec.b.max()) >= spec.nodes):
        raise PlanCheckError("network spec: a cable joins a node outside the network")


@dataclass
class PathPlanes:
    """Assigns pinned paths to address planes and lists what ns-3 must add for them.

    ``maps[(d, k)]`` is the in-tree of destination address ``plane_address(d, k)``:
    node -> link it forwards on. :meth:`pin` finds the first plane where the data path
    (toward ``d``) and the ACK path (toward ``s``) both fit, records them, and queues
    the new routes and addresses; :meth:`drain` hands the queue to the worker.

    Examples
    --------
    >>> from topoopt.fabrics import star
    >>> f = star(3, 100e9)
    >>> pp = PathPlanes(f.src, f.dst)
    >>> pp.pin(0, 1, [0, 4], [1, 3])
    0
    >>> addresses, routes = pp.drain()
    >>> sorted(addresses), len(routes)
    ([(0, 0), (1, 0)], 4)
    """

    src: np.ndarray
    dst: np.ndarray
    maps: dict = field(default_factory=dict)
    planes: dict = field(default_factory=dict)     # server -> planes it has an address in
    _cache: dict = field(default_factory=dict)
    _new_addresses: list = field(default_factory=list)
    _new_routes: list = field(default_factory=list)

    def _fits(self, key: tuple[int, int], path: Sequence[int]) -> bool:
        tree = self.maps.get(key)
        if tree is None:
            return True
        return all(tree.get(int(self.src[link]), link) == link for link in path)

    def _add(self, key: tuple[int, int], path: Sequence[int]) -> None:
        tree = self.maps.setdefault(key, {})
        addr = plane_address(*key)
        for link in path:
            u = int(self.src[link])
            if u not in tree:
                tree[u] = int(link)
                self._new_routes.append((int(link), addr))

    def _address(self, server: int, plane: int) -> None:
        have = self.planes.setdefault(server, set())
        if plane not in have:
            have.add(plane)
            self._new_addresses.append((server, plane))

    def pin(self, s: int, d: int, path: Sequence[int] | np.ndarray,
            ack_path: Sequence[int] | np.ndarray) -> int:
        """Plane of a connection from server ``s`` to ``d`` whose data takes ``path``
        (link ids, ``s`` to ``d``) and whose ACKs take ``ack_path`` (``d`` to ``s``)."""
        path = tuple(int(x) for x in path)
        ack_path = tuple(int(x) for x in ack_path)
        key = (int(s), int(d), path, ack_path)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        _check_path(self.src, self.dst, s, d, path)
        _check_path(self.src, self.dst, d, s, ack_path)
        for k in range(MAX_PLANES):
            if self._fits((d, k), path) and self._fits((s, k), ack_path):
                self._add((d, k), path)
                self._add((s, k), ack_path)
                self._address(int(s), k)
                self._address(int(d), k)
                self._cache[key] = k
                return k
        raise TopoOptError(f"more than {MAX_PLANES} distinct paths into server {d}: "
                           "use fewer ECMP ports")

    def drain(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """New ``(server, plane)`` addresses and ``(link, address)`` routes since the last call."""
        out = (self._new_addresses, self._new_routes)
        self._new_addresses, self._new_routes = [], []
        return out


def _check_path(src, dst, s: int, d: int, path: Sequence[int]) -> None:
    node = int(s)
    for link in path:
        if int(src[link]) != node:
            raise TopoOptError(f"path {list(path)} from {s} to {d} is not contiguous")
        node = int(dst[link])
    if node != int(d) or not path:
        raise TopoOptError(f"path {list(path)} does not lead from {s} to {d}")
