"""REACT on a planned TopoOpt shard: the plan's rings as the initial pattern, transforms
that know the fabric is direct-connect, and the feedback loop that picks them.

On a switched fabric REACT (§5.3) swaps ranks: any pair of servers is one switch hop
apart, so a swap only changes who talks to whom. On a TopoOpt shard the fibres are
fixed (patch panel) or slow to move (OCS, ~10 ms, TopoOpt §5.1), and every ring hop of
the plan is a fibre (TopoOpt §4.3): a swap turns hops into host-forwarded multi-hop
paths that share fibres with the other rings (the bandwidth tax of TopoOpt §3). The
transforms here keep to what the shard can do:

* :class:`Resplit` -- move AllReduce bytes between the planned rings. Each ring
  reduces only its own chunks (TotientPerms gave several, §4.3), so any split is a
  correct AllReduce; taking bytes away from a ring that crosses a slow fibre is safe.
* :class:`RingSwitch` -- run a ring on another TopologyFinder candidate permutation
  (stride ``p`` with ``gcd(p, n) = 1``, :func:`topoopt.finder.perms.totient_perms`)
  whose hops are all fibres of the shard (spare fibres); on an OCS shard also one
  that the OCS can wire on the ring's own ports, paying the reconfiguration latency.
* :class:`RingSwap` -- swap two ranks in one ring (REACT's chunk-local swap),
  estimated with the forwarding cost of every hop that is no longer a fibre.
* :class:`RouteMove` -- move one of the job's host-forwarded flows (MP traffic) to
  another of its k shortest paths, off a congested or degraded fibre.

Every pattern a transform produces passes the semantic checker
(:func:`topoopt.collectives.check_pattern`) before it is run.

The estimate (:class:`ShardModel`) is REACT's §5.4.1 model on the fibres: what a hop
got is read from its flows' completion times (``8 bytes / (FCT - latency)``), kept per
fibre port for H epochs (an unseen fibre gets the median), and a candidate's ring hop
is priced over its route with the fibre shared among the hops and owned flows that
cross it. A ring's flows depend on their two neighbours' previous step (Algorithm 2),
so with a duration ``d[p]`` per hop a ring of n ranks takes exactly
``2(n-1) max_p d[p]`` (the slowest hop, every step); the collective is its slowest ring.

The loop (:func:`shard_leader_step`, driven by :func:`run_shard_react`) is REACT's
(§5.2, §5.4, Table 3): congestion is detected from FCTs (steady or erratic, Eq. 1-2);
then the best estimated transform is applied while it gains more than epsilon (at most
Amax per batch), kept when the next batch is faster by tau_r, else reverted; at most
Emax exploration rounds, renewed after Emax x B quiet epochs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from topoopt._require import require_choice, require_positive
from topoopt.collectives import check_pattern, multi_ring_allreduce
from topoopt.collectives.ten import Pattern
from topoopt.errors import ConfigError
from topoopt.fabrics import direct_connect
from topoopt.fabrics.fabric import OPTICS, Fabric
from topoopt.finder.perms import totient_perms
from topoopt.react.detection import detect_congestion
from topoopt.react.flowsim import BackgroundFlows, hop_paths, pair_links
from topoopt.react.loop import LoopCounters, ReactParams, ReactRun
from topoopt.routing.kshortest import hop_distances, k_shortest_paths, neighbour_table
from topoopt.topology.topology import Routes, Topology

__all__ = ["RECONFIGURATION_S", "ShardLayout", "ShardConfig", "Resplit", "RingSwitch",
           "RingSwap", "RouteMove", "ShardModel", "shard_fabric", "ring_times",
           "resplit_weights", "shard_candidates", "check_shard_config", "ShardState",
           "ShardDecision", "shard_leader_init", "shard_leader_step", "run_shard_react"]

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
        rings = tuple(tuple(int(x) for x in r) for r in rings)
        if not rings:
            raise ConfigError("rings", rings, "a shard layout needs the plan's rings")
        n = topology.servers
        if any(sorted(r) != list(range(n)) for r in rings):
            raise ConfigError("rings", [list(r) for r in rings],
                              f"every ring must visit all {n} servers")
        return cls(topology, shard_fabric(topology, routes, optics), rings, float(size),
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
        return _node_path(self.fabric, paths[0][0], flow.src)

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
            tx, rx = self.ports(k)
            old = self.rings[k]
            drop |= {(u, tx[u], v, rx[v]) for u, v in _hops(old)}
            add += [(u, tx[u], v, rx[v]) for u, v in _hops(config.orders[k])]
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
        return tuple(replace(b, path=tuple(_link_path(fabric, p)))
                     for b, p in zip(self.owned, config.routes))


def _hops(order: Sequence[int]) -> list[tuple[int, int]]:
    order = list(order)
    return list(zip(order, order[1:] + order[:1]))


def _link_path(fabric: Fabric, nodes: Sequence[int]) -> list[int]:
    ids = pair_links(fabric)
    try:
        return [ids[(u, v)] for u, v in zip(nodes, nodes[1:])]
    except KeyError as exc:
        raise ConfigError("route", list(nodes), f"hop {exc.args[0]} is not a fibre") from None


def _node_path(fabric: Fabric, links: np.ndarray, src: int) -> tuple[int, ...]:
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
        _link_path(fabric, path)
    p = layout.pattern(config)
    check_pattern(p)
    return p


# ----------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ShardModel:
    """Per-fibre-port rates read from FCTs (REACT §5.4.1 on the shard).

    ``tx[(server, port)]`` and ``rx[(server, port)]`` are ``(bits/s, epoch)``: what one
    flow alone could get through that port, last seen at ``epoch``. A fibre is priced
    ``min(tx, rx)``; a port not seen for H epochs, or never, gets the median of the seen
    ones (REACT's rule for unseen pairs).
    """

    tx: Mapping = field(default_factory=dict)
    rx: Mapping = field(default_factory=dict)

    def observe(self, layout: ShardLayout, config: ShardConfig, fct: np.ndarray,
                epoch: int) -> "ShardModel":
        """Read a batch's FCTs (shape (B, E)) of ``config``'s pattern."""
        p = layout.pattern(config)
        topo, fabric = layout.topology_of(config), layout.fabric_of(config)
        ids = pair_links(fabric)
        load, owned = _loads(layout, config, fabric)
        n = layout.n
        key = (p.chunk * n + p.src) * n + p.dst
        mean_fct = np.asarray(fct, float).mean(axis=0)
        uk, inv = np.unique(key, return_inverse=True)
        per_fct = np.bincount(inv, weights=mean_fct) / np.bincount(inv)
        per_bytes = np.bincount(inv, weights=p.nbytes.astype(float)) / np.bincount(inv)
        fibres: dict[int, list] = {}
        for a, pa, b, pb in topo.links:
            fibres.setdefault(ids[(a, b)], []).append((a, pa, b, pb))
        tx, rx = dict(self.tx), dict(self.rx)
        lat = float(topo.link_latency)
        for kk, f, nb in zip(uk.tolist(), per_fct.tolist(), per_bytes.tolist()):
            u, v = (kk // n) % n, kk % n
            link = ids.get((u, v))
            if link is None or f <= lat:
                continue                      # a forwarded hop: no single fibre to read
            share = 8.0 * nb / (f - lat) * (load[link] + owned[link])
            members = fibres[link]
            for a, pa, b, pb in members:      # a bundle: its fibres share what it got
                tx[(a, pa)] = (share / len(members), epoch)
                rx[(b, pb)] = (share / len(members), epoch)
        return ShardModel(tx, rx)

    def forget(self, before: int) -> "ShardModel":
        """Drop what was seen before epoch ``before`` (H epochs of memory)."""
        keep = lambda d: {k: v for k, v in d.items() if v[1] >= before}  # noqa: E731
        return ShardModel(keep(self.tx), keep(self.rx))

    def capacities(self, layout: ShardLayout, config: ShardConfig) -> np.ndarray:
        """Estimated bits/s of every link of ``config``'s fabric."""
        topo, fabric = layout.topology_of(config), layout.fabric_of(config)
        seen = [v[0] for v in list(self.tx.values()) + list(self.rx.values())]
        B = float(topo.link_bandwidth)
        default = float(np.median(seen)) if seen else B
        ids = pair_links(fabric)
        cap = np.zeros(fabric.links)
        for a, pa, b, pb in topo.links:
            t = self.tx.get((a, pa), (default, 0))[0]
            r = self.rx.get((b, pb), (default, 0))[0]
            cap[ids[(a, b)]] += min(t, r)
        return cap


def _loads(layout: ShardLayout, config: ShardConfig, fabric: Fabric
           ) -> tuple[np.ndarray, np.ndarray]:
    """Per link: ring hops crossing it (path-weighted) and owned flows on it."""
    load = np.zeros(fabric.links)
    for order in config.orders:
        for u, v in _hops(order):
            for links, w in hop_paths(fabric, u, v):
                load[links] += w
    owned = np.zeros(fabric.links)
    for flow, path in zip(layout.owned, config.routes):
        owned[_link_path(fabric, path)] += flow.count
    return load, owned


def ring_times(layout: ShardLayout, config: ShardConfig, model: ShardModel,
               weights: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """Estimated time of every ring of ``config`` (seconds), and its parts.

    Returns
    -------
    times : ndarray, shape (R,)
        ``2(n-1) max_p (latency_p + 8 b / rate_p)`` per ring, ``b`` its bytes per flow.
    rates, latencies : ndarray, shape (R, n)
        Per hop: estimated bits/s and seconds of latency (route-weighted).
    """
    fabric = layout.fabric_of(config)
    cap = model.capacities(layout, config)
    load, owned = _loads(layout, config, fabric)
    n, R = layout.n, len(config.orders)
    rates, lats = np.zeros((R, n)), np.zeros((R, n))
    for k, order in enumerate(config.orders):
        for p, (u, v) in enumerate(_hops(order)):
            inv_rate = lat = 0.0
            for links, w in hop_paths(fabric, u, v):
                r = float(np.min(cap[links] / np.maximum(load[links] + owned[links], 1.0)))
                inv_rate += w / max(r, 1e-300)
                lat += w * float(fabric.latency[links].sum())
            rates[k, p], lats[k, p] = 1.0 / inv_rate, lat
    w = np.asarray(config.weights if weights is None else weights, float)
    per_flow = layout.size * w / n
    times = layout.steps * np.max(lats + 8.0 * per_flow[:, None] / rates, axis=1)
    return times, rates, lats


def resplit_weights(layout: ShardLayout, rates: np.ndarray, lats: np.ndarray) -> np.ndarray:
    """Shares that finish every ring at once, from per-hop rates and latencies.

    Ring ``k`` with share ``w`` takes ``2(n-1) max_p (lat_kp + 8 S w / (n r_kp))``;
    for a target time ``tau`` per step the largest share it can take is
    ``w_k(tau) = min_p (tau - lat_kp) n r_kp / (8 S)``; bisection finds ``tau`` with
    ``sum_k max(w_k(tau), min_share) = 1``.
    """
    n, S = layout.n, layout.size
    R = rates.shape[0]
    floor = min(layout.min_share, 1.0 / R)

    def shares(tau: float) -> np.ndarray:
        return np.maximum(np.min((tau - lats) * n * rates / (8.0 * S), axis=1), floor)

    lo = float(lats.max())
    hi = lo + 8.0 * S / (n * float(rates.min())) + 1e-12
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if shares(mid).sum() >= 1.0:
            hi = mid
        else:
            lo = mid
    w = shares(hi)
    return w / w.sum()


def estimate(layout: ShardLayout, current: ShardConfig, config: ShardConfig,
             model: ShardModel, horizon: int) -> float:
    """Estimated epoch time of ``config`` when ``current`` runs now: its slowest ring,
    plus any OCS re-wiring it needs amortized over ``horizon`` epochs."""
    t = float(ring_times(layout, config, model)[0].max())
    rewired = sum(1 for k, (a, b) in enumerate(zip(current.patched, config.patched))
                  if b and (not a or current.orders[k] != config.orders[k]))
    return t + (layout.reconfiguration / horizon if rewired else 0.0)


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
            on_fibres = all(h in fibres for h in _hops(order))
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
                s = RingSwap(k, min(x, y), max(x, y))
                new = list(order)
                new[pos[x]], new[pos[y]] = y, x
                hops = [(new[(i - 1) % n], new[i]) for i in (pos[x], pos[y])] + \
                       [(new[i], new[(i + 1) % n]) for i in (pos[x], pos[y])]
                (keep if all(h in fibres for h in hops) else rest).append(s)
    keep, rest = list(dict.fromkeys(keep)), list(dict.fromkeys(rest))
    rest = [rest[i] for i in rng.permutation(len(rest))]
    out += (keep + rest)[:swaps]
    bad = set(int(x) for x in links)
    if layout.owned and bad:
        topo = layout.topology_of(config)
        nbrs, dist = _routing_tables(layout, config, topo)
        for i, (flow, path) in enumerate(zip(layout.owned, config.routes)):
            if not bad & set(_link_path(fabric, path)):
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


# ----------------------------------------------------------------------- the loop
@dataclass(frozen=True)
class _Pending:
    config: ShardConfig
    time: float
    transforms: tuple


@dataclass(frozen=True)
class ShardState(LoopCounters):
    """The shard tuner's memory between batches (immutable)."""

    params: ReactParams
    layout: ShardLayout
    config: ShardConfig
    model: ShardModel = ShardModel()
    pending: _Pending | None = None


@dataclass(frozen=True)
class ShardDecision:
    """What one step decided: the config every rank runs next, and why."""

    config: ShardConfig
    transforms: tuple = ()
    reverted: bool = False
    kept: bool = False
    forced: bool = False
    estimate_before: float = float("nan")
    estimate_after: float = float("nan")
    congested_flows: int = 0


def shard_leader_init(layout: ShardLayout, config: ShardConfig | None = None,
                      params: ReactParams = ReactParams()) -> ShardState:
    """The tuner's state at the start of the job (the plan's rings, equal shares)."""
    return ShardState(params, layout, layout.initial() if config is None else config)


def _congestion_targets(layout: ShardLayout, config: ShardConfig, cong) -> tuple:
    p = layout.pattern(config)
    flagged = cong.congested
    rings = sorted(set(p.chunk[flagged].tolist()))
    counts = np.bincount(p.src[flagged], minlength=layout.n) + \
        np.bincount(p.dst[flagged], minlength=layout.n)
    nodes = [int(x) for x in np.argsort(-counts, kind="stable") if counts[x] > 0]
    fabric = layout.fabric_of(config)
    links: set[int] = set()
    for u, v in set(zip(p.src[flagged].tolist(), p.dst[flagged].tolist())):
        for ls, _ in hop_paths(fabric, u, v):
            links.update(ls.tolist())
    return rings, nodes, sorted(links)


def shard_leader_step(state: ShardState, fct: np.ndarray, epoch_time: np.ndarray
                      ) -> tuple[ShardState, ShardDecision]:
    """One pass of the loop after a batch of B epochs run with ``state.config``.

    1. Read the batch's FCTs into the model; forget what is older than H epochs.
    2. If the last batch changed the config: keep it when the observed time improved
       by tau_r (``T_old >= (1 + tau_r) T_new``), else revert (the reverted transforms
       are not tried again for H epochs). The first epoch after an OCS re-wiring (its
       stall) is left out of that comparison.
    3. With exploration rounds left (Emax, renewed after Emax x B quiet epochs) and
       congestion detected (§5.2): apply the best estimated transform while it gains
       more than epsilon, at most Amax; check the result with the semantic checker.
    """
    P, L = state.params, state.layout
    fct = np.asarray(fct, float)
    epoch_time = np.asarray(epoch_time, float)
    B = fct.shape[0]
    p = L.pattern(state.config)
    if fct.ndim != 2 or fct.shape[1] != p.edges_count or epoch_time.shape != (B,):
        raise ConfigError("fct", fct.shape, f"need (B, {p.edges_count}) FCTs and B epoch "
                          "times for the current config")
    model = state.model.observe(L, state.config, fct, state.epoch).forget(
        state.epoch + B - P.history)
    times = epoch_time
    if state.pending is not None and state.pending.config.patched != state.config.patched \
            and B > 1:
        times = epoch_time[1:]
    observed = float(times.mean())
    config, base_time = state.config, observed
    prev = state.pending
    kept, reverted, tabu = state.judge(None if prev is None else prev.time,
                                       () if prev is None else prev.transforms, observed, P, B)
    if reverted:
        config, base_time = prev.config, prev.time
    rounds, forced = state.budget(P)
    chosen: list = []
    before = after = float("nan")
    flagged = 0
    pending = None
    if rounds < P.max_rounds and not reverted:
        cong = detect_congestion(p, fct, P.delta1, P.delta2)
        flagged = int(cong.congested.sum())
        if cong.any():
            rng = np.random.default_rng([P.seed, state.batch_index])
            rings, nodes, links = _congestion_targets(L, config, cong)
            taboo = frozenset(t for t, _ in tabu)
            trials = P.trials + P.trials_growth * state.explored
            cur = config
            before = after = estimate(L, config, cur, model, P.history)
            for _ in range(P.max_accepted):
                cands = shard_candidates(L, cur, model, rings, nodes, links, rng,
                                         swaps=trials, tabu=taboo)
                if not cands:
                    break
                scored = [(estimate(L, config, t.apply(cur), model, P.history), i, t)
                          for i, t in enumerate(cands)]
                best, _, t = min(scored, key=lambda x: (x[0], x[1]))
                if not after > (1.0 + P.epsilon) * best:
                    break
                cur, after = t.apply(cur), best
                chosen.append(t)
                rings = sorted(set(rings) | ({t.ring} if hasattr(t, "ring") else set()))
            if chosen:
                check_shard_config(L, cur)
                pending = _Pending(config, base_time, tuple(chosen))
                config = cur
    new = replace(state, config=config, model=model, pending=pending,
                  **state.after(B, rounds, bool(chosen), tabu))
    return new, ShardDecision(config, tuple(chosen), reverted, kept, forced, before, after,
                              flagged)


def run_shard_react(executor, layout: ShardLayout, epochs: int,
                    params: ReactParams = ReactParams(), enabled: bool = True,
                    external: Sequence[BackgroundFlows] = (),
                    world: Callable[[Topology], Fabric] | None = None,
                    progress: Callable[[int], None] | None = None) -> ReactRun:
    """Run ``epochs`` epochs of the plan's AllReduce on ``executor``, with the shard
    tuner (or without: the plan as it is).

    ``executor`` runs patterns (:class:`~topoopt.react.classsim.ClassExecutor` or the
    ns-3 executor) and takes ``set_background(flows)`` (external plus the owned flows on
    their current routes) and, on an OCS shard, ``reconfigure(fabric, stall)``;
    ``world(topology)`` gives the fabric the network really is for a re-wired topology
    (its gray failures included). ``progress(epochs_done)`` after every batch.
    """
    state = shard_leader_init(layout, params=params)
    current = state.config
    external = tuple(external)
    executor.set_background(external + layout.owned_flows(current))
    times: list[np.ndarray] = []
    changes = []
    done = 0
    while done < epochs:
        b = min(params.batch, epochs - done)
        res = executor.run(layout.pattern(current), b)
        times.append(np.asarray(res.epoch_time, float))
        done += b
        if progress is not None:
            progress(done)
        if enabled and b == params.batch and done < epochs:
            state, dec = shard_leader_step(state, res.fct, res.epoch_time)
            new = dec.config
            if new != current:
                if new.patched != current.patched or (any(new.patched)
                                                       and new.orders != current.orders):
                    topo = layout.topology_of(new)
                    fabric = world(topo) if world is not None else layout.fabric_of(new)
                    executor.reconfigure(fabric, layout.reconfiguration)
                fabric = getattr(executor, "fabric", layout.fabric_of(new))
                if new.routes != current.routes or new.patched != current.patched:
                    executor.set_background(external + layout.owned_flows(new, fabric))
                changes.append((done, tuple(str(t) for t in dec.transforms), dec.reverted))
            current = new
    return ReactRun(np.concatenate(times), tuple(changes), layout.pattern(current))
