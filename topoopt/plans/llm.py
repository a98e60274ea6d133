"""The plan of an LLM job (:class:`LLMPlan`) and its ``plan.json``, written and checked.

An LLM plan's ``plan.json`` has the same format, cluster, job, topology, rings and
routes as any plan (so the patch-panel, OCS, NCCL and MSCCL exports work unchanged),
the per-fabric ``iteration_time_s``, ``gap_to_ideal`` and ``cost``, and an ``llm``
table instead of the operator strategy and its MCMC search: the chosen parallelism,
its placement (servers of each stage, DP group and expert group), the memory per GPU,
and per fabric the parallelism, the iteration's parts, MFU and the bytes of each
traffic kind (schema: README, "plan.json of an LLM job").
:func:`check_llm_plan_document` derives every number again from the cluster, the job
and the stored strategy and topology; the fields every plan has are read and checked
by :mod:`topoopt.plans.common`. :class:`LLMPlan` offers what every plan does
(:class:`topoopt.plans.interface.PlanLike`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import numpy as np

from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError, PlanCheckError, TopoOptError
from topoopt.fabrics.catalog import FABRICS, build_fabric
from topoopt.fabrics.direct import direct_connect
from topoopt.finder.topology_finder import TopologyPlan
from topoopt.llm import (
    KINDS,
    LLMIteration,
    LLMParallel,
    LLMTraffic,
    check_parallel,
    communicator_groups,
    finder_traffic,
    gpu_coordinates,
    llm_iteration,
    llm_traffic,
    memory_per_gpu,
)
from topoopt.llm.fabric import fabric_comm_times
from topoopt.llm.iteration import CommTimes
from topoopt.model import Model
from topoopt.plans.common import (
    FOLDER_KEYS,
    FORMAT,
    check_folder_keys,
    check_rings_of,
    check_shard_of,
    check_topology_of,
    cluster_job_of,
    cluster_json,
    job_json,
    routes_of,
    topology_plan_json,
)
from topoopt.plans.fields import (
    as_bool,
    as_int,
    as_number,
    as_str,
    as_table,
    bad_field,
    check_same,
    check_same_table,
)
from topoopt.workloads import model_of
from topoopt.workloads.gpt import TransformerShape, is_transformer, transformer_shape

__all__ = ["LLMFabricResult", "LLMPlan", "llm_plan_to_json", "check_llm_plan_document",
           "is_llm_document", "placement", "launch_order", "launch_preserves_traffic",
           "LLM_PLAN_KEYS"]

#: Top-level keys of an LLM plan's ``plan.json`` (and ``files``, ``skipped``).
LLM_PLAN_KEYS = ("format", "config", "cluster", "job", "topology", "rings", "routes",
                 "iteration_time_s", "gap_to_ideal", "cost", "llm")
_ITERATION = ("total", "micro_batch", "compute", "tp", "pp", "ep", "bubble", "dp", "mfu", "hfu")


@dataclass(frozen=True)
class LLMFabricResult:
    """One fabric's best parallelism and its iteration.

    Attributes
    ----------
    name, title : str
    parallel : LLMParallel
    iteration : LLMIteration
    comm : CommTimes
    traffic : LLMTraffic
    cost : CostReport
    topology_plan : TopologyPlan or None
        The TopoOpt shard's (None on the other fabrics).
    allreduce_degree : int or None
        The ports per server the TopoOpt shard gives the DP rings.
    tried : int
        Candidates (x port splits on TopoOpt) timed on this fabric.
    """

    name: str
    title: str
    parallel: LLMParallel
    iteration: LLMIteration
    comm: CommTimes
    traffic: LLMTraffic = field(repr=False)
    cost: Any = field(repr=False)
    topology_plan: TopologyPlan | None = field(default=None, repr=False)
    allreduce_degree: int | None = None
    tried: int = 0


@dataclass(frozen=True)
class LLMPlan:
    """The plan of an LLM job: every fabric's result, the TopoOpt shard first.

    Attributes
    ----------
    cluster, job : Cluster, Job
    model : Model
    shape : TransformerShape
    fabrics : tuple of LLMFabricResult
    candidates : tuple
        The degree search's shortlist (:class:`topoopt.planners.llm.LLMCandidate`),
        fastest on the Ideal Switch first.
    space, feasible : int
        Parallelisms enumerated, and how many fit in memory.
    source : str
    fabric_seed : int
    top : int
    fixed : Mapping
        The values the search was told to keep (``[plan] parallel``).
    """

    cluster: Cluster
    job: Job
    model: Model
    shape: TransformerShape
    fabrics: tuple[LLMFabricResult, ...]
    candidates: tuple
    space: int
    feasible: int
    source: str = ""
    fabric_seed: int = 0
    top: int = 0
    fixed: Mapping = field(default_factory=dict)

    @property
    def topology_plan(self) -> TopologyPlan:
        """The TopoOpt shard's topology, rings and routes."""
        tp = self.fabric("topoopt").topology_plan
        if tp is None:  # the planner gives the TopoOpt shard's result one, always
            raise TopoOptError("the LLM plan's topoopt fabric has no topology plan")
        return tp

    @property
    def parallel(self) -> LLMParallel:
        """The TopoOpt shard's parallelism (the plan's)."""
        return self.fabric("topoopt").parallel

    @property
    def llm_parallel(self) -> LLMParallel:
        """The plan's parallelism, whose communicators the plan folder exports."""
        return self.parallel

    @property
    def iteration_time_s(self) -> dict[str, float]:
        """Predicted seconds per iteration on every fabric (``plan.json``'s key)."""
        return {f.name: f.iteration.total for f in self.fabrics}

    @property
    def costs(self) -> dict[str, float]:
        """Interconnect cost of every fabric, relative units (``plan.json``'s ``cost``)."""
        return {f.name: f.cost.total for f in self.fabrics}

    def fabric(self, name: str) -> LLMFabricResult:
        """The result of the fabric called ``name``."""
        for f in self.fabrics:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict:
        """The ``plan.json`` document (:func:`llm_plan_to_json`)."""
        return llm_plan_to_json(self)

    @staticmethod
    def check_document(doc: dict) -> None:
        """Raise :class:`~topoopt.errors.PlanCheckError` naming the first violated
        invariant of an LLM plan's document (:func:`check_llm_plan_document`)."""
        check_llm_plan_document(doc)

    def check(self) -> None:
        """Check this plan's document as ``topoopt plan --check`` would."""
        self.check_document(self.to_json())

    def traffic_heatmaps(self) -> dict[str, tuple[np.ndarray, str]]:
        """Bytes per server pair per iteration (PP and EP bytes plus the DP AllReduces),
        ``before`` with one ring per DP group in member order and ``after`` over the
        planned rings, each with its title: the blocks are the pipeline stages and DP
        groups."""
        c, top = self.cluster, self.fabric("topoopt")
        t, label = top.traffic, top.parallel.label()
        return {which: (t.mp_matrix() + t.dp_matrix(rings),
                        f"{self.model.name} {label} on {c.servers} servers: {how}")
                for which, rings, how in (("before", None, "one ring per DP group"),
                                          ("after", self.topology_plan.rings,
                                           "TopoOpt rings"))}


def placement(par: LLMParallel, gpus_per_server: int,
              order: tuple[int, ...] | None = None) -> dict[str, list[list[int]]]:
    """Servers of each pipeline stage, DP group and expert group, and with ``cp > 1``
    of each context-parallel group (sorted, distinct), with GPU rank ``r`` on server
    ``order[r // gpus_per_server]`` (the launch order; the identity by default)."""
    g = communicator_groups(par)
    host = (lambda r: order[r // gpus_per_server]) if order is not None else \
        (lambda r: r // gpus_per_server)

    def servers(groups) -> list[list[int]]:
        out = {tuple(sorted({host(r) for r in grp})) for grp in groups}
        return [list(x) for x in sorted(out)]

    stages = [sorted({host(r) for grp in g["dp"] for r in grp
                      if gpu_coordinates(par, grp[0])[1] == p}) for p in range(par.pp)]
    out = {"stages": stages, "dp_groups": servers(g["dp"]), "ep_groups": servers(g["ep"])}
    if par.cp > 1:   # only then, so that plans without cp keep their documents
        out["cp_groups"] = servers(g["cp"])
    return out



def launch_order(rings, servers: int) -> tuple[int, ...]:
    """The servers in the order ``rank_order.txt`` launches them (line ``i`` runs GPU
    ranks ``i g .. i g + g - 1``): the first ring of the largest group (most members,
    ties the smallest tuple), then the other servers ascending -- the rule of
    :func:`topoopt.export.rank_order.rank_order`, restated here one layer below it."""
    if not rings:
        return tuple(range(servers))
    members = min(rings, key=lambda m: (-len(m), tuple(m)))
    first = tuple(int(x) for x in rings[members][0])
    inside = set(first)
    return first + tuple(x for x in range(servers) if x not in inside)


def launch_preserves_traffic(traffic: LLMTraffic, order: tuple[int, ...]) -> bool:
    """Whether launching logical server ``i`` on ``order[i]`` leaves the traffic as
    planned: every pipeline step, all-to-all, context-parallel ring step and DP group
    maps onto itself, so the shard
    TopologyFinder built for the logical traffic serves the launched job."""
    o = np.asarray(order)
    if (o == np.arange(o.size)).all():
        return True
    for m in (traffic.pp_step, traffic.ep_step, traffic.cp_step):
        if m.size and not np.array_equal(m[np.ix_(o, o)], m):
            return False
    groups = {g.members: g.bytes for g in traffic.dp_groups}
    return groups == {tuple(sorted(int(o[x]) for x in g.members)): g.bytes
                      for g in traffic.dp_groups}


def _iteration_json(it: LLMIteration, par: LLMParallel) -> dict:
    """The iteration's parts; ``cp`` (the exposed context-parallel ring per micro-batch)
    only with ``cp > 1``, so that plans without cp keep their documents."""
    out = {k: getattr(it, k) for k in _ITERATION}
    if par.cp > 1:
        out["cp"] = it.cp
    return out


def llm_plan_to_json(p: LLMPlan) -> dict:
    """The ``plan.json`` document of an LLM plan (deterministic: no wall times)."""
    shard = topology_plan_json(p.topology_plan)
    shape, c = p.shape, p.cluster
    top = p.fabric("topoopt")
    mem = memory_per_gpu(shape, top.parallel, p.job.global_batch(c), p.job.dtype_bytes,
                         c.gpu.memory)
    times = p.iteration_time_s
    return {
        "format": FORMAT,
        "config": p.source,
        "cluster": cluster_json(c),
        "job": job_json(p.job, c),
        **shard,
        "iteration_time_s": times,
        "gap_to_ideal": ({n: t / times["ideal"] for n, t in times.items()}
                         if "ideal" in times else {}),
        "cost": {f.name: f.cost.total for f in p.fabrics},
        "llm": {
            "model": {"params": shape.params, "active_params": shape.active_params,
                      "training_flops_per_token": shape.training_flops_per_token()},
            "parallel": top.parallel.to_dict(),
            "placement": placement(top.parallel, c.gpus_per_server,
                                   launch_order(p.topology_plan.rings, c.servers)),
            "memory_per_gpu": {"stage": mem.stage, "weights": mem.weights,
                               "gradients": mem.gradients, "optimizer": mem.optimizer,
                               "activations": mem.activations, "total": mem.total,
                               "capacity": mem.capacity},
            "fabrics": {f.name: {"title": f.title, "parallel": f.parallel.to_dict(),
                                 "iteration": _iteration_json(f.iteration, f.parallel),
                                 "network_bytes": f.traffic.network_bytes(),
                                 "nvlink_bytes": f.traffic.nvlink_bytes(),
                                 "allreduce_degree": f.allreduce_degree, "tried": f.tried}
                        for f in p.fabrics},
            "search": {"space": p.space, "feasible": p.feasible, "top": p.top,
                       "fabric_seed": p.fabric_seed, "fixed": dict(p.fixed),
                       "candidates": [{"parallel": x.parallel.to_dict(),
                                       "ideal_time_s": x.ideal.total} for x in p.candidates]},
        },
    }


def is_llm_document(doc: object) -> bool:
    """Whether a ``plan.json`` document is an LLM plan's."""
    return isinstance(doc, dict) and "llm" in doc and "strategy" not in doc


#: Keys :meth:`LLMParallel.to_dict` writes only when set, read back by :func:`_parallel_of`
#: with their kind (``cp``: a context-parallel plan; the others: a layout given by hand).
_OPTIONAL_PARALLEL = {"attention": "str", "cp": "int", "edge_layers": "count",
                      "shard_grads": "bool", "recompute_norms": "bool", "recompute_act": "bool"}


#: :class:`LLMParallel`'s defaults: what a field :meth:`LLMParallel.to_dict` leaves out is.
_PARALLEL_DEFAULTS = {f.name: f.default for f in fields(LLMParallel)}


def _parallel_of(value: Any, where: str) -> LLMParallel:
    t = as_table(value, where, ("tp", "pp", "dp", "ep", "micro_batches", "zero1", "recompute",
                                "order", "virtual", "flash_attention"), tuple(_OPTIONAL_PARALLEL))
    kwargs: dict[str, Any] = {k: as_int(t[k], f"{where}.{k}", 1)
                              for k in ("tp", "pp", "dp", "ep", "micro_batches", "virtual")}
    kwargs.update(zero1=as_bool(t["zero1"], f"{where}.zero1"),
                  flash_attention=as_bool(t["flash_attention"], f"{where}.flash_attention"),
                  recompute=as_str(t["recompute"], f"{where}.recompute"),
                  order=as_str(t["order"], f"{where}.order"))
    for k, kind in _OPTIONAL_PARALLEL.items():
        if k in t:
            read = {"str": as_str, "bool": as_bool}.get(kind)
            kwargs[k] = (read(t[k], f"{where}.{k}") if read else
                         as_int(t[k], f"{where}.{k}", 1 if kind == "int" else 0))
    try:
        return LLMParallel.from_dict(kwargs)
    except ConfigError as exc:
        raise PlanCheckError(f"plan.json {where}: {exc}") from None


def _check_parallel(value, where, shape, cluster, job) -> LLMParallel:
    par = _parallel_of(value, where)
    try:
        check_parallel(par, shape, cluster, job.global_batch(cluster))
    except ConfigError as exc:
        raise PlanCheckError(f"plan.json {where}: {exc}") from None
    if par.attention != job.attention:   # the planner runs every layout with the job's
        raise bad_field(f"{where}.attention", par.attention,
                        f"but job.attention is {job.attention}")
    mem = memory_per_gpu(shape, par, job.global_batch(cluster), job.dtype_bytes,
                         cluster.gpu.memory)
    if not mem.fits:
        raise bad_field(f"{where}", par.label(), f"needs {mem.total / 1e9:.1f} GB per GPU, "
                                                 f"more than the {mem.capacity / 1e9:.0f} GB "
                                                 "usable")
    return par


@dataclass(frozen=True)
class _Setting:
    """What every check of an LLM plan derives from: its cluster and job, the model's
    shape and the global batch."""

    cluster: Cluster
    job: Job
    shape: TransformerShape
    batch: int


def check_llm_plan_document(doc: dict) -> None:
    """Raise :class:`PlanCheckError` naming the first violated invariant of an LLM plan.

    Checks: no unknown key; the cluster and job valid as a config's, the model a
    transformer, ``global_batch`` derived; every fabric's parallelism valid for the
    cluster and job and within the GPUs' memory (``tp x cp x pp x dp`` GPUs, the
    activations of ``1 / cp`` of the tokens); the plan's parallelism the TopoOpt
    shard's; its placement (with ``cp > 1`` the servers of each context-parallel group)
    and memory derived again; the topology the cluster's, with
    rings exactly for its DP groups (each a Hamiltonian cycle, ``group_bytes`` derived)
    and routes that TopologyFinder's own check accepts for its traffic; per fabric the
    iteration's parts, MFU and bytes per kind derived again (the TopoOpt shard on the
    stored topology, rings and routes; the others built from the catalog with the plan's
    fabric seed; with ``cp > 1`` the exposed K/V ring and its bytes among them);
    ``iteration_time_s`` and ``gap_to_ideal`` derived, the Ideal Switch no
    slower than any fabric; costs positive; the search record well formed.
    """
    if not isinstance(doc, dict):
        raise bad_field("", doc, "must be a JSON object")
    as_table(doc, "", LLM_PLAN_KEYS, FOLDER_KEYS)
    as_str(doc["config"], "config")
    setting = _check_llm_job(doc)
    llm = as_table(doc["llm"], "llm", ("model", "parallel", "placement", "memory_per_gpu",
                                       "fabrics", "search"))
    par = _check_plan_parallel(llm, setting)
    shard = _check_llm_shard(doc, llm, par, setting)
    fabrics = as_table(llm["fabrics"], "llm.fabrics")
    times = as_table(doc["iteration_time_s"], "iteration_time_s")
    seed = _check_llm_search(llm, fabrics, times)
    for name, f in fabrics.items():
        _check_llm_fabric(doc, name, f, par, shard, seed, setting)
    _check_gap_to_ideal(doc, times)
    check_folder_keys(doc)


def _check_llm_job(doc: dict) -> _Setting:
    """The cluster and job valid as a config's, the model a transformer, the global
    batch derived."""
    cluster, job = cluster_job_of(doc)
    model = model_of(job)
    if not is_transformer(model):
        raise bad_field("job.model", job.model, "an LLM plan needs a gpt or moe model")
    batch = as_int(doc["job"].get("global_batch"), "job.global_batch", 1)
    if batch != job.global_batch(cluster):
        raise bad_field("job.global_batch", batch, f"but servers x gpus_per_server x "
                        f"batch_per_gpu is {job.global_batch(cluster)}")
    return _Setting(cluster, job, transformer_shape(model), batch)


def _check_plan_parallel(llm: dict, s: _Setting) -> LLMParallel:
    """``llm.model`` the job's; the plan's parallelism valid and within memory, its
    ``memory_per_gpu`` derived again."""
    shape = s.shape
    check_same_table(llm["model"], {"params": shape.params, "active_params": shape.active_params,
                                    "training_flops_per_token": shape.training_flops_per_token()},
                     "llm.model", "the job's model")
    par = _check_parallel(llm["parallel"], "llm.parallel", shape, s.cluster, s.job)
    mem = memory_per_gpu(shape, par, s.batch, s.job.dtype_bytes, s.cluster.gpu.memory)
    check_same_table(llm["memory_per_gpu"], {"stage": mem.stage, "weights": mem.weights,
                                             "gradients": mem.gradients,
                                             "optimizer": mem.optimizer,
                                             "activations": mem.activations, "total": mem.total,
                                             "capacity": mem.capacity},
                     "llm.memory_per_gpu", "llm.parallel")
    return par


@dataclass(frozen=True)
class _Shard:
    """The checked shard of an LLM plan and the plan's traffic on it."""

    topology: Any
    rings: dict
    routes: Any
    traffic: LLMTraffic


def _check_llm_shard(doc: dict, llm: dict, par: LLMParallel, s: _Setting) -> _Shard:
    """The topology, with rings exactly for the plan's DP groups and routes that
    TopologyFinder's check accepts for its traffic; the launch order keeps the traffic
    on the shard, and the placement is derived again in it."""
    cluster = s.cluster
    topo = check_topology_of(doc, cluster)
    t = llm_traffic(s.shape, par, cluster.servers, cluster.gpus_per_server, s.batch,
                    s.job.dtype_bytes)
    traffic = finder_traffic(t)
    rings = check_rings_of(doc, topo, traffic)
    if set(rings) != {g.members for g in traffic.allreduce}:
        missing = sorted({g.members for g in traffic.allreduce} - set(rings))
        raise bad_field("rings", f"{len(rings)} groups",
                        f"every DP group needs a ring; "
                        f"{list(missing[0]) if missing else '?'} has none")
    routes = routes_of(doc)
    check_shard_of(doc, topo, rings, routes, traffic)
    order = launch_order(rings, cluster.servers)
    if not launch_preserves_traffic(t, order):
        raise bad_field("rings", "the largest group's first ring",
                        "launches the servers (rank_order.txt) in an order that moves the "
                        "stages and groups off the shard built for them")
    check_same_table(llm["placement"], placement(par, cluster.gpus_per_server, order),
                     "llm.placement", "llm.parallel and the launch order")
    return _Shard(topo, rings, routes, t)


def _check_llm_search(llm: dict, fabrics: dict, times: dict) -> int:
    """``llm.fabrics`` those of ``iteration_time_s``, ``topoopt`` among them; the search
    record's keys, and every fabric keeping the values it was told to keep; returns the
    fabric seed."""
    if "topoopt" not in fabrics or set(fabrics) != set(times):
        raise bad_field("llm.fabrics", sorted(fabrics), "must be the fabrics of "
                                                        "iteration_time_s, topoopt among them")
    search = as_table(llm["search"], "llm.search", ("space", "feasible", "top", "fabric_seed",
                                                    "fixed", "candidates"))
    seed = as_int(search["fabric_seed"], "llm.search.fabric_seed", 0)
    for key, value in as_table(search["fixed"], "llm.search.fixed").items():
        for name, f in llm["fabrics"].items():
            par = as_table(as_table(f, f"llm.fabrics.{name}").get("parallel"),
                           f"llm.fabrics.{name}.parallel")
            # to_dict leaves out a field at its default; an unpipelined layout has no edges
            got = par.get(key, _PARALLEL_DEFAULTS.get(key))
            if key == "edge_layers" and par.get("pp") == 1:
                value = 0
            if got != value:
                raise bad_field(f"llm.fabrics.{name}.parallel.{key}", got,
                                f"but the search was told to keep {key} = {value!r}")
    return seed


def _check_llm_fabric(doc: dict, name: str, f: Any, par: LLMParallel, shard: _Shard,
                      seed: int, s: _Setting) -> None:
    """One fabric's parallelism valid (the plan's on TopoOpt), its iteration's parts,
    MFU and bytes per kind derived again (the TopoOpt shard on the stored topology,
    rings and routes, the others built from the catalog with the plan's fabric seed),
    its time the iteration's and its cost positive."""
    cluster, shape, times = s.cluster, s.shape, doc["iteration_time_s"]
    where = f"llm.fabrics.{name}"
    if name not in FABRICS or FABRICS[name].reconfigurable:
        raise bad_field(where, name, "is not a fixed fabric of the catalog")
    f = as_table(f, where, ("title", "parallel", "iteration", "network_bytes", "nvlink_bytes",
                            "allreduce_degree", "tried"))
    fpar = _check_parallel(f["parallel"], f"{where}.parallel", shape, cluster, s.job)
    if name == "topoopt":
        if fpar != par:
            raise bad_field(f"{where}.parallel", fpar.label(),
                            f"but llm.parallel is {par.label()}")
        fabric = direct_connect(shard.topology, shard.routes, name="topoopt", rings=shard.rings)
        ft, fr = shard.traffic, shard.rings
    else:
        fabric = build_fabric(name, cluster, seed=seed)
        ft = llm_traffic(shape, fpar, cluster.servers, cluster.gpus_per_server, s.batch,
                         s.job.dtype_bytes)
        fr = None
    it = llm_iteration(shape, fpar, cluster, s.batch, s.job.precision, ft,
                       fabric_comm_times(ft, fabric, fr))
    check_same_table(f["iteration"], _iteration_json(it, fpar), f"{where}.iteration",
                     "the parallelism on this fabric")
    check_same_table(f["network_bytes"], ft.network_bytes(), f"{where}.network_bytes",
                     "the parallelism's traffic")
    check_same_table(f["nvlink_bytes"], ft.nvlink_bytes(), f"{where}.nvlink_bytes",
                     "the parallelism's traffic")
    check_same(as_number(times[name], f"iteration_time_s.{name}"), it.total,
               f"iteration_time_s.{name}", f"{where}.iteration")
    as_int(f["tried"], f"{where}.tried", 1)
    if not set(KINDS) <= set(f["network_bytes"]) <= {*KINDS, "cp"}:   # cp: optional
        raise bad_field(f"{where}.network_bytes", sorted(f["network_bytes"]),
                        f"must have {', '.join(KINDS)}")
    cost = as_table(doc["cost"], "cost")
    if name not in cost:
        raise PlanCheckError(f"plan.json has no cost.{name}")
    as_number(cost[name], f"cost.{name}", positive=True)


def _check_gap_to_ideal(doc: dict, times: dict) -> None:
    """``gap_to_ideal`` derived, where the plan has the Ideal Switch, which no fabric
    beats."""
    gap = as_table(doc["gap_to_ideal"], "gap_to_ideal")
    if "ideal" in times:
        for name, value in times.items():
            if name not in gap:
                raise PlanCheckError(f"plan.json has no gap_to_ideal.{name}")
            check_same(as_number(gap[name], f"gap_to_ideal.{name}"), value / times["ideal"],
                       f"gap_to_ideal.{name}", "iteration_time_s")
            if value < times["ideal"] * (1 - 1e-9):
                raise bad_field(f"iteration_time_s.{name}", value,
                                f"is faster than the Ideal Switch ({times['ideal']:.6g} s), "
                                "which bounds every fabric")
