"""Fabrics that change their circuits within an iteration: OCS-reconfig and SiP-ML (TopoOpt §5.1).

A reconfigurable fabric is a :class:`~topoopt.fabrics.Fabric` -- its circuits at the
start, a valid static fabric that the cost model prices -- carrying a
:class:`Reconfiguration` in ``info["reconfig"]``: how it measures the demand, re-plans
its circuits and what a change costs. The iteration time of such a fabric is not a
static-fabric simulation; :mod:`topoopt.reconfig` simulates it (epochs of the flow
simulator between reconfigurations), and :func:`reconfiguration_of` is how callers tell
the two kinds apart.

- **OCS-reconfig** (:func:`ocs_reconfig`): a TopoOpt shard on commercial 3D-MEMS OCSes
  whose circuits are re-planned during the iteration from the measured demand
  (:func:`topoopt.topology.circuits.ocs_circuits`); 10 ms to reconfigure (§5.1), with
  host-based forwarding (OCS-reconfig-FW, the one of Figure 11) or without
  (OCS-reconfig-noFW, Figure 17).
- **SiP-ML** (:func:`sip_ml`, App. F): ``d`` wavelengths of ``B`` per server on a
  SiP-Ring (:func:`topoopt.topology.circuits.sip_ring_circuits`), 25 us to
  reconfigure, no forwarding, one job per cluster.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from topoopt.errors import ConfigError
from topoopt.fabrics.direct import direct_connect
from topoopt.fabrics.fabric import Fabric
from topoopt.topology.circuits import circuit_topology, ocs_circuits

__all__ = ["Reconfiguration", "SCHEMES", "IDLE", "ocs_reconfig", "sip_ml", "reconfiguration_of",
           "OCS_LATENCY", "SIP_LATENCY"]

#: How circuits are chosen: OCS-reconfig's demand heuristic, or SiP-ML's SiP-Ring.
SCHEMES = ("ocs", "sip-ring")
#: What idle ports do at a re-plan: keep the circuits in place, or be wired anew at random.
IDLE = ("keep", "rewire")
#: Reconfiguration latency of a commercial 3D-MEMS OCS (TopoOpt §5.1).
OCS_LATENCY = 10e-3
#: Reconfiguration latency of SiP-ML's silicon-photonic switches (TopoOpt §5.1).
SIP_LATENCY = 25e-6
#: Measurement interval over reconfiguration latency when none is given: 50 ms for the
#: 10 ms OCS of §5.1, and the authors' simulator's schedule (live 4 x L, reconfigure L).
INTERVAL_PER_LATENCY = 5.0


@dataclass(frozen=True)
class Reconfiguration:
    """How a fabric changes its circuits during an iteration.

    Every ``interval`` seconds the fabric measures the demand -- the bytes that the
    flows in transmission still have to send, per server pair -- and re-plans its
    circuits for it (``scheme``). The circuits that change carry nothing for
    ``latency`` seconds; the others keep carrying traffic (the authors' simulator pauses
    the whole network instead, and re-plans every ``5 x latency`` whether the demand
    changed or not).

    Attributes
    ----------
    scheme : str
        ``"ocs"`` (OCS-reconfig) or ``"sip-ring"`` (SiP-ML), see :data:`SCHEMES`.
    latency : float
        Seconds a changed circuit is down (10 ms: 3D-MEMS OCS; 25 us: SiP-ML).
    interval : float, optional
        Seconds between demand measurements; None = ``5 x latency`` (50 ms for the OCS).
        Must exceed ``latency``.
    forwarding : bool
        Host-based forwarding over the current circuits (FW) or direct circuits only.
    ports : int
        d, circuits per server (OCS ports, or SiP-ML wavelengths).
    port_bandwidth : float
        B, bits/s per circuit.
    iterations, warmup : int
        Iterations simulated back to back, and how many of the first are not measured
        (they start from the fabric's initial circuits, not from where the previous
        iteration left them).
    seed : int
        Seed of the idle-port wiring.
    idle : str
        Ports (wavelengths) the demand does not need: ``"keep"`` their circuits (a
        re-plan changes only what the demand asks for, and nothing when none is
        measured), or ``"rewire"`` them at random at every measurement, demand or not,
        as the authors' simulator does (the paper's OCS-reconfig, whose circuits the
        instantaneous demand leaves wrong for the traffic that comes next, §5.3).
    """

    scheme: str
    latency: float
    interval: float | None
    forwarding: bool
    ports: int
    port_bandwidth: float
    iterations: int = 2
    warmup: int = 1
    seed: int = 0
    idle: str = "keep"

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ConfigError("reconfig.scheme", self.scheme, f"use one of {', '.join(SCHEMES)}")
        if self.idle not in IDLE:
            raise ConfigError("reconfig.idle", self.idle, f"use one of {', '.join(IDLE)}")
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ConfigError("reconfig.latency", self.latency, "must be >= 0 seconds")
        every = self.every
        if not (math.isfinite(every) and every > 0):
            raise ConfigError("reconfig.interval", self.interval,
                              "must be > 0 seconds (give one when the latency is 0)")
        if every <= self.latency:
            raise ConfigError("reconfig.interval", every,
                              f"must exceed the reconfiguration latency ({self.latency} s)")
        for name, low in (("iterations", 1), ("warmup", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"reconfig.{name}", value, f"must be an integer >= {low}")
        if self.warmup >= self.iterations:
            raise ConfigError("reconfig.warmup", self.warmup,
                              f"must be below reconfig.iterations ({self.iterations})")

    @property
    def every(self) -> float:
        """Seconds between two demand measurements."""
        return self.interval if self.interval is not None \
            else INTERVAL_PER_LATENCY * self.latency

    def with_latency(self, latency: float, interval: float | None = None) -> "Reconfiguration":
        """The same fabric with another reconfiguration latency (and interval)."""
        return dataclasses.replace(self, latency=float(latency), interval=interval)


def _reconfigurable(fabric: Fabric, spec: Reconfiguration) -> Fabric:
    return dataclasses.replace(fabric, info={**fabric.info, "reconfig": spec}, _cache={})


def ocs_reconfig(servers: int, ports: int, link_bandwidth: float, link_latency: float = 1e-6,
                 *, latency: float = OCS_LATENCY, interval: float | None = None,
                 forwarding: bool = True, idle: str = "keep", seed: int = 0,
                 name: str | None = None) -> Fabric:
    """OCS-reconfig (TopoOpt §5.1): d OCS ports of B per server, circuits re-planned from
    the measured demand every ``interval`` (default 5 x latency = 50 ms), ``latency``
    (10 ms) per change, with or without host-based forwarding.

    The returned fabric holds the circuits at the start (no demand yet: idle ports wired
    at random, strongly connected) and is priced as a TopoOpt shard on OCSes.

    Examples
    --------
    >>> f = ocs_reconfig(8, 2, 100e9)
    >>> f.name, f.optics, reconfiguration_of(f).every
    ('ocs-reconfig', 'ocs', 0.05)
    """
    counts = ocs_circuits(np.zeros((servers, servers)), ports, seed=seed)
    topo = circuit_topology(counts, ports, link_bandwidth, link_latency, "ocs-reconfig")
    fabric = direct_connect(topo, None, optics="ocs",
                            name=name or ("ocs-reconfig" if forwarding else "ocs-reconfig-nofw"))
    return _reconfigurable(fabric, Reconfiguration("ocs", float(latency), interval, forwarding,
                                                   ports, float(link_bandwidth), seed=seed,
                                                   idle=idle))


def sip_ml(servers: int, wavelengths: int, link_bandwidth: float, link_latency: float = 1e-6,
           *, latency: float = SIP_LATENCY, interval: float | None = None,
           name: str = "sipml") -> Fabric:
    """SiP-ML (TopoOpt §5.1, App. F): d wavelengths of B per server on a SiP-Ring, 25 us per
    reconfiguration, no host forwarding, a single job.

    At the start every wavelength joins neighbours (``i -> i+1``: the ring AllReduce's
    circuits); the fabric is priced by its SiP-ML wavelengths (``optics = "sip"``).

    Examples
    --------
    >>> f = sip_ml(8, 2, 100e9)
    >>> f.optics, reconfiguration_of(f).forwarding, reconfiguration_of(f).every
    ('sip', False, 0.000125)
    """
    counts = np.zeros((servers, servers), np.int64)
    if servers >= 2:
        counts[np.arange(servers), (np.arange(servers) + 1) % servers] = wavelengths
    topo = circuit_topology(counts, wavelengths, link_bandwidth, link_latency, "sip-ring")
    fabric = direct_connect(topo, None, optics="sip", name=name)
    return _reconfigurable(fabric, Reconfiguration("sip-ring", float(latency), interval, False,
                                                   wavelengths, float(link_bandwidth)))


def reconfiguration_of(fabric: Fabric) -> Reconfiguration | None:
    """The fabric's :class:`Reconfiguration`, or None for a static fabric."""
    spec = fabric.info.get("reconfig")
    return spec if isinstance(spec, Reconfiguration) else None
