"""The search's effort with the job's size (``search.descent_scale``, ``descent_limits``):
the limits as chosen at 128 servers up to that size, a share of them above that falls
with the size and never below a floor, and a search that keeps to them."""

import math

import pytest
from test_plan import tiny_search  # the two-operator job of the MCMC tests

import topoopt.planners.mcmc as mcmc
import topoopt.planners.search as search
from topoopt.planners.search import (
    BEST_DESCENT,
    DESCENT,
    DESCENT_SERVERS,
    MIN_DESCENT_SCALE,
    START_DESCENT,
    descent_limits,
    descent_scale,
    search_space,
)
from topoopt.planners.structure import structured_strategies

SIZES = [1, 2, 3, 4, 16, 64, 100, 127, 128, 129, 192, 256, 384, 512, 768, 1024, 4096]
BUDGETS = [0, 1, 2, 10, 25, 50, 99, 100, 101, 400, 10_000]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("servers", [n for n in SIZES if n <= DESCENT_SERVERS])
def test_up_to_the_reference_size_the_limits_are_the_unscaled_ones(servers, budget):
    # the limits before the rule (what the 128-server plans were made with)
    final = min(DESCENT, 4 * budget)
    assert descent_scale(servers) == 1.0
    assert descent_limits(servers, budget) == search.DescentLimits(
        min(START_DESCENT, 2 * budget), final,
        max(final, min(BEST_DESCENT, 16 * budget)) if final > 0 else 0)


def test_the_share_falls_with_the_size_and_stops_at_the_floor():
    scales = [descent_scale(n) for n in SIZES]
    assert all(a >= b for a, b in zip(scales, scales[1:]))
    assert min(scales) == MIN_DESCENT_SCALE and max(scales) == 1.0
    assert descent_scale(2 * DESCENT_SERVERS) < 1.0     # larger jobs do get less
    with pytest.raises(ValueError):
        descent_scale(0)


@pytest.mark.parametrize("budget", BUDGETS)
def test_the_limits_are_monotone_and_never_below_the_floors(budget):
    limits = [descent_limits(n, budget) for n in SIZES]
    for field in ("start", "final", "best"):
        values = [getattr(lim, field) for lim in limits]
        assert all(a >= b for a, b in zip(values, values[1:])), field
    floor = descent_limits(10 ** 9, budget)         # the floor: every size gets at least it
    assert floor == search.DescentLimits(min(math.ceil(MIN_DESCENT_SCALE * START_DESCENT),
                                             2 * budget),
                                         min(math.ceil(MIN_DESCENT_SCALE * DESCENT),
                                             4 * budget),
                                         floor.best)
    for lim in limits:
        # the budget's caps hold at every size, and the chain ahead goes at least as far
        assert lim.start <= 2 * budget and lim.final <= 4 * budget
        assert lim.best <= max(lim.final, 16 * budget)
        assert (lim.best >= lim.final) and (lim.final > 0 or lim.best == 0)
        assert lim.start >= floor.start and lim.final >= floor.final and lim.best >= floor.best
    # more budget never means less descent, at any size
    for n in SIZES:
        lims = [descent_limits(n, b) for b in BUDGETS]
        for a, b in zip(lims, lims[1:]):
            assert a.start <= b.start and a.final <= b.final and a.best <= b.best


def test_the_floor_keeps_a_descent_of_every_chain():
    # at the floor every chain's final descent still tries more candidates than the
    # config's budget (100) of moves, and the chain ahead goes on past it
    floor = descent_limits(10 ** 9, 100)
    assert floor.final > 100 and floor.best > floor.final and floor.start > 0


def test_a_search_keeps_to_its_sizes_limits(monkeypatch):
    # the tiny job's 4 servers made "large" by lowering the reference size to 2: every
    # descent the search runs stays within the scaled limits, and some reach past the
    # scaled final limit only as the chain ahead may
    cluster, job, model, space, cost = tiny_search()
    monkeypatch.setattr(search, "DESCENT_SERVERS", 2)       # scale: the floor
    limits = descent_limits(space.servers, 50, start=8, final=12, best=40)
    assert limits.final < 12                              # the rule applies at this size
    seen = []
    real = mcmc.descend

    def recording(space_, cost_, strategy, time, moves, limit=400, *args, **kwargs):
        seen.append(limit)
        return real(space_, cost_, strategy, time, moves, limit, *args, **kwargs)

    monkeypatch.setattr(mcmc, "descend", recording)
    search_space(space, cost, structured_strategies(model, space), chains=2, budget=50,
                 seed=0, block=10, start_descent=8, descent=12, best_descent=40)
    assert seen and max(seen) <= max(limits.final, limits.best - limits.final)
    assert limits.start in seen and limits.final in seen


def test_screened_families_get_a_share_above_the_screened_size():
    from topoopt.planners.search import SCREENED_SERVERS, screened_descent
    for start in (0, 1, 7, 50, 100, 200):
        for n in SIZES:
            got = screened_descent(n, start)
            assert got <= start and got >= math.ceil(MIN_DESCENT_SCALE * start)
            if n <= SCREENED_SERVERS:
                assert got == start              # 256 servers and below: unchanged
        values = [screened_descent(n, start) for n in SIZES]
        assert all(a >= b for a, b in zip(values, values[1:]))
    assert screened_descent(2 * SCREENED_SERVERS, 100) == 50
    with pytest.raises(ValueError):
        screened_descent(0, 100)


class _Settling:
    """A chain as :func:`search._best_bottoms` sees it: settles to a given bottom."""

    def __init__(self, bottom, configs):
        self.best_t, self._bottom, self.limits = math.inf, bottom, []
        self.best = type("S", (), {"configs": configs})()

    def settle(self, limit, stop):
        self.limits.append(limit)
        self.best_t = self._bottom


def test_best_bottoms_gives_the_screened_runs_their_limit_and_keeps_the_best():
    runs = [_Settling(5.0, "a"), _Settling(3.0, "b"), _Settling(1.0, "c"), _Settling(1.0, "c"),
            _Settling(2.0, "d")]
    kept = search._best_bottoms(runs, 2, 10, lambda: False, 4)
    # the chains' own starts (the first two) descend with the whole limit, the three
    # screened families with theirs; the best distinct bottoms are kept, best first
    assert [r.limits for r in runs] == [[10], [10], [4], [4], [4]]
    assert kept == [runs[2], runs[4]]
    runs = [_Settling(2.0, "a"), _Settling(1.0, "b"), _Settling(0.5, "c")]
    search._best_bottoms(runs, 2, 10, lambda: False)          # no share: every run whole
    assert [r.limits for r in runs] == [[10], [10], [10]]


@pytest.mark.parametrize("budget", BUDGETS)
def test_the_chains_are_compared_as_chosen_up_to_the_screened_size_then_sooner(budget):
    from topoopt.planners.search import BLOCK, SCREENED_SERVERS, stop_checks
    for block in (1, 5, BLOCK):
        checks = [stop_checks(n, budget, block) for n in SIZES]
        for n, (every, least) in zip(SIZES, checks):
            if n <= SCREENED_SERVERS:     # as the search was measured: unchanged
                assert (every, least) == (block, max(2 * block, budget // 2))
            else:                         # a share, never below half, and never no block
                assert 1 <= every <= block and every >= math.ceil(block / 2)
                assert least >= 2 * every and least <= max(2 * block, budget // 2)
        for a, b in zip(checks, checks[1:]):
            assert a[0] >= b[0] and a[1] >= b[1]
    assert stop_checks(2 * SCREENED_SERVERS, 100) == (20, 40)
    with pytest.raises(ValueError):
        stop_checks(512, 100, 0)


class _Moving:
    """A chain as :func:`search._run_blocks` sees it: its best after each block."""

    def __init__(self, bests):
        self._bests, self.best_t, self.moves, self.interrupted = list(bests), bests[0], 0, False

    def run(self, k, stop, move_work):
        self.moves += k
        self.best_t = self._bests[min(self.moves // 10, len(self._bests) - 1)]


def test_chains_that_agree_stop_at_the_first_comparison_their_size_allows():
    def run(least):
        chains = [_Moving([1.0]), _Moving([1.005])]
        return search._run_blocks(chains, 100, 10, 0.01, None, lambda: False, ["a", "b"],
                                  least), chains[0].moves
    # up to 256 servers the chains wait for half the budget; above, a share of it
    # stops them at the first block
    assert run(search.stop_checks(256, 100, 10)[1]) == ("converged", 50)
    assert run(10) == ("converged", 10)
    # chains still descending by more than the tolerance go on, whatever the least
    chains = [_Moving([2.0, 1.5, 1.2, 1.0]), _Moving([2.0, 1.5, 1.2, 1.005])]
    assert search._run_blocks(chains, 100, 10, 0.01, None, lambda: False, ["a", "b"],
                              10) == "converged"
    assert chains[0].moves == 40


class _Ending:
    """A chain as :func:`search._final_descents` sees it: each descent lowers its best by
    ``gain`` (a fraction), and every call is recorded."""

    def __init__(self, best, seed, gain=0.0):
        self.best_t, self.seed, self.gain, self.calls = best, seed, gain, []
        self.reached = best

    def settle(self, limit, stop, neighbourhood=None):
        self.calls.append(("settle", limit))
        self.best_t *= 1.0 - self.gain
        return self.gain > 0

    def polish(self, limit, stop):
        self.calls.append(("polish", limit))

    def revisit(self, limit, stop, reached=None):
        self.calls.append(("revisit", limit))


def test_above_the_screened_size_the_end_spends_on_the_answer():
    from topoopt.planners.search import TRAILING_RATIO
    lead, near, far = (_Ending(1.0, 0, 0.01), _Ending(TRAILING_RATIO, 1),
                       _Ending(TRAILING_RATIO * 1.01, 2))
    search._final_descents([far, near, lead], 20, 80, lambda: False, focused=True)
    # the chain past the ratio only revisits; the one within it descends; the chain
    # ahead descends on; none is polished, though the longer descent helped
    assert far.calls == [("revisit", 20)]
    assert near.calls == [("settle", 20), ("revisit", 20)]
    assert lead.calls == [("settle", 20), ("settle", 60), ("revisit", 20)]
    # at or below that size every chain descends and is polished, the chain ahead
    # again only if its longer descent helped
    lead, far = _Ending(1.0, 0), _Ending(2.0, 1)
    search._final_descents([lead, far], 20, 80, lambda: False)
    assert far.calls == [("settle", 20), ("polish", 20), ("revisit", 20)]
    assert lead.calls == [("settle", 20), ("polish", 20), ("settle", 60), ("revisit", 20)]
    lead = _Ending(1.0, 0, 0.01)
    search._final_descents([lead, _Ending(2.0, 1)], 20, 80, lambda: False)
    assert lead.calls == [("settle", 20), ("polish", 20), ("settle", 60), ("polish", 20),
                          ("revisit", 20)]
