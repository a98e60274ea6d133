"""Replay a written plan's iteration on ns-3, per fabric, next to its predicted time.

:func:`plan_inputs` is the thin reader of ``DIR/plan.json`` (schema: README,
"plan.json"); :func:`validate_plan` builds each fabric the plan compared (the TopoOpt
shard from the plan's topology, routes and rings; the baselines from the catalog,
each with its own strategy) and runs :func:`~topoopt.netsim.ns3.iteration.replay_iteration`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from topoopt.errors import ConfigError, PlanCheckError
from topoopt.netsim.ns3.config import Ns3Config
from topoopt.netsim.ns3.iteration import replay_iteration
from topoopt.netsim.ns3.worker import Ns3Worker, require_ns3
from topoopt.workloads import model_of

__all__ = ["PlanInputs", "plan_inputs", "plan_fabric", "validate_plan"]


@dataclass(frozen=True)
class PlanInputs:
    """What a replay needs from a plan: the job, every fabric's strategy, the shard."""

    cluster: Any
    job: Any
    model: Any
    strategies: Mapping[str, Any]
    topology: Any
    routes: Any
    rings: Mapping[tuple[int, ...], tuple[tuple[int, ...], ...]]
    predicted: Mapping[str, float]
    seed: int


def plan_inputs(directory: str | Path) -> PlanInputs:
    """Read ``DIR/plan.json`` (validated by :func:`topoopt.plans.check_plan_document`)."""
    from topoopt.config import parse_config
    from topoopt.plans import check_plan_document, read_plan
    from topoopt.strategy import OpConfig, Strategy
    from topoopt.topology.topology import Routes, Topology

    doc = read_plan(directory)
    check_plan_document(doc)
    t = doc["topology"]
    topo = Topology(int(t["servers"]), int(t["ports"]),
                    tuple(tuple(int(x) for x in link) for link in t["links"]),
                    float(t["link_bandwidth"]), float(t["link_latency"]),
                    tuple(t.get("labels", ())))
    rings: dict[tuple[int, ...], list] = {}
    for r in doc["rings"]:
        rings.setdefault(tuple(int(x) for x in r["members"]), []).append(
            tuple(int(x) for x in r["order"]))
    routes = Routes({(int(r["src"]), int(r["dst"])):
                     tuple((tuple(int(x) for x in q["path"]), float(q["fraction"]))
                           for q in r["paths"]) for r in doc["routes"]})
    job_doc = {k: v for k, v in doc["job"].items() if k != "global_batch"}
    if not job_doc.get("size"):
        job_doc.pop("size", None)
    cfg = parse_config({"cluster": dict(doc["cluster"]), "job": job_doc})

    def strategy(rows) -> Strategy:
        return Strategy(tuple(OpConfig(tuple(int(s) for s in r["servers"]), int(r["dp"]),
                                       int(r["mp"])) for r in rows))

    strategies = {"topoopt": strategy(doc["strategy"])}
    for name, entry in doc.get("fabrics", {}).items():
        strategies[name] = strategy(entry["strategy"])
    return PlanInputs(cluster=cfg.cluster, job=cfg.job, model=model_of(cfg.job),
                      strategies=strategies, topology=topo, routes=routes,
                      rings={m: tuple(o) for m, o in rings.items()},
                      predicted={k: float(v) for k, v in doc["iteration_time_s"].items()},
                      seed=int(doc.get("search", {}).get("seed", 0)))


def plan_fabric(inputs: PlanInputs, name: str):
    """The fabric ``name`` of a plan: the TopoOpt shard, or a catalog baseline."""
    if name == "topoopt":
        from topoopt.fabrics import direct_connect

        return direct_connect(inputs.topology, inputs.routes, optics="patch_panel",
                              name="topoopt", rings=inputs.rings)
    from topoopt.fabrics.catalog import build_fabric

    return build_fabric(name, inputs.cluster, seed=inputs.seed, job=inputs.job,
                        model=inputs.model, strategy=inputs.strategies.get(name))


def validate_plan(directory: str | Path, fabrics: Sequence[str] | None = None,
                  config: Ns3Config = Ns3Config(), worker: Ns3Worker | None = None,
                  iterations: int = 2, ring_mode: str = "hops", ecmp: str = "split",
                  wire: bool = True, progress=None) -> list[dict]:
    """Replay the plan's iteration on each fabric at flow level and on ns-3.

    Parameters
    ----------
    directory : path
        Holds ``plan.json``.
    fabrics : sequence of str, optional
        Default: every fabric the plan has a predicted time for.
    config : Ns3Config
    worker : Ns3Worker, optional
    iterations, ring_mode, ecmp
        See :func:`~topoopt.netsim.ns3.iteration.replay_iteration`.
    wire : bool
        Include packet overheads (headers, ACKs; :mod:`topoopt.netsim.wire`) in the
        flow-level column.
    progress : callable, optional
        Called with each row as it is done.

    Returns
    -------
    list of dict
        Per fabric: ``fabric``, ``predicted_s`` (plan.json), ``flow_s``, ``ns3_s``,
        ``error`` (flow / ns-3 - 1), ``predicted_error``, ``flow_wall_s``,
        ``ns3_wall_s``, ``flows`` and the breakdowns.
    """
    require_ns3()
    inputs = plan_inputs(directory)
    names = list(fabrics) if fabrics else list(inputs.predicted)
    for n in names:
        if n not in inputs.strategies:
            raise ConfigError("--fabric", n, f"the plan has {', '.join(inputs.strategies)}")
    model = None
    if wire:
        from topoopt.netsim.wire import WireModel

        model = WireModel(mtu=config.mtu)
    rows = []
    for name in names:
        fabric = plan_fabric(inputs, name)
        if fabric.servers != inputs.cluster.servers:
            raise PlanCheckError(f"fabric {name} has {fabric.servers} servers, the plan "
                                 f"{inputs.cluster.servers}")
        rings = inputs.rings if name == "topoopt" else None
        r = replay_iteration(inputs.model, inputs.strategies[name], inputs.cluster,
                             inputs.job, fabric, rings=rings, config=config, worker=worker,
                             iterations=iterations, ecmp=ecmp, ring_mode=ring_mode,
                             wire=model)
        pred = inputs.predicted.get(name, float("nan"))
        row = {"fabric": name, "predicted_s": pred, "flow_s": r.flow.total,
               "ns3_s": r.packet.total, "error": r.error,
               "predicted_error": pred / r.packet.total - 1.0,
               "flow_wall_s": r.flow_wall, "ns3_wall_s": r.packet_wall, "flows": r.flows,
               "flow": r.flow.to_json(), "ns3": r.packet.to_json()}
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows
