"""Cooperative REACT: jobs that each run REACT on one network, without a controller.

No central controller, and no job knows the others' patterns (REACT §7.3.3's future
work).

REACT §7.3.3 sees two jobs that both run REACT do worse than when only one does: the
two leaders interact and get stuck in bad configurations. Each leader's keep/revert
test (§5.4.2: keep a batch's swaps when the batch was ``tau_r`` faster than the one
before) assumes that only its own swap changed between the two batches; with two
leaders deciding on the same batch boundaries (the same B, started together), each
one's evaluation also measures the other's change, and both keep or revert on the sum.

:func:`coop_step` wraps :func:`~topoopt.react.loop.leader_step` with three local rules;
a leader sees only its own flows' completion times, as in REACT:

1. **Randomized, staggered decision epochs** (CSMA-like): after each of its
   explorations is judged, a leader waits a random number of batches (uniform in
   ``1..window``) before it may explore again, and its first exploration waits
   ``0..window-1`` batches; leaders with independent seeds rarely explore in the same
   batch, so each evaluation sees one change.
2. **Backing off after a swap that made things worse**: a reverted exploration doubles
   the window (up to ``max_window``); a kept one resets it. Two leaders that keep
   undoing each other's gains slow down and drift apart.
3. **Telling another job's reaction from the job's own**: the flows a swap did not touch
   (same source and destination before and after) are the control group. If their
   mean FCTs moved together by more than ``shift`` (median ratio), the network around
   the job changed during the evaluation, and the old pattern's time is scaled by that
   ratio before the keep/revert test (a difference-in-differences). A shift seen while
   the leader changed nothing -- another job reacting, or external congestion starting
   or stopping -- holds exploration off for a batch: a neighbour's trial that is reverted
   lasts one batch and is then gone, while congestion that persists is handled as before.

Every pattern still comes from :func:`~topoopt.react.loop.leader_step` (its swaps and
reverts), so the semantic checker's guarantees are unchanged (tests check it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from topoopt._require import require_int, require_positive
from topoopt.collectives.ten import Pattern
from topoopt.react.loop import (
    Decision,
    LeaderState,
    ReactParams,
    keeps_pending,
    leader_init,
    leader_step,
)

__all__ = ["CoopParams", "CoopState", "coop_init", "coop_step", "environment_shift"]


@dataclass(frozen=True)
class CoopParams:
    """Parameters of the cooperative rules (not from the paper: chosen here, see
    ``benchmarks/cluster_bench.py`` for their effect).

    Attributes
    ----------
    window : int
        Batches of the first backoff window (2): after a revert, the next exploration
        waits ``0..window-1`` batches (drawn).
    max_window : int
        Largest window after consecutive reverts (4).
    shift : float
        Median relative change of the control flows' FCTs that counts as a change of
        the network around the job (0.1).
    stagger, backoff, control, renew : bool
        Rules 1, 2, 3 and 4 (each can be switched off to measure it).
    seed : int
        Draws of the waits; give every job its own.
    """

    window: int = 2
    max_window: int = 4
    shift: float = 0.1
    stagger: bool = True
    backoff: bool = True
    control: bool = True
    renew: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        require_int("coop.window", self.window, minimum=1)
        require_int("coop.max_window", self.max_window, minimum=self.window)
        require_positive("coop.shift", self.shift, allow_zero=True)
        require_int("coop.seed", self.seed, minimum=0)


@dataclass(frozen=True)
class CoopState:
    """A cooperative leader's state: REACT's, plus its backoff and its last batches.

    ``reference`` is the per-flow mean FCT before an unexplained shift (None when the
    network around the job looks steady).
    """

    leader: LeaderState
    params: CoopParams
    wait: int
    window: int
    batch: int = 0
    last_fct: np.ndarray | None = None
    last_pattern: Pattern | None = None
    reference: np.ndarray | None = None

    @property
    def pattern(self) -> Pattern:
        return self.leader.pattern


def coop_init(pattern: Pattern, params: ReactParams = ReactParams(),
              coop: CoopParams = CoopParams()) -> CoopState:
    """A cooperative leader at the start of its job."""
    return CoopState(leader_init(pattern, params), coop, 0, coop.window)


def _rng(coop: CoopParams, batch: int) -> np.random.Generator:
    return np.random.default_rng([coop.seed, batch, 73])


def environment_shift(before: np.ndarray, after: np.ndarray, same: np.ndarray) -> float:
    """Median ratio of mean FCT after / before over the flows ``same`` (1 if none).

    ``before`` and ``after`` are per-flow FCTs of two batches, shape (B, E) or (E,)
    (already averaged), of patterns with the same edges; ``same`` flags the edges
    with the same source and destination in both.
    """
    if not np.any(same):
        return 1.0
    a = np.atleast_2d(np.asarray(before, float))[:, same].mean(axis=0)
    b = np.atleast_2d(np.asarray(after, float))[:, same].mean(axis=0)
    ok = a > 0
    return float(np.median(b[ok] / a[ok])) if ok.any() else 1.0


def _same_edges(p: Pattern, q: Pattern) -> np.ndarray:
    if p.edges_count != q.edges_count:
        return np.zeros(q.edges_count, bool)
    return (p.src == q.src) & (p.dst == q.dst)


def coop_step(state: CoopState, fct: np.ndarray, epoch_time: np.ndarray
              ) -> tuple[CoopState, Decision]:
    """One batch of a cooperative leader (see the module docstring).

    Same protocol as :func:`~topoopt.react.loop.leader_step`: the batch's FCTs and
    epoch times of ``state.pattern`` in, the next pattern out.
    """
    C, lead = state.params, state.leader
    fct = np.asarray(fct, float)
    wait, window, reference = state.wait, state.window, state.reference
    judging = lead.pending is not None        # this batch ran the last batch's swaps
    scale, shifted, renewed = 1.0, False, False
    if C.control and state.last_fct is not None and state.last_pattern is not None:
        ratio = environment_shift(state.last_fct, fct,
                                  _same_edges(state.last_pattern, lead.pattern))
        shifted = abs(ratio - 1.0) > C.shift
        if judging and shifted:
            scale = ratio                     # rule 3: judge the swap net of the shift
    if judging:                               # rules 1 and 2, before leader_step acts
        reference = None
        kept = keeps_pending(lead, float(np.mean(epoch_time)), scale)
        collided = not kept and shifted       # the network moved while the swap was judged
        if C.backoff:
            window = C.window if kept else min(2 * window, C.max_window) if collided \
                else window
        if collided and C.stagger:
            wait = int(_rng(C, state.batch + 1).integers(0, window))
        explore = wait == 0
    elif reference is not None:               # rule 4: did last batch's shift persist?
        persisted = abs(environment_shift(reference, fct, np.ones(fct.shape[1], bool))
                        - 1.0) > C.shift
        reference = None
        if persisted and C.renew and lead.rounds >= lead.params.max_rounds:
            lead = replace(lead, rounds=0, quiet=0)
            renewed = True
        explore = wait == 0
    elif shifted and state.last_fct is not None:   # rule 3: hold off a batch, watch
        reference = state.last_fct.mean(axis=0)
        explore = False
    else:
        explore = wait == 0
    wait = max(wait - 1, 0)
    new, dec = leader_step(lead, fct, epoch_time, explore=explore, baseline_scale=scale)
    detail = {**dec.detail, "coop_wait": wait, "coop_window": window,
              "coop_scale": scale, "coop_explore": explore, "coop_renewed": renewed}
    return (CoopState(new, C, wait, window, state.batch + 1, fct, lead.pattern, reference),
            replace(dec, detail=detail))
