"""Simulated executors: collective patterns on the flow-level simulator.

Star, Fat-tree and direct-connect fabrics, with REACT §7.3's ECMP and background traffic.

A thin adapter over :mod:`topoopt.netsim` and :mod:`topoopt.fabrics`: it maps ranks to
servers, routes every flow, adds the pattern's dependencies
(:func:`topoopt.collectives.flow_dependencies`) and simulates one epoch at a time.
Things the simulator does not do itself and that live here:

* ECMP as in REACT §7.3: every flow of the pattern owns ``ports`` connections, each
  hashed (seeded) onto one of the equal-cost paths of its server pair; each epoch one
  connection is drawn at random per flow. The draw depends on (seed, epoch, edge index)
  only, so a baseline and a REACT run see the same draws.
* Epoch-scoped background traffic: greedy external flows active in a range of epochs
  (each on one ECMP path, fixed for its lifetime like a long TCP connection).
* Several jobs sharing one network (:class:`JobsExecutor`).
* Optionally (``wire=``), packet overheads: header bytes and ACKs on the reverse path
  (:class:`topoopt.netsim.wire.WireModel`, calibrated against ns-3); off by default, so
  times are the closed-form fluid ones.
* Optionally (``external_weight=``), the transport's unequal share at a port a job's
  flow shares with long-lived greedy flows (:func:`external_share`); 1 by default
  (max-min fairness).
* Optionally (``share_jitter=``), unequal shares among the job's own flows: each epoch
  every flow gets a seeded log-normal weight and links are shared in proportion to the
  weights (weighted max-min, work-conserving), as TCP flows that meet at a port split
  it unevenly from epoch to epoch; 0 by default (plain max-min).
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from topoopt.collectives.ten import Pattern, flow_dependencies
from topoopt.errors import ConfigError
from topoopt.fabrics.fabric import Fabric
from topoopt.netsim import Background, CompiledWorkload, FlowRoutes, Workload, simulate
from topoopt.netsim.wire import wire_backgrounds, wire_workload
from topoopt.react.execution import BatchResult

__all__ = ["BackgroundFlows", "SimulatedExecutor", "JobsExecutor", "ecmp_paths",
           "check_placements", "pattern_workload", "hop_paths", "pair_links",
           "external_share", "jitter_weights"]


@dataclass(frozen=True)
class BackgroundFlows:
    """``count`` greedy external flows from server ``src`` to server ``dst``, active in
    epochs ``[first_epoch, last_epoch)`` (``last_epoch=None``: until the end).

    ``path`` (link ids) pins them to one route, e.g. a host-forwarded route of a plan;
    by default each takes one ECMP path of the pair."""

    src: int
    dst: int
    count: int = 1
    first_epoch: int = 0
    last_epoch: int | None = None
    path: tuple[int, ...] | None = None

    def active(self, epoch: int) -> bool:
        return epoch >= self.first_epoch and (self.last_epoch is None or epoch < self.last_epoch)


def external_share(p: int, weight: float = 1.0) -> float:
    """The fraction of a port's capacity a job's flow gets next to ``p`` greedy external
    flows that each take ``weight`` times its rate: ``1 / (1 + p * weight)``.

    ``weight = 1`` is max-min fairness (``1 / (p + 1)``). A weight above 1 models a
    transport whose long-lived flows, with converged windows, keep more than a fair
    share against a flow that starts anew every epoch from an idle connection (the
    collective's flows under DCTCP; measured against ns-3 in ``docs/paper-comparison.md``).
    The job's flow and the ``p`` external flows together get the whole port:
    ``share * (1 + p * weight) == 1``.

    Parameters
    ----------
    p : int
        External flows at the port.
    weight : float
        Each external flow's rate over the job flow's rate (> 0).

    Returns
    -------
    float

    References
    ----------
    REACT (§7.3): DCTCP, greedy external flows per congested pair.

    Examples
    --------
    >>> external_share(4), round(external_share(2, 1.05), 4)
    (0.2, 0.3226)
    """
    if not weight > 0:
        raise ConfigError("external_weight", weight, "a number > 0 (1: max-min fairness)")
    return 1.0 / (1.0 + p * weight)


def _hash(*parts: int) -> int:
    return zlib.crc32(np.asarray(parts, np.int64).tobytes())


def pair_links(fabric: Fabric) -> dict[tuple[int, int], int]:
    """``(node_a, node_b) -> link id`` of ``fabric`` (cached on it; with parallel links,
    the last)."""
    ids = fabric._cache.get("pair_links")
    if ids is None:
        ids = {(int(u), int(v)): i for i, (u, v) in
               enumerate(zip(fabric.src.tolist(), fabric.dst.tolist()))}
        fabric._cache["pair_links"] = ids
    return ids


def hop_paths(fabric: Fabric, a: int, b: int) -> list[tuple[np.ndarray, float]]:
    """:meth:`Fabric.paths` of ``a -> b``, cached on the fabric. On a direct fabric an
    explicit route is read by its pair, and a hop over one fibre (no explicit route) is
    that fibre, both without a search over every route or path."""
    cache = fabric._cache.setdefault("hop_paths", {})
    key = (int(a), int(b))
    if key not in cache:
        one = None
        if fabric.kind == "direct" and key[0] != key[1]:      # servers are routing nodes
            if key in fabric.explicit:
                one = [(np.asarray(p, np.int64), float(w)) for p, w in fabric.explicit[key]]
            elif key in pair_links(fabric):
                one = [(np.array([pair_links(fabric)[key]], np.int64), 1.0)]
        cache[key] = one if one is not None else fabric.paths(*key)
    return cache[key]


def ecmp_paths(fabric: Fabric, a: int, b: int, cache: dict | None = None) -> list[np.ndarray]:
    """Equal-cost paths (link-id arrays) from server ``a`` to ``b`` of ``fabric``."""
    key = (a, b)
    if cache is not None and key in cache:
        return cache[key]
    paths = [np.asarray(links, np.int64) for links, _ in hop_paths(fabric, a, b)]
    if cache is not None:
        cache[key] = paths
    return paths


class EcmpRouter:
    """ECMP as REACT §7.3 models it: every flow owns ``ports`` connections hashed onto
    the fabric's equal-cost paths, and uses one of them, drawn per epoch from
    ``(seed, job, epoch)``. Shared by the flow-level and the ns-3 executors, so both
    route an epoch identically."""

    def __init__(self, fabric: Fabric, ports: int, seed: int) -> None:
        self.fabric, self.ports, self.seed = fabric, int(ports), int(seed)
        self._paths: dict = {}
        self._conns: dict = {}

    def connections(self, job: int, edge: int, a: int, b: int) -> list[np.ndarray]:
        key = (job, edge, a, b)
        if key not in self._conns:
            paths = ecmp_paths(self.fabric, a, b, self._paths)
            rng = np.random.default_rng(_hash(self.seed, job, edge, a, b))
            pick = rng.integers(0, len(paths), size=self.ports)
            self._conns[key] = [paths[i] for i in pick]
        return self._conns[key]

    def epoch_choices(self, job: int, epoch: int, flows: int) -> np.ndarray:
        """The connection each of a job's ``flows`` flows uses in ``epoch``."""
        rng = np.random.default_rng([self.seed, job, epoch, 7])
        return rng.integers(0, self.ports, size=flows)

    def routes(self, job: int, src: np.ndarray, dst: np.ndarray, epoch: int) -> FlowRoutes:
        choice = self.epoch_choices(job, epoch, len(src))
        links = [self.connections(job, e, int(a), int(b))[c]
                 for e, (a, b, c) in enumerate(zip(src, dst, choice))]
        return FlowRoutes.from_lists(links)

    def background_links(self, i: int, bg: BackgroundFlows, k: int) -> tuple[int, ...]:
        if bg.path is not None:
            return tuple(int(x) for x in bg.path)
        paths = ecmp_paths(self.fabric, bg.src, bg.dst, self._paths)
        j = _hash(self.seed, 99, i, k, bg.src, bg.dst) % len(paths)
        return tuple(int(x) for x in paths[j])


def pattern_workload(pattern: Pattern, cache: dict) -> tuple[CompiledWorkload, np.ndarray]:
    """The compiled workload of a pattern (flow ``e`` = edge ``e``, its dependencies;
    routes empty, filled in per epoch) and its node ids, cached in ``cache``."""
    key = pattern.signature()
    if key not in cache:
        w = Workload()
        E = pattern.edges_count
        ids = w.add_flows(pattern.nbytes.astype(float),
                          FlowRoutes(np.zeros(E + 1, np.int64), np.zeros(0, np.int64),
                                     np.zeros(0)))
        ptr, idx = flow_dependencies(pattern)
        after = np.repeat(np.arange(E), np.diff(ptr))
        w.add_dependencies(ids[idx], ids[after])
        cache.clear() if len(cache) > 64 else None
        cache[key] = (w.compile(), ids)
    return cache[key]


def check_placements(fabric: Fabric, placements: Sequence[Sequence[int] | np.ndarray]
                     ) -> list[np.ndarray]:
    """Each job's ranks as server ids, refused unless distinct servers of ``fabric``."""
    out = [np.asarray(p, np.int64) for p in placements]
    for j, p in enumerate(out):
        if len(set(p.tolist())) != len(p) or p.min() < 0 or p.max() >= fabric.servers:
            raise ConfigError(f"placement[{j}]", p.tolist(),
                              f"distinct servers in 0..{fabric.servers - 1}")
    return out


class JobsExecutor:
    """Several jobs' patterns run together, epoch by epoch, on one fabric.

    Parameters
    ----------
    fabric : topoopt.fabrics.Fabric
    placements : sequence of sequence of int
        Per job, the server of each rank.
    background : sequence of BackgroundFlows
    ports : int
        ECMP connections per flow (REACT §7.3: 4); one is drawn per epoch.
    seed : int
    wire : topoopt.netsim.wire.WireModel, optional
        Add packet overheads (wire bytes, ACK load on reverse paths); None: pure fluid.
    external_weight : float
        Each external flow's rate over a job flow's at a port they share
        (:func:`external_share`); 1: max-min fairness.
    share_jitter : float
        Standard deviation of the log of each job flow's per-epoch share weight,
        drawn from ``(seed, job, epoch)`` (:func:`jitter_weights`); 0: plain max-min.
    jitter_seed : int
        Another draw of those weights (0: the default draw).
    """

    def __init__(self, fabric: Fabric, placements: Sequence[Sequence[int] | np.ndarray],
                 background: Sequence[BackgroundFlows] = (), ports: int = 4,
                 seed: int = 0, wire=None, *, external_weight: float = 1.0,
                 share_jitter: float = 0.0, jitter_seed: int = 0) -> None:
        external_share(0, external_weight)              # refuses a weight <= 0
        if not share_jitter >= 0:
            raise ConfigError("share_jitter", share_jitter, "a number >= 0 (0: max-min)")
        self.external_weight = float(external_weight)
        self.share_jitter = float(share_jitter)
        self.seed = int(seed)
        self.jitter_key = (int(seed),) if not jitter_seed else (int(seed), int(jitter_seed))
        self.fabric = fabric
        self.placements = check_placements(fabric, placements)
        self.background = tuple(background)
        self.router = EcmpRouter(fabric, ports, seed)
        self.wire = wire
        self.epoch = 0
        self._cache: dict = {}

    def run_many(self, patterns: Sequence[Pattern], epochs: int) -> list[BatchResult]:
        """Run ``epochs`` epochs of every job's pattern at once (all start together)."""
        if len(patterns) != len(self.placements):
            raise ConfigError("patterns", len(patterns), f"one per job ({len(self.placements)})")
        out: list[tuple[list, list, list]] = [([], [], []) for _ in patterns]
        for _ in range(epochs):
            parts, spans = [], []
            for j, (p, place) in enumerate(zip(patterns, self.placements)):
                if p.ranks != len(place):
                    raise ConfigError("pattern.ranks", p.ranks, f"job {j} has {len(place)} ranks")
                base, _ = pattern_workload(p, self._cache)
                routes = self.router.routes(j, place[p.src], place[p.dst], self.epoch)
                part = dataclasses.replace(base, routes=routes)
                if self.share_jitter:
                    phi = jitter_weights(self.share_jitter, len(routes),
                                         (*self.jitter_key, j, self.epoch))
                    part = _weighted(part, phi, self.fabric.latency)
                parts.append(part)
            work = parts[0] if len(parts) == 1 else _concat(parts)
            bgs = [self._external(self.router.background_links(i, bg, k))
                   for i, bg in enumerate(self.background) if bg.active(self.epoch)
                   for k in range(bg.count)]
            if self.wire is not None:   # ACK companions go after the jobs' flows
                src = np.concatenate([pl[p.src] for p, pl in zip(patterns, self.placements)])
                dst = np.concatenate([pl[p.dst] for p, pl in zip(patterns, self.placements)])
                work = wire_workload(work, self.fabric, src, dst, self.wire)
                ends = [(bg.src, bg.dst) for bg in self.background if bg.active(self.epoch)
                        for _ in range(bg.count)]
                bgs = wire_backgrounds(bgs, self.fabric, ends, self.wire)
            res = simulate(self.fabric, work, bgs, check=False)
            off = 0
            for j, p in enumerate(patterns):
                sl = slice(off, off + p.edges_count)
                off += p.edges_count
                start, finish = res.start[sl], res.finish[sl]
                out[j][0].append(start)
                out[j][1].append(finish)
                out[j][2].append(finish.max())
                spans.append(finish.max())
            self.epoch += 1
        return [BatchResult(np.array(s), np.array(f), np.array(t)) for s, f, t in out]

    def _external(self, links: tuple[int, ...]) -> Background:
        """A greedy external flow; with a weight w != 1 it uses w x the max-min rate
        on each of its links, so a job flow beside p of them gets 1 / (1 + p w)."""
        w = self.external_weight
        return Background(links, None if w == 1.0 else (w,) * len(links))


def jitter_weights(sigma: float, flows: int, key: Sequence[int]) -> np.ndarray:
    """Per-flow share weights ``exp(sigma * N(0, 1))``, seeded by ``key`` (all 1 for
    ``sigma = 0``)."""
    z = np.random.default_rng([*(int(x) for x in key), 13]).standard_normal(flows)
    return np.exp(sigma * z)


def _weighted(w: CompiledWorkload, phi: np.ndarray, link_latency: np.ndarray
              ) -> CompiledWorkload:
    """Weighted max-min through plain max-min: flow f's route weights times ``phi[f]``
    and its size over ``phi[f]``, so at a shared bottleneck it moves ``phi[f]`` times
    the bytes per second of a weight-1 flow, and the link stays exactly full. Its
    latency stays that of its links (the simulator would weight it too)."""
    r = w.routes
    owner = np.repeat(np.arange(len(r)), np.diff(r.ptr))
    latency = w.flow_latency.copy()
    unset = np.isnan(latency)
    latency[unset] = np.bincount(owner, weights=link_latency[r.link] * r.weight,
                                 minlength=len(r))[unset]
    return dataclasses.replace(w, routes=FlowRoutes(r.ptr, r.link, r.weight * phi[owner]),
                               flow_size=w.flow_size / phi, flow_latency=latency)


def _concat(parts):
    """Concatenate compiled flow-only workloads (node ids shifted)."""
    offs = np.cumsum([0] + [w.nodes for w in parts[:-1]])
    cat = lambda name: np.concatenate([getattr(w, name) for w in parts])  # noqa: E731
    shift = lambda name: np.concatenate([getattr(w, name) + o  # noqa: E731
                                         for w, o in zip(parts, offs)])
    return CompiledWorkload(
        nodes=int(sum(w.nodes for w in parts)), is_flow=cat("is_flow"), local=shift("local"),
        release=cat("release"), flow_node=shift("flow_node"), flow_size=cat("flow_size"),
        flow_latency=cat("flow_latency"), routes=FlowRoutes.concat([w.routes for w in parts]),
        task_node=np.zeros(0, np.int64), task_duration=np.zeros(0),
        task_resource=np.zeros(0, np.int64), task_priority=np.zeros(0),
        dep_before=shift("dep_before"), dep_after=shift("dep_after"))


class SimulatedExecutor:
    """One job on the flow-level simulator: the :class:`PatternExecutor` REACT drives.

    Parameters
    ----------
    fabric : topoopt.fabrics.Fabric
    placement : sequence of int
        Server of each rank.
    background : sequence of BackgroundFlows
    ports : int
        ECMP connections per flow, one drawn at random per epoch (REACT §7.3).
    seed : int
    wire : topoopt.netsim.wire.WireModel, optional
        Packet overheads (see :class:`JobsExecutor`).
    external_weight, share_jitter : float
        See :class:`JobsExecutor` (1 and 0: plain max-min).
    jitter_seed : int
        See :class:`JobsExecutor`.

    Examples
    --------
    >>> from topoopt.fabrics import star
    >>> from topoopt.collectives import ring_allreduce
    >>> ex = SimulatedExecutor(star(4, 100e9), range(4))
    >>> r = ex.run(ring_allreduce(range(4), size=4e6), 2)
    >>> r.fct.shape, round(float(r.epoch_time[0]) * 1e6)       # 6 steps of 1 MB + 2 us each
    ((2, 24), 492)
    """

    def __init__(self, fabric: Fabric, placement: Sequence[int],
                 background: Sequence[BackgroundFlows] = (), ports: int = 4,
                 seed: int = 0, wire=None, *, external_weight: float = 1.0,
                 share_jitter: float = 0.0, jitter_seed: int = 0) -> None:
        self._jobs = JobsExecutor(fabric, [placement], background, ports, seed, wire,
                                  external_weight=external_weight, share_jitter=share_jitter,
                                  jitter_seed=jitter_seed)

    @property
    def epoch(self) -> int:
        return self._jobs.epoch

    def run(self, pattern: Pattern, epochs: int) -> BatchResult:
        return self._jobs.run_many([pattern], epochs)[0]
