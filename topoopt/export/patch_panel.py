"""``patch_panel.csv``: one row per fibre strand, panel ports and server/NIC ports at both ends.

A TopoOpt shard cabled through patch panels (TopoOpt §5, the TopoOpt interconnect: "Both
OCS and patch panels are suitable for this architecture") realises the planned topology with patch cords. A topology link
``(a, port_a, b, port_b)`` is one fibre strand from the transmitter of server ``a``'s NIC
port ``port_a`` to the receiver of server ``b``'s NIC port ``port_b``; a ring permutation
``i -> i + p`` needs the TX and RX strands of one NIC port to go to different servers, so
the panel works on simplex strands, not duplex pairs.

Panel port map (fixed by ``n``, ``d`` and the panel size ``P``, independent of the
topology, so the trunk cabling from servers to panels is done once):

* NIC port index ``e = server * d + nic`` (``d`` = ports per server).
* The TX strand of NIC port ``e`` lands on panel ``TX{e // P + 1:02d}``, front port
  ``e % P + 1``; its RX strand on panel ``RX{e // P + 1:02d}``, front port ``e % P + 1``
  (same numbers, other bank). Panel ports are 1-based, as printed on panels.
* Each link is one simplex patch cord from its TX panel port to its RX panel port.

``P`` defaults to 144: a 1U LC panel of 72 duplex adapters holds 144 simplex
positions; set ``panel_ports`` to the panels you use.

CSV columns (RFC 4180, header row, one row per link in topology order)::

    fibre,label,a_host,a_server,a_nic,a_strand,a_panel,a_panel_port,
    b_panel,b_panel_port,b_host,b_server,b_nic,b_strand

``a_*`` is the transmitting end (``a_strand`` is always ``TX``), ``b_*`` the receiving
end (``b_strand`` is always ``RX``); ``fibre`` is the link index in the topology and
``label`` its planner label (``ring:p=5``, ``mp``, ...), empty when the plan has none.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from topoopt._io import atomic_write_text
from topoopt._require import require_int
from topoopt.errors import PlanCheckError
from topoopt.export._inputs import host_names
from topoopt.topology.topology import Topology, check_topology

__all__ = ["PANEL_PORTS", "COLUMNS", "PatchCord", "panel_port", "patch_cords",
           "format_patch_panel", "write_patch_panel", "parse_patch_panel",
           "check_patch_panel"]

#: Default simplex positions per panel (1U, 72 LC duplex adapters).
PANEL_PORTS = 144

COLUMNS = ("fibre", "label", "a_host", "a_server", "a_nic", "a_strand", "a_panel",
           "a_panel_port", "b_panel", "b_panel_port", "b_host", "b_server", "b_nic",
           "b_strand")


@dataclass(frozen=True)
class PatchCord:
    """One row of ``patch_panel.csv``: a fibre strand from a TX to an RX."""

    fibre: int
    label: str
    a_host: str
    a_server: int
    a_nic: int
    a_panel: str
    a_panel_port: int
    b_panel: str
    b_panel_port: int
    b_host: str
    b_server: int
    b_nic: int

    @property
    def link(self) -> tuple[int, int, int, int]:
        return (self.a_server, self.a_nic, self.b_server, self.b_nic)


def panel_port(server: int, nic: int, strand: str, nics: int,
               panel_ports: int = PANEL_PORTS) -> tuple[str, int]:
    """``(panel, 1-based port)`` where ``strand`` ("TX"/"RX") of a NIC port lands.

    Examples
    --------
    >>> panel_port(0, 0, "TX", nics=4)
    ('TX01', 1)
    >>> panel_port(37, 2, "RX", nics=4)       # e = 37*4 + 2 = 150 -> second panel
    ('RX02', 7)
    """
    if strand not in ("TX", "RX"):
        raise ValueError(f"strand must be 'TX' or 'RX', got {strand!r}")
    e = server * nics + nic
    return f"{strand}{e // panel_ports + 1:02d}", e % panel_ports + 1


def patch_cords(topology: Topology, names: Sequence[str] | None = None,
                panel_ports: int = PANEL_PORTS) -> tuple[PatchCord, ...]:
    """The patch cords realising ``topology``, one per link, in link order.

    Raises
    ------
    PlanCheckError
        ``topology`` fails :func:`check_topology`.
    """
    require_int("panel_ports", panel_ports, minimum=1)
    check_topology(topology)
    hosts = host_names(topology.servers, names)
    labels = topology.labels or ("",) * len(topology.links)
    d = topology.ports
    cords = []
    for i, ((a, pa, b, pb), label) in enumerate(zip(topology.links, labels)):
        ap, apn = panel_port(a, pa, "TX", d, panel_ports)
        bp, bpn = panel_port(b, pb, "RX", d, panel_ports)
        cords.append(PatchCord(i, label, hosts[a], a, pa, ap, apn, bp, bpn, hosts[b], b, pb))
    return tuple(cords)


def format_patch_panel(topology: Topology, names: Sequence[str] | None = None,
                       panel_ports: int = PANEL_PORTS) -> str:
    """The text of ``patch_panel.csv`` (see the module docstring for the columns)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for c in patch_cords(topology, names, panel_ports):
        writer.writerow((c.fibre, c.label, c.a_host, c.a_server, c.a_nic, "TX", c.a_panel,
                         c.a_panel_port, c.b_panel, c.b_panel_port, c.b_host, c.b_server,
                         c.b_nic, "RX"))
    return buf.getvalue()


def write_patch_panel(path: str | Path, topology: Topology, names: Sequence[str] | None = None,
                      panel_ports: int = PANEL_PORTS) -> Path:
    """Write ``patch_panel.csv`` atomically; return its path."""
    path = Path(path)
    atomic_write_text(path, format_patch_panel(topology, names, panel_ports))
    return path


def parse_patch_panel(text: str) -> tuple[PatchCord, ...]:
    """Read ``patch_panel.csv`` text back into :class:`PatchCord` rows.

    Raises
    ------
    PlanCheckError
        Wrong header, a non-integer field, or a strand column other than TX/RX.
    """
    reader = csv.reader(io.StringIO(text))
    rows = list(reader)
    if not rows or tuple(rows[0]) != COLUMNS:
        raise PlanCheckError(f"patch_panel.csv header must be {','.join(COLUMNS)}")
    cords = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(COLUMNS):
            raise PlanCheckError(f"patch_panel.csv line {line}: {len(row)} fields, "
                                 f"expected {len(COLUMNS)}")
        f = dict(zip(COLUMNS, row))
        if f["a_strand"] != "TX" or f["b_strand"] != "RX":
            raise PlanCheckError(f"patch_panel.csv line {line}: a strand must be TX and "
                                 f"b strand RX, got {f['a_strand']}/{f['b_strand']}")
        try:
            cords.append(PatchCord(int(f["fibre"]), f["label"], f["a_host"], int(f["a_server"]),
                                   int(f["a_nic"]), f["a_panel"], int(f["a_panel_port"]),
                                   f["b_panel"], int(f["b_panel_port"]), f["b_host"],
                                   int(f["b_server"]), int(f["b_nic"])))
        except ValueError as err:
            raise PlanCheckError(f"patch_panel.csv line {line}: {err}") from None
    return tuple(cords)


def check_patch_panel(text: str, topology: Topology, names: Sequence[str] | None = None,
                      panel_ports: int = PANEL_PORTS) -> None:
    """Raise :class:`PlanCheckError` unless ``text`` realises exactly ``topology``.

    Checks: every link appears exactly once (and nothing else), no panel port and no
    NIC TX/RX strand is used twice, every panel port follows the documented map, and
    host names match the servers.
    """
    require_int("panel_ports", panel_ports, minimum=1)
    cords = parse_patch_panel(text)
    hosts = host_names(topology.servers, names)
    d = topology.ports
    used_panel: dict[tuple[str, int], int] = {}
    used_strand: dict[tuple[str, int, int], int] = {}
    for c in cords:
        for srv in (c.a_server, c.b_server):
            if not 0 <= srv < topology.servers:
                raise PlanCheckError(f"patch cord {c.fibre}: server {srv} not in the topology")
        for nic in (c.a_nic, c.b_nic):
            if not 0 <= nic < d:
                raise PlanCheckError(f"patch cord {c.fibre}: NIC port {nic} not in 0..{d - 1}")
        if (c.a_host, c.b_host) != (hosts[c.a_server], hosts[c.b_server]):
            raise PlanCheckError(f"patch cord {c.fibre}: hosts {c.a_host}/{c.b_host} do not "
                                 f"match servers {c.a_server}/{c.b_server}")
        if (c.a_panel, c.a_panel_port) != panel_port(c.a_server, c.a_nic, "TX", d, panel_ports):
            raise PlanCheckError(f"patch cord {c.fibre}: TX of server {c.a_server} NIC "
                                 f"{c.a_nic} is not on {c.a_panel} port {c.a_panel_port}")
        if (c.b_panel, c.b_panel_port) != panel_port(c.b_server, c.b_nic, "RX", d, panel_ports):
            raise PlanCheckError(f"patch cord {c.fibre}: RX of server {c.b_server} NIC "
                                 f"{c.b_nic} is not on {c.b_panel} port {c.b_panel_port}")
        for key in ((c.a_panel, c.a_panel_port), (c.b_panel, c.b_panel_port)):
            if key in used_panel:
                raise PlanCheckError(f"panel {key[0]} port {key[1]} used by patch cords "
                                     f"{used_panel[key]} and {c.fibre}")
            used_panel[key] = c.fibre
        for strand in (("TX", c.a_server, c.a_nic), ("RX", c.b_server, c.b_nic)):
            if strand in used_strand:
                raise PlanCheckError(f"{strand[0]} of server {strand[1]} NIC {strand[2]} used by "
                                     f"patch cords {used_strand[strand]} and {c.fibre}")
            used_strand[strand] = c.fibre
    want = sorted(topology.links)
    got = sorted(c.link for c in cords)
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        raise PlanCheckError(f"patch_panel.csv does not match the topology: missing links "
                             f"{missing[:3]}, extra links {extra[:3]}")
