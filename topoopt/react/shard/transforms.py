"""The shard's transforms: re-split, ring switch, fibre-aware swaps, route moves.

Each is a frozen record whose ``apply`` maps a :class:`ShardConfig` to another;
:func:`shard_candidates` offers those worth estimating now and
:func:`check_shard_config` checks a result before it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from topoopt.collectives import check_pattern
from topoopt.collectives.ten import Pattern
from topoopt.errors import ConfigError
from topoopt.react.flowsim import pair_links
from topoopt.react.shard.layout import ShardConfig, ShardLayout, link_path, ring_hops
from topoopt.react.shard.model import ShardModel, resplit_weights, ring_times
from topoopt.routing.kshortest import hop_distances, k_shortest_paths, neighbour_table
from topoopt.topology.topology import Topology

__all__ = ["Resplit", "RingSwitch", "RingSwap", "RouteMove", "check_shard_config",
           "shard_candidates"]


@dataclass(frozen=True)
class Resplit:
    """New shares of the AllReduce bytes per ring."""

    weights: tuple[float, ...]
    kind = "resplit"

    def apply(self, c: ShardConfig) -> ShardConfig:
        return replace(c, weights=tuple(self.weights))

    def __str__(self) -> str:
        return "resplit " + "/".join(f"{w:.3f}" for w in self.weights)


@dataclass(frozen=True)
class RingSwitch:
    """Ring ``ring`` runs on the permutation of ``stride`` (``order``); ``reconfigure``:
    the OCS wires it on the ring's own ports first, and ``routes`` are the owned flows'
    paths on the re-wired fibres (those whose fibres it removes take a shortest path)."""

    ring: int
    stride: int
    order: tuple[int, ...]
    reconfigure: bool = False
    routes: tuple[tuple[int, ...], ...] | None = None
    kind = "switch"

    def apply(self, c: ShardConfig) -> ShardConfig:
        orders = list(c.orders)
        orders[self.ring] = self.order
        patched = list(c.patched)
        patched[self.ring] = self.reconfigure
        return replace(c, orders=tuple(orders), patched=tuple(patched),
                       routes=c.routes if self.routes is None else self.routes)

    def __str__(self) -> str:
        return f"ring{self.ring}->p={self.stride}" + (" (ocs)" if self.reconfigure else "")


@dataclass(frozen=True)
class RingSwap:
    """Swap ranks ``a`` and ``b`` in ring ``ring`` only (a chunk-local swap, §5.3)."""

    ring: int
    a: int
    b: int
    kind = "swap"

    def apply(self, c: ShardConfig) -> ShardConfig:
        order = [self.b if x == self.a else self.a if x == self.b else x
                 for x in c.orders[self.ring]]
        orders = list(c.orders)
        orders[self.ring] = tuple(order)
        return replace(c, orders=tuple(orders))

    def __str__(self) -> str:
        return f"{self.a}<->{self.b}@ring{self.ring}"


@dataclass(frozen=True)
class RouteMove:
    """Owned flow ``flow`` takes node path ``path``."""

    flow: int
    path: tuple[int, ...]
    kind = "route"

    def apply(self, c: ShardConfig) -> ShardConfig:
        routes = list(c.routes)
        routes[self.flow] = self.path
        return replace(c, routes=tuple(routes))

    def __str__(self) -> str:
        return f"route{self.flow}->{'-'.join(map(str, self.path))}"


def check_shard_config(layout: ShardLayout, config: ShardConfig) -> Pattern:
    """Raise unless ``config`` is runnable and its pattern a correct AllReduce.

    Checks: every ring visits all servers once; every owned route is a path of fibres
    from its source to its destination; OCS re-wiring only on an OCS shard; and the
    semantic checker (:func:`topoopt.collectives.check_pattern`, REACT App. A.3) on
    the pattern. Returns the pattern.
    """
    n = layout.n
    for order in config.orders:
        if sorted(order) != list(range(n)):
            raise ConfigError("ring", list(order), f"must visit each of the {n} servers once")
    if any(config.patched) and layout.optics != "ocs":
        raise ConfigError("optics", layout.optics, "only an OCS shard can re-wire a ring")
    fabric = layout.fabric_of(config)
    for flow, path in zip(layout.owned, config.routes):
        if path[0] != flow.src or path[-1] != flow.dst or len(set(path)) != len(path):
            raise ConfigError("route", list(path), f"a simple path {flow.src} -> {flow.dst}")
        link_path(fabric, path)
    p = layout.pattern(config)
    check_pattern(p)
    return p



# ------------------------------------------------------------------- candidates
def shard_candidates(layout: ShardLayout, config: ShardConfig, model: ShardModel,
                     rings: Sequence[int], nodes: Sequence[int], links: Sequence[int],
                     rng: np.random.Generator, swaps: int = 15, tabu: frozenset = frozenset()
                     ) -> list:
    """The direct-connect-aware transforms worth estimating now.

    Parameters
    ----------
    rings : ring indices with congested flows
    nodes : congested ranks (endpoints of congested flows), most congested first
    links : links (of ``config``'s fabric) carrying congested ring hops
    swaps : at most this many :class:`RingSwap` candidates (REACT's trial budget Kt);
        those whose new hops are all fibres first, then random others (their
        forwarding is priced by the estimate)
    tabu : transforms recently reverted (skipped)

    Returns
    -------
    list of transforms
    """
    out: list = []
    _, rates, lats = ring_times(layout, config, model)
    w = tuple(resplit_weights(layout, rates, lats).tolist())
    if not np.allclose(w, config.weights, rtol=1e-3, atol=1e-4):
        out.append(Resplit(w))
    fabric = layout.fabric_of(config)
    fibres = set(pair_links(fabric))
    n = layout.n
    used = set(config.orders)
    for k in rings:
        start = config.orders[k][0]
        for s in layout.strides:
            order = tuple((start + i * s) % n for i in range(n))
            if order in used:
                continue
            on_fibres = all(h in fibres for h in ring_hops(order))
            if on_fibres and not config.patched[k]:
                out.append(RingSwitch(k, s, order))
            elif layout.optics == "ocs" and layout.ports(k) is not None:
                out.append(_rewired(layout, config, RingSwitch(k, s, order, reconfigure=True)))
    keep: list[RingSwap] = []
    rest: list[RingSwap] = []
    for x in list(nodes)[:4]:                 # the most congested ranks first
        for k in rings:
            order = config.orders[k]
            pos = {r: i for i, r in enumerate(order)}
            for y in range(n):
                if y == x:
                    continue
                swap = RingSwap(k, min(x, y), max(x, y))
                new = list(order)
                new[pos[x]], new[pos[y]] = y, x
                hops = [(new[(i - 1) % n], new[i]) for i in (pos[x], pos[y])] + \
                       [(new[i], new[(i + 1) % n]) for i in (pos[x], pos[y])]
                (keep if all(h in fibres for h in hops) else rest).append(swap)
    keep, rest = list(dict.fromkeys(keep)), list(dict.fromkeys(rest))
    rest = [rest[i] for i in rng.permutation(len(rest))]
    out += (keep + rest)[:swaps]
    bad = set(int(x) for x in links)
    if layout.owned and bad:
        topo = layout.topology_of(config)
        nbrs, dist = _routing_tables(layout, config, topo)
        for i, (flow, path) in enumerate(zip(layout.owned, config.routes)):
            if not bad & set(link_path(fabric, path)):
                continue
            for alt in k_shortest_paths(nbrs, dist, flow.src, flow.dst, layout.k_routes):
                if tuple(alt) != tuple(path):
                    out.append(RouteMove(i, tuple(int(x) for x in alt)))
    return [t for t in out if t not in tabu]


def _rewired(layout: ShardLayout, config: ShardConfig, t: RingSwitch) -> RingSwitch:
    """``t`` with the owned flows whose fibres it removes on a shortest new path."""
    new = t.apply(config)
    if not layout.owned:
        return t
    topo = layout.topology_of(new)
    fibres = {(a, b) for a, _, b, _ in topo.links}
    routes = list(new.routes)
    for i, (flow, path) in enumerate(zip(layout.owned, routes)):
        if all(h in fibres for h in zip(path, path[1:])):
            continue
        nbrs, dist = _routing_tables(layout, new, topo)
        routes[i] = tuple(int(x) for x in k_shortest_paths(nbrs, dist, flow.src, flow.dst, 1)[0])
    return replace(t, routes=tuple(routes))


def _routing_tables(layout: ShardLayout, config: ShardConfig, topo: Topology):
    key = ("tables", config.orders if any(config.patched) else None)
    if key not in layout._cache:
        layout._cache[key] = (neighbour_table(topo), hop_distances(topo))
    return layout._cache[key]
