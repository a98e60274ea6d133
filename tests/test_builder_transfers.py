"""The MP transfers of a task graph, listed per group of edges, against all edges listed.

:class:`~topoopt.estimate.builder.IterationGraphBuilder` lists the forward transfers
of a group of edges (producers of one config into one consumer) once, from its first
edge, and the backward transfers of the edges that are not aliases; the bytes of a
group's other edges are added without listing their transfers (issue 33: an edge
from a config on k servers to one on m has k x m transfers, and a layout with every
DLRM table on all n servers feeding a consumer on half of them has about n^3 / 4).
:class:`AllEdgesBuilder` here lists every edge's transfers first and then selects, as
the builder did before; both must give the same graph, every array bit for bit, on
structured layouts (multi-edge groups, aliases), the all-to-half layout and random
MCMC walks, with per-pair flows (merged or not) and coflows.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from topoopt.cluster import Cluster, Job
from topoopt.estimate.builder import IterationGraphBuilder
from topoopt.estimate.mp_flows import add_mp_pass
from topoopt.estimate.templates import BWD_KEY, DST_POS, FWD_KEY, SRC_POS
from topoopt.fabrics.catalog import build_fabric
from topoopt.planners.moves import MoveSet
from topoopt.planners.space import StrategySpace
from topoopt.planners.structure import structured_strategies
from topoopt.strategy import OpConfig, Strategy
from topoopt.workloads import model_of

FIELDS = ("task_server", "task_duration", "flow_class", "flow_bytes", "flow_latency",
          "flow_kind", "hop_count", "dep_before", "dep_after")


class AllEdgesBuilder(IterationGraphBuilder):
    """The builder with its MP transfers listed for every edge, then selected (the
    forward pass's first edges per group, their bytes summed by ``np.bincount``; the
    backward pass's kept edges)."""

    def _add_mp_flows(self, edges, aliases, backward_kept, g_base, g_sign, layout, flows,
                      barriers, deps):
        nn = self.n * self.n
        plans = edges.plans
        lens = np.array([p.size for p in plans], np.int64)
        tg = np.array(edges.segs, np.int64)
        ints = np.concatenate([p.ints for p in plans], axis=1)
        nbytes = (np.concatenate([p.overlap for p in plans])
                  * np.repeat(np.array(edges.scale, float), lens))
        grp = np.array(edges.group, np.int64)
        is_first = np.array(edges.first)
        first = np.repeat(is_first, lens)
        f_keys = (np.repeat(tg[:, 1] * nn, lens) + ints[FWD_KEY])[first]
        f_pred = (np.repeat(g_base[grp], lens)
                  + np.repeat(g_sign[grp], lens) * ints[SRC_POS])[first]
        if len(edges.groups) == len(plans):
            f_bytes = nbytes
        else:
            f_lens = lens[is_first]
            f_start = np.cumsum(f_lens) - f_lens
            t_start = np.cumsum(lens) - lens
            at = np.repeat(f_start[grp] - t_start, lens) + np.arange(nbytes.size)
            f_bytes = np.bincount(at, weights=nbytes, minlength=f_keys.size)
        if not all(backward_kept):
            elem = np.repeat(np.array(backward_kept), lens)
            ints, nbytes = ints[:, elem], nbytes[elem]
            lens, tg = lens[np.array(backward_kept)], tg[np.array(backward_kept)]
        b_keys = np.repeat(tg[:, 0] * nn, lens) + ints[BWD_KEY]
        b_pred = np.repeat(layout.bwd_base[tg[:, 1]], lens) + ints[DST_POS]
        coflows = self.mp_flows == "coflow"
        merge = self.merge_flows and not self.random_paths
        add_mp_pass(flows, self.routes, coflows, merge, f_keys, f_bytes, f_pred,
                    layout.fwd_base, layout.position, len({gv for _, gv in edges.pairs}),
                    None, barriers, layout.sizes, deps)
        add_mp_pass(flows, self.routes, coflows, merge, b_keys, nbytes, b_pred,
                    layout.bwd_base, layout.position, len({gu for gu, _ in edges.pairs}),
                    aliases, barriers, layout.sizes, deps)


def dlrm(n: int, tables: int):
    job = Job("dlrm", 32, size={"tables": tables, "rows": 100_000, "dim": 64, "bag": 20,
                                "bottom_layers": 2, "bottom_width": 256, "top_layers": 2,
                                "top_width": 256})
    cluster = Cluster(servers=n, nics=4, link_bandwidth=100e9)
    return model_of(job), cluster, job


def all_to_half(model, n: int, upper: bool = False) -> Strategy:
    """Every table split over all ``n`` servers, the rest data parallel on half of
    them (the lower or ``upper`` half): the most MP transfers per edge."""
    half = tuple(range(n // 2, n)) if upper else tuple(range(n // 2))
    tables = OpConfig(tuple(range(n)), dp=1, mp=n)
    body = OpConfig(half, dp=len(half), mp=1)
    return Strategy(tuple(tables if op.kind == "embedding" else body
                          for op in model.operators), "all-to-half")


def assert_same_graph(a, b) -> None:
    """Every array of two graphs equal bit for bit (and of the same dtype)."""
    assert a.tasks == b.tasks and a.barriers == b.barriers
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), name
    for name in ("ptr", "link", "weight"):
        assert getattr(a.routes, name).tobytes() == getattr(b.routes, name).tobytes(), name
    assert (a.flow_count is None) == (b.flow_count is None)
    if a.flow_count is not None:
        assert a.flow_count.tobytes() == b.flow_count.tobytes()
    assert a.segments == b.segments and a.ring_orders == b.ring_orders


def walk(model, cluster, job, start: Strategy, steps: int, seed: int) -> list[Strategy]:
    """``start`` and the states of a random walk of MCMC moves from it."""
    space = StrategySpace.build(model, cluster, job)
    moves = MoveSet(space, structured_strategies(model, space))
    rng = np.random.default_rng(seed)
    out, s = [start], start
    memory = space.memory(s)
    for _ in range(steps):
        move = moves.propose(s, memory, rng)
        if move is not None:
            s, memory = move[0], move[1]
            out.append(s)
    return out


OPTIONS = [dict(mp_flows="pair"), dict(mp_flows="pair", merge_flows=True),
           dict(mp_flows="coflow"), dict(mp_flows="coflow", mp_barriers=False)]


@pytest.mark.parametrize("options", OPTIONS, ids=["pair", "pair-merged", "coflow",
                                                   "coflow-no-barriers"])
@pytest.mark.parametrize("n", [16, 32])
def test_structured_layouts_and_walks_build_the_same_graphs(n, options):
    model, cluster, job = dlrm(n, n // 2)
    space = StrategySpace.build(model, cluster, job)
    layouts = structured_strategies(model, space)
    names = {x.name for x in layouts}
    assert {"tables-mpall+body-stages2", "tables-mp4+body-dp",
            "tables-spread+body-block1"} <= names
    pick = [x.strategy for x in layouts if x.tables in ("mpall", "mp4", "spread")][::3]
    pick += walk(model, cluster, job, all_to_half(model, n), 12, seed=n)
    fabric = build_fabric("ideal", cluster)
    new = IterationGraphBuilder(model, cluster, job, fabric, **options)
    old = AllEdgesBuilder(model, cluster, job, fabric, **options)
    groups = aliased = 0
    for s in pick:      # one builder each, the same strategies in the same order
        edges = new._transfers(new.fused(s))
        groups += len(edges.groups) < len(edges.plans)
        aliased += not all(new._aliases(edges, new.fused(s))[1])
        assert_same_graph(new.build(s), old.build(s))
    if options.get("mp_barriers", True):
        assert groups > 0   # some strategies have edges sharing a group
        if options.get("mp_flows") == "coflow" or options.get("merge_flows"):
            assert aliased > 0


def test_group_edges_share_one_template():
    """The edges of a forward group share their template (the same object), so their
    transfers align position by position."""
    model, cluster, job = dlrm(16, 8)
    b = IterationGraphBuilder(model, cluster, job, build_fabric("ideal", cluster))
    edges = b._transfers(b.fused(all_to_half(model, 16)))
    assert len(edges.groups) < len(edges.plans)
    for i, g in enumerate(edges.group):
        first = list(edges.groups.values())[g].first
        assert edges.plans[i] is edges.plans[first]


@pytest.mark.parametrize("fabric_name", ["ideal", "fattree"])
def test_all_to_half_at_64_servers(fabric_name, monkeypatch):
    """The all-to-half layout and a walk from it at 64 servers, with a group's bytes
    added edge by edge and all at once."""
    model, cluster, job = dlrm(64, 32)
    fabric = build_fabric(fabric_name, cluster)
    strategies = walk(model, cluster, job, all_to_half(model, 64, upper=True), 4, seed=1)
    for limit in (1, 1 << 16):
        monkeypatch.setattr("topoopt.estimate.mp_flows._SUM_CHUNK", limit)
        for options in (dict(merge_flows=True), dict(mp_flows="coflow")):
            new = IterationGraphBuilder(model, cluster, job, fabric, **options)
            old = AllEdgesBuilder(model, cluster, job, fabric, **options)
            for s in strategies:
                assert_same_graph(new.build(s), old.build(s))


def _build_peak(cls, model, cluster, job, fabric, strategy) -> int:
    b = cls(model, cluster, job, fabric, merge_flows=True)
    b.build(strategy)            # the caches (templates, routes) warm
    tracemalloc.start()
    try:
        b.build(strategy)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_build_lists_the_transfers_of_groups_and_kept_edges_only(monkeypatch):
    """The memory a (warm) build of the all-to-half layout allocates (tracemalloc's
    peak) grows with its groups' and kept edges' transfers, not every edge's. At 64
    servers and 32 tables, the 32 table edges are one forward group and one kept
    backward edge of 64 x 32 - 32 transfers each; every edge's are 16 times as many."""
    n, tables = 64, 32
    model, cluster, job = dlrm(n, tables)
    fabric = build_fabric("ideal", cluster)
    s = all_to_half(model, n)
    b = IterationGraphBuilder(model, cluster, job, fabric, merge_flows=True)
    edges = b._transfers(b.fused(s))
    kept = b._aliases(edges, b.fused(s))[1]
    every = sum(p.size for p in edges.plans)
    listed = (sum(p.size for p, f in zip(edges.plans, edges.first) if f)
              + sum(p.size for p, k in zip(edges.plans, kept) if k))
    assert every >= tables * n * (n // 2 - 1) and every >= 8 * listed
    # a group's later edges' bytes added edge by edge
    monkeypatch.setattr("topoopt.estimate.mp_flows._SUM_CHUNK", 1)
    new = _build_peak(IterationGraphBuilder, model, cluster, job, fabric, s)
    old = _build_peak(AllEdgesBuilder, model, cluster, job, fabric, s)
    # listing every edge's transfers holds at least their ints (32 bytes each); listing
    # the groups' and kept edges' holds less, under 200 bytes per listed transfer more
    # than a build without MP transfers (and the old way is above that)
    assert old > 32 * every > new
    plain = _build_peak(IterationGraphBuilder, model, cluster, job, fabric,
                        Strategy(tuple(OpConfig(tuple(range(n)), dp=n, mp=1)
                                       for _ in model.operators), "dp"))
    assert new - plain < 200 * listed < old - plain
