"""Cross-seeding started as the searches end (topoopt.planners.crossing): the plan does
not depend on the order in which searches and timings end, and adoption keeps the
first of the fastest strategies."""

import json
import random

import pytest

from topoopt import Cluster, Job
from topoopt.executor import SerialExecutor
from topoopt.planners.crossing import CrossUnit, Evaluation, adopt, cross_pairs, cross_time
from topoopt.planners.planner import plan
from topoopt.plans.document import plan_to_json
from topoopt.strategy import data_parallel, hybrid
from topoopt.workloads import model_of


class _Lazy:
    """A task that runs when its result is asked for, or when the executor picks it."""

    def __init__(self, fn, item, order):
        self.fn, self.item, self.ran, self.value, self.order = fn, item, False, None, order

    def run(self):
        if not self.ran:
            self.value, self.ran = self.fn(self.item), True
            self.order.append((self.fn.__name__, self.item.name))

    def result(self):
        self.run()
        return self.value


class ShuffledExecutor(SerialExecutor):
    """In-process tasks that end in a seeded random order: ``next_done`` runs tasks
    started so far, drawn at random one by one, until one of those it waits for has
    ended, then names a random one of those as ended."""

    name = "shuffled"

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.started = []
        self.order = []     # (function, item name), in the order they ran

    def submit(self, fn, item):
        self.started.append(_Lazy(fn, item, self.order))
        return self.started[-1]

    def next_done(self, pending):
        while not any(t.ran for t in pending):
            self.rng.choice([t for t in self.started if not t.ran]).run()
        return self.rng.choice([i for i, t in enumerate(pending) if t.ran])


def _small(executor=None):
    # five fabrics whose bests differ: cross-seeding times 20 pairs, and adopts
    cluster = Cluster(servers=12, nics=2, link_bandwidth=100e9)
    job = Job("ncf", batch_per_gpu=16, size={"tables": 4, "rows": 1000, "top_layers": 2})
    return plan(cluster, job, budget=12, rounds=1, chains=2, seed=1, executor=executor)


@pytest.fixture(scope="module")
def serial_doc():
    return json.dumps(plan_to_json(_small()), sort_keys=True)


def test_plan_does_not_depend_on_completion_order(serial_doc):
    orders = []
    for seed in (0, 1, 2):
        ex = ShuffledExecutor(seed)
        assert json.dumps(plan_to_json(_small(ex)), sort_keys=True) == serial_doc
        orders.append(tuple(ex.order))
        # timings ran while searches were still to end
        last_search = max(i for i, (fn, _) in enumerate(ex.order) if fn == "search_one_fabric")
        assert any(fn == "cross_time" for fn, _ in ex.order[:last_search])
    assert len(set(orders)) == len(orders)
    doc = json.loads(serial_doc)
    assert doc["search"]["adopted_from"] or any(f["adopted_from"]
                                                for f in doc["fabrics"].values())


def _eval(fabric, strategy, time):
    return Evaluation(fabric, strategy, time, estimate=None, cost=None)


def test_adoption_keeps_the_first_of_the_fastest():
    model = model_of(Job("dlrm", batch_per_gpu=64, size={"tables": 4, "rows": 100_000}))
    dp, hy = data_parallel(model, 8), hybrid(model, 8)
    names = ("topoopt", "ideal", "fattree")
    own = {"topoopt": _eval("topoopt", dp, 3.0), "ideal": _eval("ideal", hy, 1.0),
           "fattree": _eval("fattree", hy, 2.0)}
    strategies = {n: e.strategy for n, e in own.items()}
    # hy once for the shard (ideal's and fattree's are the same strategy), dp elsewhere
    assert cross_pairs(names, strategies) == [("topoopt", "ideal"), ("ideal", "topoopt"),
                                              ("fattree", "topoopt")]
    timed = {("topoopt", hy.configs): _eval("topoopt", hy, 2.5),
             ("ideal", dp.configs): _eval("ideal", dp, 1.0),      # a tie is not adopted
             ("fattree", dp.configs): _eval("fattree", dp, 1.5)}
    chosen = adopt(names, own, timed)
    assert chosen["topoopt"][1] == "ideal" and chosen["topoopt"][0].time == 2.5
    assert chosen["ideal"] == (own["ideal"], "")
    assert chosen["fattree"][1] == "topoopt" and chosen["fattree"][0].strategy is dp
    # the mapping's order (the order timings ended in) does not matter
    assert adopt(names, own, dict(reversed(list(timed.items())))) == chosen


def test_a_timing_does_not_depend_on_the_ones_before():
    cluster = Cluster(servers=8, nics=2, link_bandwidth=100e9)
    job = Job("dlrm", batch_per_gpu=64, size={"tables": 4, "rows": 100_000})
    model = model_of(job)
    from topoopt.fabrics.cost import DEFAULT_PRICES
    unit = {s.name: CrossUnit("expander", cluster, job, s, DEFAULT_PRICES)
            for s in (data_parallel(model, 8), hybrid(model, 8))}
    alone = cross_time(unit["hybrid"])
    cross_time(unit["dp"])
    after = cross_time(unit["hybrid"])
    assert after.time == alone.time and after.estimate == alone.estimate


@pytest.mark.parametrize("fabric", ["topoopt", "expander", "fattree"])
@pytest.mark.parametrize("make", [data_parallel, hybrid])
def test_a_timing_with_a_time_to_beat_decides_as_the_full_one(make, fabric):
    # the fabric's own best is what a strategy must beat to be adopted: below it the
    # timing is the one without it (time, estimate; the shard's topology); at or above
    # it, a lower bound that says "not faster" without the shard's other splits' routes
    # or an estimate
    cluster = Cluster(servers=16, nics=4, link_bandwidth=100e9)
    job = Job("dlrm", batch_per_gpu=64, size={"tables": 8, "rows": 100_000})
    from topoopt.fabrics.cost import DEFAULT_PRICES
    s = make(model_of(job), 16)
    full = cross_time(CrossUnit(fabric, cluster, job, s, DEFAULT_PRICES))
    assert full.estimate is not None and full.estimate.total == pytest.approx(full.time)
    above = cross_time(CrossUnit(fabric, cluster, job, s, DEFAULT_PRICES,
                                 beat=full.time * 1.5))
    assert above.time == full.time and above.estimate == full.estimate
    assert above.cost == full.cost
    if fabric == "topoopt":
        assert above.topology_plan.topology == full.topology_plan.topology
    other = (hybrid if make is data_parallel else data_parallel)(model_of(job), 16)
    for beat in (full.time, full.time * 0.99, full.time * 0.3):
        slower = cross_time(CrossUnit(fabric, cluster, job, s, DEFAULT_PRICES, beat=beat))
        assert slower.estimate is None and slower.cost is None
        assert slower.time >= beat          # a lower bound, at or above beat
        # never adopted when the fabric's own best is the time to beat
        own = {fabric: _eval(fabric, other, beat), "ideal": _eval("ideal", s, 1.0)}
        timed = {(fabric, s.configs): slower, ("ideal", other.configs): _eval("ideal", other, 2.0)}
        assert adopt((fabric, "ideal"), own, timed)[fabric] == (own[fabric], "")
