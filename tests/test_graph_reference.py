"""The fast task-graph builder against a slow one written from the definition.

``tests/reference_graph.py`` builds one iteration's task graph (TopoOpt §5, FlexNet)
in plain Python from its definition; here hypothesis generates small models (random
DAGs, fan-ins of equal producers, tiny DLRM / NCF / BERT), strategies (configs drawn
from a small pool, as the same object, an equal copy or fresh), clusters of 2-8
servers, every fabric the planner uses (Ideal Switch, Fat-tree, 2:1 oversubscribed
Fat-tree, Expander, a TopoOpt shard from the TopologyFinder), ring orders, and every
build option, and compares :class:`~topoopt.estimate.graph.IterationGraphBuilder`'s
graphs and simulated times with the reference's.

The comparison is made in a form that legitimate implementation choices do not change:

- tasks are matched per server in run order (a server runs its ready tasks in node-id
  order, which is part of the graph's meaning; numbering across servers is not);
- dependencies are compared as reachability between tasks and flows, so barrier
  nodes and implied edges do not matter;
- flows are keyed by (kind, hops, bytes, latency, route, tasks before them) and
  counted: identical flows merged into one node with ``flow_count`` (and the aliases'
  flows) count as many, the tasks after them united -- they start together, share
  every rate and end together, so nothing can tell them apart;
- floats (bytes, route weights, latencies) are compared to 9 significant digits in
  keys and to ``1e-12`` relative as values: the reference computes the overlaps of
  sample ranges with exact fractions and adds in its own order, the fast builder
  scales cached patterns;
- simulated times to ``1e-9`` relative: both engines treat events within 1e-9
  relative as simultaneous, and sums are taken in other orders.

Not compared: ``random_paths`` graphs (each build draws its own paths from the
fabric's generator; nothing independent to compare with) and the event count (a
barrier may or may not add event times).

250 generated cases (5 fabrics x 50), derandomized: a run is reproducible for a given
source. Two deviations the comparison found are kept as strict xfails and let through
in the generated cases only where they are pinned down:
:func:`test_alias_barriers_keep_the_order_a_server_runs_its_tasks` and
:func:`test_the_critical_path_bound_with_an_empty_activation`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from reference_graph import RefGraph, reference_graph, reference_workload

from topoopt.cluster import Cluster, Job
from topoopt.estimate.graph import FLOW_ALLREDUCE, FLOW_MP, IterationGraph, IterationGraphBuilder
from topoopt.estimate.iteration import FastEstimator, estimate_iteration
from topoopt.fabrics.catalog import build_fabric
from topoopt.model import Model, Operator
from topoopt.netsim.dag import run_dag
from topoopt.netsim.engine import simulate
from topoopt.strategy import OpConfig, Strategy, check_strategy
from topoopt.workloads import build_model

FABRICS = ("ideal", "fattree", "oversub", "expander", "topoopt")
REL_TIME = 1e-9
SETTINGS = dict(deadline=None, derandomize=True, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

LIBRARY_MODELS = {
    "dlrm": {"tables": 3, "rows": 1000, "dim": 16, "bag": 4, "bottom_layers": 1,
             "bottom_width": 64, "top_layers": 1, "top_width": 64},
    "ncf": {"tables": 2, "rows": 1000, "dim": 16, "top_layers": 1, "top_width": 32},
    "bert": {"layers": 1, "hidden": 64, "heads": 2, "seq": 8, "vocab": 100,
             "max_position": 16},
}


@functools.lru_cache(maxsize=None)
def library_model(name: str) -> Model:
    return build_model(name, LIBRARY_MODELS[name])


# -- generated cases ---------------------------------------------------------------------

SIZES = st.sampled_from([0, 16, 1000, 1 << 16])
FLOPS = st.sampled_from([0.0, 1e6, 3e8, 4e9])


@st.composite
def operator(draw, name: str, kind: str, inputs: tuple[str, ...], out_elems=None) -> Operator:
    params = draw(st.sampled_from([0, 7, 4096, 1 << 20]))
    if kind in ("embedding", "dense", "attention", "conv"):
        params = max(params, 8)
    elif kind in ("interaction", "loss", "elementwise", "pool"):
        params = 0
    fwd = 0.0 if kind == "embedding" else draw(FLOPS)
    return Operator(name, kind, params=params, fwd_flops=fwd,
                    bwd_flops=draw(st.sampled_from([1.0, 2.0])) * fwd,
                    out_elems=draw(SIZES) if out_elems is None else out_elems, inputs=inputs,
                    mem_elems=draw(st.sampled_from([64, 4096])) if kind == "embedding" else 0)


@st.composite
def dag_models(draw) -> Model:
    """Random DAGs: chains (fusion), fan-ins and fan-outs, data loaders."""
    ops: list[Operator] = [Operator(f"in{i}", "input", out_elems=draw(SIZES))
                           for i in range(draw(st.integers(0, 2)))]
    for j in range(draw(st.integers(1, 7))):
        names = [op.name for op in ops]
        if names and draw(st.booleans()):
            inputs = (names[-1],)           # a chain
        else:
            inputs = tuple(draw(st.lists(st.sampled_from(names), unique=True, max_size=3))
                           if names else [])
        kind = draw(st.sampled_from(["dense", "embedding", "attention", "conv", "norm",
                                     "elementwise", "interaction", "pool", "loss"]))
        ops.append(draw(operator(f"op{j}", kind, inputs)))
    return Model("dag", tuple(ops))


@st.composite
def fan_in_models(draw) -> Model:
    """DLRM's shape: equal producers (tables) into one consumer, then a chain."""
    ops: list[Operator] = []
    feed: tuple[str, ...] = ()
    if draw(st.booleans()):
        ops.append(Operator("in", "input", out_elems=16))
        feed = ("in",)
    kind = draw(st.sampled_from(["embedding", "dense"]))
    out = draw(st.sampled_from([16, 1000]))
    k = draw(st.integers(2, 4))
    for i in range(k):
        # mostly equal outputs (aliases), sometimes one apart
        ops.append(draw(operator(f"p{i}", kind, feed,
                                 out if i or draw(st.booleans()) else 2 * out)))
    ops.append(draw(operator("mix", "interaction", tuple(f"p{i}" for i in range(k)))))
    last = "mix"
    for j in range(draw(st.integers(0, 3))):
        ops.append(draw(operator(f"top{j}", draw(st.sampled_from(["dense", "elementwise"])),
                                 (last,))))
        last = f"top{j}"
    return Model("fan_in", tuple(ops))


MODELS = st.one_of(dag_models(), fan_in_models(),
                   st.sampled_from(sorted(LIBRARY_MODELS)).map(library_model))


@st.composite
def op_config(draw, n: int, batch: int, op: Operator | None = None) -> OpConfig:
    """A config valid for ``op`` (``None``: for any operator, ``mp = 1``)."""
    shapes = [(dp, mp) for dp in range(1, n + 1) for mp in range(1, n + 1)
              if dp * mp <= n and batch % dp == 0
              and (mp == 1 or (op is not None and op.splittable and op.params >= mp))]
    dp, mp = draw(st.sampled_from(shapes))
    servers = draw(st.permutations(range(n)))[:dp * mp]
    return OpConfig(tuple(servers), dp, mp)


@st.composite
def strategies(draw, model: Model, n: int, batch: int) -> Strategy:
    pool = draw(st.lists(op_config(n, batch), min_size=1, max_size=3))
    configs = []
    for op in model.operators:
        how = draw(st.sampled_from(["same", "equal", "fresh"]))
        if how == "fresh":
            configs.append(draw(op_config(n, batch, op)))
        else:
            c = pool[draw(st.integers(0, len(pool) - 1))]
            configs.append(c if how == "same" else OpConfig(tuple(c.servers), c.dp, c.mp))
    s = Strategy(tuple(configs))
    check_strategy(model, s, n, batch)
    return s


@functools.lru_cache(maxsize=64)
def fixed_fabric(name: str, cluster: Cluster, seed: int):
    return build_fabric(name, cluster, seed=seed)


@st.composite
def ring_orders(draw, strategies_: list[Strategy], model: Model) -> dict:
    """Random ring orders (1-3 rings) for some AllReduce groups of the strategies."""
    groups = sorted({tuple(sorted(c.replicas(b)))
                     for s in strategies_ for op, c in zip(model.operators, s.configs)
                     if op.params > 0 and c.dp >= 2 for b in range(c.mp)})
    rings = {}
    for members in groups:
        if draw(st.booleans()):
            rings[members] = tuple(tuple(draw(st.permutations(members)))
                                   for _ in range(draw(st.integers(1, 3))))
    return rings


@st.composite
def cases(draw, name: str, max_strategies: int = 3) -> dict:
    """A model, 1-3 strategies built by one builder (its caches warm), a cluster, the
    fabric ``name``, ring orders and the builder's options."""
    n = draw(st.integers(2, 8))
    cluster = Cluster(servers=n, nics=draw(st.integers(1, min(3, max(1, n - 2)))),
                      link_bandwidth=draw(st.sampled_from([25e9, 100e9])),
                      link_latency=draw(st.sampled_from([0.0, 1e-6, 5e-6])))
    job = Job("synthetic", batch_per_gpu=draw(st.sampled_from([1, 6, 16])),
              precision=draw(st.sampled_from(["fp32", "fp16"])))
    model = draw(MODELS)
    batch = job.global_batch(cluster)
    strats = draw(st.lists(strategies(model, n, batch), min_size=1, max_size=max_strategies))
    seed = draw(st.integers(0, 2))
    if name == "topoopt":   # planned for the first strategy's traffic
        fabric = build_fabric(name, cluster, seed=seed, job=job, model=model,
                              strategy=strats[0])
    else:
        fabric = fixed_fabric(name, cluster, seed)
    rings = draw(st.none() | ring_orders(strats, model))
    options = {"overlap": draw(st.booleans()),
               "mp_flows": draw(st.sampled_from(["auto", "pair", "coflow"])),
               "merge_flows": draw(st.booleans()), "mp_barriers": draw(st.booleans())}
    return {"model": model, "strategies": strats, "cluster": cluster, "job": job,
            "fabric": fabric, "rings": rings, "options": options,
            "force_merges": options["merge_flows"] and draw(st.booleans())}


@contextlib.contextmanager
def identical_blocks_merged(on: bool = True):
    """With ``merge_flows``, the builder looks for identical blocks of flows only in
    passes of thousands of flows (a speed threshold, ``_MERGE_MIN``); set it to 0 for
    the small graphs here, wherever in ``topoopt.estimate`` it is defined."""
    patched = [(m, m._MERGE_MIN) for name, m in list(sys.modules.items())
               if on and name.startswith("topoopt.estimate") and hasattr(m, "_MERGE_MIN")]
    for m, _ in patched:
        m._MERGE_MIN = 0
    try:
        yield bool(patched)
    finally:
        for m, value in patched:
            m._MERGE_MIN = value


def builder_of(case) -> IterationGraphBuilder:
    return IterationGraphBuilder(case["model"], case["cluster"], case["job"], case["fabric"],
                                 rings=case["rings"], **case["options"])


def reference_of(case, strategy) -> RefGraph:
    o = case["options"]
    return reference_graph(case["model"], strategy, case["cluster"], case["job"],
                           case["fabric"], case["rings"], o["overlap"], o["mp_flows"])


# -- canonical forms ---------------------------------------------------------------------

def _r(x: float) -> float:
    return float(f"{x:.9g}")


def closure(nodes: int, deps, bit: dict[int, int]) -> tuple[list[int], list[int]]:
    """Per node, the tasks before it and after it (bitmasks over ``bit[node]``);
    asserts the graph is acyclic."""
    succ: list[list[int]] = [[] for _ in range(nodes)]
    indeg = [0] * nodes
    for a, b in deps:
        succ[a].append(b)
        indeg[b] += 1
    order = [x for x in range(nodes) if indeg[x] == 0]
    for x in order:
        for y in succ[x]:
            indeg[y] -= 1
            if indeg[y] == 0:
                order.append(y)
    assert len(order) == nodes, "the task graph has a cycle"
    own = [1 << bit[x] if x in bit else 0 for x in range(nodes)]
    before, after = [0] * nodes, [0] * nodes
    for x in order:
        for y in succ[x]:
            before[y] |= before[x] | own[x]
    for x in reversed(order):
        for y in succ[x]:
            after[x] |= after[y] | own[y]
    return before, after


def canonical(tasks_before: dict, flows: list[tuple]) -> tuple[dict, dict]:
    """(task label -> tasks before it, flow key -> [count, tasks after])."""
    grouped: dict = {}
    for key, count, after in flows:
        entry = grouped.setdefault(key, [0, 0])
        entry[0] += count
        entry[1] |= after
    return tasks_before, grouped


def route_key(links, weights) -> tuple:
    return tuple(sorted((int(link), _r(w)) for link, w in zip(links, weights) if w > 1e-15))


def reference_canonical(ref: RefGraph):
    nodes = len(ref.tasks) + len(ref.flows)
    before, after = closure(nodes, ref.deps, {i: i for i in range(len(ref.tasks))})
    flows = []
    for j, f in enumerate(ref.flows):
        x = ref.flow_node(j)
        key = (f.kind, f.hops, _r(f.nbytes), _r(f.latency),
               route_key([link for link, _ in f.route], [w for _, w in f.route]), before[x])
        flows.append((key, 1, after[x]))
    return canonical({i: before[i] for i in range(len(ref.tasks))}, flows)


def match_tasks(graph: IterationGraph, ref: RefGraph) -> list[int]:
    """Per fast task, the reference task it is: the same server, the same place in the
    order that server runs its ready tasks."""
    fast_on: dict[int, list[int]] = defaultdict(list)
    for i in range(graph.tasks):
        fast_on[int(graph.task_server[i])].append(i)
    ref_on: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(ref.tasks):
        ref_on[t.server].append(i)
    assert {s: len(x) for s, x in fast_on.items()} == {s: len(x) for s, x in ref_on.items()}, \
        "tasks per server"
    match = [-1] * graph.tasks
    for s, mine in fast_on.items():
        theirs = sorted(ref_on[s], key=lambda i: ref.tasks[i].order)
        for i, j in zip(mine, theirs):     # mine: node-id order, the order the server runs
            match[i] = j
    return match


def fast_canonical(graph: IterationGraph, match: list[int]):
    bit = {i: match[i] for i in range(graph.tasks)}
    deps = zip(graph.dep_before.tolist(), graph.dep_after.tolist())
    before, after = closure(graph.nodes, deps, bit)
    routes = graph.flow_routes()
    kinds = {FLOW_MP: "mp", FLOW_ALLREDUCE: "allreduce"}
    flows = []
    for j, x in enumerate(graph.flow_nodes.tolist()):
        links, weights = routes.row(j)
        key = (kinds[int(graph.flow_kind[j])], int(graph.hop_count[j]),
               _r(float(graph.flow_bytes[j])), _r(float(graph.flow_latency[j])),
               route_key(links.tolist(), weights.tolist()), before[x])
        flows.append((key, int(graph.counts()[j]), after[x]))
    return canonical({match[i]: before[i] for i in range(graph.tasks)}, flows)


def describe(ref: RefGraph, mask: int) -> list:
    return [ref.tasks[i].label for i in range(len(ref.tasks)) if mask >> i & 1]


def assert_same_graph(graph: IterationGraph, ref: RefGraph) -> list[int]:
    """Segments, tasks, dependencies and flows equal (in the canonical form); returns
    the task match."""
    assert [s.ops for s in graph.segments] == [ops for ops, _ in ref.segments]
    assert [s.config for s in graph.segments] == [c for _, c in ref.segments]
    assert graph.tasks == len(ref.tasks)
    match = match_tasks(graph, ref)
    for i, j in enumerate(match):
        assert graph.task_duration[i] == pytest.approx(ref.tasks[j].duration, rel=1e-12,
                                                       abs=0), ref.tasks[j].label
    fast_tasks, fast_flows = fast_canonical(graph, match)
    ref_tasks, ref_flows = reference_canonical(ref)
    for j, mask in ref_tasks.items():
        assert fast_tasks[j] == mask, (ref.tasks[j].label, "waits for",
                                       describe(ref, fast_tasks[j] & ~mask), "not for",
                                       describe(ref, mask & ~fast_tasks[j]))
    missing = {k: v for k, v in ref_flows.items() if fast_flows.get(k) != v}
    extra = {k: v for k, v in fast_flows.items() if ref_flows.get(k) != v}
    assert not missing and not extra, (
        "flows differ", [(k[:5], describe(ref, k[5]), v[0]) for k, v in missing.items()][:3],
        [(k[:5], describe(ref, k[5]), v[0]) for k, v in extra.items()][:3])
    assert sorted(graph.ring_orders) == sorted(
        f.parts for f in ref.flows if f.kind == "allreduce")
    return match


# -- the tests ---------------------------------------------------------------------------

@pytest.mark.parametrize("fabric", FABRICS)
@settings(max_examples=28, **SETTINGS)
@given(data=st.data())
def test_fast_graphs_have_the_reference_tasks_dependencies_and_flows(fabric, data):
    case = data.draw(cases(fabric))
    builder = builder_of(case)
    for s in case["strategies"]:
        with identical_blocks_merged(case["force_merges"]):
            graph = builder.build(s)
        assert_same_graph(graph, reference_of(case, s))
        # what the case exercised (hypothesis --hypothesis-show-statistics)
        kinds = set(graph.flow_kind.tolist())
        event("fused" if any(len(x.ops) > 1 for x in graph.segments) else "no fusion")
        event("MP flows" if FLOW_MP in kinds else "no MP flow")
        event("AllReduce" if FLOW_ALLREDUCE in kinds else "no AllReduce")
        event("barriers" if graph.barriers else "no barrier")
        event("merged flows" if (graph.counts() > 1).any() else "no merged flow")


def _busy(intervals) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, reach = 0.0, -np.inf
    for a, b in sorted(intervals):
        if a > reach:
            total += b - a
            reach = b
        elif b > reach:
            total += b - reach
            reach = b
    return total


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TIME * abs(b) + 1e-15


def task_time_mismatches(graph: IterationGraph, ref: RefGraph, finish_ref, capacity) -> list:
    """The reference tasks whose finish differs in ``graph`` on the DAG engine."""
    match = match_tasks(graph, ref)
    _, finish, _, _ = run_dag(capacity, graph.dag)
    return [(ref.tasks[j].label, float(finish[i]), float(finish_ref[j]))
            for i, j in enumerate(match) if not _close(finish[i], finish_ref[j])]


@pytest.mark.parametrize("fabric", FABRICS)
@settings(max_examples=14, **SETTINGS)
@given(data=st.data())
def test_simulated_times_equal_the_reference_graph_on_the_general_simulator(fabric, data):
    """The reference graph on :func:`topoopt.netsim.simulate` against the fast graphs:
    the builder's (the drawn options) on the DAG engine, every task's finish;
    :func:`estimate_iteration` on both engines, every field; :class:`FastEstimator`,
    the time.

    One deviation is known and let through, where the same builder without
    ``mp_barriers`` gives the reference's times exactly: the barrier an alias's
    backward tasks wait behind releases them after the tasks the same flow releases
    directly, so a server may run them in another order
    (:func:`test_alias_barriers_keep_the_order_a_server_runs_its_tasks`).
    """
    case = data.draw(cases(fabric, max_strategies=2))
    model, cluster, job, fabric = case["model"], case["cluster"], case["job"], case["fabric"]
    o = case["options"]
    builder = builder_of(case)
    fast = FastEstimator(model, cluster, job, fabric, case["rings"], o["overlap"],
                         o["mp_flows"])
    for s in case["strategies"]:
        ref = reference_of(case, s)
        sim = simulate(fabric, reference_workload(ref))
        with identical_blocks_merged(case["force_merges"]):
            graph = builder.build(s)
        wrong = task_time_mismatches(graph, ref, sim.finish, fabric.capacity)
        busy: dict[int, float] = defaultdict(float)
        for t in ref.tasks:
            busy[t.server] += t.duration
        nt = len(ref.tasks)
        mp = [(sim.start[nt + j], sim.finish[nt + j]) for j, f in enumerate(ref.flows)
              if f.kind == "mp"]
        ar = [(sim.start[nt + j], sim.finish[nt + j]) for j, f in enumerate(ref.flows)
              if f.kind == "allreduce"]
        times = {"total": sim.makespan, "mp": _busy(mp), "allreduce": _busy(ar)}
        exact = {"compute": max(busy.values(), default=0.0),
                 "mp_bytes": sum(f.nbytes for f in ref.flows if f.kind == "mp"),
                 "allreduce_bytes": sum(f.nbytes * f.hops for f in ref.flows
                                        if f.kind == "allreduce")}
        for engine in (False, True):
            est = estimate_iteration(model, s, cluster, job, fabric, case["rings"],
                                     o["overlap"], mp_flows=o["mp_flows"], reference=engine)
            for name, value in exact.items():
                assert getattr(est, name) == pytest.approx(value, rel=1e-12, abs=1e-15), \
                    (name, engine)
            assert (est.tasks, est.flows) == (nt, len(ref.flows))
            wrong += [(name, engine, getattr(est, name), value) for name, value in times.items()
                      if not _close(getattr(est, name), value)]
        if not _close(fast.total(s), sim.makespan):
            wrong.append(("FastEstimator", fast.total(s), sim.makespan))
        if wrong:
            plain = IterationGraphBuilder(model, cluster, job, fabric, case["rings"],
                                          o["overlap"], o["mp_flows"], mp_barriers=False)
            assert not task_time_mismatches(plain.build(s), ref, sim.finish,
                                            fabric.capacity), wrong
            event("known deviation: an alias barrier reorders a server's tasks")
        else:
            event("the same times")


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="an alias barrier lets a later backward task run first")
def test_alias_barriers_keep_the_order_a_server_runs_its_tasks():
    """Known deviation (found by the comparison above; ``mp_barriers``, the default).

    Tables ``p1..p3`` share a config, their one consumer and their gradients, so
    ``p2`` and ``p3`` are aliases of ``p1`` and the three backward tasks on server 1
    wait behind one barrier; ``p0`` (its own config: replicated) waits for the same
    coflow directly. Both engines process the barrier's zero-time completion after
    they have given server 1 to ``p0``'s backward, which should run last (backward
    tasks run in reverse segment order): ``p0``'s AllReduce starts earlier and the
    iteration ends 2e-4 earlier than the graph defines. Not fixed in this round
    (the planner's times would change); the strict xfail fails once it is: remove it.
    """
    emb = (lambda name, out, params=8: Operator(name, "embedding", params=params,
                                                 out_elems=out, inputs=("in",),
                                                 mem_elems=4096))
    model = Model("tables", (Operator("in", "input", out_elems=16), emb("p0", 32, 1 << 24),
                             emb("p1", 16), emb("p2", 16), emb("p3", 16),
                             Operator("mix", "interaction", inputs=("p0", "p1", "p2", "p3"))))
    one = OpConfig((1,), 1, 1)
    s = Strategy((one, OpConfig((1, 2), 2, 1), one, one, one, OpConfig((0,), 1, 1)))
    cluster = Cluster(servers=6, nics=1, link_bandwidth=25e9, link_latency=1e-6)
    job = Job("synthetic", batch_per_gpu=16)
    fabric = fixed_fabric("oversub", cluster, 0)
    ref = reference_graph(model, s, cluster, job, fabric)
    total = simulate(fabric, reference_workload(ref)).makespan
    plain = IterationGraphBuilder(model, cluster, job, fabric, mp_barriers=False).build(s)
    if simulate(fabric, plain.workload).makespan != pytest.approx(total, rel=REL_TIME):
        pytest.fail("without mp_barriers too: not the known deviation")   # not xfailed
    assert estimate_iteration(model, s, cluster, job, fabric).total == pytest.approx(
        total, rel=REL_TIME)


@pytest.mark.parametrize("fabric", FABRICS)
@settings(max_examples=8, **SETTINGS)
@given(data=st.data())
def test_the_builders_bounds_against_the_reference_graph(fabric, data):
    """``link_bound`` is the reference flows' busiest link; ``lower_bound`` and
    ``critical_path_bound`` stay below the reference graph's simulated time (the
    latter not checked where an empty activation crosses servers:
    :func:`test_the_critical_path_bound_with_an_empty_activation`)."""
    case = data.draw(cases(fabric, max_strategies=2))
    fabric = case["fabric"]
    builder = builder_of(case)
    for s in case["strategies"]:
        ref = reference_of(case, s)
        load = np.zeros(fabric.capacity.size)
        for f in ref.flows:
            for link, w in f.route:
                load[link] += f.nbytes * w
        live = fabric.capacity > 0
        busiest = float((8.0 * load[live] / fabric.capacity[live]).max()) if live.any() else 0.0
        assert builder.link_bound(s) == pytest.approx(busiest, rel=1e-9, abs=1e-18)
        total = simulate(fabric, reference_workload(ref)).makespan
        assert builder.lower_bound(s) <= total * (1 + 1e-12)
        if empty_activation_across_servers(case["model"], ref):
            event("an empty activation across servers: critical path not checked")
        else:
            assert builder.critical_path_bound(s) <= total * (1 + 1e-12)


def empty_activation_across_servers(model: Model, ref: RefGraph) -> bool:
    """Whether an edge between segments carries no bytes to a server its producer is
    not on (the graph has no dependency there)."""
    seg_of = {v: g for g, (ops, _) in enumerate(ref.segments) for v in ops}
    for u, v in model.edges:
        op = model.operators[u]
        if op.kind == "input" or op.out_elems > 0 or seg_of[u] == seg_of[v]:
            continue
        if set(ref.segments[seg_of[v]][1].servers) - set(ref.segments[seg_of[u]][1].servers):
            return True
    return False


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="the critical path waits for an edge the graph has no flow for")
def test_the_critical_path_bound_with_an_empty_activation():
    """Known deviation (found by the comparison above; custom models only: no built-in
    model has an empty activation on an edge).

    ``a`` (server 0) feeds ``b`` (server 1) an empty activation: the graph has no
    transfer, so no dependency, and ``b`` runs alongside ``a``; the critical-path
    bound still chains ``b`` after ``a`` and passes the simulated time, so the search
    would reject such a strategy unsimulated. Either the graph should keep the
    dependency (a zero-byte message) or the bound should drop it; the strict xfail
    fails once they agree: remove it.
    """
    model = Model("empty", (Operator("a", "dense", params=8, fwd_flops=4e9, bwd_flops=8e9),
                            Operator("b", "dense", params=8, fwd_flops=4e9, bwd_flops=8e9,
                                     inputs=("a",))))
    s = Strategy((OpConfig((0,), 1, 1), OpConfig((1,), 1, 1)))
    cluster = Cluster(servers=2, nics=1, link_bandwidth=25e9)
    job = Job("synthetic", batch_per_gpu=16)
    fabric = fixed_fabric("ideal", cluster, 0)
    ref = reference_graph(model, s, cluster, job, fabric)
    total = simulate(fabric, reference_workload(ref)).makespan
    builder = IterationGraphBuilder(model, cluster, job, fabric)
    if estimate_iteration(model, s, cluster, job, fabric).total != pytest.approx(
            total, rel=REL_TIME):
        pytest.fail("the graph itself differs: not the known deviation")   # not xfailed
    assert builder.critical_path_bound(s) <= total * (1 + 1e-12)


def test_identical_flow_blocks_merge_and_match_the_reference():
    # tables sharded over every server feeding a data-parallel interaction: its backward
    # sends each table the same gradients, blocks that merge_flows merges into flows of
    # flow_count > 1 (here with its size threshold lifted; the generated cases lift it
    # too, and this says that lifting it still works)
    model = library_model("dlrm")
    n = 4
    cluster = Cluster(servers=n, nics=2, link_bandwidth=100e9)
    job = Job("synthetic", batch_per_gpu=4)
    every = OpConfig(tuple(range(n)), n, 1)
    sharded = OpConfig(tuple(range(n)), 1, n)
    s = Strategy(tuple(sharded if op.kind == "embedding" else every
                       for op in model.operators))
    fabric = fixed_fabric("ideal", cluster, 0)
    builder = IterationGraphBuilder(model, cluster, job, fabric, merge_flows=True,
                                    mp_barriers=False)
    with identical_blocks_merged() as found:
        graph = builder.build(s)
    assert found, "no _MERGE_MIN in topoopt.estimate: update identical_blocks_merged"
    assert (graph.counts() > 1).any()
    assert_same_graph(graph, reference_graph(model, s, cluster, job, fabric))
