"""TopologyFinder (TopoOpt §4, Algorithm 1): degree split, TotientPerms and
SelectPermutations for the AllReduce rings, Blossom matchings for MP, then routes.

The steps live in :mod:`~topoopt.finder.degree`, :mod:`~topoopt.finder.perms` and
:mod:`~topoopt.finder.matching`; :mod:`~topoopt.finder.topology_finder` combines them
with the routing of :mod:`topoopt.routing`.
"""

from topoopt.finder.degree import allocate_group_degrees, split_degree
from topoopt.finder.matching import max_weight_matching
from topoopt.finder.perms import select_permutations, totient_perms
from topoopt.finder.topology_finder import (
                                            GroupPlan,
                                            TopologyPlan,
                                            check_topology_plan,
                                            extend_plan,
                                            topology_finder,
)

__all__ = ["topology_finder", "extend_plan", "check_topology_plan", "TopologyPlan",
           "GroupPlan", "split_degree", "allocate_group_degrees", "totient_perms",
           "select_permutations", "max_weight_matching"]
