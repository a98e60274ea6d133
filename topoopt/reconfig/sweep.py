"""TopoOpt Figure 17: iteration time of OCS-reconfig against its reconfiguration latency.

For one job and strategy, OCS-reconfig with and without host forwarding at every
latency of a sweep (1 us .. 10 ms in the paper), next to the TopoOpt shard's iteration
time, which does not depend on it (its topology never changes). The demand is measured
every ``interval_factor x latency`` by default (5: 50 ms at 10 ms, the schedule of the
authors' simulator), or every ``interval`` seconds whatever the latency.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError
from topoopt.estimate import EstimateCache, estimate_iteration
from topoopt.fabrics.catalog import build_fabric
from topoopt.fabrics.reconfigurable import INTERVAL_PER_LATENCY, ocs_reconfig, reconfiguration_of
from topoopt.model import Model
from topoopt.reconfig.iteration import Interrupted, ReconfigEstimator
from topoopt.strategy import Strategy

__all__ = ["SweepPoint", "LatencySweep", "latency_sweep", "PAPER_LATENCIES"]

#: The latencies of the paper's Figure 17 runs (the authors' scripts), seconds.
PAPER_LATENCIES = (1e-6, 5e-6, 20e-6, 100e-6, 1e-3, 10e-3)


@dataclass(frozen=True)
class SweepPoint:
    """OCS-reconfig at one latency, with or without forwarding.

    Attributes
    ----------
    latency, interval : float
        Seconds per change, seconds between demand measurements.
    forwarding : bool
    total : float
        Seconds of a measured iteration (their mean).
    changes : float
        Circuit changes per measured iteration (mean).
    bandwidth_tax : float
    iteration_times : tuple of float
        Every simulated iteration, warm-up included.
    """

    latency: float
    interval: float
    forwarding: bool
    total: float
    changes: float
    bandwidth_tax: float
    iteration_times: tuple[float, ...]


@dataclass(frozen=True)
class LatencySweep:
    """The sweep: TopoOpt's iteration time and OCS-reconfig's at every latency
    (``complete`` False when it was stopped: the latencies done so far)."""

    model: str
    strategy: str
    servers: int
    ports: int
    link_bandwidth: float
    idle: str
    topoopt: float
    points: tuple[SweepPoint, ...]
    complete: bool = True

    def series(self, forwarding: bool) -> list[SweepPoint]:
        """The points of one curve, by latency."""
        return sorted((p for p in self.points if p.forwarding == forwarding),
                      key=lambda p: p.latency)

    def to_json(self) -> dict:
        return {"model": self.model, "strategy": self.strategy, "servers": self.servers,
                "ports": self.ports, "link_bandwidth_bps": self.link_bandwidth,
                "idle": self.idle, "topoopt_s": self.topoopt, "complete": self.complete,
                "points": [dataclasses.asdict(p) for p in self.points]}


def latency_sweep(model: Model, strategy: Strategy, cluster: Cluster, job: Job,
                  latencies: Sequence[float] = PAPER_LATENCIES, *,
                  interval: float | None = None,
                  interval_factor: float = INTERVAL_PER_LATENCY,
                  forwarding: Sequence[bool] = (True, False), idle: str = "keep",
                  iterations: int = 2, warmup: int = 1, seed: int = 0,
                  strategy_name: str = "",
                  progress: Callable[[str], None] | None = None,
                  stop: Callable[[], bool] | None = None) -> LatencySweep:
    """OCS-reconfig's iteration time at every latency, and TopoOpt's (TopoOpt §5.7, Fig. 17).

    Parameters
    ----------
    model, strategy, cluster, job :
        The job (the paper: DLRM and BERT at n = 128, d = 4, B = 100 Gb/s).
    latencies : sequence of float
        Reconfiguration latencies, seconds.
    interval : float, optional
        Seconds between demand measurements, the same at every latency; default
        ``interval_factor x latency``.
    interval_factor : float
        Measurement interval over latency when ``interval`` is None (> 1).
    forwarding : sequence of bool
        The curves: with (FW) and without (noFW) host forwarding.
    idle : {"keep", "rewire"}
        What the ports the demand does not need do
        (:class:`~topoopt.fabrics.reconfigurable.Reconfiguration`).
    iterations, warmup : int
        Iterations simulated per point, and how many are not measured.
    seed : int
        TopologyFinder's and the idle wiring's seed.
    strategy_name : str
        For the report.
    progress : callable, optional
        ``progress(text)`` before each point.
    stop : callable, optional
        Polled during the runs (e.g. :func:`topoopt.interrupt.stop_requested`); when it
        returns True the sweep ends with the latencies done (``complete`` False).

    Returns
    -------
    LatencySweep

    Raises
    ------
    ConfigError
        A latency that is negative or not finite, or an interval not above a latency.
    """
    if not latencies:
        raise ConfigError("latencies", latencies, "give at least one latency")
    for lat in latencies:
        if not (math.isfinite(lat) and lat >= 0):
            raise ConfigError("latencies", lat, "latencies must be >= 0 seconds")
    if interval is None and not interval_factor > 1:
        raise ConfigError("interval", interval_factor, "a factor of the latency must be > 1")
    if interval is not None and not interval > max(latencies):
        raise ConfigError("interval", interval, "must exceed every latency of the sweep")
    cache = EstimateCache(model, cluster, job)
    topo = build_fabric("topoopt", cluster, job=job, model=model, strategy=strategy, seed=seed)
    topoopt = estimate_iteration(model, strategy, cluster, job, topo, cache=cache).total
    runs = {}
    for fw in forwarding:
        fabric = ocs_reconfig(cluster.servers, cluster.nics, cluster.link_bandwidth,
                              cluster.link_latency, forwarding=fw, idle=idle, seed=seed)
        spec = reconfiguration_of(fabric)
        assert spec is not None, "ocs_reconfig builds a reconfigurable fabric"
        base = dataclasses.replace(spec, iterations=iterations, warmup=warmup)
        runs[fw] = (ReconfigEstimator(model, cluster, job, fabric, cache=cache, spec=base), base)
    points = []
    complete = True
    try:
        for lat in sorted(latencies):        # by latency: a stop leaves whole rows
            every = interval if interval is not None else interval_factor * lat
            for fw in forwarding:
                est, base = runs[fw]
                spec = base.with_latency(lat, every)
                if progress is not None:
                    progress(f"OCS-reconfig-{'FW' if fw else 'noFW'} at {lat:g} s")
                run = est.run(strategy, spec=spec, stop=stop)
                measured = run.reconfigurations[warmup:]
                points.append(SweepPoint(lat, spec.every, fw, run.estimate.total,
                                         sum(measured) / len(measured), run.bandwidth_tax,
                                         run.iteration_times))
    except Interrupted:
        complete = False
        points = [p for p in points
                  if sum(q.latency == p.latency for q in points) == len(forwarding)]
    return LatencySweep(model.name, strategy_name, cluster.servers, cluster.nics,
                        cluster.link_bandwidth, idle, topoopt, tuple(points), complete)
