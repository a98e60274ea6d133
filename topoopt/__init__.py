"""topoopt: plan optical (patch-panel / OCS) network shards for distributed training.

The library's face: read a config, plan a shard, estimate an iteration, run
TopologyFinder, write and check a plan folder.

>>> import topoopt
>>> cfg = topoopt.load_config("configs/dlrm-16.toml")       # doctest: +SKIP
>>> p = topoopt.plan(cfg.cluster, cfg.job, budget=50, seed=0)  # doctest: +SKIP
>>> p.iteration_time_s["topoopt"]                            # doctest: +SKIP

See README, "Use as a library", for a worked example.
"""

from topoopt.cluster import GPUS, Cluster, GpuSpec, Job
from topoopt.config import Config, load_config, parse_config
from topoopt.errors import ConfigError, PlanCheckError, TopoOptError
from topoopt.estimate import IterationEstimate, estimate_iteration
from topoopt.export.plan_dir import check_plan_dir, write_plan
from topoopt.fabrics import Fabric
from topoopt.fabrics.catalog import FABRICS, build_fabric
from topoopt.finder import TopologyPlan, topology_finder
from topoopt.model import Model, Operator
from topoopt.planners.planner import plan
from topoopt.plans import Plan, plan_to_json, read_plan
from topoopt.strategy import OpConfig, Strategy, data_parallel, hybrid
from topoopt.traffic import Traffic, derive_traffic
from topoopt.workloads import MODEL_NAMES, build_model, model_of

__version__ = "0.1.0"

__all__ = ["Cluster", "Job", "GpuSpec", "GPUS", "Config", "load_config", "parse_config",
           "TopoOptError", "ConfigError", "PlanCheckError", "plan", "Plan", "plan_to_json",
           "read_plan", "write_plan", "check_plan_dir", "estimate_iteration",
           "IterationEstimate", "topology_finder", "TopologyPlan", "Fabric", "FABRICS",
           "build_fabric", "Model", "Operator", "MODEL_NAMES", "build_model", "model_of",
           "Strategy", "OpConfig", "data_parallel", "hybrid", "Traffic", "derive_traffic",
           "__version__"]
