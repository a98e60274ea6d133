"""The strategy space: valid parallel configs per operator at server granularity (FlexFlow §4)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from topoopt.cluster import Cluster, Job
from topoopt.model import Model, Operator
from topoopt.strategy import OpConfig, Strategy, memory_per_server

__all__ = ["StrategySpace", "op_configs", "divisors"]


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small = [k for k in range(1, int(n ** 0.5) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def op_configs(op: Operator, servers: int, global_batch: int, max_mp: int | None = None
               ) -> tuple[OpConfig, ...]:
    """Every parallel config the search may give ``op``.

    A config runs on an aligned block of ``k`` servers (``k`` divides ``servers``, the
    block starts at a multiple of ``k``), as ``dp x mp = k`` with ``dp`` dividing the
    global batch. ``mp > 1`` only for splittable operators (dense, attention, conv,
    embedding), up to ``max_mp``. Input operators stay data parallel on every server:
    each server's loader reads its own samples.

    Parameters
    ----------
    op : workloads.Operator
    servers : int
    global_batch : int
    max_mp : int, optional
        Largest model-parallel degree (default: no limit beyond the block size).

    Returns
    -------
    tuple of OpConfig
        Deterministic order: by block size, offset, then mp.

    Examples
    --------
    >>> from topoopt.workloads.layers import dense
    >>> len(op_configs(dense("fc", 8, 8, ()), 4, 16))  # k=1: 4, k=2: 2x2, k=4: 1x3
    11
    """
    everyone = OpConfig(tuple(range(servers)), dp=servers, mp=1)
    if op.kind == "input":
        return (everyone,)
    out = []
    for k in divisors(servers):
        for start in range(0, servers, k):
            block = tuple(range(start, start + k))
            for mp in divisors(k):
                dp = k // mp
                if global_batch % dp:
                    continue
                if mp > 1 and (not op.splittable or op.params < mp
                               or (max_mp is not None and mp > max_mp)):
                    continue
                out.append(OpConfig(block, dp=dp, mp=mp))
    return tuple(out)


@dataclass(frozen=True)
class StrategySpace:
    """All valid strategies of a model on a cluster, and random moves between them.

    Attributes
    ----------
    model : workloads.Model
    servers : int
    global_batch : int
    dtype_bytes : int
    memory_limit : float
        Bytes per server (GPUs x HBM); strategies above it are invalid.
    configs : tuple of tuple of OpConfig
        Candidate configs per operator.
    """

    model: Model
    servers: int
    global_batch: int
    dtype_bytes: int
    memory_limit: float
    configs: tuple[tuple[OpConfig, ...], ...]

    @classmethod
    def build(cls, model: Model, cluster: Cluster, job: Job,
              max_mp: int | None = None) -> StrategySpace:
        """The space of ``model`` on ``cluster`` for ``job`` (batch, precision)."""
        batch = job.global_batch(cluster)
        # one instance per distinct config across operators: the estimator's memos key
        # edges by their two configs' identities, and a run of layers shares them
        pool: dict[OpConfig, OpConfig] = {}
        configs = tuple(tuple(pool.setdefault(c, c)
                              for c in op_configs(op, cluster.servers, batch, max_mp))
                        for op in model.operators)
        return cls(model, cluster.servers, batch, job.dtype_bytes,
                   cluster.gpus_per_server * cluster.gpu.memory, configs)

    @cached_property
    def canonical(self) -> tuple[dict, ...]:
        """Per operator, each candidate config to the space's own instance of it: the
        estimator's memos are keyed by config identity, so a move that builds an equal
        config anew would miss them."""
        return tuple({c: c for c in cands} for cands in self.configs)

    def canonical_strategy(self, strategy: Strategy) -> Strategy:
        """``strategy`` with the space's own instance of every config it has (a start
        built elsewhere, or sent from another process: the estimator's memos would miss
        its configs until moves replaced them)."""
        configs = tuple(cands.get(c, c) for c, cands in zip(strategy.configs, self.canonical))
        if all(a is b for a, b in zip(configs, strategy.configs)):
            return strategy
        return replace(strategy, configs=configs)

    @cached_property
    def movable(self) -> tuple[int, ...]:
        """Operators with more than one candidate config."""
        return tuple(i for i, c in enumerate(self.configs) if len(c) > 1)

    def size_log10(self) -> float:
        """log10 of the number of strategies (before the memory check)."""
        return float(sum(np.log10(len(c)) for c in self.configs))

    def memory(self, strategy: Strategy) -> np.ndarray:
        """Bytes per server of ``strategy`` (:func:`topoopt.strategy.memory_per_server`)."""
        return np.array(memory_per_server(self.model, strategy, self.servers,
                                          self.dtype_bytes, self.global_batch))

    def fits(self, strategy: Strategy) -> bool:
        """Whether every server's memory holds its share of ``strategy``."""
        return float(self.memory(strategy).max()) <= self.memory_limit

    def _op_memory(self, i: int, cfg: OpConfig) -> float:
        op = self.model.operators[i]
        state = 1 if op.kind == "embedding" else 2
        return (op.params / cfg.mp * state
                + op.out_elems * self.global_batch / cfg.dp / cfg.mp) * self.dtype_bytes

    @cached_property
    def _server_indices(self) -> dict[tuple[int, ...], np.ndarray]:
        return {}

    def _index(self, servers: tuple[int, ...]) -> np.ndarray:
        """``servers`` as an index array, made once per server set (a move of a run of
        layers on 128 servers indexes the same sets dozens of times)."""
        idx = self._server_indices.get(servers)
        if idx is None:
            idx = self._server_indices[servers] = np.array(servers, dtype=np.intp)
        return idx

    def moved_memory(self, memory: np.ndarray, i: int, old: OpConfig, new: OpConfig,
                     copy: bool = True) -> np.ndarray:
        """Per-server bytes after operator ``i`` moves from ``old`` to ``new`` (in place
        in ``memory`` if not ``copy``)."""
        out = memory.copy() if copy else memory
        out[self._index(old.servers)] -= self._op_memory(i, old)
        out[self._index(new.servers)] += self._op_memory(i, new)
        return out

    def contains(self, strategy: Strategy) -> bool:
        """Whether ``strategy`` is made of candidate configs and fits in memory."""
        return (len(strategy) == len(self.configs)
                and all(c in cands for c, cands in zip(strategy.configs, self.canonical))
                and self.fits(strategy))

    def propose(self, strategy: Strategy, memory: np.ndarray, rng: np.random.Generator,
                tries: int = 32) -> tuple[int, OpConfig, np.ndarray] | None:
        """A random move: one operator, a different candidate config that still fits.

        Parameters
        ----------
        strategy : Strategy
            The current state.
        memory : ndarray
            Its bytes per server (:meth:`memory`), updated incrementally by the caller.
        rng : numpy Generator

        Returns
        -------
        (operator index, new config, new memory) or None
            ``None`` when ``tries`` proposals all failed the memory check.
        """
        movable = self.movable
        if not movable:
            return None
        for _ in range(tries):
            i = movable[int(rng.integers(len(movable)))]
            cands = self.configs[i]
            cfg = cands[int(rng.integers(len(cands)))]
            if cfg == strategy.configs[i]:
                continue
            moved = self.moved_memory(memory, i, strategy.configs[i], cfg)
            if float(moved.max()) <= self.memory_limit:
                return i, cfg, moved
        return None
