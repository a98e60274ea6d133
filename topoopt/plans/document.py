"""A plan: the Plan and FabricResult types, the ``plan.json`` document (written,
read, checked), and the checks every field of it must pass.

The planner (:func:`topoopt.plan`, :mod:`topoopt.planners.planner`) makes a
:class:`Plan`; :func:`plan_to_json` gives its document (schema in README), and
:func:`check_plan_document` re-validates one. The plan folder with its exports is
written and checked by :mod:`topoopt.export.plan_dir`.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from topoopt.cluster import Cluster, Job
from topoopt.config import parse_config
from topoopt.errors import PlanCheckError, TopoOptError
from topoopt.fabrics.catalog import FABRICS
from topoopt.finder.topology_finder import GroupPlan, TopologyPlan, check_topology_plan
from topoopt.routing.metrics import topology_metrics
from topoopt.strategy import OpConfig, Strategy, check_strategy
from topoopt.topology.topology import Routes, Topology, check_ring, check_topology
from topoopt.traffic import derive_traffic
from topoopt.workloads import model_of

__all__ = ["FORMAT", "BASELINES", "FabricResult", "Plan", "plan_to_json", "read_plan",
           "check_plan_document", "topology_of", "rings_of", "routes_of", "strategy_of",
           "cluster_job_of", "PLAN_KEYS", "FOLDER_KEYS", "topology_plan_json"]

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
#: The cluster fields of plan.json (the GPU by name).
_CLUSTER_KEYS = ("servers", "nics", "link_bandwidth", "link_latency", "gpus_per_server", "gpu",
                 "intra_server_bandwidth", "compute_efficiency", "memory_efficiency")


def _cluster_json(c) -> dict:
    return {k: c.gpu.name if k == "gpu" else getattr(c, k) for k in _CLUSTER_KEYS}


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


def topology_plan_json(tp: TopologyPlan) -> dict:
    """A TopologyFinder plan's ``topology``, ``rings`` and ``routes`` as in ``plan.json``
    (every plan's shard, LLM plans' too: :mod:`topoopt.plans.llm`)."""
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
    return {"topology": {"servers": topo.servers, "ports": topo.ports,
                         "link_bandwidth": topo.link_bandwidth,
                         "link_latency": topo.link_latency,
                         "links": [list(link) for link in topo.links],
                         "labels": list(topo.labels),
                         "degree_allreduce": tp.degree_allreduce, "degree_mp": tp.degree_mp},
            "rings": rings, "routes": routes}


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
        "cluster": _cluster_json(p.cluster),
        "job": _job_json(p.job, p.cluster),
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
    if Path(directory).exists() and not Path(directory).is_dir():
        raise PlanCheckError(f"{directory} is a file, not a plan folder (topoopt plan -o DIR "
                             "writes DIR/plan.json)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanCheckError(f"{path} does not exist; run `topoopt plan CONFIG -o {directory}`")
    except (IsADirectoryError, PermissionError) as exc:
        raise PlanCheckError(f"{path} cannot be read ({exc.strerror})")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise PlanCheckError(f"{path} is not valid JSON: {exc}")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PlanCheckError(f"{path}: format is not {FORMAT!r}")
    return doc


# ------------------------------------------------------------------- typed fields
# Every reader below takes a field by its dotted name and says, in one line, which field
# is missing or mangled and what it must be (never a Python exception's repr).
def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(where: str, value: object, allowed: str) -> PlanCheckError:
    return PlanCheckError(f"plan.json {where} = {_show(value)}: {allowed}")


def _key(table: Any, key: str, where: str) -> Any:
    if not isinstance(table, dict):
        raise _bad(where.rsplit(".", 1)[0] if "." in where else where, table, "must be a table")
    if key not in table:
        raise PlanCheckError(f"plan.json has no {where}")
    return table[key]


def _table(value: Any, where: str, keys: tuple[str, ...] | None = None,
           optional: tuple[str, ...] = ()) -> dict:
    """``value`` must be a JSON object; with ``keys``, exactly those (and ``optional``)."""
    if not isinstance(value, dict):
        raise _bad(where, value, "must be a table")
    if keys is not None:
        for k in keys:
            if k not in value:
                raise PlanCheckError(f"plan.json has no {where}.{k}" if where else
                                     f"plan.json has no {k}")
        for k in value:
            if k not in keys and k not in optional:
                raise _bad(f"{where}.{k}" if where else k, value[k],
                           f"unknown key; {where or 'plan.json'} has "
                           f"{', '.join(keys + optional)}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise _bad(where, value, "must be a list")
    return value


def _int(value: Any, where: str, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(where, value, "must be an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        span = (f"in {low}..{high}" if low is not None and high is not None
                else f">= {low}" if low is not None else f"<= {high}")
        raise _bad(where, value, f"must be an integer {span}")
    return value


def _num(value: Any, where: str, positive: bool = False) -> float:
    """A finite number, >= 0 (> 0 with ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise _bad(where, value, f"must be a finite number {'>' if positive else '>='} 0")
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(where, value, "must be true or false")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _bad(where, value, "must be a string")
    return value


def _same(value: float, derived: float, where: str, what: str) -> None:
    """A stored number must equal the one re-derived from the checked fields."""
    if not math.isclose(value, derived, rel_tol=1e-6, abs_tol=1e-12):
        raise _bad(where, value, f"but {what} gives {derived:.6g}")


# ------------------------------------------------------------------------ readers
def topology_of(doc: dict) -> Topology:
    """The ``topology`` of a plan document (ports and servers as integers, not truncated)."""
    t = _table(_key(doc, "topology", "topology"), "topology")
    n = _int(_key(t, "servers", "topology.servers"), "topology.servers", 2)
    d = _int(_key(t, "ports", "topology.ports"), "topology.ports", 1)
    links = []
    for i, link in enumerate(_list(_key(t, "links", "topology.links"), "topology.links")):
        where = f"topology.links[{i}]"
        if not isinstance(link, list) or len(link) != 4:
            raise _bad(where, link, "must be [server_a, port_a, server_b, port_b]")
        a, pa, b, pb = (_int(x, f"{where}[{k}]", 0) for k, x in enumerate(link))
        if a >= n or b >= n:
            raise _bad(where, link, f"servers must be in 0..{n - 1}")
        if pa >= d or pb >= d:
            raise _bad(where, link, f"ports must be in 0..{d - 1}")
        links.append((a, pa, b, pb))
    labels = [_str(x, f"topology.labels[{i}]")
              for i, x in enumerate(_list(t.get("labels", []), "topology.labels"))]
    return Topology(n, d, tuple(links),
                    _num(_key(t, "link_bandwidth", "topology.link_bandwidth"),
                         "topology.link_bandwidth", positive=True),
                    _num(t.get("link_latency", 1e-6), "topology.link_latency"), tuple(labels))


def rings_of(doc: dict) -> dict[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Group members -> ring orders of a plan document."""
    rings: dict[tuple[int, ...], list] = {}
    for i, r in enumerate(_list(_key(doc, "rings", "rings"), "rings")):
        r = _table(r, f"rings[{i}]")
        members = tuple(_int(x, f"rings[{i}].members[{k}]", 0)
                        for k, x in enumerate(_list(_key(r, "members", f"rings[{i}].members"),
                                                    f"rings[{i}].members")))
        order = tuple(_int(x, f"rings[{i}].order[{k}]", 0)
                      for k, x in enumerate(_list(_key(r, "order", f"rings[{i}].order"),
                                                  f"rings[{i}].order")))
        rings.setdefault(members, []).append(order)
    return {m: tuple(orders) for m, orders in rings.items()}


def cluster_job_of(doc: dict) -> tuple[Cluster, Job]:
    """The cluster and job of a plan document, validated as a config's would be."""
    c = _table(_key(doc, "cluster", "cluster"), "cluster")
    j = {k: v for k, v in _table(_key(doc, "job", "job"), "job").items() if k != "global_batch"}
    if not j.get("size"):
        j.pop("size", None)
    try:
        cfg = parse_config({"cluster": dict(c), "job": j})
    except TopoOptError as exc:
        raise PlanCheckError(f"plan.json {exc}") from None
    return cfg.cluster, cfg.job


def routes_of(doc: dict) -> Routes:
    """The ``routes`` of a plan document (each ``src -> dst`` pair at most once)."""
    out: dict[tuple[int, int], tuple] = {}
    for i, r in enumerate(_list(_key(doc, "routes", "routes"), "routes")):
        where = f"routes[{i}]"
        r = _table(r, where, ("src", "dst", "paths"))
        pair = (_int(r["src"], f"{where}.src", 0), _int(r["dst"], f"{where}.dst", 0))
        if pair in out:
            raise _bad(f"{where}.src", pair[0], f"pair {pair[0]}->{pair[1]} is routed twice")
        options = []
        for k, q in enumerate(_list(r["paths"], f"{where}.paths")):
            at = f"{where}.paths[{k}]"
            q = _table(q, at, ("path", "fraction"))
            path = tuple(_int(x, f"{at}.path[{j}]", 0)
                         for j, x in enumerate(_list(q["path"], f"{at}.path")))
            options.append((path, _num(q["fraction"], f"{at}.fraction", positive=True)))
        out[pair] = tuple(options)
    return Routes(out)


def strategy_of(rows: list[dict], where: str = "strategy") -> Strategy:
    """A strategy from its ``plan.json`` rows (``strategy`` or ``fabrics.NAME.strategy``)."""
    configs = []
    for i, r in enumerate(_list(rows, where)):
        at = f"{where}[{i}]"
        r = _table(r, at, ("op", "servers", "dp", "mp"))
        _str(r["op"], f"{at}.op")
        servers = tuple(_int(s, f"{at}.servers[{j}]", 0)
                        for j, s in enumerate(_list(r["servers"], f"{at}.servers")))
        configs.append(OpConfig(servers, _int(r["dp"], f"{at}.dp", 1), _int(r["mp"], f"{at}.mp", 1)))
    return Strategy(tuple(configs))


# ------------------------------------------------------------------------ checks
#: Keys of a plan document; ``files`` and ``skipped`` are added by the plan folder's
#: writer (:func:`topoopt.export.plan_dir.write_plan`).
PLAN_KEYS = ("format", "config", "cluster", "job", "strategy", "topology", "metrics", "rings",
             "routes", "iteration_time_s", "gap_to_ideal", "reference_time_s", "breakdown",
             "cost", "fabrics", "search")
FOLDER_KEYS = ("files", "skipped")
_LABEL = re.compile(r"(ring|backbone|spare):p=[1-9][0-9]*|mp")
_BREAKDOWN = ("compute", "mp", "allreduce", "exposed_communication", "mp_bytes",
              "allreduce_bytes")
_ROUND = {"round": "int", "mcmc_time": "time", "topology_time": "time",
          "allreduce_degree": "degree", "mp_degree": "degree", "moves": "count",
          "accepted": "count", "improved": "bool"}
#: A fabric's search record (:class:`~topoopt.planners.search.FabricSearch`).
_SEARCH = ("stop", "spread", "moves", "evaluations", "starts", "chains")
_STOPS = ("converged", "budget", "interrupted")
#: The strategies a plan is compared with (``reference_time_s``).
_REFERENCES = ("data parallel", "hybrid")
_CHAIN = ("seed", "start_time_s", "best_time_s", "moves", "accepted", "curve_s", "improved_by")


def check_plan_document(doc: dict) -> None:
    """Raise :class:`PlanCheckError` naming the first violated invariant of a plan.

    Every field is checked for its type and range, and every field that follows from
    others is derived again and compared. Checks: no unknown key; the cluster and job
    valid as a config's (``global_batch`` derived); the topology the cluster's (servers,
    ports, link speed and latency), each port transmitting and receiving at most once,
    link labels known, ``degree_allreduce + degree_mp`` at most the NICs and no server
    with more ring links than ``degree_allreduce``; every ring a Hamiltonian cycle of
    its group, a group's ring shares equal and summing to 1, its ``group_bytes`` the
    strategy's, a ``direct`` ring's hops links labelled with its stride; every route a
    path of links with fractions summing to 1, each pair once; rings exactly for the
    strategy's AllReduce groups, every MP pair routed and every pair that carries
    bytes a link or routed (TopologyFinder's own check); the topology strongly
    connected; ``metrics`` derived again; every fabric's strategy valid for the job
    (servers, degrees, memory); per fabric a time, a cost and a breakdown whose
    ``exposed_communication`` is the time less compute and whose ``mp_bytes`` is its
    strategy's, ``gap_to_ideal`` derived, ``reference_time_s`` the same strategies on
    every fabric and none faster than the plan's; every search record (baselines' and each
    round's): stop reason, chains no worse than their starts and their best-so-far
    curves, which never rise, spread and moves derived; the search's settings, best time (the
    TopoOpt time unless it adopted another fabric's strategy, then no faster) and
    history; and the folder keys ``files`` and ``skipped`` well formed.
    """
    if not isinstance(doc, dict):
        raise _bad("", doc, "must be a JSON object")
    _table(doc, "", PLAN_KEYS, FOLDER_KEYS)
    _str(doc["config"], "config")
    _table(doc["cluster"], "cluster", _CLUSTER_KEYS)
    _table(doc["job"], "job", ("model", "batch_per_gpu", "precision", "size", "global_batch"),
           ("operators",))
    _table(doc["job"]["size"], "job.size")
    cluster, job = cluster_job_of(doc)
    model = model_of(job)
    batch = _int(_key(doc["job"], "global_batch", "job.global_batch"), "job.global_batch", 1)
    if batch != job.global_batch(cluster):
        raise _bad("job.global_batch", batch, f"but servers x gpus_per_server x batch_per_gpu "
                   f"is {job.global_batch(cluster)}")
    topo = _check_topology(doc, cluster)
    strategy = _check_strategy(doc["strategy"], "strategy", model, cluster, job)
    traffic = derive_traffic(model, strategy, cluster.servers, batch, job.dtype_bytes)
    rings = _check_rings(doc, topo, traffic)
    routes = routes_of(doc)
    for (src, dst), options in routes.paths.items():
        if src >= topo.servers or dst >= topo.servers or src == dst:
            raise PlanCheckError(f"plan.json routes: pair {src}->{dst} is not two servers "
                                 f"in 0..{topo.servers - 1}")
    groups = {g.members: g for g in traffic.allreduce}
    direct = {tuple(r["members"]): r["direct"] for r in doc["rings"]}
    plan = TopologyPlan(topo, rings, routes, doc["topology"]["degree_allreduce"],
                        doc["topology"]["degree_mp"],
                        tuple(GroupPlan(m, groups[m].network_bytes,
                                        len(rings[m]) if direct[m] else 0) for m in rings))
    check_topology_plan(plan, traffic)
    _check_metrics(doc, topology_metrics(topo, traffic, rings, routes))
    fabrics = _check_fabrics(doc, model, cluster, job, strategy)
    _check_search(doc, cluster, fabrics)
    _check_folder_keys(doc)


def _check_topology(doc: dict, cluster: Cluster) -> Topology:
    topo = topology_of(doc)
    t = _table(doc["topology"], "topology",
               ("servers", "ports", "link_bandwidth", "link_latency", "links", "labels",
                "degree_allreduce", "degree_mp"))
    if topo.servers != cluster.servers or topo.ports != cluster.nics:
        raise PlanCheckError(f"plan.json topology has {topo.servers} servers x {topo.ports} "
                             f"ports but the cluster {cluster.servers} x {cluster.nics}")
    for key in ("link_bandwidth", "link_latency"):
        if t[key] != getattr(cluster, key):
            raise _bad(f"topology.{key}", t[key], f"but cluster.{key} is {getattr(cluster, key)}")
    try:
        check_topology(topo)
    except PlanCheckError as exc:
        raise PlanCheckError(f"plan.json topology: {exc}") from None
    if len(topo.labels) != len(topo.links):
        raise _bad("topology.labels", f"{len(topo.labels)} labels",
                   f"needs one label per link ({len(topo.links)})")
    for i, label in enumerate(topo.labels):
        if not _LABEL.fullmatch(label):
            raise _bad(f"topology.labels[{i}]", label,
                       "unknown link label; use ring:p=N, backbone:p=N, spare:p=N or mp")
    d_ar = _int(t["degree_allreduce"], "topology.degree_allreduce", 0, cluster.nics)
    d_mp = _int(t["degree_mp"], "topology.degree_mp", 0, cluster.nics)
    if d_ar + d_mp > cluster.nics:
        raise _bad("topology.degree_mp", d_mp, f"degree_allreduce + degree_mp = {d_ar + d_mp} "
                   f"is more than the {cluster.nics} NICs per server")
    ring_out = np.bincount([a for (a, _, _, _), label in zip(topo.links, topo.labels)
                            if label.startswith(("ring:", "backbone:"))],
                           minlength=topo.servers)
    if ring_out.max(initial=0) > d_ar:
        worst = int(ring_out.argmax())
        raise _bad("topology.degree_allreduce", d_ar, f"but server {worst} has "
                   f"{int(ring_out[worst])} ring links")
    for i, ((a, _, b, _), label) in enumerate(zip(topo.links, topo.labels)):
        if label.startswith("backbone:") and b != (a + int(label[11:])) % topo.servers:
            raise _bad(f"topology.labels[{i}]", label, f"but link {a}->{b} is not that "
                       "stride of the ring over all servers")
    return topo


def _check_strategy(rows: Any, where: str, model, cluster: Cluster, job: Job) -> Strategy:
    strategy = strategy_of(rows, where)
    names = [r["op"] for r in rows]
    if names != [op.name for op in model.operators]:
        raise PlanCheckError(f"plan.json {where}: operators {_show(names)} are not the job's "
                             f"model's {_show([op.name for op in model.operators])}")
    try:
        check_strategy(model, strategy, cluster.servers, job.global_batch(cluster),
                       cluster.gpus_per_server * cluster.gpu.memory, job.dtype_bytes)
    except TopoOptError as exc:
        raise PlanCheckError(f"plan.json {where}: {exc}") from None
    return strategy


def _check_rings(doc: dict, topo: Topology, traffic) -> dict:
    rings = rings_of(doc)
    links = Counter((a, b, label) for (a, _, b, _), label in zip(topo.links, topo.labels))
    groups = {g.members: g for g in traffic.allreduce}
    seen: dict[tuple[int, ...], tuple] = {}
    for i, r in enumerate(doc["rings"]):
        where = f"rings[{i}]"
        _table(r, where, ("members", "order", "share", "group_bytes", "direct"))
        members, order = tuple(r["members"]), tuple(r["order"])
        if not members or list(members) != sorted(set(members)) or members[-1] >= topo.servers:
            raise _bad(f"{where}.members", list(members),
                       f"must be distinct servers in 0..{topo.servers - 1}, ascending")
        if members not in groups:
            raise _bad(f"{where}.members", list(members),
                       "is not an AllReduce group of the strategy")
        check_ring(order, members)
        share = _num(r["share"], f"{where}.share", positive=True)
        _same(share, 1.0 / len(rings[members]), f"{where}.share",
              f"splitting the group's bytes evenly over its {len(rings[members])} ring(s)")
        if r["group_bytes"] is None:
            raise _bad(f"{where}.group_bytes", None, "must be a number")
        _same(_num(r["group_bytes"], f"{where}.group_bytes"), groups[members].network_bytes,
              f"{where}.group_bytes", "the strategy's AllReduce traffic")
        direct = _bool(r["direct"], f"{where}.direct")
        if seen.setdefault(members, (direct,)) != (direct,):
            raise _bad(f"{where}.direct", direct, "differs from the group's other rings")
        if direct:
            idx = {s: k for k, s in enumerate(members)}
            for u, v in zip(order, order[1:] + order[:1]):
                want = f"ring:p={(idx[v] - idx[u]) % len(members)}"
                links[u, v, want] -= 1  # each direct ring has links of its own
                if links[u, v, want] < 0:
                    raise PlanCheckError(f"ring {list(order)} hop {u}->{v} is marked direct "
                                         f"but is not a link labelled {want} of its own")
    return rings


def _check_metrics(doc: dict, metrics) -> None:
    m = _table(doc["metrics"], "metrics", ("diameter", "average_path_length", "bandwidth_tax",
                                           "mp_hops", "max_link_load_bytes"))
    derived = {"diameter": metrics.diameter, "average_path_length": metrics.average_path_length,
               "bandwidth_tax": metrics.bandwidth_tax, "mp_hops": metrics.mp_hops,
               "max_link_load_bytes": metrics.max_link_load}
    for key, value in derived.items():
        _same(_num(m[key], f"metrics.{key}"), value, f"metrics.{key}",
              "the topology, rings and routes")


def _check_fabrics(doc: dict, model, cluster: Cluster, job: Job, strategy: Strategy) -> list:
    """The per-fabric results; returns the fabric names (``topoopt`` among them)."""
    times = _table(doc["iteration_time_s"], "iteration_time_s")
    names = list(times)
    if "topoopt" not in times:
        raise PlanCheckError("plan.json has no iteration_time_s.topoopt")
    for name in names:
        if name not in FABRICS:
            raise _bad(f"iteration_time_s.{name}", times[name],
                       f"unknown fabric; use {', '.join(FABRICS)}")
        _num(times[name], f"iteration_time_s.{name}", positive=True)
    for key in ("cost", "breakdown"):
        table = _table(doc[key], key)
        if set(table) != set(names):
            raise _bad(key, sorted(table), f"must have the fabrics of iteration_time_s "
                                           f"{sorted(names)}")
        for name in names:
            if key == "cost":
                _num(table[name], f"cost.{name}", positive=True)
    gaps = _table(doc["gap_to_ideal"], "gap_to_ideal")
    if set(gaps) != (set(names) if "ideal" in times else set()):
        raise _bad("gap_to_ideal", sorted(gaps), "must have every fabric of iteration_time_s "
                   "when the plan has the ideal one, else none")
    for name, gap in gaps.items():
        _same(_num(gap, f"gap_to_ideal.{name}", positive=True), times[name] / times["ideal"],
              f"gap_to_ideal.{name}", "iteration_time_s over the ideal's")
    refs = _table(doc["reference_time_s"], "reference_time_s")
    if refs and set(refs) != set(names):
        raise _bad("reference_time_s", sorted(refs), f"must have every fabric of "
                                                     f"iteration_time_s {sorted(names)}")
    kinds = None
    for name, table in refs.items():
        table = _table(table, f"reference_time_s.{name}")
        if kinds is not None and set(table) != kinds:
            raise _bad(f"reference_time_s.{name}", sorted(table), "must time the same "
                       f"strategies as the other fabrics ({', '.join(sorted(kinds))})")
        kinds = set(table)
        for kind, t in table.items():
            if kind not in _REFERENCES:
                raise _bad(f"reference_time_s.{name}.{kind}", t,
                           f"unknown strategy; use {', '.join(_REFERENCES)}")
            if _num(t, f"reference_time_s.{name}.{kind}", positive=True) * (1 + 1e-9) \
                    < times[name]:
                raise _bad(f"iteration_time_s.{name}", times[name], f"is slower than "
                           f"{kind} on the same fabric ({t:.6g} s), a start of its search")
    extra = _table(doc["fabrics"], "fabrics")
    if set(extra) != set(names) - {"topoopt"}:
        raise _bad("fabrics", sorted(extra), f"must have the baselines of iteration_time_s "
                   f"{sorted(set(names) - {'topoopt'})}")
    batch = job.global_batch(cluster)
    for name in names:
        if name == "topoopt":
            mine = strategy
        else:
            where = f"fabrics.{name}"
            f = _table(extra[name], where, ("title", "start_time_s", "moves", "adopted_from",
                                            "strategy", "search"))
            if f["title"] != FABRICS[name].title:
                raise _bad(f"{where}.title", f["title"], f"is {FABRICS[name].title!r}")
            start = _num(f["start_time_s"], f"{where}.start_time_s", positive=True)
            if times[name] > start * (1 + 1e-9):
                raise _bad(f"iteration_time_s.{name}", times[name],
                           f"is slower than its start strategy ({start:.6g} s)")
            _adopted(f["adopted_from"], f"{where}.adopted_from", names, name)
            search = _check_fabric_search(f["search"], f"{where}.search", start)
            _same(_int(f["moves"], f"{where}.moves", 0), search["moves"], f"{where}.moves",
                  f"{where}.search.moves")
            mine = _check_strategy(f["strategy"], f"{where}.strategy", model, cluster, job)
        b = _table(doc["breakdown"][name], f"breakdown.{name}", _BREAKDOWN)
        for key in _BREAKDOWN:
            _num(b[key], f"breakdown.{name}.{key}")
        total = times[name]
        for key in ("compute", "mp", "allreduce"):
            if b[key] > total * (1 + 1e-9):
                raise _bad(f"breakdown.{name}.{key}", b[key], f"is longer than the iteration "
                                                              f"({total:.6g} s)")
        _same(b["exposed_communication"], total - b["compute"],
              f"breakdown.{name}.exposed_communication", "iteration - compute")
        traffic = derive_traffic(model, mine, cluster.servers, batch, job.dtype_bytes)
        _same(b["mp_bytes"], traffic.mp_bytes, f"breakdown.{name}.mp_bytes",
              "its strategy's MP traffic")
    return names


def _adopted(value: Any, where: str, names: list, mine: str) -> None:
    """``adopted_from``: "" or another fabric of the plan (cross-seeding)."""
    if value != "" and (value not in names or value == mine):
        raise _bad(where, value, f"use \"\" or another fabric of the plan "
                                 f"({', '.join(n for n in names if n != mine)})")


def _timed(rows: Any, where: str) -> list:
    """A list of ``{"strategy": name, "time_s": seconds}`` (starts, screened)."""
    for i, r in enumerate(_list(rows, where)):
        _table(r, f"{where}[{i}]", ("strategy", "time_s"))
        _str(r["strategy"], f"{where}[{i}].strategy")
        _num(r["time_s"], f"{where}[{i}].time_s", positive=True)
    return rows


def _check_fabric_search(fs: Any, where: str, start: float | None = None,
                         keys: tuple[str, ...] = _SEARCH, first: str | None = None) -> dict:
    """A fabric's search: stop reason, starts (the first one ``first`` when given, no
    chain from below the fastest), chains (each best no worse than its start or the end
    of its best-so-far curve, which never rises), spread and moves derived."""
    fs = _table(fs, where, keys)
    if fs["stop"] not in _STOPS:
        raise _bad(f"{where}.stop", fs["stop"], f"use {', '.join(_STOPS)}")
    starts = _timed(fs["starts"], f"{where}.starts")
    if start is not None and starts:
        _same(starts[0]["time_s"], start, f"{where}.starts[0].time_s", "its start_time_s")
    if first is not None and starts and starts[0]["strategy"] != first:
        raise _bad(f"{where}.starts[0].strategy", starts[0]["strategy"],
                   f"must be {first!r}, the strategy the round began with")
    # strategies simulated: starts answered by the memo or cut short by the analytical
    # bound are not among them, so there may be fewer than starts
    _int(fs["evaluations"], f"{where}.evaluations", 0)
    chains = _list(fs["chains"], f"{where}.chains")
    for i, c in enumerate(chains):
        at = f"{where}.chains[{i}]"
        _table(c, at, _CHAIN)
        _int(c["seed"], f"{at}.seed", 0)
        first = _num(c["start_time_s"], f"{at}.start_time_s", positive=True)
        best = _num(c["best_time_s"], f"{at}.best_time_s", positive=True)
        if best > first * (1 + 1e-9):
            raise _bad(f"{at}.best_time_s", best, f"is slower than its start ({first:.6g} s)")
        moves = _int(c["moves"], f"{at}.moves", 0)
        _int(c["accepted"], f"{at}.accepted", 0, moves)
        curve = [_num(x, f"{at}.curve_s[{k}]", positive=True)
                 for k, x in enumerate(_list(c["curve_s"], f"{at}.curve_s"))]
        for k in range(1, len(curve)):
            if curve[k] > curve[k - 1] * (1 + 1e-12):
                raise _bad(f"{at}.curve_s[{k}]", curve[k], "rises; a best-so-far curve "
                                                             "never does")
        if curve and best > curve[-1] * (1 + 1e-9):  # a final descent may only improve it
            raise _bad(f"{at}.best_time_s", best, f"is slower than the end of its curve_s "
                                                  f"({curve[-1]:.6g} s)")
        for kind, count in _table(c["improved_by"], f"{at}.improved_by").items():
            _int(count, f"{at}.improved_by.{kind}", 0)
    if chains and starts:
        # every chain begins at one of the starts (those that begin from the best
        # screened basin bottoms need not begin at the fastest start); a start's time
        # is exact or a lower bound, so no chain begins below the fastest of them
        fastest = min(r["time_s"] for r in starts)
        for i, c in enumerate(chains):
            if c["start_time_s"] < fastest * (1 - 1e-9):
                raise _bad(f"{where}.chains[{i}].start_time_s", c["start_time_s"],
                           f"is faster than the fastest of its starts ({fastest:.6g} s)")
    spread = _num(fs["spread"], f"{where}.spread", positive=True)
    if chains:
        bests = [c["best_time_s"] for c in chains]
        _same(spread, max(bests) / min(bests), f"{where}.spread",
              "its chains' largest best over the smallest")
    _same(_int(fs["moves"], f"{where}.moves", 0), sum(c["moves"] for c in chains),
          f"{where}.moves", "its chains' moves")
    return fs


def _check_search(doc: dict, cluster: Cluster, fabrics: list) -> None:
    s = _table(doc["search"], "search", ("seed", "fabric_seed", "budget", "rounds", "chains",
                                         "tolerance",
                                         "start_strategy", "start_time_s", "first_round_from",
                                         "best_time_s", "adopted_from", "moves", "interrupted",
                                         "screened", "history"))
    _int(s["seed"], "search.seed", 0)
    _int(s["fabric_seed"], "search.fabric_seed", 0)
    budget = _int(s["budget"], "search.budget", 0)
    rounds = _int(s["rounds"], "search.rounds", 1)
    chains = _int(s["chains"], "search.chains", 1)
    if _num(s["tolerance"], "search.tolerance") >= 1:
        raise _bad("search.tolerance", s["tolerance"], "must be a fraction below 1")
    for key in ("start_strategy", "first_round_from"):
        if not _str(s[key], f"search.{key}"):
            raise _bad(f"search.{key}", "", "must name a strategy")
    start = _num(s["start_time_s"], "search.start_time_s", positive=True)
    screened = _timed(s["screened"], "search.screened")
    # screened[0] is the start on Step 1's topology; start_time_s the start on the best of
    # that degree split and its neighbours, so never slower
    if screened and screened[0]["strategy"] != "start":
        raise _bad("search.screened[0].strategy", screened[0]["strategy"],
                   "must be 'start' (the start on Step 1's topology comes first)")
    if screened and start > screened[0]["time_s"] * (1 + 1e-9):
        raise _bad("search.start_time_s", start, "is slower than the start on Step 1's "
                   f"topology (search.screened[0].time_s = {screened[0]['time_s']:.6g} s)")
    best = _num(s["best_time_s"], "search.best_time_s", positive=True)
    if best > start * (1 + 1e-9):
        raise _bad("search.best_time_s", best, f"is slower than the start ({start:.6g} s)")
    _adopted(s["adopted_from"], "search.adopted_from", fabrics, "topoopt")
    topoopt = doc["iteration_time_s"]["topoopt"]
    if s["adopted_from"] == "":
        _same(best, topoopt, "search.best_time_s", "iteration_time_s.topoopt")
    elif topoopt > best * (1 + 1e-9):
        raise _bad("iteration_time_s.topoopt", topoopt, "is slower than the search's best "
                   f"({best:.6g} s), though it adopted {s['adopted_from']}'s strategy")
    moves = _int(s["moves"], "search.moves", 0, budget * rounds * chains)
    interrupted = _bool(s["interrupted"], "search.interrupted")
    history = _list(s["history"], "search.history")
    if len(history) > rounds or (not history and not interrupted):
        raise _bad("search.history", f"{len(history)} rounds",
                   f"must have 1 to {rounds} rounds (search.rounds)")
    for i, r in enumerate(history):
        where = f"search.history[{i}]"
        _check_fabric_search(r, where, keys=(*_ROUND, *_SEARCH), first="current")
        for key, kind in _ROUND.items():
            at = f"{where}.{key}"
            if kind == "int":
                _int(r[key], at, i + 1, i + 1)
            elif kind == "time":
                _num(r[key], at, positive=True)
            elif kind == "degree":
                _int(r[key], at, 0, cluster.nics)
            elif kind == "count":
                _int(r[key], at, 0)
            else:
                _bool(r[key], at)
        if r["accepted"] != sum(c["accepted"] for c in r["chains"]):
            raise _bad(f"{where}.accepted", r["accepted"], "but its chains accepted "
                       f"{sum(c['accepted'] for c in r['chains'])}")
        if r["allreduce_degree"] + r["mp_degree"] > cluster.nics:
            raise _bad(f"{where}.mp_degree", r["mp_degree"],
                       f"with allreduce_degree {r['allreduce_degree']} is more than the "
                       f"{cluster.nics} NICs")
    if sum(r["moves"] for r in history) != moves:
        raise _bad("search.moves", moves, f"but its rounds made "
                                          f"{sum(r['moves'] for r in history)}")


def _check_folder_keys(doc: dict) -> None:
    if "files" in doc:
        files = _list(doc["files"], "files")
        for i, name in enumerate(files):
            _str(name, f"files[{i}]")
            parts = Path(name).parts
            if not parts or name.startswith("/") or ".." in parts or "\\" in name:
                raise _bad(f"files[{i}]", name, "must be a path inside the plan folder")
        if len(set(files)) != len(files) or files != sorted(files):
            raise _bad("files", files, "must list each file once, sorted")
    if "skipped" in doc:
        for name, reason in _table(doc["skipped"], "skipped").items():
            _str(reason, f"skipped.{name}")
