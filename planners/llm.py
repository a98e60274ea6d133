"""Plan an LLM or MoE training job: degrees, micro-batches, placement, and the shard's topology.

:func:`plan_llm` is what :func:`topoopt.plan` runs for a ``gpt`` or ``moe`` model (or a
preset of theirs):

1. **Degrees** (:func:`rank_parallel`): every ``(tp, pp, dp, ep)`` that uses all GPUs
   (``tp`` inside a server; and ``cp``, powers of two, for sequences of at least
   :data:`CP_MIN_SEQ` tokens), every micro-batch count ``m`` dividing a replica's
   sequences, activation recomputation off or full, ZeRO-1 off or on, plain or
   interleaved 1F1B (``v`` of :data:`VIRTUALS` dividing the layers per stage) and
   both rank orders (:data:`~topoopt.llm.ORDERS`), is checked against the GPUs' HBM (:func:`~topoopt.llm.memory_per_gpu`) and timed on
   the Ideal Switch in closed form (:func:`~topoopt.llm.ideal_comm_times`). ZeRO-1 moves
   the same bytes (reduce-scatter + all-gather) but overlaps differently, so both are
   timed and the faster kept (off on a tie).
   Exhaustive: a few thousand candidates, each in about a millisecond.
2. **Placement and fabrics** (:func:`evaluate_fabric`): the ``top`` fastest candidates
   are timed on every fabric on its routed links (:mod:`topoopt.llm.fabric`); the rank
   order is the placement (which servers form each stage, DP group and expert group:
   ``tp-dp-pp`` puts a stage's replicas on neighbouring servers, ``tp-pp-dp`` a
   replica's stages). On the TopoOpt shard each candidate gets its own topology:
   TopologyFinder (TopoOpt §4, Algorithm 1) receives the DP groups as AllReduce groups
   (one per stage, or per stage and expert rank) and the PP and EP bytes as MP demand,
   for every split of the ``d`` ports between them, and the fastest is kept -- the
   co-optimization of strategy and topology, here by enumeration instead of MCMC,
   because the LLM space is small and structured.

Every fabric keeps its own best candidate; the plan's strategy is the TopoOpt shard's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from topoopt._require import (
    require_callable,
    require_instance,
    require_int,
    require_names,
    require_seed,
)
from topoopt.cluster import Cluster, Job
from topoopt.config import PLAN_DEFAULTS, require_finder_kwargs
from topoopt.errors import ConfigError
from topoopt.executor import Executor
from topoopt.fabrics.catalog import FABRICS, build_fabric
from topoopt.fabrics.cost import DEFAULT_PRICES, PriceTable, fabric_cost
from topoopt.fabrics.direct import direct_connect
from topoopt.finder.topology_finder import TopologyPlan, topology_finder_accepting
from topoopt.interrupt import stop_requested
from topoopt.llm import (
    HBM_USABLE,
    ORDERS,
    LLMIteration,
    LLMParallel,
    LLMTraffic,
    MemoryBreakdown,
    finder_traffic,
    ideal_comm_times,
    llm_iteration,
    llm_traffic,
    memory_per_gpu,
)
from topoopt.llm.fabric import fabric_comm_times
from topoopt.llm.iteration import CommTimes
from topoopt.llm.parallel import stage_layers
from topoopt.plans.llm import LLMFabricResult, LLMPlan, launch_order, launch_preserves_traffic
from topoopt.workloads import model_of
from topoopt.workloads.gpt import TransformerShape, transformer_shape

__all__ = ["LLMCandidate", "LLMFabricResult", "LLMPlan", "enumerate_parallel", "rank_parallel",
           "evaluate_fabric", "plan_llm", "time_on_fabric", "TOP", "FIXABLE", "SWITCHES",
           "check_fixed", "CP_MIN_SEQ"]

#: Candidates of the degree search timed on every fabric.
TOP = 6


@dataclass(frozen=True)
class LLMCandidate:
    """A parallelism that fits, with its memory and its Ideal Switch iteration."""

    parallel: LLMParallel
    memory: MemoryBreakdown
    ideal: LLMIteration


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


#: Shortest sequence (tokens) for which the search also tries context parallelism
#: (``cp`` of 2, 4, 8, ... dividing the GPUs of a ``tp`` group's column, ``2 cp``
#: dividing the sequence). Llama 3 405B trained its 8K-token stage with ``cp = 1`` and
#: turned CP 16 on for 128K (Grattafiori et al., Table 4); Megatron-Core documents CP
#: for long sequences. At 16K and beyond a layer's activations per sequence pass a GB
#: on most models; below it the search space, and every plan, stay as they were.
CP_MIN_SEQ = 16384


def _cp_degrees(shape: TransformerShape, gpus: int) -> list[int]:
    """Context-parallel degrees the search tries for ``gpus`` GPUs outside the tensor
    group: 1, and below :data:`CP_MIN_SEQ` nothing else."""
    if shape.seq < CP_MIN_SEQ:
        return [1]
    out, cp = [], 1
    while cp <= gpus:
        if gpus % cp == 0 and (cp == 1 or shape.seq % (2 * cp) == 0):
            out.append(cp)
        cp *= 2
    return out


#: Interleaved chunks per stage the search tries (Llama 3 405B's layout gains ~35 %
#: over v = 1; a v must divide the layers per stage).
VIRTUALS = (1, 2, 3, 4, 6, 8)


def enumerate_parallel(shape: TransformerShape, cluster: Cluster, global_batch: int,
                       virtuals: Sequence[int] = VIRTUALS, edge_layers: int = 0
                       ) -> list[LLMParallel]:
    """Every valid parallelism (:func:`~topoopt.llm.check_parallel`) of the search
    space (module notes), ZeRO-1 off; ``cp > 1`` only for sequences of at least
    :data:`CP_MIN_SEQ` tokens. With ``edge_layers``, every pipelined layout (``pp >
    1``) has that many layers fewer on its first and last stage (Llama 3 §3.3.2), and
    its chunks are counted over ``layers + 2 edge_layers``."""
    g, total = cluster.gpus_per_server, cluster.servers * cluster.gpus_per_server
    out = []
    for tp in _divisors(g):
        if shape.heads % tp or (shape.kv_heads % tp and tp % shape.kv_heads):
            continue
        for cp in _cp_degrees(shape, total // tp):
            for pp in _divisors(total // tp // cp):
                dp = total // tp // cp // pp
                if global_batch % dp:
                    continue
                out += _layouts(shape, tp, cp, pp, dp, global_batch, virtuals,
                                edge_layers if pp > 1 else 0)
    return out


def _layouts(shape: TransformerShape, tp: int, cp: int, pp: int, dp: int,
             global_batch: int, virtuals: Sequence[int], edge: int = 0) -> list[LLMParallel]:
    """The candidates of one ``(tp, cp, pp, dp)``: every ``v``, ``ep``, ``m``,
    recomputation and rank order (``edge`` layers fewer on the edge stages)."""
    out = []
    layers = shape.layers + 2 * edge
    for v in virtuals:
        if pp * v > layers or (v > 1 and (pp == 1 or layers % (pp * v))):
            continue
        if edge and (min(stage_layers(shape.layers, pp, v, edge)) < 1
                     or layers // (pp * v) < edge):
            continue       # an edge chunk may be empty, a stage may not
        for ep in (_divisors(dp) if shape.moe else [1]):
            if shape.moe and shape.experts % ep:
                continue
            for m in _divisors(global_batch // dp):
                for recompute in ("none", "full"):
                    for order in (ORDERS if pp > 1 and dp > 1 else ORDERS[:1]):
                        out.append(LLMParallel(tp, pp, dp, ep, m, False, recompute,
                                               order, v, cp=cp, edge_layers=edge))
    return out


def _fits(shape, par, batch, dtype, memory, zero1: bool | None = None
          ) -> list[tuple[LLMParallel, MemoryBreakdown]]:
    """``par`` with ZeRO-1 off and on (dp > 1; only ``zero1`` when given), those that
    fit: with the overlapped reduce-scatter and all-gather ZeRO-1 can also be the
    faster one."""
    out = []
    tried = (False, True) if par.dp > 1 else (False,)
    for z1 in (tried if zero1 is None else [z for z in tried if z == zero1]):
        z = replace(par, zero1=z1)
        mem = memory_per_gpu(shape, z, batch, dtype, memory)
        if mem.fits:
            out.append((z, mem))
    return out


def time_on_fabric(shape: TransformerShape, par: LLMParallel, cluster: Cluster, job: Job,
                   fabric=None, rings=None) -> tuple[LLMIteration, CommTimes, LLMTraffic]:
    """``par``'s iteration on ``fabric`` (the Ideal Switch in closed form when None)."""
    batch = job.global_batch(cluster)
    t = llm_traffic(shape, par, cluster.servers, cluster.gpus_per_server, batch,
                    job.dtype_bytes)
    comm = ideal_comm_times(t, cluster) if fabric is None else fabric_comm_times(t, fabric, rings)
    return llm_iteration(shape, par, cluster, batch, job.precision, t, comm), comm, t


#: What ``[plan] parallel = {...}`` may fix (the rest is searched).
FIXABLE = ("tp", "pp", "dp", "ep", "micro_batches", "virtual", "recompute", "order", "cp")
#: What ``[plan] parallel`` may switch on for every layout: memory savings the search
#: leaves off (:class:`~topoopt.llm.LLMParallel` has what each does), and ``zero1``,
#: which it otherwise tries both ways. ``edge_layers`` applies to pipelined layouts
#: only (``pp > 1``; Llama 3 405B: ``{edge_layers = 1, shard_grads = true}``).
SWITCHES = ("zero1", "shard_grads", "edge_layers", "recompute_norms", "recompute_act")


def check_fixed(fixed: Mapping | None) -> dict:
    """Validate ``[plan] parallel``: degrees the search must keep (:data:`FIXABLE`) and
    switches every layout gets (:data:`SWITCHES`).

    Raises
    ------
    ConfigError
        ``plan.parallel.KEY`` for an unknown key or a bad value.
    """
    fixed = dict(fixed or {})
    for key, value in fixed.items():
        where = f"plan.parallel.{key}"
        if key not in FIXABLE + SWITCHES:
            raise ConfigError(where, value, f"unknown key; fix some of {', '.join(FIXABLE)} "
                                            f"or switch {', '.join(SWITCHES)}")
        if key in ("recompute", "order"):
            allowed = ("none", "full") if key == "recompute" else ORDERS
            if value not in allowed:
                raise ConfigError(where, value, f"use one of {', '.join(allowed)}")
        elif key == "edge_layers":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(where, value, "must be 0 or a positive integer")
        elif key in SWITCHES:
            if not isinstance(value, bool):
                raise ConfigError(where, value, "must be true or false")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(where, value, "must be a positive integer")
    return fixed


def rank_parallel(shape: TransformerShape, cluster: Cluster, job: Job,
                  fixed: Mapping | None = None) -> tuple[list[LLMCandidate], int]:
    """Every parallelism that fits, fastest first on the Ideal Switch, and how many
    were enumerated (those with the ``fixed`` values only, :func:`check_fixed`).

    Raises
    ------
    ConfigError
        ``cluster.servers`` when none fits, naming the least memory any needs and what
        to change.
    """
    batch = job.global_batch(cluster)
    fixed = check_fixed(fixed)
    degrees = {k: v for k, v in fixed.items() if k in FIXABLE}
    # every layout runs the job's attention kernel (``[job] attention``) and the switches
    switches = {k: v for k, v in fixed.items() if k in SWITCHES and k not in ("zero1",
                                                                             "edge_layers")}
    space = [replace(p, attention=job.attention, **switches)
             for p in enumerate_parallel(shape, cluster, batch,
                                         edge_layers=fixed.get("edge_layers", 0))
             if all(getattr(p, k) == v for k, v in degrees.items())]
    if not space:
        raise ConfigError("plan.parallel", fixed,
                          f"no parallelism of {job.model} on {cluster.servers} x "
                          f"{cluster.gpus_per_server} GPUs has these values; relax some")
    fitting, least = [], None
    for par in space:
        found = _fits(shape, par, batch, job.dtype_bytes, cluster.gpu.memory,
                      fixed.get("zero1"))
        if not found:
            z = replace(par, zero1=fixed.get("zero1", par.dp > 1))
            mem = memory_per_gpu(shape, z, batch, job.dtype_bytes, cluster.gpu.memory)
            if least is None or mem.total < least[1].total:
                least = (z, mem)
            continue
        # ZeRO-1 moves the same bytes: one traffic and its times for both
        t = llm_traffic(shape, par, cluster.servers, cluster.gpus_per_server, batch,
                        job.dtype_bytes)
        comm = ideal_comm_times(t, cluster)
        timed = [(llm_iteration(shape, z, cluster, batch, job.precision, t, comm), z.zero1, z, m)
                 for z, m in found]
        it, _, par, mem = min(timed, key=lambda x: (x[0].total, x[1]))
        fitting.append(LLMCandidate(par, mem, it))
    if not fitting:
        if least is None:
            raise ConfigError("cluster.servers", cluster.servers,
                              f"{cluster.servers * cluster.gpus_per_server} GPUs cannot split "
                              f"a global batch of {batch} sequences into replicas; make "
                              "job.batch_per_gpu a multiple of a power of two")
        par, mem = least
        raise ConfigError(
            "cluster.servers", cluster.servers,
            f"no parallelism of {job.model} fits {HBM_USABLE * cluster.gpu.memory / 1e9:.0f} GB "
            f"usable per {cluster.gpu.name}: the least needs {mem.total / 1e9:.1f} GB "
            f"({par.label()}); add servers, lower job.batch_per_gpu or job.size.seq, or use "
            "a smaller model")
    fitting.sort(key=lambda c: (c.ideal.total, c.parallel.label()))
    return fitting, len(space)


def _member_order_first(rings: Mapping[tuple[int, ...], Sequence[tuple[int, ...]]]
                        ) -> dict[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """``rings`` with each group's member-order ring (stride 1), when it has one, first
    and starting at its smallest member: the ring NCCL runs for a communicator whose
    ranks are in server order, which keeps the launch order (``rank_order.txt``) the
    servers in order."""
    out = {}
    for members, orders in rings.items():
        # members are distinct: o is a rotation of them iff it is the one that starts
        # where members[0] sits
        first = [i for i, o in enumerate(orders)
                 if members and members[0] in o
                 and tuple(o[o.index(members[0]):]) + tuple(o[:o.index(members[0])])
                 == tuple(members)]
        if first:
            i = first[0]
            orders = (tuple(members),) + tuple(o for j, o in enumerate(orders) if j != i)
        out[members] = tuple(orders)
    return out


def _member_ring_first(plan: TopologyPlan) -> TopologyPlan:
    """``plan`` with :func:`_member_order_first` rings."""
    return replace(plan, rings=_member_order_first(plan.rings))


@dataclass(frozen=True)
class _LaunchCheck:
    """TopologyFinder's ``accept_rings`` for an LLM's traffic: False when the largest
    group (the one :func:`launch_order` follows) has rings of its own whose launch order
    would not keep the traffic; True when it has none yet (decided later)."""

    traffic: LLMTraffic
    largest: tuple[int, ...]
    servers: int

    def __call__(self, rings: Mapping) -> bool:
        if self.largest not in rings:
            return True
        first = _member_order_first({self.largest: rings[self.largest]})
        return launch_preserves_traffic(self.traffic, launch_order(first, self.servers))


@dataclass(frozen=True)
class _FinderTask:
    """One TopologyFinder run for a candidate: its traffic with ``d_ar`` ports per
    server for the DP rings (None: TopologyFinder's own split)."""

    shape: TransformerShape
    parallel: LLMParallel
    cluster: Cluster
    job: Job
    seed: int
    finder_kwargs: Mapping
    d_ar: int | None


def _finder_tasks(shape, par, cluster, job, seed, finder_kwargs) -> list[_FinderTask]:
    """Every port split of ``par``'s traffic that :func:`_topoopt` tries."""
    t = llm_traffic(shape, par, cluster.servers, cluster.gpus_per_server,
                    job.global_batch(cluster), job.dtype_bytes)
    traffic = finder_traffic(t)
    splits = ([None] if not traffic.allreduce or not traffic.mp.any()
              else [None, *range(1, cluster.nics)])
    return [_FinderTask(shape, par, cluster, job, seed, dict(finder_kwargs), d_ar)
            for d_ar in splits]


def _topoopt_split(task: _FinderTask) -> tuple | None:
    """``task.parallel`` on TopologyFinder's topology for its traffic at one port split,
    as ``(iteration, comm, plan, d_ar)``; None when the launch order of
    ``rank_order.txt`` (NCCL following the largest group's first ring) would not leave
    the traffic as planned, found from the rings before the rest of TopologyFinder runs.
    A pure function of its task, so it runs in any executor's worker; what it returns
    is small (the traffic and fabric are rebuilt for the plan kept: pickled, they are
    ~170 MB at 2,048 servers)."""
    shape, par, cluster, job = task.shape, task.parallel, task.cluster, task.job
    batch = job.global_batch(cluster)
    t = llm_traffic(shape, par, cluster.servers, cluster.gpus_per_server, batch,
                    job.dtype_bytes)
    ft = finder_traffic(t)
    largest = min((g.members for g in ft.allreduce), key=lambda m: (-len(m), m), default=())
    found = topology_finder_accepting(
        _LaunchCheck(t, largest, cluster.servers), ft, cluster.servers, cluster.nics,
        cluster.link_bandwidth, cluster.link_latency, seed=task.seed,
        allreduce_degree=task.d_ar, **task.finder_kwargs)
    if found is None:
        return None
    plan = _member_ring_first(found)
    if not launch_preserves_traffic(t, launch_order(plan.rings, cluster.servers)):
        return None
    comm = fabric_comm_times(t, _shard_fabric(plan), plan.rings)
    return llm_iteration(shape, par, cluster, batch, job.precision, t, comm), comm, plan, \
        plan.degree_allreduce


def _shard_fabric(plan: TopologyPlan):
    """The TopoOpt shard of ``plan`` as a fabric."""
    return direct_connect(plan.topology, plan.routes, optics="patch_panel", name="topoopt",
                          rings=plan.rings)


def _topoopt(shape, par, cluster, job, seed, finder_kwargs) -> list[tuple]:
    """``par`` on TopologyFinder's topology for its traffic, for every port split
    (:func:`_topoopt_split`), the shards the launch order keeps."""
    runs = [_topoopt_split(task)
            for task in _finder_tasks(shape, par, cluster, job, seed, finder_kwargs)]
    return [r for r in runs if r is not None]


def _topoopt_runs(candidates, shape, cluster, job, seed, finder_kwargs, executor):
    """``(candidate, run)`` for every candidate and port split: through ``executor``
    (every TopologyFinder run a task, spread over its workers) or, serially, stopping
    after the first candidate once a stop is requested."""
    if executor is None or executor.name == "serial":
        found = False
        for cand in candidates:
            if stop_requested() and found:
                return
            for run in _topoopt(shape, cand.parallel, cluster, job, seed, finder_kwargs):
                found = True
                yield cand, run
        return
    tasks = [(cand, task) for cand in candidates
             for task in _finder_tasks(shape, cand.parallel, cluster, job, seed,
                                       finder_kwargs)]
    for (cand, _), run in zip(tasks, executor.map(_topoopt_split, [t for _, t in tasks])):
        if run is not None:
            yield cand, run


def evaluate_fabric(name: str, candidates: Sequence[LLMCandidate], shape: TransformerShape,
                    cluster: Cluster, job: Job, prices: PriceTable = DEFAULT_PRICES,
                    seed: int = 0, finder_kwargs: Mapping | None = None,
                    executor: Executor | None = None) -> LLMFabricResult:
    """The fastest of ``candidates`` on the fabric called ``name`` (the TopoOpt shard:
    each on its own TopologyFinder topology, every port split tried, as tasks of
    ``executor`` when given; the result does not depend on it)."""
    best: tuple | None = None
    tried = 0
    fabric = None if name == "topoopt" else build_fabric(name, cluster, prices, seed)
    if name == "topoopt":
        for cand, (it, comm, plan, d_ar) in _topoopt_runs(
                candidates, shape, cluster, job, seed, dict(finder_kwargs or {}), executor):
            tried += 1
            if best is None or it.total < best[0].total:
                best = (it, comm, None, cand.parallel, plan, None, d_ar)
        if best is not None:
            par = best[3]
            t = llm_traffic(shape, par, cluster.servers, cluster.gpus_per_server,
                            job.global_batch(cluster), job.dtype_bytes)
            best = (*best[:2], t, par, best[4], _shard_fabric(best[4]), best[6])
    else:
        for cand in candidates:
            if stop_requested() and best is not None:
                break
            it, comm, t = time_on_fabric(shape, cand.parallel, cluster, job, fabric)
            tried += 1
            if best is None or it.total < best[0].total:
                best = (it, comm, t, cand.parallel, None, fabric, None)
    if best is None:
        raise ConfigError("plan.parallel", candidates[0].parallel.label(),
                          f"no candidate gives {name} a shard on which the launch order "
                          "(rank_order.txt) keeps the planned traffic; fix order = "
                          "\"tp-dp-pp\" or time more candidates (top)")
    it, comm, t, par, plan, fab, d_ar = best
    return LLMFabricResult(name, FABRICS[name].title, par, it, comm, t,
                           fabric_cost(fab, prices), plan, d_ar, tried)


def _require_arguments(cluster: object, job: object, baselines: object, prices: object,
                       top: object, source: object, fabric_seed: object,
                       finder_kwargs: Mapping | None, on_fabric: object) -> tuple[str, ...]:
    """:func:`plan_llm`'s arguments checked before any work; its baselines."""
    require_instance("cluster", cluster, Cluster)
    require_instance("job", job, Job)
    names = require_names("plan.baselines", baselines,
                          tuple(n for n in FABRICS if n != "topoopt"), '["ideal"]')
    for name in names:
        if FABRICS[name].reconfigurable:
            raise ConfigError("plan.baselines", name, "an LLM plan compares fixed fabrics; "
                              f"use some of {', '.join(PLAN_DEFAULTS.baselines)}")
    if prices is not None:
        require_instance("prices", prices, PriceTable)
    require_int("top", top, minimum=1)
    require_instance("source", source, str)
    require_seed("fabric_seed", fabric_seed)
    require_finder_kwargs(finder_kwargs or {})
    require_callable("on_fabric", on_fabric)
    return names


def plan_llm(cluster: Cluster, job: Job, *, baselines: Sequence[str] = PLAN_DEFAULTS.baselines,
             prices: PriceTable | None = None, top: int = TOP, source: str = "",
             fabric_seed: int = 0, finder_kwargs: Mapping | None = None,
             on_fabric: Callable[[str, float, str], None] | None = None,
             fixed: Mapping | None = None, executor: Executor | None = None) -> LLMPlan:
    """Plan an LLM job on the TopoOpt shard and on every baseline fabric.

    Parameters
    ----------
    cluster, job : Cluster, Job
        ``job.model`` is ``gpt``, ``moe`` or a preset of theirs; the global batch is
        ``servers x gpus_per_server x batch_per_gpu`` sequences.
    baselines : sequence of str
        Fabrics compared with the TopoOpt shard.
    prices : PriceTable, optional
    top : int
        Candidates of the degree search timed on every fabric.
    source : str
        The config's path, for the plan.
    fabric_seed : int
        The Expander's graph and TopologyFinder's tie-breaks.
    finder_kwargs : mapping, optional
        TopologyFinder options (``routing``, ``k_paths``, ...).
    on_fabric : callable, optional
        ``on_fabric(name, seconds, how)`` as each fabric is done.
    fixed : mapping, optional
        Values of :data:`FIXABLE` the search keeps (a config's ``[plan] parallel``).
    executor : Executor, optional
        Runs the TopoOpt shard's TopologyFinder runs (every candidate and port split)
        as tasks (:func:`topoopt.executor.make_executor`); in this process by
        default. The plan does not depend on it.

    Returns
    -------
    LLMPlan

    Examples
    --------
    >>> from topoopt import Cluster, Job
    >>> c = Cluster(servers=4, nics=4, link_bandwidth=100e9, gpus_per_server=4)
    >>> j = Job("llama3-8b", 2, "bf16", size={"layers": 4, "seq": 512})
    >>> p = plan_llm(c, j, top=2)
    >>> p.iteration_time_s["ideal"] <= min(p.iteration_time_s.values())
    True
    """
    baselines = _require_arguments(cluster, job, baselines, prices, top, source, fabric_seed,
                                   finder_kwargs, on_fabric)
    model = model_of(job)
    shape = transformer_shape(model)
    prices = prices or DEFAULT_PRICES
    fixed = check_fixed(fixed)
    ranked, space = rank_parallel(shape, cluster, job, fixed)
    shortlist: list[LLMCandidate] = []
    seen = set()
    for cand in ranked:   # the best of each (tp, pp, dp, ep); orders kept for placement
        key = (cand.parallel.tp, cand.parallel.pp, cand.parallel.dp, cand.parallel.ep,
               cand.parallel.order)
        if key not in seen:
            seen.add(key)
            shortlist.append(cand)
        if len(shortlist) >= top:
            break
    results = []
    for name in ("topoopt", *dict.fromkeys(baselines)):
        r = evaluate_fabric(name, shortlist, shape, cluster, job, prices, fabric_seed,
                            finder_kwargs, executor)
        results.append(r)
        if on_fabric is not None:
            on_fabric(name, r.iteration.total, f"{r.tried} timed")
    return LLMPlan(cluster, job, model, shape, tuple(results), tuple(shortlist), space,
                   len(ranked), source, fabric_seed, top, fixed)
