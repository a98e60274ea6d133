"""Per-config pieces of a task graph, built once and placed in many graphs.

What a segment's config, or an MP edge's pair of configs, adds to a graph does not
depend on the rest of the strategy, apart from node offsets: a config's servers and
their positions (:class:`ConfigInfo`), an edge's transfers and shared servers
(:class:`PairTemplate`), a config's AllReduce rings and dependencies
(:class:`AllReduceTemplate`). :class:`ConfigTable` numbers the configs by value so that
the builder's caches can be keyed by small ints.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from topoopt.errors import ConfigError
from topoopt.estimate.routes import RingRoute
from topoopt.estimate.segments import Segment
from topoopt.strategy import OpConfig
from topoopt.topology.topology import check_ring

__all__ = ["ConfigInfo", "ConfigTable", "Fused", "PairTemplate", "AllReduceTemplate",
           "PackedAllReduce", "allreduce_template", "BWD", "UPD", "RING", "BAR", "GLOBAL",
           "FWD_KEY", "BWD_KEY", "SRC_POS", "DST_POS"]

Rings = Mapping[tuple[int, ...], Sequence[Sequence[int]]]

#: Node kinds of an AllReduce dependency template: a member's backward or update task,
#: a ring, a barrier of the template, the global barrier (``overlap=False``).
BWD, UPD, RING, BAR, GLOBAL = range(5)
#: Rows of :attr:`PairTemplate.ints`.
FWD_KEY, BWD_KEY, SRC_POS, DST_POS = range(4)


class ConfigInfo(NamedTuple):
    """A config as a graph uses it.

    Attributes
    ----------
    config : OpConfig
    servers : ndarray of int
        Its servers, in cell order.
    position : ndarray of int, shape (n,)
        Each server's position in ``servers``, -1 where unused.
    token : int
        A number per distinct config (equal configs built apart get the same).
    """

    config: OpConfig
    servers: np.ndarray
    position: np.ndarray
    token: int


class Fused(NamedTuple):
    """A strategy's fused segments (:func:`~topoopt.estimate.segments.fuse_operators`)
    with their configs' :class:`ConfigInfo`."""

    segments: tuple[Segment, ...]
    segment_of: np.ndarray
    info: list[ConfigInfo]


class ConfigTable:
    """:class:`ConfigInfo` of every config seen, for a cluster of ``n`` servers."""

    def __init__(self, n: int) -> None:
        self.n = n
        # Keyed by identity, a front to the value table: hashing a config hashes its
        # server tuple (2 us at 128 servers, against 0.3 for an id) and this runs per
        # segment per graph. The entry keeps its config alive, so the id is not reused;
        # a config built anew misses here only and gets the token of its equal.
        self._by_id: dict[int, ConfigInfo] = {}
        self._tokens: dict[OpConfig, int] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def clear(self) -> None:
        """Forget every config (tokens are numbered afresh: drop what they key)."""
        self._by_id.clear()
        self._tokens.clear()

    def info(self, cfg: OpConfig) -> ConfigInfo:
        """The :class:`ConfigInfo` of ``cfg``."""
        hit = self._by_id.get(id(cfg))
        if hit is None or hit.config is not cfg:
            srv = np.asarray(cfg.servers, np.int64)
            pos = np.full(self.n, -1, np.int64)
            pos[srv] = np.arange(srv.size)
            token = self._tokens.setdefault(cfg, len(self._tokens))
            hit = self._by_id[id(cfg)] = ConfigInfo(cfg, srv, pos, token)
        return hit


class PairTemplate:
    """What an MP edge from config ``cu`` to ``cv`` adds to a graph, apart from its
    segments' node offsets and its activation: its forward transfers (the pattern of
    :meth:`~topoopt.estimate.segments.EstimateCache.pattern`) and the positions both
    configs share (a dependency without a transfer).

    Attributes
    ----------
    overlap : ndarray
        Per transfer, the batch overlap (bytes per unit of scale).
    size : int
        Transfers.
    ints : ndarray of int, shape (4, size)
        Rows :data:`FWD_KEY` (``src x n + dst``), :data:`BWD_KEY` (``dst x n + src``),
        :data:`SRC_POS` (position of ``src`` in ``cu``), :data:`DST_POS` (of ``dst`` in
        ``cv``).
    lu, lv : ndarray of int
        Positions in ``cu`` and in ``cv`` of the servers both use.
    shared : ndarray of int, shape (2, 2 x shared servers)
        The same-server dependencies' before and after positions, ``[lu, lv]`` and
        ``[lv, lu]``.
    """

    __slots__ = ("overlap", "ints", "size", "lu", "lv", "shared")

    def __init__(self, src: np.ndarray, dst: np.ndarray, overlap: np.ndarray,
                 pu: np.ndarray, pv: np.ndarray, n: int) -> None:
        common = np.flatnonzero((pu >= 0) & (pv >= 0))
        lu, lv = pu[common], pv[common]
        self.overlap = overlap
        self.size = int(overlap.size)
        self.ints = np.stack([src * n + dst, dst * n + src, pu[src], pv[dst]])
        self.lu, self.lv = lu, lv
        self.shared = np.stack([np.concatenate([lu, lv]), np.concatenate([lv, lu])])

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays (what a cache of templates holds)."""
        return sum(a.nbytes for a in (self.overlap, self.ints, self.lu, self.lv, self.shared))

    @staticmethod
    def shared_deps(pairs: list[tuple[int, int]], plans: list["PairTemplate"],
                    fwd_base: np.ndarray, bwd_base: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """``(before, after)``: the same-server dependencies of segment ``pairs`` (their
        templates ``plans``): per pair, producer forward -> consumer forward and
        consumer backward -> producer backward on every server both use, pair after
        pair."""
        m = np.fromiter((p.lu.size for p in plans), np.int64, len(plans))
        pu, pv = np.array(pairs, np.int64).T
        local = np.concatenate([p.shared for p in plans], axis=1)
        reps = np.repeat(m, 2)
        before = np.repeat(np.stack([fwd_base[pu], bwd_base[pv]], axis=1).ravel(), reps)
        after = np.repeat(np.stack([fwd_base[pv], bwd_base[pu]], axis=1).ravel(), reps)
        return before + local[0], after + local[1]


class PackedAllReduce(NamedTuple):
    """An :class:`AllReduceTemplate` as three arrays, for the builder to join many
    templates in few calls."""

    #: Rows: route class, ring length.
    ring_ints: np.ndarray
    #: Rows: bytes factor, rings per shard, latency.
    ring_floats: np.ndarray
    #: Rows: before kind, signed before index, after kind, signed after index; a
    #: barrier's index negated (its node is ``-1 - number``, a placeholder).
    deps: np.ndarray


@dataclass(frozen=True)
class AllReduceTemplate:
    """A config's AllReduce: its rings (route class, latency, length, bytes factor
    ``2(k-1)/k`` and rings per shard) and the dependencies between its members'
    backward/update tasks, rings and barriers as (kind, index) pairs (kinds
    :data:`BWD`, :data:`UPD`, :data:`RING`, :data:`BAR`, :data:`GLOBAL`)."""

    orders: tuple[tuple[int, ...], ...]
    ring_class: np.ndarray
    ring_latency: np.ndarray
    ring_length: np.ndarray
    ring_factor: np.ndarray
    ring_count: np.ndarray
    barriers: int
    before_type: np.ndarray
    before_index: np.ndarray
    after_type: np.ndarray
    after_index: np.ndarray

    @cached_property
    def packed(self) -> PackedAllReduce:
        """The template as :class:`PackedAllReduce`."""
        sign_b = np.where((self.before_type == BAR) | (self.before_type == GLOBAL), -1, 1)
        sign_a = np.where((self.after_type == BAR) | (self.after_type == GLOBAL), -1, 1)
        return PackedAllReduce(
            np.stack([self.ring_class, self.ring_length]),
            np.stack([self.ring_factor, self.ring_count, self.ring_latency]),
            np.stack([self.before_type, sign_b * self.before_index, self.after_type,
                      sign_a * self.after_index]))


def allreduce_template(cfg: OpConfig, position: np.ndarray, rings: Rings | None,
                       overlap: bool, ring_route: Callable[[tuple[int, ...]], RingRoute]
                       ) -> AllReduceTemplate:
    """The AllReduce of ``cfg``'s parameter shards, one group of replicas per shard.

    Parameters
    ----------
    cfg : OpConfig
    position : ndarray of int
        Each server's position in ``cfg`` (:attr:`ConfigInfo.position`).
    rings : Mapping, optional
        Group members (sorted tuple) -> ring orders; default one ring in member order.
    overlap : bool
        Rings start after their members' backward (True) or the global barrier.
    ring_route : callable
        A ring order -> its :class:`~topoopt.estimate.routes.RingRoute`.
    """
    orders_out: list[tuple[int, ...]] = []
    cls: list[int] = []
    lat: list[float] = []
    glen: list[int] = []
    frac: list[tuple[float, int]] = []
    bt: list[int] = []   # the dependency template: (kind, index) pairs
    bi: list[int] = []
    at: list[int] = []
    ai: list[int] = []
    nbar = 0
    for b in range(cfg.mp):
        members = tuple(sorted(cfg.replicas(b)))
        orders = (rings or {}).get(members, (members,))
        if not orders:
            raise ConfigError("rings", members, "every AllReduce group needs a ring")
        k, r, first = len(members), len(orders), len(cls)
        for order in orders:
            order = tuple(int(x) for x in order)
            check_ring(order, members)
            c, hop_lat = ring_route(order)
            orders_out.append(order)
            cls.append(c)
            lat.append(2 * (len(order) - 1) * hop_lat)
            glen.append(len(order))
            frac.append((2.0 * (k - 1) / k, r))
        local = position[np.asarray(members, np.int64)].tolist()
        ring_ids = list(range(first, first + r))
        if not overlap:          # rings after the global barrier
            bt += [GLOBAL] * r
            bi += [0] * r
            at += [RING] * r
            ai += ring_ids
        elif r == 1:
            bt += [BWD] * k
            bi += local
            at += [RING] * k
            ai += [first] * k
        else:                    # members -> barrier -> rings
            bt += [BWD] * k + [BAR] * r
            bi += local + [nbar] * r
            at += [BAR] * k + [RING] * r
            ai += [nbar] * k + ring_ids
            nbar += 1
        if r == 1:               # rings -> members' updates
            bt += [RING] * k
            bi += [first] * k
            at += [UPD] * k
            ai += local
        else:
            bt += [RING] * r + [BAR] * k
            bi += ring_ids + [nbar] * k
            at += [BAR] * r + [UPD] * k
            ai += [nbar] * r + local
            nbar += 1

    def i64(x: list[int]) -> np.ndarray:
        return np.asarray(x, np.int64)

    return AllReduceTemplate(tuple(orders_out), i64(cls), np.asarray(lat, float), i64(glen),
                             np.asarray([f for f, _ in frac]),
                             np.asarray([r for _, r in frac], float), nbar, i64(bt), i64(bi),
                             i64(at), i64(ai))
