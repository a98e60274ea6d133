"""MCMC search over parallelization strategies on a fixed network (TopoOpt §4, Comp x Comm plane).

FlexFlow's search (Jia et al., "Beyond Data and Model Parallelism", MLSys'19, §5): a
Markov chain whose states are strategies, Metropolis acceptance on the simulated
iteration time, the best state tracked. Two changes make it converge on our models:
moves that change repeated structure together (:mod:`topoopt.planners.moves`), and a
restart to the chain's best every ``restart_every`` moves -- a fixed number, so that a
larger budget buys more exploration between restarts instead of more restarts.
A :class:`Chain` runs in blocks, so a search can compare several chains as they go
(:mod:`topoopt.planners.search`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from topoopt.interrupt import stop_requested
from topoopt.planners.moves import MOVE_KINDS, MoveSet
from topoopt.planners.space import StrategySpace
from topoopt.strategy import Strategy

__all__ = ["SearchResult", "Chain", "mcmc_search", "descend", "DEFAULT_ALPHA", "RESTART_EVERY",
           "REVISIT_WITHIN", "CANDIDATE_WORK"]

#: Metropolis temperature on the *relative* change: a move 5% worse than the current
#: state is accepted with probability exp(-20 x 0.05) = 0.37, 20% worse with 0.018.
DEFAULT_ALPHA = 20.0
#: Moves between jumps back to the chain's best state.
RESTART_EVERY = 40
#: Entry-events (:func:`topoopt.netsim.dag.run_work`) a descent may spend per candidate
#: of its limit (:func:`descend`), and a chain per move of a block (:meth:`Chain.run`):
#: 25x what any descent of a 256-server DLRM plan spends over its limit, 4x what every
#: 512-server descent does but one screened family's (7.7e9 for a 2 % gain, to a bottom
#: 1.5x the fabric's result); one run of a 1024-server Expander candidate of the
#: costliest families is ~1e11-5e11 (docs/tuning.md, "Descents limited by their work").
CANDIDATE_WORK = 2e9
#: :meth:`Chain.revisit` descends from the chain's earlier bests within this factor of
#: the best its moves reached.
REVISIT_WITHIN = 1.02


@dataclass(frozen=True)
class SearchResult:
    """Outcome of one MCMC chain.

    Attributes
    ----------
    best : Strategy
    best_time : float
        Its simulated iteration time, seconds.
    start_time : float
        The start strategy's time on the same fabric.
    moves, accepted : int
        Proposed and accepted moves.
    trace : tuple of float
        Best time so far after every ``trace_every`` moves (the convergence curve).
    seed : int
    interrupted : bool
        Stopped early by Ctrl-C (or a stop callback); ``best`` is still valid.
    improved_by : dict
        Per move kind, how many accepted moves of that kind set a new best.
    """

    best: Strategy
    best_time: float
    start_time: float
    moves: int
    accepted: int
    trace: tuple[float, ...]
    seed: int
    interrupted: bool = False
    improved_by: tuple[tuple[str, int], ...] = ()


class Chain:
    """One Markov chain over strategies, advanced in blocks of moves.

    Parameters
    ----------
    space : StrategySpace
    cost : callable
        Strategy -> iteration seconds. If it has a true ``supports_bound`` attribute it
        is called as ``cost(strategy, bound)`` with the time above which the next
        acceptance draw rejects the candidate, and may return any value above
        ``bound`` for such a candidate: the draw is read ahead without being consumed,
        so the chain (moves, acceptances, best) is the same as with exact times.
    start : Strategy
        In ``space``.
    seed : int
    alpha : float
        Acceptance ``exp(-alpha x (new - current) / current)`` for worse moves.
    restart_every : int
        Jump back to the best state every this many moves.
    moves : MoveSet, optional
        The proposals (default: :class:`~topoopt.planners.moves.MoveSet` of ``space``).
    trace_every : int
        Record the best time every this many moves.
    """

    def __init__(self, space: StrategySpace, cost: Callable, start: Strategy, seed: int = 0,
                 alpha: float = DEFAULT_ALPHA, restart_every: int = RESTART_EVERY,
                 moves: MoveSet | None = None, trace_every: int = 10,
                 start_time: float | None = None) -> None:
        self.space, self.cost, self.seed, self.alpha = space, cost, seed, alpha
        self.restart_every = max(1, int(restart_every))
        self.moveset = moves if moves is not None else MoveSet(space)
        self.trace_every = max(1, int(trace_every))
        self.rng = np.random.default_rng(seed)
        self.bounded = bool(getattr(cost, "supports_bound", False))
        t = cost(start) if start_time is None else start_time
        self.current, self.current_t, self.memory = start, t, space.memory(start)
        self.best, self.best_t, self.start_t = start, t, t
        #: every strategy that was the chain's best, in order, and whether a move (not a
        #: descent) found it (see :meth:`revisit`)
        self.records: list[tuple[Strategy, float, bool]] = [(start, t, False)]
        self._descended: set = set()     # configs a descent started from ...
        self._ends: set = set()          # ... or ended at
        self.moves = self.accepted = 0
        self.trace: list[float] = []
        self.improved = dict.fromkeys((*MOVE_KINDS, "descent"), 0)
        self.interrupted = False

    def step(self) -> None:
        """Propose one move and accept or reject it."""
        rng = self.rng
        self.moves += 1
        move = self.moveset.propose(self.current, self.memory, rng)
        if move is not None:
            candidate, moved_memory, kind = move
            if self.bounded:
                # The acceptance draw comes next (when t > current_t): read it without
                # consuming it, so the cost can stop once t is sure to be rejected.
                state = rng.bit_generator.state
                draw = rng.random()
                rng.bit_generator.state = state
                t = self.cost(candidate, _threshold(self.current_t, draw, self.alpha))
            else:
                t = self.cost(candidate)
            cur = self.current_t
            if t <= cur or rng.random() < math.exp(-self.alpha * (t - cur) / cur):
                self.current, self.current_t, self.memory = candidate, t, moved_memory
                self.accepted += 1
                if t < self.best_t:
                    self._new_best(candidate, t, moved=True)
                    self.improved[kind] += 1
        if self.moves % self.trace_every == 0:
            self.trace.append(self.best_t)
        if self.moves % self.restart_every == 0:
            self.current, self.current_t = self.best, self.best_t
            self.memory = self.space.memory(self.best)

    def run(self, count: int, stop: Callable[[], bool] = stop_requested,
            move_work: float = math.inf) -> None:
        """Advance ``count`` moves (fewer when ``stop()`` turns true, or once a cost that
        counts its simulations' work, ``cost.work``, has spent ``count x move_work``
        entry-events on them: the block ends there, as :func:`descend` does on its
        work)."""
        work_end = _work_end(self.cost, count * move_work)
        for _ in range(count):
            if stop():
                self.interrupted = True
                return
            self.step()
            if getattr(self.cost, "work", 0) >= work_end:
                return

    def settle(self, limit: int, stop: Callable[[], bool] = stop_requested,
               neighbourhood: Callable | None = None) -> bool:
        """Descend from the best state (:func:`descend` over ``neighbourhood``, at most
        ``limit`` candidates) and continue from where it ends; no moves are counted and
        the draws are untouched. Returns whether the best improved."""
        if limit <= 0:
            return False
        if neighbourhood is None:
            self._descended.add(self.best.configs)
        s, t, _ = descend(self.space, self.cost, self.best, self.best_t, self.moveset,
                          limit, stop, neighbourhood)
        self._ends.add(s.configs)
        if t >= self.best_t:
            return False
        self._descended_to(s, t)
        return True

    @property
    def reached(self) -> float:
        """The best time the chain's moves found (descents aside)."""
        return min((t for _, t, moved in self.records if moved), default=self.start_t)

    def revisit(self, limit: int, stop: Callable[[], bool] = stop_requested,
                within: float = REVISIT_WITHIN, reached: float | None = None) -> bool:
        """Descend (at most ``limit`` candidates each) from the chain's earlier bests that
        are within ``within`` of ``reached`` (default: :attr:`reached`), most recent
        first, and keep the fastest bottom if it beats the best. Returns whether the
        best improved.

        A steepest descent from a faster point may end in a slower basin. A longer
        chain passes through the shorter one's bests (the same draws, the same moves),
        so descending from those still close to its own best keeps more effort from
        ending worse (``docs/tuning.md``, ## Search).
        A point a descent started or ended at is not revisited, nor one as fast as
        another revisited (a mirror image of it: the same layout on other servers)."""
        if limit <= 0:
            return False
        if reached is None:
            reached = self.reached
        improved = False
        times: list[float] = []
        for s, t, _ in self.records[::-1]:
            if stop():
                break
            if (t > within * reached or s.configs in self._descended
                    or s.configs in self._ends
                    or any(abs(t - u) <= 1e-6 * u for u in times)):
                continue
            times.append(t)
            self._descended.add(s.configs)
            s2, t2, _ = descend(self.space, self.cost, s, t, self.moveset, limit, stop)
            self._ends.add(s2.configs)
            if t2 < self.best_t:
                self._descended_to(s2, t2)
                improved = True
        return improved

    def _new_best(self, strategy: Strategy, t: float, moved: bool = False) -> None:
        self.best, self.best_t = strategy, t
        self.records.append((strategy, t, moved))

    def _descended_to(self, strategy: Strategy, t: float) -> None:
        """A descent's better bottom: the new best, and where the chain goes on from."""
        self._new_best(strategy, t)
        self.current, self.current_t, self.memory = strategy, t, self.space.memory(strategy)
        self.improved["descent"] += 1

    def polish(self, limit: int, stop: Callable[[], bool] = stop_requested) -> None:
        """After the last descent: the stages' end operators split on their own, the
        body's ends on every server, the lone tables' layouts and the run members' shapes
        (:meth:`~topoopt.planners.moves.MoveSet.end_splits`), then, if that helped, the
        descent again (a quarter of ``limit``). Never worse than the best before."""
        if self.settle(limit, stop, self.moveset.end_splits):
            self.settle(limit // 4, stop)

    def result(self) -> SearchResult:
        return SearchResult(self.best, self.best_t, self.start_t, self.moves, self.accepted,
                            tuple(self.trace), self.seed, self.interrupted,
                            tuple((k, v) for k, v in self.improved.items() if v))


def mcmc_search(space: StrategySpace, cost: Callable[[Strategy], float], start: Strategy,
                budget: int, seed: int = 0, alpha: float = DEFAULT_ALPHA,
                restart_every: int = RESTART_EVERY, moves: MoveSet | None = None,
                progress: Callable[[int, float], None] | None = None,
                stop: Callable[[], bool] = stop_requested) -> SearchResult:
    """Search strategies by MCMC from ``start`` for ``budget`` moves, keeping the best.

    Parameters
    ----------
    space : StrategySpace
    cost : callable
        Strategy -> iteration seconds (:class:`~topoopt.planners.cost.IterationCost`).
    start : Strategy
    budget : int
        Moves to propose.
    seed : int
    alpha, restart_every, moves
        As :class:`Chain`.
    progress : callable, optional
        Called as ``progress(moves_done, best_time)`` every ``budget // 20`` moves.
    stop : callable
        Polled between moves; True ends the search early with the best so far.

    Returns
    -------
    SearchResult

    References
    ----------
    .. [1] Z. Jia, M. Zaharia, A. Aiken, "Beyond Data and Model Parallelism for Deep
       Neural Networks", MLSys 2019, §5 (MCMC search).
    .. [2] TopoOpt §4, "Comp. x Comm. plane".
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    chain = Chain(space, cost, start, seed, alpha, restart_every, moves,
                  trace_every=max(1, budget // 100))
    block = max(1, budget // 20)
    done = 0
    while done < budget and not chain.interrupted:
        k = min(block, budget - done)
        chain.run(k, stop)
        done += k
        if progress is not None:
            progress(chain.moves, chain.best_t)
    return chain.result()


def descend(space: StrategySpace, cost: Callable, strategy: Strategy, time: float,
            moves: MoveSet, limit: int = 400,
            stop: Callable[[], bool] = stop_requested,
            neighbourhood: Callable | None = None,
            candidate_work: float = CANDIDATE_WORK) -> tuple[Strategy, float, int]:
    """Steepest descent over :meth:`MoveSet.neighbourhood` (or ``neighbourhood``: a
    function of ``(strategy, memory)`` that yields ``(candidate, memory)``) until no
    neighbour is faster (or ``limit`` candidates were tried): the chains explore, this
    settles a chain's best into the bottom of its basin, the same bottom whatever the
    seed.

    Each sweep times the whole neighbourhood and takes its fastest candidate; the first
    improvement would follow whichever change the neighbourhood lists first (a stage
    boundary) even where another (splitting the stage ``dp x mp``) opens a deeper basin.
    Candidates are timed against the sweep's best so far as a bound (a cost that supports
    it stops there). Returns ``(strategy, time, candidates tried)``.

    A cost that counts its simulations' work (``cost.work``, entry-events: :func:`~
    topoopt.netsim.dag.run_work`) also ends the descent once it has spent ``limit x
    candidate_work`` (as when ``limit`` candidates are tried: the sweep's best so far is
    taken). The limit in candidates was chosen where a candidate costs about the same
    in every family; at 1024 servers one family's candidates cost a thousand times
    another's, and its descent would spend the search's time on a fraction of a percent
    (docs/tuning.md, "Descents limited by their work")."""
    bounded = bool(getattr(cost, "supports_bound", False))
    around = moves.neighbourhood if neighbourhood is None else neighbourhood
    memory = space.memory(strategy)
    work_end = _work_end(cost, limit * candidate_work)
    tried = 0
    improved = True
    while improved and tried < limit and not stop():
        improved = False
        best = None
        best_t = time
        for candidate, moved in around(strategy, memory):
            tried += 1
            t = cost(candidate, best_t) if bounded else cost(candidate)
            if t < best_t * (1.0 - 1e-12):
                best, best_t = (candidate, moved), t
            if tried >= limit or stop() or getattr(cost, "work", 0) >= work_end:
                limit = tried   # (the work ends the descent here, as the limit would)
                break
        if best is not None:
            (strategy, memory), time, improved = best, best_t, True
    return strategy, time, tried


def _work_end(cost: Callable, allowance: float) -> float:
    """The ``cost.work`` at which ``allowance`` more entry-events are spent (inf for a
    cost that does not count its work)."""
    start = getattr(cost, "work", None)
    return math.inf if start is None else start + allowance


def _threshold(current_t: float, draw: float, alpha: float) -> float:
    """A time above which a candidate is surely rejected by the draw ``draw``.

    Metropolis accepts ``t > current_t`` iff ``draw < exp(-alpha (t - current_t) /
    current_t)``, i.e. ``t < current_t (1 - ln(draw) / alpha)``; the margin of 1e-9
    keeps floating-point rounding of exp/log on the safe side.
    """
    if not (alpha > 0 and draw > 0 and math.isfinite(current_t) and current_t > 0):
        return math.inf
    return current_t * (1.0 - math.log(draw) / alpha) * (1.0 + 1e-9)
