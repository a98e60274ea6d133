"""OCS cabling: the NIC-strand -> OCS-port map and the cross-connects a topology needs.

An optical circuit switch (OCS) unit here is an ``N x N`` switch: ``N`` ingress ports
(light in) and ``N`` egress ports (light out). Two numberings of the same ports are in
use, and every OCS file in a plan uses the one its device expects:

* Polatis (NETCONF, SCPI, TL1): ingress ports ``1..N``, egress ports ``N+1..2N``. The
  ONOS Polatis driver reads and writes cross-connects as ``ingress``/``egress`` port
  numbers of the ``optical-switch`` YANG module
  (opennetworkinglab/onos, drivers/polatis/netconf/PolatisFlowRuleProgrammable.java),
  and a Polatis REST listing of a 512x512 unit shows ingress ports below 513 and egress
  ports from 513 (quintons/polatis2, __endpoint-mocks/api/data/cross-connects/pair).
* SONiC OCS (CONFIG_DB): simplex port ids ``kA`` (ingress ``k``) and ``kB`` (egress
  ``k``), ``k = 1..N`` (sonic-ocs.yang, "such as 1A, 64B"; the ocs-kvm sample has 16
  ingress ports ``1A..16A`` and 16 egress ports ``1B..16B``).

Cabling map (fixed by ``n`` servers, ``d`` NIC ports per server and ``N``; independent
of the topology, so the fibres are laid once and only cross-connects change per job).
A server's NIC port transmits into an ingress port (server TX -> OCS ingress) and
receives from an egress port (OCS egress -> server RX):

* ``rails = min(d, N // n)`` NIC-port indices ("rails") share one unit; unit ``u``
  holds NIC ports ``u*rails .. u*rails + rails - 1`` of *every* server, so
  ``units = ceil(d / rails)``.
* NIC port ``nic`` of ``server`` uses slot ``(nic % rails) * n + server`` of unit
  ``nic // rails``: Polatis ingress ``slot + 1`` / egress ``N + slot + 1``, SONiC
  ``{slot+1}A`` / ``{slot+1}B``.

With ``n * d <= N`` (the default ``N = 320``, the single-unit limit the issue gives)
everything is on unit ``ocs0``. Beyond that the shard is split over several units,
one group of rails each, and a cross-connect cannot join two units: a link
``(a, port_a, b, port_b)`` is realisable only when ``port_a`` and ``port_b`` are on
the same unit (always true when the planner puts a ring permutation, or a matching
round, on the same port index of every server). Otherwise :func:`cross_connects` raises
:class:`PlanCheckError` naming the link: use one OCS with ``N >= n * d`` or a patch
panel (``patch_panel.csv`` realises any topology). A shard with more servers than one
unit has ingress ports (``n > N``) cannot be cabled this way at all.

Any topology can be made realisable on this layout by renumbering NIC ports, before the
plan is written: :func:`align_ports_to_rails` colours the links so that each link
leaves and enters on the same port index (König's edge-colouring theorem on the
bipartite out-side/in-side multigraph of maximum degree ``d``).

``ocs/port_map.csv`` is the cabling sheet: one row per NIC strand, columns
``host,server,nic,strand,ocs,ocs_port,sonic_port`` (``strand`` TX rows give the
ingress port, RX rows the egress port).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import networkx as nx

from topoopt._require import require_int
from topoopt.errors import PlanCheckError
from topoopt.export._inputs import host_names
from topoopt.topology.topology import Topology, check_topology

__all__ = ["OCS_PORTS", "PORT_MAP_COLUMNS", "OcsLayout", "CrossConnect", "ocs_layout",
           "align_ports_to_rails", "cross_connects", "check_cross_connects", "format_ocs_port_map",
           "parse_ocs_port_map", "check_ocs_port_map", "unit_name"]

#: Default ingress (= egress) ports per OCS unit.
OCS_PORTS = 320

PORT_MAP_COLUMNS = ("host", "server", "nic", "strand", "ocs", "ocs_port", "sonic_port")


def unit_name(unit: int) -> str:
    """File/device name of OCS unit ``unit`` (``ocs0``, ``ocs1``, ...)."""
    return f"ocs{unit}"


@dataclass(frozen=True)
class OcsLayout:
    """Where each NIC strand of an ``n x d`` shard is cabled on ``N x N`` OCS units.

    Attributes
    ----------
    servers, nics : int
        ``n`` and ``d``.
    ocs_ports : int
        ``N``, ingress (= egress) ports per unit.
    """

    servers: int
    nics: int
    ocs_ports: int

    @property
    def rails_per_unit(self) -> int:
        """NIC-port indices per unit, ``min(d, N // n)``."""
        return min(self.nics, self.ocs_ports // self.servers)

    @property
    def units(self) -> int:
        """OCS units needed, ``ceil(d / rails_per_unit)``."""
        return math.ceil(self.nics / self.rails_per_unit)

    def slot(self, server: int, nic: int) -> tuple[int, int]:
        """``(unit, 0-based slot)`` of a NIC port."""
        if not (0 <= server < self.servers and 0 <= nic < self.nics):
            raise PlanCheckError(f"server {server} NIC {nic} is outside the {self.servers} x "
                                 f"{self.nics} shard")
        r = self.rails_per_unit
        return nic // r, (nic % r) * self.servers + server

    def ingress(self, server: int, nic: int) -> tuple[int, int]:
        """``(unit, Polatis ingress port)`` receiving this NIC port's TX strand.

        Examples
        --------
        >>> OcsLayout(servers=16, nics=4, ocs_ports=320).ingress(3, 2)
        (0, 36)
        """
        unit, slot = self.slot(server, nic)
        return unit, slot + 1

    def egress(self, server: int, nic: int) -> tuple[int, int]:
        """``(unit, Polatis egress port)`` feeding this NIC port's RX strand.

        Examples
        --------
        >>> OcsLayout(servers=16, nics=4, ocs_ports=320).egress(3, 2)
        (0, 356)
        """
        unit, slot = self.slot(server, nic)
        return unit, self.ocs_ports + slot + 1

    def _from_slot(self, unit: int, slot: int) -> tuple[int, int] | None:
        r = self.rails_per_unit
        if not (0 <= unit < self.units and 0 <= slot < r * self.servers):
            return None
        nic = unit * r + slot // self.servers
        return (slot % self.servers, nic) if nic < self.nics else None

    def tx_of(self, unit: int, ingress: int) -> tuple[int, int] | None:
        """``(server, nic)`` cabled to ``ingress`` of ``unit``, or None if unused."""
        return self._from_slot(unit, ingress - 1)

    def rx_of(self, unit: int, egress: int) -> tuple[int, int] | None:
        """``(server, nic)`` cabled to ``egress`` of ``unit``, or None if unused."""
        return self._from_slot(unit, egress - self.ocs_ports - 1)


def ocs_layout(servers: int, nics: int, ocs_ports: int = OCS_PORTS) -> OcsLayout:
    """The cabling of an ``n x d`` shard on ``N x N`` units (module docstring).

    Raises
    ------
    PlanCheckError
        ``n > N``: one rail of NIC ports does not fit on a unit.
    """
    require_int("servers", servers, minimum=1)
    require_int("nics", nics, minimum=1)
    require_int("ocs_ports", ocs_ports, minimum=1)
    if servers > ocs_ports:
        raise PlanCheckError(f"{servers} servers do not fit on an OCS with {ocs_ports} ingress "
                             f"ports: use a larger OCS (ocs_ports >= {servers}) or a patch panel")
    return OcsLayout(servers, nics, ocs_ports)


def align_ports_to_rails(topology: Topology) -> Topology:
    """The same links with NIC ports renumbered so every link uses one port index at both ends.

    Colour the links of the bipartite multigraph (transmitting servers on one side,
    receiving servers on the other; maximum degree ``d``) with ``d`` colours so no
    two links of a colour share a transmitter or a receiver (König: possible for any
    bipartite multigraph), then give link ``a -> b`` of colour ``c`` port ``c`` at both
    ends. Each server transmits and receives at most once per colour, so the ports stay
    valid, and every link sits on one rail of :class:`OcsLayout`. The colouring pads
    the multigraph to ``d``-regular and peels ``d`` perfect matchings (Hopcroft-Karp).
    Link order and labels are kept; only ports change.

    Examples
    --------
    >>> t = Topology(3, 2, ((0, 0, 1, 1), (1, 0, 2, 0), (2, 1, 0, 0)), 1e9)
    >>> [pa == pb for _, pa, _, pb in align_ports_to_rails(t).links]
    [True, True, True]
    """
    check_topology(topology)
    n, d = topology.servers, topology.ports
    edges = [(a, b) for a, _, b, _ in topology.links]
    out_deg = [0] * n
    in_deg = [0] * n
    for a, b in edges:
        out_deg[a] += 1
        in_deg[b] += 1
    # pad to d-regular with placeholder edges between deficient sides
    tx_free = [s for s in range(n) for _ in range(d - out_deg[s])]
    rx_free = [s for s in range(n) for _ in range(d - in_deg[s])]
    edges += list(zip(tx_free, rx_free))
    pending: dict[tuple[int, int], list[int]] = {}
    for i, e in enumerate(edges):
        pending.setdefault(e, []).append(i)
    colour = [0] * len(edges)
    top = [("tx", s) for s in range(n)]
    for c in range(d):
        g = nx.Graph()
        g.add_nodes_from(top)
        g.add_nodes_from(("rx", s) for s in range(n))
        g.add_edges_from((("tx", a), ("rx", b)) for (a, b), ids in pending.items() if ids)
        match = nx.bipartite.hopcroft_karp_matching(g, top_nodes=top)
        for s in range(n):  # a (d - c)-regular bipartite multigraph has a perfect matching
            b = match[("tx", s)][1]
            colour[pending[(s, b)].pop(0)] = c
    links = tuple((a, colour[i], b, colour[i]) for i, (a, _, b, _) in enumerate(topology.links))
    return Topology(n, d, links, topology.link_bandwidth, topology.link_latency, topology.labels)


@dataclass(frozen=True)
class CrossConnect:
    """One ingress -> egress connection on an OCS unit, realising one topology link."""

    unit: int
    ingress: int
    egress: int
    link: int
    tx: tuple[int, int]
    rx: tuple[int, int]
    label: str = ""

    def sonic_ports(self, ocs_ports: int) -> tuple[str, str]:
        """SONiC simplex port ids ``("kA", "jB")``."""
        return f"{self.ingress}A", f"{self.egress - ocs_ports}B"


def cross_connects(topology: Topology, layout: OcsLayout) -> tuple[CrossConnect, ...]:
    """The cross-connects realising ``topology``, sorted by unit and ingress port.

    Raises
    ------
    PlanCheckError
        The layout is for another shard size, or a link joins NIC ports cabled to two
        different units.
    """
    if (layout.servers, layout.nics) != (topology.servers, topology.ports):
        raise PlanCheckError(f"OCS layout is for {layout.servers} x {layout.nics} but the "
                             f"topology is {topology.servers} x {topology.ports}")
    labels = topology.labels or ("",) * len(topology.links)
    out = []
    for i, ((a, pa, b, pb), label) in enumerate(zip(topology.links, labels)):
        ua, ingress = layout.ingress(a, pa)
        ub, egress = layout.egress(b, pb)
        if ua != ub:
            raise PlanCheckError(
                f"link {i} {(a, pa, b, pb)}: NIC port {pa} of server {a} is cabled to "
                f"{unit_name(ua)} but NIC port {pb} of server {b} to {unit_name(ub)}; a "
                f"cross-connect cannot span two OCS units: renumber the plan's ports with "
                f"align_ports_to_rails, or use one OCS with ocs_ports >= "
                f"{topology.servers * topology.ports}, or a patch panel")
        out.append(CrossConnect(ua, ingress, egress, i, (a, pa), (b, pb), label))
    return tuple(sorted(out, key=lambda c: (c.unit, c.ingress)))


def check_cross_connects(pairs: Mapping[int, Sequence[tuple[int, int]]], topology: Topology,
                         layout: OcsLayout) -> None:
    """Raise :class:`PlanCheckError` unless ``pairs`` realise exactly ``topology``.

    ``pairs`` maps a unit to its ``(ingress, egress)`` Polatis port pairs, as read back
    from a config file. Checks: ports in range, no ingress or egress port used twice
    on a unit (so the map is a bijection on used ports), every port cabled to a NIC,
    and the links they make are the topology's links, each once.
    """
    n_ports = layout.ocs_ports
    got = []
    for unit, unit_pairs in pairs.items():
        seen_in: set[int] = set()
        seen_out: set[int] = set()
        for ingress, egress in unit_pairs:
            if not 1 <= ingress <= n_ports:
                raise PlanCheckError(f"{unit_name(unit)}: ingress port {ingress} not in 1..{n_ports}")
            if not n_ports < egress <= 2 * n_ports:
                raise PlanCheckError(f"{unit_name(unit)}: egress port {egress} not in "
                                     f"{n_ports + 1}..{2 * n_ports}")
            if ingress in seen_in:
                raise PlanCheckError(f"{unit_name(unit)}: ingress port {ingress} used twice")
            if egress in seen_out:
                raise PlanCheckError(f"{unit_name(unit)}: egress port {egress} used twice")
            seen_in.add(ingress)
            seen_out.add(egress)
            tx, rx = layout.tx_of(unit, ingress), layout.rx_of(unit, egress)
            if tx is None or rx is None:
                raise PlanCheckError(f"{unit_name(unit)}: cross-connect {ingress}->{egress} "
                                     f"uses a port no NIC is cabled to")
            got.append((tx[0], tx[1], rx[0], rx[1]))
    want = sorted(topology.links)
    if sorted(got) != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        raise PlanCheckError(f"OCS cross-connects do not match the topology: missing links "
                             f"{missing[:3]}, extra links {extra[:3]}")


def format_ocs_port_map(layout: OcsLayout, names: Sequence[str] | None = None) -> str:
    """``ocs/port_map.csv``: where every NIC strand is cabled (module docstring)."""
    hosts = host_names(layout.servers, names)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(PORT_MAP_COLUMNS)
    for server in range(layout.servers):
        for nic in range(layout.nics):
            unit, ingress = layout.ingress(server, nic)
            _, egress = layout.egress(server, nic)
            writer.writerow((hosts[server], server, nic, "TX", unit_name(unit), ingress,
                             f"{ingress}A"))
            writer.writerow((hosts[server], server, nic, "RX", unit_name(unit), egress,
                             f"{egress - layout.ocs_ports}B"))
    return buf.getvalue()


def parse_ocs_port_map(text: str) -> dict[tuple[int, int, str], tuple[str, int, str]]:
    """Read ``ocs/port_map.csv``: ``(server, nic, strand) -> (ocs, port, sonic_port)``."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or tuple(rows[0]) != PORT_MAP_COLUMNS:
        raise PlanCheckError(f"ocs/port_map.csv header must be {','.join(PORT_MAP_COLUMNS)}")
    out: dict[tuple[int, int, str], tuple[str, int, str]] = {}
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(PORT_MAP_COLUMNS):
            raise PlanCheckError(f"ocs/port_map.csv line {line}: {len(row)} fields")
        f = dict(zip(PORT_MAP_COLUMNS, row))
        try:
            key = (int(f["server"]), int(f["nic"]), f["strand"])
            value = (f["ocs"], int(f["ocs_port"]), f["sonic_port"])
        except ValueError as err:
            raise PlanCheckError(f"ocs/port_map.csv line {line}: {err}") from None
        if key in out:
            raise PlanCheckError(f"ocs/port_map.csv line {line}: server {key[0]} NIC {key[1]} "
                                 f"{key[2]} listed twice")
        out[key] = value
    return out


def check_ocs_port_map(text: str, layout: OcsLayout, names: Sequence[str] | None = None) -> None:
    """Raise :class:`PlanCheckError` unless ``text`` is the layout's cabling, bijectively.

    Every NIC strand of the shard appears once, with the port the layout gives it, and
    no OCS port is given to two strands.
    """
    table = parse_ocs_port_map(text)
    hosts = host_names(layout.servers, names)
    want_keys = {(s, p, d) for s in range(layout.servers) for p in range(layout.nics)
                 for d in ("TX", "RX")}
    if set(table) != want_keys:
        raise PlanCheckError("ocs/port_map.csv does not list every NIC strand of the shard once")
    rows = list(csv.DictReader(io.StringIO(text)))
    for row in rows:
        if row["host"] != hosts[int(row["server"])]:
            raise PlanCheckError(f"ocs/port_map.csv: host {row['host']} is not server {row['server']}")
    taken: dict[tuple[str, int], tuple[int, int, str]] = {}
    for (server, nic, strand), (ocs, port, sonic) in table.items():
        unit, want = (layout.ingress if strand == "TX" else layout.egress)(server, nic)
        want_sonic = f"{want}A" if strand == "TX" else f"{want - layout.ocs_ports}B"
        if (ocs, port, sonic) != (unit_name(unit), want, want_sonic):
            raise PlanCheckError(f"ocs/port_map.csv: server {server} NIC {nic} {strand} on "
                                 f"{ocs} port {port}, the layout says {unit_name(unit)} {want}")
        if (ocs, port) in taken:
            raise PlanCheckError(f"ocs/port_map.csv: {ocs} port {port} given to two strands")
        taken[ocs, port] = (server, nic, strand)
