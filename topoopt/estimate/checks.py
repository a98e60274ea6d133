"""Input checks of the estimator's entry points: one line naming the bad parameter.

The planner's hot path builds graphs of strategies its own space made, so the
builder checks little per graph; the library's entry points
(:func:`~topoopt.estimate.iteration.estimate_iteration`,
:func:`~topoopt.estimate.builder.build_iteration`) check their arguments first, so a
strategy that does not fit the cluster fails with its name instead of an
``IndexError`` deep in the build.
"""

from __future__ import annotations

from numbers import Integral

from topoopt._require import require_instance, require_int
from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError
from topoopt.fabrics.fabric import Fabric
from topoopt.model import Model
from topoopt.strategy import OpConfig, Strategy

__all__ = ["check_estimate_inputs"]


def check_estimate_inputs(model: Model, strategy: Strategy, cluster: Cluster, job: Job,
                          fabric: Fabric, seed: int = 0) -> None:
    """Raise :class:`TypeError` or :class:`~topoopt.errors.ConfigError` unless the
    arguments describe one estimable iteration.

    Checks the types; one config per operator; each config's ``dp x mp`` distinct
    server ids within the cluster; a fabric with the cluster's servers; an integer
    seed.
    """
    for name, value, kind in (("model", model, Model), ("strategy", strategy, Strategy),
                              ("cluster", cluster, Cluster), ("job", job, Job),
                              ("fabric", fabric, Fabric)):
        require_instance(name, value, kind)
    require_int("seed", seed)
    ops = model.operators
    if len(strategy.configs) != len(ops):
        raise ConfigError("strategy", len(strategy.configs),
                          f"needs one config per operator ({len(ops)})")
    n = cluster.servers
    seen: set[int] = set()     # configs are shared between operators: check each once
    for op, cfg in zip(ops, strategy.configs):
        if id(cfg) in seen:
            continue
        seen.add(id(cfg))
        where = f"strategy[{op.name}]"
        require_instance(where, cfg, OpConfig)
        if cfg.dp < 1 or cfg.mp < 1 or len(cfg.servers) != cfg.dp * cfg.mp:
            raise ConfigError(f"{where}.servers", list(cfg.servers),
                              f"needs dp*mp = {cfg.dp}*{cfg.mp} distinct servers")
        if any(isinstance(s, bool) or not isinstance(s, Integral) or not 0 <= s < n
               for s in cfg.servers):
            raise ConfigError(f"{where}.servers", list(cfg.servers),
                              f"server ids must be integers in 0..{n - 1} (the cluster "
                              f"has {n} servers)")
        if len(set(cfg.servers)) != len(cfg.servers):
            raise ConfigError(f"{where}.servers", list(cfg.servers), "servers must be distinct")
    if fabric.servers != n:
        raise ConfigError("fabric", fabric.servers,
                          f"has {fabric.servers} servers but the cluster has {n}")
