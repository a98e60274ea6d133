"""Network fabrics (TopoOpt §5 baselines), their routing and their cost.

Contract (the estimator, the planner and REACT rely on it): a :class:`Fabric` is
frozen; servers are nodes ``0..n-1``, switches ``n..``; links are DIRECTED, given
as arrays ``src``, ``dst``, ``capacity`` (bits/s), ``latency`` (s) -- so a fabric
is a network for :func:`topoopt.netsim.simulate`. ``fabric.paths(s, t)`` lists
``(link ids, weight)`` with weights summing to 1 (ECMP = equal weight per
shortest path); ``fabric.route(src, dst, random=False, seed=0)`` gives the same
for arrays of flows as a :class:`topoopt.netsim.FlowRoutes` (``random=True``:
one seeded random shortest path per flow).

Builders: :func:`ideal_switch`, :func:`star`, :func:`fat_tree` (full bisection,
or ``oversubscription=2``), :func:`leaf_spine` (two-tier Clos), :func:`expander`, :func:`direct_connect` (a TopoOpt
topology + routes, host-based forwarding). :mod:`topoopt.fabrics.catalog` builds
the named fabrics of a cluster; :mod:`topoopt.fabrics.cost` prices them;
:func:`placed_fabric` is a shared fabric as one job on some of its servers sees it.
"""

from topoopt.fabrics.direct import direct_connect, expander
from topoopt.fabrics.fabric import KINDS, OPTICS, Fabric, check_fabric
from topoopt.fabrics.placed import placed_fabric
from topoopt.fabrics.switched import fat_tree, fat_tree_arity, ideal_switch, leaf_spine, star

__all__ = ["Fabric", "check_fabric", "KINDS", "OPTICS", "star", "ideal_switch", "fat_tree",
           "fat_tree_arity", "leaf_spine", "direct_connect", "expander",
           "placed_fabric"]
