"""Per-iteration traffic of a strategy: AllReduce groups and the MP transfer matrix (TopoOpt §2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from topoopt.model import Model
from topoopt.strategy import OpConfig, Strategy

__all__ = ["AllReduceGroup", "Transfers", "Traffic", "derive_traffic", "edge_transfers",
           "allreduce_groups", "ring_matrix", "check_traffic"]


@dataclass(frozen=True)
class AllReduceGroup:
    """Servers that hold replicas of the same parameters and all-reduce their gradients.

    Attributes
    ----------
    members : tuple of int
        Sorted server ids (at least 2).
    bytes : float
        S, the gradient bytes each member contributes (sum over the group's operators).
    ops : tuple of str
        Operators whose gradients are reduced in this group.
    """

    members: tuple[int, ...]
    bytes: float
    ops: tuple[str, ...] = ()

    @property
    def ring_bytes_per_pair(self) -> float:
        """Bytes each ring neighbour pair carries: 2(g-1)/g x S."""
        g = len(self.members)
        return 2.0 * (g - 1) / g * self.bytes

    @property
    def network_bytes(self) -> float:
        """Bytes all members send in a ring AllReduce: 2(g-1) x S."""
        return 2.0 * (len(self.members) - 1) * self.bytes


@dataclass(frozen=True)
class Transfers:
    """MP transfers of one iteration as parallel arrays.

    ``edge[i]`` indexes ``model.edges`` and ``phase[i]`` is 0 for the forward
    activation, 1 for the backward gradient (which flows the opposite way).
    """

    src: np.ndarray
    dst: np.ndarray
    bytes: np.ndarray
    edge: np.ndarray
    phase: np.ndarray

    def __len__(self) -> int:
        return int(self.src.size)


@dataclass(frozen=True)
class Traffic:
    """What a strategy sends over the network in one iteration.

    Attributes
    ----------
    servers : int
    allreduce : tuple of AllReduceGroup
    mp : ndarray, shape (servers, servers)
        MP bytes from row server to column server (forward + backward); zero diagonal.
    records : Transfers or callable
        The same MP bytes, one record per (edge, phase, src, dst) (:attr:`transfers`),
        or what lists them when first asked for: a strategy that splits every tensor
        over all servers has about ``n^3 / 4`` of them, which only a check reads.
    """

    servers: int
    allreduce: tuple[AllReduceGroup, ...]
    mp: np.ndarray = field(repr=False)
    records: Transfers | Callable[[], Transfers] = field(repr=False, compare=False)

    @property
    def transfers(self) -> Transfers:
        """The MP bytes, one record per (edge, phase, src, dst), listed once asked for."""
        if callable(self.records):
            object.__setattr__(self, "records", self.records())
        assert isinstance(self.records, Transfers)
        return self.records

    @property
    def allreduce_bytes(self) -> float:
        """Total bytes sent by ring AllReduce over all groups."""
        return sum(g.network_bytes for g in self.allreduce)

    @property
    def mp_bytes(self) -> float:
        """Total MP bytes."""
        return float(self.mp.sum())

    def matrix(self, rings: Mapping[tuple[int, ...], Sequence[tuple[int, ...]]] | None = None
               ) -> np.ndarray:
        """Server-to-server bytes: MP plus AllReduce as rings.

        ``rings`` maps a group's members to the ring orders it uses (bytes split
        evenly across them); by default each group runs one ring in member order.
        """
        total = self.mp.copy()
        for g in self.allreduce:
            orders = (rings or {}).get(g.members, [g.members])
            for order in orders:
                total += ring_matrix(order, g.ring_bytes_per_pair / len(orders), self.servers)
        return total


def ring_matrix(order, pair_bytes: float, servers: int) -> np.ndarray:
    """``servers x servers`` matrix with ``pair_bytes`` on each ring edge ``order[i] -> order[i+1]``."""
    m = np.zeros((servers, servers))
    order = np.asarray(order)
    if order.size > 1:
        np.add.at(m, (order, np.roll(order, -1)), pair_bytes)
    return m


def _overlap(p: int, q: int) -> np.ndarray:
    """Fraction of the batch shared by sample part ``a`` of ``p`` and ``a'`` of ``q``."""
    a = np.arange(p)[:, None]
    b = np.arange(q)[None, :]
    lo = np.maximum(a / p, b / q)
    hi = np.minimum((a + 1) / p, (b + 1) / q)
    return np.clip(hi - lo, 0.0, None)


def edge_transfers(producer: OpConfig, consumer: OpConfig, tensor_bytes: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward transfers of one activation tensor from ``producer`` to ``consumer``.

    Parameters
    ----------
    producer, consumer : OpConfig
    tensor_bytes : float
        The whole activation for the global batch (out elements x batch x dtype).

    Returns
    -------
    src, dst, nbytes : ndarray
        One entry per server pair with a positive transfer; ``src != dst``.

    Notes
    -----
    Producer cell ``(a, b)`` holds sample part ``a`` of feature shard ``b``. Every
    consumer cell needs all features of its own samples (column-parallel input), so
    it receives ``overlap(a, a') / mp_producer`` of the tensor from each producer cell.
    """
    if producer == consumer and producer.mp == 1:
        return (np.empty(0, np.int64),) * 2 + (np.empty(0),)
    share = _overlap(producer.dp, consumer.dp) * (tensor_bytes / producer.mp)
    # Expand sample parts to cells: rows (a, b) and columns (a', b').
    cells = np.repeat(np.repeat(share, producer.mp, axis=0), consumer.mp, axis=1)
    src = np.asarray(producer.servers)[:, None]
    dst = np.asarray(consumer.servers)[None, :]
    keep = (cells > 0) & (src != dst)
    rows, cols = np.nonzero(keep)
    return (np.asarray(producer.servers)[rows], np.asarray(consumer.servers)[cols],
            cells[rows, cols])


def allreduce_groups(model: Model, strategy: Strategy, dtype_bytes: int) -> tuple[AllReduceGroup, ...]:
    """AllReduce groups of a strategy, merged by member set, sorted by size then members."""
    merged: dict[tuple[int, ...], list] = {}
    for op, cfg in zip(model.operators, strategy.configs):
        if op.params == 0 or cfg.dp < 2:
            continue
        shard_bytes = op.params / cfg.mp * dtype_bytes
        for b in range(cfg.mp):
            members = tuple(sorted(cfg.replicas(b)))
            entry = merged.setdefault(members, [0.0, []])
            entry[0] += shard_bytes
            entry[1].append(op.name)
    groups = [AllReduceGroup(m, nbytes, tuple(ops)) for m, (nbytes, ops) in merged.items()]
    return tuple(sorted(groups, key=lambda g: (-len(g.members), g.members)))


def derive_traffic(model: Model, strategy: Strategy, servers: int, global_batch: int,
                   dtype_bytes: int) -> Traffic:
    """AllReduce groups and MP transfers of one training iteration.

    Parameters
    ----------
    model : workloads.Model
    strategy : Strategy
    servers : int
    global_batch : int
        Samples per iteration.
    dtype_bytes : int
        Bytes per element.

    Returns
    -------
    Traffic

    Notes
    -----
    Operators of kind ``input`` create no traffic: each server's data loader reads the
    samples its operators need. The backward pass sends, for every forward transfer,
    the gradient of the same size the opposite way (TopoOpt §2, "MP transfers").

    Examples
    --------
    >>> from topoopt.workloads import build_model
    >>> from topoopt.strategy import data_parallel
    >>> m = build_model("ncf", {"tables": 2, "rows": 10, "top_layers": 1})
    >>> t = derive_traffic(m, data_parallel(m, 4), 4, 64, 4)
    >>> t.mp_bytes, len(t.allreduce)
    (0.0, 1)
    """
    flat = np.zeros(servers * servers)
    # one edge at a time, in the records' order: the same sums as over all records
    for _, s, d, nbytes in _edge_records(model, strategy, global_batch, dtype_bytes):
        np.add.at(flat, s * servers + d, nbytes)
        np.add.at(flat, d * servers + s, nbytes)
    return Traffic(servers, allreduce_groups(model, strategy, dtype_bytes),
                   flat.reshape(servers, servers),
                   partial(_transfer_records, model, strategy, global_batch, dtype_bytes))


def _edge_records(model: Model, strategy: Strategy, global_batch: int, dtype_bytes: int
                  ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """Per model edge with transfers: ``(edge, src, dst, bytes)`` of its forward pass
    (the backward pass sends the same the other way)."""
    for e, (u, v) in enumerate(model.edges):
        op_u = model.operators[u]
        if op_u.kind == "input":
            continue
        tensor = op_u.out_elems * global_batch * dtype_bytes
        s, d, nbytes = edge_transfers(strategy.configs[u], strategy.configs[v], tensor)
        if s.size:
            yield e, s, d, nbytes


def _transfer_records(model: Model, strategy: Strategy, global_batch: int,
                      dtype_bytes: int) -> Transfers:
    """:attr:`Traffic.transfers` of :func:`derive_traffic`: per edge its forward
    activations, then their gradients the other way."""
    srcs, dsts, sizes, edges, phases = [], [], [], [], []
    for e, s, d, nbytes in _edge_records(model, strategy, global_batch, dtype_bytes):
        srcs += [s, d]
        dsts += [d, s]
        sizes += [nbytes, nbytes]
        edges += [np.full(s.size, e), np.full(s.size, e)]
        phases += [np.zeros(s.size, np.int8), np.ones(s.size, np.int8)]
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.empty(0, dt))
    return Transfers(cat(srcs, np.int64), cat(dsts, np.int64), cat(sizes, float),
                     cat(edges, np.int64), cat(phases, np.int8))


def check_traffic(traffic: Traffic) -> None:
    """Raise ValueError unless the traffic is well formed.

    Zero diagonal, non-negative bytes, every AllReduce group of >= 2 distinct sorted
    members in range, and the MP matrix equal to the sum of the transfer records.
    """
    n = traffic.servers
    if traffic.mp.shape != (n, n) or np.any(traffic.mp < 0) or np.any(np.diag(traffic.mp)):
        raise ValueError("MP matrix must be n x n, non-negative, with a zero diagonal")
    for g in traffic.allreduce:
        if len(g.members) < 2 or list(g.members) != sorted(set(g.members)) \
                or not all(0 <= s < n for s in g.members) or g.bytes < 0:
            raise ValueError(f"bad AllReduce group {g.members}")
    check = np.zeros((n, n))
    np.add.at(check, (traffic.transfers.src, traffic.transfers.dst), traffic.transfers.bytes)
    if not np.allclose(check, traffic.mp):
        raise ValueError("MP matrix differs from its transfer records")
