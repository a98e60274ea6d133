"""A plan: the Plan and FabricResult types, the ``plan.json`` document (written,
read, checked), and the checks every field of it must pass.

The planner (:func:`topoopt.plan`, :mod:`topoopt.planners.planner`) makes a
:class:`Plan`; :func:`plan_to_json` gives its document (schema in README), and
:func:`check_plan_document` re-validates one. The plan folder with its exports is
written and checked by :mod:`topoopt.export.plan_dir`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from topoopt.cluster import Cluster, Job
from topoopt.config import parse_config
from topoopt.errors import PlanCheckError, TopoOptError
from topoopt.routing.metrics import topology_metrics
from topoopt.strategy import OpConfig, Strategy, check_strategy
from topoopt.topology.topology import Routes, Topology, check_ring, check_routes, check_topology
from topoopt.traffic import derive_traffic
from topoopt.workloads import model_of

__all__ = ["FORMAT", "BASELINES", "FabricResult", "Plan", "plan_to_json", "read_plan",
           "check_plan_document", "topology_of", "rings_of", "routes_of", "strategy_of",
           "cluster_job_of"]

FORMAT = "topoopt.plan/1"
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

    cluster: Any
    job: Any
    model: Any
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

    def fabric(self, name: str) -> FabricResult:
        """The result of the fabric called ``name``."""
        for f in self.fabrics:
            if f.name == name:
                return f
        raise KeyError(name)


# ----------------------------------------------------------------------------- JSON
def _cluster_json(c) -> dict:
    return {"servers": c.servers, "nics": c.nics, "link_bandwidth": c.link_bandwidth,
            "link_latency": c.link_latency, "gpus_per_server": c.gpus_per_server,
            "gpu": c.gpu.name, "intra_server_bandwidth": c.intra_server_bandwidth,
            "compute_efficiency": c.compute_efficiency,
            "memory_efficiency": c.memory_efficiency}


def _job_json(job: Job, cluster: Cluster) -> dict:
    out = {"model": job.model, "batch_per_gpu": job.batch_per_gpu, "precision": job.precision,
           "size": dict(job.size), "global_batch": job.global_batch(cluster)}
    if job.operators:
        out["operators"] = [dict(o) for o in job.operators]
    return out


def _chains_json(chains) -> list[dict]:
    return [{"seed": c.seed, "start_time_s": c.start_time, "best_time_s": c.best_time,
             "moves": c.moves, "accepted": c.accepted, "curve_s": list(c.trace),
             "improved_by": dict(c.improved_by)} for c in chains]


def _search_json(fs) -> dict:
    """A :class:`~topoopt.planners.search.FabricSearch` as JSON."""
    return {"stop": fs.stop, "spread": fs.spread, "moves": fs.moves,
            "evaluations": fs.evaluations,
            "starts": [{"strategy": n, "time_s": t} for n, t in fs.starts],
            "chains": _chains_json(fs.chains)}


def plan_to_json(p: Plan) -> dict:
    """The ``plan.json`` document (schema: README, "plan.json").

    Deterministic: the same inputs and seed give the same document, so no wall times.
    """
    tp = p.topology_plan
    topo = tp.topology
    groups = {g.members: g for g in tp.groups}
    rings = []
    for members, orders in sorted(tp.rings.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        g = groups.get(members)
        for order in orders:
            rings.append({"members": list(members), "order": list(order),
                          "share": 1.0 / len(orders),
                          "group_bytes": g.bytes if g is not None else None,
                          "direct": bool(g is not None and g.degree > 0)})
    routes = [{"src": s, "dst": d, "paths": [{"path": list(path), "fraction": f}
                                             for path, f in options]}
              for (s, d), options in sorted(tp.routes.paths.items())]

    traffic = derive_traffic(p.model, p.strategy, p.cluster.servers,
                             p.job.global_batch(p.cluster), p.job.dtype_bytes)
    metrics = topology_metrics(topo, traffic, tp.rings, tp.routes)
    return {
        "format": FORMAT,
        "config": p.source,
        "cluster": _cluster_json(p.cluster),
        "job": _job_json(p.job, p.cluster),
        "strategy": p.strategy.to_json(p.model),
        "topology": {"servers": topo.servers, "ports": topo.ports,
                     "link_bandwidth": topo.link_bandwidth, "link_latency": topo.link_latency,
                     "links": [list(link) for link in topo.links],
                     "labels": list(topo.labels),
                     "degree_allreduce": tp.degree_allreduce, "degree_mp": tp.degree_mp},
        "metrics": {"diameter": metrics.diameter,
                    "average_path_length": metrics.average_path_length,
                    "bandwidth_tax": metrics.bandwidth_tax, "mp_hops": metrics.mp_hops,
                    "max_link_load_bytes": metrics.max_link_load},
        "rings": rings,
        "routes": routes,
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
                   "screened": [{"strategy": n, "time_s": t} for n, t in p.search.screened],
                   "history": [{**r.to_json(), **_search_json(fs)}
                               for r, fs in zip(p.search.history, p.search.searches)]},
    }


def read_plan(directory: str | Path) -> dict:
    """Load ``DIR/plan.json``.

    Raises
    ------
    PlanCheckError
        Missing file, not JSON, or not a topoopt plan.
    """
    path = Path(directory) / "plan.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanCheckError(f"{path} does not exist; run `topoopt plan CONFIG -o {directory}`")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanCheckError(f"{path} is not valid JSON: {exc}")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PlanCheckError(f"{path}: format is not {FORMAT!r}")
    return doc


def topology_of(doc: dict):
    t = doc["topology"]
    return Topology(int(t["servers"]), int(t["ports"]),
                    tuple(tuple(int(x) for x in link) for link in t["links"]),
                    float(t["link_bandwidth"]), float(t["link_latency"]),
                    tuple(t.get("labels", ())))


def rings_of(doc: dict) -> dict[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    rings: dict[tuple[int, ...], list] = {}
    for r in doc["rings"]:
        rings.setdefault(tuple(r["members"]), []).append(tuple(r["order"]))
    return {m: tuple(orders) for m, orders in rings.items()}


def cluster_job_of(doc: dict):
    c = dict(doc["cluster"])
    j = {k: v for k, v in doc["job"].items() if k != "global_batch"}
    if not j.get("size"):
        j.pop("size", None)
    cfg = parse_config({"cluster": c, "job": j})
    return cfg.cluster, cfg.job


def routes_of(doc: dict) -> Routes:
    """The ``routes`` of a plan document."""
    return Routes({(int(r["src"]), int(r["dst"])):
                   tuple((tuple(int(x) for x in q["path"]), float(q["fraction"]))
                         for q in r["paths"]) for r in doc["routes"]})


def strategy_of(rows: list[dict]) -> Strategy:
    """A strategy from its ``plan.json`` rows (``strategy`` or ``fabrics.NAME.strategy``)."""
    return Strategy(tuple(OpConfig(tuple(int(s) for s in r["servers"]), int(r["dp"]),
                                   int(r["mp"])) for r in rows))


def check_plan_document(doc: dict) -> None:
    """Raise :class:`PlanCheckError` naming the first violated invariant of a plan.

    Checks: the topology's ports (each transmits and receives at most once, within
    the shard's NICs); every ring a Hamiltonian cycle of its group and, for rings
    marked ``direct``, each hop a link; every route a path of links with fractions
    summing to 1; every ring hop that is not a link routed; the strategy valid for
    the job (servers, degrees, memory); an iteration time and a cost for every fabric.
    """
    try:
        topo = topology_of(doc)
        rings = rings_of(doc)
        routes = routes_of(doc)
        cluster, job = cluster_job_of(doc)
        strategy_rows = doc["strategy"]
        times, costs = doc["iteration_time_s"], doc["cost"]
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanCheckError(f"plan.json is missing or mangles a field: {exc!r}")
    except TopoOptError as exc:
        raise PlanCheckError(f"plan.json cluster/job: {exc}")
    if topo.servers != cluster.servers or topo.ports != cluster.nics:
        raise PlanCheckError(f"topology has {topo.servers} servers x {topo.ports} ports but "
                             f"the cluster {cluster.servers} x {cluster.nics}")
    check_topology(topo)
    links = {(a, b) for a, _, b, _ in topo.links}
    direct = {tuple(r["members"]): bool(r.get("direct")) for r in doc["rings"]}
    for members, orders in rings.items():
        for order in orders:
            check_ring(order, members)
            for u, v in zip(order, order[1:] + order[:1]):
                if (u, v) in links:
                    continue
                if direct[members]:
                    raise PlanCheckError(f"ring {list(order)} hop {u}->{v} is marked direct "
                                         "but is not a link")
                if (u, v) not in routes:
                    raise PlanCheckError(f"ring {list(order)} hop {u}->{v} is neither a link "
                                         "nor routed")
    check_routes(topo, routes)
    model = model_of(job)
    try:
        strategy = strategy_of(strategy_rows)
        names = [r["op"] for r in strategy_rows]
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanCheckError(f"plan.json strategy is malformed: {exc!r}")
    if names != [op.name for op in model.operators]:
        raise PlanCheckError("strategy operators do not match the job's model")
    try:
        check_strategy(model, strategy, cluster.servers, job.global_batch(cluster),
                       cluster.gpus_per_server * cluster.gpu.memory, job.dtype_bytes)
    except TopoOptError as exc:
        raise PlanCheckError(f"strategy: {exc}")
    for fabric in ("topoopt", *BASELINES):
        if fabric in times and not (isinstance(times[fabric], (int, float))
                                    and times[fabric] > 0):
            raise PlanCheckError(f"iteration_time_s.{fabric} = {times[fabric]!r} is not > 0")
    if "topoopt" not in times or "topoopt" not in costs:
        raise PlanCheckError("plan.json has no iteration_time_s/cost for topoopt")
    if set(times) != set(costs):
        raise PlanCheckError(f"fabrics with times {sorted(times)} differ from those with "
                             f"costs {sorted(costs)}")
