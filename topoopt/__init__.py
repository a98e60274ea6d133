"""topoopt: plan optical (patch-panel / OCS) network shards for distributed training.

Library entry points: :func:`load_config`, :class:`Cluster`, :class:`Job`, the
strategies in :mod:`topoopt.strategy` and the traffic model in :mod:`topoopt.traffic`.
"""

from topoopt.cluster import GPUS, Cluster, GpuSpec, Job
from topoopt.config import Config, load_config, parse_config
from topoopt.errors import ConfigError, PlanCheckError, TopoOptError

__version__ = "0.1.0"

__all__ = ["Cluster", "Job", "GpuSpec", "GPUS", "Config", "load_config", "parse_config",
           "TopoOptError", "ConfigError", "PlanCheckError", "__version__"]
