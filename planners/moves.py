"""The MCMC's moves: one operator, a segment, a run of identical operators, a swap, a layout.

FlexFlow's search (Jia et al., MLSys'19, §5) re-configures one operator per move,
drawn uniformly. On our models that chain rarely reaches the good strategies: a dense
layer has ~500 candidate configs at n = 128 and only five use every server, and the
good strategies change a whole repeated structure at once (every MLP layer split
``dp x mp2``, the tables moved as a block). So a move here is one of

- ``single``: FlexFlow's move, the config drawn from the *wide* configs (every server
  or the operator's current block, any ``mp``) half of the time;
- ``neighbour``: an operator takes an adjacent operator's config (they then fuse and
  exchange no MP traffic);
- ``segment``: a random config for an operator and every connected operator sharing
  its config (a fused chain moves together);
- ``run``: one config for a run of identical operators (all tables, an MLP's equal
  layers, BERT's per-block operators), or one shard pattern across it (tables moved
  to the next block);
- ``swap``: two operators of a run trade configs (two tables trade servers);
- ``boundary``: every place in the body where the config changes (a stage boundary)
  moves by one operator the same way -- the shift that rebalances stages together;
- ``split``: the body operators from one on, as long as they share its config, get
  a new config -- a new stage cut off the end of one;
- ``stage``: a stage (consecutive body operators on the same servers), or the members
  of one run inside it, split ``dp x mp`` another way on the same servers -- the
  tensor-split top of a pipeline stage whose bottom stays data parallel;
- ``layout``: the table or body part of the strategy replaced by a structured layout
  (:mod:`topoopt.planners.structure`).

Every move keeps the strategy inside the space and within memory (or is dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topoopt.model import Model
from topoopt.planners.space import StrategySpace
from topoopt.planners.structure import Layout, operator_runs
from topoopt.strategy import OpConfig, Strategy

__all__ = ["MOVE_KINDS", "DEFAULT_MIX", "MoveSet", "neighbours"]

MOVE_KINDS = ("single", "neighbour", "segment", "run", "swap", "boundary", "split", "stage",
              "layout")
#: Probability of each move kind (renormalized over the kinds a model has).
DEFAULT_MIX = {"single": 0.15, "neighbour": 0.15, "segment": 0.1, "run": 0.15, "swap": 0.1,
               "boundary": 0.1, "split": 0.05, "stage": 0.05, "layout": 0.15}


def neighbours(model: Model) -> list[list[int]]:
    """Per operator, the operators it exchanges tensors with (inputs excluded)."""
    adj: list[set[int]] = [set() for _ in model.operators]
    for u, v in model.edges:
        if model.operators[u].kind != "input":
            adj[u].add(v)
            adj[v].add(u)
    return [sorted(a) for a in adj]


@dataclass
class MoveSet:
    """Move proposals for one model and strategy space.

    Parameters
    ----------
    space : StrategySpace
    layouts : sequence of Layout
        Structured strategies whose table or body parts ``layout`` moves borrow.
    mix : mapping, optional
        Probability per move kind (:data:`DEFAULT_MIX`).
    """

    space: StrategySpace
    layouts: tuple[Layout, ...] = ()
    mix: dict | None = None

    def __post_init__(self) -> None:
        model = self.space.model
        self.model = model
        self.neighbours = neighbours(model)
        movable = set(self.space.movable)
        self.runs = tuple(r for r in (tuple(i for i in run if i in movable)
                                      for run in operator_runs(model)) if len(r) > 1)
        ops = model.operators
        self.tables = tuple(i for i, op in enumerate(ops) if op.kind == "embedding")
        self.body = tuple(i for i, op in enumerate(ops)
                          if op.kind not in ("embedding", "input"))
        in_run = {i for run in self.runs for i in run}
        self.lone_tables = tuple(i for i in self.tables
                                 if i not in in_run and i in movable)
        self.wide = tuple(self._wide(i) for i in range(len(ops)))
        self.blocks = _aligned_blocks(self.space.servers)
        mix = dict(DEFAULT_MIX if self.mix is None else self.mix)
        if not self.runs:
            mix.pop("run", None)
            mix.pop("swap", None)
        if not self.layouts:
            mix.pop("layout", None)
        kinds = [k for k in MOVE_KINDS if mix.get(k, 0) > 0]
        p = np.array([mix[k] for k in kinds], float)
        self.kinds = tuple(kinds)
        self.cum = np.cumsum(p / p.sum())

    def _wide(self, i: int) -> tuple[OpConfig, ...]:
        """Candidate configs of op ``i`` that use every server (any ``mp``)."""
        n = self.space.servers
        return tuple(c for c in self.space.configs[i] if len(c.servers) == n)

    # -- helpers ---------------------------------------------------------------------
    def _fit(self, strategy: Strategy, memory: np.ndarray, changes: dict[int, OpConfig]):
        """``strategy`` with ``changes`` applied where the op accepts the config, if it
        changes anything and fits; else None."""
        configs = list(strategy.configs)
        moved = None                      # one copy of ``memory``, then moved in place
        canonical = self.space.canonical
        for i, wanted in changes.items():
            cfg = canonical[i].get(wanted)
            # configs are the space's shared instances: most unchanged ones are the same
            if cfg is not None and configs[i] is not cfg and configs[i] != cfg:
                moved = self.space.moved_memory(memory if moved is None else moved, i,
                                                configs[i], cfg, copy=moved is None)
                configs[i] = cfg
        if moved is None or float(moved.max()) > self.space.memory_limit:
            return None
        return Strategy(tuple(configs), "mcmc"), moved

    def _unseen(self, strategy: Strategy, memory: np.ndarray):
        """``emit(changes)``: :meth:`_fit` of ``changes``, or None where that gives
        ``strategy`` itself or a candidate ``emit`` already returned."""
        seen = {strategy.configs}

        def emit(changes: dict[int, OpConfig]):
            out = self._fit(strategy, memory, changes)
            if out is not None and out[0].configs not in seen:
                seen.add(out[0].configs)
                return out
            return None

        return emit

    def _draw_config(self, i: int, current: OpConfig, rng: np.random.Generator) -> OpConfig:
        cands = self.space.configs[i]
        if rng.random() < 0.5:
            # wide: every server, or the current block with another mp
            block = [c for c in cands if c.servers == current.servers]
            pool = self.wide[i] + tuple(block)
            if pool:
                return pool[int(rng.integers(len(pool)))]
        return cands[int(rng.integers(len(cands)))]

    # -- the moves -------------------------------------------------------------------
    def propose(self, strategy: Strategy, memory: np.ndarray, rng: np.random.Generator,
                tries: int = 8):
        """A random move from ``strategy``: ``(candidate, its memory, kind)`` or None."""
        movable = self.space.movable
        if not movable:
            return None
        for _ in range(tries):
            kind = self.kinds[int(np.searchsorted(self.cum, rng.random(), side="right"))
                              if len(self.kinds) > 1 else 0]
            out = getattr(self, f"_{kind}")(strategy, memory, rng)
            if out is not None:
                return out[0], out[1], kind
        return None

    def _single(self, strategy, memory, rng):
        movable = self.space.movable
        i = movable[int(rng.integers(len(movable)))]
        return self._fit(strategy, memory, {i: self._draw_config(i, strategy.configs[i], rng)})

    def _neighbour(self, strategy, memory, rng):
        movable = self.space.movable
        i = movable[int(rng.integers(len(movable)))]
        if not self.neighbours[i]:
            return None
        j = self.neighbours[i][int(rng.integers(len(self.neighbours[i])))]
        return self._fit(strategy, memory, {i: strategy.configs[j]})

    def _segment(self, strategy, memory, rng):
        movable = self.space.movable
        i = movable[int(rng.integers(len(movable)))]
        old = strategy.configs[i]
        segment, frontier = {i}, [i]
        while frontier:
            u = frontier.pop()
            for v in self.neighbours[u]:
                if v not in segment and strategy.configs[v] == old:
                    segment.add(v)
                    frontier.append(v)
        cfg = self._draw_config(i, old, rng)
        return self._fit(strategy, memory, {j: cfg for j in sorted(segment)})

    def _run(self, strategy, memory, rng):
        run = self.runs[int(rng.integers(len(self.runs)))]
        if rng.random() < 0.5:
            i = run[int(rng.integers(len(run)))]
            cfg = self._draw_config(i, strategy.configs[i], rng)
            return self._fit(strategy, memory, {j: cfg for j in run})
        out = self._shifted(strategy, run, int(rng.choice([-1, 1])))
        return self._fit(strategy, memory, out) if out else None

    def _shifted(self, strategy: Strategy, run: tuple[int, ...], step: int) -> dict:
        """The run's shard pattern shifted: every member not on every server to the next
        (``step`` = 1) or previous (-1) block of its size."""
        n = self.space.servers
        out = {}
        for j in run:
            c = strategy.configs[j]
            k = len(c.servers)
            if k == n:
                continue
            first = (c.servers[0] + step * k) % n
            out[j] = OpConfig(tuple(range(first, first + k)), c.dp, c.mp) \
                if first + k <= n else c
        return out

    def _swap(self, strategy, memory, rng):
        run = self.runs[int(rng.integers(len(self.runs)))]
        a, b = rng.choice(len(run), size=2, replace=False)
        i, j = run[int(a)], run[int(b)]
        ci, cj = strategy.configs[i], strategy.configs[j]
        if ci == cj:
            return None
        return self._fit(strategy, memory, {i: cj, j: ci})

    def _boundary(self, strategy, memory, rng):
        body, configs = self.body, strategy.configs
        step = int(rng.choice([-1, 1]))
        changes = {}
        for a, b in zip(body, body[1:]):
            if configs[a] != configs[b]:
                # step +1: the operator after the boundary joins the one before it
                if step > 0:
                    changes.setdefault(b, configs[a])
                else:
                    changes.setdefault(a, configs[b])
        if not changes:
            return None
        if len(changes) > 1 and rng.random() < 0.5:   # sometimes just one boundary
            keys = sorted(changes)
            k = keys[int(rng.integers(len(keys)))]
            changes = {k: changes[k]}
        return self._fit(strategy, memory, changes)

    def _split(self, strategy, memory, rng):
        body, configs = self.body, strategy.configs
        if not body:
            return None
        k = int(rng.integers(len(body)))
        old = configs[body[k]]
        tail = [body[k]]
        for i in body[k + 1:]:
            if configs[i] != old:
                break
            tail.append(i)
        cfg = self._draw_config(body[k], old, rng)
        return self._fit(strategy, memory, {i: cfg for i in tail})

    def _stages(self, strategy: Strategy) -> list[tuple[int, ...]]:
        """The stages of the body: maximal runs of consecutive operators on the same
        servers, in body order."""
        configs = strategy.configs
        stages: list[list[int]] = []
        for i in self.body:
            if stages and configs[stages[-1][-1]].servers == configs[i].servers:
                stages[-1].append(i)
            else:
                stages.append([i])
        return [tuple(s) for s in stages]

    def _stage_groups(self, strategy: Strategy) -> list[tuple[int, ...]]:
        """Each stage of the body (:meth:`_stages`) and each run's members inside it, in
        body order, without repeats."""
        groups: dict[tuple[int, ...], None] = {}
        for stage in self._stages(strategy):
            groups.setdefault(stage)
            members = set(stage)
            for run in self.runs:
                inside = tuple(i for i in run if i in members)
                if inside:
                    groups.setdefault(inside)
        return list(groups)

    def _stage_splits(self, strategy: Strategy, group: tuple[int, ...]) -> list[dict]:
        """The changes that give every member of ``group`` the same ``dp x mp`` split of
        its stage's servers, one per ``mp`` some member accepts."""
        servers = strategy.configs[group[0]].servers
        k = len(servers)
        mps = sorted({c.mp for i in group for c in self.space.configs[i] if c.servers == servers})
        return [{i: OpConfig(servers, k // m, m) for i in group} for m in mps if k % m == 0]

    def _stage(self, strategy, memory, rng):
        groups = self._stage_groups(strategy)
        group = groups[int(rng.integers(len(groups)))]
        splits = self._stage_splits(strategy, group)
        if not splits:
            return None
        return self._fit(strategy, memory, splits[int(rng.integers(len(splits)))])

    # -- the deterministic neighbourhood (descent) -----------------------------------
    def neighbourhood(self, strategy: Strategy, memory: np.ndarray):
        """Every small structured change of ``strategy``, in a fixed order: each stage
        boundary of the body moved by one operator either way, all of them at once, each
        run of identical operators given one member's config of each shape or shifted a
        block either way, each stage (and each run's members in it) split ``dp x mp``
        every other way on its servers, each stage moved whole onto every other
        aligned block of ``n/16 .. n/2`` servers, every structured table layout with the
        body kept, every table split over one such block, and each operator taking an
        adjacent operator's config. Yields ``(candidate,
        memory)``."""
        configs = strategy.configs
        body = self.body
        bounds = [(a, b) for a, b in zip(body, body[1:]) if configs[a] != configs[b]]
        emit = self._unseen(strategy, memory)
        for step in (1, -1):
            every = {}
            for a, b in bounds:
                change = {b: configs[a]} if step > 0 else {a: configs[b]}
                every.update(change)
                out = emit(change)
                if out is not None:
                    yield out
            if len(bounds) > 1:
                out = emit(every)
                if out is not None:
                    yield out
        for run in self.runs:
            # one member's config of each shape (the tables' 64 blocks of two are one
            # shape: the blocks below try the others)
            shapes: dict[tuple[int, int, int], OpConfig] = {}
            for i in run:
                c = configs[i]
                shapes.setdefault((len(c.servers), c.dp, c.mp), c)
            for cfg in shapes.values():
                out = emit({i: cfg for i in run})
                if out is not None:
                    yield out
            for step in (1, -1):
                out = emit(self._shifted(strategy, run, step))
                if out is not None:
                    yield out
        for group in self._stage_groups(strategy):
            for changes in self._stage_splits(strategy, group):
                out = emit(changes)
                if out is not None:
                    yield out
        # every stage moved whole onto another aligned block of n/16 .. n/2 servers (each
        # member keeping its mp where the block allows): on a fabric where some blocks
        # are better connected than others (an Expander) the stage's traffic is best
        # kept on one of those
        for stage in self._stages(strategy):
            for block in self.blocks:
                out = emit({i: _on_block(configs[i], block) for i in stage})
                if out is not None:
                    yield out
        # every table layout under the current body (a layout move, made deterministic)
        for tables in dict.fromkeys(tuple(lay.strategy.configs[i] for i in self.tables)
                                    for lay in self.layouts):
            out = emit(dict(zip(self.tables, tables)))
            if out is not None:
                yield out
        # every table split over one aligned block of n/16 .. n/2 servers: on a shard
        # whose links suit one block the tables' all-to-all is best kept there
        if self.tables:
            for block in self.blocks:
                out = emit(dict.fromkeys(self.tables, OpConfig(block, 1, len(block))))
                if out is not None:
                    yield out
        # last, the most numerous: each operator taking an adjacent operator's config (a
        # descent cut short by its limit has tried the structured changes above)
        for i in self.space.movable:
            for j in self.neighbours[i]:
                out = emit({i: configs[j]})
                if out is not None:
                    yield out

    def end_splits(self, strategy: Strategy, memory: np.ndarray):
        """The changes a search tries once its descent has ended (a polish), each alone.

        - The first and the last operator of each stage split ``dp x mp`` every other
          way on its servers: the layer at a pipeline cut, tensor-split, evens out the
          two stages.
        - The first and last 1, 2, 4, ... operators of the body (up to its whole first
          or last stage) data parallel on every server: the loss and the layers before
          it are cheap to replicate everywhere, and no boundary move reaches that config
          from a body on one block.
        - Each table in no run given the config each table layout gives it: table
          layouts move every table at once, and tables of different sizes (BERT's word,
          position and token-type embeddings) form no run.
        - Each member of a run whose members differ in shape given each shape (servers,
          dp, mp) of the run, on the aligned block that holds its first server: the
          run's members tuned one by one.

        None of these is in :meth:`neighbourhood`: the descent's greedy path changes
        with every candidate it may take, and with these in it the seeds ended further
        apart, so a search tries them once its descent has ended. Yields ``(candidate,
        memory)``."""
        emit = self._unseen(strategy, memory)
        n = self.space.servers
        stages = self._stages(strategy)
        for stage in stages:
            for i in dict.fromkeys((stage[0], stage[-1])):
                for changes in self._stage_splits(strategy, (i,)):
                    out = emit(changes)
                    if out is not None:
                        yield out
        if stages:
            everyone = OpConfig(tuple(range(n)), n, 1)
            for stage, tail in ((stages[0], False), (stages[-1], True)):
                for k in _doubling(len(stage)):
                    out = emit(dict.fromkeys(stage[-k:] if tail else stage[:k], everyone))
                    if out is not None:
                        yield out
        for i in self.lone_tables:
            for cfg in dict.fromkeys(lay.strategy.configs[i] for lay in self.layouts):
                out = emit({i: cfg})
                if out is not None:
                    yield out
        # each member of a run given alone each shape (servers, dp, mp) its run uses,
        # on the aligned block that holds its first server (a run of one shape: none)
        for run in self.runs:
            shapes = dict.fromkeys((len(c.servers), c.dp, c.mp) for c in
                                   (strategy.configs[i] for i in run))
            if len(shapes) < 2:
                continue
            for i in run:
                first = strategy.configs[i].servers[0]
                for k, dp, mp in shapes:
                    start = first // k * k
                    if start + k <= n:
                        out = emit({i: OpConfig(tuple(range(start, start + k)), dp, mp)})
                        if out is not None:
                            yield out

    def _layout(self, strategy, memory, rng):
        layout = self.layouts[int(rng.integers(len(self.layouts)))]
        part = self.tables if (self.tables and rng.random() < 0.5) else self.body
        return self._fit(strategy, memory, {i: layout.strategy.configs[i] for i in part})


def _on_block(cfg: OpConfig, block: tuple[int, ...]) -> OpConfig:
    """``cfg`` moved onto ``block``: its ``mp`` kept if it divides the block, else data
    parallel over it."""
    k = len(block)
    mp = cfg.mp if k % cfg.mp == 0 else 1
    return OpConfig(block, k // mp, mp)


def _doubling(length: int) -> list[int]:
    """1, 2, 4, ... below ``length``, then ``length``."""
    out, k = [], 1
    while k < length:
        out.append(k)
        k *= 2
    return out + [length]


def _aligned_blocks(n: int) -> tuple[tuple[int, ...], ...]:
    """The aligned blocks of ``n/16 .. n/2`` servers (at least one server each),
    smallest first: where the descent tries a stage or all the tables."""
    blocks = []
    k = max(1, n // 16)
    while k < n:
        blocks += [tuple(range(first, first + k)) for first in range(0, n, k)]
        k *= 2
    return tuple(blocks)
