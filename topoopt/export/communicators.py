"""``communicators.json`` and ``msccl/{dp,edp}{j}.xml``: every communicator of an LLM plan.

An LLM job does not run one AllReduce but many communicators
(:func:`topoopt.llm.parallel.communicator_groups`, Megatron-LM's ``parallel_state``):
TP groups inside a server, PP groups along a replica's stages, DP groups per (stage,
tensor rank), EP groups of ``ep`` replicas and, with ``1 < ep < dp``, the experts' own
gradient groups (``edp``). ``rank_order.txt`` fixes the global ranks (GPU rank ``r`` runs
on the server of line ``r // g``, local GPU ``r % g``); this module says, per group,
which GPUs and servers it holds and how to make its AllReduce follow the ring
TopologyFinder planned for it on the shard.

``communicators.json``::

    {"format": "topoopt-communicators/1", "gpus_per_server": g,
     "launch_order": [server of line 0, ...],
     "groups": {"tp": [...], "pp": [...], "dp": [...], "ep": [...], "edp": [...]},
     "skipped": {file: reason}}

(``"cp": [...]`` after ``"tp"`` when the plan has context parallelism, ``cp > 1``.)

Each group is ``{"kind", "index", "ranks", "servers"}``: ``ranks`` the global GPU ranks
(ascending; ``pp`` in stage order), ``servers`` the servers holding them (ascending).
Each ``dp``/``edp`` group that crosses servers also has

* ``rings``: the planned rings of its servers (``plan.json``'s rings of the group);
* ``nccl_order``: its ranks in the order the communicator's ranks should take so that
  NCCL's ring follows the first planned ring (servers in ring order, a server's GPUs
  ascending; NCCL runs one node order on every channel, so the other rings need MSCCL).
  NCCL numbers nodes by first appearance over communicator ranks and node ``n`` sends
  to node ``n + 1`` (:func:`topoopt.export.rank_order.node_ring`); create the
  communicator with ``ncclCommSplit(world, color=index, key=position in nccl_order)``
  (NCCL orders a split's ranks by ``key``); ``torch.distributed.new_group`` sorts the
  ranks instead, and ``sorted_follows_ring`` says whether that is already the ring
  (true for the largest group's first ring, which ``rank_order.txt`` launches);
* ``msccl``: the MSCCL file running the group's AllReduce over *all* its planned rings
  (:func:`topoopt.export.msccl.ring_allreduce_algo`, the bytes split evenly), or null
  when it is skipped (the reason in ``skipped``).

MSCCL files. ``msccl/dp{j}.xml`` (``edp{j}`` for expert gradients) serves the GPU
groups of that kind on the ``j``-th server group of ``plan.json``'s ``rings`` (sorted
member tuples). Its ranks are the communicator ranks as ``torch.distributed.new_group``
numbers them (ascending global rank), so it needs no split key; each ring goes
through a server's GPUs of the group in ascending rank and crosses to the next server
of the planned ring. MSCCL picks an algorithm by collective, ``ngpus`` and message size
only (msccl-executor-nccl), not by communicator: point each process's
``MSCCL_ALGO_DIR`` at a folder holding its own DP group's file; another communicator
of the same size (a TP group, say) would also run it -- a correct AllReduce, but not
ringed for that group. A group beyond MSCCL's step, channel or element limits
(:mod:`topoopt.export.msccl`) is skipped with the reason.

Not written: an MSCCL all-to-all per EP group (``msccl/ep*.xml`` in ``skipped``).
NCCL's all-to-all already sends to every peer directly, and a schedule that beats it on
a direct-connect shard would have to forward through the shard's multi-hop routes,
which :mod:`topoopt.export.msccl` does not build; the EP groups' routes are the shard's
(``plan.json`` ``routes``). Nor are TP or PP files: TP runs on NVLink inside a server
and PP is point-to-point between consecutive stages.

References
----------
.. [1] W. Wang et al., "TopoOpt", NSDI'23, §4 (AllReduce groups, several ring
   permutations per group, the bytes split over them).
.. [2] NCCL documentation, ``ncclCommSplit`` (ranks of a new communicator ordered by
   ``key``); NVIDIA/nccl ``src/graph/connect.cc`` (``connectRings``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

import topoopt.export.msccl as _msccl
from topoopt.cluster import Cluster
from topoopt.errors import PlanCheckError
from topoopt.export._inputs import Rings
from topoopt.export.msccl_runtime import (
    DEFAULT_RUNTIME,
    check_msccl_runtime,
    for_runtime,
    runtime_of,
)
from topoopt.export.rank_order import node_ring, rank_order
from topoopt.llm import LLMParallel, communicator_groups

__all__ = ["COMMUNICATORS", "COMMUNICATORS_FORMAT", "KINDS", "CP_KINDS", "kinds_of",
           "EP_SKIPPED",
           "CommunicatorExports", "communicator_table", "group_msccl_rings",
           "communicator_exports", "render_communicators", "check_communicators",
           "is_communicator_file", "msccl_name"]

COMMUNICATORS = "communicators.json"
COMMUNICATORS_FORMAT = "topoopt-communicators/1"
#: Communicator kinds, in the order of :func:`~topoopt.llm.parallel.communicator_groups`.
KINDS = ("tp", "pp", "dp", "ep", "edp")
#: With context parallelism (``cp > 1``) the ``cp`` groups (K and V passed around a
#: ring, :func:`~topoopt.llm.parallel.communicator_groups`) come after the tensor ones.
CP_KINDS = ("tp", "cp", "pp", "dp", "ep", "edp")


def kinds_of(par: LLMParallel) -> tuple[str, ...]:
    """The communicator kinds of ``par``'s ``communicators.json``: :data:`KINDS`, and
    ``cp`` too with context parallelism (a plan without it keeps its file)."""
    return CP_KINDS if par.cp > 1 else KINDS
_RINGED = ("dp", "edp")
EP_SKIPPED = "msccl/ep*.xml"
EP_REASON = ("no MSCCL all-to-all: NCCL's all-to-all already sends to every peer "
             "directly, and beating it on the shard needs forwarding over its multi-hop "
             "routes, which topoopt's MSCCL writer does not build")


def msccl_name(kind: str, j: int) -> str:
    """``msccl/dp{j}.xml``: the file of ``kind`` groups on the ``j``-th server group."""
    return f"msccl/{kind}{j}.xml"


def is_communicator_file(rel: str) -> bool:
    """Whether ``rel`` is a name this module writes."""
    if rel == COMMUNICATORS:
        return True
    for kind in _RINGED:
        head = f"msccl/{kind}"
        if rel.startswith(head) and rel.endswith(".xml"):
            j = rel[len(head):-4]
            return j.isdigit() and str(int(j)) == j
    return False


def _host(order: tuple[int, ...], g: int):
    return lambda r: int(order[r // g])


def group_msccl_rings(ranks: tuple[int, ...], orders, order: tuple[int, ...],
                      g: int) -> list[list[int]]:
    """The group's planned server rings as rings of its communicator ranks.

    Communicator rank ``i`` is the ``i``-th smallest of ``ranks`` (global GPU ranks,
    ``torch.distributed.new_group``'s numbering); each ring visits the servers in the
    planned order and, on each, the group's ranks ascending.

    Examples
    --------
    Four GPUs, two per server, servers launched as (0, 1), one ring 1 -> 0:

    >>> group_msccl_rings((0, 1, 2, 3), [(1, 0)], (0, 1), 2)
    [[2, 3, 0, 1]]
    """
    host = _host(order, g)
    comm = sorted(ranks)
    on: dict[int, list[int]] = {}
    for i, r in enumerate(comm):
        on.setdefault(host(r), []).append(i)
    return [[i for s in ring for i in on[int(s)]] for ring in orders]


def communicator_table(par: LLMParallel, rings: Rings, cluster: Cluster,
                       msccl: Mapping[tuple[str, tuple[int, ...]], str | None] | None = None
                       ) -> dict:
    """The ``communicators.json`` document of ``par`` on the shard's ``rings``.

    Parameters
    ----------
    par : LLMParallel
        The plan's parallelism (``plan.json`` ``llm.parallel``).
    rings : mapping
        ``plan.json``'s rings (server group -> ring orders).
    msccl : mapping, optional
        ``(kind, server group)`` -> the MSCCL file serving it, or None when skipped.

    Raises
    ------
    PlanCheckError
        A DP group crossing servers has no ring in ``rings``.
    """
    g = cluster.gpus_per_server
    order = rank_order(cluster.servers, rings)
    host = _host(order, g)
    groups = communicator_groups(par)
    out: dict[str, list] = {}
    for kind in kinds_of(par):
        rows = []
        for index, ranks in enumerate(groups[kind]):
            servers = sorted({host(r) for r in ranks})
            row = {"kind": kind, "index": index, "ranks": list(ranks), "servers": servers}
            if kind in _RINGED and len(servers) > 1:
                key = tuple(servers)
                if key not in rings:
                    raise PlanCheckError(f"{kind} group {index} on servers {servers} has no "
                                         "planned ring")
                planned = [[int(s) for s in o] for o in rings[key]]
                ring = planned[0]
                pos = {s: i for i, s in enumerate(ring)}
                nccl = sorted(ranks, key=lambda r: (pos[host(r)], r))
                row.update(rings=planned, nccl_order=nccl,
                           sorted_follows_ring=_same_cycle(
                               node_ring([host(r) for r in sorted(ranks)]), ring),
                           msccl=(msccl or {}).get((kind, key)))
            rows.append(row)
        out[kind] = rows
    return {"format": COMMUNICATORS_FORMAT, "gpus_per_server": g,
            "launch_order": [int(s) for s in order], "groups": out, "skipped": {}}


def _same_cycle(a, b) -> bool:
    a, b = list(a), list(b)
    if len(a) != len(b) or not a or a[0] not in b:
        return a == b
    k = b.index(a[0])
    return a == b[k:] + b[:k]


def _algos(par: LLMParallel, rings: Rings, cluster: Cluster, proto: str, runtime: str
           ) -> tuple[dict[str, _msccl.MscclAlgo], dict[str, str],
                      dict[tuple[str, tuple[int, ...]], str | None]]:
    """``{file: MscclAlgo}``, ``{file: reason}`` and ``(kind, servers) -> file or None``."""
    g = cluster.gpus_per_server
    order = rank_order(cluster.servers, rings)
    host = _host(order, g)
    index = {m: j for j, m in enumerate(sorted(rings))}
    groups = communicator_groups(par)
    algos: dict[str, _msccl.MscclAlgo] = {}
    skipped: dict[str, str] = {}
    where: dict[tuple[str, tuple[int, ...]], str | None] = {}
    laid: dict[str, list[list[int]]] = {}
    for kind in _RINGED:
        for ranks in groups[kind]:
            key = tuple(sorted({host(r) for r in ranks}))
            if len(key) < 2 or key not in index:
                continue
            name = msccl_name(kind, index[key])
            rank_rings = group_msccl_rings(ranks, rings[key], order, g)
            laid.setdefault(name, rank_rings)
            if name in algos or name in skipped:
                if rank_rings != laid[name]:
                    raise PlanCheckError(f"{kind} groups on servers {list(key)} lay out "
                                         "their GPUs differently; one MSCCL file cannot "
                                         "serve them")
                continue
            comment = "\n".join(
                [f"TopoOpt LLM plan: {kind} AllReduce on servers {list(key)} over "
                 f"{len(rank_rings)} planned ring(s), one rank per GPU of the group; "
                 "rank i = the i-th smallest global rank (torch.distributed.new_group).",
                 *(f"ring {c}: servers {' -> '.join(map(str, o))}"
                   for c, o in enumerate(rings[key]))])
            try:
                algo = _msccl.ring_allreduce_algo(rank_rings, name=f"topoopt_{kind}{index[key]}",
                                                  proto=proto, comment=comment)
                _msccl.check_msccl_algo(algo)
                algo = for_runtime(algo, runtime)
                check_msccl_runtime(algo, runtime)
            except PlanCheckError as err:
                skipped[name] = str(err)
                where[(kind, key)] = None
                continue
            algos[name] = algo
            where[(kind, key)] = name
    return algos, skipped, where


def _text(doc: dict) -> str:
    """The file's text: one group per line, keys sorted (the same table, the same bytes)."""
    head = {k: v for k, v in doc.items() if k != "groups"}
    lines = ["{" + ",\n ".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
                               for k, v in sorted(head.items())) + ",", ' "groups": {']
    kinds = []
    for kind in (k for k in CP_KINDS if k in doc["groups"]):
        rows = ",\n".join(f"   {json.dumps(row, sort_keys=True)}" for row in doc["groups"][kind])
        kinds.append(f'  "{kind}": [' + (f"\n{rows}\n  ]" if rows else "]"))
    return "\n".join(lines) + "\n" + ",\n".join(kinds) + "\n }\n}\n"


@dataclass(frozen=True)
class CommunicatorExports:
    """An LLM plan's communicator files, rendered.

    Attributes
    ----------
    table : dict
        The ``communicators.json`` document.
    algos : mapping
        MSCCL file -> its :class:`~topoopt.export.msccl.MscclAlgo`.
    files : mapping
        Path relative to the plan folder -> text.
    skipped : mapping
        File not written -> why (``plan.json`` ``skipped``).
    """

    table: dict = field(repr=False)
    algos: Mapping[str, _msccl.MscclAlgo] = field(repr=False)
    files: Mapping[str, str] = field(repr=False)
    skipped: Mapping[str, str]


def communicator_exports(par: LLMParallel, rings: Rings, cluster: Cluster, *,
                         proto: str = "Simple",
                         msccl_runtime: str = DEFAULT_RUNTIME) -> CommunicatorExports:
    """``communicators.json`` and the MSCCL file of every ringed DP group, in memory.

    ``msccl_runtime`` is the MSCCL runtime the files target (their byte range and
    placement flags: :func:`~topoopt.export.msccl_runtime.for_runtime`), as for
    ``msccl_allreduce.xml``.

    Raises
    ------
    PlanCheckError
        A DP group crossing servers has no planned ring.
    """
    algos, skipped, where = _algos(par, rings, cluster, proto, msccl_runtime)
    table = communicator_table(par, rings, cluster, where)
    if any(len(row["servers"]) > 1 for row in table["groups"]["ep"]):
        skipped[EP_SKIPPED] = EP_REASON
    table["skipped"] = dict(sorted(skipped.items()))
    files = {COMMUNICATORS: _text(table)}
    files.update({name: _msccl.format_msccl_xml(a) for name, a in sorted(algos.items())})
    return CommunicatorExports(table, algos, files, table["skipped"])


def render_communicators(par: LLMParallel, rings: Rings, cluster: Cluster, *,
                         proto: str = "Simple") -> tuple[dict[str, str], dict[str, str]]:
    """The texts of :func:`communicator_exports` keyed by path, and what it skipped."""
    out = communicator_exports(par, rings, cluster, proto=proto)
    return dict(out.files), dict(out.skipped)


def check_communicators(directory: str | Path, files, par: LLMParallel, rings: Rings,
                        cluster: Cluster, *, simulate: bool = True,
                        rendered: CommunicatorExports | None = None) -> list[str]:
    """Read ``communicators.json`` and the MSCCL files back against the plan.

    ``files`` is ``plan.json``'s list. ``communicators.json`` must equal the table
    derived from ``par`` and ``rings`` (the first differing group named); the MSCCL
    files listed must be exactly those the plan renders; each must be the text of the
    schedule that rings the group's communicator ranks along its planned rings
    (:func:`group_msccl_rings`; a file that differs is parsed by MSCCL's rules and the
    first difference named, a comment edit is accepted), and with ``simulate`` that
    schedule is executed as an AllReduce
    (:func:`~topoopt.export.msccl.check_msccl_allreduce`). ``rendered`` is
    :func:`communicator_exports` of the plan, when the caller has it already.

    Returns
    -------
    list of str
        The files checked.

    Raises
    ------
    PlanCheckError
        Naming the file and the first violation.
    """
    directory = Path(directory)
    if rendered is None:
        rendered = communicator_exports(par, rings, cluster)
    want, algos = rendered.table, rendered.algos
    listed = sorted(f for f in files if is_communicator_file(f))
    if listed != sorted(rendered.files):
        raise PlanCheckError(f"plan.json files lists {listed}, but the plan's communicator "
                             f"files are {sorted(rendered.files)}")
    try:
        got = json.loads((directory / COMMUNICATORS).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PlanCheckError(f"{COMMUNICATORS}: not JSON ({exc})") from None
    if not isinstance(got, dict) or set(got) != set(want):
        raise PlanCheckError(f"{COMMUNICATORS}: keys must be {sorted(want)}")
    for key in ("format", "gpus_per_server", "launch_order", "skipped"):
        if got[key] != want[key]:
            raise PlanCheckError(f"{COMMUNICATORS}: {key} is {got[key]!r}, the plan gives "
                                 f"{want[key]!r}")
    groups = got["groups"]
    kinds = kinds_of(par)
    if not isinstance(groups, dict) or sorted(groups) != sorted(kinds):
        raise PlanCheckError(f"{COMMUNICATORS}: groups must have {', '.join(kinds)}")
    for kind in kinds:
        mine, theirs = want["groups"][kind], groups[kind]
        if not isinstance(theirs, list) or len(theirs) != len(mine):
            raise PlanCheckError(f"{COMMUNICATORS}: {len(mine)} {kind} groups expected")
        for a, b in zip(mine, theirs):
            if a != b:
                field = next((k for k in a if not isinstance(b, dict) or b.get(k) != a[k]),
                             "keys")
                raise PlanCheckError(f"{COMMUNICATORS}: {kind} group {a['index']} {field} "
                                     f"is not what the plan gives ({a.get(field)})")
    checked = [COMMUNICATORS]
    for name, algo in sorted(algos.items()):
        try:
            text = (directory / name).read_text(encoding="utf-8")
        except OSError as exc:
            raise PlanCheckError(f"{name}: cannot be read ({exc})") from None
        if text != rendered.files[name]:   # another runtime's file, or say what is wrong
            try:
                got_algo = _msccl.parse_msccl_xml(text)
                _msccl.check_msccl_algo(got_algo)
                check_msccl_runtime(got_algo, runtime_of(got_algo))
            except PlanCheckError as exc:
                raise PlanCheckError(f"{name}: {exc}") from None
            if got_algo != replace(for_runtime(algo, runtime_of(got_algo)), comment=""):
                raise PlanCheckError(f"{name}: its schedule is not the plan's: the group's "
                                     f"{algo.ngpus} ranks ringed along its planned rings, "
                                     f"{algo.nchannels} channels")
        if simulate:   # the text is the plan's schedule: execute it
            try:
                _msccl.check_msccl_allreduce(algo)
            except PlanCheckError as exc:
                raise PlanCheckError(f"{name}: {exc}") from None
        checked.append(name)
    return checked
