"""Direct-connect topologies: the TopologyFinder of TopoOpt §4 and its building blocks."""

from topoopt.topology.topology import (Link, Routes, Topology, check_ring, check_routes,
                                       check_topology)

__all__ = ["Link", "Topology", "Routes", "check_topology", "check_routes", "check_ring"]
