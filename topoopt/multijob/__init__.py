"""Shared clusters: many jobs at once (TopoOpt §5, "Shared cluster", Fig. 16).

A cluster of many jobs (:mod:`~topoopt.multijob.config`: the cluster, the fabrics and
the job mix), their servers (:mod:`~topoopt.multijob.placement`), a plan per distinct
job and fabric (:mod:`~topoopt.multijob.plans`, through :func:`topoopt.plan`) and
every job's iterations simulated at once on the flow-level simulator
(:mod:`~topoopt.multijob.simulation`): on TopoOpt each job on its own shard, on a
Fat-tree all jobs on the shared switches. ``topoopt cluster CONFIG`` runs it.
"""

from topoopt.multijob.config import (
                                     ClusterConfig,
                                     JobClass,
                                     JobSpec,
                                     load_cluster_config,
                                     parse_cluster_config,
                                     split_jobs,
)
from topoopt.multijob.placement import PLACEMENTS, check_placement, place_jobs
from topoopt.multijob.plans import JobPlan, plan_jobs
from topoopt.multijob.simulation import (
                                     ClusterRun,
                                     JobRun,
                                     PlacedJob,
                                     run_iterations,
                                     simulate_cluster,
                                     simulate_fabrics,
                                     stack_iterations,
)

__all__ = ["ClusterConfig", "JobClass", "JobSpec", "load_cluster_config",
           "parse_cluster_config", "split_jobs", "PLACEMENTS", "place_jobs",
           "check_placement", "JobPlan", "plan_jobs", "ClusterRun", "JobRun", "PlacedJob",
           "run_iterations", "simulate_cluster", "simulate_fabrics", "stack_iterations"]
