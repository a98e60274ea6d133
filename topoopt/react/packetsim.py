"""REACT on ns-3: epochs of collective patterns as TCP flows, and REACT's scenarios there.

The scenarios (§7.3) run with the same set-up and loop as the flow-level runs.

The packet-level twin of :class:`topoopt.react.flowsim.JobsExecutor`: same placements,
same ECMP model and draws (every flow owns ``ports`` connections hashed onto equal-cost
paths; one connection is drawn per epoch from ``(seed, job, epoch)``), same external
flows -- so a flow-level and a packet-level run of one scenario see the same paths and
differ only in the network model. Per epoch every job's pattern is one DAG: a flow
starts when the flows it depends on (:func:`topoopt.collectives.flow_dependencies`)
have delivered their last byte, which the worker's C++ driver does inside ns-3. Epochs
run back to back in simulated time; connections (with their TCP state) and external
greedy flows persist across epochs and across :meth:`run` calls.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from topoopt.collectives.ten import Pattern, flow_dependencies
from topoopt.errors import ConfigError
from topoopt.fabrics.fabric import Fabric
from topoopt.netsim.ns3.config import Ns3Config
from topoopt.netsim.ns3.session import DagBuilder, Ns3Network
from topoopt.netsim.ns3.worker import Ns3Worker, require_ns3
from topoopt.react.execution import BatchResult
from topoopt.react.flowsim import BackgroundFlows, EcmpRouter, check_placements
from topoopt.react.loop import ReactParams, ReactRun
from topoopt.react.scenarios import (
    Scenario,
    ScenarioResult,
    compare_runs,
    scenario_setup,
    shard_scenario,
    without_and_with,
)
from topoopt.react.shard import run_shard_react

__all__ = ["Ns3JobsExecutor", "Ns3Executor", "run_scenario_ns3"]


class Ns3JobsExecutor:
    """Several jobs' patterns run together, epoch by epoch, on one fabric in ns-3.

    Parameters
    ----------
    fabric : topoopt.fabrics.Fabric
        Its capacities are the ns-3 link rates (degraded links included).
    placements : sequence of sequence of int
        Per job, the server of each rank.
    background : sequence of BackgroundFlows
        Greedy external TCP flows, each on one ECMP path, on during their epochs
        (switched on ``config.background_settle`` seconds before the epoch starts).
    ports : int
        ECMP connections per flow (REACT §7.3: 4), one drawn per epoch.
    seed : int
        ECMP seed (as in the flow-level executor).
    config : Ns3Config
    worker : Ns3Worker, optional
        Default: the shared worker.
    limit : float
        Simulated seconds an epoch may take before it is declared stalled.
    """

    def __init__(self, fabric: Fabric, placements: Sequence[Sequence[int] | np.ndarray],
                 background: Sequence[BackgroundFlows] = (), ports: int = 4, seed: int = 0,
                 config: Ns3Config = Ns3Config(), worker: Ns3Worker | None = None,
                 limit: float = 5.0) -> None:
        self.fabric = fabric
        self.placements = check_placements(fabric, placements)
        self.background = tuple(background)
        self.router = EcmpRouter(fabric, ports, seed)
        self.network = Ns3Network(fabric, config, worker)
        self.config = config
        self.limit = float(limit)
        self.epoch = 0
        self._bg_on: dict[int, bool] = {}
        self._deps: dict = {}

    def _flow_conns(self, job: int, pattern: Pattern, place: np.ndarray) -> np.ndarray:
        src, dst = place[pattern.src], place[pattern.dst]
        choice = self.router.epoch_choices(job, self.epoch, len(src))
        conns = np.empty(len(src), np.int64)
        for e, (a, b, c) in enumerate(zip(src.tolist(), dst.tolist(), choice.tolist())):
            path = self.router.connections(job, e, a, b)[c]
            conns[e] = self.network.connection(a, b, path, key=("flow", job, e, a, b, c))
        return conns

    def set_background(self, background: Sequence[BackgroundFlows]) -> None:
        """Replace the external flows from the next epoch on (a moved route: the old
        connections stop, new ones start on the new path)."""
        self.background = tuple(background)

    def _background_switches(self) -> list[tuple[int, bool]]:
        out = []
        want: dict[int, bool] = {}
        for i, bg in enumerate(self.background):
            on = bg.active(self.epoch)
            for k in range(bg.count):
                links = self.router.background_links(i, bg, k)
                conn = self.network.connection(bg.src, bg.dst, links,
                                               key=("bg", i, k, bg.src, bg.dst, links))
                want[conn] = want.get(conn, False) or on
        for conn in self._bg_on:
            want.setdefault(conn, False)
        for conn, on in want.items():
            if self._bg_on.get(conn, False) != on:
                self._bg_on[conn] = on
                out.append((conn, on))
        return out

    def _dependencies(self, pattern: Pattern) -> tuple[np.ndarray, np.ndarray]:
        key = pattern.signature()
        if key not in self._deps:
            ptr, idx = flow_dependencies(pattern)
            after = np.repeat(np.arange(pattern.edges_count), np.diff(ptr))
            if len(self._deps) > 64:
                self._deps.clear()
            self._deps[key] = (idx, after)
        return self._deps[key]

    def run_many(self, patterns: Sequence[Pattern], epochs: int) -> list[BatchResult]:
        """Run ``epochs`` epochs of every job's pattern at once (all start together)."""
        if len(patterns) != len(self.placements):
            raise ConfigError("patterns", len(patterns), f"one per job ({len(self.placements)})")
        for j, (p, place) in enumerate(zip(patterns, self.placements)):
            if p.ranks != len(place):
                raise ConfigError("pattern.ranks", p.ranks, f"job {j} has {len(place)} ranks")
        dags, switches, advance, spans = [], [], [], []
        first = self.epoch
        for _ in range(epochs):
            sw = self._background_switches()
            b = DagBuilder()
            lo = []
            for j, (p, place) in enumerate(zip(patterns, self.placements)):
                ids = b.add_flows(self._flow_conns(j, p, place), p.nbytes.astype(float))
                before, after = self._dependencies(p)
                b.add_dependencies(ids[before], ids[after])
                lo.append((int(ids[0]) if ids.size else 0, p.edges_count))
            dags.append(b.build())
            switches.append(sw)
            advance.append(self.config.background_settle if any(on for _, on in sw) else 0.0)
            spans.append(lo)
            self.epoch += 1
        try:
            results = self.network.run(dags, advance, self.limit, greedy=switches)
        except Exception:
            self.epoch = first
            raise
        out: list[tuple[list, list, list]] = [([], [], []) for _ in patterns]
        for res, lo in zip(results, spans):
            assert res is not None                   # every epoch ran a DAG
            for j, (off, count) in enumerate(lo):
                s, f = res.start[off:off + count], res.finish[off:off + count]
                out[j][0].append(s)
                out[j][1].append(f)
                out[j][2].append(f.max() if f.size else 0.0)
        return [BatchResult(np.array(s), np.array(f), np.array(t)) for s, f, t in out]


class Ns3Executor:
    """One job on ns-3: the :class:`~topoopt.react.execution.PatternExecutor` REACT drives.

    Parameters are those of :class:`Ns3JobsExecutor` with one ``placement``.

    Examples
    --------
    >>> from topoopt.fabrics import star
    >>> from topoopt.collectives import ring_allreduce
    >>> ex = Ns3Executor(star(4, 100e9), range(4))                     # doctest: +SKIP
    >>> ex.run(ring_allreduce(range(4), size=4e6), 2).epoch_time        # doctest: +SKIP
    """

    def __init__(self, fabric: Fabric, placement: Sequence[int],
                 background: Sequence[BackgroundFlows] = (), ports: int = 4, seed: int = 0,
                 config: Ns3Config = Ns3Config(), worker: Ns3Worker | None = None,
                 limit: float = 5.0) -> None:
        self._jobs = Ns3JobsExecutor(fabric, [placement], background, ports, seed, config,
                                     worker, limit)

    @property
    def epoch(self) -> int:
        return self._jobs.epoch

    @property
    def network(self) -> Ns3Network:
        return self._jobs.network

    def run(self, pattern: Pattern, epochs: int) -> BatchResult:
        return self._jobs.run_many([pattern], epochs)[0]

    def set_background(self, background: Sequence[BackgroundFlows]) -> None:
        self._jobs.set_background(background)

    def reconfigure(self, fabric: Fabric, stall: float = 0.0) -> None:
        raise ConfigError("optics", "ocs", "ns-3 cannot re-wire a running network; use "
                          "--backend flow for an OCS shard")


def run_scenario_ns3(sc: Scenario, params: ReactParams = ReactParams(),
                     config: Ns3Config = Ns3Config(), worker: Ns3Worker | None = None,
                     rings: Sequence[Sequence[int]] | None = None, fabric: Fabric | None = None,
                     progress: Callable[[str, int], None] | None = None
                     ) -> ScenarioResult:
    """Run a scenario without and with REACT on ns-3 (one after the other, on fresh
    networks with the same seeds and ECMP draws) and compare.

    The packet-level twin of :func:`topoopt.react.scenarios.run_scenario`: the fabric,
    placement, external flows and pattern come from
    :func:`~topoopt.react.scenarios.scenario_setup` (a plan's multi-ring AllReduce from
    :func:`~topoopt.react.scenarios.shard_scenario`, with the shard tuner); the executor
    is :class:`Ns3Executor`. ``progress(stage, epochs_done)``
    as in :func:`~topoopt.react.scenarios.run_scenario`.
    """
    require_ns3()
    if fabric is None and rings is None and sc.collective == "plan" \
            and sc.fabric.startswith("plan:"):
        if sc.optics == "ocs":
            raise ConfigError("optics", "ocs", "ns-3 cannot re-wire a running network; use "
                              "--backend flow for an OCS shard")
        ss = shard_scenario(sc)

        def run_one(enabled: bool, report) -> ReactRun:
            ex = Ns3Executor(ss.fabric, range(sc.nodes), ss.external, 1, sc.seed, config,
                             worker)
            return run_shard_react(ex, ss.layout, sc.epochs, params, enabled, ss.external,
                                   progress=report)

        return without_and_with(sc, run_one, progress)
    fabric, placement, background, pattern = scenario_setup(sc, rings, fabric)

    def make() -> Ns3Executor:
        return Ns3Executor(fabric, placement, background, sc.ports, sc.seed, config, worker)

    return compare_runs(sc, pattern, make, params, progress)
