"""Checks shared by every export: host names, the cluster, and the rings of a plan."""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from topoopt.cluster import Cluster
from topoopt.errors import ConfigError, PlanCheckError
from topoopt.topology.topology import Topology, check_ring, check_topology

__all__ = ["Rings", "host_names", "check_rings", "largest_group", "check_export_inputs",
           "xml_comment"]

#: AllReduce group (sorted member tuple) -> ring orders (Hamiltonian cycles of the group).
Rings = Mapping[tuple[int, ...], tuple[tuple[int, ...], ...]]

# Host names go into CSV cells, hostfiles and XML text: keep them to hostname characters.
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def host_names(servers: int, names: Sequence[str] | None = None) -> tuple[str, ...]:
    """One host name per server: ``names`` checked, or ``server-{i:03d}`` by default.

    Raises
    ------
    ConfigError
        Wrong count, a duplicate, or a name with characters other than letters, digits,
        ``.``, ``_`` and ``-`` (names land in CSV cells, hostfiles and XML).
    """
    if names is None:
        return tuple(f"server-{i:03d}" for i in range(servers))
    names = tuple(names)
    if len(names) != servers:
        raise ConfigError("names", f"{len(names)} names",
                          f"give exactly one host name per server ({servers})")
    seen: set[str] = set()
    for i, name in enumerate(names):
        if not isinstance(name, str) or not _HOST_NAME.match(name):
            raise ConfigError(f"names[{i}]", name,
                              "use a host name of letters, digits, '.', '_' and '-'")
        if name in seen:
            raise ConfigError(f"names[{i}]", name, "host names must be unique")
        seen.add(name)
    return names


def check_rings(topology: Topology, rings: Rings) -> dict[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Return ``rings`` as a plain dict after checking every group and ring.

    Each key must be a sorted tuple of at least two distinct servers of ``topology``;
    each value a non-empty tuple of rings, each a Hamiltonian cycle of the key
    (:func:`~topoopt.topology.topology.check_ring`).

    Raises
    ------
    PlanCheckError
        Naming the first bad group or ring.
    """
    if not isinstance(rings, Mapping):
        raise PlanCheckError(f"rings must map member tuples to ring orders, got {type(rings).__name__}")
    out: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = {}
    for members, orders in rings.items():
        members = tuple(members)
        if len(members) < 2 or list(members) != sorted(set(members)):
            raise PlanCheckError(f"AllReduce group {list(members)} must be a sorted tuple of "
                                 f"at least two distinct servers")
        if not all(isinstance(m, int) and 0 <= m < topology.servers for m in members):
            raise PlanCheckError(f"AllReduce group {list(members)} names a server outside "
                                 f"0..{topology.servers - 1}")
        orders = tuple(tuple(order) for order in orders)
        if not orders:
            raise PlanCheckError(f"AllReduce group {list(members)} has no ring")
        for order in orders:
            check_ring(order, members)
        out[members] = orders
    return out


def largest_group(rings: Rings) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]] | None:
    """The AllReduce group with the most members (ties: the smallest member tuple)."""
    if not rings:
        return None
    members = min(rings, key=lambda m: (-len(m), tuple(m)))
    return tuple(members), tuple(tuple(o) for o in rings[members])


def check_export_inputs(topology: Topology, rings: Rings, cluster: Cluster,
                        names: Sequence[str] | None = None):
    """Validate a plan before any export is rendered; return ``(rings, names)``.

    Raises
    ------
    PlanCheckError
        The topology fails :func:`check_topology`, it does not match the cluster
        (server count, ports beyond the cluster's NICs), or a ring is not a
        Hamiltonian cycle of its group.
    ConfigError
        Bad host names.
    """
    if not isinstance(topology, Topology):
        raise PlanCheckError(f"topology must be a Topology, got {type(topology).__name__}")
    if not isinstance(cluster, Cluster):
        raise PlanCheckError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    check_topology(topology)
    if topology.servers != cluster.servers:
        raise PlanCheckError(f"topology has {topology.servers} servers but the cluster has "
                             f"{cluster.servers}")
    if topology.ports > cluster.nics:
        raise PlanCheckError(f"topology uses {topology.ports} ports per server but the "
                             f"cluster has {cluster.nics} NICs")
    return check_rings(topology, rings), host_names(topology.servers, names)


def xml_comment(text: str) -> str:
    """``text`` as an XML comment (``--`` is not allowed inside one)."""
    return "<!-- " + text.replace("--", "- -") + " -->"
