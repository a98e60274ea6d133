"""Polatis NETCONF ``<edit-config>`` RPC that sets one OCS unit's cross-connects.

File ``ocs/ocs{u}.netconf.xml``: a complete NETCONF RPC (RFC 6241 §7.2) editing the
``running`` datastore with ``<default-operation>merge</default-operation>``; its
``<config>`` holds the Polatis ``optical-switch`` YANG container::

    <cross-connects xmlns="http://www.polatis.com/yang/optical-switch">
      <pair><ingress>1</ingress><egress>321</egress></pair>
      ...
    </cross-connects>

Namespace and element names as the ONOS Polatis NETCONF driver uses them
(opennetworkinglab/onos, drivers/polatis/netconf: ``KEY_XMLNS =
"http://www.polatis.com/yang/optical-switch"``, container ``cross-connects``, list
entries with leaves ``ingress`` and ``egress``). The list entry is ``pair`` in
``optical-switch`` revisions from 2017-08-04 and ``pairs`` before (ONOS
``PolatisFlowRuleProgrammable.PAIR_COMPAT_REVISION``); we write ``pair`` and read both.
Port numbers are Polatis numbers (ingress ``1..N``, egress ``N+1..2N``, see
:mod:`topoopt.export.ocs`). Each pair is preceded by a comment naming the two NIC ends.

Send the file as the RPC of a NETCONF session (RFC 6242, SSH port 830) with any client
that sends raw RPCs, or with ncclient pass its ``<edit-config>`` element to
``Manager.dispatch`` or its ``<config>`` element to ``Manager.edit_config(target=
"running", config=...)``. ``merge`` adds these
connections and leaves others on the switch; on a unit dedicated to the shard, first
clear it with an edit-config of ``<cross-connects nc:operation="delete"/>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Sequence

from topoopt.errors import PlanCheckError
from topoopt.export._inputs import xml_comment
from topoopt.export.ocs import CrossConnect

__all__ = ["NETCONF_NS", "POLATIS_NS", "format_polatis_netconf", "parse_polatis_netconf"]

NETCONF_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
POLATIS_NS = "http://www.polatis.com/yang/optical-switch"


def _end(hosts: Sequence[str] | None, server: int, nic: int, strand: str) -> str:
    name = hosts[server] if hosts is not None else f"server {server}"
    return f"{name} nic{nic} {strand}"


def format_polatis_netconf(connects: Sequence[CrossConnect], hosts: Sequence[str] | None = None,
                           message_id: int = 1) -> str:
    """The RPC text for one unit's ``connects`` (ingress order)."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             f'<rpc message-id="{message_id}" xmlns="{NETCONF_NS}">',
             "  <edit-config>",
             "    <target>",
             "      <running/>",
             "    </target>",
             "    <default-operation>merge</default-operation>",
             "    <config>",
             f'      <cross-connects xmlns="{POLATIS_NS}">']
    for c in sorted(connects, key=lambda c: c.ingress):
        note = f"{_end(hosts, *c.tx, 'TX')} -> {_end(hosts, *c.rx, 'RX')}, link {c.link}"
        if c.label:
            note += f" ({c.label})"
        lines += [f"        {xml_comment(note)}",
                  "        <pair>",
                  f"          <ingress>{c.ingress}</ingress>",
                  f"          <egress>{c.egress}</egress>",
                  "        </pair>"]
    lines += ["      </cross-connects>", "    </config>", "  </edit-config>", "</rpc>", ""]
    return "\n".join(lines)


def parse_polatis_netconf(text: str) -> list[tuple[int, int]]:
    """Read an edit-config RPC back: its ``(ingress, egress)`` pairs.

    Raises
    ------
    PlanCheckError
        Not well-formed XML, not an ``<rpc><edit-config>`` on ``running``, no Polatis
        ``cross-connects`` container, or a pair without integer ingress and egress.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        raise PlanCheckError(f"NETCONF file is not well-formed XML: {err}") from None
    nc = f"{{{NETCONF_NS}}}"
    if root.tag != f"{nc}rpc" or root.get("message-id") is None:
        raise PlanCheckError("NETCONF file must be an <rpc message-id=...> in the NETCONF namespace")
    edit = root.find(f"{nc}edit-config")
    if edit is None or edit.find(f"{nc}target/{nc}running") is None:
        raise PlanCheckError("NETCONF rpc must be an <edit-config> with target <running/>")
    container = edit.find(f"{nc}config/{{{POLATIS_NS}}}cross-connects")
    if container is None:
        raise PlanCheckError(f"NETCONF <config> has no <cross-connects xmlns=\"{POLATIS_NS}\">")
    pairs = []
    for entry in container:
        if entry.tag not in (f"{{{POLATIS_NS}}}pair", f"{{{POLATIS_NS}}}pairs"):
            raise PlanCheckError(f"unexpected element {entry.tag} in <cross-connects>")
        ingress = entry.findtext(f"{{{POLATIS_NS}}}ingress")
        egress = entry.findtext(f"{{{POLATIS_NS}}}egress")
        try:  # a missing one (None) fails as int("") does
            pairs.append((int(ingress or ""), int(egress or "")))
        except ValueError:
            raise PlanCheckError(f"<pair> needs integer <ingress> and <egress>, got "
                                 f"{ingress!r}/{egress!r}") from None
    return pairs
