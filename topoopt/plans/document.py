"""An operator-strategy plan: the :class:`Plan` and :class:`FabricResult` types and their
``plan.json`` document (:func:`plan_to_json`).

The planner (:func:`topoopt.plan`, :mod:`topoopt.planners.planner`) makes a
:class:`Plan`; :func:`plan_to_json` gives its document (schema in README), and
:func:`check_plan_document` (:mod:`topoopt.plans.check`) re-validates one. The fields
every plan has are written, read and checked by :mod:`topoopt.plans.common`; an LLM
job's plan is :class:`topoopt.plans.llm.LLMPlan`; both offer
:class:`topoopt.plans.interface.PlanLike`. The plan folder with its exports is written
and checked by :mod:`topoopt.export.plan_dir`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from topoopt.cluster import Cluster, Job
from topoopt.llm import LLMParallel
from topoopt.model import Model
from topoopt.plans.check import PLAN_KEYS, check_plan_document, strategy_of
from topoopt.plans.common import (
    FOLDER_KEYS,
    FORMAT,
    cluster_job_of,
    cluster_json,
    job_json,
    read_plan,
    rings_of,
    routes_of,
    topology_of,
    topology_plan_json,
)
from topoopt.routing.metrics import topology_metrics
from topoopt.strategy import Strategy
from topoopt.traffic import derive_traffic

# the readers (common), strategy_of and the checker (check) are re-exported: callers import
# them from here
__all__ = ["FORMAT", "BASELINES", "FabricResult", "Plan", "plan_to_json", "read_plan",
           "check_plan_document", "topology_of", "rings_of", "routes_of", "strategy_of",
           "cluster_job_of", "PLAN_KEYS", "FOLDER_KEYS", "topology_plan_json"]

#: Baseline fabrics compared with the TopoOpt shard (names of topoopt.fabrics.catalog).
BASELINES = ("ideal", "fattree", "oversub", "expander")


@dataclass(frozen=True)
class FabricResult:
    """One fabric's best strategy, predicted iteration and cost.

    Attributes
    ----------
    name, title : str
    strategy : Strategy
    estimate : IterationEstimate
    cost : CostReport
    start_time : float
        The start strategy's iteration time on this fabric.
    moves : int
        MCMC moves spent on it.
    search : FabricSearch, optional
        The baseline's search (starts, chains and their curves, why it stopped); the
        TopoOpt shard's is the plan's ``search``.
    adopted_from : str
        The fabric whose best strategy was faster here than this fabric's own ("" if
        none; see :mod:`topoopt.planners.planner`, cross-seeding).
    """

    name: str
    title: str
    strategy: Any
    estimate: Any
    cost: Any
    start_time: float
    moves: int
    search: Any = None
    adopted_from: str = ""


@dataclass(frozen=True)
class Plan:
    """A plan: the TopoOpt shard's strategy, topology, rings, routes; every fabric's result.

    Attributes
    ----------
    cluster, job : Cluster, Job
    model : workloads.Model
    topology_plan : TopologyPlan
        Topology with ports, rings per AllReduce group and routes.
    fabrics : tuple of FabricResult
        ``topoopt`` first, then the baselines.
    search : AlternatingResult
        History of the alternating optimization.
    seed, budget, rounds, chains : int
    source : str
        Where the config came from (for reports).
    tolerance : float
        The chains' agreement that ended a search early.
    fabric_seed : int
        The seed of the Expander's random graph and of TopologyFinder's tie-breaks.
    references : Mapping
        Per fabric, the iteration time of the strategies people compare a plan with
        (``"data parallel"``, ``"hybrid"``, where they are valid; on TopoOpt each on
        the TopologyFinder topology for its own traffic).
    """

    cluster: Cluster
    job: Job
    model: Model
    topology_plan: Any
    fabrics: tuple[FabricResult, ...]
    search: Any
    seed: int
    budget: int
    rounds: int
    chains: int
    source: str = ""
    tolerance: float = 0.01
    references: Mapping = field(default_factory=dict)
    fabric_seed: int = 0

    @property
    def strategy(self) -> Strategy:
        """The TopoOpt shard's strategy."""
        return self.fabric("topoopt").strategy

    @property
    def iteration_time_s(self) -> dict[str, float]:
        """Predicted seconds per iteration on every fabric (``plan.json``'s key)."""
        return {f.name: f.estimate.total for f in self.fabrics}

    @property
    def costs(self) -> dict[str, float]:
        """Interconnect cost of every fabric, relative units (``plan.json``'s ``cost``)."""
        return {f.name: f.cost.total for f in self.fabrics}

    @property
    def llm_parallel(self) -> LLMParallel | None:
        """None: an operator strategy, so no LLM communicators to export."""
        return None

    def fabric(self, name: str) -> FabricResult:
        """The result of the fabric called ``name``."""
        for f in self.fabrics:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict:
        """The ``plan.json`` document (:func:`plan_to_json`)."""
        return plan_to_json(self)

    @staticmethod
    def check_document(doc: dict) -> None:
        """Raise :class:`~topoopt.errors.PlanCheckError` naming the first violated
        invariant of an operator-strategy plan's document (:func:`check_plan_document`)."""
        check_plan_document(doc)

    def check(self) -> None:
        """Check this plan's document as ``topoopt plan --check`` would."""
        self.check_document(self.to_json())

    def traffic_heatmaps(self) -> dict[str, tuple[np.ndarray, str]]:
        """Bytes per server pair per iteration, ``before`` (the start strategy, one ring
        per AllReduce group in member order) and ``after`` (the planned strategy over the
        planned rings), each with its title (TopoOpt Figures 8 and 9)."""
        c, job, model = self.cluster, self.job, self.model
        batch = job.global_batch(c)
        before = derive_traffic(model, self.search.start, c.servers, batch, job.dtype_bytes)
        after = derive_traffic(model, self.strategy, c.servers, batch, job.dtype_bytes)
        title = f"{model.name} on {c.servers} servers: "
        return {"before": (before.matrix(None),
                           title + f"start ({self.search.start.name}), one ring"),
                "after": (after.matrix(self.topology_plan.rings),
                          title + "planned, TopoOpt rings")}



# ----------------------------------------------------------------------------- JSON
def _chains_json(chains) -> list[dict]:
    return [{"seed": c.seed, "start_time_s": c.start_time, "best_time_s": c.best_time,
             "moves": c.moves, "accepted": c.accepted, "curve_s": list(c.trace),
             "improved_by": dict(c.improved_by)} for c in chains]


def _timed_json(rows, bounds) -> list[dict]:
    """``(name, seconds)`` rows as JSON, ``lower_bound`` true where the seconds are only
    a lower bound of the strategy's time (those ``bounds`` names)."""
    return [{"strategy": n, "time_s": t, "lower_bound": n in bounds} for n, t in rows]


def _search_json(fs) -> dict:
    """A :class:`~topoopt.planners.search.FabricSearch` as JSON."""
    return {"stop": fs.stop, "spread": fs.spread, "moves": fs.moves,
            "evaluations": fs.evaluations,
            "starts": _timed_json(fs.starts, fs.bounded),
            "chains": _chains_json(fs.chains)}



def plan_to_json(p: Plan) -> dict:
    """The ``plan.json`` document (schema: README, "plan.json").

    Deterministic: the same inputs and seed give the same document, so no wall times.
    """
    tp = p.topology_plan
    topo = tp.topology
    shard = topology_plan_json(tp)
    traffic = derive_traffic(p.model, p.strategy, p.cluster.servers,
                             p.job.global_batch(p.cluster), p.job.dtype_bytes)
    metrics = topology_metrics(topo, traffic, tp.rings, tp.routes)
    return {
        "format": FORMAT,
        "config": p.source,
        "cluster": cluster_json(p.cluster),
        "job": job_json(p.job, p.cluster),
        "strategy": p.strategy.to_json(p.model),
        "topology": shard["topology"],
        "metrics": {"diameter": metrics.diameter,
                    "average_path_length": metrics.average_path_length,
                    "bandwidth_tax": metrics.bandwidth_tax, "mp_hops": metrics.mp_hops,
                    "max_link_load_bytes": metrics.max_link_load},
        "rings": shard["rings"],
        "routes": shard["routes"],
        "iteration_time_s": p.iteration_time_s,
        "gap_to_ideal": ({f.name: f.estimate.total / p.iteration_time_s["ideal"]
                          for f in p.fabrics} if "ideal" in p.iteration_time_s else {}),
        "reference_time_s": {k: dict(v) for k, v in p.references.items()},
        "breakdown": {f.name: {k: getattr(f.estimate, k) for k in
                               ("compute", "mp", "allreduce", "exposed_communication",
                                "mp_bytes", "allreduce_bytes")} for f in p.fabrics},
        "cost": {f.name: f.cost.total for f in p.fabrics},
        "fabrics": {f.name: {"title": f.title, "start_time_s": f.start_time,
                             "moves": f.moves, "adopted_from": f.adopted_from,
                             "strategy": f.strategy.to_json(p.model),
                             "search": _search_json(f.search)}
                    for f in p.fabrics if f.name != "topoopt"},
        "search": {"seed": p.seed, "budget": p.budget, "rounds": p.rounds,
                   "chains": p.chains, "tolerance": p.tolerance, "fabric_seed": p.fabric_seed,
                   "start_strategy": p.search.start.name,
                   "start_time_s": p.search.start_time, "first_round_from": p.search.origin,
                   "best_time_s": p.search.time,
                   "adopted_from": p.fabric("topoopt").adopted_from,
                   "moves": p.search.moves, "interrupted": p.search.interrupted,
                   "screened": _timed_json(p.search.screened, p.search.screened_bounds),
                   "history": [{**r.to_json(), **_search_json(fs)}
                               for r, fs in zip(p.search.history, p.search.searches)]},
    }

