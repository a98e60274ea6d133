"""TopologyFinder (TopoOpt §4, Algorithm 1): AllReduce rings + MP matchings + routes for one job.

Unlike the authors' public code, the MP share of the degree is really given to MP (the
Blossom step runs), groups get rings in proportion to their traffic (not all to the
largest), and MP bytes are split over k paths (not one BFS path).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, NamedTuple

import numpy as np
from scipy.sparse.csgraph import connected_components

from topoopt._frozen import FrozenDict
from topoopt.errors import PlanCheckError
from topoopt.finder.backbone import backbone_stride
from topoopt.finder.degree import allocate_group_degrees, split_degree
from topoopt.finder.hops import pair_hops
from topoopt.finder.matching import (
    DENSE_EDGE_LIMIT,
    max_weight_matching,
    max_weight_matching_edges,
)
from topoopt.finder.mp_routes import Contribs, Path, _mp_routes, _mp_routes_reference
from topoopt.finder.perms import PermutationSelection, ring_order, select_permutations
from topoopt.routing.coin_change import coin_change, coin_change_orders, coin_change_table
from topoopt.routing.kshortest import UNREACHABLE, _adjacency, hop_distances, k_shortest_routes
from topoopt.routing.metrics import mp_link_time_bound, route_traffic
from topoopt.topology.topology import Routes, Topology, check_ring, check_routes, check_topology
from topoopt.traffic import Traffic

__all__ = ["GroupPlan", "TopologyPlan", "topology_finder", "topology_finder_accepting",
           "TopologyDraft", "draft_topology",
           "check_topology_plan",
           "is_strongly_connected", "extend_plan"]

#: Largest shard whose matching tie-break is drawn as an n x n array (see _match_mp)
DENSE_TIEBREAK_MAX = 1024

Ring = tuple[int, ...]
#: coin_change_table's (count, last)
CoinTable = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class GroupPlan:
    """What Step 2 did for one AllReduce group.

    Attributes
    ----------
    members : tuple of int
        Sorted, as in ``Traffic.allreduce``.
    bytes : float
        Ring AllReduce bytes of the group (its traffic weight).
    degree : int
        d_k, rings with their own links.
    selection : PermutationSelection or None
        The strides (in the group's index space) and the diameter they achieve alone.
    host : tuple of int or None
        For a group without rings: the members of the group whose rings carry its
        hops by coin change (the backbone is ``tuple(range(n))``), or None when its
        hops take k-shortest paths over the whole topology.
    """

    members: tuple[int, ...]
    bytes: float
    degree: int
    selection: PermutationSelection | None = None
    host: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TopologyPlan:
    """TopologyFinder's output: the topology, AllReduce ring orders and routes.

    Attributes
    ----------
    topology : Topology
        Links labelled ``"ring:p=5"`` (AllReduce ring of stride 5 in its group's index
        space), ``"backbone:p=1"`` (a ring over all servers added for connectivity),
        ``"mp"`` (Blossom matching, two links per full-duplex pair) or
        ``"spare:p=1"`` (a ring over servers with ports left over).
    rings : Mapping
        Group members -> ring orders (Hamiltonian cycles of the group); the group's
        bytes are split evenly across them. Every ``Traffic.allreduce`` group has one.
    routes : Routes
        For every pair with MP demand and every ring hop that is not a link: paths
        that split the pair's total bytes (``traffic.matrix(plan.rings)[u, v]``). A
        pair without an entry is a link and carries all its bytes directly.
    degree_allreduce, degree_mp : int
        Step 1's split of d (MP may also take AllReduce ports a server has left).
    groups : tuple of GroupPlan
    backbone : PermutationSelection or None
        Set when the rings and matchings alone did not connect the shard.
    matching_rounds : tuple of tuple of (u, v)
        Blossom matchings of Step 3, one tuple per round.
    spare_rings : tuple of Ring
    routing : str
    k_paths : int
    """

    topology: Topology
    rings: Mapping[tuple[int, ...], tuple[Ring, ...]]
    routes: Routes
    degree_allreduce: int
    degree_mp: int
    groups: tuple[GroupPlan, ...]
    backbone: PermutationSelection | None = None
    matching_rounds: tuple[tuple[tuple[int, int], ...], ...] = ()
    spare_rings: tuple[Ring, ...] = ()
    routing: str = "kshortest"
    k_paths: int = 4
    mp_max_load: float | None = field(default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rings", FrozenDict(self.rings))

    @property
    def mp_links(self) -> int:
        """Full-duplex MP connections (each is two links)."""
        return sum(len(r) for r in self.matching_rounds)


def is_strongly_connected(topology: Topology) -> bool:
    """Whether every server can reach every other over the directed links."""
    if topology.servers <= 1:
        return True
    count, _ = connected_components(_adjacency(topology), directed=True, connection="strong")
    return count == 1


class _Builder:
    """Port bookkeeping for Step 4: each ring or matching edge takes one port per end."""

    def __init__(self, n: int, d: int) -> None:
        self.n, self.d = n, d
        self.used = np.zeros(n, dtype=np.int64)
        self.links: list[tuple[int, int, int, int]] = []
        self.labels: list[str] = []

    def ring(self, order: Ring, label: str) -> None:
        ports = {s: int(self.used[s]) for s in order}
        for a, b in zip(order, order[1:] + order[:1]):
            self.links.append((a, ports[a], b, ports[b]))
            self.labels.append(label)
        self.used[list(order)] += 1

    def duplex(self, u: int, v: int, label: str) -> None:
        pu, pv = int(self.used[u]), int(self.used[v])
        self.links += [(u, pu, v, pv), (v, pv, u, pu)]
        self.labels += [label, label]
        self.used[[u, v]] += 1

    def topology(self, bandwidth: float, latency: float) -> Topology:
        return Topology(self.n, self.d, tuple(self.links), bandwidth, latency,
                        tuple(self.labels))

def _decay_fn(mp_decay: float | Callable[[float, int], float]
              ) -> Callable[[float, int], float]:
    if callable(mp_decay):
        return mp_decay
    r = float(mp_decay)
    if not 0 <= r < 1:
        raise ValueError(f"mp_decay must be in [0, 1) or a callable, got {mp_decay}")
    return lambda demand, links: demand * r ** links


def _matching_weights(demand: np.ndarray, far: np.ndarray, noise: np.ndarray, n: int
                      ) -> np.ndarray:
    """Integer weights of the candidate edges: demand first, then far-apart pairs, then
    a seeded tie-break.

    The decayed demand is quantized to ~2^-33 of the largest; the round-trip hop
    distance ``far`` in the topology built so far comes next, so equal demands link the
    farthest pairs (all-to-all MP gets expander-like links, not arbitrary ones).
    """
    far = np.minimum(far, 2 * n).astype(np.int64)  # hops there and back
    far_bits = int(2 * n + 1).bit_length()
    q_bits = 62 - far_bits - 16
    q = np.maximum(1, np.round(demand / demand.max() * (2 ** q_bits - 1))).astype(np.int64)
    return (q << (far_bits + 16)) + (far << 16) + noise


@dataclass(frozen=True)
class _Layout:
    """Steps 1-3 of one pass: the topology and what was decided on the way.

    ``rings`` and ``selections`` cover the groups with rings of their own;
    ``ring_groups`` maps every set of servers with rings (the backbone included) to
    its strides; ``degrees`` is d_k per ``Traffic.allreduce`` group.
    """

    topology: Topology
    degree_allreduce: int
    rings: Mapping[tuple[int, ...], tuple[Ring, ...]]
    ring_groups: Mapping[tuple[int, ...], tuple[int, ...]]
    degrees: tuple[int, ...]
    selections: Mapping[tuple[int, ...], PermutationSelection]
    backbone: PermutationSelection | None
    rounds: tuple[tuple[tuple[int, int], ...], ...]
    spare: tuple[Ring, ...]


class _Step4(NamedTuple):
    """:func:`topology_finder`'s routing options."""

    routing: str
    k_paths: int
    max_extra_hops: int | None
    implementation: str


@dataclass(frozen=True)
class TopologyDraft:
    """TopologyFinder's Steps 1-3 for one traffic: the topology and its hop distances,
    before Step 4 routes them (:func:`draft_topology`; :meth:`plan` routes).

    Attributes
    ----------
    traffic : topoopt.traffic.Traffic
    dist : ndarray
        All-pairs hop counts of :attr:`topology`
        (:func:`~topoopt.routing.kshortest.hop_distances`).
    """

    traffic: Traffic
    layout: _Layout = field(repr=False)
    dist: np.ndarray = field(repr=False, compare=False)
    step4: _Step4 = field(repr=False)

    @property
    def topology(self) -> Topology:
        return self.layout.topology

    @property
    def degree_allreduce(self) -> int:
        """Step 1's split (ports per server given to AllReduce)."""
        return self.layout.degree_allreduce

    def lower_bound(self) -> float:
        """Seconds the plan's links need at least to carry the traffic's MP bytes,
        whatever Step 4 routes (:func:`~topoopt.routing.metrics.mp_link_time_bound`):
        an iteration simulated on the plan takes at least this long."""
        return mp_link_time_bound(self.topology, self.traffic.mp, self.dist)

    def plan(self) -> TopologyPlan:
        """Step 4: the rings of the groups without their own and the routes; the plan
        :func:`topology_finder` gives for the same traffic and options."""
        traffic, layout, dist = self.traffic, self.layout, self.dist
        routing, k_paths, max_extra_hops, implementation = self.step4
        topo = layout.topology
        direct = {(a, b) for a, _, b, _ in topo.links}
        rings, group_plans, contribs = _allreduce_routes(traffic, layout, dist, direct,
                                                         k_paths, max_extra_hops)
        mp_routes = _mp_routes_reference if implementation == "reference" else _mp_routes
        routes, mp_max_load = mp_routes(traffic, topo, dist, direct, contribs, routing,
                                        k_paths, max_extra_hops)
        d_ar = layout.degree_allreduce
        return TopologyPlan(topology=topo, rings=rings, routes=routes, degree_allreduce=d_ar,
                            degree_mp=topo.ports - d_ar, groups=tuple(group_plans),
                            backbone=layout.backbone, matching_rounds=layout.rounds,
                            spare_rings=layout.spare, routing=routing, k_paths=int(k_paths),
                            mp_max_load=mp_max_load)


def _build(traffic: Traffic, n: int, d: int, bandwidth: float, latency: float,
           primes_only: bool, decay: Callable[[float, int], float], seed: int,
           backbone: int | None, matching: str, d_ar: int | None = None) -> _Layout:
    """One pass of Steps 1-3; ``backbone``: the stride of a ring over all servers laid
    first (for connectivity), or None."""
    rng = np.random.default_rng(seed)
    b = _Builder(n, d)
    if d_ar is None:
        d_ar = split_degree(d, traffic.allreduce_bytes, traffic.mp_bytes)
    ring_groups: dict[tuple[int, ...], tuple[int, ...]] = {}  # members -> strides
    backbone_sel = None
    if backbone is not None:
        backbone_sel = select_permutations(n, 1, (backbone,))
        p = backbone_sel.strides[0]
        b.ring(ring_order(tuple(range(n)), p), f"backbone:p={p}")
        ring_groups[tuple(range(n))] = backbone_sel.strides
    # Step 2: AllReduce rings per group
    degrees, selections, rings = _group_rings(traffic, np.maximum(0, d_ar - b.used),
                                              primes_only, seed)
    for members, orders in rings.items():
        for p, order in zip(selections[members].strides, orders):
            b.ring(order, f"ring:p={p}")
        ring_groups[members] = selections[members].strides
    rounds = _match_mp(b, traffic.mp, decay, rng, matching)
    spare = _spare_rings(b, seed)
    return _Layout(b.topology(bandwidth, latency), d_ar, rings, ring_groups, tuple(degrees),
                   selections, backbone_sel, rounds, spare)


def _group_rings(traffic: Traffic, budget: np.ndarray, primes_only: bool, seed: int
                 ) -> tuple[tuple[int, ...], dict[tuple[int, ...], PermutationSelection],
                            dict[tuple[int, ...], tuple[Ring, ...]]]:
    """Step 2 without building: d_k per group for ``budget`` ports per server, and the
    strides and ring orders of the groups that get rings."""
    groups = traffic.allreduce
    degrees = allocate_group_degrees([g.members for g in groups],
                                     [g.network_bytes for g in groups], budget)
    selections, rings = {}, {}
    for g, dk in zip(groups, degrees):
        if dk:
            sel = select_permutations(len(g.members), dk, primes_only=primes_only, seed=seed)
            selections[g.members] = sel
            rings[g.members] = tuple(ring_order(g.members, p) for p in sel.strides)
    return tuple(degrees), selections, rings


def _rings_rejected(traffic: Traffic, n: int, d: int, primes_only: bool, seed: int,
                    d_ar: int | None, accept_rings: Callable[[Mapping], bool]) -> bool:
    """Whether ``accept_rings`` refuses the Step 2 rings of both passes (without and
    with the backbone ring, which takes one port of every server whatever its stride),
    so that it refuses the plan's whichever pass it takes."""
    if d_ar is None:
        d_ar = split_degree(d, traffic.allreduce_bytes, traffic.mp_bytes)
    return all(not accept_rings(_group_rings(traffic, np.full(n, max(0, d_ar - used)),
                                             primes_only, seed)[2]) for used in (0, 1))


def _match_mp(b: _Builder, mp: np.ndarray, decay: Callable[[float, int], float],
              rng: np.random.Generator, matching: str
              ) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Step 3: repeated Blossom matchings on the MP demand over the ports left at each
    server, a pair's demand decayed by the links it already has. Returns the rounds.

    Kept as the list of pairs with demand (``u < v``, row-major), not n x n arrays: an
    LLM's pipeline has ~n of the n^2 pairs. Up to :data:`DENSE_TIEBREAK_MAX` servers
    each round draws an ``n x n`` tie-break (its upper triangle read), the stream the
    dense version drew, so those plans did not change; above, one draw per pair.
    """
    n, d = b.n, b.d
    want = mp + mp.T
    iu, iv = np.nonzero(want)
    upper = iu < iv                       # np.nonzero(np.triu(want, 1)), without the mask
    iu, iv = iu[upper], iv[upper]
    wants = want[iu, iv]
    left = wants.copy()
    linked = np.zeros(iu.size, dtype=np.int64)
    edge = {(int(u), int(v)): i for i, (u, v) in enumerate(zip(iu, iv))}
    rounds = []
    while True:
        free = b.used < d
        cand = np.where(free[iu] & free[iv], left, 0.0)
        pos = np.flatnonzero(cand > 0)
        if pos.size == 0:
            break
        pu, pv = iu[pos], iv[pos]
        noise = (rng.integers(0, 2 ** 16, size=(n, n))[pu, pv] if n <= DENSE_TIEBREAK_MAX
                 else rng.integers(0, 2 ** 16, size=pos.size))
        hops = _demand_hops(b, np.r_[pu, pv], np.r_[pv, pu])
        w = _matching_weights(cand[pos], hops[:pos.size] + hops[pos.size:], noise, n)
        if pos.size > DENSE_EDGE_LIMIT:       # the dense path thins to each node's top k
            dense = np.zeros((n, n), dtype=np.int64)
            dense[pu, pv] = dense[pv, pu] = w
            pairs = max_weight_matching(dense, method=matching)
        else:
            pairs = max_weight_matching_edges(n, pu, pv, w, method=matching)
        if not pairs:
            break
        for u, v in pairs:
            b.duplex(u, v, "mp")
            i = edge[u, v]
            linked[i] += 1
            left[i] = decay(float(wants[i]), int(linked[i]))
        rounds.append(tuple(pairs))
    return tuple(rounds)


def _demand_hops(b: _Builder, s_of: np.ndarray, t_of: np.ndarray) -> np.ndarray:
    """Hop distances ``s_of[i] -> t_of[i]`` over the links built so far (``UNREACHABLE``
    where there is no path)."""
    if not b.links:
        return np.full(s_of.size, UNREACHABLE, dtype=np.int64)
    links = np.array([(lk[0], lk[2]) for lk in b.links], dtype=np.int64)
    return pair_hops(links[:, 0], links[:, 1], b.n, s_of, t_of, UNREACHABLE)


def _spare_rings(b: _Builder, seed: int) -> tuple[Ring, ...]:
    """Rings over the servers that still have ports (servers outside the groups, odd
    ports left by the matchings), until fewer than two have one."""
    d = b.d
    spare = []
    while True:
        free_servers = tuple(int(s) for s in np.flatnonzero(b.used < d))
        if len(free_servers) < 2:
            break
        r = int((d - b.used[list(free_servers)]).min())
        sel = select_permutations(len(free_servers), r, seed=seed)
        for p in sel.strides:
            order = ring_order(free_servers, p)
            b.ring(order, f"spare:p={p}")
            spare.append(order)
    return tuple(spare)

def _order_along_host(members: tuple[int, ...], host: tuple[int, ...],
                      strides: tuple[int, ...], table: CoinTable) -> tuple[Ring, int]:
    """Members ordered along one of the host's rings, fewest total coins."""
    g = len(host)
    idx = {s: i for i, s in enumerate(host)}
    count = table[0]
    tried = []
    for p in sorted(set(strides) | {1}):
        inv = pow(p, -1, g) if g > 1 else 0
        order = tuple(sorted(members, key=lambda s: (idx[s] * inv) % g))
        cost = sum(int(count[(idx[v] - idx[u]) % g])
                   for u, v in zip(order, order[1:] + order[:1]))
        tried.append((order, cost))
    return min(tried, key=lambda oc: oc[1])  # the first of the cheapest


def _nearest_neighbour_ring(members: tuple[int, ...], dist: np.ndarray) -> Ring:
    order = [members[0]]
    rest = set(members[1:])
    while rest:
        u = order[-1]
        v = min(rest, key=lambda s: (int(dist[u, s]), s))
        order.append(v)
        rest.remove(v)
    return tuple(order)


def _check_arguments(traffic: Traffic, servers: int, ports: int, link_bandwidth: float,
                     routing: str, k_paths: int, allreduce_degree: int | None,
                     implementation: str) -> tuple[int, int]:
    """``(n, d)``; ValueError for an argument :func:`topology_finder` cannot take."""
    n, d = int(servers), int(ports)
    if n != servers or n < 2:
        raise ValueError(f"servers must be an integer >= 2, got {servers}")
    if d != ports or d < 1:
        raise ValueError(f"ports must be an integer >= 1, got {ports}")
    if traffic.servers != n:
        raise ValueError(f"traffic is for {traffic.servers} servers, not {n}")
    if link_bandwidth <= 0:
        raise ValueError(f"link_bandwidth must be > 0, got {link_bandwidth}")
    if routing not in ("kshortest", "lp"):
        raise ValueError(f"routing must be 'kshortest' or 'lp', got {routing!r}")
    if implementation not in ("fast", "reference"):
        raise ValueError(f"implementation must be 'fast' or 'reference', got "
                         f"{implementation!r}")
    if int(k_paths) != k_paths or k_paths < 1:
        raise ValueError(f"k_paths must be a positive integer, got {k_paths}")
    if allreduce_degree is not None and not (
            int(allreduce_degree) == allreduce_degree and 1 <= allreduce_degree <= d):
        raise ValueError(f"allreduce_degree must be an integer in 1..{d}, got {allreduce_degree}")
    return n, d

def topology_finder(traffic: Traffic, servers: int, ports: int, link_bandwidth: float,
                    link_latency: float = 1e-6, *, primes_only: bool = False,
                    mp_decay: float | Callable[[float, int], float] = 0.5, k_paths: int = 4,
                    routing: str = "kshortest", max_extra_hops: int | None = 0,
                    seed: int = 0, matching: str = "rustworkx",
                    allreduce_degree: int | None = None,
                    implementation: str = "fast") -> TopologyPlan:
    """Build the topology, AllReduce rings and routes for one job's traffic (Algorithm 1).

    Parameters
    ----------
    traffic : topoopt.traffic.Traffic
        AllReduce groups and the MP matrix of the strategy (§2).
    servers, ports : int
        n and d (NIC ports per server).
    link_bandwidth, link_latency : float
        Bits/s per link, and seconds.
    primes_only : bool
        TotientPerms restricted to primes (and 1).
    mp_decay : float or callable
        Diminishing return of MP demand for pairs already matched: a factor ``r``
        (demand x r^links; the paper halves, 0.5) or ``f(demand, links) -> weight``.
    k_paths : int
        Paths per MP pair (and per routed ring hop).
    routing : {"kshortest", "lp"}
        MP demand split evenly over the k shortest paths, or by the path-based LP
        that minimizes the maximum link load (:func:`~topoopt.routing.lp.min_max_load_routes`),
        whose candidates are the k shortest paths up to 2 hops longer than the shortest.
    max_extra_hops : int or None
        For "kshortest": keep paths at most this many hops longer than the shortest
        (0: equal-cost multipath over up to k shortest paths; None: all k).
    seed : int
        Tie-break among equally heavy matching edges; stride search sampling.
    matching : {"rustworkx", "networkx"}
        Blossom implementation.
    allreduce_degree : int, optional
        Override Step 1's split: ports per server given to AllReduce (1..d). The
        planner uses it to try neighbouring splits and keep the one the simulator
        prefers; by default :func:`~topoopt.finder.degree.split_degree` decides.
    implementation : {"fast", "reference"}
        "fast": MP routes as :class:`~topoopt.topology.topology.RouteArrays` and the
        LP assembled as sparse arrays; "reference": a tuple per path and the LP built
        variable by variable. The plans are equal (with ``routing="lp"``: the same
        optimal maximum load; the split may differ where several are optimal).

    Returns
    -------
    TopologyPlan

    Notes
    -----
    Step 1 :func:`~topoopt.finder.degree.split_degree`; Step 2 per group
    :func:`~topoopt.finder.degree.allocate_group_degrees`, TotientPerms and
    SelectPermutations in the group's index space (member ``i`` sends to member
    ``(i + p) mod g``), one port per ring at each member; Step 3 repeated maximum-weight
    matchings over the servers with ports left, pairs already matched decayed, equal
    demands linking the farthest pairs; then rings over servers that still have ports
    (``"spare"``). If the result is not strongly connected (groups that do not span the
    shard, no AllReduce at all), it is rebuilt with one "backbone" ring over all servers
    taken from the AllReduce degree (the paper's reason for "at least one degree to
    AllReduce"), of the stride that carries the MP demand in the fewest hop-bytes
    (:func:`~topoopt.finder.backbone.backbone_stride`). Step 4 routes: hops of groups without rings follow the
    rings of a group containing them by minimal coin change in Z_g (App. E.1), spread
    over up to ``k_paths`` orders of the coins (all shortest); other hops and MP pairs
    take k-shortest paths or the LP.

    Examples
    --------
    >>> from topoopt.workloads import build_model
    >>> from topoopt.strategy import hybrid
    >>> from topoopt.traffic import derive_traffic
    >>> m = build_model("dlrm", {"tables": 8, "rows": 1000})
    >>> t = derive_traffic(m, hybrid(m, 8), 8, 8 * 4 * 64, 4)
    >>> plan = topology_finder(t, 8, 4, 100e9)
    >>> check_topology_plan(plan, t)
    >>> plan.degree_allreduce + plan.degree_mp
    4
    """
    plan = topology_finder_accepting(
        None, traffic, servers, ports, link_bandwidth, link_latency,
        primes_only=primes_only, mp_decay=mp_decay, k_paths=k_paths, routing=routing,
        max_extra_hops=max_extra_hops, seed=seed, matching=matching,
        allreduce_degree=allreduce_degree, implementation=implementation)
    assert plan is not None
    return plan


def topology_finder_accepting(accept_rings: Callable[[Mapping], bool] | None,
                              traffic: Traffic, servers: int, ports: int,
                              link_bandwidth: float, link_latency: float = 1e-6, *,
                              primes_only: bool = False,
                              mp_decay: float | Callable[[float, int], float] = 0.5,
                              k_paths: int = 4, routing: str = "kshortest",
                              max_extra_hops: int | None = 0, seed: int = 0,
                              matching: str = "rustworkx", allreduce_degree: int | None = None,
                              implementation: str = "fast") -> TopologyPlan | None:
    """:func:`topology_finder`'s plan, or None as soon as ``accept_rings`` refuses it.

    ``accept_rings(rings)`` sees the ring orders of the groups that got rings of their
    own in Step 2 (members -> orders, the plan's ``rings`` for those groups) and returns
    False only if no plan with them can be used (a caller's own check on the rings,
    such as a launch order that must keep the traffic). It is asked before Step 3 (the
    matchings) for both passes, and again on the pass kept, before the routes: a
    refused plan costs Step 2, not the whole run. Same options as
    :func:`topology_finder`; a plan it returns is the one :func:`topology_finder` gives
    (None for ``accept_rings``: never refused).
    """
    n, d = _check_arguments(traffic, servers, ports, link_bandwidth, routing, k_paths,
                            allreduce_degree, implementation)
    if accept_rings is not None and _rings_rejected(traffic, n, d, primes_only, seed,
                                                    allreduce_degree, accept_rings):
        return None
    layout = _layout(traffic, n, d, link_bandwidth, link_latency, primes_only, mp_decay, seed,
                     matching, allreduce_degree)
    if accept_rings is not None and not accept_rings(layout.rings):
        return None
    return TopologyDraft(traffic, layout, hop_distances(layout.topology),
                         _Step4(routing, k_paths, max_extra_hops, implementation)).plan()


def draft_topology(traffic: Traffic, servers: int, ports: int, link_bandwidth: float,
                   link_latency: float = 1e-6, *, primes_only: bool = False,
                   mp_decay: float | Callable[[float, int], float] = 0.5, k_paths: int = 4,
                   routing: str = "kshortest", max_extra_hops: int | None = 0,
                   seed: int = 0, matching: str = "rustworkx",
                   allreduce_degree: int | None = None,
                   implementation: str = "fast") -> TopologyDraft:
    """:func:`topology_finder` up to Step 3: its topology, not yet routed.

    Same options as :func:`topology_finder`; ``draft_topology(...).plan()`` is
    ``topology_finder(...)``. For a caller that may not want the plan: Step 4's MP
    routes are most of the finder's time and memory when MP pairs lie far apart, and
    :meth:`TopologyDraft.lower_bound` tells, before them, how fast the plan can be.
    """
    n, d = _check_arguments(traffic, servers, ports, link_bandwidth, routing, k_paths,
                            allreduce_degree, implementation)
    layout = _layout(traffic, n, d, link_bandwidth, link_latency, primes_only, mp_decay, seed,
                     matching, allreduce_degree)
    return TopologyDraft(traffic, layout, hop_distances(layout.topology),
                         _Step4(routing, k_paths, max_extra_hops, implementation))


def _layout(traffic: Traffic, n: int, d: int, bandwidth: float, latency: float,
            primes_only: bool, mp_decay: float | Callable[[float, int], float], seed: int,
            matching: str, d_ar: int | None) -> _Layout:
    """Steps 1-3: the first pass, or the second (with a backbone ring) when the first
    does not connect the shard."""
    decay = _decay_fn(mp_decay)
    layout = _build(traffic, n, d, bandwidth, latency, primes_only, decay, seed, None,
                    matching, d_ar)
    if not is_strongly_connected(layout.topology):
        stride = backbone_stride(traffic.mp, layout.topology, primes_only, seed)
        layout = _build(traffic, n, d, bandwidth, latency, primes_only, decay, seed, stride,
                        matching, d_ar)
    return layout


def _host_ring_paths(u: int, v: int, host: tuple[int, ...], strides: tuple[int, ...],
                     table: CoinTable, k_paths: int) -> list[Path]:
    """Up to ``k_paths`` paths from ``u`` to ``v`` along the host group's rings: each an
    order of the coin-change coins (strides) that add up to the hop (§4, Appendix)."""
    hidx = {s: i for i, s in enumerate(host)}
    coins = coin_change((hidx[v] - hidx[u]) % len(host), strides, len(host), table)
    paths = []
    for seq in coin_change_orders(coins, k_paths):
        i, path = hidx[u], [u]
        for c in seq:
            i = (i + c) % len(host)
            path.append(host[i])
        paths.append(tuple(path))
    return paths


def _ring_for_group(members: tuple[int, ...], layout: _Layout, dist: np.ndarray,
                    tables: dict[tuple[tuple[int, ...], tuple[int, ...]], CoinTable]
                    ) -> tuple[Ring, tuple[int, ...] | None]:
    """The ring order of a group without rings of its own and its host: along the
    rings of the group containing it with the fewest coins (then the smallest), else
    a nearest-neighbour ring without a host. Fills ``tables`` (host, strides) ->
    :func:`~topoopt.routing.coin_change.coin_change_table`."""
    ring_groups = layout.ring_groups
    best: tuple[Ring, int, tuple[int, ...]] | None = None
    for h in ring_groups:
        if not set(members) <= set(h):
            continue
        key = (h, ring_groups[h])
        if key not in tables:
            tables[key] = coin_change_table(ring_groups[h], len(h))
        order, cost = _order_along_host(members, h, ring_groups[h], tables[key])
        if best is None or (cost, len(h)) < (best[1], len(best[2])):
            best = (order, cost, h)
    if best is None:
        return _nearest_neighbour_ring(members, dist), None
    return best[0], best[2]


def _allreduce_routes(traffic: Traffic, layout: _Layout, dist: np.ndarray,
                      direct: set[tuple[int, int]], k_paths: int, max_extra_hops: int | None
                      ) -> tuple[dict[tuple[int, ...], tuple[Ring, ...]], list[GroupPlan],
                                 Contribs]:
    """Step 4a: ring orders for the groups that got no rings of their own (along a host
    group's rings, else a nearest-neighbour ring), and the routes of every ring hop
    that is not a link (coin change on the host's strides, else k shortest paths).

    Returns ``(rings, group plans, contributions)``: group members -> ring orders, one
    :class:`GroupPlan` per AllReduce group, and ``(src, dst) -> [(path, bytes)]``.
    """
    rings = dict(layout.rings)
    ring_groups = layout.ring_groups
    tables: dict[tuple[tuple[int, ...], tuple[int, ...]], CoinTable] = {}
    contribs: Contribs = {}
    group_plans = []
    needs_paths: dict[tuple[int, int], float] = {}
    for g, dk in zip(traffic.allreduce, layout.degrees):
        host = None
        if dk == 0:
            order, host = _ring_for_group(g.members, layout, dist, tables)
            rings[g.members] = (order,)
        group_plans.append(GroupPlan(g.members, g.network_bytes, dk,
                                     layout.selections.get(g.members), host))
        orders = rings[g.members]
        hop_bytes = g.ring_bytes_per_pair / len(orders)
        for order in orders:
            for u, v in zip(order, order[1:] + order[:1]):
                if (u, v) in direct:
                    contribs.setdefault((u, v), []).append(((u, v), hop_bytes))
                elif host is not None:
                    paths = _host_ring_paths(u, v, host, ring_groups[host],
                                             tables[host, ring_groups[host]], k_paths)
                    for p in paths:
                        contribs.setdefault((u, v), []).append((p, hop_bytes / len(paths)))
                else:
                    needs_paths[u, v] = needs_paths.get((u, v), 0.0) + hop_bytes
    if needs_paths:
        for pair, opts in k_shortest_routes(layout.topology, needs_paths, k_paths,
                                            max_extra_hops, dist=dist).items():
            for p, f in opts:
                contribs.setdefault(pair, []).append((p, needs_paths[pair] * f))
    return rings, group_plans, contribs


def check_topology_plan(plan: TopologyPlan, traffic: Traffic) -> None:
    """Raise :class:`PlanCheckError` unless the plan is consistent with ``traffic``.

    Checks: ports (no port transmits or receives twice, at most d per server), one
    ring set and one group (with the traffic's bytes) per AllReduce group, every order a Hamiltonian cycle of the group,
    every group's own rings made of links, every route a valid path of links with
    fractions summing to 1, every pair that carries bytes either a link or routed,
    and the topology strongly connected.
    """
    topo = plan.topology
    check_topology(topo)
    if topo.servers != traffic.servers:
        raise PlanCheckError(f"plan has {topo.servers} servers, traffic {traffic.servers}")
    direct = {(a, b) for a, _, b, _ in topo.links}
    groups = {g.members: g for g in traffic.allreduce}
    if set(plan.rings) != set(groups):
        raise PlanCheckError("rings must be given for exactly the traffic's AllReduce groups")
    if sorted(gp.members for gp in plan.groups) != sorted(groups):
        raise PlanCheckError("the plan's groups must be exactly the traffic's AllReduce groups")
    for gp in plan.groups:
        if not np.isclose(gp.bytes, groups[gp.members].network_bytes, rtol=1e-9, atol=0.0):
            raise PlanCheckError(f"group {list(gp.members)} carries {gp.bytes:.6g} bytes in "
                                 f"the plan but {groups[gp.members].network_bytes:.6g} in "
                                 "the traffic")
    for gp in plan.groups:
        orders = plan.rings[gp.members]
        if not orders:
            raise PlanCheckError(f"group {list(gp.members)} has no ring order")
        for order in orders:
            check_ring(order, gp.members)
        if gp.degree:
            if len(orders) != gp.degree:
                raise PlanCheckError(f"group {list(gp.members)} has {gp.degree} rings but "
                                     f"{len(orders)} orders")
            for order in orders:
                for u, v in zip(order, order[1:] + order[:1]):
                    if (u, v) not in direct:
                        raise PlanCheckError(f"ring hop {u}->{v} of group with its own "
                                             f"rings is not a link")
    check_routes(topo, plan.routes)
    n = topo.servers
    routed = np.zeros((n, n), bool)
    if len(plan.routes):
        arr = plan.routes.arrays()
        inside = (arr.src < n) & (arr.dst < n)
        routed[arr.src[inside], arr.dst[inside]] = True
    linked = np.zeros((n, n), bool)
    for a, b in direct:
        linked[a, b] = True
    total = traffic.matrix(plan.rings)
    stray = np.argwhere((total != 0) & ~routed & ~linked)
    if stray.size:
        u, v = stray[0]
        raise PlanCheckError(f"{u}->{v} carries bytes but is neither a link nor routed")
    lost = np.argwhere((traffic.mp != 0) & ~routed)
    if lost.size:
        u, v = lost[0]
        raise PlanCheckError(f"MP pair {u}->{v} has no route")
    if not is_strongly_connected(topo):
        raise PlanCheckError("the topology is not strongly connected")


def extend_plan(plan: TopologyPlan, traffic: Traffic) -> TopologyPlan:
    """The same topology, with rings and routes for traffic it was not built for.

    The MCMC may change the strategy on a fixed topology (TopoOpt §4: the Comp x Comm
    plane keeps the topology), creating AllReduce groups without rings and MP pairs
    without routes. Groups the plan has keep their rings; new groups get a
    nearest-neighbour ring over the topology's hop distances; groups the traffic no
    longer has are dropped. Pairs without a route (new MP pairs, ring hops that are
    not links) get k-shortest routes; existing routes stay.

    Returns
    -------
    TopologyPlan
        Passes :func:`check_topology_plan` for ``traffic``: one :class:`GroupPlan` per
        group of ``traffic`` (in its order) with the traffic's bytes, whatever strategy
        the plan was built for.
    """
    dist = hop_distances(plan.topology)
    rings = {g.members: plan.rings.get(g.members)
             or (_nearest_neighbour_ring(g.members, dist),) for g in traffic.allreduce}
    extra = route_traffic(plan.topology, traffic, rings, plan.k_paths, skip=plan.routes)
    routes = extra.merge(plan.routes)
    # every group of the traffic once, in its order, with the traffic's bytes: a kept
    # group's ring links stay, but its bytes are those of the strategy now reducing it
    kept = {g.members: g for g in plan.groups}
    groups = tuple(replace(kept[g.members], bytes=g.network_bytes) if g.members in kept
                   else GroupPlan(g.members, g.network_bytes, 0) for g in traffic.allreduce)
    return replace(plan, rings=rings, routes=routes, groups=groups)
