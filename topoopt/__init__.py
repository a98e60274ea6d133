"""topoopt: plan optical (patch-panel / OCS) network shards for distributed training.

The library's face: read a config, plan a shard, estimate an iteration, run
TopologyFinder, write and check a plan folder. A plan is a :class:`Plan` (an operator
strategy) or, for a GPT/MoE job, an :class:`LLMPlan` (a parallelism); both are
:class:`PlanLike`, which is what :func:`write_plan` and the plan folder's commands take.

>>> import topoopt
>>> cluster = topoopt.Cluster(servers=4, nics=2, link_bandwidth=100e9)
>>> job = topoopt.Job("ncf", 32, size={"tables": 4, "rows": 1000, "top_layers": 2})
>>> p = topoopt.plan(cluster, job, budget=20, rounds=1, baselines=("ideal",))
>>> sorted(p.iteration_time_s)
['ideal', 'topoopt']

README, "Use as a library", has a worked example.
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
from topoopt.plans import LLMPlan, Plan, PlanLike, plan_to_json, read_plan
from topoopt.strategy import OpConfig, Strategy, data_parallel, hybrid
from topoopt.traffic import Traffic, derive_traffic
from topoopt.workloads import MODEL_NAMES, build_model, model_of

__version__ = "0.1.0"

__all__ = ["Cluster", "Job", "GpuSpec", "GPUS", "Config", "load_config", "parse_config",
           "TopoOptError", "ConfigError", "PlanCheckError", "plan", "Plan", "LLMPlan",
           "PlanLike", "plan_to_json", "read_plan", "write_plan", "check_plan_dir",
           "estimate_iteration",
           "IterationEstimate", "topology_finder", "TopologyPlan", "Fabric", "FABRICS",
           "build_fabric", "Model", "Operator", "MODEL_NAMES", "build_model", "model_of",
           "Strategy", "OpConfig", "data_parallel", "hybrid", "Traffic", "derive_traffic",
           "__version__"]
