"""The named fabrics of TopoOpt §5 for a cluster and job: one registry line per fabric.

Reconfigurable fabrics (OCS-reconfig, SiP-ML) are fabrics too -- their circuits at the
start, priced like any other -- with a :class:`~topoopt.fabrics.reconfigurable.Reconfiguration`
in ``info["reconfig"]``; their iteration time is simulated by :mod:`topoopt.reconfig`
(:func:`topoopt.reconfig.iteration_estimator` picks the estimator for any fabric).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError
from topoopt.fabrics.cost import DEFAULT_PRICES, PriceTable, cost_equivalent_bandwidth
from topoopt.fabrics.direct import direct_connect, expander
from topoopt.fabrics.fabric import Fabric
from topoopt.fabrics.reconfigurable import ocs_reconfig, sip_ml
from topoopt.fabrics.switched import fat_tree, ideal_switch
from topoopt.finder.topology_finder import topology_finder
from topoopt.model import Model
from topoopt.strategy import Strategy
from topoopt.traffic import derive_traffic

__all__ = ["FabricContext", "FabricSpec", "FABRICS", "build_fabric", "register_fabric"]


@dataclass(frozen=True)
class FabricContext:
    """What a fabric builder may look at.

    Attributes
    ----------
    cluster : Cluster
    prices : PriceTable
    seed : int
    job, model, strategy : optional
        The job being planned (a TopoOpt shard is built for its traffic).
    """

    cluster: Any
    prices: PriceTable = DEFAULT_PRICES
    seed: int = 0
    job: Any = None
    model: Any = None
    strategy: Any = None


@dataclass(frozen=True)
class FabricSpec:
    """How to build one named fabric.

    Attributes
    ----------
    name : str
        The ``--fabric`` name.
    title : str
        What it is, for tables.
    build : callable
        ``build(ctx: FabricContext) -> Fabric``.
    reconfigurable : bool
        Its circuits change within an iteration (the fabric carries a
        :class:`~topoopt.fabrics.reconfigurable.Reconfiguration`).
    """

    name: str
    title: str
    build: Callable[[FabricContext], Fabric]
    reconfigurable: bool = False


def _fattree(ctx: FabricContext) -> Fabric:
    c = ctx.cluster
    speed = cost_equivalent_bandwidth(c.servers, c.nics, c.link_bandwidth, ctx.prices)
    return fat_tree(c.servers, speed, c.link_latency)


def _topoopt(ctx: FabricContext) -> Fabric:
    """A TopoOpt shard (patch panels) from TopologyFinder on the job's traffic."""
    c, job = ctx.cluster, ctx.job
    if ctx.model is None or ctx.strategy is None or job is None:
        raise ConfigError("fabric", "topoopt", "needs the job, model and strategy to plan for")
    traffic = derive_traffic(ctx.model, ctx.strategy, c.servers, job.global_batch(c),
                             job.dtype_bytes)
    plan = topology_finder(traffic, c.servers, c.nics, c.link_bandwidth, c.link_latency,
                           seed=ctx.seed)
    return direct_connect(plan.topology, plan.routes, optics="patch_panel", name="topoopt",
                          rings=plan.rings)


_REGISTRY: dict[str, FabricSpec] = {}


def register_fabric(spec: FabricSpec) -> None:
    """Add a fabric to :data:`FABRICS` (table order = registration order)."""
    _REGISTRY[spec.name] = spec


# One line per fabric.
register_fabric(FabricSpec("topoopt", "TopoOpt shard (d x B ports, patch panel, TopologyFinder)",
                           _topoopt))
# Any two servers one link latency apart (two links of half of it), as on a direct
# fibre: with the same d x B per server, no forwarding and no blocking, the Ideal
# Switch is then a relaxation of every fabric here, its time a bound on theirs.
register_fabric(FabricSpec("ideal", "Ideal Switch (d x B per server, non-blocking)",
                           lambda x: ideal_switch(x.cluster.servers, x.cluster.server_bandwidth,
                                                  x.cluster.link_latency / 2)))
register_fabric(FabricSpec("fattree", "Fat-tree, full bisection, cost-equivalent (d x B')",
                           _fattree))
register_fabric(FabricSpec("oversub", "Fat-tree 2:1 oversubscribed (d x B links)",
                           lambda x: fat_tree(x.cluster.servers, x.cluster.server_bandwidth,
                                              x.cluster.link_latency, oversubscription=2)))
register_fabric(FabricSpec("expander", "Expander, random d-regular (d x B ports)",
                           lambda x: expander(x.cluster.servers, x.cluster.nics,
                                              x.cluster.link_bandwidth, x.cluster.link_latency,
                                              seed=x.seed)))
register_fabric(FabricSpec("ocs-reconfig",
                           "OCS-reconfig, circuits re-planned every 50 ms, 10 ms per change, "
                           "host forwarding (d x B ports, OCS)",
                           lambda x: ocs_reconfig(x.cluster.servers, x.cluster.nics,
                                                  x.cluster.link_bandwidth,
                                                  x.cluster.link_latency, seed=x.seed),
                           reconfigurable=True))
register_fabric(FabricSpec("ocs-reconfig-nofw",
                           "OCS-reconfig without host forwarding (d x B ports, OCS)",
                           lambda x: ocs_reconfig(x.cluster.servers, x.cluster.nics,
                                                  x.cluster.link_bandwidth,
                                                  x.cluster.link_latency, forwarding=False,
                                                  seed=x.seed),
                           reconfigurable=True))
register_fabric(FabricSpec("sipml", "SiP-ML, SiP-Ring of d wavelengths of B, 25 us per change, "
                                    "no forwarding, one job",
                           lambda x: sip_ml(x.cluster.servers, x.cluster.nics,
                                            x.cluster.link_bandwidth, x.cluster.link_latency),
                           reconfigurable=True))

#: Name -> :class:`FabricSpec`, in table order (read-only view of the registry).
FABRICS: Mapping[str, FabricSpec] = MappingProxyType(_REGISTRY)


def build_fabric(name: str, cluster: Cluster, prices: PriceTable = DEFAULT_PRICES, seed: int = 0,
                 job: Job | None = None, model: Model | None = None, strategy: Strategy | None = None) -> Fabric:
    """Build the fabric called ``name`` (see :data:`FABRICS`) for ``cluster``.

    ``job``, ``model`` and ``strategy`` are needed by ``"topoopt"`` only (its
    topology is planned for that job's traffic).

    Raises
    ------
    ConfigError
        Unknown name, or ``"topoopt"`` without a job.
    """
    spec = FABRICS.get(name)
    if spec is None:
        raise ConfigError("fabric", name, f"use one of {', '.join(FABRICS)}")
    return spec.build(FabricContext(cluster, prices, seed, job, model, strategy))
