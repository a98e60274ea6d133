"""The shard tuner: REACT's feedback loop choosing among the shard's transforms.

Congestion is detected from FCTs (steady or erratic, REACT Eq. 1-2); then the best
estimated transform is applied while it gains more than epsilon (at most Amax per
batch), kept when the next batch is faster by tau_r, else reverted; at most Emax
exploration rounds, renewed after Emax x B quiet epochs (REACT §5.2, §5.4, Table 3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from topoopt.errors import ConfigError
from topoopt.fabrics.fabric import Fabric
from topoopt.react.detection import detect_congestion
from topoopt.react.flowsim import BackgroundFlows, hop_paths
from topoopt.react.loop import LoopCounters, ReactParams, ReactRun
from topoopt.react.shard.layout import ShardConfig, ShardLayout
from topoopt.react.shard.model import ShardModel, estimate
from topoopt.react.shard.transforms import check_shard_config, shard_candidates
from topoopt.topology.topology import Topology

__all__ = ["ShardState", "ShardDecision", "shard_leader_init", "shard_leader_step",
           "run_shard_react"]


@dataclass(frozen=True)
class _Pending:
    config: ShardConfig
    time: float
    transforms: tuple


@dataclass(frozen=True)
class ShardState(LoopCounters):
    """The shard tuner's memory between batches (immutable)."""

    params: ReactParams
    layout: ShardLayout
    config: ShardConfig
    model: ShardModel = ShardModel()
    pending: _Pending | None = None


@dataclass(frozen=True)
class ShardDecision:
    """What one step decided: the config every rank runs next, and why."""

    config: ShardConfig
    transforms: tuple = ()
    reverted: bool = False
    kept: bool = False
    forced: bool = False
    estimate_before: float = float("nan")
    estimate_after: float = float("nan")
    congested_flows: int = 0


def shard_leader_init(layout: ShardLayout, config: ShardConfig | None = None,
                      params: ReactParams = ReactParams()) -> ShardState:
    """The tuner's state at the start of the job (the plan's rings, equal shares)."""
    return ShardState(params, layout, layout.initial() if config is None else config)


def _congestion_targets(layout: ShardLayout, config: ShardConfig, cong) -> tuple:
    p = layout.pattern(config)
    flagged = cong.congested
    rings = sorted(set(p.chunk[flagged].tolist()))
    counts = np.bincount(p.src[flagged], minlength=layout.n) + \
        np.bincount(p.dst[flagged], minlength=layout.n)
    nodes = [int(x) for x in np.argsort(-counts, kind="stable") if counts[x] > 0]
    fabric = layout.fabric_of(config)
    links: set[int] = set()
    for u, v in set(zip(p.src[flagged].tolist(), p.dst[flagged].tolist())):
        for ls, _ in hop_paths(fabric, u, v):
            links.update(ls.tolist())
    return rings, nodes, sorted(links)


def shard_leader_step(state: ShardState, fct: np.ndarray, epoch_time: np.ndarray
                      ) -> tuple[ShardState, ShardDecision]:
    """One pass of the loop after a batch of B epochs run with ``state.config``.

    1. Read the batch's FCTs into the model; forget what is older than H epochs.
    2. If the last batch changed the config: keep it when the observed time improved
       by tau_r (``T_old >= (1 + tau_r) T_new``), else revert (the reverted transforms
       are not tried again for H epochs). The first epoch after an OCS re-wiring (its
       stall) is left out of that comparison.
    3. With exploration rounds left (Emax, renewed after Emax x B quiet epochs) and
       congestion detected (§5.2): apply the best estimated transform while it gains
       more than epsilon, at most Amax; check the result with the semantic checker.
    """
    P, L = state.params, state.layout
    fct = np.asarray(fct, float)
    epoch_time = np.asarray(epoch_time, float)
    B = fct.shape[0]
    p = L.pattern(state.config)
    if fct.ndim != 2 or fct.shape[1] != p.edges_count or epoch_time.shape != (B,):
        raise ConfigError("fct", fct.shape, f"need (B, {p.edges_count}) FCTs and B epoch "
                          "times for the current config")
    model = state.model.observe(L, state.config, fct, state.epoch).forget(
        state.epoch + B - P.history)
    times = epoch_time
    if state.pending is not None and state.pending.config.patched != state.config.patched \
            and B > 1:
        times = epoch_time[1:]
    observed = float(times.mean())
    config, base_time = state.config, observed
    prev = state.pending
    kept, reverted, tabu = state.judge(None if prev is None else prev.time,
                                       () if prev is None else prev.transforms, observed, P, B)
    if prev is not None and reverted:
        config, base_time = prev.config, prev.time
    rounds, forced = state.budget(P)
    chosen: list = []
    before = after = float("nan")
    flagged = 0
    pending = None
    if rounds < P.max_rounds and not reverted:
        cong = detect_congestion(p, fct, P.delta1, P.delta2)
        flagged = int(cong.congested.sum())
        if cong.any():
            rng = np.random.default_rng([P.seed, state.batch_index])
            rings, nodes, links = _congestion_targets(L, config, cong)
            taboo = frozenset(t for t, _ in tabu)
            trials = P.trials + P.trials_growth * state.explored
            cur = config
            before = after = estimate(L, config, cur, model, P.history)
            for _ in range(P.max_accepted):
                cands = shard_candidates(L, cur, model, rings, nodes, links, rng,
                                         swaps=trials, tabu=taboo)
                if not cands:
                    break
                scored = [(estimate(L, config, t.apply(cur), model, P.history), i, t)
                          for i, t in enumerate(cands)]
                best, _, t = min(scored, key=lambda x: (x[0], x[1]))
                if not after > (1.0 + P.epsilon) * best:
                    break
                cur, after = t.apply(cur), best
                chosen.append(t)
                rings = sorted(set(rings) | ({t.ring} if hasattr(t, "ring") else set()))
            if chosen:
                check_shard_config(L, cur)
                pending = _Pending(config, base_time, tuple(chosen))
                config = cur
    new = replace(state, config=config, model=model, pending=pending,
                  **state.after(B, rounds, bool(chosen), tabu))
    return new, ShardDecision(config, tuple(chosen), reverted, kept, forced, before, after,
                              flagged)


def run_shard_react(executor, layout: ShardLayout, epochs: int,
                    params: ReactParams = ReactParams(), enabled: bool = True,
                    external: Sequence[BackgroundFlows] = (),
                    world: Callable[[Topology], Fabric] | None = None,
                    progress: Callable[[int], None] | None = None) -> ReactRun:
    """Run ``epochs`` epochs of the plan's AllReduce on ``executor``, with the shard
    tuner (or without: the plan as it is).

    ``executor`` runs patterns (:class:`~topoopt.react.classsim.ClassExecutor` or the
    ns-3 executor) and takes ``set_background(flows)`` (external plus the owned flows on
    their current routes) and, on an OCS shard, ``reconfigure(fabric, stall)``;
    ``world(topology)`` gives the fabric the network really is for a re-wired topology
    (its gray failures included). ``progress(epochs_done)`` after every batch.
    """
    state = shard_leader_init(layout, params=params)
    current = state.config
    external = tuple(external)
    executor.set_background(external + layout.owned_flows(current))
    times: list[np.ndarray] = []
    changes = []
    done = 0
    while done < epochs:
        b = min(params.batch, epochs - done)
        res = executor.run(layout.pattern(current), b)
        times.append(np.asarray(res.epoch_time, float))
        done += b
        if progress is not None:
            progress(done)
        if enabled and b == params.batch and done < epochs:
            state, dec = shard_leader_step(state, res.fct, res.epoch_time)
            new = dec.config
            if new != current:
                if new.patched != current.patched or (any(new.patched)
                                                       and new.orders != current.orders):
                    topo = layout.topology_of(new)
                    fabric = world(topo) if world is not None else layout.fabric_of(new)
                    executor.reconfigure(fabric, layout.reconfiguration)
                fabric = getattr(executor, "fabric", layout.fabric_of(new))
                if new.routes != current.routes or new.patched != current.patched:
                    executor.set_background(external + layout.owned_flows(new, fabric))
                changes.append((done, tuple(str(t) for t in dec.transforms), dec.reverted))
            current = new
    return ReactRun(np.concatenate(times), tuple(changes), layout.pattern(current))
