"""Route classes of the task graphs one builder makes: each distinct route once.

A flow's route is a row of a growing CSR (:class:`RouteStore`); flows on the same
route share its row (its *class*), which lets the simulator solve max-min per class
(flows of one class freeze together). :class:`RouteCache` keeps the classes of rings,
per-pair flows and coflows across graphs, since the search builds thousands of graphs
on one fabric.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from topoopt.fabrics.fabric import Fabric
from topoopt.netsim.workload import FlowRoutes

__all__ = ["RouteStore", "RouteCache", "RingRoute", "ring_flow_routes", "row_latency",
           "alone_rate"]


class RouteStore:
    """Route classes: a growing CSR of distinct routes (rows never move or change)."""

    def __init__(self) -> None:
        self.ptr = np.zeros(1025, np.int64)
        self.link = np.empty(4096, np.int64)
        self.weight = np.empty(4096)
        self.rows = 0
        self._view: FlowRoutes | None = None

    @property
    def entries(self) -> int:
        """Link entries over every row."""
        return int(self.ptr[self.rows])

    def add(self, routes: FlowRoutes) -> np.ndarray:
        """Append the rows of ``routes``; return their class ids."""
        k, e = len(routes), routes.link.size
        r0, e0 = self.rows, self.entries
        while r0 + k + 1 > self.ptr.size:
            self.ptr = np.concatenate([self.ptr, np.zeros(self.ptr.size, np.int64)])
        while e0 + e > self.link.size:
            self.link = np.concatenate([self.link, np.empty(self.link.size, np.int64)])
            self.weight = np.concatenate([self.weight, np.empty(self.weight.size)])
        self.ptr[r0 + 1:r0 + k + 1] = e0 + routes.ptr[1:]
        self.link[e0:e0 + e] = routes.link
        self.weight[e0:e0 + e] = routes.weight
        self.rows += k
        self._view = None
        return np.arange(r0, r0 + k, dtype=np.int64)

    def view(self) -> FlowRoutes:
        """The rows so far (a view: later rows do not show in it)."""
        if self._view is None:
            e = self.entries
            self._view = FlowRoutes(self.ptr[:self.rows + 1], self.link[:e], self.weight[:e])
        return self._view


class RingRoute(NamedTuple):
    """A ring's coupled flow: its route class and its slowest hop's latency (seconds)."""

    route_class: int
    hop_latency: float


def ring_flow_routes(fabric: Fabric, orders: Sequence[Sequence[int]], random: bool = False,
                     seed: int | None = 0) -> tuple[FlowRoutes, np.ndarray]:
    """One coupled flow per ring: its route is every hop's route (weights summed
    where hops share a link); its latency is the slowest hop's.

    Parameters
    ----------
    fabric : Fabric
    orders : sequence of sequence of int
        Each ring's servers, in ring order.
    random : bool
        One seeded random shortest path per hop instead of ECMP.
    seed : int, optional

    Returns
    -------
    routes : FlowRoutes
        One row per ring.
    hop_latency : ndarray
        Largest hop path latency per ring, seconds.
    """
    hops_src = np.concatenate([np.asarray(o, np.int64) for o in orders])
    hops_dst = np.concatenate([np.roll(np.asarray(o, np.int64), -1) for o in orders])
    owner = np.repeat(np.arange(len(orders)), [len(o) for o in orders])
    return fabric.coupled_route(hops_src, hops_dst, owner, np.ones(owner.size), len(orders),
                                random=random, seed=seed)


def row_latency(fabric: Fabric, routes: FlowRoutes) -> np.ndarray:
    """Per route row, the weighted sum of its link latencies."""
    owner = np.repeat(np.arange(len(routes)), np.diff(routes.ptr))
    return np.bincount(owner, weights=fabric.latency[routes.link] * routes.weight,
                       minlength=len(routes))


def alone_rate(cap: np.ndarray, link: np.ndarray, weight: np.ndarray,
               counts: np.ndarray) -> np.ndarray:
    """Per route row (``counts[i]`` consecutive entries of ``link``/``weight``), the
    most bits/s a flow gets on it alone, ``min(capacity / weight)``; ``inf`` for a row
    with no link or a link down (a flow there is stuck, which the simulation says)."""
    rate = np.full(counts.size, np.inf)
    has = counts > 0
    if has.any():
        with np.errstate(divide="ignore"):
            per = cap[link] / weight
        low = np.minimum.reduceat(per, (np.cumsum(counts) - counts)[has])
        rate[has] = np.where(low > 0, low, np.inf)
    return rate


class RouteCache:
    """The route classes of rings, per-pair flows and coflows on one fabric, each
    routed once (with ``random_paths``, drawn anew every time and not kept).

    Parameters
    ----------
    fabric : Fabric
    random_paths : bool
        One seeded random shortest path per flow instead of ECMP.
    seed : int
    """

    def __init__(self, fabric: Fabric, random_paths: bool = False, seed: int = 0) -> None:
        self.fabric, self.random_paths, self.seed = fabric, random_paths, seed
        self.n = fabric.servers
        self.store = RouteStore()
        self._rings: dict[tuple[int, ...], RingRoute] = {}
        # member (src, dst, share) rows as bytes -> (class, latency)
        self._coflows: dict[bytes, tuple[int, float]] = {}
        # src x n + dst -> class and latency: n^2 entries, made on the first per-pair
        # flow (a builder on coflows never needs them)
        self._pairs = np.empty(0, np.int64)
        self._pair_lat = np.empty(0)

    @property
    def coflows(self) -> int:
        """Coflow routes kept."""
        return len(self._coflows)

    def ring(self, order: tuple[int, ...]) -> RingRoute:
        """The coupled flow of one ring (:func:`ring_flow_routes`)."""
        hit = None if self.random_paths else self._rings.get(order)
        if hit is None:
            routes, lat = ring_flow_routes(self.fabric, [order], self.random_paths, self.seed)
            hit = RingRoute(int(self.store.add(routes)[0]), float(lat[0]))
            if not self.random_paths:
                self._rings[order] = hit
        return hit

    def pair_classes(self, src: np.ndarray, dst: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Route class and latency of a flow per (``src``, ``dst``) pair."""
        if self.random_paths:
            r = self.fabric.route(src, dst, random=True, seed=self.seed)
            return self.store.add(r), row_latency(self.fabric, r)
        n = self.n
        if not self._pairs.size:
            self._pairs = np.full(n * n, -1, np.int64)
            self._pair_lat = np.zeros(n * n)
        key = src * n + dst
        cls = self._pairs[key]
        miss = cls < 0
        if miss.any():
            new = np.unique(key[miss])
            r = self.fabric.route(new // n, new % n)
            self._pair_lat[new] = row_latency(self.fabric, r)
            self._pairs[new] = self.store.add(r)
            cls = self._pairs[key]
        return cls, self._pair_lat[key]

    def coflow_classes(self, src: np.ndarray, dst: np.ndarray, member: np.ndarray,
                       share: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
        """Route class and latency of each coflow: member ``i`` (``src[i]`` to
        ``dst[i]``, a ``share[i]`` of its bytes) belongs to coflow ``member[i]``; a
        coflow's members, rows of (src, dst, share bits), are its key."""
        if self.random_paths:
            routes, lat = self.fabric.coupled_route(src, dst, member, share, groups,
                                                    random=True, seed=self.seed)
            return self.store.add(routes), lat
        order = np.argsort(member, kind="stable")
        edges = (24 * np.concatenate([[0], np.cumsum(np.bincount(member, minlength=groups))])
                 ).tolist()
        rows = np.empty((order.size, 3), np.int64)
        rows[:, 0] = src[order]
        rows[:, 1] = dst[order]
        rows[:, 2] = np.asarray(share, float)[order].view(np.int64)
        blob = rows.tobytes()
        cls = np.empty(groups, np.int64)
        lat = np.empty(groups)
        missing, keys = [], []
        get = self._coflows.get
        for g in range(groups):
            key = blob[edges[g]:edges[g + 1]]
            hit = get(key)
            if hit is None:
                missing.append(g)
                keys.append(key)
            else:
                cls[g], lat[g] = hit
        if missing:
            miss = np.asarray(missing, np.int64)
            renum = np.full(groups, -1, np.int64)
            renum[miss] = np.arange(miss.size)
            take = renum[member] >= 0
            routes, mlat = self.fabric.coupled_route(src[take], dst[take], renum[member[take]],
                                                     share[take], miss.size)
            new = self.store.add(routes)
            cls[miss] = new
            lat[miss] = mlat
            for k, c, x in zip(keys, new.tolist(), mlat.tolist()):
                self._coflows[k] = (c, x)
        return cls, lat
