"""Parallelization strategies at server granularity (FlexFlow-style parallel configs)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Mapping, Sequence

from topoopt.errors import ConfigError
from topoopt.model import Model

__all__ = ["OpConfig", "Strategy", "data_parallel", "hybrid", "check_strategy",
           "memory_per_server", "describe_strategy"]


@dataclass(frozen=True)
class OpConfig:
    """How one operator is partitioned over servers.

    The operator's work is a ``dp x mp`` grid: the batch (sample dimension) is split
    in ``dp`` equal parts and the parameters (output features) in ``mp`` parts. Cell
    ``(a, b)`` runs on ``servers[a * mp + b]``.

    Attributes
    ----------
    servers : tuple of int
        Distinct server ids, ``len(servers) == dp * mp``.
    dp : int
        Data-parallel degree (replicas of each parameter shard).
    mp : int
        Model-parallel degree (parameter shards).
    """

    servers: tuple[int, ...]
    dp: int
    mp: int = 1

    def server(self, a: int, b: int) -> int:
        """Server of cell ``(a, b)``."""
        return self.servers[a * self.mp + b]

    def replicas(self, b: int) -> tuple[int, ...]:
        """Servers holding parameter shard ``b`` (one AllReduce group)."""
        return tuple(self.servers[a * self.mp + b] for a in range(self.dp))


@dataclass(frozen=True)
class Strategy:
    """A parallel config per operator, aligned with ``model.operators``.

    Attributes
    ----------
    configs : tuple of OpConfig
    name : str
        A label for reports (``"dp"``, ``"hybrid"``, ``"mcmc"``).
    """

    configs: tuple[OpConfig, ...]
    name: str = ""

    def __len__(self) -> int:
        return len(self.configs)

    def __getitem__(self, i: int) -> OpConfig:
        return self.configs[i]

    def with_config(self, i: int, config: OpConfig, name: str | None = None) -> "Strategy":
        """A copy with operator ``i`` re-configured."""
        configs = self.configs[:i] + (config,) + self.configs[i + 1:]
        return Strategy(configs, self.name if name is None else name)

    def to_json(self, model: Model) -> list[dict]:
        """One ``{"op", "servers", "dp", "mp"}`` record per operator."""
        return [{"op": op.name, "servers": list(c.servers), "dp": c.dp, "mp": c.mp}
                for op, c in zip(model.operators, self.configs)]


def data_parallel(model: Model, servers: int) -> Strategy:
    """Every operator replicated on all ``servers``, batch split evenly (pure DP)."""
    everyone = OpConfig(tuple(range(servers)), dp=servers, mp=1)
    return Strategy(tuple(everyone for _ in model.operators), name="dp")


def hybrid(model: Model, servers: int, placement: Mapping[str, int] | None = None) -> Strategy:
    """DLRM's hybrid strategy (TopoOpt §2): embedding tables model-parallel, rest DP.

    Parameters
    ----------
    model : Model
    servers : int
    placement : mapping of str to int, optional
        Embedding operator name -> server. By default the ``T`` tables are spread
        evenly: table ``i`` on server ``floor(i * servers / T)``.

    Returns
    -------
    Strategy
    """
    tables = [op.name for op in model.operators if op.kind == "embedding"]
    placement = dict(placement or {})
    for i, name in enumerate(tables):
        placement.setdefault(name, (i * servers) // len(tables))
    base = data_parallel(model, servers).configs
    configs = tuple(
        OpConfig((placement[op.name],), dp=1, mp=1) if op.name in placement else base[i]
        for i, op in enumerate(model.operators))
    return Strategy(configs, name="hybrid")


def memory_per_server(model: Model, strategy: Strategy, servers: int, dtype_bytes: int,
                      global_batch: int) -> list[float]:
    """Bytes each server holds: weights (+ gradients for dense ops) and activations.

    Embedding tables are updated sparsely (SGD), so no gradient buffer is counted for
    them; dense parameters hold weights and gradients. Activations of every operator
    are kept for the backward pass.
    """
    mem = [0.0] * servers
    for op, cfg in zip(model.operators, strategy.configs):
        state = 1 if op.kind == "embedding" else 2
        per_server = (op.params / cfg.mp * state
                      + op.out_elems * global_batch / cfg.dp / cfg.mp) * dtype_bytes
        for s in cfg.servers:
            mem[s] += per_server
    return mem


def check_strategy(model: Model, strategy: Strategy, servers: int, global_batch: int | None = None,
                   memory_limit: float | None = None, dtype_bytes: int = 4) -> None:
    """Raise :class:`ConfigError` unless ``strategy`` is a valid strategy for ``model``.

    Checks: one config per operator; server ids in range and distinct; ``dp * mp``
    servers; ``dp`` divides the global batch; ``mp > 1`` only for splittable operators
    with at least ``mp`` parameters; and, with ``memory_limit``, that every server's
    :func:`memory_per_server` fits.
    """
    if len(strategy.configs) != len(model.operators):
        raise ConfigError("strategy", len(strategy.configs),
                          f"needs one config per operator ({len(model.operators)})")
    for op, cfg in zip(model.operators, strategy.configs):
        where = f"strategy[{op.name}]"
        if cfg.dp < 1 or cfg.mp < 1 or len(cfg.servers) != cfg.dp * cfg.mp:
            raise ConfigError(f"{where}.servers", list(cfg.servers),
                              f"needs dp*mp = {cfg.dp}*{cfg.mp} distinct servers")
        if len(set(cfg.servers)) != len(cfg.servers):
            raise ConfigError(f"{where}.servers", list(cfg.servers), "servers must be distinct")
        if any(not 0 <= s < servers for s in cfg.servers):
            raise ConfigError(f"{where}.servers", list(cfg.servers),
                              f"server ids must be in 0..{servers - 1}")
        if global_batch is not None and global_batch % cfg.dp:
            raise ConfigError(f"{where}.dp", cfg.dp,
                              f"must divide the global batch {global_batch}")
        if cfg.mp > 1 and (not op.splittable or op.params < cfg.mp):
            raise ConfigError(f"{where}.mp", cfg.mp,
                              f"a {op.kind} operator cannot be split across servers")
    if memory_limit is not None and global_batch is not None:
        mem = memory_per_server(model, strategy, servers, dtype_bytes, global_batch)
        worst = max(range(servers), key=mem.__getitem__)
        if mem[worst] > memory_limit:
            raise ConfigError("strategy", strategy.name or "given",
                              f"server {worst} needs {mem[worst] / 1e9:.1f} GB but has "
                              f"{memory_limit / 1e9:.1f} GB; spread the parameters wider")


def servers_used(strategy: Strategy) -> Sequence[int]:
    """Sorted server ids that run at least one operator."""
    return sorted({s for c in strategy.configs for s in c.servers})


def describe_strategy(model: Model, strategy: Strategy, servers: int) -> list[str]:
    """A short description of ``strategy``: consecutive operators of one kind whose
    configs have one shape (block size, ``dp``, ``mp``) are one line, with where they
    run: ``all servers``, one block, each block's operators when up to three blocks
    hold consecutive runs of them (a pipeline's stages), else how many blocks.

    Examples
    --------
    >>> from topoopt.workloads import build_model
    >>> m = build_model("dlrm", {"tables": 4, "rows": 100, "bottom_layers": 2})
    >>> describe_strategy(m, hybrid(m, 4), 4)[0]
    'emb0..emb3 (4 embedding): 4 blocks of 1 server, dp1'
    >>> two = OpConfig((0, 1), 2, 1), OpConfig((2, 3), 2, 1)
    >>> s = Strategy(tuple(two[0] if op.name in ("bottom0", "top0") else two[1]
    ...                    if op.kind == "dense" else c
    ...                    for op, c in zip(m.operators, hybrid(m, 4).configs)))
    >>> describe_strategy(m, s, 4)[1]
    'bottom0..bottom1 (2 dense): bottom0 on servers 0-1, bottom1 on servers 2-3, dp2'
    """
    out: list[list] = []
    for op, cfg in zip(model.operators, strategy.configs):
        if op.kind == "input":
            continue
        shape = (op.kind, len(cfg.servers), cfg.dp, cfg.mp)
        if out and out[-1][0] == shape:
            out[-1][1].append((op.name, cfg.servers))
        else:
            out.append([shape, [(op.name, cfg.servers)]])
    lines = []
    for (kind, k, dp, mp), members in out:
        names = [name for name, _ in members]
        blocks = {b for _, b in members}
        span = _span(names)
        # runs of consecutive operators on one block
        runs = [(b, [name for name, _ in g]) for b, g in groupby(members, key=itemgetter(1))]
        if k == servers:
            where = "all servers"
        elif len(blocks) == 1:
            where = _block(members[0][1])
        elif len(runs) == len(blocks) <= 3 and all(_consecutive(b) for b in blocks):
            where = ", ".join(f"{_span(ns)} on {_block(b)}" for b, ns in runs)
        else:
            where = f"{len(blocks)} blocks of {k} server{'s' if k > 1 else ''}"
        par = f"dp{dp}" + (f" x mp{mp}" if mp > 1 else "")
        lines.append(f"{span} ({len(names)} {kind}): {where}, {par}")
    return lines


def _span(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


def _block(servers: Sequence[int]) -> str:
    """``servers a-b`` (first and last id) or ``server a``."""
    return f"servers {servers[0]}-{servers[-1]}" if len(servers) > 1 else f"server {servers[0]}"


def _consecutive(servers: Sequence[int]) -> bool:
    return list(servers) == list(range(servers[0], servers[0] + len(servers)))
