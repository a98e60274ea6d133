"""SONiC OCS CONFIG_DB JSON (``OCS_PORT`` and ``OCS_CROSS_CONNECT``) for one OCS unit.

File ``ocs/ocs{u}.sonic.json``, the schema of the SONiC OCS work
(sonic-buildimage ``src/sonic-yang-models/yang-models/sonic-ocs.yang``, module
``sonic-ocs``, revision 2024-11-21)::

    {
      "OCS_PORT": {
        "1A":   {"label": "server-000 nic0 TX", "state": "normal"},
        "1B":   {"label": "server-005 nic0 RX", "state": "normal"},
        ...
      },
      "OCS_CROSS_CONNECT": {
        "1A-1B": {"a_side": "1A", "b_side": "1B"},
        ...
      }
    }

``OCS_PORT`` is keyed by simplex port id (``kA`` = ingress ``k``, ``kB`` = egress
``k``, ``k = 1..N``; see :mod:`topoopt.export.ocs`) with leaves ``label`` (free text,
"for cable tracing") and ``state`` (``normal`` or ``force_blocked``).
``OCS_CROSS_CONNECT`` is keyed by ``"<a_side>-<b_side>"`` ("two simplex port
identifiers separated by a hyphen, such as 1A-2B") with leaves ``a_side`` and
``b_side``; sonic-mgmt's L1-switch testbed doc writes exactly these entries
(``"1A-2B": {"a_side": "1A", "b_side": "2B"}``). We list only the ports the shard's
NICs are cabled to, with labels naming the NIC strand.

Load it into CONFIG_DB on the OCS with ``sudo sonic-cfggen -j ocs0.sonic.json
--write-to-db`` (how the ocs-kvm platform README loads its sample ``ocs_config.json``),
then ``sudo config save -y`` to keep it across reboots.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

from topoopt.errors import PlanCheckError
from topoopt.export.ocs import CrossConnect

__all__ = ["PORT_STATES", "format_sonic_ocs", "parse_sonic_ocs"]

#: ``port_config_override_state`` of sonic-ocs.yang.
PORT_STATES = ("normal", "force_blocked")

_PORT_ID = re.compile(r"([1-9][0-9]*)([AB])\Z")


def _label(hosts: Sequence[str] | None, server: int, nic: int, strand: str) -> str:
    name = hosts[server] if hosts is not None else f"server {server}"
    return f"{name} nic{nic} {strand}"


def format_sonic_ocs(connects: Sequence[CrossConnect], ocs_ports: int,
                     hosts: Sequence[str] | None = None) -> str:
    """The CONFIG_DB JSON for one unit's ``connects`` (ingress order)."""
    ports: dict[str, dict[str, str]] = {}
    xcs: dict[str, dict[str, str]] = {}
    for c in sorted(connects, key=lambda c: c.ingress):
        a, b = c.sonic_ports(ocs_ports)
        ports[a] = {"label": _label(hosts, *c.tx, "TX"), "state": "normal"}
        ports[b] = {"label": _label(hosts, *c.rx, "RX"), "state": "normal"}
        xcs[f"{a}-{b}"] = {"a_side": a, "b_side": b}
    ports = dict(sorted(ports.items(), key=lambda kv: (int(kv[0][:-1]), kv[0][-1])))
    return json.dumps({"OCS_PORT": ports, "OCS_CROSS_CONNECT": xcs}, indent=2) + "\n"


def parse_sonic_ocs(text: str, ocs_ports: int) -> list[tuple[int, int]]:
    """Read the JSON back, validating it against sonic-ocs.yang: Polatis-numbered pairs.

    Returns ``(ingress, egress)`` with ``egress = N + k`` for ``kB``, so the pairs compare
    directly with the NETCONF, SCPI and TL1 files.

    Raises
    ------
    PlanCheckError
        Unknown tables or leaves, a port id that is not ``kA``/``kB`` with ``k`` in
        ``1..N``, a bad ``state``, a cross-connect key other than ``a_side-b_side``, an
        ``a_side`` that is not an A port or ``b_side`` not a B port, or a cross-connect
        naming a port missing from ``OCS_PORT``.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PlanCheckError(f"SONiC OCS file is not JSON: {err}") from None
    if not isinstance(data, dict) or set(data) - {"OCS_PORT", "OCS_CROSS_CONNECT"}:
        raise PlanCheckError("SONiC OCS file must hold only the OCS_PORT and OCS_CROSS_CONNECT tables")
    ports = data.get("OCS_PORT", {})
    xcs = data.get("OCS_CROSS_CONNECT", {})

    def port_index(port_id: object, side: str) -> int:
        m = _PORT_ID.match(port_id) if isinstance(port_id, str) else None
        if not m or m.group(2) != side or not 1 <= int(m.group(1)) <= ocs_ports:
            raise PlanCheckError(f"SONiC OCS port {port_id!r} is not a {side}-side port "
                                 f"1{side}..{ocs_ports}{side}")
        return int(m.group(1))

    for port_id, leaves in ports.items():
        m = _PORT_ID.match(port_id)
        if not m or not 1 <= int(m.group(1)) <= ocs_ports:
            raise PlanCheckError(f"OCS_PORT id {port_id!r} is not kA or kB with k in 1..{ocs_ports}")
        if not isinstance(leaves, dict) or set(leaves) - {"label", "state"}:
            raise PlanCheckError(f"OCS_PORT {port_id}: leaves must be label and state")
        if "state" in leaves and leaves["state"] not in PORT_STATES:
            raise PlanCheckError(f"OCS_PORT {port_id}: state {leaves['state']!r} not in {PORT_STATES}")
        if not isinstance(leaves.get("label", ""), str):
            raise PlanCheckError(f"OCS_PORT {port_id}: label must be a string")
    pairs = []
    for key, leaves in xcs.items():
        if not isinstance(leaves, dict) or set(leaves) != {"a_side", "b_side"}:
            raise PlanCheckError(f"OCS_CROSS_CONNECT {key}: leaves must be a_side and b_side")
        a, b = leaves["a_side"], leaves["b_side"]
        if key != f"{a}-{b}":
            raise PlanCheckError(f"OCS_CROSS_CONNECT key {key!r} is not a_side-b_side ({a}-{b})")
        ingress, k = port_index(a, "A"), port_index(b, "B")
        for port_id in (a, b):
            if port_id not in ports:
                raise PlanCheckError(f"OCS_CROSS_CONNECT {key}: port {port_id} is not in OCS_PORT")
        pairs.append((ingress, ocs_ports + k))
    return pairs
