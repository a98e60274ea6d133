"""A strategy search on one fabric: structured starts, several MCMC chains, and a stop when
the chains agree.

1. Every structured strategy (:func:`~topoopt.planners.structure.structured_strategies`)
   and the given extra starts are timed; they do not depend on the seed. A layout whose
   analytical lower bound already shows it cannot start a chain is not simulated.
2. The starts are grouped in families (one body layout, whatever its table layout or
   stage cut): basins differ between families far more than within one. The best start
   of each of the best families descends to the bottom of its basin, and ``chains``
   MCMC chains (:class:`~topoopt.planners.mcmc.Chain`) go on from the best distinct
   bottoms -- a family's start says little about its bottom.
3. The chains run in blocks of ``block`` moves. Once chains from at least two families
   agree -- every chain's best within ``tolerance`` of the best of all, none of them
   lower by more than ``tolerance`` than a block before -- (after at least half the
   budget) the search has converged; else it stops after ``budget`` moves per chain.
   Above :data:`SCREENED_SERVERS` servers the blocks and that wait are halved
   (:func:`stop_checks`); at every size a chain's block also ends once its moves have
   spent their work (:meth:`~topoopt.planners.mcmc.Chain.run`).
4. Each chain's best descends to the bottom of its basin
   (:func:`~topoopt.planners.mcmc.descend`), is polished
   (:meth:`~topoopt.planners.mcmc.Chain.polish`), and each chain descends again from its
   earlier bests close to the best any chain's moves reached
   (:meth:`~topoopt.planners.mcmc.Chain.revisit`): a descent from a faster point may
   end in a slower basin, and this keeps a longer search from ending worse than a
   shorter one. Above :data:`SCREENED_SERVERS` servers a chain far behind does not
   descend and no chain is polished (:func:`_final_descents`).

Chains that start apart and end within ``tolerance`` of each other are the evidence of
convergence a single chain cannot give (Gelman and Rubin's multiple-chain check, in
spirit); the stop reason and each chain's best-so-far curve are kept for the plan.
The measurements behind the constants are in ``docs/tuning.md`` (## Search).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import astuple, dataclass
from typing import Any, Callable, Hashable, Sequence

from topoopt.interrupt import stop_requested
from topoopt.planners.mcmc import CANDIDATE_WORK, DEFAULT_ALPHA, RESTART_EVERY, Chain, SearchResult
from topoopt.planners.moves import MoveSet
from topoopt.planners.space import StrategySpace
from topoopt.planners.structure import Layout
from topoopt.strategy import OpConfig, Strategy

__all__ = ["FabricSearch", "search_space", "DEFAULT_TOLERANCE", "BLOCK", "DESCENT",
           "BEST_DESCENT", "START_DESCENT", "SCREENED_FAMILIES", "SCREEN_RATIO",
           "DESCENT_SERVERS", "MIN_DESCENT_SCALE", "DescentLimits", "descent_scale",
           "descent_limits", "SCREENED_SERVERS", "screened_descent", "stop_checks",
           "TRAILING_RATIO"]

#: Chains agree when their bests are within this fraction of the best of all.
DEFAULT_TOLERANCE = 0.01
#: Moves per chain between two comparisons of the chains.
BLOCK = 40
#: Candidates each chain's final descent may try (at most four times its budget): a
#: sweep of a 128-server neighbourhood is 100-400 candidates, and a descent that stops
#: inside its first sweep leaves the seeds apart.
DESCENT = 400
#: Candidates the final descent of the chain ahead may try in all (at most sixteen
#: times its budget): :data:`DESCENT` is about one steepest step of a 128-server
#: neighbourhood, and the chain ahead is the plan's answer.
BEST_DESCENT = 1600
#: Candidates the descent from a chain's start may try (at most twice its budget).
START_DESCENT = 200
#: The size the three descent limits above were chosen at (docs/tuning.md, "Final
#: descent limit"): at most this many servers a search gets them whole.
DESCENT_SERVERS = 128
#: The smallest share of the limits a larger job gets (:func:`descent_scale`): half, the
#: smallest share measured to keep every fabric's result (at 256 servers); a quarter
#: (final and start limits 100 and 50) had left BERT-128's seeds apart, stopped inside
#: their first sweep (docs/tuning.md, "Final descent limit"), and a neighbourhood only
#: grows with the servers.
MIN_DESCENT_SCALE = 0.5
#: Families descended beyond one per chain, before the chains pick where to start.
SCREENED_FAMILIES = 3
#: ... if their best start is within this factor of the best start.
SCREEN_RATIO = 1.3
#: Above this many servers a screened family's start descent gets a share of the
#: chains' (:func:`screened_descent`): at 512 servers one such descent (a body split
#: ``mp4`` over every server, 27,000 flows a candidate) was half the Expander's search.
#: It is also the largest size the search's quality was measured at against four times
#: its effort; above it the chains are compared sooner (:func:`stop_checks`) and the
#: end of a search descends only the chains that may be its answer, unpolished
#: (:func:`_final_descents`).
SCREENED_SERVERS = 256
#: Above :data:`SCREENED_SERVERS`, a chain whose best after the moves is past this factor
#: of the chain ahead's does not descend at the end (its revisits stay): of the chains
#: that trailed by 1.08-5.7x in 512- and 1024-server plans, none ended ahead of the
#: chain ahead, their final descents gaining 1.4-12.9 % for up to 135 CPU s
#: (docs/tuning.md, "The end of a search above 256 servers").
TRAILING_RATIO = 1.1

#: A timed start: its name, the strategy (the space's config instances) and its time
#: (or, cut short by a bound, a lower bound of it).
_Start = tuple[str, Strategy, float]


@dataclass(frozen=True)
class FabricSearch:
    """The outcome of a search on one fabric.

    Attributes
    ----------
    best : Strategy
    best_time : float
        Seconds per iteration of ``best``.
    starts : tuple of (str, float)
        Every start's name and time, the extra starts first, then the layouts in their
        given order (for a layout shown unable to start a chain, by its analytical bound
        or a simulation stopped there, a lower bound of its time: ``bounded`` names
        those).
    chains : tuple of SearchResult
        One per chain (``trace``: its best-so-far curve, one point per block of
        ``trace_every`` moves).
    stop : str
        ``"converged"`` (chains agreed within the tolerance), ``"budget"`` or
        ``"interrupted"``.
    spread : float
        Largest chain best over the smallest (1.0: all found the same time).
    moves : int
        Moves of all chains.
    evaluations : int
        Strategies timed (starts and chains, each strategy once).
    bounded : frozenset of str
        The starts whose time in ``starts`` is a lower bound, not their time.
    """

    best: Strategy
    best_time: float
    starts: tuple[tuple[str, float], ...]
    chains: tuple[SearchResult, ...]
    stop: str
    spread: float
    moves: int
    evaluations: int
    bounded: frozenset[str] = frozenset()

    @property
    def stop_spread(self) -> float:
        """The chains' spread when the search stopped, the one ``stop`` judged: their
        best-so-far curves' last points, before the final descents (which give the
        chain ahead a longer one, so ``spread`` may be wider or narrower)."""
        last = [c.trace[-1] for c in self.chains if c.trace]
        if not last or min(last) <= 0:
            return self.spread
        return max(last) / min(last)

    @property
    def start_time(self) -> float:
        """The first start's time (the data-parallel or hybrid start of the plan)."""
        return self.starts[0][1] if self.starts else self.best_time


@dataclass(frozen=True)
class DescentLimits:
    """Candidates each descent of one search may try (:func:`descent_limits`).

    Attributes
    ----------
    start : int
        The descent from each chain's start (and each screened family's).
    final : int
        Each chain's final descent (and its polish, and each revisit).
    best : int
        The chain ahead's final descent in all (``final`` included).
    """

    start: int
    final: int
    best: int


def descent_scale(servers: int, reference: int | None = None) -> float:
    """The share of the descent limits a search on ``servers`` servers gets:
    ``reference / servers`` (default :data:`DESCENT_SERVERS`), at most 1 and at least
    :data:`MIN_DESCENT_SCALE`.

    At most :data:`DESCENT_SERVERS` servers it is 1: the limits as they were chosen
    there. Above, each candidate costs more to time (a simulation's flows grow with the
    servers its operators span, the MP and AllReduce flows up to their square), the
    descents are most of a plan's time, and the screened starts and the chains have
    already found the basin the descents finish (docs/tuning.md, "Search at scale:
    effort with the size", has the measurements). So the share falls in proportion to
    the size, never rises with it, and stops at the floor.
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    at = DESCENT_SERVERS if reference is None else reference
    return max(MIN_DESCENT_SCALE, min(1.0, at / servers))


def descent_limits(servers: int, budget: int, *, start: int = START_DESCENT,
                   final: int = DESCENT, best: int = BEST_DESCENT) -> DescentLimits:
    """The descents' limits of a search on ``servers`` servers at ``budget`` moves per
    chain: ``start``, ``final`` and ``best`` (the limits at :data:`DESCENT_SERVERS`)
    times :func:`descent_scale` (rounded up), then capped by the budget, as before the
    scale: ``start`` at ``2 x budget``, ``final`` at ``4 x budget``, ``best`` at ``16 x
    budget`` and never below ``final`` (0 where ``final`` is 0).

    The one rule of the search's effort with the size. The moves per chain (``budget``,
    ``--budget``) never scale: an explicit budget is that many moves at every size. The
    descents' limits are ``min(ceil(scale x limit), k x budget)`` with ``k`` 2, 4 and
    16, whatever the budget: a budget above ``ceil(scale x limit) / k`` adds moves, not
    descent.

    Examples
    --------
    >>> descent_limits(128, 100)
    DescentLimits(start=200, final=400, best=1600)
    >>> descent_limits(256, 100)
    DescentLimits(start=100, final=200, best=800)
    >>> descent_limits(256, 10)
    DescentLimits(start=20, final=40, best=160)
    """
    scale = descent_scale(servers)
    first = min(math.ceil(scale * start), 2 * budget)
    last = min(math.ceil(scale * final), 4 * budget)
    ahead = max(last, min(math.ceil(scale * best), 16 * budget)) if last > 0 else 0
    return DescentLimits(first, last, ahead)


def screened_descent(servers: int, start: int) -> int:
    """Candidates the descent from a screened family's start may try, where a chain's
    start descent may try ``start`` (:func:`descent_limits`): ``start`` times
    :func:`descent_scale` with :data:`SCREENED_SERVERS` as its reference (rounded up),
    so all of them up to that size, then ``start x SCREENED_SERVERS / servers``, never
    below :data:`MIN_DESCENT_SCALE` of it.

    A screened family descends only to be judged by its bottom against the chains'
    families (:func:`_best_bottoms` keeps the best distinct bottoms); its candidates
    are the costliest to time where its body spans many servers, and the chains'
    own start descents keep their limit (docs/tuning.md, "Screened descents at 512
    servers").

    Examples
    --------
    >>> screened_descent(256, 100), screened_descent(512, 100), screened_descent(4096, 100)
    (100, 50, 50)
    """
    return math.ceil(descent_scale(servers, SCREENED_SERVERS) * start)


def stop_checks(servers: int, budget: int, block: int = BLOCK) -> tuple[int, int]:
    """The moves per chain between two comparisons of the chains, and the fewest moves
    per chain before they may stop converged, of a search on ``servers`` servers at
    ``budget`` moves per chain: ``block`` and ``max(2 x block, budget / 2)``, both times
    :func:`descent_scale` with :data:`SCREENED_SERVERS` as its reference (rounded up).

    Up to :data:`SCREENED_SERVERS` servers, where the search's quality was measured
    against four times its effort, they are as they were chosen; at 512 servers and
    above, half: there a move costs up to a second, and chains that start from the
    bottoms of two families' basins and agree within the tolerance for a block, neither
    descending, have met where the longer wait found them too (docs/tuning.md, "The end
    of a search above 256 servers").

    Examples
    --------
    >>> stop_checks(256, 100), stop_checks(256, 200)
    ((40, 80), (40, 100))
    >>> stop_checks(1024, 100), stop_checks(1024, 200)
    ((20, 40), (20, 50))
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    scale = descent_scale(servers, SCREENED_SERVERS)
    every = math.ceil(scale * block)
    return every, max(2 * every, math.ceil(scale * (budget // 2)))


def search_space(space: StrategySpace, cost: Callable, layouts: Sequence[Layout], *,
                 extra: Sequence[tuple[str, Strategy]] = (), chains: int = 2,
                 budget: int = 200, seed: int = 0, tolerance: float = DEFAULT_TOLERANCE,
                 block: int = BLOCK, alpha: float = DEFAULT_ALPHA,
                 restart_every: int = RESTART_EVERY, descent: int = DESCENT,
                 best_descent: int = BEST_DESCENT, start_descent: int = START_DESCENT,
                 screened_families: int = SCREENED_FAMILIES,
                 progress: Callable[[int, float], None] | None = None,
                 stop: Callable[[], bool] = stop_requested) -> FabricSearch:
    """Search ``space`` for the fastest strategy under ``cost`` (see the module docstring).

    Parameters
    ----------
    space : StrategySpace
    cost : callable
        Strategy -> seconds (:class:`~topoopt.planners.cost.IterationCost`).
    layouts : sequence of Layout
        Structured starts (also borrowed by the ``layout`` moves).
    extra : sequence of (str, Strategy)
        More starts, tried first (e.g. the plan's data-parallel or hybrid start, other
        fabrics' best strategies).
    chains : int
        Chains, each from a different start.
    budget : int
        Most moves per chain (0: the starts are only timed, no chain moves or descends).
    seed : int
        Chain ``c`` draws from ``seed * 1000 + c``.
    tolerance : float
        The chains' agreement that ends the search early.
    block : int
        Moves per chain between comparisons (a share of them above
        :data:`SCREENED_SERVERS` servers: :func:`stop_checks`).
    alpha, restart_every
        As :class:`~topoopt.planners.mcmc.Chain`.
    descent : int
        Most candidates a chain's final descent tries, and no more than ``4 x budget``
        (0: none).
    best_descent : int
        Candidates the chain ahead after the final descents may try in all (it goes on
        from where ``descent`` stopped it; no more than ``16 x budget``).
    start_descent : int
        Most candidates the descent from a chain's start tries, and no more than
        ``2 x budget``.

        The three are the limits at :data:`DESCENT_SERVERS` servers; a larger space
        gets a share of them (:func:`descent_limits`).
    screened_families : int
        Families descended beyond one per chain before the chains pick their starts
        (0: the best start of each of the first ``chains`` families).
    progress : callable, optional
        ``progress(moves_done, best_time)`` after every block.
    stop : callable
        Ctrl-C: polled between moves.

    Returns
    -------
    FabricSearch
    """
    if chains < 1:
        raise ValueError(f"chains must be >= 1, got {chains}")
    moveset = MoveSet(space, tuple(layouts))
    block, least = stop_checks(space.servers, budget, block)
    # the descents try up to two (into the start's basin) and four (the last, which
    # finishes the plan) times as many candidates as the chain makes moves (most are
    # cut short by the bound), a share of them above 128 servers
    first, descent, best_descent = astuple(descent_limits(
        space.servers, budget, start=start_descent, final=descent, best=best_descent))
    screened = screened_families if first > 0 else 0
    starts, family_of, bounded = _timed_starts(space, cost, layouts, extra, moveset, stop,
                                               chains, screened)
    candidates = _candidates(starts, family_of, chains, screened)
    runs = [Chain(space, cost, starts[i][1], seed * 1000 + c, alpha, restart_every, moveset,
                  trace_every=max(1, block // 4), start_time=cost(starts[i][1]))
            for c, i in enumerate(candidates)]     # cost(): exact, cut short or not
    family = {id(ch): family_of[starts[i][1].configs] for ch, i in zip(runs, candidates)}
    if first > 0:                     # each chain explores from the bottom of its start's basin
        runs = _best_bottoms(runs, chains, first, stop,
                             screened_descent(space.servers, first))
    stop_reason = _run_blocks(runs, budget, block, tolerance, progress, stop,
                              [family[id(ch)] for ch in runs], least)
    if descent > 0 and stop_reason != "interrupted":
        _final_descents(runs, descent, best_descent, stop,
                        focused=space.servers > SCREENED_SERVERS)
    results = tuple(ch.result() for ch in runs)
    best = min(results, key=lambda r: (r.best_time, r.seed))
    times = [r.best_time for r in results]
    spread = max(times) / min(times) if min(times) > 0 else math.inf
    return FabricSearch(best.best, best.best_time, tuple((n, t) for n, _, t in starts), results,
                        stop_reason, spread, sum(r.moves for r in results),
                        getattr(cost, "evaluations", 0), bounded)


def _timed_starts(space: StrategySpace, cost: Callable, layouts: Sequence[Layout],
                  extra: Sequence[tuple[str, Strategy]], moveset: MoveSet,
                  stop: Callable[[], bool], chains: int = 1, screened: int = 0
                  ) -> tuple[list[_Start], dict[tuple, str], frozenset[str]]:
    """Every distinct valid start, the extra ones first, timed; each start's family
    (by its configs); and the names of those whose time is a lower bound.

    An extra start whose body is a layout's (the current strategy of a round, another
    fabric's best) belongs to that layout's family: two chains from one basin agree
    without proving anything. The extra starts are simulated in full. A layout only
    matters as a chain's start: its family's best, and that family among the first
    ``chains`` or (within :data:`SCREEN_RATIO` of the best start) the first
    ``chains + screened`` families (:func:`_candidates`). Under a cost that supports a
    bound, the layouts go in the order of their analytical lower bounds
    (``cost.lower_bound``, no simulation), and one whose bound already passes
    :func:`_relevance` -- what the exact times found so far prove it cannot be -- is
    not simulated, nor is a simulation carried past it: its time is then a lower bound
    above it, and the chains start where they would with every time exact."""
    def body_of(s: Strategy) -> tuple[OpConfig, ...]:
        return tuple(s.configs[i] for i in moveset.body)

    families: dict[tuple[OpConfig, ...], str] = {}
    for lay in layouts:
        families.setdefault(body_of(lay.strategy), _family(lay.name))
    slots: list[tuple[str, Strategy, str]] = []
    seen: set = set()
    family_of: dict[tuple, str] = {}
    extras = 0
    for k, (name, s) in enumerate([*extra, *((lay.name, lay.strategy) for lay in layouts)]):
        if s.configs in seen or not space.contains(s):
            continue
        s = space.canonical_strategy(s)
        seen.add(s.configs)
        fam = family_of[s.configs] = families.get(body_of(s), _family(name))
        slots.append((name, s, fam))
        extras += k < len(extra)
    times: list[float | None] = [None] * len(slots)
    bounded: set[int] = set()               # slots whose time is a lower bound
    exact: dict[str, float] = {}            # family -> its best exact time so far
    for j in range(extras):
        t = cost(slots[j][1])
        times[j] = t
        exact[slots[j][2]] = min(exact.get(slots[j][2], math.inf), t)
    interrupted = extras > 0 and stop()
    if getattr(cost, "supports_bound", False) and hasattr(cost, "lower_bound"):
        _screen_layouts(slots, times, exact, cost, range(extras, len(slots)), stop,
                        interrupted, chains, screened, bounded)
    else:
        for j in range(extras, len(slots)):
            if interrupted:
                break
            times[j] = cost(slots[j][1])
            interrupted = stop()
    starts = [(n, s, t) for (n, s, _), t in zip(slots, times) if t is not None]
    if not starts:
        raise ValueError("no valid start strategy")
    return starts, family_of, frozenset(slots[j][0] for j in bounded)


def _screen_layouts(slots: list[tuple[str, Strategy, str]], times: list[float | None],
                    exact: dict[str, float], cost: Any, rest: Sequence[int],
                    stop: Callable[[], bool], interrupted: bool, chains: int,
                    screened: int, bounded: set[int]) -> None:
    """Time the layouts ``rest`` of ``slots`` (name, strategy, family) into ``times``,
    lowest analytical bound first (a heap: the cheap bounds of all, the busiest link's
    only for one that comes to the front below its limit), skipping -- its bound as
    its time -- or stopping the simulation of each once it passes :func:`_relevance`
    (those go into ``bounded``); ``exact`` (family -> best exact time) is kept up to
    date."""
    heap = [(cost.lower_bound(slots[j][1]), j, False) for j in rest]
    heapq.heapify(heap)
    while heap and not interrupted:
        low, j, tight = heapq.heappop(heap)
        strategy, fam = slots[j][1], slots[j][2]
        limit = _relevance(exact, fam, chains, screened)
        if low <= limit and not tight:
            heapq.heappush(heap, (cost.lower_bound(strategy, links=True), j, True))
            continue
        t = low
        if low <= limit:
            t = cost(strategy, limit) if math.isfinite(limit) else cost(strategy)
        times[j] = t
        if t <= limit:                      # a time above the limit is a lower bound
            exact[fam] = min(exact.get(fam, math.inf), t)
        else:
            bounded.add(j)
        interrupted = stop()


def _relevance(exact: dict[str, float], family: str, chains: int, screened: int) -> float:
    """The time above which a start of ``family`` cannot start a chain, given the exact
    family bests found so far (``exact``; every later time only lowers them): above
    its own family's best it is not that family's best; above the ``chains +
    screened``-th best of the other families its family ranks past every chain's and
    screened family's start; above the ``chains``-th and :data:`SCREEN_RATIO` times
    the best start, past every chain's and is not screened."""
    others = sorted(t for f, t in exact.items() if f != family)

    def nth(k: int) -> float:
        return others[k - 1] if 0 < k <= len(others) else math.inf

    best = min(exact.values(), default=math.inf)
    return min(exact.get(family, math.inf), nth(chains + screened),
               max(nth(chains), SCREEN_RATIO * best))


def _candidates(starts: list[_Start], family_of: dict[tuple, str], chains: int,
                screened: int) -> list[int]:
    """The starts the chains go from, by index: the best start of each of the first
    ``chains`` families (fastest first), then of the next ``screened`` families those
    within :data:`SCREEN_RATIO` of the best start (they descend too before the chains
    pick theirs)."""
    picked, families_found = _families_first(starts, family_of)
    more = picked[chains:min(families_found, chains + screened)]
    return picked[:chains] + _screened(starts, more, starts[picked[0]][2])


def _families_first(starts: list[_Start], family_of: dict[tuple, str]) -> tuple[list[int], int]:
    """The starts' indices, fastest first (ties: the earlier start), with each family's
    best before every other; and the number of families."""
    ranked = sorted(range(len(starts)), key=lambda i: (starts[i][2], i))
    picked = []
    taken: set = set()
    for i in ranked:
        fam = family_of[starts[i][1].configs]
        if fam not in taken:
            taken.add(fam)
            picked.append(i)
    families_found = len(picked)
    return picked + [i for i in ranked if i not in picked], families_found


def _screened(starts: list[_Start], more: list[int], best_start: float) -> list[int]:
    """Of the further families' best starts ``more``, those within :data:`SCREEN_RATIO`
    of the best start: families are judged by the bottom of their basin, not by their
    start, so these descend too before the chains pick theirs."""
    return [i for i in more if starts[i][2] <= SCREEN_RATIO * best_start]


def _best_bottoms(runs: list[Chain], chains: int, first: int,
                  stop: Callable[[], bool], screened_first: int | None = None) -> list[Chain]:
    """Each chain descended (``first`` candidates at most; the screened families' runs,
    past the first ``chains``, ``screened_first``) to the bottom of its start's basin;
    the ``chains`` with the best distinct bottoms kept (two families may share one),
    then the others, best first."""
    for k, ch in enumerate(runs):
        ch.settle(first if k < chains or screened_first is None else screened_first, stop)
    if len(runs) <= chains:
        return runs
    order = sorted(range(len(runs)), key=lambda k: (runs[k].best_t, k))
    first_of: dict = {}
    for k in order:
        first_of.setdefault(runs[k].best.configs, k)
    distinct = set(first_of.values())
    keep = [k for k in order if k in distinct] + [k for k in order if k not in distinct]
    return [runs[k] for k in keep[:chains]]


def _run_blocks(runs: list[Chain], budget: int, block: int, tolerance: float,
                progress: Callable[[int, float], None] | None,
                stop: Callable[[], bool], families: Sequence[Hashable] | None,
                least: int) -> str:
    """Advance the chains ``block`` moves at a time until they have converged
    (:func:`_converged`, after at least ``least`` moves each: :func:`stop_checks`), a
    stop, or ``budget`` moves each; the stop reason. ``families``: each chain's start's
    family (None: all different).

    A block also ends for a chain once it has spent ``block x``
    :data:`~topoopt.planners.mcmc.CANDIDATE_WORK` entry-events, as a descent does on
    its limit: at 1024 servers one Expander family's moves cost up to a thousand times
    another's (docs/tuning.md, "The end of a search above 256 servers")."""
    families = list(range(len(runs))) if families is None else list(families)
    done = 0
    while done < budget:
        k = min(block, budget - done)
        before = [ch.best_t for ch in runs]
        for ch in runs:
            ch.run(k, stop, CANDIDATE_WORK)
        done += k
        bests = [ch.best_t for ch in runs]
        if progress is not None:
            progress(done * len(runs), min(bests))
        if any(ch.interrupted for ch in runs):
            return "interrupted"
        if done >= least and _converged(before, bests, families, tolerance):
            return "converged"
    return "budget"


def _converged(before: Sequence[float], bests: Sequence[float], families: Sequence,
               tolerance: float) -> bool:
    """Whether chains whose bests went from ``before`` to ``bests`` in the last block
    have converged: chains from at least two families (two chains from one family's
    basin agree without proving anything, and one chain proves nothing), every best
    within ``tolerance`` of the best of all, and none of them lower by more than
    ``tolerance`` than a block before (chains that agree while still descending
    have only met on their way down)."""
    if len(set(families)) < 2:
        return False
    if max(bests) > min(bests) * (1.0 + tolerance):
        return False
    return all(b > 0 and a <= b * (1.0 + tolerance) for a, b in zip(before, bests))


def _final_descents(runs: list[Chain], descent: int, best_descent: int,
                    stop: Callable[[], bool], focused: bool = False) -> None:
    """Each chain's best descended (``descent`` candidates) and polished; the chain ahead
    descends on (to ``best_descent`` in all); then each chain descends from its earlier
    bests close to the best the moves reached, so a longer search still tries where a
    shorter one's descent started.

    ``focused`` (a search above :data:`SCREENED_SERVERS` servers): a chain past
    :data:`TRAILING_RATIO` of the chain ahead does not descend (it still revisits),
    and no chain is polished. There a polish candidate splits an operator over up to
    every server (about a second to time at 1024 servers, up to 150 CPU s a polish)
    and no polish of a 512- or 1024-server plan gained 1 % (docs/tuning.md, "The end
    of a search above 256 servers")."""
    ahead = min(ch.best_t for ch in runs)
    for ch in runs:
        if focused and ch.best_t > TRAILING_RATIO * ahead:
            continue
        ch.settle(descent, stop)
        if not focused:
            ch.polish(descent, stop)
    lead = min(runs, key=lambda ch: (ch.best_t, ch.seed))
    if (best_descent > descent and lead.settle(best_descent - descent, stop)
            and not focused):
        lead.polish(descent, stop)
    reached = min(ch.reached for ch in runs)
    for ch in runs:
        ch.revisit(descent, stop, reached=reached)


def _family(name: str) -> str:
    """A start's family: its body layout without the stage cut (``tables-mp2+body-stages4@ops``
    -> ``stages4``); other starts are their own family."""
    if "+body-" not in name:
        return name
    return name.split("+body-", 1)[1].split("@", 1)[0]
