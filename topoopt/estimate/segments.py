"""Fused segments of a strategy (chains of operators run as one task per server) and the
per-operator pieces the estimator memoizes across strategies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from topoopt.cluster import Cluster, Job
from topoopt.compute import op_time
from topoopt.model import Model, Operator
from topoopt.strategy import OpConfig, Strategy
from topoopt.traffic import edge_transfers

__all__ = ["Segment", "EstimateCache", "fuse_operators", "update_time"]


@dataclass(frozen=True)
class Segment:
    """A chain of consecutive operators with one parallel config, run as one task
    per server (fused: no MP between them, and only the chain ends talk outside).

    Attributes
    ----------
    ops : tuple of int
        Operator indices, in order.
    config : OpConfig
    fwd, bwd : float
        Seconds per server (sum over the chain).
    update : float
        Seconds per server of the weight update (0 when nothing is updated densely).
    params : int
        Parameters of the chain (elements).
    """

    ops: tuple[int, ...]
    config: OpConfig
    fwd: float
    bwd: float
    update: float
    params: int


#: (source servers, destination servers, bytes per unit of scale) per transfer.
_Pattern = tuple[np.ndarray, np.ndarray, np.ndarray]


class _OpCost(NamedTuple):
    """An operator's seconds per server under one config: (forward, backward), update."""

    times: tuple[float, float]
    update: float


class EstimateCache:
    """Memo of the per-operator pieces that do not change when a strategy changes
    elsewhere: compute times keyed by (op, config), fused segments keyed by (operators,
    config) and MP transfer patterns keyed by (producer config, consumer config). One
    cache per (model, cluster, job)."""

    #: Entries kept per memo before it is cleared (bounds memory on long searches), and
    #: bytes of transfer patterns (each a few arrays per transfer: gigabytes at 1024
    #: servers before the count is reached).
    limit = 200_000
    pattern_bytes = 1 << 28

    def __init__(self, model: Model, cluster: Cluster, job: Job) -> None:
        self.key = (id(model), cluster, job)
        self.times: dict[tuple[int, OpConfig], _OpCost] = {}
        self.patterns: dict[tuple[OpConfig, OpConfig], _Pattern] = {}
        self._pattern_held = 0      # bytes of ``patterns``
        self.segments: dict[tuple[tuple[int, ...], int], Segment] = {}
        self.consumers = _consumers(model)
        #: Bytes of each operator's output for the global batch (what its edges carry).
        self.activation = np.array([op.out_elems for op in model.operators], float) * (
            job.global_batch(cluster) * job.dtype_bytes)
        # fusion: v may join the segment of ``chain[v]`` (its only input, whose only
        # consumer it is), -1 if not; inputs never fuse
        ops = model.operators
        pos = {op.name: i for i, op in enumerate(ops)}
        self.chain = [pos[op.inputs[0]] if (op.kind != "input" and len(op.inputs) == 1
                                            and self.consumers[pos[op.inputs[0]]] == [v])
                      else -1 for v, op in enumerate(ops)]
        self.is_input = [op.kind == "input" for op in ops]

    def _cost(self, model: Model, i: int, cfg: OpConfig, cluster: Cluster,
              job: Job) -> _OpCost:
        key = (i, cfg)
        hit = self.times.get(key)
        if hit is None:
            if len(self.times) >= self.limit:
                self.times.clear()
            op = model.operators[i]
            hit = self.times[key] = _OpCost(
                op_time(op, cfg, cluster, job.precision, job.dtype_bytes,
                        job.global_batch(cluster), job.attention),
                update_time(op, cfg, cluster, job))
        return hit

    def op_time(self, model: Model, i: int, cfg: OpConfig, cluster: Cluster,
                job: Job) -> tuple[float, float]:
        """(forward, backward) seconds per server of operator ``i`` under ``cfg``."""
        return self._cost(model, i, cfg, cluster, job).times

    def update_time(self, model: Model, i: int, cfg: OpConfig, cluster: Cluster,
                    job: Job) -> float:
        """Seconds per server of operator ``i``'s weight update under ``cfg``."""
        return self._cost(model, i, cfg, cluster, job).update

    def segment(self, model: Model, ops: tuple[int, ...], cfg: OpConfig, cluster: Cluster,
                job: Job) -> "Segment":
        """The :class:`Segment` of operators ``ops`` under ``cfg`` (memoized)."""
        # Keyed by the config's identity: every candidate's fusion asks for each of its
        # segments, and hashing a config hashes its server tuple (2 us at 128 servers
        # against 0.3 for an id). The entry keeps its config alive, so the id is not
        # reused; a config built anew only misses (its segment is rebuilt, equal).
        key = (ops, id(cfg))
        hit = self.segments.get(key)
        if hit is None or hit.config is not cfg:
            if len(self.segments) >= self.limit:
                self.segments.clear()
            fwd = bwd = upd = 0.0
            params = 0
            for i in ops:
                cost = self._cost(model, i, cfg, cluster, job)
                f, b = cost.times
                fwd += f
                bwd += b
                upd += cost.update
                params += model.operators[i].params
            hit = self.segments[key] = Segment(ops, cfg, float(fwd), float(bwd), float(upd),
                                               int(params))
        return hit

    def pattern(self, cu: OpConfig, cv: OpConfig) -> _Pattern:
        """:func:`~topoopt.traffic.edge_transfers` of one (producer, consumer) config
        pair with the batch overlaps as sizes: every edge between the two configs
        scales it (many edges share few config pairs)."""
        key = (cu, cv)
        hit = self.patterns.get(key)
        if hit is None:
            if len(self.patterns) >= self.limit or self._pattern_held > self.pattern_bytes:
                self.patterns.clear()
                self._pattern_held = 0
            hit = self.patterns[key] = edge_transfers(cu, cv, float(cu.mp))
            self._pattern_held += sum(a.nbytes for a in hit)
        return hit


def _consumers(model: Model) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in model.operators]
    for u, v in model.edges:
        out[u].append(v)
    return out


def update_time(op: Operator, cfg: OpConfig, cluster: Cluster, job: Job) -> float:
    """SGD update: read weights and gradients, write weights, over HBM. Embedding
    shards that are not replicated are updated sparsely inside their backward."""
    if op.params == 0 or (op.kind == "embedding" and cfg.dp == 1):
        return 0.0
    rate = cluster.gpu.hbm_bandwidth / 8 * cluster.gpus_per_server * cluster.memory_efficiency
    return 3.0 * op.params / cfg.mp * job.dtype_bytes / rate


def fuse_operators(model: Model, strategy: Strategy, cluster: Cluster, job: Job,
                   cache: EstimateCache | None = None
                   ) -> tuple[tuple[Segment, ...], np.ndarray]:
    """Group the operators into fused segments.

    Operator ``v`` joins the segment of the operator ``u`` before it when ``v``'s
    only input is ``u``, ``u``'s only consumer is ``v``, both have the same config
    and that config has ``mp = 1`` (so no transfer between them). Operators of kind
    ``input`` (data loaders) get no segment.

    Returns
    -------
    segments : tuple of Segment
        In topological order.
    segment_of : ndarray of int, shape (operators,)
        Segment index per operator (-1 for inputs).
    """
    cache = cache or EstimateCache(model, cluster, job)
    cfgs = strategy.configs
    chain, is_input = cache.chain, cache.is_input
    seg_of = np.full(len(cfgs), -1, np.int64)
    groups: list[list[int]] = []
    for v in range(len(cfgs)):
        if is_input[v]:
            continue
        u = chain[v]
        if groups and u == groups[-1][-1] and cfgs[v].mp == 1 and \
                (cfgs[u] is cfgs[v] or cfgs[u] == cfgs[v]):
            groups[-1].append(v)
        else:
            groups.append([v])
        seg_of[v] = len(groups) - 1
    segments = tuple(cache.segment(model, tuple(g), cfgs[g[0]], cluster, job) for g in groups)
    return segments, seg_of
