"""MCMC search over parallelization strategies on a fixed network (TopoOpt §4, Comp x Comm plane).

FlexFlow's search (Jia et al., "Beyond Data and Model Parallelism", MLSys'19, §5):
a Markov chain whose states are strategies; a move re-configures one operator;
Metropolis acceptance on the simulated iteration time; the best state is tracked,
and the chain restarts from it every ``budget / restarts`` moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from topoopt.interrupt import stop_requested
from topoopt.model import Model
from topoopt.planners.space import StrategySpace
from topoopt.strategy import Strategy

__all__ = ["SearchResult", "mcmc_search", "DEFAULT_ALPHA"]

#: Metropolis temperature on the *relative* change: a move 5% worse than the current
#: state is accepted with probability exp(-20 x 0.05) = 0.37, 20% worse with 0.018.
DEFAULT_ALPHA = 20.0

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
        Best time after each block of ``budget // 100`` moves.
    seed : int
    interrupted : bool
        Stopped early by Ctrl-C (or a stop callback); ``best`` is still valid.
    """

    best: Strategy
    best_time: float
    start_time: float
    moves: int
    accepted: int
    trace: tuple[float, ...]
    seed: int
    interrupted: bool = False


def mcmc_search(space: StrategySpace, cost: Callable[[Strategy], float], start: Strategy,
                budget: int,
                seed: int = 0, alpha: float = DEFAULT_ALPHA, restarts: int = 100,
                neighbour_moves: float = 0.25, segment_moves: float = 0.25,
                progress: Callable[[int, float], None] | None = None,
                stop: Callable[[], bool] = stop_requested) -> SearchResult:
    """Search strategies by MCMC, keeping the best.

    Parameters
    ----------
    space : planners.space.StrategySpace
        Valid configs per operator and the memory check.
    cost : callable
        Strategy -> iteration seconds (:class:`IterationCost`). If it has a true
        ``supports_bound`` attribute it is called as ``cost(strategy, bound)`` with
        the time above which the next acceptance draw rejects the candidate, and may
        return any value above ``bound`` for such a candidate instead of its time: the
        draw is read ahead without being consumed, so the chain (moves, acceptances,
        best strategy and times) is the same as with exact times.
    start : Strategy
        Must be in ``space`` (data parallel, or DLRM's hybrid when DP does not fit).
    budget : int
        Moves to propose.
    seed : int
    alpha : float
        Acceptance ``exp(-alpha x (new - current) / current)`` for worse moves.
    restarts : int
        Jump back to the best state every ``budget // restarts`` moves.
    neighbour_moves : float
        Probability that a move copies the config of an adjacent operator instead of
        drawing a random one. Adjacent operators with one config fuse into one task
        and exchange no MP traffic, so such moves reach good regions much faster
        than uniform draws.
    segment_moves : float
        Probability that a random config is given to a whole segment: the operator
        and every operator connected to it through neighbours that share its current
        config. Moving a fused chain one operator at a time creates MP traffic at each
        step, a barrier single-operator moves rarely cross. The remaining moves are
        FlexFlow's uniform single-operator draws, so the chain still covers the space.
    progress : callable, optional
        Called as ``progress(moves_done, best_time)`` after every block of moves.
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
    rng = np.random.default_rng(seed)
    current, current_t = start, cost(start)
    best, best_t, start_t = current, current_t, current_t
    memory = space.memory(current)
    block = max(1, budget // max(restarts, 1))
    trace: list[float] = []
    accepted = 0
    interrupted = False
    neighbours = _neighbours(space.model)
    bounded = bool(getattr(cost, "supports_bound", False))
    move = None
    moves = 0
    for moves in range(1, budget + 1):
        if stop():
            interrupted, moves = True, moves - 1
            break
        u = rng.random()
        if u < neighbour_moves:
            move = _neighbour_move(space, current, memory, neighbours, rng)
        elif u < neighbour_moves + segment_moves:
            move = _segment_move(space, current, memory, neighbours, rng)
        else:
            move = space.propose(current, memory, rng)
            if move is not None:
                i, config, moved_memory = move
                move = (current.with_config(i, config, name="mcmc"), moved_memory)
        if move is not None:
            candidate, moved_memory = move
            if bounded:
                # The acceptance draw comes next (when t > current_t): read it without
                # consuming it, so the cost can stop once t is sure to be rejected.
                state = rng.bit_generator.state
                draw = rng.random()
                rng.bit_generator.state = state
                t = cost(candidate, _threshold(current_t, draw, alpha))
            else:
                t = cost(candidate)
            if t <= current_t or rng.random() < math.exp(-alpha * (t - current_t) / current_t):
                current, current_t, memory = candidate, t, moved_memory
                accepted += 1
                if t < best_t:
                    best, best_t = candidate, t
        if moves % block == 0:
            trace.append(best_t)
            if progress is not None:
                progress(moves, best_t)
            current, current_t, memory = best, best_t, space.memory(best)
    return SearchResult(best, best_t, start_t, moves, accepted, tuple(trace), seed, interrupted)


def _threshold(current_t: float, draw: float, alpha: float) -> float:
    """A time above which a candidate is surely rejected by the draw ``draw``.

    Metropolis accepts ``t > current_t`` iff ``draw < exp(-alpha (t - current_t) /
    current_t)``, i.e. ``t < current_t (1 - ln(draw) / alpha)``; the margin of 1e-9
    keeps floating-point rounding of exp/log on the safe side.
    """
    if not (alpha > 0 and draw > 0 and math.isfinite(current_t) and current_t > 0):
        return math.inf
    return current_t * (1.0 - math.log(draw) / alpha) * (1.0 + 1e-9)


def _neighbours(model: Model) -> list[list[int]]:
    """Per operator, the operators it exchanges tensors with (inputs excluded)."""
    adj: list[set[int]] = [set() for _ in model.operators]
    for u, v in model.edges:
        if model.operators[u].kind != "input":
            adj[u].add(v)
            adj[v].add(u)
    return [sorted(a) for a in adj]


def _neighbour_move(space, strategy: Strategy, memory, neighbours, rng):
    """Operator ``i`` takes the config of an adjacent operator."""
    movable = space.movable
    i = movable[int(rng.integers(len(movable)))]
    if not neighbours[i]:
        return None
    j = neighbours[i][int(rng.integers(len(neighbours[i])))]
    return _apply(space, strategy, memory, [i], strategy.configs[j])


def _segment_move(space, strategy: Strategy, memory, neighbours, rng):
    """A random config for operator ``i`` and the connected operators sharing its config."""
    movable = space.movable
    i = movable[int(rng.integers(len(movable)))]
    old = strategy.configs[i]
    segment, frontier = {i}, [i]
    while frontier:
        u = frontier.pop()
        for v in neighbours[u]:
            if v not in segment and strategy.configs[v] == old:
                segment.add(v)
                frontier.append(v)
    cands = space.configs[i]
    return _apply(space, strategy, memory, sorted(segment), cands[int(rng.integers(len(cands)))])


def _apply(space, strategy: Strategy, memory, ops: list[int], config):
    """``strategy`` with ``config`` on every op of ``ops`` that accepts it, if it fits."""
    configs = list(strategy.configs)
    moved = memory
    for i in ops:
        if configs[i] != config and config in space.config_sets[i]:
            moved = space.moved_memory(moved, i, configs[i], config)
            configs[i] = config
    if moved is memory or float(moved.max()) > space.memory_limit:
        return None
    return Strategy(tuple(configs), "mcmc"), moved
