"""REACT's feedback loop (§5.4, Algorithm 1, Table 3): a pure leader function plus a driver.

:func:`leader_step` is everything the leader (rank 0's RTuner thread, §6.2) does after a
batch of B epochs: given its state, the batch's gathered FCTs and epoch times, it
returns its next state and the pattern every rank runs next. It has no side effects
and draws its randomness from ``(seed, batch index)``, so any transport can carry it
(the flow simulator here, ns-3, a Gloo gather/broadcast in the real runtime).
:func:`run_react` drives it with any :class:`~topoopt.react.execution.PatternExecutor`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np

from topoopt._require import require_int, require_keys, require_positive
from topoopt.collectives.ten import Pattern
from topoopt.errors import ConfigError
from topoopt.react.critical import critical_paths
from topoopt.react.detection import Congestion, detect_congestion
from topoopt.react.execution import PatternExecutor
from topoopt.react.fct_model import FctHistory, estimate_fcts, estimate_paths
from topoopt.react.transforms import PositionSpace, Swap, candidate_swaps

__all__ = ["ReactParams", "LoopCounters", "keeps", "keeps_pending", "LeaderState", "Decision",
           "leader_init", "leader_step", "apply_transforms", "run_react", "ReactRun"]


@dataclass(frozen=True)
class ReactParams:
    """REACT's parameters (Table 3), defaults from the paper.

    Attributes
    ----------
    batch : int
        B, epochs per batch (6).
    delta1, delta2 : float
        Steady (0.2) and erratic (0.15) congestion thresholds (§5.2).
    trials : int
        Kt, transforms tried per batch (15), growing by ``trials_growth`` after every
        exploration round so later rounds search wider.
    trials_growth : int
        Not fixed by the paper; 5.
    max_accepted : int
        Amax (Kmax in Algorithm 1): transforms accepted per batch; not given in the paper; 4.
    epsilon : float
        Estimated improvement needed to accept a transform (0.05).
    tau_r : float
        Observed improvement needed to keep a batch's transforms (0.05): kept when
        ``T_old >= (1 + tau_r) T_new``, else reverted.
    max_rounds : int
        Emax, exploration rounds before sticking (5); after ``Emax x B`` epochs without
        exploration the budget is renewed (forced exploration).
    history : int
        H, epochs of FCTs remembered (60).
    positions : bool
        Offer position-equivalent swaps (their classes are computed once, at start).
    seed : int
    """

    batch: int = 6
    delta1: float = 0.2
    delta2: float = 0.15
    trials: int = 15
    trials_growth: int = 5
    max_accepted: int = 4
    epsilon: float = 0.05
    tau_r: float = 0.05
    max_rounds: int = 5
    history: int = 60
    positions: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batch", "trials", "max_accepted", "max_rounds", "history"):
            require_int(f"react.{name}", getattr(self, name), minimum=1)
        require_int("react.trials_growth", self.trials_growth, minimum=0)
        require_int("react.seed", self.seed, minimum=0)
        for name in ("delta1", "delta2", "epsilon", "tau_r"):
            require_positive(f"react.{name}", getattr(self, name), allow_zero=True)
        if self.delta1 >= 1:
            raise ConfigError("react.delta1", self.delta1, "must be in [0, 1)")

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> "ReactParams":
        """From a config's ``[react]`` table (keys are the attribute names)."""
        names = [f for f in cls.__dataclass_fields__]
        require_keys("react", dict(table), names)
        return cls(**dict(table))


@dataclass(frozen=True)
class _Pending:
    """The pattern before the last batch's transforms, to compare against and revert to."""

    pattern: Pattern
    space: PositionSpace
    time: float
    fct: np.ndarray
    steady_moved: frozenset
    swaps: tuple = ()


@dataclass(frozen=True, kw_only=True)
class LoopCounters:
    """Where a feedback loop is (§5.4.2), shared by every leader built on it.

    Attributes
    ----------
    epoch, batch_index : int
        Epochs and batches seen.
    rounds : int
        Exploration rounds used of Emax (a batch that changed the pattern is one).
    explored : int
        Batches that explored so far (Kt grows with them).
    quiet : int
        Epochs since the last exploration (Emax x B of them renew the budget).
    tabu : tuple
        ``(transform, epoch it was reverted)``: not tried again for H epochs.
    """

    epoch: int = 0
    batch_index: int = 0
    rounds: int = 0
    explored: int = 0
    quiet: int = 0
    tabu: tuple = ()

    def budget(self, params: ReactParams) -> tuple[int, bool]:
        """Exploration rounds used, after the forced renewal; and whether it happened."""
        if self.rounds >= params.max_rounds and self.quiet >= params.max_rounds * params.batch:
            return 0, True
        return self.rounds, False

    def live_tabu(self, params: ReactParams, batch: int) -> tuple:
        """The tabu entries still within H epochs after a batch of ``batch`` epochs."""
        return tuple(x for x in self.tabu if x[1] > self.epoch + batch - params.history)

    def judge(self, pending_time: float | None, transforms: tuple, observed: float,
              params: ReactParams, batch: int) -> tuple[bool, bool, tuple]:
        """Keep or revert the last batch's transforms (``pending_time``: the time before
        them, None if there were none): ``(kept, reverted, tabu)``, the reverted
        transforms added to the tabu list (§5.4.2)."""
        tabu = self.live_tabu(params, batch)
        if pending_time is None:
            return False, False, tabu
        if keeps(pending_time, observed, params):
            return True, False, tabu
        return False, True, tabu + tuple((t, self.epoch) for t in transforms)

    def after(self, batch: int, rounds: int, changed: bool, tabu: tuple) -> dict:
        """The counters after a batch (fields for :func:`dataclasses.replace`)."""
        return {"epoch": self.epoch + batch, "batch_index": self.batch_index + 1,
                "rounds": rounds + (1 if changed else 0),
                "explored": self.explored + (1 if changed else 0),
                "quiet": 0 if changed else self.quiet + batch, "tabu": tabu}


def keeps(old_time: float, new_time: float, params: ReactParams) -> bool:
    """Keep a batch's transforms: ``T_old >= (1 + tau_r) T_new`` (§5.4.2), else revert."""
    return old_time >= (1.0 + params.tau_r) * new_time


@dataclass(frozen=True)
class LeaderState(LoopCounters):
    """Everything the leader remembers between batches (immutable)."""

    params: ReactParams
    pattern: Pattern
    space: PositionSpace
    history: FctHistory
    pending: _Pending | None = None
    moved_steady: frozenset = frozenset()


@dataclass(frozen=True)
class Decision:
    """What one leader step decided."""

    pattern: Pattern
    swaps: tuple[Swap, ...] = ()
    reverted: bool = False
    kept: bool = False
    forced: bool = False
    congested_nodes: tuple[int, ...] = ()
    estimate_before: float = float("nan")
    estimate_after: float = float("nan")
    detail: dict = field(default_factory=dict)


def leader_init(pattern: Pattern, params: ReactParams = ReactParams()) -> LeaderState:
    """The leader's state at the start of the job (position classes computed here, once)."""
    return LeaderState(params, pattern, PositionSpace.of(pattern, params.positions),
                       FctHistory.empty())


def _node_counts(p: Pattern, flows: np.ndarray) -> np.ndarray:
    n = p.ranks
    return (np.bincount(p.src[flows], minlength=n) + np.bincount(p.dst[flows], minlength=n))


def _steady_nodes(p: Pattern, cong: Congestion) -> set[int]:
    """Nodes all of whose incoming, or all of whose outgoing, flows are steady congested."""
    out = set()
    for r in range(p.ranks):
        for side in (p.dst == r, p.src == r):
            if side.any() and cong.steady[side].all():
                out.add(r)
    return out


def _estimated_time(history: FctHistory, pattern: Pattern) -> float:
    """Critical-path length of ``pattern`` with estimated FCTs (its estimated time)."""
    _, length = critical_paths(pattern, estimate_fcts(history, pattern))
    return float(length[0])


def apply_transforms(pattern: Pattern, space: PositionSpace, fct: np.ndarray,
                     cong: Congestion, history: FctHistory, params: ReactParams,
                     rng: np.random.Generator, moved_steady: frozenset = frozenset(),
                     trials: int | None = None, tabu: frozenset = frozenset()):
    """Algorithm 1: try swaps of congested nodes on critical paths, keep estimated wins.

    Critical paths are taken per epoch of the batch and on the mean FCTs (B + 1 paths,
    §5.4.1). Congested flows on any of them name the congested nodes: steady-congested
    nodes first, then by how many (steady, then any) congested flows touch them. For
    each node in turn, viable swaps are drawn at random from the best non-empty
    priority group (:func:`candidate_swaps`), skipping those in ``tabu`` (swaps recently
    reverted: "tries new transforms", §5.4.2). A swap is accepted when the mean
    estimated time of the (old) critical paths drops by more than ``epsilon``
    (:func:`estimate_paths`) and -- a guard added here, since the old paths cannot see
    a bottleneck that merely moved elsewhere -- the critical path of the new pattern
    with estimated FCTs is not longer than the current one's. At most ``trials`` swaps
    are tried and ``max_accepted`` accepted. Steady-congested nodes are never swap
    partners, and the two ranks of a swap accepted in this batch are not moved again
    in the same batch (the next batch's measurements judge them first).

    Returns
    -------
    pattern, space, swaps, steady_moved, info
    """
    P = params
    trials = P.trials if trials is None else trials
    fct = np.asarray(fct, float)
    weights = np.vstack([fct, fct.mean(axis=0, keepdims=True)])
    paths, _ = critical_paths(pattern, weights)
    on_path = np.zeros(pattern.edges_count, bool)
    for p in paths:
        on_path[p] = True
    flagged = cong.congested & on_path
    info: dict = {"congested_flows": int(cong.congested.sum()),
                  "on_critical_path": int(flagged.sum())}
    if not flagged.any():
        return pattern, space, (), frozenset(), info
    bad_pairs = set(zip(pattern.src[cong.congested].tolist(),
                        pattern.dst[cong.congested].tolist()))
    steady = _steady_nodes(pattern, cong)
    counts = _node_counts(pattern, np.flatnonzero(flagged))
    steady_counts = _node_counts(pattern, np.flatnonzero(flagged & cong.steady))
    # steady-congested nodes first (all in- or out-flows steady, §5.4.1: the more severe),
    # then by steady, then by all congested flows on a critical path
    queue = sorted(np.flatnonzero(counts).tolist(),
                   key=lambda r: (r not in steady, -steady_counts[r], -counts[r], r))
    info["congested_nodes"] = tuple(queue)
    current = estimate_paths(history, pattern, paths)
    whole_now = _estimated_time(history, pattern)
    info["estimate_before"] = current
    swaps: list[Swap] = []
    steady_moved: set[int] = set()
    done: set[int] = set()
    placed: set[int] = set()      # ranks a swap of this batch just put somewhere: leave them
    used = 0
    while queue and used < trials and len(swaps) < P.max_accepted:
        x = queue.pop(0)
        done.add(x)
        flows_x = flagged & ((pattern.src == x) | (pattern.dst == x))
        incoming = bool((flows_x & (pattern.dst == x)).any())
        outgoing = bool((flows_x & (pattern.src == x)).any())
        exclude = frozenset((steady | set(moved_steady) | steady_moved | placed) - {x})
        groups = candidate_swaps(pattern, space, x, incoming=incoming, outgoing=outgoing,
                                 exclude=exclude)
        accepted = False
        for group in groups:
            group = [c for c in group if c[0] not in tabu]
            for i in rng.permutation(len(group)):
                if used >= trials:
                    break
                used += 1
                s, q = group[i]
                est = estimate_paths(history, q, paths)
                if current > (1.0 + P.epsilon) * est:
                    whole = _estimated_time(history, q)
                    if whole > whole_now:          # guard: it only moved the bottleneck
                        continue
                    pattern, space, current, whole_now = q, space.after(s), est, whole
                    swaps.append(s)
                    placed.update((s.a, s.b))
                    if x in steady:
                        steady_moved.add(x)
                    accepted = True
                    break
            if accepted or used >= trials:
                break
        if accepted:
            # congested pairs still on the new pattern's estimated critical path
            w = estimate_fcts(history, pattern)
            (path,), _ = critical_paths(pattern, w)
            still = [e for e in path.tolist()
                     if (int(pattern.src[e]), int(pattern.dst[e])) in bad_pairs]
            c2 = _node_counts(pattern, np.array(still, np.int64))
            queue = sorted((r for r in np.flatnonzero(c2).tolist()
                            if r not in done and r not in placed),
                           key=lambda r: (-c2[r], r))
    info["trials"] = used
    info["estimate_after"] = current
    return pattern, space, tuple(swaps), frozenset(steady_moved), info


def keeps_pending(state: LeaderState, observed: float, baseline_scale: float = 1.0) -> bool:
    """Whether the last batch's swaps stay (§5.4.2): the old pattern's time (times
    ``baseline_scale``) is at least ``1 + tau_r`` times ``observed``, the mean epoch
    time with the swaps. False when no swap is pending."""
    prev = state.pending
    return prev is not None and keeps(prev.time * baseline_scale, observed, state.params)


def leader_step(state: LeaderState, fct: np.ndarray, epoch_time: np.ndarray, *,
                explore: bool = True, baseline_scale: float = 1.0
                ) -> tuple[LeaderState, Decision]:
    """One pass of the feedback loop after a batch (Fig. 3, §5.4.1-§5.4.2).

    Parameters
    ----------
    state : LeaderState
    fct : array, shape (B, E)
        Gathered flow completion times of the batch, run with ``state.pattern``.
    epoch_time : array, shape (B,)
        The collective's time in each epoch of the batch.
    explore : bool
        Whether this batch may introduce transforms (step 3); a cooperative leader
        (:mod:`topoopt.react.cooperative`) holds off in some batches.
    baseline_scale : float
        Multiplies the old pattern's time before the keep/revert test of step 2 (1:
        Algorithm 1 as is): what the old pattern would take now, when the network
        around the job changed during the evaluation (:mod:`topoopt.react.cooperative`).

    Returns
    -------
    (LeaderState, Decision)
        ``decision.pattern`` is what every rank runs next.

    Notes
    -----
    1. Remember the batch's FCTs (forget epochs older than H).
    2. If the previous batch introduced transforms: keep them when the observed time
       improved by ``tau_r`` (``T_old >= (1 + tau_r) T_new``), else revert to the old
       pattern (and continue from its last FCTs); the reverted swaps are not tried
       again for H epochs.
    3. If fewer than Emax exploration rounds were used (renewed after Emax x B quiet
       epochs) and congestion is detected, apply Algorithm 1
       (:func:`apply_transforms`); a batch that changes the pattern is an exploration
       round.
    """
    P = state.params
    fct = np.asarray(fct, float)
    epoch_time = np.asarray(epoch_time, float)
    B = fct.shape[0]
    if fct.ndim != 2 or fct.shape[1] != state.pattern.edges_count or epoch_time.shape != (B,):
        raise ConfigError("fct", fct.shape, f"need (B, {state.pattern.edges_count}) FCTs "
                          "and B epoch times for the current pattern")
    history = state.history.add(state.pattern, fct, state.epoch, P.history)
    observed = float(epoch_time.mean())
    pattern, space, base_fct, base_time = state.pattern, state.space, fct, observed
    moved = state.moved_steady
    prev = state.pending
    kept, reverted, tabu = state.judge(None if prev is None else prev.time * baseline_scale,
                                       () if prev is None else prev.swaps, observed, P, B)
    if prev is not None and kept:
        moved = moved | prev.steady_moved
    elif prev is not None and reverted:
        pattern, space, base_fct, base_time = prev.pattern, prev.space, prev.fct, prev.time
    rounds, forced = state.budget(P)
    swaps: tuple[Swap, ...] = ()
    pending = None
    info: dict = {}
    congested_nodes: tuple[int, ...] = ()
    if explore and rounds < P.max_rounds:
        cong = detect_congestion(pattern, base_fct, P.delta1, P.delta2)
        if cong.any():
            rng = np.random.default_rng([P.seed, state.batch_index])
            trials = P.trials + P.trials_growth * state.explored
            new, new_space, swaps, steady_moved, info = apply_transforms(
                pattern, space, base_fct, cong, history, P, rng, moved, trials,
                frozenset(s for s, _ in tabu))
            congested_nodes = tuple(info.get("congested_nodes", ()))
            if swaps:
                pending = _Pending(pattern, space, base_time, base_fct, steady_moved, swaps)
                pattern, space = new, new_space
    new_state = replace(state, pattern=pattern, space=space, history=history,
                        pending=pending, moved_steady=moved,
                        **state.after(B, rounds, bool(swaps), tabu))
    return new_state, Decision(pattern, swaps, reverted, kept, forced, congested_nodes,
                               info.get("estimate_before", float("nan")),
                               info.get("estimate_after", float("nan")), info)


@dataclass(frozen=True)
class ReactRun:
    """Per-epoch collective times of one run, and what the loop did.

    Attributes
    ----------
    epoch_time : ndarray, shape (epochs,)
    changes : tuple of (epoch, swaps, reverted)
        Epoch at which a new pattern took effect, the swaps applied (empty for a plain
        revert) and whether it was a revert.
    final : Pattern
    positions_skipped : bool
        Position swaps were not offered: the pattern is too large for their class
        search (:data:`~topoopt.react.transforms.POSITION_WORK_LIMIT`).
    """

    epoch_time: np.ndarray
    changes: tuple
    final: Pattern
    positions_skipped: bool = False

    @property
    def converged_epoch(self) -> int:
        """First epoch from which the pattern no longer changed (0 if it never did)."""
        return int(self.changes[-1][0]) if self.changes else 0


def run_react(executor: PatternExecutor, pattern: Pattern, epochs: int,
              params: ReactParams = ReactParams(), enabled: bool = True,
              progress: Callable[[int], None] | None = None) -> ReactRun:
    """Run ``epochs`` epochs on ``executor``, with the REACT loop (or without: baseline).

    Batches of B epochs run with the current pattern; after each batch the leader
    (:func:`leader_step`) picks the pattern for the next one. ``progress(epochs_done)``
    is called after every batch.
    """
    require_int("epochs", epochs, minimum=1)
    state = leader_init(pattern, params) if enabled else None
    current = pattern
    times: list[np.ndarray] = []
    changes = []
    done = 0
    while done < epochs:
        b = min(params.batch, epochs - done)
        res = executor.run(current, b)
        times.append(np.asarray(res.epoch_time, float))
        done += b
        if progress is not None:
            progress(done)
        if state is not None and b == params.batch and done < epochs:
            state, dec = leader_step(state, res.fct, res.epoch_time)
            if dec.pattern.signature() != current.signature():
                changes.append((done, tuple(str(s) for s in dec.swaps), dec.reverted))
            current = dec.pattern
    return ReactRun(np.concatenate(times), tuple(changes), current,
                    state is not None and state.space.skipped)
