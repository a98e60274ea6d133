"""The shard REACT tunes: the plan's fibres, rings and routes, and the state it changes.

:class:`ShardLayout` is what the tuner knows of the plan (not the network's state);
:class:`ShardConfig` is what it changes (ring orders, byte shares, owned routes, OCS
re-wiring), and the layout derives the fibres, fabric and pattern a config implies.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from topoopt._require import require_choice, require_positive
from topoopt.collectives import multi_ring_allreduce
from topoopt.collectives.ten import Pattern
from topoopt.errors import ConfigError
from topoopt.fabrics import direct_connect
from topoopt.fabrics.fabric import OPTICS, Fabric
from topoopt.finder.perms import totient_perms
from topoopt.react.flowsim import BackgroundFlows, pair_links
from topoopt.topology.topology import Routes, Topology

__all__ = ["RECONFIGURATION_S", "shard_fabric", "ShardLayout", "ShardConfig", "ring_hops",
           "link_path", "node_path"]

#: OCS reconfiguration latency, seconds (TopoOpt §5.1, "OCS-reconfig": 10 ms;
#: docs/reference-data.md).
RECONFIGURATION_S = 10e-3


# ----------------------------------------------------------------------- the shard
def shard_fabric(topology: Topology, routes: Routes | None = None, optics: str = "patch_panel",
                 tx: Mapping[tuple[int, int], float] | None = None,
                 rx: Mapping[tuple[int, int], float] | None = None) -> Fabric:
    """The direct-connect fabric of ``topology`` with per-port gray failures.

    A fibre ``(a, pa) -> (b, pb)`` carries ``min(B, tx[a, pa], rx[b, pb])`` bits/s: a
    dirty connector or a NIC at half rate belongs to a port, so it stays with the port
    when an OCS re-wires it. Parallel fibres between two servers are one bundled link
    of their summed rates (:func:`topoopt.fabrics.direct_connect`). Explicit ``routes``
    are kept if every hop of every route is still a fibre; otherwise (a re-wired
    topology) all pairs take ECMP over shortest paths.
    """
    tx, rx = dict(tx or {}), dict(rx or {})
    links = {(a, b) for a, _, b, _ in topology.links}
    if routes is not None and not all(
            (u, v) in links for opts in routes.paths.values() for path, _ in opts
            for u, v in zip(path, path[1:])):
        routes = None
    fabric = direct_connect(topology, routes, optics=optics, name="plan")
    if not tx and not rx:
        return fabric
    B = float(topology.link_bandwidth)
    key = fabric.src * topology.servers + fabric.dst
    cap = np.zeros(fabric.links)
    for a, pa, b, pb in topology.links:
        i = int(np.searchsorted(key, a * topology.servers + b))
        cap[i] += min(B, tx.get((a, pa), B), rx.get((b, pb), B))
    return fabric.with_capacity(cap)


def _ring_ports(topology: Topology, order: Sequence[int]) -> tuple[dict, dict] | None:
    """Transmit and receive port of each rank on ring ``order`` (None if a hop is not
    a fibre): the ports an OCS may re-wire for this ring."""
    free: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for a, pa, b, pb in topology.links:
        free.setdefault((a, b), []).append((pa, pb))
    tx, rx = {}, {}
    for u, v in zip(order, list(order[1:]) + [order[0]]):
        opts = free.get((u, v))
        if not opts:
            return None
        pa, pb = opts.pop(0)
        tx[u], rx[v] = pa, pb
    return tx, rx


@dataclass(frozen=True, eq=False)
class ShardLayout:
    """What the tuner knows about the shard: the plan, not the network's state.

    Attributes
    ----------
    topology : Topology
        The planned fibres.
    fabric : Fabric
        The planned shard with its routes (nominal rates).
    rings : tuple of tuple of int
        The planned ring orders (the initial pattern).
    size : float
        Bytes per AllReduce.
    strides : tuple of int
        TopologyFinder's candidate ring permutations (TotientPerms of n).
    optics : str
        ``patch_panel``/``none`` (fixed fibres) or ``ocs`` (rings may be re-wired).
    reconfiguration : float
        Seconds an OCS re-wiring stalls the next epoch.
    owned : tuple of BackgroundFlows
        The job's own host-forwarded flows (MP traffic) that REACT may re-route.
    k_routes : int
        Alternatives per owned flow (k shortest paths).
    min_share : float
        Smallest share of the bytes a ring keeps after a re-split (so it stays observed).
    itemsize : int
        Bytes per element of the AllReduce buffer.
    routes : Routes or None
        The plan's routes (host forwarding of the pairs with no fibre).
    """

    topology: Topology
    fabric: Fabric
    rings: tuple[tuple[int, ...], ...]
    size: float
    strides: tuple[int, ...]
    optics: str = "patch_panel"
    reconfiguration: float = RECONFIGURATION_S
    owned: tuple[BackgroundFlows, ...] = ()
    k_routes: int = 4
    min_share: float = 0.01
    itemsize: int = 4
    routes: Routes | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, topology: Topology, rings: Sequence[Sequence[int]], size: float,
           routes: Routes | None = None, optics: str = "patch_panel",
           owned: Sequence[BackgroundFlows] = (), reconfiguration: float = RECONFIGURATION_S
           ) -> "ShardLayout":
        """The layout of a plan: its topology, rings, routes and the candidate strides."""
        require_choice("optics", optics, OPTICS)
        require_positive("size", size)
        orders = tuple(tuple(int(x) for x in r) for r in rings)
        if not orders:
            raise ConfigError("rings", orders, "a shard layout needs the plan's rings")
        n = topology.servers
        if any(sorted(r) != list(range(n)) for r in orders):
            raise ConfigError("rings", [list(r) for r in orders],
                              f"every ring must visit all {n} servers")
        return cls(topology, shard_fabric(topology, routes, optics), orders, float(size),
                   totient_perms(n) if n > 2 else (1,), optics, float(reconfiguration),
                   tuple(owned), routes=routes)

    @property
    def n(self) -> int:
        return self.topology.servers

    @property
    def steps(self) -> int:
        """TEN steps of a ring AllReduce: 2(n - 1)."""
        return 2 * (self.n - 1)

    def ports(self, k: int) -> tuple[dict, dict] | None:
        """Transmit/receive ports of planned ring ``k`` (what an OCS may re-wire)."""
        key = ("ports", k)
        if key not in self._cache:
            self._cache[key] = _ring_ports(self.topology, self.rings[k])
        return self._cache[key]

    def initial(self) -> "ShardConfig":
        """The plan as it is: its rings, equal shares, owned flows on their routes."""
        return ShardConfig(self.rings, tuple([1.0 / len(self.rings)] * len(self.rings)),
                           tuple(self.default_route(b) for b in self.owned),
                           tuple([False] * len(self.rings)))

    def default_route(self, flow: BackgroundFlows) -> tuple[int, ...]:
        """The planned node path of an owned flow: its first route path, or a shortest."""
        paths = self.fabric.paths(flow.src, flow.dst)
        return node_path(self.fabric, paths[0][0], flow.src)

    # -- the physical state a config implies --------------------------------------
    def topology_of(self, config: "ShardConfig") -> Topology:
        """The fibres under ``config``: the plan, with OCS-re-wired rings replaced."""
        if not any(config.patched):
            return self.topology
        key = ("topo", config.orders, config.patched)
        if key in self._cache:
            return self._cache[key]
        drop, add = set(), []
        for k, on in enumerate(config.patched):
            if not on:
                continue
            ports = self.ports(k)
            if ports is None:
                raise ConfigError("patched", k, "an OCS re-wires only a ring of fibres")
            tx, rx = ports
            old = self.rings[k]
            drop |= {(u, tx[u], v, rx[v]) for u, v in ring_hops(old)}
            add += [(u, tx[u], v, rx[v]) for u, v in ring_hops(config.orders[k])]
        keep = [(link, lab) for link, lab in zip(self.topology.links, self.topology.labels
                                                 or [""] * len(self.topology.links))
                if link not in drop]
        links = tuple(link for link, _ in keep) + tuple(add)
        labels = tuple(lab for _, lab in keep) + ("ring:ocs",) * len(add)
        topo = Topology(self.n, self.topology.ports, links, self.topology.link_bandwidth,
                        self.topology.link_latency, labels)
        self._cache[key] = topo
        return topo

    def fabric_of(self, config: "ShardConfig") -> Fabric:
        """The fabric under ``config`` (nominal rates)."""
        if not any(config.patched):
            return self.fabric
        key = ("fabric", config.orders, config.patched)
        if key not in self._cache:
            self._cache[key] = shard_fabric(self.topology_of(config), self.routes, self.optics)
        return self._cache[key]

    def pattern(self, config: "ShardConfig") -> Pattern:
        """The multi-ring AllReduce of ``config`` (cached)."""
        key = ("pattern", config.orders, config.weights)
        if key not in self._cache:
            if len(self._cache) > 512:
                self._cache.clear()
            self._cache[key] = multi_ring_allreduce(config.orders, self.size, self.itemsize,
                                                    weights=config.weights)
        return self._cache[key]

    def owned_flows(self, config: "ShardConfig", fabric: Fabric | None = None
                    ) -> tuple[BackgroundFlows, ...]:
        """The owned flows pinned to their routes in ``config`` (link ids of ``fabric``)."""
        fabric = self.fabric_of(config) if fabric is None else fabric
        return tuple(replace(b, path=tuple(link_path(fabric, p)))
                     for b, p in zip(self.owned, config.routes))


def ring_hops(order: Sequence[int]) -> list[tuple[int, int]]:
    order = list(order)
    return list(zip(order, order[1:] + order[:1]))


def link_path(fabric: Fabric, nodes: Sequence[int]) -> list[int]:
    ids = pair_links(fabric)
    try:
        return [ids[(u, v)] for u, v in zip(nodes, nodes[1:])]
    except KeyError as exc:
        raise ConfigError("route", list(nodes), f"hop {exc.args[0]} is not a fibre") from None


def node_path(fabric: Fabric, links: np.ndarray, src: int) -> tuple[int, ...]:
    head = {int(fabric.src[i]): int(fabric.dst[i]) for i in links.tolist()}
    node, out = int(src), [int(src)]
    while node in head:
        node = head.pop(node)
        out.append(node)
    return tuple(out)


# ----------------------------------------------------------------------- configs
@dataclass(frozen=True)
class ShardConfig:
    """The state REACT tunes on a shard (hashable).

    Attributes
    ----------
    orders : tuple of tuple of int
        Ring orders (one chunk each).
    weights : tuple of float
        Share of the AllReduce bytes per ring (sums to 1).
    routes : tuple of tuple of int
        Node path of each owned flow (:attr:`ShardLayout.owned`).
    patched : tuple of bool
        Ring ``k`` runs on OCS circuits wired for its order (not the planned fibres).
    """

    orders: tuple[tuple[int, ...], ...]
    weights: tuple[float, ...]
    routes: tuple[tuple[int, ...], ...] = ()
    patched: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if not self.patched:
            object.__setattr__(self, "patched", tuple([False] * len(self.orders)))
        w = np.asarray(self.weights, float)
        if w.shape != (len(self.orders),) or np.any(~(w > 0)):
            raise ConfigError("weights", self.weights, "one positive share per ring")
        object.__setattr__(self, "weights", tuple(float(x) for x in w / w.sum()))
