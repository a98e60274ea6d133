"""The named fabrics of TopoOpt §5 for a cluster: one registry line per fabric."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

from topoopt.errors import ConfigError
from topoopt.fabrics.cost import DEFAULT_PRICES, PriceTable, cost_equivalent_bandwidth
from topoopt.fabrics.direct import expander
from topoopt.fabrics.fabric import Fabric
from topoopt.fabrics.switched import fat_tree, ideal_switch

__all__ = ["FabricSpec", "FABRICS", "build_fabric", "register_fabric"]


@dataclass(frozen=True)
class FabricSpec:
    """How to build one named fabric for a cluster.

    Attributes
    ----------
    name : str
        The ``--fabric`` name.
    title : str
        What it is, for tables.
    build : callable
        ``build(cluster, prices, seed) -> Fabric``.
    """

    name: str
    title: str
    build: Callable[..., Fabric]


def _fattree(cluster, prices: PriceTable, seed: int) -> Fabric:
    speed = cost_equivalent_bandwidth(cluster.servers, cluster.nics, cluster.link_bandwidth,
                                      prices)
    return fat_tree(cluster.servers, speed, cluster.link_latency)


_REGISTRY: dict[str, FabricSpec] = {}


def register_fabric(spec: FabricSpec) -> None:
    """Add a fabric to :data:`FABRICS` (e.g. the TopoOpt direct-connect plan)."""
    _REGISTRY[spec.name] = spec


# One line per fabric; the TopoOpt shard joins with one more once the planner exists.
register_fabric(FabricSpec("ideal", "Ideal Switch (d x B per server, non-blocking)",
                           lambda c, p, s: ideal_switch(c.servers, c.server_bandwidth,
                                                        c.link_latency)))
register_fabric(FabricSpec("fattree", "Fat-tree, full bisection, cost-equivalent (d x B')",
                           _fattree))
register_fabric(FabricSpec("oversub", "Fat-tree 2:1 oversubscribed (d x B links)",
                           lambda c, p, s: fat_tree(c.servers, c.server_bandwidth,
                                                    c.link_latency, oversubscription=2)))
register_fabric(FabricSpec("expander", "Expander, random d-regular (d x B ports)",
                           lambda c, p, s: expander(c.servers, c.nics, c.link_bandwidth,
                                                    c.link_latency, seed=s)))

#: Name -> :class:`FabricSpec`, in table order (read-only view of the registry).
FABRICS: Mapping[str, FabricSpec] = MappingProxyType(_REGISTRY)


def build_fabric(name: str, cluster, prices: PriceTable = DEFAULT_PRICES, seed: int = 0
                 ) -> Fabric:
    """Build the fabric called ``name`` for ``cluster`` (see :data:`FABRICS`).

    Raises
    ------
    ConfigError
        Unknown name.
    """
    spec = FABRICS.get(name)
    if spec is None:
        raise ConfigError("fabric", name, f"use one of {', '.join(FABRICS)}")
    return spec.build(cluster, prices, seed)
