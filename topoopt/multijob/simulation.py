"""Many jobs training at once on one flow-level simulation (TopoOpt §5, Fig. 16).

Each job's iteration is its task graph (:class:`~topoopt.estimate.IterationGraph`:
compute tasks on its servers' GPUs, MP flows, AllReduce rings), built on the fabric as
the job sees it: its own TopoOpt shard, or the shared switched fabric with the job's
servers renumbered (:func:`~topoopt.fabrics.placed_fabric`), so that its routes are
routes over the shared switches. :func:`stack_iterations` puts the iterations of every
job back to back into one graph -- iteration ``k + 1`` of a job starts when all of
iteration ``k`` is done (synchronous training), the first one after the job's *phase*
(jobs start out of phase) -- and the DAG engine (:func:`topoopt.netsim.dag.run_dag`)
runs it: max-min sharing of every link among all jobs' flows in flight.

Measurement (:func:`simulate_cluster`): with ``T`` the longest time any job's iteration
takes alone and ``o`` the latest phase, the window is ``[o, o + (iterations + 1) T]``;
every job runs iterations until past the window's end (what happens later cannot
change what happened inside), and its iterations that start and end inside the
window are measured -- so every measured iteration ran while all the jobs were running.
A job slowed down so much that none of its iterations fits extends the window (of its
group of jobs) to the end of its first iteration in it.

Jobs that share no link are independent (max-min rates split over disjoint link sets):
they are simulated separately (the TopoOpt shards, one by one), which is the same
result as one simulation of all of them (``joint=True``; a test checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from topoopt.cluster import Cluster, Job
from topoopt.errors import TopoOptError
from topoopt.estimate import EstimateCache, IterationGraph, IterationGraphBuilder
from topoopt.executor import Executor, SerialExecutor
from topoopt.fabrics.catalog import build_fabric
from topoopt.fabrics.placed import placed_fabric
from topoopt.multijob.config import ClusterConfig, JobSpec
from topoopt.multijob.placement import check_placement, place_jobs
from topoopt.multijob.plans import JobPlan, job_key
from topoopt.netsim import Network, simulate
from topoopt.netsim.dag import run_dag
from topoopt.netsim.workload import FlowRoutes
from topoopt.workloads import model_of

__all__ = ["PlacedJob", "StackedIterations", "JobRun", "ClusterRun", "stack_iterations",
           "run_iterations", "job_seed", "weighted_quantile", "build_jobs", "simulate_cluster",
           "simulate_fabrics"]


@dataclass(frozen=True)
class PlacedJob:
    """One job's iteration graph placed in the cluster.

    Attributes
    ----------
    graph : IterationGraph
        Built on the job's view of the network: servers ``0..k-1``, link ``l`` of the
        graph's routes is link ``l + link_offset`` of the network.
    servers : ndarray of int
        The cluster servers (GPU resources) of its ranks.
    link_offset : int
    phase : float
        Seconds before its first iteration starts.
    iterations : int
        Iterations run back to back.
    """

    graph: IterationGraph
    servers: np.ndarray
    link_offset: int = 0
    phase: float = 0.0
    iterations: int = 1

    def links(self) -> np.ndarray:
        """Network links its flows use."""
        g = self.graph
        rows = np.unique(g.flow_class)
        used = np.concatenate([g.routes.link[g.routes.ptr[r]:g.routes.ptr[r + 1]]
                               for r in rows.tolist()]) if rows.size else np.empty(0, np.int64)
        return np.unique(used) + self.link_offset


@dataclass(frozen=True, eq=False)
class StackedIterations:
    """Several jobs' iterations as one graph.

    Attributes
    ----------
    graph : IterationGraph
    ends : tuple of ndarray
        Per job, the node of each iteration's end (a zero-time barrier after every
        node of the iteration).
    phase : ndarray
        Per job, when its first iteration starts.
    """

    graph: IterationGraph
    ends: tuple[np.ndarray, ...]
    phase: np.ndarray

    def iteration_bounds(self, finish: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per job, (start, end) of every iteration from the simulated finish times."""
        out = []
        for ph, ends in zip(self.phase, self.ends):
            end = finish[ends]
            out.append((np.concatenate([[ph], end[:-1]]), end))
        return out


def _sources_sinks(g: IterationGraph) -> tuple[np.ndarray, np.ndarray]:
    n = g.nodes
    has_pred = np.bincount(g.dep_after, minlength=n) > 0
    has_succ = np.bincount(g.dep_before, minlength=n) > 0
    return np.flatnonzero(~has_pred), np.flatnonzero(~has_succ)


def stack_iterations(jobs: Sequence[PlacedJob]) -> StackedIterations:
    """One task graph of every job's ``iterations`` iterations, back to back.

    Node layout: the compute tasks of every (job, iteration), then one delay task per
    job (its phase, on a resource of its own), then the flows, then the barriers
    (each iteration's own, then its end barrier). Dependencies: each iteration's
    own; every node without a successor -> the iteration's end barrier -> every node
    without a predecessor of the next iteration; the delay -> those of the first.
    Resources: one per (job, iteration, server) -- a job's iterations never overlap
    and jobs never share a server's GPUs, so this is the same schedule as one resource
    per server, with short dispatch queues. Route classes
    are concatenated, their links shifted by each job's ``link_offset``; the
    iterations of a job share its classes.

    Returns
    -------
    StackedIterations
    """
    if not jobs:
        raise TopoOptError("stack_iterations needs at least one job")
    graphs = [j.graph for j in jobs]
    K = np.array([j.iterations for j in jobs], np.int64)
    if (K < 1).any():
        raise TopoOptError("every job runs at least one iteration")
    T = np.array([g.tasks for g in graphs], np.int64)
    F = np.array([g.flow_kind.size for g in graphs], np.int64)
    Bb = np.array([g.barriers + 1 for g in graphs], np.int64)      # + the end barrier
    J = len(jobs)
    ntask = int((K * T).sum()) + J
    nflow = int((K * F).sum())
    t_base = np.concatenate([[0], np.cumsum(K * T)[:-1]])
    f_base = ntask + np.concatenate([[0], np.cumsum(K * F)[:-1]])
    b_base = ntask + nflow + np.concatenate([[0], np.cumsum(K * Bb)[:-1]])
    delay = int((K * T).sum()) + np.arange(J)
    width = np.array([int(g.task_server.max()) + 1 if g.tasks else 1 for g in graphs])
    r_base = np.concatenate([[0], np.cumsum(K * width)[:-1]])
    resources = int((K * width).sum())
    server, duration, fclass, fbytes, flat, fkind, fhops, fcount = [], [], [], [], [], [], [], []
    before, after, ends = [], [], []
    class_off = 0
    routes = []
    for j, (job, g) in enumerate(zip(jobs, graphs)):
        k, t, f, b = int(K[j]), int(T[j]), int(F[j]), int(Bb[j])
        it = np.arange(k)[:, None]
        old = np.arange(g.nodes)
        # new id of node `old` in iteration 0; iteration i adds (t, f, b) per region
        base = np.where(old < t, t_base[j] + old,
                        np.where(old < t + f, f_base[j] + old - t, b_base[j] + old - t - f))
        stride = np.where(old < t, t, np.where(old < t + f, f, b))
        ids = base[None, :] + it * stride[None, :]                  # (k, nodes)
        end = b_base[j] + np.arange(k) * b + (b - 1)
        src, snk = _sources_sinks(g)
        before += [ids[:, g.dep_before].ravel(), ids[:, snk].ravel(),
                   np.concatenate([[delay[j]], end[:-1]]).repeat(src.size)]
        after += [ids[:, g.dep_after].ravel(), np.repeat(end, snk.size),
                  ids[:, src].ravel()]
        ends.append(end)
        server.append((r_base[j] + np.arange(k)[:, None] * width[j]
                       + g.task_server[None, :]).ravel())
        duration.append(np.tile(g.task_duration, k))
        fclass.append(np.tile(g.flow_class + class_off, k))
        fbytes.append(np.tile(g.flow_bytes, k))
        flat.append(np.tile(g.flow_latency, k))
        fkind.append(np.tile(g.flow_kind, k))
        fhops.append(np.tile(g.hop_count, k))
        fcount.append(np.tile(g.counts(), k))
        routes.append(FlowRoutes(g.routes.ptr, g.routes.link + job.link_offset,
                                 g.routes.weight))
        class_off += len(g.routes)
    phase = np.array([float(j.phase) for j in jobs])
    server.append(resources + np.arange(J))          # the delays: a resource each
    duration.append(phase)
    cat = np.concatenate
    graph = IterationGraph(
        tasks=ntask, task_server=cat(server), task_duration=cat(duration),
        flow_class=cat(fclass), flow_bytes=cat(fbytes), flow_latency=cat(flat),
        flow_kind=cat(fkind).astype(np.int8), hop_count=cat(fhops),
        barriers=int((K * Bb).sum()), dep_before=cat(before).astype(np.int64),
        dep_after=cat(after).astype(np.int64), routes=FlowRoutes.concat(routes),
        segments=(), ring_orders=(),
        flow_count=cat(fcount) if any(g.flow_count is not None for g in graphs) else None)
    return StackedIterations(graph, tuple(ends), phase)


def run_iterations(capacity: np.ndarray, jobs: Sequence[PlacedJob], reference: bool = False
                   ) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """Simulate ``jobs`` together on a network of link ``capacity`` (bits/s).

    Returns
    -------
    bounds : list of (start, end)
        Per job, every iteration's start and end (seconds).
    events : int
        Events the simulator processed.

    ``reference=True`` runs the general simulator (:func:`topoopt.netsim.simulate`)
    instead of the DAG engine (the independent check; slower).
    """
    stacked = stack_iterations(jobs)
    cap = np.asarray(capacity, float)
    if reference:
        res = simulate(Network(cap, np.zeros(cap.size)), stacked.graph.workload, check=True)
        finish, events = res.finish, res.events
    else:
        _, finish, _, events = run_dag(cap, stacked.graph.dag)
    return stacked.iteration_bounds(finish), int(events)


@dataclass(frozen=True)
class JobRun:
    """One job's iterations in the shared cluster.

    Attributes
    ----------
    index : int
    name : str
        Its class in the mix.
    model : str
    servers : tuple of int
    alone : float
        Seconds of its iteration alone on the same fabric and servers.
    start, end : ndarray
        Every simulated iteration's start and end.
    measured : ndarray of bool
        Iterations inside the measurement window.
    """

    index: int
    name: str
    model: str
    servers: tuple[int, ...]
    alone: float
    start: np.ndarray
    end: np.ndarray
    measured: np.ndarray

    @property
    def times(self) -> np.ndarray:
        """Measured iteration times, seconds."""
        return (self.end - self.start)[self.measured]

    @property
    def mean(self) -> float:
        return float(self.times.mean()) if self.times.size else math.nan

    @property
    def p99(self) -> float:
        return float(np.percentile(self.times, 99)) if self.times.size else math.nan

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "model": self.model,
                "servers": list(self.servers), "alone_s": self.alone,
                "mean_s": self.mean, "p99_s": self.p99,
                "slowdown": self.mean / self.alone, "measured": int(self.measured.sum()),
                "iteration_s": self.times.tolist()}


@dataclass(frozen=True)
class ClusterRun:
    """Every job of a shared cluster on one fabric.

    Attributes
    ----------
    fabric : str
    placement : str
    jobs : tuple of JobRun
    window : (float, float)
        The measurement window, seconds.
    events : int
    groups : int
        Sets of jobs that share links (simulated separately).
    """

    fabric: str
    placement: str
    jobs: tuple[JobRun, ...]
    window: tuple[float, float]
    events: int
    groups: int

    @property
    def times(self) -> np.ndarray:
        """Every measured iteration of every job, seconds."""
        return np.concatenate([j.times for j in self.jobs])

    @property
    def weights(self) -> np.ndarray:
        """Weight of each of :attr:`times`: every job weighs the same in total (a fast
        job measures many more iterations than a slow one in the same window)."""
        return np.concatenate([np.full(j.times.size, 1.0 / (j.times.size * len(self.jobs)))
                               for j in self.jobs])

    @property
    def mean(self) -> float:
        """Average iteration time, jobs weighted equally (TopoOpt Fig. 16a): the mean
        over jobs of each job's mean iteration time."""
        return float(np.mean([j.mean for j in self.jobs]))

    @property
    def p99(self) -> float:
        """99th-percentile iteration time (Fig. 16b) of the iterations of all jobs, jobs
        weighted equally (:attr:`weights`): the smallest time that at least 99% of the
        weight does not exceed."""
        return weighted_quantile(self.times, self.weights, 0.99)

    def by_class(self, names: Sequence[str]) -> tuple[list[float], list[float]]:
        """Per job class (mix name): mean and p99 as :attr:`mean` and :attr:`p99`, over
        that class's jobs only."""
        means, p99s = [], []
        for name in names:
            sub = ClusterRun(self.fabric, self.placement,
                             tuple(j for j in self.jobs if j.name == name), self.window,
                             self.events, self.groups)
            means.append(sub.mean)
            p99s.append(sub.p99)
        return means, p99s

    @property
    def slowdown(self) -> float:
        """Mean over jobs of (mean iteration time / its time alone)."""
        return float(np.mean([j.mean / j.alone for j in self.jobs]))

    def to_json(self) -> dict:
        return {"fabric": self.fabric, "placement": self.placement, "jobs": len(self.jobs),
                "mean_s": self.mean, "p99_s": self.p99, "slowdown": self.slowdown,
                "window_s": list(self.window), "events": self.events, "groups": self.groups,
                "per_job": [j.to_json() for j in self.jobs]}


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose cumulative weight (values ascending) reaches ``q`` of
    the total.

    Examples
    --------
    >>> weighted_quantile(np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.25, 0.25]), 0.5)
    1.0
    >>> weighted_quantile(np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.25, 0.25]), 0.99)
    3.0
    """
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(np.asarray(weights, float)[order])
    i = int(np.searchsorted(cum, q * cum[-1] * (1 - 1e-12)))
    return float(np.asarray(values)[order][min(i, order.size - 1)])


def job_seed(seed: int, index: int) -> int:
    """Seed of job ``index``'s ECMP draws (``ecmp = "hash"``)."""
    return int(np.random.SeedSequence([seed, index, 1616]).generate_state(1)[0])


def build_jobs(config: ClusterConfig, fabric: str, plans: dict,
               placements: Sequence[np.ndarray] | None = None,
               progress: Callable[[str, int, int], None] | None = None
               ) -> tuple[list[JobSpec], list[PlacedJob], np.ndarray]:
    """The iteration graph of every job of ``config`` on ``fabric`` (one iteration, phase 0).

    On ``topoopt`` each job runs on its own shard (its plan's), the shards side by side
    in the network (link offsets); on any other catalog fabric, built for the whole
    cluster, every job runs on its placement (``config.placement``, or ``placements``)
    with the strategy planned for that fabric, and ``config.ecmp`` routing.

    Returns
    -------
    specs, jobs, capacity
        The jobs, their :class:`PlacedJob` (one iteration each) and the network's link
        capacities.
    """
    specs = list(config.job_list())
    if placements is None:
        placements = place_jobs([s.servers for s in specs], config.cluster.servers,
                                config.placement, config.seed)
    check_placement(placements, config.cluster.servers)
    shared = None if fabric == "topoopt" else build_fabric(fabric, config.cluster,
                                                           seed=config.seed)
    caches: dict[tuple, tuple] = {}
    graphs: dict[tuple, IterationGraph] = {}
    out: list[PlacedJob] = []
    capacity = [] if shared is None else [shared.capacity]
    offset = 0
    for i, (spec, servers) in enumerate(zip(specs, placements)):
        key = job_key(spec.job, spec.servers)
        jp: JobPlan = plans[key][fabric]
        if key not in caches:
            model = model_of(spec.job)
            caches[key] = (model, EstimateCache(model, jp.cluster, spec.job))
        model, cache = caches[key]
        if shared is None:
            shard = jp.shard
            assert shard is not None, "a TopoOpt job plan carries its shard"
            if key not in graphs:       # identical jobs: identical shards and graphs
                graphs[key] = _graph(model, jp.cluster, spec.job, jp, shard, cache)
            out.append(PlacedJob(graphs[key], np.asarray(servers), offset))
            capacity.append(shard.capacity)
            offset += shard.links
        else:
            # a graph per job: its routes are those of its own servers
            view = placed_fabric(shared, servers)
            graph = _graph(model, jp.cluster, spec.job, jp, view, cache, config.ecmp == "hash",
                           job_seed(config.seed, i))
            out.append(PlacedJob(graph, np.asarray(servers), 0))
        if progress:
            progress(f"{fabric}: task graphs", i + 1, len(specs))
    return specs, out, np.concatenate(capacity)


def _graph(model, cluster: Cluster, job: Job, jp: JobPlan, fabric, cache, random_paths=False,
           seed=0) -> IterationGraph:
    builder = IterationGraphBuilder(model, cluster, job, fabric, cache=cache,
                                    random_paths=random_paths, seed=seed)
    return builder.build(jp.strategy)


def _groups(jobs: Sequence[PlacedJob], links: int) -> np.ndarray:
    """Component label of every job: jobs are joined when they share a link."""
    rows, cols = [], []
    for j, job in enumerate(jobs):
        used = job.links()
        rows.append(np.full(used.size, j))
        cols.append(used)
    r, c = np.concatenate(rows), np.concatenate(cols)
    inc = csr_matrix((np.ones(r.size), (r, c)), shape=(len(jobs), links))
    _, label = connected_components(inc @ inc.T, directed=False)
    return label


def simulate_cluster(config: ClusterConfig, fabric: str, plans: dict,
                     placements: Sequence[np.ndarray] | None = None, joint: bool = False,
                     reference: bool = False,
                     progress: Callable[[str, int, int], None] | None = None) -> ClusterRun:
    """Every job of ``config`` training at once on ``fabric``; each job's iteration times.

    Parameters
    ----------
    config : ClusterConfig
    fabric : str
        ``topoopt`` (a shard per job) or a catalog fabric shared by all jobs.
    plans : dict
        From :func:`topoopt.multijob.plans.plan_jobs` (with ``fabric`` planned).
    placements : sequence of arrays, optional
        Override ``config.placement``.
    joint : bool
        One simulation of all jobs, even of those that share no link.
    reference : bool
        The general simulator instead of the DAG engine.
    progress : callable, optional
        ``progress(stage, done, total)``.

    Returns
    -------
    ClusterRun

    Notes
    -----
    Phases: job ``j`` starts after ``u_j x`` its iteration time alone, ``u_j`` uniform
    in [0, 1) from ``config.seed`` (the same draws on every fabric). See the module
    docstring for the window.
    """
    specs, jobs, capacity = build_jobs(config, fabric, plans, placements, progress)
    J = len(jobs)
    # Alone: each distinct graph once, in isolation.
    alone_of: dict[int, float] = {}
    for job in jobs:
        if id(job.graph) not in alone_of:
            [(_, end)], _ = run_iterations(capacity, [job])
            alone_of[id(job.graph)] = float(end[0])
    alone = np.array([alone_of[id(j.graph)] for j in jobs])
    u = np.random.default_rng([config.seed, 16]).random(J)
    phase = u * alone
    t_max, o_max = float(alone.max()), float(phase.max())
    horizon = o_max + (config.iterations + 1) * t_max
    # Sharing rarely makes an iteration faster than alone (max-min is not monotone,
    # by a few percent at most); a margin keeps every job running past the window.
    counts = np.ceil(1.1 * (horizon - phase) / alone).astype(np.int64) + 2
    labels = np.zeros(J, np.int64) if joint else _groups(jobs, capacity.size)
    groups = [np.flatnonzero(labels == g) for g in np.unique(labels)]
    bounds: list = [None] * J
    events = 0
    ends = np.zeros(J)                  # the window's end, per job's group
    for gi, members in enumerate(groups):
        end_g = horizon
        for _ in range(8):
            placed = [PlacedJob(jobs[j].graph, jobs[j].servers, jobs[j].link_offset,
                                float(phase[j]), int(counts[j])) for j in members]
            res, ev = run_iterations(capacity, placed, reference)
            # a job slowed down past the window: extend the window to its first iteration
            first = [float(end[np.argmax(start >= o_max - 1e-12)]) if (start >= o_max - 1e-12)
                     .any() else math.inf for start, end in res]
            end_g = max([horizon] + first)
            short = [j for j, (_, end) in zip(members, res) if end[-1] < end_g]
            if not short:
                break
            counts[short] *= 2      # every job must still be running at the window's end
        else:  # pragma: no cover - would need iterations 100x slower or faster than alone
            raise TopoOptError("the simulation did not cover the measurement window")
        events += ev
        for m, b in zip(members, res):
            bounds[m] = b
            ends[m] = end_g
        if progress:
            progress(f"{fabric}: simulating", gi + 1, len(groups))
    runs = []
    for j, spec in enumerate(specs):
        start, end = bounds[j]
        measured = (start >= o_max - 1e-12) & (end <= ends[j] * (1 + 1e-12))
        runs.append(JobRun(spec.index, spec.name, spec.job.model,
                           tuple(int(s) for s in jobs[j].servers), float(alone[j]), start, end,
                           measured))
    return ClusterRun(fabric, config.placement, tuple(runs), (o_max, float(ends.max())),
                      events, len(groups))


def _staged(progress: Callable[[str, int, int], None] | None, stage: str
            ) -> Callable[[str, int, int], None] | None:
    """``progress`` with its stage name replaced by ``stage`` (None stays None)."""
    if progress is None:
        return None
    report = progress
    return lambda s, d, t: report(f"{stage}: {s.split(': ', 1)[-1]}", d, t)


def _simulate_task(task) -> ClusterRun:
    config, fabric, plans = task
    return simulate_cluster(config, fabric, plans)


def simulate_fabrics(configs: Sequence[ClusterConfig], fabrics: Sequence[str], plans: dict,
                     executor: Executor | None = None,
                     progress: Callable[[str, int, int], None] | None = None
                     ) -> list[ClusterRun]:
    """:func:`simulate_cluster` for every (config, fabric), through ``executor``.

    The results come in (config, fabric) order and do not depend on the executor.
    """
    tasks = [(c, f, plans) for c in configs for f in fabrics]
    executor = executor or SerialExecutor()
    if executor.name == "serial":
        out = []
        for c, f, p in tasks:
            out.append(simulate_cluster(c, f, p, progress=_staged(
                progress, f"{f}, {len(c.job_list())} jobs")))
        return out
    out = executor.map(_simulate_task, tasks)
    if progress:
        progress("simulating", len(tasks), len(tasks))
    return out
