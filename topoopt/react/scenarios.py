"""REACT's simulated scenarios (§7.1, §7.3): fabrics, placements, congestion, and one run.

A :class:`Scenario` is a pure, picklable description; :func:`run_scenario` builds the
fabric and the pattern, draws the random parts from ``seed`` and runs the same epochs
without and with REACT on identical executors (same ECMP draws), so results depend only
on the scenario. Kinds of congestion:

* ``external``: ``congested`` source-destination pairs, each with ``p`` greedy external
  flows from a job node (distinct, random) to a random server outside the job (§7.3.1,
  Fig. 5). On a plan's direct-connect fabric, where every server is in the job, the
  destination is another job server.
* ``spine``: ``congested`` pairs of servers outside the job, in different pods, each with
  ``p`` flows: they load spine-ToR links only (erratic congestion).
* ``failures``: ``congested`` random links anywhere in the fabric degraded to
  ``capacity`` bits/s (gray failures, §7.3.4); on a plan, fibres of its rings (a dirty
  connector: the fibre's transmit port runs at ``capacity``).
* ``nic``: ``congested`` NICs at ``capacity`` in both directions (a NIC at half rate:
  50 Gbps); on a plan, ports of its rings; on a switched fabric, a job server's up-
  and downlink.
* ``slow-server``: ``congested`` job servers slowed by a co-located job whose ``p``
  greedy flows share each of the server's NICs (out of it and into it: on a plan, one
  over each of its fibres; on a switched fabric, to and from a server outside the job).
* ``forwarded``: on a plan only, ``congested`` fibres of its rings at ``capacity``,
  each crossed by ``p`` greedy flows of the job's own host-forwarded traffic (MP
  transfers between servers with no fibre between them, on their planned route):
  traffic REACT may move to another path.
* ``none``: no congestion (the p = 0 overhead).

Fabrics: ``star`` (one switch; the job and 8 more servers), ``fattree`` (3-layer k = 8
Fat-tree of 128 servers, job placed at random, 4-port ECMP) and ``plan:DIR`` (the
direct-connect shard of ``DIR/plan.json``, read with :func:`topoopt.plans.read_plan`:
its topology, routes, and the rings of its widest AllReduce group, since a plan also
lists rings of groups that span part of the shard). On a plan, ``--collective plan``
runs the plan's multi-ring AllReduce with the shard tuner of
:mod:`topoopt.react.shard` on the class executor (:mod:`topoopt.react.classsim`);
``optics="ocs"`` lets it re-wire rings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from topoopt._require import require_choice, require_int, require_positive
from topoopt.collectives import build_pattern, multi_ring_allreduce
from topoopt.collectives.ten import Pattern
from topoopt.errors import ConfigError, PlanCheckError
from topoopt.fabrics import fat_tree, star
from topoopt.fabrics.fabric import OPTICS, Fabric
from topoopt.plans.document import read_plan, rings_of, routes_of, topology_of
from topoopt.react.classsim import ClassExecutor
from topoopt.react.execution import PatternExecutor
from topoopt.react.flowsim import BackgroundFlows, SimulatedExecutor
from topoopt.react.jobs import overlap_placement, run_jobs
from topoopt.react.loop import ReactParams, ReactRun, run_react
from topoopt.react.shard import ShardLayout, run_shard_react, shard_fabric
from topoopt.topology.topology import Routes, Topology, check_topology

__all__ = ["Scenario", "ScenarioResult", "KINDS", "COLLECTIVES", "run_scenario",
           "compare_runs", "scenario_setup", "load_plan", "group_shard", "scenario_fabric",
           "run_two_jobs", "summarize", "ShardScenario", "shard_scenario", "without_and_with",
           "PLACEMENTS", "FIG5_NS3_FIT"]

KINDS = ("external", "spine", "failures", "nic", "slow-server", "forwarded", "none")
#: Job placements on the Fat-tree.
PLACEMENTS = ("random", "racks")
COLLECTIVES = ("tree", "ring", "rd-allgather", "plan")
#: The flow-level transport terms fitted to ns-3's per-flow completion times on Fig. 5's
#: tree scenarios (DCTCP, MTU 9000; ``react_bench.py --sections fig5mech``, the fit in
#: docs/paper-comparison.md): ``replace(scenario, **FIG5_NS3_FIT)``.
FIG5_NS3_FIT = {"share_jitter": 0.08, "external_weight": 1.04}


@dataclass(frozen=True)
class Scenario:
    """One simulated experiment (defaults: REACT §7.3's setting).

    Attributes
    ----------
    collective : str
        ``tree``, ``ring``, ``rd-allgather`` or ``plan`` (the plan's multi-ring).
    nodes : int
    size : float
        Bytes per collective.
    fabric : str
        ``star``, ``fattree`` or ``plan:DIR``.
    kind : str
        One of :data:`KINDS`.
    congested : int
        Pairs (or links, for ``failures``).
    p : int
        External flows per pair.
    capacity : float
        Bits/s of a failed link.
    epochs, warmup : int
        Epochs run; the first ``warmup`` are left out of the means (§7.3: 100, 25).
    bandwidth, latency : float
        Link bits/s and seconds.
    ports : int
        ECMP connections per flow (a plan's multi-ring AllReduce uses one: its hops
        keep the plan's paths).
    seed : int
    optics : str
        A plan's optics: ``patch_panel`` or ``none`` (fixed fibres), ``ocs``
        (REACT may re-wire a ring, stalling one epoch by the reconfiguration time).
    direction : str
        ``out``: external flows from the job node to the outside server (§7.3.1's
        wording, the default); ``in``: from the outside server into the job node (§7.1's).
    placement : str
        On the Fat-tree: ``random`` servers (default), or ``racks``: whole racks (ToRs of
        k/2 servers) in different pods, so some ranks share a ToR.
    share_jitter, external_weight : float
        The flow-level model's transport terms (:class:`~topoopt.react.flowsim.JobsExecutor`):
        per-epoch unequal shares among the job's flows, and the external flows' weight
        against a job flow at a shared port. 0 and 1 (plain max-min) by default;
        ``FIG5_NS3_FIT`` holds the values fitted to ns-3's per-flow times. The ns-3
        backend ignores them.
    jitter_seed : int
        Another draw of ``share_jitter``'s weights (0: the default draw).
    """

    collective: str = "tree"
    nodes: int = 8
    size: float = 20e6
    fabric: str = "fattree"
    kind: str = "external"
    congested: int = 1
    p: int = 2
    capacity: float = 50e9
    epochs: int = 100
    warmup: int = 25
    bandwidth: float = 100e9
    latency: float = 1e-6
    ports: int = 4
    seed: int = 0
    optics: str = "patch_panel"
    direction: str = "out"
    placement: str = "random"
    share_jitter: float = 0.0
    external_weight: float = 1.0
    jitter_seed: int = 0

    def __post_init__(self) -> None:
        require_choice("collective", self.collective, COLLECTIVES)
        require_choice("optics", self.optics, OPTICS)
        require_choice("direction", self.direction, ("out", "in"))
        require_choice("placement", self.placement, PLACEMENTS)
        require_choice("scenario", self.kind, KINDS)
        require_int("nodes", self.nodes, minimum=2)
        require_positive("size", self.size)
        require_int("congested", self.congested, minimum=0)
        require_int("p", self.p, minimum=0)
        require_int("epochs", self.epochs, minimum=1)
        require_int("warmup", self.warmup, minimum=0)
        require_int("seed", self.seed, minimum=0)
        require_positive("bandwidth", self.bandwidth)
        require_positive("capacity", self.capacity, allow_zero=True)
        require_positive("share_jitter", self.share_jitter, allow_zero=True)
        require_positive("external_weight", self.external_weight)
        require_int("jitter_seed", self.jitter_seed, minimum=0)
        if not (self.fabric in ("star", "fattree") or self.fabric.startswith("plan:")):
            raise ConfigError("fabric", self.fabric, "use star, fattree or plan:DIR")
        if self.warmup >= self.epochs:
            raise ConfigError("warmup", self.warmup, f"must be below epochs ({self.epochs})")


@dataclass(frozen=True)
class ScenarioResult:
    """Per-epoch times without and with REACT, and what REACT changed."""

    scenario: Scenario
    baseline: np.ndarray
    react: np.ndarray
    changes: tuple
    converged_epoch: int
    positions_skipped: bool = False

    def mean(self, which: str) -> float:
        return float(getattr(self, which)[self.scenario.warmup:].mean())

    def p95(self, which: str) -> float:
        return float(np.percentile(getattr(self, which)[self.scenario.warmup:], 95))

    @property
    def improvement(self) -> float:
        """Relative gain in mean algorithm bandwidth (size / time): base/react - 1."""
        return self.mean("baseline") / self.mean("react") - 1.0

    def to_json(self) -> dict:
        s = self.scenario
        algbw = lambda t: s.size / t  # noqa: E731  bytes/s
        return {"scenario": asdict(s),
                "baseline": {"mean_s": self.mean("baseline"), "p95_s": self.p95("baseline"),
                             "algbw_Bps": algbw(self.mean("baseline"))},
                "react": {"mean_s": self.mean("react"), "p95_s": self.p95("react"),
                          "algbw_Bps": algbw(self.mean("react"))},
                "improvement": self.improvement, "converged_epoch": self.converged_epoch,
                "positions_skipped": self.positions_skipped,
                "changes": [{"epoch": e, "swaps": list(sw), "revert": r}
                            for e, sw, r in self.changes],
                "epoch_time_baseline_s": self.baseline.tolist(),
                "epoch_time_react_s": self.react.tolist()}


# ------------------------------------------------------------------------- plans
def load_plan(directory: str | Path) -> tuple[Topology, list[list[int]], Routes]:
    """Topology, rings of the widest AllReduce group, and routes of ``DIR/plan.json``.

    Read with :func:`topoopt.plans.read_plan` (and its ``topology_of``, ``rings_of``,
    ``routes_of``). A plan lists the rings of every AllReduce group; the runtime's
    collective is the group over the most servers.
    """
    try:
        doc = read_plan(directory)
    except PlanCheckError as exc:
        raise ConfigError("fabric", f"plan:{directory}", str(exc)) from None
    try:
        topo = topology_of(doc)
        groups = rings_of(doc)
        routes = routes_of(doc) if doc.get("routes") else Routes({})
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError("fabric", f"plan:{directory}",
                          f"plan.json needs topology.links, rings and routes ({exc!r})") from None
    if not groups:
        raise ConfigError("fabric", f"plan:{directory}", "plan.json has no rings")
    try:
        check_topology(topo)
    except PlanCheckError as exc:
        raise ConfigError("fabric", f"plan:{directory}", f"plan.json topology: {exc}") from None
    widest = max(groups, key=lambda m: (len(m), [-x for x in m]))
    rings = [list(r) for r in groups[widest]]
    for r in rings:
        if len(set(r)) != len(r) or not all(0 <= s < topo.servers for s in r):
            raise ConfigError("fabric", f"plan:{directory}",
                              f"ring {r} must visit distinct servers of 0..{topo.servers - 1} "
                              "(each once)")
    return topo, rings, routes


def scenario_fabric(spec: str, nodes: int, bandwidth: float = 100e9, latency: float = 1e-6,
                    optics: str = "none"):
    """``(fabric, rings or None)`` for ``star``, ``fattree`` or ``plan:DIR``."""
    if spec == "star":
        return star(nodes + 8, bandwidth, latency), None
    if spec == "fattree":
        k = 8
        while k ** 3 // 4 < 2 * nodes:
            k += 2
        return fat_tree(k ** 3 // 4, bandwidth, latency, k=k), None
    if spec.startswith("plan:"):
        topo, rings, routes = load_plan(spec[5:])
        if topo.servers != nodes:
            # the widest AllReduce group on the fibres among its members
            group, rings, routes, members = group_shard(topo, rings, routes)
            if group.servers != nodes:
                raise ConfigError("nodes", nodes, f"the plan has {topo.servers} servers, its "
                                  f"widest AllReduce group {group.servers} "
                                  f"({_span(members)})")
            topo = group
        return shard_fabric(topo, routes, optics), rings
    raise ConfigError("fabric", spec, "use star, fattree or plan:DIR")


@dataclass(frozen=True, eq=False)
class ShardScenario:
    """A plan under a scenario: what the tuner knows, and what the network really is.

    Attributes
    ----------
    layout : ShardLayout
        The plan (topology, routes, rings, the job's own forwarded flows).
    fabric : Fabric
        The network as it is: the plan's fibres with the scenario's gray failures.
    external : tuple of BackgroundFlows
        Traffic that is not the job's.
    tx, rx : dict
        Degraded ports ``(server, port) -> bits/s`` (they stay with the port when an OCS
        re-wires it).
    """

    layout: ShardLayout
    fabric: Fabric
    external: tuple
    tx: dict
    rx: dict

    def world(self, topology: Topology) -> Fabric:
        """The network after re-wiring to ``topology`` (same degraded ports)."""
        return shard_fabric(topology, self.layout.routes, self.layout.optics, self.tx, self.rx)


def _ring_fibres(topo: Topology, rings) -> list[tuple[int, int, int, int]]:
    hops = {(u, v) for r in rings for u, v in zip(r, list(r[1:]) + [r[0]])}
    return [link for link in topo.links if (link[0], link[2]) in hops]


def group_shard(topo: Topology, rings: Sequence[Sequence[int]], routes: Routes
                ) -> tuple[Topology, list[list[int]], Routes, tuple[int, ...]]:
    """The part of a shard an AllReduce group runs on, its members renumbered 0..k-1.

    A plan's widest AllReduce group may span part of the shard (a strategy with two
    data-parallel stages has one group per stage). Its rings use fibres between its
    members (TopologyFinder gives a group with its own ring degree direct rings), and
    the other groups' collectives run on other fibres, so REACT tunes the group on the
    fibres among its members: their links (same ports), and the routes between members
    that stay inside the group. Returns ``(topology, rings, routes, members)``; the
    whole shard unchanged when the group covers it.

    Raises
    ------
    ConfigError
        A ring hop that is not a fibre between members (a group whose rings ride
        another group's: run ``--collective tree`` or ``ring`` on the plan instead).
    """
    members = tuple(sorted(set(rings[0])))
    if members == tuple(range(topo.servers)):
        return topo, [list(r) for r in rings], routes, members
    index = {s: i for i, s in enumerate(members)}
    kept = [k for k, (a, _, b, _) in enumerate(topo.links) if a in index and b in index]
    links = tuple((index[a], pa, index[b], pb)
                  for a, pa, b, pb in (topo.links[k] for k in kept))
    labels = tuple(topo.labels[k] for k in kept) if topo.labels else ()
    fibres = {(a, b) for a, _, b, _ in links}
    sub_rings = [[index[s] for s in r] for r in rings]
    for r in sub_rings:
        for u, v in zip(r, r[1:] + r[:1]):
            if (u, v) not in fibres:
                raise ConfigError("collective", "plan",
                                  f"ring hop {members[u]}->{members[v]} of the plan's widest "
                                  f"AllReduce group (servers {list(members)}) is not a "
                                  "fibre between its members; use --collective tree or "
                                  "ring on the plan's topology")
    paths = {}
    for (a, b), options in routes.paths.items():
        if a in index and b in index:
            inside = tuple((tuple(index[x] for x in path), f) for path, f in options
                           if all(x in index for x in path))
            total = sum(f for _, f in inside)
            if inside and total > 0:
                paths[index[a], index[b]] = tuple((q, f / total) for q, f in inside)
    sub = Topology(len(members), topo.ports, links, topo.link_bandwidth, topo.link_latency,
                   labels)
    return sub, sub_rings, Routes(paths), members


def _span(members: Sequence[int]) -> str:
    lo, hi = members[0], members[-1]
    return f"servers {lo}-{hi}" if list(members) == list(range(lo, hi + 1)) else \
        f"servers {list(members)}"


def shard_scenario(sc: Scenario) -> ShardScenario:
    """The plan of ``sc.fabric`` (``plan:DIR``) under ``sc``'s congestion (random parts
    drawn from ``sc.seed``): for ``--collective plan``, the planned rings of the widest
    AllReduce group with the shard tuner, on the fibres among its members
    (:func:`group_shard`)."""
    topo, rings, routes, members = group_shard(*load_plan(sc.fabric[5:]))
    n = topo.servers
    if n != sc.nodes:
        raise ConfigError("nodes", sc.nodes, f"the plan's widest AllReduce group has {n} "
                                             f"servers ({_span(members)})")
    rng = np.random.default_rng([sc.seed, 2024])
    k = sc.congested if sc.kind != "none" else 0
    tx: dict = {}
    rx: dict = {}
    external: list[BackgroundFlows] = []
    owned: list[BackgroundFlows] = []
    fibres = _ring_fibres(topo, rings)
    planned = shard_fabric(topo, routes, sc.optics)
    if sc.kind in ("failures", "forwarded") and k:
        picks = rng.choice(len(fibres), min(k, len(fibres)), replace=False)
        for i in picks.tolist():
            a, pa, b, pb = fibres[i]
            tx[(a, pa)] = min(tx.get((a, pa), np.inf), sc.capacity)
            if sc.kind == "forwarded" and sc.p:
                flow = _forwarded_over(planned, a, b, rng)
                if flow is None:
                    raise ConfigError("scenario", "forwarded",
                                      f"no planned route uses fibre {a}->{b}")
                owned.append(replace(flow, count=sc.p))
    elif sc.kind == "nic" and k:
        ports = sorted({(a, pa) for a, pa, _, _ in fibres})
        for i in rng.choice(len(ports), min(k, len(ports)), replace=False).tolist():
            tx[ports[i]] = rx[ports[i]] = sc.capacity
    elif sc.kind == "slow-server" and k and sc.p:
        for s in rng.choice(n, min(k, n), replace=False).tolist():
            for a, _, b, _ in topo.links:
                if a == s or b == s:
                    external.append(BackgroundFlows(a, b, sc.p))
    elif sc.kind == "external" and k and sc.p:
        if k > n:
            raise ConfigError("congested", k, f"at most one pair per job node ({n})")
        for s in rng.choice(n, k, replace=False).tolist():
            pool = np.setdiff1d(np.arange(n), [s])
            external.append(BackgroundFlows(int(s), int(rng.choice(pool)), sc.p))
    elif sc.kind == "spine" and k:
        raise ConfigError("scenario", "spine", "needs --fabric fattree")
    layout = ShardLayout.of(topo, rings, sc.size, routes, sc.optics, owned)
    fabric = shard_fabric(topo, routes, sc.optics, tx, rx)
    return ShardScenario(layout, fabric, tuple(external), tx, rx)


def _forwarded_over(fabric: Fabric, a: int, b: int, rng: np.random.Generator
                    ) -> BackgroundFlows | None:
    """A flow from ``a`` to a server it has no fibre to, whose route starts a -> b."""
    direct = set(fabric.dst[fabric.src == a].tolist())
    first = int(np.flatnonzero((fabric.src == a) & (fabric.dst == b))[0])
    for v in rng.permutation(fabric.servers).tolist():
        if v == a or v in direct:
            continue
        links, _ = fabric.paths(a, v)[0]
        if links.size and int(links[0]) == first:
            return BackgroundFlows(a, int(v))
    return None


# ------------------------------------------------------------------------- set-up
def scenario_setup(sc: Scenario, rings: Sequence[Sequence[int]] | None = None,
                   fabric: Fabric | None = None):
    """Fabric, placement, background flows and initial pattern of a scenario.

    ``rings``/``fabric`` override the plan read from ``plan:DIR`` (for in-memory plans).
    A plan read from ``plan:DIR`` with ``--collective plan`` is set up by
    :func:`shard_scenario` (the background then includes the job's own forwarded
    flows on their planned routes).
    """
    if fabric is None and sc.collective == "plan" and sc.fabric.startswith("plan:") \
            and rings is None:
        ss = shard_scenario(sc)
        layout = ss.layout
        flows = list(ss.external) + list(layout.owned_flows(layout.initial(), ss.fabric))
        return ss.fabric, np.arange(sc.nodes), flows, layout.pattern(layout.initial())
    if fabric is None:
        fabric, plan_rings = scenario_fabric(sc.fabric, sc.nodes, sc.bandwidth, sc.latency)
        rings = rings if rings is not None else plan_rings
    rng = np.random.default_rng([sc.seed, 2024])
    n, servers = sc.nodes, fabric.servers
    if sc.fabric == "fattree" and sc.placement == "racks":
        placement = _rack_placement(fabric, n, np.random.default_rng([sc.seed, 2025]))
    elif sc.fabric == "fattree":
        placement = np.sort(rng.choice(servers, n, replace=False))
    else:
        placement = np.arange(n)
    outside = np.setdiff1d(np.arange(servers), placement)
    background: list[BackgroundFlows] = []
    capacity = fabric.capacity.copy()
    k = sc.congested if sc.kind != "none" else 0
    if sc.kind == "external" and k and sc.p:
        if k > n:
            raise ConfigError("congested", k, f"at most one pair per job node ({n})")
        srcs = rng.choice(n, k, replace=False)
        for s in srcs:
            pool = outside if outside.size else placement[placement != placement[s]]
            a, b = int(placement[s]), int(rng.choice(pool))
            background.append(BackgroundFlows(*((a, b) if sc.direction == "out" else (b, a)),
                                              sc.p))
    elif sc.kind == "spine" and k and sc.p:
        if sc.fabric != "fattree":
            raise ConfigError("scenario", "spine", "needs --fabric fattree")
        pod = fabric.info["k"] ** 2 // 4
        for _ in range(k):
            a = int(rng.choice(outside))
            others = outside[outside // pod != a // pod]
            background.append(BackgroundFlows(a, int(rng.choice(others)), sc.p))
    elif sc.kind == "failures" and k:
        links = rng.choice(fabric.links, min(k, fabric.links), replace=False)
        capacity[links] = np.minimum(capacity[links], sc.capacity)
        fabric = fabric.with_capacity(capacity)
    elif sc.kind == "nic" and k:
        servers_hit = placement[rng.choice(n, min(k, n), replace=False)]
        if fabric.kind == "direct":
            hit = np.isin(fabric.src, servers_hit) | np.isin(fabric.dst, servers_hit)
            capacity[hit] = np.minimum(capacity[hit], sc.capacity)
        else:
            for s in servers_hit.tolist():
                for link in (fabric.uplink[s], fabric.downlink[s]):
                    capacity[link] = min(capacity[link], sc.capacity)
        fabric = fabric.with_capacity(capacity)
    elif sc.kind == "slow-server" and k and sc.p:
        for s in placement[rng.choice(n, min(k, n), replace=False)].tolist():
            pool = outside if outside.size else placement[placement != s]
            background.append(BackgroundFlows(int(s), int(rng.choice(pool)), sc.p))
            background.append(BackgroundFlows(int(rng.choice(pool)), int(s), sc.p))
    elif sc.kind == "forwarded" and k:
        raise ConfigError("scenario", "forwarded", "needs --collective plan --fabric plan:DIR")
    if sc.collective == "plan":
        if rings is None:
            raise ConfigError("collective", "plan", "needs --fabric plan:DIR (a plan's rings)")
        if sorted(set(rings[0])) != list(range(n)):
            raise ConfigError("collective", "plan",
                              f"the plan's widest AllReduce group has {len(set(rings[0]))} "
                              f"of its {n} servers: give --nodes {len(set(rings[0]))} to run "
                              "it on the fibres among its members")
        pattern = multi_ring_allreduce(rings, sc.size)
    else:
        pattern = build_pattern(sc.collective, n, sc.size)
    return fabric, placement, background, pattern


def _rack_placement(fabric: Fabric, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` servers filling whole racks (k/2 servers per ToR), one rack per pod."""
    k = int(fabric.info["k"])
    per_tor, per_pod = k // 2, k * k // 4
    racks = -(-n // per_tor)
    if racks > k:
        raise ConfigError("nodes", n, f"at most {k * per_tor} for placement racks")
    pods = rng.choice(k, racks, replace=False)
    tors = pods * per_pod + rng.integers(0, k // 2, racks) * per_tor
    return np.sort(np.concatenate([np.arange(t, t + per_tor) for t in tors])[:n])


def run_scenario(sc: Scenario, params: ReactParams = ReactParams(),
                 rings: Sequence[Sequence[int]] | None = None, fabric: Fabric | None = None,
                 progress: Callable[[str, int], None] | None = None) -> ScenarioResult:
    """Run a scenario without and with REACT (identical executors) and compare.

    A plan's multi-ring AllReduce (``--collective plan`` on ``plan:DIR``) runs on the
    class executor with the shard tuner (:func:`topoopt.react.shard.run_shard_react`);
    everything else on the general flow-level simulator with REACT's swaps.
    ``progress(stage, epochs_done)`` is called after every batch of epochs, with
    stage ``"without REACT"`` or ``"with REACT"``.
    """
    if fabric is None and rings is None and sc.collective == "plan" \
            and sc.fabric.startswith("plan:"):
        ss = shard_scenario(sc)

        def run_one(enabled: bool, report) -> ReactRun:
            # one connection per flow: a shard's hop keeps the plan's path (REACT's 4
            # ports re-draw ECMP paths of a switched fabric)
            ex = ClassExecutor(ss.fabric, range(sc.nodes), ss.external, 1, sc.seed)
            return run_shard_react(ex, ss.layout, sc.epochs, params, enabled, ss.external,
                                   ss.world, report)

        return without_and_with(sc, run_one, progress)
    fabric, placement, background, pattern = scenario_setup(sc, rings, fabric)
    return compare_runs(sc, pattern, lambda: SimulatedExecutor(
        fabric, placement, background, sc.ports, sc.seed, share_jitter=sc.share_jitter,
        external_weight=sc.external_weight, jitter_seed=sc.jitter_seed), params, progress)


def without_and_with(sc: Scenario, run_one: Callable[[bool, Callable | None], ReactRun],
            progress: Callable[[str, int], None] | None = None) -> ScenarioResult:
    """``run_one(enabled, report)`` without, then with REACT, as one result."""
    runs = []
    for stage, enabled in (("without REACT", False), ("with REACT", True)):
        report = (lambda done, s=stage: progress(s, done)) if progress else None
        runs.append(run_one(enabled, report))
    base, tuned = runs
    return ScenarioResult(sc, base.epoch_time, tuned.epoch_time, tuned.changes,
                          tuned.converged_epoch, tuned.positions_skipped)


def compare_runs(sc: Scenario, pattern: Pattern,
                 make_executor: Callable[[], PatternExecutor], params: ReactParams = ReactParams(),
                 progress: Callable[[str, int], None] | None = None) -> ScenarioResult:
    """``sc.epochs`` epochs of ``pattern`` without, then with REACT, each on a fresh
    executor from ``make_executor`` (same seeds, so the same draws)."""
    return without_and_with(sc, lambda enabled, report: run_react(
        make_executor(), pattern, sc.epochs, params, enabled, report), progress)


def run_two_jobs(overlap: int, seed: int = 0, nodes: int = 8, size: float = 20e6,
                 epochs: int = 100, react: tuple[bool, bool] = (True, True),
                 params: ReactParams = ReactParams(), bandwidth: float = 100e9
                 ) -> dict:
    """Two jobs on one star sharing ``overlap`` servers (§7.3.3, Fig. 6).

    Job 1 runs the double binary tree, job 2 ring AllReduce, both ``size`` bytes on
    ``nodes`` ranks; the shared servers are drawn from ``seed``. Returns per-job mean
    epoch times without and with REACT (``react`` says which jobs run it). The
    general driver (any modes, the cooperative rules, Fig. 7's setting) is
    :mod:`topoopt.react.jobs`.
    """
    require_int("overlap", overlap, minimum=0, maximum=nodes)
    fabric = star(2 * nodes, bandwidth)
    placements = overlap_placement(nodes, overlap, seed)
    patterns = [build_pattern("tree", nodes, size), build_pattern("ring", nodes, size)]
    warm = min(25, epochs - 1)
    out = {}
    for label, modes in (("baseline", ("off", "off")),
                         ("react", tuple("react" if on else "off" for on in react))):
        run = run_jobs(fabric, placements, patterns, modes, epochs, params, seed=seed)
        out[label] = [run.mean(j, warm) for j in range(2)]
    return out


def summarize(results: Sequence[ScenarioResult]) -> dict:
    """Mean/max improvement and mean epochs-to-converge of a list of results."""
    imp = np.array([r.improvement for r in results])
    conv = np.array([r.converged_epoch for r in results])
    return {"mean_improvement": float(imp.mean()), "max_improvement": float(imp.max()),
            "min_improvement": float(imp.min()), "converged_epoch": float(conv.mean()),
            "runs": len(results)}
