"""One real-runtime experiment: a collective on N local ranks, without and with REACT.

The collective runs in a tight loop, optionally with one rank's traffic slowed (REACT
§7.1-§7.2 on one machine).

:func:`run_runtime` launches the ranks (:mod:`.launch`), on 127.0.0.1 or -- with a slowed
rank -- in the network-namespace testbed (:mod:`.netem`); each rank runs ``epochs``
epochs with the fixed pattern (baseline) and then ``epochs`` epochs with RTuner on, on
the same process group and under the same congestion, checking every epoch's result.
Rank 0 turns the ranks' clock readings into per-epoch collective times and, from the
epochs each run spent on its final pattern (after the warm-up), the critical path: how
much of it is spent in flows of the slowed rank shows whether REACT moved that rank off
the critical path.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from topoopt._require import require_choice, require_int, require_positive
from topoopt.collectives import (
    build_pattern,
    multi_ring_allreduce,
    pattern_to_json,
    ring_allreduce,
)
from topoopt.collectives.ten import Pattern
from topoopt.errors import ConfigError
from topoopt.fabrics import star
from topoopt.react.critical import critical_paths
from topoopt.react.execution import BatchResult
from topoopt.react.flowsim import BackgroundFlows, SimulatedExecutor
from topoopt.react.loop import ReactParams, run_react
from topoopt.react.runtime.launch import LaunchOptions, launch
from topoopt.react.runtime.netem import NetnsTestbed, netns_supported
from topoopt.react.runtime.tuner import assemble_batch

__all__ = ["RunSpec", "SlowRank", "RuntimeResult", "run_runtime", "make_pattern",
           "critical_share", "FluidPrediction", "fluid_prediction", "fluid_pattern_run",
           "COLLECTIVES"]

#: Patterns :func:`make_pattern` builds.
COLLECTIVES = ("tree", "ring", "rd-allgather", "multi-ring")


@dataclass(frozen=True)
class RunSpec:
    """What to run.

    Attributes
    ----------
    collective : str
        ``tree`` (NCCL double binary tree AllReduce), ``ring`` (on ``rings[0]`` or
        0..n-1), ``multi-ring`` (one ring per entry of ``rings``, e.g. a TopoOpt plan's)
        or ``rd-allgather``.
    nprocs : int
    size : float
        Bytes of the collective (AllGather: of the gathered output); float32 elements.
    epochs : int
        Epochs per run (baseline and REACT each).
    warmup : int
        Epochs left out of the means.
    rings : tuple of tuple of int, optional
    params : ReactParams
    slack : int
        Epochs the old pattern keeps running while the leader decides (§6.3).
    baseline, react : bool
        Which runs to do.
    decision_timeout, control_timeout : float
        RTuner's waits (see :class:`~topoopt.react.runtime.ReactCollective`).
    threads : bool, optional
        Per-chunk threads (default on gloo).
    """

    collective: str = "tree"
    nprocs: int = 8
    size: float = 20e6
    epochs: int = 100
    warmup: int = 25
    rings: tuple[tuple[int, ...], ...] | None = None
    params: ReactParams = field(default_factory=ReactParams)
    slack: int = 5
    baseline: bool = True
    react: bool = True
    decision_timeout: float = 10.0
    control_timeout: float = 30.0
    threads: bool | None = None

    def __post_init__(self) -> None:
        require_choice("collective", self.collective, COLLECTIVES)
        require_int("nprocs", self.nprocs, minimum=2)
        require_positive("size", self.size)
        require_int("epochs", self.epochs, minimum=1)
        require_int("warmup", self.warmup, minimum=0)
        require_int("slack", self.slack, minimum=0)
        if self.warmup >= self.epochs:
            raise ConfigError("warmup", self.warmup, f"must be below epochs ({self.epochs})")
        if not (self.baseline or self.react):
            raise ConfigError("runs", "none", "run the baseline, REACT or both")
        if self.collective == "multi-ring" and not self.rings:
            raise ConfigError("rings", self.rings, "multi-ring needs ring orders")


@dataclass(frozen=True)
class SlowRank:
    """Slow one rank's traffic on the testbed.

    Attributes
    ----------
    rank : int
    mode : str
        ``flows``: ``flows`` greedy external TCP flows into the rank (steady congestion
        on its downlink, REACT §7.2); ``rate``: its link shaped to ``rate`` bits/s both
        ways (a degraded link).
    flows : int
    rate : float
    """

    rank: int
    mode: str = "flows"
    flows: int = 2
    rate: float = 100e6

    def __post_init__(self) -> None:
        require_int("slow_rank", self.rank, minimum=0)
        require_choice("slow_mode", self.mode, ("flows", "rate"))
        require_int("flows", self.flows, minimum=1)
        require_positive("slow_rate", self.rate)


def make_pattern(spec: RunSpec) -> Pattern:
    """The initial pattern of ``spec`` (float32 elements)."""
    n = spec.nprocs
    if spec.collective == "multi-ring":
        return multi_ring_allreduce([list(r) for r in spec.rings or ()], spec.size)
    if spec.collective == "ring" and spec.rings:
        return ring_allreduce(list(spec.rings[0]), spec.size)
    return build_pattern(spec.collective, n, spec.size)


def critical_share(pattern: Pattern, fct: np.ndarray, rank: int, incoming: bool = True,
                   outgoing: bool = True) -> tuple[float, int, float]:
    """How much of the critical path (on mean FCTs) is in flows into/out of ``rank``.

    Returns
    -------
    share : float
        Those flows' FCTs on the critical path over the path's length.
    flows : int
        How many of the critical path's flows touch ``rank`` that way.
    seconds : float
        Their FCTs summed (the time the critical path spends at ``rank``).
    """
    w = np.asarray(fct, float).mean(axis=0)
    (path,), length = critical_paths(pattern, w)
    mask = np.zeros(len(path), bool)
    if incoming:
        mask |= pattern.dst[path] == rank
    if outgoing:
        mask |= pattern.src[path] == rank
    seconds = float(w[path[mask]].sum())
    return seconds / max(float(length[0]), 1e-15), int(mask.sum()), seconds


def _phase(rank: int, world: int, spec: RunSpec, pattern: Pattern, tune: bool) -> dict:
    """Run one phase on this rank; rank 0 returns the gathered summary."""
    import torch
    import torch.distributed as dist

    from topoopt.react.runtime.react_collective import ReactCollective

    rc = ReactCollective(pattern, tune=tune, params=spec.params, slack=spec.slack,
                         decision_timeout=spec.decision_timeout,
                         control_timeout=spec.control_timeout, threads=spec.threads)
    rc.keep_records = spec.epochs
    allgather = pattern.collective == "allgather"
    if allgather:
        sched = rc.rc.schedule(pattern)
        inp = torch.empty(sched.own_size)
        out = torch.empty(pattern.elements)
        expected = torch.empty(pattern.elements)
        owners = pattern.owners
        assert owners is not None                    # an AllGather pattern has them
        for j, (a, b) in enumerate(pattern.segments.tolist()):
            expected[a:b] = float(owners[j] + 1)
    else:
        buf = torch.empty(pattern.elements)
        total = float(world * (world + 1) // 2)
    wrong = 0
    for _ in range(spec.epochs):
        if allgather:
            inp.fill_(rank + 1)
            out.zero_()
            rc.all_gather_into_tensor(out, inp)
            wrong += not torch.equal(out, expected)
        else:
            buf.fill_(rank + 1)
            rc.all_reduce(buf)
            wrong += not bool((buf == total).all())
    rc.close()
    # every epoch after the warm-up that ran the final pattern (measured or slack)
    last = [r for e, (r, v) in enumerate(zip(rc.records, rc.versions))
            if v == rc.version and e >= spec.warmup] or rc.records[-1:]
    mine = {"begin": np.asarray(rc.begin), "end": np.asarray(rc.end), "wrong": wrong,
            "last": np.stack([r.to_array() for r in last])}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank != 0:
        return {"wrong": wrong}
    begin = np.stack([x["begin"] for x in everyone])
    end = np.stack([x["end"] for x in everyone])
    k = min(x["last"].shape[0] for x in everyone)
    batch = assemble_batch(np.stack([x["last"][-k:] for x in everyone]))
    return {"epoch_time": end.max(axis=0) - begin.min(axis=0),
            "wrong": [x["wrong"] for x in everyone],
            "changes": list(rc.changes), "dropped": list(rc.dropped),
            "final": pattern_to_json(rc.pattern), "fct": batch.fct,
            "final_pattern": rc.pattern,
            "leader_log": list(rc.tuner.log) if rc.tuner is not None else []}


def _worker(rank: int, world: int, spec: RunSpec) -> dict:
    """Body of each rank: baseline, then REACT, same group and conditions."""
    import torch.distributed as dist

    pattern = make_pattern(spec)
    out = {}
    for name, tune in (("baseline", False), ("react", True)):
        if getattr(spec, name):
            out[name] = _phase(rank, world, spec, pattern, tune)
            dist.barrier()
    return out


@dataclass(frozen=True)
class RuntimeResult:
    """Per-epoch collective times without and with REACT on the real runtime.

    ``baseline``/``react`` are None when that run was not asked for. ``share`` maps run
    -> :func:`critical_share` of the slowed rank, on the mean FCTs of the epochs that ran
    the run's final pattern after the warm-up.
    """

    spec: RunSpec
    baseline: np.ndarray | None
    react: np.ndarray | None
    changes: tuple
    dropped: tuple
    wrong_epochs: int
    slow: SlowRank | None
    network: str
    share: dict
    final: dict | None
    leader_log: tuple

    def mean(self, which: str) -> float:
        return float(getattr(self, which)[self.spec.warmup:].mean())

    def p95(self, which: str) -> float:
        return float(np.percentile(getattr(self, which)[self.spec.warmup:], 95))

    @property
    def improvement(self) -> float:
        """Relative gain in mean algorithm bandwidth: base/react - 1."""
        return self.mean("baseline") / self.mean("react") - 1.0

    @property
    def converged_epoch(self) -> int:
        """First epoch from which the pattern no longer changed (0 if it never did)."""
        return int(self.changes[-1][0]) if self.changes else 0

    def to_json(self) -> dict:
        s = self.spec
        spec = {k: v for k, v in asdict(s).items() if k != "params"}
        spec["params"] = asdict(s.params)
        out: dict[str, Any] = {
            "spec": spec, "network": self.network,
            "slow": None if self.slow is None else asdict(self.slow),
            "wrong_epochs": self.wrong_epochs,
            "changes": [{"epoch": e, "version": v, "swaps": list(sw), "revert": r}
                        for e, v, sw, r in self.changes],
            "dropped_batches": list(self.dropped),
            "critical_share": {k: list(v) for k, v in self.share.items()},
            "final_pattern": self.final, "leader_log": list(self.leader_log)}
        for which in ("baseline", "react"):
            t = getattr(self, which)
            if t is not None:
                out[which] = {"mean_s": self.mean(which), "p95_s": self.p95(which),
                              "algbw_Bps": s.size / self.mean(which),
                              "epoch_time_s": t.tolist()}
        if self.baseline is not None and self.react is not None:
            out["improvement"] = self.improvement
        return out


def run_runtime(spec: RunSpec, slow: SlowRank | None = None, *, network: str = "auto",
                link_rate: float = 1e9, timeout: float = 3600.0) -> RuntimeResult:
    """Launch ``spec.nprocs`` local ranks and run the experiment.

    Parameters
    ----------
    spec : RunSpec
    slow : SlowRank, optional
        Slow this rank's traffic (needs the network-namespace testbed).
    network : str
        ``loopback`` (127.0.0.1), ``netns`` (the testbed: every link shaped to
        ``link_rate``) or ``auto`` (netns when a rank is slowed).
    link_rate : float
        Bits/s of every rank link on the testbed.
    timeout : float
        Seconds for the whole launch (stragglers are killed).

    Returns
    -------
    RuntimeResult
    """
    require_choice("network", network, ("auto", "loopback", "netns"))
    if slow is not None and slow.rank >= spec.nprocs:
        raise ConfigError("slow_rank", slow.rank, f"must be a rank in 0..{spec.nprocs - 1}")
    if network == "auto":
        network = "netns" if slow is not None else "loopback"
    if slow is not None and network != "netns":
        raise ConfigError("network", network, "slowing a rank needs the netns testbed")
    op_timeout = max(60.0, spec.control_timeout, spec.decision_timeout) * 2
    if network == "loopback":
        results = launch(_worker, spec.nprocs, (spec,), timeout=timeout,
                         options=LaunchOptions(op_timeout=op_timeout))
    else:
        ok, why = netns_supported()
        if not ok:
            raise ConfigError("network", "netns", f"the namespace testbed is unavailable "
                              f"here ({why}); run without --slow-rank")
        with NetnsTestbed(spec.nprocs, link_rate) as tb:
            if slow is not None and slow.mode == "rate":
                tb.shape(slow.rank, slow.rate)
            if slow is not None and slow.mode == "flows":
                tb.external_flows(slow.rank, slow.flows)
            results = launch(_worker, spec.nprocs, (spec,), timeout=timeout,
                             options=tb.launch_options(op_timeout=op_timeout))
    r0 = results[0]
    wrong = sum(sum(r0[k]["wrong"]) for k in ("baseline", "react") if k in r0)
    share = {}
    if slow is not None:
        into = True
        out_too = slow.mode == "rate"
        for k in ("baseline", "react"):
            if k in r0:
                share[k] = critical_share(r0[k]["final_pattern"], r0[k]["fct"], slow.rank,
                                          incoming=into, outgoing=out_too)
    react = r0.get("react", {})
    return RuntimeResult(
        spec=spec, baseline=r0["baseline"]["epoch_time"] if "baseline" in r0 else None,
        react=react.get("epoch_time"),
        changes=tuple((e, v, tuple(sw), rev) for e, v, sw, rev in react.get("changes", ())),
        dropped=tuple(react.get("dropped", ())), wrong_epochs=int(wrong), slow=slow,
        network=network, share=share, final=react.get("final"),
        leader_log=tuple(react.get("leader_log", ())))


@dataclass(frozen=True)
class FluidPrediction:
    """What the flow-level (fluid) simulator predicts for a :func:`run_runtime` setting.

    ``baseline``/``react`` are per-epoch times (seconds of link time only: no
    software overhead), ``changes`` the swaps REACT made there.
    """

    baseline: np.ndarray
    react: np.ndarray
    changes: tuple
    warmup: int

    def mean(self, which: str) -> float:
        return float(getattr(self, which)[self.warmup:].mean())

    @property
    def improvement(self) -> float:
        """Relative gain in mean algorithm bandwidth: base/react - 1."""
        return self.mean("baseline") / self.mean("react") - 1.0


def fluid_prediction(spec: RunSpec, slow: SlowRank | None, link_rate: float,
                     latency: float = 20e-6, seed: int = 0) -> FluidPrediction:
    """The fluid model's run of the testbed setting of :func:`run_runtime`.

    The testbed is a star: one bridge, every rank link at ``link_rate`` both ways, and
    one outside host (the background senders' namespace). A ``flows`` slow rank gets
    ``slow.flows`` greedy flows from that host into it; a ``rate`` slow rank gets its
    links at ``slow.rate``. Each flow is one TCP connection (one path), and the same
    REACT parameters run without, then with the loop (as ``react simulate --backend
    flow`` does on its own fabrics).

    Parameters
    ----------
    spec : RunSpec
    slow : SlowRank, optional
    link_rate : float
        Bits/s of every rank link.
    latency : float
        Seconds per link (a veth and the bridge: tens of microseconds).
    seed : int

    Returns
    -------
    FluidPrediction

    References
    ----------
    REACT §7.1-§7.2 (external flows into one server of a single-switch cluster).
    """
    require_positive("link_rate", link_rate)
    executor = _testbed_executor(spec.nprocs, slow, link_rate, latency, seed)
    pattern = make_pattern(spec)
    runs = [run_react(executor(), pattern, spec.epochs, spec.params, enabled)
            for enabled in (False, True)]
    return FluidPrediction(runs[0].epoch_time, runs[1].epoch_time, runs[1].changes,
                           spec.warmup)


def _testbed_executor(n: int, slow: SlowRank | None, link_rate: float, latency: float,
                      seed: int):
    """A factory of fresh fluid executors of the testbed (see :func:`fluid_prediction`)."""
    bw = [float(link_rate)] * (n + 1)
    background = []
    if slow is not None and slow.mode == "rate":
        bw[slow.rank] = float(slow.rate)
    elif slow is not None:
        background = [BackgroundFlows(n, slow.rank, slow.flows)]
    fabric = star(n + 1, bw, latency)
    return lambda: SimulatedExecutor(fabric, list(range(n)), background, 1, seed)


def fluid_pattern_run(pattern: Pattern, slow: SlowRank | None, link_rate: float,
                      epochs: int = 1, latency: float = 20e-6, seed: int = 0) -> BatchResult:
    """``epochs`` epochs of a fixed ``pattern`` on the fluid model of the testbed.

    The same network as :func:`fluid_prediction` (a star of ``pattern.ranks`` ranks and one
    outside host, ``slow``'s congestion), without REACT: to rate a pattern the real
    runtime ended on against the initial one on a model independent of wall clocks.

    Parameters
    ----------
    pattern : Pattern
    slow : SlowRank, optional
    link_rate : float
        Bits/s of every rank link.
    epochs : int
    latency : float
        Seconds per link.
    seed : int

    Returns
    -------
    BatchResult
        Per epoch and flow: start, finish (and FCT), and the epoch times.

    References
    ----------
    REACT §7.1-§7.2 (external flows into one server of a single-switch cluster).
    """
    require_positive("link_rate", link_rate)
    require_int("epochs", epochs, minimum=1)
    if slow is not None and slow.rank >= pattern.ranks:
        raise ConfigError("slow_rank", slow.rank, f"must be a rank in 0..{pattern.ranks - 1}")
    return _testbed_executor(pattern.ranks, slow, link_rate, latency, seed)().run(pattern, epochs)
