"""REACT with several jobs on one network (REACT §7.3.3, Figs. 6 and 7).

Two settings of two jobs, 8 ranks each, 20 MB collectives, 100 epochs measured after
epoch 25 (REACT §7.3):

* ``overlap`` (Fig. 6): both jobs on one star (a single switch), ``overlap`` servers
  shared (drawn at random from the seed): job 1 runs NCCL's double binary tree, job 2
  ring AllReduce; a shared server's NIC carries both jobs' flows.
* ``network`` (Fig. 7): no shared server, only the network: the Alibaba-like two-tier
  Clos of REACT §7.1 (48 ToRs x 3 aggregation switches, 15 servers a ToR, 720
  servers, :func:`~topoopt.fabrics.leaf_spine`; 100 Gb/s links, so a ToR is 5:1
  oversubscribed). The two jobs sit on the same ``tors`` racks (drawn at random), each
  with ``8 / tors`` servers per rack, ranks in random order -- as a scheduler that packs
  racks but does not order ranks would place them -- so the flows between racks meet
  on the ToR-spine links ("Spine-ToR congestion"). Fig. 7a: ring + ring; 7b:
  recursive-doubling AllGather + ring.

Each job's leader runs in one of the modes of :data:`MODES`: ``off`` (the pattern as
built), ``react`` (REACT's loop, :func:`~topoopt.react.loop.leader_step`, its own seed)
or ``coop`` (the cooperative rules of :mod:`topoopt.react.cooperative`). Both jobs run
epoch by epoch on one :class:`~topoopt.react.flowsim.JobsExecutor` (same ECMP draws in
every mode), and each leader sees only its own flows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from topoopt._require import require_choice, require_int, require_positive
from topoopt.collectives import build_pattern
from topoopt.collectives.ten import Pattern
from topoopt.errors import ConfigError
from topoopt.executor import make_executor
from topoopt.fabrics import leaf_spine, star
from topoopt.fabrics.fabric import Fabric
from topoopt.react.cooperative import CoopParams, coop_init, coop_step
from topoopt.react.flowsim import JobsExecutor
from topoopt.react.loop import ReactParams, leader_init, leader_step

__all__ = ["MODES", "SETTINGS", "TwoJobScenario", "JobsRun", "TwoJobResult", "run_jobs",
           "two_job_setup", "run_two_job_scenario", "overlap_placement", "figure6_grid",
           "figure7_grid", "run_two_job_sweep", "two_job_table"]

MODES = ("off", "react", "coop")
SETTINGS = ("overlap", "network")
#: Fig. 7's Alibaba-like Clos (REACT §7.1): ToRs, aggregation switches, servers a ToR.
ALIBABA = (48, 3, 15)


@dataclass(frozen=True)
class TwoJobScenario:
    """Two jobs sharing servers or the network (defaults: REACT Fig. 6 at overlap 0).

    Attributes
    ----------
    setting : str
        ``overlap`` (star, shared servers) or ``network`` (Alibaba-like Clos).
    collectives : (str, str)
        Job 1's and job 2's (``tree``, ``ring``, ``rd-allgather``).
    nodes : int
        Ranks per job.
    overlap : int
        Shared servers (``overlap`` setting).
    tors : int
        Racks both jobs share (``network`` setting); must divide ``nodes``.
    size : float
        Bytes per collective.
    epochs, warmup : int
    bandwidth, latency : float
    ports : int
        ECMP connections per flow (one drawn per epoch, REACT §7.3).
    seed : int
    """

    setting: str = "overlap"
    collectives: tuple[str, str] = ("tree", "ring")
    nodes: int = 8
    overlap: int = 0
    tors: int = 2
    size: float = 20e6
    epochs: int = 100
    warmup: int = 25
    bandwidth: float = 100e9
    latency: float = 1e-6
    ports: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        require_choice("setting", self.setting, SETTINGS)
        object.__setattr__(self, "collectives", tuple(self.collectives))
        if len(self.collectives) != 2:
            raise ConfigError("collectives", self.collectives, "give one per job (two)")
        for c in self.collectives:
            require_choice("collectives", c, ("tree", "ring", "rd-allgather"))
        require_int("nodes", self.nodes, minimum=2)
        require_int("overlap", self.overlap, minimum=0, maximum=self.nodes)
        require_int("tors", self.tors, minimum=1)
        require_int("epochs", self.epochs, minimum=1)
        require_int("warmup", self.warmup, minimum=0, maximum=self.epochs - 1)
        require_int("seed", self.seed, minimum=0)
        require_positive("size", self.size)
        require_positive("bandwidth", self.bandwidth)
        if self.setting == "network" and (self.nodes % self.tors
                                          or 2 * self.nodes // self.tors > ALIBABA[2]):
            raise ConfigError("tors", self.tors, f"must divide nodes ({self.nodes}) with "
                              f"both jobs' servers fitting in a rack of {ALIBABA[2]}")


@dataclass(frozen=True)
class JobsRun:
    """Per-epoch times of every job in one run, and what their leaders did.

    Attributes
    ----------
    modes : tuple of str
    epoch_time : tuple of ndarray
        Per job, shape (epochs,).
    changes : tuple of tuple
        Per job, ``(epoch, swaps, reverted)`` whenever its pattern changed.
    patterns : tuple of tuple of Pattern
        Per job, every pattern it ran (the first is the one built).
    """

    modes: tuple[str, ...]
    epoch_time: tuple[np.ndarray, ...]
    changes: tuple[tuple, ...]
    patterns: tuple[tuple[Pattern, ...], ...]

    def mean(self, job: int, warmup: int = 0) -> float:
        return float(self.epoch_time[job][warmup:].mean())


def run_jobs(fabric: Fabric, placements: Sequence[Sequence[int] | np.ndarray],
             patterns: Sequence[Pattern], modes: Sequence[str], epochs: int,
             params: ReactParams = ReactParams(), coop: CoopParams = CoopParams(),
             seed: int = 0, ports: int = 4,
             progress: Callable[[int], None] | None = None,
             executor: Callable[..., Any] = JobsExecutor) -> JobsRun:
    """Run several jobs' collectives together, each with its leader in its mode.

    Job ``j``'s leader draws from seed ``params.seed + j`` (REACT) or
    ``coop.seed + j`` (the cooperative rules), so the leaders are independent.
    Batches of ``params.batch`` epochs run with the current patterns; after each full
    batch every active leader decides its next pattern from its own FCTs.
    ``executor(fabric, placements, background, ports, seed)`` makes what runs the
    epochs: the flow-level :class:`~topoopt.react.flowsim.JobsExecutor`, or
    :class:`topoopt.react.packetsim.Ns3JobsExecutor` for ns-3.
    """
    for m in modes:
        require_choice("modes", m, MODES)
    if not (len(modes) == len(patterns) == len(placements)):
        raise ConfigError("modes", list(modes), "one mode, pattern and placement per job")
    require_int("epochs", epochs, minimum=1)
    ex = executor(fabric, placements, (), ports, seed)
    leaders: list[Any] = []          # per job: its LeaderState, CoopState or None (off)
    for j, (p, m) in enumerate(zip(patterns, modes)):
        mine = replace(params, seed=params.seed + j)
        if m == "react":
            leaders.append(leader_init(p, mine))
        elif m == "coop":
            leaders.append(coop_init(p, mine, replace(coop, seed=coop.seed + j)))
        else:
            leaders.append(None)
    current = list(patterns)
    seen: list[list[Pattern]] = [[p] for p in patterns]
    times: list[list[np.ndarray]] = [[] for _ in patterns]
    changes: list[list] = [[] for _ in patterns]
    done = 0
    while done < epochs:
        b = min(params.batch, epochs - done)
        results = ex.run_many(current, b)
        done += b
        for j, res in enumerate(results):
            times[j].append(res.epoch_time)
            if leaders[j] is None or b != params.batch or done >= epochs:
                continue
            step = leader_step if modes[j] == "react" else coop_step
            leaders[j], dec = step(leaders[j], res.fct, res.epoch_time)
            if dec.pattern.signature() != current[j].signature():
                changes[j].append((done, tuple(str(s) for s in dec.swaps), dec.reverted))
                seen[j].append(dec.pattern)
            current[j] = dec.pattern
        if progress is not None:
            progress(done)
    return JobsRun(tuple(modes), tuple(np.concatenate(t) for t in times),
                   tuple(tuple(c) for c in changes), tuple(tuple(s) for s in seen))


def overlap_placement(nodes: int, overlap: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Fig. 6's placement on a star of ``2 x nodes`` servers: job 1 on ``0..nodes-1``,
    job 2 on ``overlap`` of them (random) and ``nodes - overlap`` others, ranks shuffled."""
    rng = np.random.default_rng([seed, 6])
    job1 = np.arange(nodes)
    shared = rng.choice(nodes, overlap, replace=False)
    job2 = np.concatenate([shared, np.arange(nodes, 2 * nodes - overlap)])
    rng.shuffle(job2)
    return job1, job2


def _rack_placement(sc: TwoJobScenario) -> tuple[np.ndarray, np.ndarray]:
    tors, _, per = ALIBABA
    rng = np.random.default_rng([sc.seed, 7])
    racks = rng.choice(tors, sc.tors, replace=False)
    k = sc.nodes // sc.tors
    slots = np.stack([r * per + rng.choice(per, 2 * k, replace=False) for r in racks])
    job1, job2 = slots[:, :k].ravel(), slots[:, k:].ravel()
    return rng.permutation(job1), rng.permutation(job2)


def two_job_setup(sc: TwoJobScenario) -> tuple[Fabric, tuple[np.ndarray, np.ndarray],
                                               tuple[Pattern, ...]]:
    """Fabric, placements and initial patterns of a two-job scenario."""
    if sc.setting == "overlap":
        fabric = star(2 * sc.nodes, sc.bandwidth, sc.latency)
        placements = overlap_placement(sc.nodes, sc.overlap, sc.seed)
    else:
        fabric = leaf_spine(*ALIBABA, sc.bandwidth, sc.latency)
        placements = _rack_placement(sc)
    patterns = tuple(build_pattern(c, sc.nodes, sc.size) for c in sc.collectives)
    return fabric, placements, patterns


@dataclass(frozen=True)
class TwoJobResult:
    """A two-job scenario run in several combinations of modes.

    ``runs[modes]`` is the :class:`JobsRun` of that combination, e.g.
    ``runs[("react", "off")]``; ``("off", "off")`` is the baseline.
    """

    scenario: TwoJobScenario
    runs: dict

    def mean(self, modes: Sequence[str], job: int) -> float:
        return self.runs[tuple(modes)].mean(job, self.scenario.warmup)

    def improvement(self, modes: Sequence[str], job: int) -> float:
        """Gain in job ``job``'s mean algorithm bandwidth over the baseline:
        ``T_base / T - 1`` (epochs after the warm-up)."""
        return self.mean(("off", "off"), job) / self.mean(modes, job) - 1.0

    def to_json(self) -> dict:
        return {"scenario": asdict(self.scenario),
                "runs": [{"modes": list(k), "mean_s": [r.mean(j, self.scenario.warmup)
                                                       for j in range(2)],
                          "improvement": [self.improvement(k, j) for j in range(2)],
                          "changes": [len(c) for c in r.changes]}
                         for k, r in self.runs.items()]}


def run_two_job_scenario(sc: TwoJobScenario,
                         modes: Sequence[Sequence[str]] = (("react", "react"),),
                         params: ReactParams = ReactParams(), coop: CoopParams = CoopParams(),
                         executor: Callable[..., Any] = JobsExecutor) -> TwoJobResult:
    """The baseline and every combination of ``modes`` of a scenario (same ECMP draws;
    ``executor`` as in :func:`run_jobs`)."""
    fabric, placements, patterns = two_job_setup(sc)
    runs = {}
    for m in [("off", "off")] + [tuple(x) for x in modes if tuple(x) != ("off", "off")]:
        runs[m] = run_jobs(fabric, placements, patterns, m, sc.epochs, params, coop,
                           sc.seed, sc.ports, executor=executor)
    return TwoJobResult(sc, runs)


def figure6_grid(overlaps: Sequence[int] = (0, 1, 2, 3, 4), seeds: int = 5,
                 base: TwoJobScenario = TwoJobScenario()) -> list[TwoJobScenario]:
    """REACT Fig. 6: tree + ring on a star, each overlap with ``seeds`` random draws."""
    return [replace(base, setting="overlap", collectives=("tree", "ring"), overlap=k, seed=s)
            for k in overlaps for s in range(seeds)]


def figure7_grid(seeds: int = 5, base: TwoJobScenario = TwoJobScenario(setting="network")
                 ) -> list[TwoJobScenario]:
    """REACT Fig. 7: (a) ring + ring, (b) recursive doubling + ring, on the Alibaba-like
    Clos, ``seeds`` random placements each."""
    return [replace(base, setting="network", collectives=c, seed=s)
            for c in (("ring", "ring"), ("rd-allgather", "ring")) for s in range(seeds)]


def _run(task) -> TwoJobResult:
    sc, modes, params, coop = task
    return run_two_job_scenario(sc, modes, params, coop)


def run_two_job_sweep(scenarios: Sequence[TwoJobScenario], modes: Sequence[Sequence[str]],
                      params: ReactParams = ReactParams(), coop: CoopParams = CoopParams(),
                      workers: int = 1, ray: str | bool | None = None) -> list[TwoJobResult]:
    """:func:`run_two_job_scenario` for every scenario, through the project's executor
    (``workers`` local processes or Ray); results in scenario order."""
    modes = tuple(tuple(m) for m in modes)
    with make_executor(workers, ray) as ex:
        return ex.map(_run, [(sc, modes, params, coop) for sc in scenarios])


def two_job_table(results: Sequence[TwoJobResult], modes: Sequence[Sequence[str]]
                  ) -> list[dict]:
    """Rows of Figs. 6-7: per (collectives, overlap) the mean gain of each job in each
    combination of modes, over the seeds."""
    groups: dict[tuple, list[TwoJobResult]] = {}
    for r in results:
        s = r.scenario
        groups.setdefault((s.setting, s.collectives, s.overlap), []).append(r)
    rows = []
    for (setting, colls, overlap), rs in groups.items():
        for m in modes:
            gains = np.array([[r.improvement(tuple(m), j) for j in range(2)] for r in rs])
            rows.append({"setting": setting, "collectives": list(colls), "overlap": overlap,
                         "modes": list(m), "mean_improvement": gains.mean(axis=0).tolist(),
                         "min_improvement": gains.min(axis=0).tolist(), "runs": len(rs)})
    return rows
