"""Direct-connect topologies: servers, ports and fibres, the routes over them, and
their invariants (no port used twice, rings that are Hamiltonian cycles, routes
made of links). TopologyFinder, which builds them, is :mod:`topoopt.finder`.
"""

from topoopt.topology.topology import (
                                       Link,
                                       RouteArrays,
                                       Routes,
                                       Topology,
                                       check_ring,
                                       check_routes,
                                       check_topology,
)

__all__ = ["Link", "Topology", "Routes", "RouteArrays", "check_topology", "check_routes",
           "check_ring"]
