"""Structured strategies: the families a parallelization search starts from and moves in.

The models repeat structure -- dozens of identical embedding tables, runs of identical
MLP layers, transformer blocks -- and the best strategies are structured the same way
(FlexFlow and Alpa search such regular spaces; TopoOpt §2 discusses DLRM's hybrid).
A strategy here is a *table layout* (how the embedding operators are placed) times a
*body layout* (how the remaining compute operators are): data parallel on every server,
tensor-split on every server (``dp x mp``), cut into contiguous stages on disjoint
server blocks, or kept on one small block. :func:`structured_strategies` lists every
such strategy that is valid and fits in memory; :func:`operator_runs` finds the runs of
identical operators the search's group moves act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from topoopt.model import Model
from topoopt.planners.space import StrategySpace
from topoopt.strategy import OpConfig, Strategy

__all__ = ["Layout", "operator_runs", "body_stages", "side_branch", "structured_strategies",
           "TABLE_LAYOUTS", "BODY_LAYOUTS", "SIDE_LAYOUTS"]

#: Table layouts: ``dp`` (replicated like the body), ``spread`` (table i alone on server
#: floor(i n / T), DLRM's hybrid), ``mpK`` (table i split over an aligned block of K),
#: ``mpall`` (every table split over every server, up to :data:`MPALL_SHARDS` shards).
TABLE_LAYOUTS = ("dp", "spread", "mp2", "mp4", "mpall")
#: Most shards of ``mpall`` in all: beyond, the all-to-all it makes is dear to simulate
#: and gained nothing; below, a few large tables split everywhere save their AllReduce.
MPALL_SHARDS = 512
#: Body layouts: ``dp``, ``mpM`` (dp n/M x mp M on every server), ``stagesG`` and
#: ``stagesG-mp2`` (G contiguous parts of about equal work on G blocks of n/G servers;
#: ``stagesG@params`` and ``stagesG@ops`` cut by parameters or by operator count
#: instead), ``blockK`` (the whole body on servers 0..K-1, data parallel: on a poor network
#: fewer replicas can beat all of them).
BODY_LAYOUTS = ("dp", "mp2", "mp4", "mp8", "stages2", "stages4", "stages8", "stages2-mp2",
                "stages4-mp2", "stages2@params", "stages4@params", "stages8@params",
                "stages2@ops", "stages4@ops", "stages8@ops", "block1", "block2", "block4",
                "block8", "block16", "block32", "block64")
#: Side-branch body layouts: ``stagesG-side``, the side branch (:func:`side_branch`) on
#: the last block and the rest cut into G stages. Only the TopoOpt shard's first round
#: starts from them (:func:`~topoopt.planners.alternating.alternating_optimization`),
#: where they help its seeds agree; as more families of every fabric's search they
#: made the seeds disagree.
SIDE_LAYOUTS = ("stages2-side", "stages4-side")
#: What a stage cut balances.
CUTS = ("work", "params", "ops")


@dataclass(frozen=True)
class Layout:
    """A named structured strategy."""

    tables: str
    body: str
    strategy: Strategy

    @property
    def name(self) -> str:
        return f"tables-{self.tables}+body-{self.body}"


def operator_runs(model: Model) -> tuple[tuple[int, ...], ...]:
    """Groups of interchangeable operators: same kind and the same per-sample costs and
    size (the tables of DLRM, an MLP's equal layers, BERT's per-block operators).

    Returns
    -------
    tuple of tuple of int
        Each group (two operators at least) in model order; groups in order of their
        first operator.

    Examples
    --------
    >>> from topoopt.workloads import build_model
    >>> runs = operator_runs(build_model("dlrm", {"tables": 4, "rows": 100}))
    >>> [len(r) for r in runs][:1]
    [4]
    """
    groups: dict[tuple, list[int]] = {}
    for i, op in enumerate(model.operators):
        if op.kind == "input":
            continue
        key = (op.kind, op.params, op.fwd_flops, op.bwd_flops, op.out_elems, op.mem_elems)
        groups.setdefault(key, []).append(i)
    return tuple(tuple(g) for g in sorted(groups.values(), key=lambda g: g[0]) if len(g) > 1)


def body_stages(model: Model, body: list[int], parts: int, cut: str = "work"
                ) -> list[list[int]]:
    """``body`` (operator indices in model order) cut into ``parts`` contiguous pieces
    of about equal ``cut``: ``"work"`` (forward + backward FLOPs plus three FLOPs per
    parameter, so that parameter-heavy but cheap layers count too), ``"params"`` or
    ``"ops"`` (operators with parameters)."""
    ops = model.operators
    if cut == "work":
        work = np.array([ops[i].fwd_flops + ops[i].bwd_flops + 3.0 * ops[i].params
                         for i in body])
    elif cut == "params":
        work = np.array([float(ops[i].params) for i in body])
    else:
        work = np.array([1.0 if ops[i].params > 0 else 0.0 for i in body])
    total = float(work.sum())
    if total <= 0:
        work = np.ones(len(body))
        total = float(len(body))
    # cut after the operator where the running share passes g / parts
    ends = np.cumsum(work) / total
    cuts = np.searchsorted(ends, np.arange(1, parts) / parts, side="left") + 1
    bounds = [0, *np.clip(cuts, 1, len(body) - 1).tolist(), len(body)]
    return [body[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def side_branch(model: Model) -> tuple[int, ...]:
    """The body operators no embedding table feeds, when tables feed the rest: a
    branch that can run beside the table lookups (DLRM's bottom MLP).

    Placing independent operators on disjoint devices is FlexFlow's operator
    dimension; a pipeline of stages keeps its last block idle until the first stage's
    forward pass is done, so the ``stagesG-side`` layouts put the branch there.

    Returns
    -------
    tuple of int
        Operator indices in model order; empty for a model without tables, or whose
        body all depends on them (BERT: every layer reads the embeddings).

    Examples
    --------
    >>> from topoopt.workloads import build_model
    >>> m = build_model("dlrm", {"tables": 4, "rows": 100, "bottom_layers": 2})
    >>> [m.operators[i].name for i in side_branch(m)]
    ['bottom0', 'bottom1']
    """
    ops = model.operators
    fed = [op.kind == "embedding" for op in ops]
    if not any(fed):
        return ()
    for u, v in model.edges:        # edges run forward in model order
        fed[v] = fed[v] or fed[u]
    return tuple(i for i, op in enumerate(ops)
                 if op.kind not in ("embedding", "input") and not fed[i])


def _table_configs(model: Model, tables: list[int], n: int, layout: str) -> dict[int, OpConfig]:
    out: dict[int, OpConfig] = {}
    everyone = OpConfig(tuple(range(n)), dp=n, mp=1)
    T = len(tables)
    for t, i in enumerate(tables):
        if layout == "dp":
            out[i] = everyone
            continue
        home = (t * n) // T
        if layout == "spread":
            out[i] = OpConfig((home,), dp=1, mp=1)
            continue
        k = n if layout == "mpall" else int(layout[2:])
        start = home // k * k
        out[i] = OpConfig(tuple(range(start, start + k)), dp=1, mp=k)
    return out


def _body_configs(model: Model, body: list[int], n: int, layout: str) -> dict[int, OpConfig]:
    ops = model.operators
    out: dict[int, OpConfig] = {}

    def on(servers: tuple[int, ...], mp: int, idx: list[int]) -> None:
        k = len(servers)
        for i in idx:
            m = mp if (mp > 1 and ops[i].splittable and ops[i].params >= mp) else 1
            out[i] = OpConfig(servers, dp=k // m, mp=m)

    everyone = tuple(range(n))
    if layout == "dp":
        on(everyone, 1, body)
    elif layout.startswith("mp"):
        on(everyone, int(layout[2:]), body)
    elif layout.startswith("block"):
        on(tuple(range(int(layout[5:]))), 1, body)
    else:
        layout, _, cut = layout.partition("@")
        name, _, mp = layout.partition("-")
        parts = int(name[6:])
        size = n // parts
        if mp == "side":
            side = set(side_branch(model))
            on(tuple(range(n - size, n)), 1, [i for i in body if i in side])
            body, mp = [i for i in body if i not in side], ""
        for g, idx in enumerate(body_stages(model, body, parts, cut or "work")):
            on(tuple(range(g * size, (g + 1) * size)), int(mp[2:]) if mp else 1, idx)
    return out


def _applicable(layout: str, n: int, tables: int, body: int, side: int) -> bool:
    if layout.endswith("-side") and not 0 < side < body:
        return False
    if layout.startswith("stages"):
        parts = int(layout.split("@")[0].split("-")[0][6:])
        return n % parts == 0 and n // parts >= 1 and body >= parts
    if layout.startswith("block"):
        return int(layout[5:]) < n and n % int(layout[5:]) == 0
    if layout.startswith("mp") and layout != "mp":
        k = int(layout[2:])
        return n % k == 0 and k <= n
    return True


def structured_strategies(model: Model, space: StrategySpace,
                          bodies: Sequence[str] = BODY_LAYOUTS) -> tuple[Layout, ...]:
    """Every table layout x body layout that is a valid strategy of ``space`` and fits in
    memory, without duplicates, in a fixed order (:data:`TABLE_LAYOUTS` then
    ``bodies``).

    Parameters
    ----------
    model : Model
    space : StrategySpace
        The valid configs per operator and the memory limit.
    bodies : sequence of str
        The body layouts: :data:`BODY_LAYOUTS` (default) or :data:`SIDE_LAYOUTS`.

    Returns
    -------
    tuple of Layout

    Examples
    --------
    >>> from topoopt.cluster import Cluster, Job
    >>> from topoopt.workloads import model_of
    >>> job = Job("dlrm", 32, size={"tables": 4, "rows": 1000})
    >>> cluster = Cluster(servers=4, nics=2, link_bandwidth=100e9)
    >>> model = model_of(job)
    >>> names = [s.name for s in structured_strategies(model,
    ...          StrategySpace.build(model, cluster, job))]
    >>> "tables-spread+body-dp" in names and "tables-dp+body-dp" in names
    True
    """
    n = space.servers
    ops = model.operators
    tables = [i for i, op in enumerate(ops) if op.kind == "embedding"]
    body = [i for i, op in enumerate(ops) if op.kind not in ("embedding", "input")]
    n_side = len(side_branch(model))
    everyone = OpConfig(tuple(range(n)), dp=n, mp=1)
    seen: set = set()
    out: list[Layout] = []
    for tl in TABLE_LAYOUTS if tables else ("dp",):
        if tl == "mpall" and len(tables) * n > MPALL_SHARDS:
            continue
        if tl.startswith("mp") and tl != "mpall" and (n % int(tl[2:]) or int(tl[2:]) >= n):
            continue
        tcfg = _table_configs(model, tables, n, tl)
        for bl in bodies:
            if not _applicable(bl, n, len(tables), len(body), n_side):
                continue
            bcfg = _body_configs(model, body, n, bl)
            configs = tuple(tcfg.get(i) or bcfg.get(i) or everyone for i in range(len(ops)))
            if configs in seen:
                continue
            seen.add(configs)
            s = Strategy(configs, f"{tl}+{bl}")
            if space.contains(s):
                out.append(Layout(tl, bl, s))
    return tuple(out)
