"""Direct-connect topologies on server ports, and routes over them, with their checkers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import networkx as nx

from topoopt.errors import PlanCheckError
from topoopt._frozen import FrozenDict

__all__ = ["Link", "Topology", "Routes", "check_topology", "check_routes", "check_ring"]

#: ``(server_a, port_a, server_b, port_b)``: one fibre strand from the transmitter of
#: ``server_a``'s port ``port_a`` to the receiver of ``server_b``'s port ``port_b``.
Link = tuple[int, int, int, int]


@dataclass(frozen=True)
class Topology:
    """A direct-connect topology: directed links between NIC ports of servers.

    Servers are numbered ``0..servers-1`` and each has ports ``0..ports-1``. A NIC
    port has a transmit and a receive strand, and a patch panel or OCS can send them
    to different servers: that is how one port per server carries a ring permutation
    ``i -> (i + p) mod n`` (TopoOpt §4). So a link is directed, from a port's
    transmitter to a port's receiver, and no port transmits twice or receives twice
    (DESIGN.md: "no port is used twice"). A full-duplex connection between two
    servers, as a Blossom matching edge makes, is two links on the same two ports.
    Parallel links between the same two servers are allowed.

    Attributes
    ----------
    servers : int
        n.
    ports : int
        d, NIC ports per server.
    links : tuple of Link
        ``(server_a, port_a, server_b, port_b)``: transmitter of ``(a, port_a)`` to
        receiver of ``(b, port_b)``, ``a != b``.
    link_bandwidth : float
        Bits/s per link.
    link_latency : float
        Seconds.
    labels : tuple of str
        Optional, one per link: why it exists (``"ring:p=5"``, ``"mp"``, ``"expander"``).
    """

    servers: int
    ports: int
    links: tuple[Link, ...]
    link_bandwidth: float
    link_latency: float = 1e-6
    labels: tuple[str, ...] = ()

    def graph(self) -> nx.MultiDiGraph:
        """Directed multigraph over servers; edge key = link index, attrs ``ports``."""
        g = nx.MultiDiGraph()
        g.add_nodes_from(range(self.servers))
        for i, (a, pa, b, pb) in enumerate(self.links):
            g.add_edge(a, b, key=i, ports=(pa, pb))
        return g

    def simple_graph(self) -> nx.DiGraph:
        """Directed graph over servers; edge attribute ``links`` = parallel link count."""
        g = nx.DiGraph()
        g.add_nodes_from(range(self.servers))
        for a, _, b, _ in self.links:
            if g.has_edge(a, b):
                g[a][b]["links"] += 1
            else:
                g.add_edge(a, b, links=1)
        return g

    def out_degree(self, server: int) -> int:
        """Transmitters of ``server`` in use."""
        return sum(a == server for a, _, _, _ in self.links)

    def in_degree(self, server: int) -> int:
        """Receivers of ``server`` in use."""
        return sum(b == server for _, _, b, _ in self.links)


@dataclass(frozen=True)
class Routes:
    """Routes over a topology: per ordered server pair, paths with traffic fractions.

    Attributes
    ----------
    paths : Mapping
        ``(src, dst) -> ((node_path, fraction), ...)``; each node path starts at
        ``src``, ends at ``dst``, and the fractions sum to 1.
    """

    paths: Mapping[tuple[int, int], tuple[tuple[tuple[int, ...], float], ...]] = \
        field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", FrozenDict(self.paths))

    def __getitem__(self, pair: tuple[int, int]):
        return self.paths[pair]

    def __contains__(self, pair: object) -> bool:
        return pair in self.paths

    def __len__(self) -> int:
        return len(self.paths)


def check_topology(topology: Topology, max_ports: int | None = None) -> None:
    """Raise :class:`PlanCheckError` naming the first violated invariant.

    Checks: servers and ports in range (ports below ``max_ports``, default
    ``topology.ports``), no self-loop, no port transmitting twice or receiving twice,
    and one label per link when labels are given.
    """
    n, d = topology.servers, max_ports if max_ports is not None else topology.ports
    used: dict[tuple[str, int, int], int] = {}
    for i, link in enumerate(topology.links):
        if len(link) != 4:
            raise PlanCheckError(f"link {i} {link!r} is not (server_a, port_a, server_b, port_b)")
        a, pa, b, pb = link
        if a == b:
            raise PlanCheckError(f"link {i} {link!r} connects server {a} to itself")
        for end, s, p in (("transmits", a, pa), ("receives", b, pb)):
            if not 0 <= s < n:
                raise PlanCheckError(f"link {i} {link!r}: server {s} not in 0..{n - 1}")
            if not 0 <= p < d:
                raise PlanCheckError(f"link {i} {link!r}: port {p} not in 0..{d - 1}")
            if (end, s, p) in used:
                raise PlanCheckError(f"link {i} {link!r}: port {p} of server {s} already "
                                     f"{end} on link {used[end, s, p]}")
            used[end, s, p] = i
    if topology.labels and len(topology.labels) != len(topology.links):
        raise PlanCheckError(f"{len(topology.labels)} labels for {len(topology.links)} links")


def check_routes(topology: Topology, routes: Routes, tol: float = 1e-9) -> None:
    """Raise :class:`PlanCheckError` unless every route is a valid path of links.

    Each path must start at its pair's source, end at its destination, visit no
    server twice and only take hops ``u -> v`` that are links; fractions must be positive
    and sum to 1 per pair.
    """
    g = topology.simple_graph()
    for (src, dst), options in routes.paths.items():
        if not options:
            raise PlanCheckError(f"route {src}->{dst} has no path")
        total = 0.0
        for path, fraction in options:
            if fraction <= 0:
                raise PlanCheckError(f"route {src}->{dst} path {path} has fraction {fraction}")
            total += fraction
            if path[0] != src or path[-1] != dst:
                raise PlanCheckError(f"route {src}->{dst} path {path} does not join them")
            if len(set(path)) != len(path):
                raise PlanCheckError(f"route {src}->{dst} path {path} visits a server twice")
            for u, v in zip(path, path[1:]):
                if not g.has_edge(u, v):
                    raise PlanCheckError(f"route {src}->{dst} path {path}: no link {u}-{v}")
        if abs(total - 1.0) > tol:
            raise PlanCheckError(f"route {src}->{dst} fractions sum to {total}, not 1")


def check_ring(order: tuple[int, ...], members: tuple[int, ...]) -> None:
    """Raise :class:`PlanCheckError` unless ``order`` visits each member exactly once."""
    if sorted(order) != sorted(members) or len(set(order)) != len(order):
        raise PlanCheckError(f"ring {list(order)} is not a Hamiltonian cycle of {list(members)}")
