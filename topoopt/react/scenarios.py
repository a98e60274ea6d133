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
  ``capacity`` bits/s (gray failures, §7.3.4).
* ``none``: no congestion (the p = 0 overhead).

Fabrics: ``star`` (one switch; the job and 8 more servers), ``fattree`` (3-layer k = 8
Fat-tree of 128 servers, job placed at random, 4-port ECMP) and ``plan:DIR`` (the
direct-connect topology of ``DIR/plan.json``: ``topology`` with ``servers``, ``ports``,
``links`` ``[[server_a, port_a, server_b, port_b], ...]``, ``link_bandwidth``,
``link_latency``; and ``rings``, a list of server orders or of ``{"order": [...],
"members": [...]}``; only the rings of the largest group are used, since a plan also
lists rings of AllReduce groups that span part of the shard).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from topoopt._require import require_choice, require_int, require_positive
from topoopt.collectives import build_pattern, multi_ring_allreduce
from topoopt.collectives.ten import Pattern
from topoopt.errors import ConfigError
from topoopt.fabrics import direct_connect, fat_tree, star
from topoopt.fabrics.fabric import Fabric
from topoopt.react.flowsim import BackgroundFlows, SimulatedExecutor
from topoopt.react.jobs import overlap_placement, run_jobs
from topoopt.react.loop import ReactParams, run_react
from topoopt.topology.topology import Topology

__all__ = ["Scenario", "ScenarioResult", "KINDS", "COLLECTIVES", "run_scenario",
           "compare_runs", "scenario_setup", "load_plan", "scenario_fabric", "run_two_jobs",
           "summarize"]

KINDS = ("external", "spine", "failures", "none")
COLLECTIVES = ("tree", "ring", "rd-allgather", "plan")


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
        ECMP connections per flow.
    seed : int
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

    def __post_init__(self) -> None:
        require_choice("collective", self.collective, COLLECTIVES)
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
def load_plan(directory: str | Path) -> tuple[Topology, list[list[int]]]:
    """Topology and rings of ``DIR/plan.json`` (see the module docstring for the keys)."""
    path = Path(directory) / "plan.json"
    try:
        doc = json.loads(path.read_text())
        t = doc["topology"]
        topo = Topology(int(t["servers"]), int(t["ports"]),
                        tuple(tuple(int(x) for x in link) for link in t["links"]),
                        float(t["link_bandwidth"]), float(t.get("link_latency", 1e-6)))
        rings = [list(r["order"]) if isinstance(r, dict) else list(r) for r in doc["rings"]]
        # A plan lists the rings of every AllReduce group; the runtime's collective is
        # the group over the most servers (the rings of one group share its members).
        if rings:
            widest = max(len(set(r)) for r in rings)
            rings = [r for r in rings if len(set(r)) == widest]
            rings = [r for r in rings if set(r) == set(rings[0])]
    except FileNotFoundError:
        raise ConfigError("fabric", f"plan:{directory}", f"{path} does not exist") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError("fabric", f"plan:{directory}",
                          f"plan.json needs topology.links and rings ({exc!r})") from None
    if not rings:
        raise ConfigError("fabric", f"plan:{directory}", "plan.json has no rings")
    return topo, rings


def scenario_fabric(spec: str, nodes: int, bandwidth: float = 100e9, latency: float = 1e-6):
    """``(fabric, rings or None)`` for ``star``, ``fattree`` or ``plan:DIR``."""
    if spec == "star":
        return star(nodes + 8, bandwidth, latency), None
    if spec == "fattree":
        k = 8
        while k ** 3 // 4 < 2 * nodes:
            k += 2
        return fat_tree(k ** 3 // 4, bandwidth, latency, k=k), None
    if spec.startswith("plan:"):
        topo, rings = load_plan(spec[5:])
        if topo.servers != nodes:
            raise ConfigError("nodes", nodes, f"the plan has {topo.servers} servers")
        return direct_connect(topo, optics="none", name="plan"), rings
    raise ConfigError("fabric", spec, "use star, fattree or plan:DIR")


# ------------------------------------------------------------------------- set-up
def scenario_setup(sc: Scenario, rings: Sequence[Sequence[int]] | None = None,
                   fabric: Fabric | None = None):
    """Fabric, placement, background flows and initial pattern of a scenario.

    ``rings``/``fabric`` override the plan read from ``plan:DIR`` (for in-memory plans).
    """
    if fabric is None:
        fabric, plan_rings = scenario_fabric(sc.fabric, sc.nodes, sc.bandwidth, sc.latency)
        rings = rings if rings is not None else plan_rings
    rng = np.random.default_rng([sc.seed, 2024])
    n, servers = sc.nodes, fabric.servers
    if sc.fabric == "fattree":
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
            background.append(BackgroundFlows(int(placement[s]), int(rng.choice(pool)), sc.p))
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
    if sc.collective == "plan":
        if rings is None:
            raise ConfigError("collective", "plan", "needs --fabric plan:DIR (a plan's rings)")
        if sorted(set(rings[0])) != list(range(n)):
            raise ConfigError("collective", "plan",
                              f"the plan's widest AllReduce group is servers "
                              f"{sorted(set(rings[0]))}, not all {n}; use --collective tree "
                              "or ring on the plan's topology")
        pattern = multi_ring_allreduce(rings, sc.size)
    else:
        pattern = build_pattern(sc.collective, n, sc.size)
    return fabric, placement, background, pattern


def run_scenario(sc: Scenario, params: ReactParams = ReactParams(),
                 rings: Sequence[Sequence[int]] | None = None, fabric: Fabric | None = None,
                 progress: Callable[[str, int], None] | None = None) -> ScenarioResult:
    """Run a scenario without and with REACT (identical executors) and compare.

    ``progress(stage, epochs_done)`` is called after every batch of epochs, with
    stage ``"without REACT"`` or ``"with REACT"``.
    """
    fabric, placement, background, pattern = scenario_setup(sc, rings, fabric)
    return compare_runs(sc, pattern, lambda: SimulatedExecutor(fabric, placement, background,
                                                               sc.ports, sc.seed),
                        params, progress)


def compare_runs(sc: Scenario, pattern: Pattern, make_executor: Callable[[], object],
                 params: ReactParams = ReactParams(),
                 progress: Callable[[str, int], None] | None = None) -> ScenarioResult:
    """``sc.epochs`` epochs of ``pattern`` without, then with REACT, each on a fresh
    executor from ``make_executor`` (same seeds, so the same draws)."""
    runs = []
    for stage, enabled in (("without REACT", False), ("with REACT", True)):
        report = (lambda done, s=stage: progress(s, done)) if progress else None
        runs.append(run_react(make_executor(), pattern, sc.epochs, params, enabled, report))
    base, tuned = runs
    return ScenarioResult(sc, base.epoch_time, tuned.epoch_time, tuned.changes,
                          tuned.converged_epoch, tuned.positions_skipped)


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
