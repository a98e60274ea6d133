"""The planner's estimator (one builder with warm caches and merged flows, on the DAG
engine) against the general simulator on graphs built afresh, random strategies.

Both engines run graphs of the one builder, so these tests check the engines, the
caches and the flow merging against each other; the builder's graph itself is checked
against an independent construction in tests/test_graph_reference.py."""

import functools
from dataclasses import asdict

import numpy as np
import pytest

from topoopt.cluster import Cluster, Job
from topoopt.estimate import EstimateCache, FastEstimator, build_iteration, estimate_iteration
from topoopt.estimate.graph import FLOW_MP, IterationGraphBuilder
from topoopt.fabrics import expander, fat_tree, ideal_switch
from topoopt.model import Model, Operator
from topoopt.netsim import (
    NO_RESOURCE,
    FlowRoutes,
    Network,
    SimulationError,
    Workload,
    max_min_rates,
    simulate,
)
from topoopt.netsim._dag_kernel import _REFRESH, _solve
from topoopt.netsim._fill_kernel import link_classes
from topoopt.netsim.dag import link_load_bound, route_classes, run_dag, simulate_dag
from topoopt.planners.alternating import plan_topology, start_strategy, topoopt_fabric
from topoopt.planners.cost import IterationCost
from topoopt.planners.mcmc import mcmc_search
from topoopt.planners.moves import MoveSet
from topoopt.planners.space import StrategySpace
from topoopt.strategy import OpConfig, Strategy
from topoopt.workloads import model_of

G = 1e9
SMALL_DLRM = {"tables": 8, "rows": 200_000, "dim": 64, "bag": 20, "bottom_layers": 2,
              "bottom_width": 256, "top_layers": 2, "top_width": 512}
SMALL_BERT = {"layers": 2, "hidden": 256, "heads": 4, "seq": 32}
REL = 1e-9


def both(ref_call, fast_call, *args, **kw):
    """Run both on the same arguments: neither may raise (every strategy of the space
    has an acyclic task graph), and every field must agree."""
    ref = ref_call(*args, **kw)
    assert_same(ref, fast_call(*args, **kw))
    return ref


def assert_same(ref, fast):
    """Every time and byte count to REL, every count exactly."""
    a, b = asdict(ref), asdict(fast)
    for k, v in a.items():
        if isinstance(v, float):
            assert b[k] == pytest.approx(v, rel=REL, abs=1e-18), k
        else:
            assert b[k] == v, k


def random_strategies(model, cluster, job, count, seed):
    """A seeded random walk over the space, through every kind of MCMC move."""
    space = StrategySpace.build(model, cluster, job)
    rng = np.random.default_rng(seed)
    current = start_strategy(model, cluster, job, space)
    memory = space.memory(current)
    moves = MoveSet(space)
    out = [current]
    while len(out) < count:
        move = moves.propose(current, memory, rng)
        if move is not None:
            current, memory, _ = move
            out.append(current)
    return out


def cluster_of(n):
    return Cluster(servers=n, nics=4, link_bandwidth=100 * G, link_latency=1e-6)


def fabrics_of(n, model, cluster, job):
    start = start_strategy(model, cluster, job)
    plan = plan_topology(model, start, cluster, job)
    bw = cluster.server_bandwidth
    return {"ideal": (ideal_switch(n, bw), None),
            "fattree": (fat_tree(n, bw / 2), None),
            "expander": (expander(n, 4, 100 * G, seed=1), None),
            "topoopt": (topoopt_fabric(plan), plan.rings)}


@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.parametrize("model_name,size", [("dlrm", SMALL_DLRM), ("bert", SMALL_BERT)])
def test_fast_estimates_equal_the_reference_on_random_strategies(n, model_name, size):
    job = Job(model_name, batch_per_gpu=16, size=size)
    model = model_of(job)
    cluster = cluster_of(n)
    strategies = random_strategies(model, cluster, job, 12, seed=n)
    for fabric, rings in fabrics_of(n, model, cluster, job).values():
        fast = FastEstimator(model, cluster, job, fabric, rings)  # one per fabric: warm caches
        ref_cache = EstimateCache(model, cluster, job)

        def reference(s, fabric=fabric, rings=rings, ref_cache=ref_cache):
            return estimate_iteration(model, s, cluster, job, fabric, rings, cache=ref_cache,
                                      reference=True)

        for s in strategies:
            ref = both(reference, fast.estimate, s)
            assert fast.total(s) == pytest.approx(ref.total, rel=REL)


@pytest.mark.parametrize("overlap,mp_flows", [(False, "auto"), (True, "pair"), (True, "coflow")])
def test_fast_estimates_equal_the_reference_without_overlap_and_per_flow_mode(overlap, mp_flows):
    n = 8
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    model = model_of(job)
    cluster = cluster_of(n)
    fabrics = fabrics_of(n, model, cluster, job)
    for s in random_strategies(model, cluster, job, 6, seed=3):
        for fabric, rings in (fabrics["fattree"], fabrics["topoopt"], fabrics["ideal"]):
            kw = {"overlap": overlap, "mp_flows": mp_flows}
            both(functools.partial(estimate_iteration, reference=True), estimate_iteration,
                 model, s, cluster, job, fabric, rings, **kw)


def test_random_paths_run_on_the_dag_engine_with_the_reference_graph():
    n = 8
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    model = model_of(job)
    cluster = cluster_of(n)
    fabric = fat_tree(n, cluster.server_bandwidth)
    for s in random_strategies(model, cluster, job, 4, seed=5):
        both(functools.partial(estimate_iteration, reference=True), estimate_iteration,
             model, s, cluster, job, fabric, random_paths=True, seed=7)
    # the link bound reads the fabric's routes, not a graph's draw
    drawn = IterationGraphBuilder(model, cluster, job, fabric, random_paths=True, seed=7)
    with pytest.raises(ValueError, match="random_paths"):
        drawn.link_bound(s)


def test_iteration_cost_fast_and_reference_agree_and_memoize():
    n = 8
    job = Job("bert", batch_per_gpu=16, size=SMALL_BERT)
    model = model_of(job)
    cluster = cluster_of(n)
    fabric = ideal_switch(n, cluster.server_bandwidth)
    fast = IterationCost(model, cluster, job, fabric)
    ref = IterationCost(model, cluster, job, fabric, reference=True)
    strategies = random_strategies(model, cluster, job, 5, seed=2)
    for s in strategies:
        assert fast(s) == pytest.approx(ref(s), rel=REL)
        assert_same(ref.estimate(s), fast.estimate(s))
    fast(strategies[0])
    assert fast.evaluations == len({s.configs for s in strategies})


def test_candidates_a_bound_rejects_unbuilt_are_not_counted_as_simulated():
    # plan.json's `evaluations` counts strategies simulated: a candidate the critical
    # path rejects before its graph is built is `bounded`, like one the server bound
    # rejects
    n = 8
    job = Job("bert", batch_per_gpu=16, size=SMALL_BERT)
    model = model_of(job)
    cluster = cluster_of(n)
    cost = IterationCost(model, cluster, job, ideal_switch(n, cluster.server_bandwidth))
    builder = cost.fast.builder
    for s in random_strategies(model, cluster, job, 25, seed=3):
        other = max(builder.lower_bound(s), builder.link_bound(s))
        if builder.critical_path_bound(s) > 1.01 * other:
            break
    else:
        pytest.fail("no strategy whose critical path passes the other bounds")
    low = cost(s, 1.005 * other)
    assert low > 1.005 * other
    assert (cost.evaluations, cost.bounded) == (0, 1)
    assert cost(s) >= low
    assert (cost.evaluations, cost.bounded) == (1, 1)


def test_coflows_stay_acyclic_when_a_consumer_reads_two_producer_segments():
    # BERT at n = 8 on a fat-tree: this walk's 10th strategy has a consumer fed by two
    # producer segments on one server. Grouping coflows by their first predecessor
    # closed a dependency cycle here; grouping by the exact predecessor set must not.
    n = 8
    job = Job("bert", batch_per_gpu=16, size=SMALL_BERT)
    model = model_of(job)
    cluster = cluster_of(n)
    fabric = fat_tree(n, cluster.server_bandwidth / 2)
    s = random_strategies(model, cluster, job, 12, seed=n)[9]
    ref = estimate_iteration(model, s, cluster, job, fabric, reference=True, mp_flows="coflow")
    fast = estimate_iteration(model, s, cluster, job, fabric, mp_flows="coflow")
    pair = estimate_iteration(model, s, cluster, job, fabric, reference=True, mp_flows="pair")
    assert np.isfinite(ref.total) and fast.total == pytest.approx(ref.total, rel=1e-9)
    assert ref.total == pytest.approx(pair.total, rel=0.1)
    assert IterationCost(model, cluster, job, fabric)(s) == pytest.approx(ref.total, rel=1e-9)


@pytest.mark.parametrize("fabric_name", ["fattree", "expander", "topoopt"])
def test_warm_builder_caches_build_the_graph_a_fresh_builder_builds(fabric_name):
    # the planner's builder keeps its caches across strategies (route classes numbered
    # in the order they were met, templates of configs seen before); a fresh builder
    # per strategy must build the same graph: tasks, flows, bytes, routes, dependencies
    # (coflows here: merge_flows changes nothing, so the graphs compare node by node)
    n = 16
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    model = model_of(job)
    cluster = cluster_of(n)
    fabric, rings = fabrics_of(n, model, cluster, job)[fabric_name]
    fast = FastEstimator(model, cluster, job, fabric, rings)
    for s in random_strategies(model, cluster, job, 6, seed=9):
        ref = build_iteration(model, s, cluster, job, fabric, rings)
        g = fast.graph(s)
        assert g.tasks == ref.task_nodes.size
        np.testing.assert_array_equal(g.task_server, ref.task_server)
        np.testing.assert_array_equal(g.task_duration, ref.task_duration)
        np.testing.assert_array_equal(g.flow_kind, ref.flow_kind)
        np.testing.assert_array_equal(g.flow_bytes, ref.flow_bytes)
        np.testing.assert_array_equal(g.hop_count, ref.hop_count)
        np.testing.assert_array_equal(g.flow_latency, ref.flow_latency)
        np.testing.assert_array_equal(g.dep_before, ref.dep_before)
        np.testing.assert_array_equal(g.dep_after, ref.dep_after)
        assert g.barriers == ref.barriers and g.ring_orders == ref.ring_orders
        # every flow's route (its class row) is the fresh graph's flow's route
        w = ref.workload.compile()
        routes = g.dag.class_routes
        for f in range(w.flow_size.size):
            links, weights = routes.row(int(g.dag.flow_class[f]))
            rl, rw = w.routes.row(f)
            order = np.argsort(rl)
            np.testing.assert_array_equal(np.sort(links), rl[order])
            np.testing.assert_allclose(weights[np.argsort(links)], rw[order], rtol=1e-12)


def test_equal_configs_built_apart_share_the_builders_caches():
    # the caches are keyed by the configs' values: a strategy rebuilt from new but
    # equal configs (not the space's instances) builds the same graph from them,
    # adding no route and no per-pair template
    n = 8
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    model = model_of(job)
    cluster = cluster_of(n)
    fabric = fat_tree(n, cluster.server_bandwidth)
    fast = FastEstimator(model, cluster, job, fabric)
    builder = fast.builder
    for s in random_strategies(model, cluster, job, 4, seed=2):
        g = fast.graph(s)
        bounds = (builder.lower_bound(s), builder.link_bound(s),
                  builder.critical_path_bound(s))
        rows, pairs = builder.routes.store.rows, len(builder._pairs)
        again = Strategy(tuple(OpConfig(tuple(c.servers), c.dp, c.mp) for c in s.configs))
        assert all(a is not b for a, b in zip(again.configs, s.configs))
        h = fast.graph(again)
        assert (builder.routes.store.rows, len(builder._pairs)) == (rows, pairs)
        for f in ("task_server", "task_duration", "flow_class", "flow_bytes", "flow_latency",
                  "dep_before", "dep_after"):
            np.testing.assert_array_equal(getattr(h, f), getattr(g, f))
        assert (builder.lower_bound(again), builder.link_bound(again),
                builder.critical_path_bound(again)) == bounds


# --- the DAG engine on its own ------------------------------------------------------

def random_workload(rng, links, nodes=60):
    """Tasks on 4 resources (random priorities, some free, some zero-length) and flows
    (random routes, some empty or zero-size, some with a set latency) with random
    forward dependencies, repeats included."""
    w = Workload()
    kinds = rng.random(nodes) < 0.4
    for i in range(nodes):
        if kinds[i]:
            k = int(rng.integers(0, 4))
            ls = rng.choice(links, size=k, replace=False) if k else []
            ws = rng.choice([0.5, 1.0, 2.0], size=k)
            size = 0.0 if rng.random() < 0.1 else float(rng.choice([1e5, 1e6, 3e6]))
            lat = None if rng.random() < 0.5 else float(rng.random() * 1e-5)
            w.add_flow(size, ls, ws, latency=lat)
        else:
            dur = 0.0 if rng.random() < 0.1 else float(rng.choice([1e-4, 2e-4, 5e-4]))
            res = None if rng.random() < 0.15 else int(rng.integers(0, 4))
            prio = None if rng.random() < 0.5 else float(rng.integers(0, 5))
            w.add_task(dur, res, priority=prio)
    for _ in range(2 * nodes):
        a, b = sorted(rng.integers(0, nodes, size=2).tolist())
        if a != b:
            w.add_dependencies(a, b)
    return w


@pytest.mark.parametrize("seed", range(12))
def test_simulate_dag_equals_simulate_on_random_workloads(seed):
    rng = np.random.default_rng(seed)
    L = 6
    net = Network(rng.choice([10e9, 25e9, 100e9], size=L), np.full(L, 1e-6))
    w = random_workload(rng, L)
    ref = simulate(net, w)
    got = simulate_dag(net, w)
    assert got.events == ref.events
    for field in ("start", "finish", "tx_end"):
        np.testing.assert_allclose(getattr(got, field), getattr(ref, field), rtol=1e-9,
                                   atol=1e-15, equal_nan=True)
    assert got.makespan == pytest.approx(ref.makespan, rel=1e-9)
    np.testing.assert_allclose(got.link_bytes, ref.link_bytes, rtol=1e-9, atol=1e-3)


def layered_multihop_workload(rng, links, layers=5, width=24):
    """Layers of flows on multi-hop routes (2-5 links; a third split evenly over two
    paths, as ECMP) between layers of tasks: equal capacities and sizes, so many flows
    start, tie on bottlenecks and end together, and a route is shared by several flows."""
    routes = []
    for _ in range(width // 2):
        a = rng.choice(links, size=int(rng.integers(2, 6)), replace=False)
        if rng.random() < 1 / 3:
            b = rng.choice(links, size=a.size, replace=False)
            routes.append((np.concatenate([a, b]), np.full(2 * a.size, 0.5)))
        else:
            routes.append((a, np.ones(a.size)))
    w = Workload()
    prev = [w.add_task(float(rng.choice([1e-4, 2e-4])), int(r)) for r in range(4)]
    for _ in range(layers):
        flows = []
        for _ in range(width):
            ls, ws = routes[int(rng.integers(0, len(routes)))]
            after = rng.choice(prev, size=int(rng.integers(1, 3)), replace=False).tolist()
            flows.append(w.add_flow(float(rng.choice([1e6, 2e6])), ls, ws, after=after))
        prev = [w.add_task(float(rng.choice([0.0, 1e-4])), int(rng.integers(0, 4)),
                           after=rng.choice(flows, size=3, replace=False).tolist())
                for _ in range(6)]
    return w


@pytest.mark.parametrize("seed", range(8))
def test_simulate_dag_equals_simulate_on_layered_multihop_flows(seed):
    # warm max-min solves as whole layers of flows on shared multi-hop routes start and
    # end together (the Expander's and TopoOpt's coflows): the reference engine's
    # events and times
    rng = np.random.default_rng(200 + seed)
    L = 16
    cap = np.full(L, 10e9) if seed % 2 else rng.choice([10e9, 25e9], size=L)
    net = Network(cap, np.full(L, 1e-6))
    w = layered_multihop_workload(rng, L)
    ref, got = simulate(net, w), simulate_dag(net, w)
    assert got.events == ref.events
    for field in ("start", "finish", "tx_end"):
        np.testing.assert_allclose(getattr(got, field), getattr(ref, field), rtol=1e-9,
                                   atol=1e-15, equal_nan=True)
    assert got.makespan == pytest.approx(ref.makespan, rel=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_simulate_dag_dispatches_fan_outs_in_priority_order(seed):
    # one task releases many tasks on few resources at once (small and large batches):
    # each free resource must start its lowest (priority, id) task first
    rng = np.random.default_rng(100 + seed)
    w = Workload()
    roots = [w.add_task(float(rng.choice([1e-4, 2e-4])), int(r)) for r in range(3)]
    for k in range(int(rng.integers(3, 40))):
        after = [roots[int(rng.integers(0, 3))]]
        w.add_task(float(rng.choice([1e-4, 3e-4, 5e-4])), int(rng.integers(0, 3)),
                   priority=float(rng.integers(0, 6)), after=after)
    net = Network(np.array([1e9]), np.array([0.0]))
    ref, got = simulate(net, w), simulate_dag(net, w)
    assert got.events == ref.events
    np.testing.assert_allclose(got.start, ref.start, rtol=1e-12, atol=1e-18)
    np.testing.assert_allclose(got.finish, ref.finish, rtol=1e-12, atol=1e-18)


def test_simulate_dag_closed_forms_and_errors():
    net = Network(np.array([8e6]), np.array([0.0]))
    w = Workload()
    a = w.add_flow(1e6, [0])
    b = w.add_flow(3e6, [0])
    r = simulate_dag(net, w)
    assert r.finish[a] == pytest.approx(2.0) and r.finish[b] == pytest.approx(4.0)
    # a dead link never finishes; a cycle never starts
    w = Workload()
    w.add_flow(1e6, [0])
    with pytest.raises(SimulationError, match="capacity 0"):
        simulate_dag(Network(np.array([0.0]), np.array([0.0])), w)
    w = Workload()
    x = w.add_task(1.0, 0)
    y = w.add_task(1.0, 0, after=[x])
    w.add_dependencies(y, x)
    with pytest.raises(SimulationError, match="cycle"):
        simulate_dag(net, w)
    # timed releases go to the reference engine
    w = Workload()
    t = w.add_task(1.0, NO_RESOURCE, release=2.0)
    assert simulate_dag(net, w).finish[t] == pytest.approx(3.0)


@pytest.mark.parametrize("seed", range(4))
def test_simulate_dag_equals_simulate_over_many_warm_solves(seed):
    # long runs of warm solves on shared multi-hop routes with ties (equal capacities
    # and sizes on odd seeds): the links' load kept as running sums between fresh sums
    # (_dag_kernel._REFRESH) stays within 1e-7 of the reference engine's times
    rng = np.random.default_rng(300 + seed)
    L = 24
    cap = np.full(L, 10e9) if seed % 2 else rng.choice([10e9, 25e9, 40e9], size=L)
    net = Network(cap, np.full(L, 1e-6))
    w = layered_multihop_workload(rng, L, layers=10, width=40)
    ref, got = simulate(net, w), simulate_dag(net, w)
    assert got.events == ref.events > 6 * _REFRESH
    for field in ("start", "finish", "tx_end"):
        np.testing.assert_allclose(getattr(got, field), getattr(ref, field), rtol=1e-7,
                                   atol=1e-15, equal_nan=True)
    assert got.makespan == pytest.approx(ref.makespan, rel=1e-7)


def _kernel_rates(cap, routes, flow_class, act, state=None, warm=False, count=None,
                  refresh_every=3):
    """Rates of the active flows ``act`` from the compiled engine's max-min solve (flow
    ``f`` standing for ``count[f]`` identical flows); the links' load is summed afresh
    on every ``refresh_every``-th solve of a ``state``, between them kept as running sums."""
    C, L = len(routes), cap.size
    if state is None:
        state = [np.zeros(C, np.int64), np.zeros(C, np.int64), np.empty(flow_class.size,
                 np.int64), 0, np.zeros(C), np.zeros(L), np.zeros(L), 0]
    if count is None:
        count = np.ones(flow_class.size, np.int64)
    mult, pmult, prev_cls, nprev, crate, aload, aweight, nsolve = state
    rate = np.empty(act.size)
    lptr, lcls, _ = link_classes(flow_class, routes.ptr, routes.link, L)
    iscratch = np.zeros((5, L), np.int64)
    iscratch[3] = -1
    state[3] = _solve(act, act.size, flow_class, count, routes.ptr, routes.link, routes.weight, cap,
                      warm, nsolve % refresh_every == 0, mult, pmult, prev_cls, nprev, crate,
                      aload, aweight, lptr, lcls, np.zeros((4, L)), iscratch, np.zeros(C, bool),
                      rate)
    state[7] = nsolve + 1
    return rate, state


def _random_problem(seed):
    rng = np.random.default_rng(seed)
    L, C = 10, 12
    cap = rng.choice([1.0, 2.0, 3.0, 5.0], size=L)
    rows = [rng.choice(L, size=int(rng.integers(1, 5)), replace=False) for _ in range(C)]
    routes = FlowRoutes.from_lists(rows, [rng.choice([0.5, 1.0, 2.0], size=r.size)
                                          for r in rows])
    flow_class = np.repeat(np.arange(C), rng.integers(1, 4, size=C))
    return rng, cap, rows, routes, flow_class


def _expanded(cap, rows, routes, flows):
    ef = np.concatenate([np.full(len(rows[c]), i) for i, c in enumerate(flows)])
    el = np.concatenate([routes.row(c)[0] for c in flows])
    ew = np.concatenate([routes.row(c)[1] for c in flows])
    return max_min_rates(cap, ef, el, ew, flows.size)


@pytest.mark.parametrize("seed", range(6))
def test_class_rows_weighted_by_count_equal_max_min_on_the_expanded_flows(seed):
    # the compiled engine solves one row per route class, weighted by its active count
    rng, cap, rows, routes, flow_class = _random_problem(seed)
    act = rng.permutation(flow_class.size)
    rate, _ = _kernel_rates(cap, routes, flow_class, act)
    np.testing.assert_allclose(rate, _expanded(cap, rows, routes, flow_class[act]), rtol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_a_flow_standing_for_k_flows_weighs_k_in_max_min(seed):
    # a merged flow node (flow_count k) gets the rate each of its k copies would get
    rng, cap, rows, routes, flow_class = _random_problem(seed)
    count = rng.integers(1, 4, size=flow_class.size)
    act = rng.permutation(flow_class.size)
    rate, _ = _kernel_rates(cap, routes, flow_class, act, count=count)
    copies = np.repeat(act, count[act])
    expanded = _expanded(cap, rows, routes, flow_class[copies])
    np.testing.assert_allclose(np.repeat(rate, count[act]), expanded, rtol=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_warm_started_filling_equals_a_fresh_filling(seed):
    # remove random flows from a solved problem: resuming the filling below the
    # first level that lost a flow gives the fresh solution
    rng, cap, rows, routes, flow_class = _random_problem(seed)
    act = rng.permutation(flow_class.size)
    _, state = _kernel_rates(cap, routes, flow_class, act)
    for _ in range(5):
        act = act[rng.random(act.size) < 0.8]
        if not act.size:
            break
        warm, state = _kernel_rates(cap, routes, flow_class, act, state, warm=True)
        np.testing.assert_allclose(warm, _expanded(cap, rows, routes, flow_class[act]),
                                   rtol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_filling_with_most_classes_idle_equals_max_min_on_the_expanded_flows(seed):
    # a few transmitting classes among many the graph uses (an all-to-all's idle
    # pairs): the solve lists its own link -> class rows, with the same rates
    rng = np.random.default_rng(100 + seed)
    L, C = 12, 60
    cap = rng.choice([1.0, 2.0, 3.0, 5.0], size=L)
    rows = [rng.choice(L, size=int(rng.integers(1, 5)), replace=False) for _ in range(C)]
    routes = FlowRoutes.from_lists(rows, [rng.choice([0.5, 1.0, 2.0], size=r.size)
                                          for r in rows])
    flow_class = np.repeat(np.arange(C), rng.integers(1, 3, size=C))
    act = rng.choice(flow_class.size, size=6, replace=False)
    assert routes.ptr[-1] > 3 * (routes.ptr[flow_class[act] + 1]
                                 - routes.ptr[flow_class[act]]).sum()
    rate, state = _kernel_rates(cap, routes, flow_class, act)
    np.testing.assert_allclose(rate, _expanded(cap, rows, routes, flow_class[act]), rtol=1e-12)
    # and warm, after some of them end
    act = act[:3]
    warm, _ = _kernel_rates(cap, routes, flow_class, act, state, warm=True)
    np.testing.assert_allclose(warm, _expanded(cap, rows, routes, flow_class[act]), rtol=1e-12)


def test_link_classes_lists_each_used_class_once_per_entry():
    routes = FlowRoutes.from_lists([[0, 2], [1], [2, 0, 1], [1]], [[1, 1], [1], [1, 2, 1], [1]])
    ptr, cls, ent = link_classes(np.array([2, 0, 0]), routes.ptr, routes.link, 3)
    assert (routes.link[ent] == np.repeat(np.arange(3), np.diff(ptr))).all()
    rows = [sorted(cls[ptr[k]:ptr[k + 1]].tolist()) for k in range(3)]
    assert rows == [[0, 2], [2], [0, 2]]   # classes 1 and 3 carry no flow


@pytest.mark.parametrize("block", range(4))
def test_warm_solves_as_flows_come_and_go_equal_a_fresh_filling(block):
    # flows added and removed between solves (several classes gaining flows on one
    # link among them): the filling resumes below the first level a removed flow or
    # the added ones can move, and gives the fresh solution
    for seed in range(50 * block, 50 * block + 50):
        rng = np.random.default_rng(seed)
        L, C = int(rng.integers(5, 30)), int(rng.integers(5, 60))
        cap = rng.choice([1.0, 2.0, 3.0, 5.0], size=L) * rng.uniform(0.5, 2, size=L)
        rows = [rng.choice(L, size=int(rng.integers(1, min(L, 8))), replace=False)
                for _ in range(C)]
        routes = FlowRoutes.from_lists(rows, [rng.uniform(0.1, 2.0, size=r.size)
                                              for r in rows])
        flow_class = np.repeat(np.arange(C), rng.integers(1, 4, size=C))
        count = rng.integers(1, 4, size=flow_class.size)
        pool = rng.permutation(flow_class.size)
        act = pool[:pool.size // 2]
        _, state = _kernel_rates(cap, routes, flow_class, act, count=count)
        for _ in range(20):
            keep = act[rng.random(act.size) < 0.8]
            idle = np.setdiff1d(pool, keep)
            act = np.concatenate([keep, rng.choice(idle, size=min(idle.size,
                                                                  int(rng.integers(0, 3))),
                                                   replace=False)])
            if not act.size:
                break
            warm, state = _kernel_rates(cap, routes, flow_class, act, state, warm=True,
                                        count=count)
            copies = np.repeat(act, count[act])
            np.testing.assert_allclose(np.repeat(warm, count[act]),
                                       _expanded(cap, rows, routes, flow_class[copies]),
                                       rtol=1e-12, err_msg=f"seed {seed}")


def test_route_classes_merge_identical_rows_only():
    routes = FlowRoutes.from_lists([[0, 1], [2], [0, 1], [0, 1], []], [[1, 1], [1], [1, 1],
                                                                     [1, 2], []])
    klass, rows = route_classes(routes)
    assert klass.tolist() == [0, 1, 0, 2, 3]
    assert len(rows) == 4 and rows.row(2)[1].tolist() == [1.0, 2.0]


class _Exact:
    """An IterationCost seen without its bound support (always exact times)."""

    def __init__(self, cost):
        self.cost = cost

    def __call__(self, strategy):
        return self.cost(strategy)


@pytest.mark.parametrize("model_name,size", [("dlrm", SMALL_DLRM), ("bert", SMALL_BERT)])
def test_bounded_costs_leave_the_chain_unchanged(model_name, size):
    # the search reads the next acceptance draw ahead and lets the cost stop at the
    # rejection threshold: same chain as with exact times, fewer simulated events
    n = 8
    job = Job(model_name, batch_per_gpu=16, size=size)
    model = model_of(job)
    cluster = cluster_of(n)
    space = StrategySpace.build(model, cluster, job)
    start = start_strategy(model, cluster, job, space)
    fabrics = fabrics_of(n, model, cluster, job)
    for fabric, rings in (fabrics["fattree"], fabrics["topoopt"]):
        bounded = IterationCost(model, cluster, job, fabric, rings)
        exact = IterationCost(model, cluster, job, fabric, rings)
        never = (lambda: False)  # independent of a Ctrl-C flag left by other tests
        a = mcmc_search(space, bounded, start, 100, seed=4, stop=never)
        b = mcmc_search(space, _Exact(exact), start, 100, seed=4, stop=never)
        assert a.best.configs == b.best.configs
        assert (a.best_time, a.start_time, a.accepted, a.trace) == \
            (b.best_time, b.start_time, b.accepted, b.trace)
        assert bounded.lower  # some candidates were cut short
        for key, low in bounded.lower.items():
            assert exact.memo[key] >= low


@pytest.mark.parametrize("kind", ["routes", "configs"])
@pytest.mark.parametrize("fabric_name", ["ideal", "fattree", "topoopt"])
def test_cache_resets_keep_the_estimates_and_bounds(fabric_name, kind):
    # memory bounds: a builder past its limits drops its route-derived caches (route
    # classes numbered afresh) or its per-config caches (configs numbered afresh)
    # before each graph; its graphs' times and its bounds, asked for between builds as
    # the search does, must be those of a builder that never resets
    n = 8
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    model = model_of(job)
    cluster = cluster_of(n)
    fabric, rings = fabrics_of(n, model, cluster, job)[fabric_name]
    tiny = FastEstimator(model, cluster, job, fabric, rings)
    if kind == "routes":
        tiny.builder.route_limit = tiny.builder.coflow_limit = 0
    else:
        tiny.builder.config_limit = 0
    resets = {"routes": 0, "configs": 0}
    for name in resets:
        reset = getattr(tiny.builder, f"reset_{name}")

        def counted(reset=reset, name=name):
            resets[name] += 1
            reset()

        setattr(tiny.builder, f"reset_{name}", counted)
    fast = FastEstimator(model, cluster, job, fabric, rings)
    strategies = random_strategies(model, cluster, job, 8, seed=11)
    for s in strategies:
        for _ in range(2):      # bounds before a build, and after one (which reset)
            assert tiny.builder.lower_bound(s) == fast.builder.lower_bound(s)
            assert tiny.builder.link_bound(s) == fast.builder.link_bound(s)
            assert tiny.builder.critical_path_bound(s) == fast.builder.critical_path_bound(s)
            assert_same(fast.estimate(s), tiny.estimate(s))
    # not vacuous: every build reset that kind of cache (but perhaps the first one's
    # routes, if its bounds routed nothing yet), and only that kind
    assert resets[kind] >= 2 * len(strategies) - 1
    assert resets["configs" if kind == "routes" else "routes"] == 0
    if kind == "routes":
        assert tiny.builder.routes.store.rows < fast.builder.routes.store.rows


@pytest.mark.parametrize("n", [8, 16])
def test_the_analytical_bound_is_below_every_simulated_time(n):
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    model = model_of(job)
    cluster = cluster_of(n)
    strategies = random_strategies(model, cluster, job, 25, seed=n)
    for fabric, rings in fabrics_of(n, model, cluster, job).values():
        fast = FastEstimator(model, cluster, job, fabric, rings)
        loaded = 0
        for s in strategies:
            lb, t = fast.builder.lower_bound(s), fast.total(s)
            assert 0 < lb <= t * (1 + 1e-12)
            # the busiest link's bits over its capacity: also below the simulated time
            busiest = link_load_bound(fabric.capacity, fast.graph(s).dag)
            assert busiest <= t * (1 + 1e-12)
            loaded += busiest > 0.5 * t
            # the same bound from the traffic matrix, before the graph is built
            assert fast.builder.link_bound(s) == pytest.approx(busiest, rel=1e-12)
        assert loaded  # and not vacuous: close to the time on some strategies


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("model_name,size", [("dlrm", SMALL_DLRM), ("bert", SMALL_BERT)])
def test_the_critical_path_bound_is_below_every_simulated_time(model_name, size, overlap):
    n = 8
    job = Job(model_name, batch_per_gpu=16, size=size)
    model = model_of(job)
    cluster = cluster_of(n)
    strategies = random_strategies(model, cluster, job, 25, seed=3)
    for name, (fabric, rings) in fabrics_of(n, model, cluster, job).items():
        fast = FastEstimator(model, cluster, job, fabric, rings, overlap=overlap)
        sees_more = 0
        for s in strategies:
            cp, t = fast.builder.critical_path_bound(s), fast.total(s)
            assert 0 < cp <= t, (name, cp, t)
            other = max(fast.builder.lower_bound(s), fast.builder.link_bound(s))
            sees_more += cp > other
        # not vacuous: BERT's layers are a chain the busiest server or link bounds miss
        # (random DLRM strategies here pile their tables' lookups onto a server instead)
        assert sees_more >= (5 if model_name == "bert" else 0), name


def test_the_critical_path_bound_is_the_time_of_a_chain_without_contention():
    # two layers on two servers of an Ideal Switch: forward, the activation over,
    # forward, backward, the gradient back, backward, update; nothing waits for a
    # server or a link, so the longest chain is the time
    ops = (Operator("a", "dense", params=1 << 20, fwd_flops=4e9, bwd_flops=8e9,
                    out_elems=1 << 20),
           Operator("b", "dense", params=1 << 20, fwd_flops=4e9, bwd_flops=8e9,
                    out_elems=1 << 10, inputs=("a",)))
    model = Model("chain", ops)
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    cluster = cluster_of(2)
    fabric = ideal_switch(2, cluster.server_bandwidth)
    s = Strategy((OpConfig((0,), 1, 1), OpConfig((1,), 1, 1)))
    fast = FastEstimator(model, cluster, job, fabric)
    t = fast.total(s)
    graph = fast.graph(s)
    assert (graph.flow_kind == FLOW_MP).sum() == 2
    assert fast.builder.critical_path_bound(s) == pytest.approx(t, rel=1e-8)
    # not vacuous: the two transfers are a good part of the time
    assert 2 * graph.flow_bytes[0] * 8 / cluster.server_bandwidth > 0.1 * t


def test_the_critical_path_bound_refuses_random_paths():
    n = 8
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    model = model_of(job)
    cluster = cluster_of(n)
    drawn = IterationGraphBuilder(model, cluster, job, fat_tree(n, cluster.server_bandwidth),
                                  random_paths=True, seed=7)
    with pytest.raises(ValueError, match="random_paths"):
        drawn.critical_path_bound(start_strategy(model, cluster, job))


# --- merging a pass's MP transfers ----------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_merge_transfers_equals_unique_bincount_and_distinct_pairs(seed):
    from topoopt.estimate._mp_kernel import merge_transfers
    rng = np.random.default_rng(seed)
    n, nseg = 6, 5
    size = int(rng.integers(0, 400))
    seg = rng.choice([0, 2, 3], size)            # consumer segments 1 and 4 absent
    keys = seg * n * n + rng.integers(0, n * n, size) // (1 + seed % 2)
    nbytes = rng.random(size) * 1e6
    preds = rng.integers(-3, 9, size)            # < 0: barrier placeholders (-1 too)
    uk, inv, sizes, k_of, p_of = merge_transfers(keys, nbytes, preds, n * n, nseg)
    ref_uk, ref_inv = np.unique(keys, return_inverse=True)
    np.testing.assert_array_equal(uk, ref_uk)
    np.testing.assert_array_equal(inv, ref_inv.ravel())
    np.testing.assert_array_equal(sizes, np.bincount(ref_inv.ravel(), nbytes, uk.size))
    pairs = sorted({(int(k), int(p)) for k, p in zip(ref_inv.ravel(), preds)})
    assert list(zip(k_of.tolist(), p_of.tolist())) == pairs


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("fabric_name", ["ideal", "fattree", "topoopt"])
def test_mp_barriers_keep_every_time_and_cut_dependencies(fabric_name, overlap):
    # tables sharing a config feed the interaction: their flows wait for them through
    # one barrier per source; each node's times must be those of the graph without
    n = 16
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    model = model_of(job)
    cluster = cluster_of(n)
    fabric, rings = fabrics_of(n, model, cluster, job)[fabric_name]
    strategies = [_sharded_tables(model, n, k) for k in (4, 16)]
    strategies += random_strategies(model, cluster, job, 10, seed=4)
    graphs = {mb: IterationGraphBuilder(model, cluster, job, fabric, rings, overlap,
                                        merge_flows=True, mp_barriers=mb)
              for mb in (False, True)}
    for i, s in enumerate(strategies):
        plain, joined = graphs[False].build(s), graphs[True].build(s)
        if i < 2:   # 8 tables sharing a config: a barrier per source
            assert joined.barriers > plain.barriers
            # per-pair flows (the Ideal Switch): a dependency per table and per flow
            # instead of one per (table, flow); coflows already waited once each
            assert joined.dep_before.size <= plain.dep_before.size + joined.barriers
            if fabric_name == "ideal":
                assert joined.dep_before.size < plain.dep_before.size
                # the tables' gradients: the first table's flows stand for all eight
                assert joined.flow_kind.size < plain.flow_kind.size
                assert joined.counts().sum() == plain.counts().sum()
        # every byte is still sent
        assert (joined.counts() * joined.flow_bytes).sum() == pytest.approx(
            (plain.counts() * plain.flow_bytes).sum(), rel=1e-12)
        runs = [run_dag(fabric.capacity, g.dag) for g in (plain, joined)]
        # every task starts and ends at the same time (coflows may be numbered apart;
        # an aliased table's coflow bytes are summed in another order: to 1e-12)
        rel = 0.0 if fabric_name == "ideal" else 1e-12
        for a, b in zip(runs[0][:2], runs[1][:2]):
            np.testing.assert_allclose(b[:plain.tasks], a[:plain.tasks], rtol=rel, atol=0)
        assert runs[0][3] == runs[1][3]     # events
        # and the reference engine agrees on the joined graph
        ref = simulate(fabric, joined.workload, check=True)
        assert ref.makespan == pytest.approx(np.nanmax(runs[1][1]), rel=REL)


def test_row_ranks_equal_unique_rows():
    from topoopt.estimate.mp_flows import row_ranks as _row_ranks
    rng = np.random.default_rng(1)
    rows = rng.integers(-1, 3, (7, 4))
    mat = rows[rng.integers(0, 7, 200)]
    np.testing.assert_array_equal(_row_ranks(mat),
                                  np.unique(mat, axis=0, return_inverse=True)[1].ravel())


@pytest.mark.parametrize("mp_flows", ["pair", "coflow"])
def test_dense_and_sorted_mp_merges_build_the_same_graph(monkeypatch, mp_flows):
    import topoopt.estimate.mp_flows as graph
    n = 8
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    model = model_of(job)
    cluster = cluster_of(n)
    fabric = fat_tree(n, cluster.server_bandwidth / 2)
    for s in random_strategies(model, cluster, job, 8, seed=3):
        monkeypatch.setattr(graph, "_DENSE_PER_TRANSFER", 1 << 40)
        dense = build_iteration(model, s, cluster, job, fabric, mp_flows=mp_flows)
        monkeypatch.setattr(graph, "_DENSE_PER_TRANSFER", 0)
        monkeypatch.setattr(graph, "_DENSE_MIN", 0)
        sort = build_iteration(model, s, cluster, job, fabric, mp_flows=mp_flows)
        monkeypatch.undo()
        for f in ("flow_class", "flow_bytes", "flow_latency", "flow_kind"):
            np.testing.assert_array_equal(getattr(dense, f), getattr(sort, f))
        deps = [np.unique(np.stack([g.dep_before, g.dep_after], 1), axis=0)
                for g in (dense, sort)]
        np.testing.assert_array_equal(*deps)
        # each dependency once: a coflow waits for its members' predecessors once
        assert len(deps[0]) == dense.dep_before.size


# --- identical per-pair flows merged (merge_flows) ------------------------------------

def _sharded_tables(model, n, spread):
    """Every table sharded over ``spread`` aligned servers (mp), the rest data parallel
    on all ``n``: the backward of the interaction sends each table the same gradients."""
    from topoopt.strategy import OpConfig, Strategy
    everyone = OpConfig(tuple(range(n)), dp=n)
    return Strategy(tuple(OpConfig(tuple(range(spread)), dp=1, mp=spread)
                          if op.kind == "embedding" else everyone for op in model.operators))


@pytest.mark.parametrize("spread", [4, 16])
def test_merged_flows_give_the_reference_times_and_events(monkeypatch, spread):
    import topoopt.estimate.mp_flows as graph_mod

    monkeypatch.setattr(graph_mod, "_MERGE_MIN", 0)
    n = 16
    job = Job("dlrm", batch_per_gpu=16, size=SMALL_DLRM)
    model = model_of(job)
    cluster = cluster_of(n)
    fabric = ideal_switch(n, cluster.server_bandwidth)
    s = _sharded_tables(model, n, spread)
    fast = FastEstimator(model, cluster, job, fabric)
    merged = fast.graph(s)
    plain = build_iteration(model, s, cluster, job, fabric)
    assert plain.flow_count is None and merged.flow_count is not None
    # eight tables' gradient blocks became one: fewer nodes, the same flows in all
    assert merged.flow_kind.size < plain.flow_kind.size
    assert int(merged.counts().sum()) == plain.flow_kind.size
    assert (merged.counts() * merged.flow_bytes).sum() == pytest.approx(plain.flow_bytes.sum())
    ref = both(lambda *a, **k: estimate_iteration(*a, **k, reference=True),
               lambda *a, **k: fast.estimate(s), model, s, cluster, job, fabric)
    # the merged graph expanded back into its flows runs the same on the reference engine
    again = simulate(fabric, merged.workload, check=True)
    assert again.makespan == pytest.approx(ref.total, rel=REL) and again.events == ref.events
    # and the link-load bound counts every copy
    assert link_load_bound(fabric.capacity, merged.dag) == pytest.approx(
        link_load_bound(fabric.capacity, plain.dag), rel=1e-12)


def test_blocks_merge_only_when_pairs_bytes_and_predecessors_match():
    from topoopt.estimate.mp_flows import identical_blocks as _identical_blocks

    seg = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    pair = np.array([1, 2, 1, 2, 1, 2, 1, 3])
    sizes = np.array([5.0, 6.0, 5.0, 6.0, 5.0, 7.0, 5.0, 6.0])
    k_of = np.arange(8)
    p_of = np.array([9, 9, 9, 9, 9, 9, 9, 9])
    flow_of, count = _identical_blocks(seg, pair, sizes, k_of, p_of)
    # block 1 matches block 0; block 2 differs in bytes, block 3 in a pair
    assert flow_of.tolist() == [0, 1, 0, 1, 4, 5, 6, 7]
    assert count.tolist() == [2, 2, 0, 0, 1, 1, 1, 1]
    # another predecessor keeps a block apart
    p_of = np.array([9, 9, 9, 8, 9, 9, 9, 9])
    assert _identical_blocks(seg, pair, sizes, k_of, p_of)[1] is None
