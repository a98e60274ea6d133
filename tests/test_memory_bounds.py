"""What keeps the TopoOpt shard's search within its memory (docs/limits.md, "Memory"):
explicit routes as arrays, releasable estimator caches, a bound on the warm costs, and
no reference cycles (what only Python's cyclic collector frees stays held until it runs)."""

import gc
import weakref
from contextlib import contextmanager

import numpy as np
import pytest

import topoopt.planners.alternating as alternating
from topoopt.cluster import Cluster, Job
from topoopt.estimate import FastEstimator
from topoopt.fabrics._router import _explicit_arrays
from topoopt.fabrics.cost import DEFAULT_PRICES
from topoopt.fabrics.direct import LinkPaths, direct_connect
from topoopt.finder.topology_finder import TopologyDraft
from topoopt.planners.alternating import alternating_optimization, plan_topology, start_strategy
from topoopt.planners.cost import IterationCost
from topoopt.planners.planner import FabricTask, search_one_fabric
from topoopt.planners.space import StrategySpace
from topoopt.planners.structure import structured_strategies
from topoopt.strategy import hybrid
from topoopt.workloads import model_of

SMALL_DLRM = {"tables": 8, "rows": 200_000, "dim": 64, "bag": 20, "bottom_layers": 2,
              "bottom_width": 256, "top_layers": 2, "top_width": 512}


def small(servers=16):
    cluster = Cluster(servers=servers, nics=4, link_bandwidth=100e9, link_latency=1e-6)
    job = Job("dlrm", batch_per_gpu=32, size=SMALL_DLRM)
    model = model_of(job)
    return cluster, job, model, StrategySpace.build(model, cluster, job)


def shard(servers=16):
    """A TopologyFinder plan with explicit routes (the hybrid's MP traffic), and its job."""
    cluster, job, model, space = small(servers)
    plan = plan_topology(model, hybrid(model, servers), cluster, job)
    assert len(plan.routes)          # not vacuous: pairs routed over other servers
    return cluster, job, model, space, plan


def test_explicit_routes_are_arrays_equal_to_the_routes_paths():
    *_, plan = shard()
    fabric = direct_connect(plan.topology, plan.routes, rings=plan.rings)
    explicit = fabric.explicit
    assert isinstance(explicit, LinkPaths)
    # independently: every hop of a node path is the bundled link from its node to
    # the next, with the path's fraction
    link_of = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(fabric.src, fabric.dst))}
    assert list(explicit) == list(plan.routes.paths)
    assert len(explicit) == len(plan.routes)
    for pair, options in plan.routes.paths.items():
        got = explicit[pair]
        assert pair in explicit
        assert len(got) == len(options)
        for (links, frac), (nodes, want_frac) in zip(got, options):
            assert links.tolist() == [link_of[h] for h in zip(nodes, nodes[1:])]
            assert frac == want_frac
        assert [(tuple(np.asarray(p).tolist()), w) for p, w in fabric.paths(*pair)] == \
            [(tuple(links.tolist()), frac) for links, frac in got]
    missing = next((s, t) for s in range(16) for t in range(16)
                   if s != t and (s, t) not in plan.routes.paths)
    assert missing not in explicit and "x" not in explicit
    with pytest.raises(KeyError):
        explicit[missing]


def test_explicit_arrays_equal_those_of_the_same_routes_as_tuples():
    # the router loads an array-backed mapping without its tuples: the same arrays
    # as from a plain mapping of the same routes, so the same routes
    *_, plan = shard()
    fabric = direct_connect(plan.topology, plan.routes, rings=plan.rings)
    as_dict = {k: tuple((np.array(p), f) for p, f in v) for k, v in fabric.explicit.items()}
    for got, want in zip(_explicit_arrays(fabric.explicit), _explicit_arrays(as_dict)):
        assert got.dtype.kind == want.dtype.kind
        assert np.array_equal(got, want)
    plain = type(fabric)(**{**{f: getattr(fabric, f) for f in fabric.__dataclass_fields__
                               if f != "_cache"}, "explicit": as_dict})
    n = fabric.servers
    src, dst = np.divmod(np.arange(n * n), n)
    keep = src != dst
    a, b = fabric.route(src[keep], dst[keep]), plain.route(src[keep], dst[keep])
    for name in ("ptr", "link", "weight"):
        assert np.array_equal(getattr(a, name), getattr(b, name))


def test_explicit_routes_load_the_same_in_runs_of_pairs(monkeypatch):
    """The router reads an array-backed mapping a run of pairs at a time (no table of
    every hop's link at once): the runs join to the whole, and the routes are the same
    whatever the run's length."""
    import topoopt.fabrics._router as router
    import topoopt.fabrics.direct as direct

    *_, plan = shard()
    fabric = direct_connect(plan.topology, plan.routes, rings=plan.rings)
    whole = fabric.explicit.link_arrays()
    for hops, table in ((1, True), (7, False), (50, True), (10 ** 9, False)):
        # the hops' links read from a dense table, or searched for
        monkeypatch.setattr(direct, "_TABLE_ENTRIES", 1 << 24 if table else 0)
        runs = list(fabric.explicit.link_chunks(hops))
        assert len(runs) > 1 or hops == 10 ** 9
        for got, want in zip(zip(*runs), whole):
            assert np.array_equal(np.concatenate(got), want)
    monkeypatch.undo()
    n = fabric.servers
    src, dst = np.divmod(np.arange(n * n), n)
    keep = src != dst
    group = np.arange(keep.sum()) % 7          # coflows: the store as a matrix too
    share = np.linspace(0.5, 1.0, keep.sum())

    def routed(f):
        return f.route(src[keep], dst[keep]), f.coupled_route(src[keep], dst[keep], group,
                                                              share, 7)

    want, (want_c, want_lat) = routed(fabric)
    monkeypatch.setattr(router, "_EXPLICIT_CHUNK", 5)
    got, (got_c, got_lat) = routed(direct_connect(plan.topology, plan.routes,
                                                  rings=plan.rings))
    for name in ("ptr", "link", "weight"):
        assert np.array_equal(getattr(got, name), getattr(want, name))
        assert np.array_equal(getattr(got_c, name), getattr(want_c, name))
    assert np.array_equal(got_lat, want_lat)      # the rows' latencies summed in runs


def test_a_released_cost_gives_the_same_times_and_keeps_its_memo():
    cluster, job, model, space, plan = shard()
    strategies = [lay.strategy for lay in structured_strategies(model, space)][:4]
    strategies.append(start_strategy(model, cluster, job, space))

    def cost():
        fabric = direct_connect(plan.topology, plan.routes, rings=plan.rings)
        return IterationCost(model, cluster, job, fabric, plan.rings)

    warm, cold = cost(), cost()
    for s in strategies:
        want = (warm(s), warm.lower_bound(s, links=True))
        cold.release()
        assert not cold.fabric._cache and cold.fabric.routes_nbytes == 0   # the router's went
        cold.memo.clear()                  # (simulated again, not remembered)
        cold.lower.clear()
        assert (cold(s), cold.lower_bound(s, links=True)) == want
    cold.fabric.route([0], [1])
    assert cold.fabric.routes_nbytes > 0               # (what a release gives back)
    t = cold(strategies[0])
    evaluations = cold.evaluations
    cold.release()
    assert cold.memo[strategies[0].configs] == t == cold(strategies[0])
    assert cold.evaluations == evaluations


def test_route_classes_make_their_pair_tables_only_for_pair_flows():
    # n^2 entries per fabric: a builder whose MP flows are coflows never needs them
    cluster, job, model, space, plan = shard()
    fabric = direct_connect(plan.topology, plan.routes, rings=plan.rings)
    fast = FastEstimator(model, cluster, job, fabric, plan.rings)
    fast.total(hybrid(model, cluster.servers))
    assert fast.builder.mp_flows == "coflow" and fast.builder.routes._pairs.size == 0
    pairs = FastEstimator(model, cluster, job, fabric, plan.rings, mp_flows="pair")
    assert pairs.total(hybrid(model, cluster.servers)) > 0
    assert pairs.builder.routes._pairs.size == cluster.servers ** 2


def _run(monkeypatch, warm, warm_bytes=1 << 30):
    """The alternation with ``WARM_COSTS = warm`` and ``WARM_BYTES = warm_bytes``: its
    result, and per cost asked for, (costs kept, warm costs, whether every cold one had
    released its caches)."""
    cluster, job, model, space = small(8)
    monkeypatch.setattr(alternating, "WARM_COSTS", warm)
    monkeypatch.setattr(alternating, "WARM_BYTES", warm_bytes)
    seen = []
    asked = alternating._Shard.cost

    def cost(self, plan):
        out = asked(self, plan)
        cold = [c for key, (_, c) in self.costs.items() if key not in self.warm]
        seen.append((len(self.costs), len(self.warm), all(not c.fabric._cache for c in cold)))
        # every kept cost's plan is alive: a plan no one holds takes its cost with it
        assert all(ref() is not None for ref, _ in self.costs.values())
        return out

    monkeypatch.setattr(alternating._Shard, "cost", cost)
    found = alternating_optimization(model, cluster, job, start_strategy(model, cluster, job),
                                     rounds=2, budget=6, chains=2,
                                     layouts=structured_strategies(model, space))
    return found, seen


def test_the_warm_costs_are_bounded_and_the_result_does_not_depend_on_it(monkeypatch):
    bounded, seen = _run(monkeypatch, 1)
    assert max(kept for kept, _, _ in seen) > 2     # not vacuous: many topologies timed
    assert max(warm for _, warm, _ in seen) == 1
    assert all(released for _, _, released in seen)
    unbounded, seen = _run(monkeypatch, 10 ** 6)
    assert all(kept == warm for kept, warm, _ in seen)
    by_bytes, seen = _run(monkeypatch, 10 ** 6, warm_bytes=1)    # one warm: the newest
    assert max(warm for _, warm, _ in seen) == 1 and all(released for _, _, released in seen)
    assert (by_bytes.strategy.configs, by_bytes.time, by_bytes.history) == (
        unbounded.strategy.configs, unbounded.time, unbounded.history)
    assert bounded.strategy.configs == unbounded.strategy.configs
    assert bounded.time == unbounded.time
    assert bounded.history == unbounded.history
    assert bounded.screened == unbounded.screened
    # the searches moved alike: the same starts, chain by chain the same curves
    for a, b in zip(bounded.searches, unbounded.searches, strict=True):
        assert a.starts == b.starts and a.stop == b.stop and a.moves == b.moves
        assert [c.trace for c in a.chains] == [c.trace for c in b.chains]


def test_the_screen_keeps_only_the_plans_the_first_round_reads(monkeypatch):
    # the start and the two fastest other screened strategies keep their topologies (and
    # costs); the others' go as soon as they fall behind, and the plan is the same
    cluster, job, model, space = small(8)
    layouts = structured_strategies(model, space)
    p = alternating._Shard(model, cluster, job, space, 0, {})
    screened, _ = alternating._screen(p, start_strategy(model, cluster, job, space), None,
                                      layouts, (), 4)
    assert len(screened) > 1 + alternating._RANKED                # not vacuous
    kept = [c for c in screened[1:] if c[2] is not None]
    fastest = sorted(screened[1:], key=lambda c: c[3])[:alternating._RANKED]
    assert screened[0][2] is not None
    assert [c[0] for c in kept] == [c[0] for c in screened[1:] if c in fastest]
    assert len(p.costs) == 1 + alternating._RANKED                 # the others' costs went

    def run():
        return alternating_optimization(model, cluster, job, start_strategy(model, cluster, job),
                                        rounds=1, budget=4, chains=2, layouts=layouts)

    lean = run()
    monkeypatch.setattr(alternating, "_keep_ranked_plans", lambda screened: None)
    whole = run()
    assert (lean.strategy.configs, lean.time, lean.origin, lean.screened, lean.history) == (
        whole.strategy.configs, whole.time, whole.origin, whole.screened, whole.history)


def test_the_screen_does_not_route_what_its_bound_puts_behind(monkeypatch):
    # a bound just below each strategy's time: those behind the two fastest others are
    # refused before their routes, with the bound as their time, and the plan is the same
    cluster, job, model, space = small(8)
    layouts = structured_strategies(model, space)
    start = start_strategy(model, cluster, job, space)
    draft = alternating._Shard.draft

    def run():
        return alternating_optimization(model, cluster, job, start, rounds=1, budget=4,
                                        chains=2, layouts=layouts)

    monkeypatch.setattr(TopologyDraft, "lower_bound", lambda self: 0.0)   # none refused
    p = alternating._Shard(model, cluster, job, space, 0, {})
    whole, none = alternating._screen(p, start, None, layouts, (), 4)
    assert none == frozenset()
    time_of = {s.configs: t for _, s, _, t in whole}
    routed = run()

    class Tight:
        def __init__(self, d, t):
            self.d, self.t = d, t

        def lower_bound(self):
            return self.t * (1 - 1e-12)

        def plan(self):
            return self.d.plan()

    monkeypatch.setattr(alternating._Shard, "draft",
                        lambda self, s: Tight(draft(self, s), time_of[s.configs]))
    p = alternating._Shard(model, cluster, job, space, 0, {})
    lean, marked = alternating._screen(p, start, None, layouts, (), 4)
    ref = {c[0]: c[3] for c in whole}
    refused = [c for c in lean if c[3] != ref[c[0]]]
    assert refused                                                   # not vacuous
    assert marked == {c[0] for c in refused}                # exactly those are marked
    ranked = sorted(c[3] for c in whole[1:])[:alternating._RANKED]
    for name, _, plan, t in refused:
        assert plan is None and t == ref[name] * (1 - 1e-12) and ref[name] > ranked[-1]
    found = run()
    assert (found.strategy.configs, found.time, found.origin, found.history) == (
        routed.strategy.configs, routed.time, routed.origin, routed.history)
    assert found.screened_bounds and not routed.screened_bounds
    assert found.screened_bounds <= {n for n, _ in found.screened}


@contextmanager
def _reference_counting_alone():
    """The block runs with Python's cyclic collector off: what it drops is freed at once
    or not at all."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _cyclic_garbage() -> list[str]:
    """The types, of topoopt's own, of the objects only the cyclic collector would free."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sorted({type(o).__qualname__ for o in gc.garbage
                       if type(o).__module__.startswith("topoopt")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_dropped_cost_frees_its_fabric_routes_and_caches_at_once():
    # the fabric keeps its router and the builder its bounds: neither may point back,
    # or a dropped topology's routes (gigabytes at 1024 servers) wait for the collector
    cluster, job, model, space, plan = shard()
    with _reference_counting_alone():
        fabric = direct_connect(plan.topology, plan.routes, rings=plan.rings)
        cost = IterationCost(model, cluster, job, fabric, plan.rings)
        s = start_strategy(model, cluster, job, space)
        assert cost(s) > 0 and cost.lower_bound(s, links=True) > 0
        core = fabric._cache["core"]
        builder = cost.fast.builder
        assert builder.bounds is not None and core.row_of.size    # (not vacuous)
        held = [weakref.ref(x) for x in (fabric, core, cost, builder, builder.bounds)]
        del fabric, core, cost, builder
        assert [r() for r in held] == [None] * len(held)
    assert _cyclic_garbage() == []


@pytest.mark.parametrize("name", ["topoopt", "expander", "fattree"])
def test_a_fabric_search_leaves_nothing_for_the_cyclic_collector(name):
    # a pool worker that ended its search sits idle: nothing makes Python collect the
    # cycles its search left, and at 1024 servers they were gigabytes
    cluster, job, model, space = small(16)
    with _reference_counting_alone():
        out = search_one_fabric(FabricTask(name, cluster, job, 4, 1, 2, 0, 0.01,
                                           DEFAULT_PRICES))
        assert out.time > 0
        del out
        assert _cyclic_garbage() == []
