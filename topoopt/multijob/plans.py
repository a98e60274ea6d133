"""Each distinct job of a shared cluster planned once, for every fabric compared.

A job's strategy depends on the fabric it runs on, so every fabric gets its own: with
``[plan] strategy = "plan"``, :func:`topoopt.plan` on the job's shard (``servers`` of
the cluster's servers, d NICs of B) searches a strategy per baseline fabric and
co-optimizes the TopoOpt shard's strategy and topology (TopoOpt §4); with ``hybrid``
or ``dp`` that strategy is used everywhere and TopologyFinder plans the shard for its
traffic (the ``topoopt`` fabric of :mod:`topoopt.fabrics.catalog`). Jobs with the same
model, batch, precision, size and servers share one plan (a cluster of 27 jobs has 4
distinct ones in TopoOpt Fig. 16), and the distinct plans run through the project's
executor (process pool or Ray).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from topoopt._require import require_callable, require_instance, require_names
from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError
from topoopt.estimate import estimate_iteration
from topoopt.executor import Executor, SerialExecutor
from topoopt.fabrics.catalog import FABRICS, build_fabric
from topoopt.fabrics.fabric import Fabric
from topoopt.multijob.config import ClusterConfig
from topoopt.planners.alternating import topoopt_fabric
from topoopt.planners.planner import plan
from topoopt.plans import Plan
from topoopt.strategy import Strategy, data_parallel, hybrid
from topoopt.workloads import model_of

__all__ = ["JobPlan", "PlanTask", "plan_job", "plan_jobs", "job_key"]


@dataclass(frozen=True)
class JobPlan:
    """One kind of job on one fabric: the strategy it runs and, on TopoOpt, its shard.

    Attributes
    ----------
    job : Job
    cluster : Cluster
        The job's shard (its servers, the cluster's d, B and GPUs).
    fabric : str
        Catalog name.
    strategy : Strategy
    shard : Fabric, optional
        The job's own direct-connect fabric (TopoOpt); None on a shared fabric.
    planned_s : float
        The planner's iteration time of the strategy on that fabric built for the job
        alone (its shard, or a fabric of the job's size): a reference, not the shared
        cluster's time.
    method : str
        ``plan``, ``hybrid`` or ``dp``.
    """

    job: Job
    cluster: Cluster
    fabric: str
    strategy: Strategy
    shard: Fabric | None
    planned_s: float
    method: str


@dataclass(frozen=True)
class PlanTask:
    """Everything :func:`plan_job` needs (picklable, for process pools and Ray)."""

    job: Job
    cluster: Cluster
    fabrics: tuple[str, ...]
    plan: Any                 # the config's [plan] table


def job_key(job: Job, servers: int) -> tuple:
    """Identity of a kind of job: jobs with equal keys share a plan."""
    return (job, servers)


def plan_job(task: PlanTask) -> dict[str, JobPlan]:
    """Plan one job for every fabric of ``task`` (see the module docstring)."""
    require_instance("task", task, PlanTask)
    job, cluster, settings = task.job, task.cluster, dict(task.plan)
    method = settings["strategy"]
    model = model_of(job)
    out: dict[str, JobPlan] = {}
    if method == "plan":
        shared = tuple(f for f in task.fabrics if f != "topoopt")
        p = plan(cluster, job, budget=settings["budget"], rounds=settings["rounds"],
                 chains=settings["chains"], seed=settings["seed"], baselines=shared)
        if not isinstance(p, Plan):
            raise ConfigError("job.model", job.model, "an LLM job's plan has no strategy a "
                                                      "shared cluster can run")
        for name in task.fabrics:
            res = p.fabric(name)
            shard = topoopt_fabric(p.topology_plan) if name == "topoopt" else None
            out[name] = JobPlan(job, cluster, name, res.strategy, shard, res.estimate.total,
                                method)
        return out
    strategy = {"dp": data_parallel, "hybrid": hybrid}[method](model, cluster.servers)
    for name in task.fabrics:
        fabric = build_fabric(name, cluster, seed=settings["seed"], job=job, model=model,
                              strategy=strategy)
        planned = estimate_iteration(model, strategy, cluster, job, fabric).total
        out[name] = JobPlan(job, cluster, name, strategy,
                            fabric if name == "topoopt" else None, planned, method)
    return out


def plan_jobs(config: ClusterConfig, fabrics: Sequence[str] | None = None,
              executor: Executor | None = None,
              progress: Callable[[str, int, int], None] | None = None
              ) -> dict[tuple, dict[str, JobPlan]]:
    """Plan every distinct job of ``config`` once, for every fabric.

    Parameters
    ----------
    config : ClusterConfig
    fabrics : sequence of str, optional
        Default ``config.fabrics``.
    executor : Executor, optional
        Where the distinct jobs are planned (serial by default); the plans do not
        depend on it.
    progress : callable, optional
        ``progress(stage, done, total)`` after each distinct job.

    Returns
    -------
    dict
        :func:`job_key` -> fabric name -> :class:`JobPlan`.
    """
    require_instance("config", config, ClusterConfig, "load_cluster_config(path)")
    fabrics = (require_names("fabrics", fabrics, tuple(FABRICS)) if fabrics
               else config.fabrics)
    require_callable("progress", progress)
    keys: dict[tuple, PlanTask] = {}
    for spec in config.job_list():
        key = job_key(spec.job, spec.servers)
        if key not in keys:
            keys[key] = PlanTask(spec.job, config.job_cluster(spec.servers), fabrics,
                                 config.plan)
    executor = executor or SerialExecutor()
    tasks = list(keys.values())
    if executor.name == "serial":
        results = []
        for i, t in enumerate(tasks):
            results.append(plan_job(t))
            if progress:
                progress(f"planning {t.job.model}", i + 1, len(tasks))
    else:
        results = executor.map(plan_job, tasks)
        if progress:
            progress("planning", len(tasks), len(tasks))
    return dict(zip(keys, results))
