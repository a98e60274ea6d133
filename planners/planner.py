"""Plan a job's optical shard: co-optimized strategy and topology, compared with every fabric.

:func:`plan` is the library call behind ``topoopt plan CONFIG -o DIR`` (and
``topoopt.plan``): alternating optimization (TopoOpt §4) for the TopoOpt shard, and an
MCMC search with the same budget on each baseline fabric (Ideal Switch,
cost-equivalent Fat-tree, 2:1 oversubscribed Fat-tree, Expander; §5), so every fabric
is compared with its own best strategy.
"""

from __future__ import annotations

from typing import Callable, Sequence

from topoopt.cluster import Cluster, Job
from topoopt.errors import ConfigError
from topoopt.executor import Executor, SerialExecutor
from topoopt.fabrics.catalog import FABRICS, build_fabric
from topoopt.fabrics.cost import DEFAULT_PRICES, PriceTable, fabric_cost
from topoopt.interrupt import stop_requested
from topoopt.planners.alternating import (
    ChainTask,
    alternating_optimization,
    run_chain,
    search_fabric,
    start_strategy,
    topoopt_fabric,
)
from topoopt.planners.cost import IterationCost
from topoopt.planners.space import StrategySpace
from topoopt.plans.document import BASELINES, FabricResult, Plan
from topoopt.workloads import model_of

__all__ = ["plan"]


def plan(cluster: Cluster, job: Job, *, budget: int = 400, rounds: int = 3, chains: int = 1,
         seed: int = 0, baselines: Sequence[str] = BASELINES, executor: Executor | None = None,
         prices: PriceTable | None = None,
         finder_kwargs: dict | None = None, source: str = "",
         progress: Callable[[str, int, float], None] | None = None) -> Plan:
    """Co-optimize a job's strategy and its shard's topology, and compare fabrics.

    Parameters
    ----------
    cluster : Cluster
    job : Job
    budget : int
        MCMC moves per chain per round. Each baseline gets ``budget x rounds`` moves
        per chain, the most the TopoOpt alternation can spend.
    rounds : int
        k, rounds of alternating optimization.
    chains : int
        Independent MCMC chains (different seeds); the best is kept.
    seed : int
    baselines : sequence of str
        Fabrics to compare (default: ideal, fattree, oversub, expander).
    executor : Executor, optional
        :func:`topoopt.executor.make_executor`; serial by default. The result does
        not depend on it.
    prices : PriceTable, optional
        Cost model prices (:func:`topoopt.fabrics.cost.price_table`).
    finder_kwargs : dict, optional
        TopologyFinder options (``routing``, ``k_paths``, ``primes_only``, ``mp_decay``).
    source : str
        Config path, echoed in the plan.
    progress : callable, optional
        ``progress(stage, moves_done, best_seconds)``.

    Returns
    -------
    Plan

    Examples
    --------
    >>> from topoopt import Cluster, Job
    >>> p = plan(Cluster(servers=4, nics=2, link_bandwidth=100e9),
    ...          Job("ncf", 32, size={"tables": 4, "rows": 1000, "top_layers": 2}),
    ...          budget=20, rounds=1)
    >>> p.fabric("topoopt").estimate.total <= p.search.start_time
    True
    """
    for field, value, low in (("plan.budget", budget, 0), ("plan.rounds", rounds, 1),
                              ("plan.chains", chains, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(field, value, f"must be an integer >= {low}")
    for name in baselines:
        if name not in FABRICS or name == "topoopt":
            raise ConfigError("plan.baselines", name,
                              f"use some of {', '.join(n for n in FABRICS if n != 'topoopt')}")
    prices = prices or DEFAULT_PRICES
    executor = executor or SerialExecutor()
    model = model_of(job)
    space = StrategySpace.build(model, cluster, job)
    start = start_strategy(model, cluster, job, space)

    # Baselines: each its own search with the same per-chain budget, all through the executor.
    results = []
    tasks = [ChainTask(cluster, job, start, budget * rounds, seed * 1000 + 900 + c,
                       fabric=name, prices=prices, fabric_seed=seed)
             for name in baselines for c in range(chains)]
    if stop_requested():
        tasks = [ChainTask(t.cluster, t.job, t.start, 0, t.seed, t.fabric, prices=prices,
                           fabric_seed=seed) for t in tasks]
    if executor.name == "serial":
        found = []
        for t in tasks:
            stage = f"{t.fabric} search"
            found.append(search_fabric([t], executor,
                                       (lambda m, b, s=stage: progress(s, m, b))
                                       if progress else None))
    else:
        found = executor.map(run_chain, tasks)
    for i, name in enumerate(baselines):
        mine = found[i * chains:(i + 1) * chains]
        best = min(mine, key=lambda r: (r.best_time, r.seed))
        fab = build_fabric(name, cluster, prices, seed, job=job, model=model, strategy=start)
        est = IterationCost(model, cluster, job, fab, seed=seed).estimate(best.best)
        results.append(FabricResult(name, FABRICS[name].title, best.best, est,
                                    fabric_cost(fab, prices), best.start_time,
                                    sum(r.moves for r in mine)))

    # TopoOpt last: the baselines' best strategies may seed its first round.
    search = alternating_optimization(model, cluster, job, start, rounds=rounds, budget=budget,
                                      chains=chains, seed=seed, executor=executor,
                                      finder_kwargs=finder_kwargs,
                                      seeds={r.name: r.strategy for r in results},
                                      progress=progress)
    fabric = topoopt_fabric(search.topology_plan)
    est = IterationCost(model, cluster, job, fabric, search.topology_plan.rings).estimate(
        search.strategy)
    results.insert(0, FabricResult("topoopt", FABRICS["topoopt"].title, search.strategy, est,
                                   fabric_cost(fabric, prices), search.start_time, search.moves))
    return Plan(cluster, job, model, search.topology_plan, tuple(results), search, seed,
                budget, rounds, chains, source)
