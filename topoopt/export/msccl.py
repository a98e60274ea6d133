"""``msccl_allreduce.xml``: an MSCCL algorithm that runs one AllReduce over all planned rings at once.

TopoOpt §4 splits a group's AllReduce bytes evenly over several ring permutations
("TotientPerms", "SelectPermutations"); NCCL runs one node order on every channel
(:mod:`topoopt.export.rank_order`), so to use every planned ring we hand MSCCL an
explicit schedule. The executor is msccl-executor-nccl (Azure/msccl-executor-nccl);
it loads every XML in ``MSCCL_ALGO_DIR`` when ``NCCL_MSCCL_ENABLE=1`` (RCCL:
``RCCL_MSCCL_ENABLE=1``) and picks an algorithm whose ``ngpus`` equals the
communicator size, whose ``coll`` matches and whose byte range holds the message.

The schedule. The largest AllReduce group's ``R`` rings become ``R`` independent ring
AllReduces on disjoint chunks: ``nchunksperloop = R * k`` (``k`` ranks), ring ``c``
owns chunks ``c*k .. c*k + k - 1`` (the bytes split evenly over the rings), and
rank ``q_j`` at position ``j`` of ring ``c`` runs on one threadblock with ``send`` =
the next rank and ``recv`` = the previous rank of that ring, in the ring's direction
(when the group has its own ring links, as TopologyFinder builds them, every hop
``q_j -> q_{j+1}`` is one fibre strand)::

    step 0          s     send own chunk j
    steps 1..k-2    rrs   receive, add own chunk (j - t), send          (reduce-scatter)
    step k-1        rrcs  receive, add own chunk j+1, store, send       (chunk j+1 done)
    steps k..2k-3   rcs   receive chunk (j - u), store, forward         (all-gather)
    step 2k-2       r     receive chunk j+2, store

MSCCL limits (msccl-executor-nccl ``src/include/msccl/msccl_struct.h`` and
``msccl_parser.h``): at most ``MSCCL_MAX_NUM_STEPS = 64`` steps per threadblock,
``MAXCHANNELS = 32`` channels, ``MAX_SUBS = 1024`` children per element,
``MAX_NODES = 4096`` elements read per rank, 16 attributes per element, ``cnt < 72``.
A ring of ``2k - 1 > 64`` steps is cut into segments on consecutive channels: at a cut,
the fused op is split into its receive half (``rrc`` into the output chunk, or ``r``)
ending one segment and its send half (``s`` from that output chunk) starting the next,
which depends on it (``depid``/``deps`` on the previous threadblock, ``hasdep="1"``
there). Every rank cuts at the same step, so each message is still sent and received
on the same channel. ``R`` rings of ``q`` segments use ``R * q`` channels; a plan that
needs more than 32 raises :class:`PlanCheckError`.

Rank granularity (``granularity``):

* ``"server"`` (default): one MSCCL rank per server, ``ngpus = k``. MSCCL rank ``i``
  is the host on line ``i`` of ``rank_order.txt`` (the largest group's first ring
  starts that file, so these are the group members in ascending global rank). Use
  it on a communicator with one process per server (``g = 1``, or the local-rank-0
  processes of a hierarchical AllReduce: reduce inside the server over NVLink, run
  this across servers, broadcast inside).
* ``"gpu"``: one rank per GPU, ``ngpus = k * g``, rank ``i * g + l`` = GPU ``l`` of the
  host on line ``i``; each ring passes through a server's GPUs in local order and
  crosses to the next server from its last GPU. Rings are ``g`` times longer, so the
  step and channel limits are reached ``g`` times sooner.

XML form. MSCCL reads the file with its own parser (``msccl_parser.cc``), stricter
than XML: no ``<?xml?>`` declaration (the first element must be ``<algo>``, whose
attributes are read for the algorithm's metadata), attribute values in double quotes,
one space between attributes, spaces (not tabs) between elements, comments only as
``<!-- ... -->``. We write::

    <algo name=".." proto="Simple" nchannels=".." nchunksperloop=".." ngpus=".."
          coll="allreduce" inplace="1" outofplace="1" minBytes="0" maxBytes="0">
      <gpu id=".." i_chunks=".." o_chunks=".." s_chunks="0">
        <tb id=".." send=".." recv=".." chan="..">
          <step s=".." type=".." srcbuf=".." srcoff=".." dstbuf=".." dstoff=".." cnt="1"
                depid=".." deps=".." hasdep=".."/>

(each element on one line). :func:`parse_msccl_xml` re-reads it by MSCCL's rules,
:func:`check_msccl_algo` checks the schema and cross-rank consistency, and
:func:`simulate_msccl` executes the steps on integer buffers
(:func:`check_msccl_allreduce` asserts every rank ends with the sum of all inputs,
in place and out of place).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from topoopt._io import atomic_write_text
from topoopt._require import require_choice, require_int
from topoopt.errors import PlanCheckError
from topoopt.export._inputs import Rings, largest_group

__all__ = ["MAX_STEPS", "MAX_CHANNELS", "MAX_COUNT", "MAX_SUBS", "MAX_NODES", "MAX_ATTRS",
           "PROTOCOLS", "COLLECTIVES", "STEP_TYPES", "MscclStep", "MscclThreadBlock",
           "MscclGpu", "MscclAlgo", "ring_allreduce_algo", "plan_msccl_allreduce",
           "format_msccl_xml", "write_msccl_xml", "parse_msccl_xml", "check_msccl_algo",
           "simulate_msccl", "check_msccl_allreduce"]

MAX_STEPS = 64        # MSCCL_MAX_NUM_STEPS
MAX_CHANNELS = 32     # NCCL MAXCHANNELS
MAX_COUNT = 72        # MSCCL_MAX_COUNT: cnt must be < 72
MAX_TB_PER_CHANNEL = 32
MAX_SUBS = 1024
MAX_NODES = 4096
MAX_ATTRS = 16
PROTOCOLS = ("Simple", "LL128", "LL")
COLLECTIVES = ("reduce", "broadcast", "allreduce", "reducescatter", "allgather", "send",
               "recv", "gather", "scatter", "alltoall", "alltoallv")

#: step type -> (sends, receives, reads src, writes dst, reads dst); the executor's
#: prims: recvReduceSend(src), recvReduceCopy(src, dst), recvCopySend(dst), ...
STEP_TYPES = {
    "s": (True, False, True, False, False),
    "r": (False, True, False, True, False),
    "rcs": (True, True, False, True, False),
    "rrs": (True, True, True, False, False),
    "rrc": (False, True, True, True, False),
    "rrcs": (True, True, True, True, False),
    "cpy": (False, False, True, True, False),
    "re": (False, False, True, True, True),
    "nop": (False, False, False, False, False),
}
BUFFERS = ("i", "o", "s")

ALGO_ATTRS = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace",
              "outofplace", "minBytes", "maxBytes")
GPU_ATTRS = ("id", "i_chunks", "o_chunks", "s_chunks")
TB_ATTRS = ("id", "send", "recv", "chan")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps",
              "hasdep")


@dataclass(frozen=True)
class MscclStep:
    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int = 1
    depid: int = -1
    deps: int = -1
    hasdep: int = 0


@dataclass(frozen=True)
class MscclThreadBlock:
    id: int
    send: int
    recv: int
    chan: int
    steps: tuple[MscclStep, ...]


@dataclass(frozen=True)
class MscclGpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: tuple[MscclThreadBlock, ...]


@dataclass(frozen=True)
class MscclAlgo:
    """An MSCCL ``<algo>``: its attributes and, per GPU, threadblocks of steps."""

    name: str
    proto: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str
    inplace: int
    outofplace: int
    minBytes: int
    maxBytes: int
    gpus: tuple[MscclGpu, ...]
    comment: str = ""


# ---------------------------------------------------------------- building


def _ring_ops(j: int, k: int) -> list[tuple[str, int]]:
    """Fused ``(type, chunk)`` ops of position ``j`` in a ``k``-rank ring (2k - 1 of them)."""
    ops = [("s", j % k)]
    ops += [("rrs", (j - t) % k) for t in range(1, k - 1)]
    ops.append(("rrcs", (j + 1) % k))
    ops += [("rcs", (j - u) % k) for u in range(k - 2)]
    ops.append(("r", (j + 2) % k))
    return ops


def _cuts(length: int, max_steps: int) -> list[int]:
    """Op indices where a ``length``-op schedule is split so no segment exceeds ``max_steps``."""
    cuts, start = [], 0
    while length - start > max_steps:
        start += max_steps - 1
        cuts.append(start)  # op ``start`` ends one segment (receive half), starts the next
    return cuts


def _step(s: int, kind: str, off: int, **dep) -> MscclStep:
    if kind in ("s_out",):                       # send half of a cut op, from the output
        return MscclStep(s, "s", "o", off, "o", off, **dep)
    src, dst = {"s": ("i", "i"), "rrs": ("i", "i"), "rrcs": ("i", "o"), "rrc": ("i", "o"),
                "rcs": ("o", "o"), "r": ("o", "o")}[kind]
    return MscclStep(s, kind, src, off, dst, off, **dep)


def ring_allreduce_algo(rings: Sequence[Sequence[int]], *, name: str = "topoopt_ring_allreduce",
                        proto: str = "Simple", max_steps: int = MAX_STEPS,
                        max_channels: int = MAX_CHANNELS, min_bytes: int = 0,
                        max_bytes: int = 0, comment: str = "") -> MscclAlgo:
    """One AllReduce over all ``rings`` at once, chunks split evenly (module docstring).

    Parameters
    ----------
    rings : sequence of sequences of int
        Each a Hamiltonian cycle of ranks ``0..k-1`` (``q_j`` sends to ``q_{j+1}``).
    max_steps, max_channels : int
        The executor's ``MSCCL_MAX_NUM_STEPS`` and channel limit.

    Raises
    ------
    PlanCheckError
        Not rings over ``0..k-1`` with ``k >= 2``, or the schedule needs more channels
        than ``max_channels`` or more elements than MSCCL's parser reads.

    Examples
    --------
    >>> algo = ring_allreduce_algo([(0, 1, 2, 3), (0, 2, 1, 3)])
    >>> algo.ngpus, algo.nchannels, algo.nchunksperloop, len(algo.gpus[0].tbs[0].steps)
    (4, 2, 8, 7)
    """
    require_choice("msccl.proto", proto, PROTOCOLS)
    require_int("msccl.max_steps", max_steps, minimum=2)
    require_int("msccl.max_channels", max_channels, minimum=1)
    rings = [tuple(r) for r in rings]
    if not rings:
        raise PlanCheckError("an MSCCL ring AllReduce needs at least one ring")
    k = len(rings[0])
    for ring in rings:
        if sorted(ring) != list(range(k)) or k < 2:
            raise PlanCheckError(f"ring {list(ring)} is not a cycle of ranks 0..{k - 1} (k >= 2)")
    n_ops = 2 * k - 1
    cuts = _cuts(n_ops, max_steps)
    segments = len(cuts) + 1
    channels = len(rings) * segments
    if channels > max_channels:
        raise PlanCheckError(
            f"MSCCL needs {channels} channels ({len(rings)} rings x {segments} segments of at "
            f"most {max_steps} steps for {k} ranks) but allows {max_channels}: use fewer rings "
            f"or the 'server' granularity")
    chunks = len(rings) * k
    if k > MAX_SUBS or chunks > 32767:
        raise PlanCheckError(f"MSCCL's parser reads at most {MAX_SUBS} GPUs and 32767 chunks, "
                             f"this schedule has {k} and {chunks}")
    bounds = [0] + cuts + [n_ops - 1]
    gpus = []
    for rank in range(k):
        tbs = []
        for c, ring in enumerate(rings):
            j = ring.index(rank)
            ops = _ring_ops(j, k)
            nxt, prv = ring[(j + 1) % k], ring[(j - 1) % k]
            for g in range(segments):
                first, last = bounds[g], bounds[g + 1]
                tb_id = c * segments + g
                steps: list[MscclStep] = []
                for t in range(first, last + 1):
                    kind, m = ops[t]
                    off, s = c * k + m, len(steps)
                    if t == first and g > 0:          # send half of the cut op
                        prev_len = bounds[g] - bounds[g - 1] + 1
                        steps.append(_step(s, "s_out", off, depid=tb_id - 1, deps=prev_len - 1))
                    elif t == last and g < segments - 1:  # receive half of the cut op
                        steps.append(_step(s, "r" if kind == "rcs" else "rrc", off, hasdep=1))
                    else:
                        steps.append(_step(s, kind, off))
                tbs.append(MscclThreadBlock(tb_id, nxt, prv, tb_id, tuple(steps)))
        gpus.append(MscclGpu(rank, chunks, chunks, 0, tuple(tbs)))
    nodes = 1 + k + channels + channels * max(b - a + 1 for a, b in zip(bounds, bounds[1:]))
    if nodes > MAX_NODES:
        raise PlanCheckError(f"MSCCL's parser reads at most {MAX_NODES} elements per rank, "
                             f"this schedule has {nodes}")
    return MscclAlgo(name, proto, channels, chunks, k, "allreduce", 1, 1, min_bytes, max_bytes,
                     tuple(gpus), comment)


def plan_msccl_allreduce(rings: Rings, gpus_per_server: int, granularity: str = "server",
                         **options) -> tuple[MscclAlgo, tuple[tuple[int, int], ...]]:
    """The MSCCL AllReduce of a plan's largest group; also ``(server, local GPU)`` per rank.

    Ranks follow ``rank_order.txt``: the group's first ring gives the host order.

    Raises
    ------
    PlanCheckError
        No AllReduce group, or MSCCL's limits (see :func:`ring_allreduce_algo`).
    """
    require_choice("msccl.granularity", granularity, ("server", "gpu"))
    require_int("gpus_per_server", gpus_per_server, minimum=1)
    largest = largest_group(rings)
    if largest is None:
        raise PlanCheckError("the plan has no AllReduce group to write an MSCCL algorithm for")
    members, orders = largest
    first = orders[0]
    position = {s: i for i, s in enumerate(first)}
    g = gpus_per_server if granularity == "gpu" else 1
    rank_rings = [[position[s] * g + local for s in order for local in range(g)]
                  for order in orders]
    ranks = tuple((s, local) for s in first for local in range(g))
    lines = [f"TopoOpt plan: AllReduce of group {list(members)} over {len(orders)} ring(s), "
             f"one rank per {granularity}."]
    for i, (s, local) in enumerate(ranks):
        lines.append(f"rank {i} = server {s}" + (f" gpu {local}" if granularity == "gpu" else ""))
    for c, order in enumerate(orders):
        lines.append(f"ring {c}: servers {' -> '.join(map(str, order))}")
    algo = ring_allreduce_algo(rank_rings, comment="\n".join(lines), **options)
    return algo, ranks


# ---------------------------------------------------------------- writing


def _attrs(pairs) -> str:
    return " ".join(f'{k}="{v}"' for k, v in pairs)


def _attrs_format(names: tuple[str, ...]) -> str:
    """A :meth:`str.format` template writing ``names`` of its argument as
    :func:`_attrs` does (one call per element: a plan of hundreds of ranks has
    hundreds of thousands of steps)."""
    return " ".join(f'{k}="{{0.{k}}}"' for k in names)


_TB_FORMAT = "    <tb " + _attrs_format(TB_ATTRS) + ">"
_STEP_FORMAT = "      <step " + _attrs_format(STEP_ATTRS) + "/>"


def format_msccl_xml(algo: MscclAlgo) -> str:
    """The XML text, in the strict form MSCCL's parser reads (module docstring)."""
    head = _attrs((k, getattr(algo, k)) for k in ALGO_ATTRS)
    lines = [f"<algo {head}>"]
    if algo.comment:
        body = algo.comment.replace("--", "- -")
        lines.append("  <!--\n" + "\n".join(f"    {ln}" for ln in body.splitlines()) + "\n  -->")
    for gpu in algo.gpus:
        lines.append(f"  <gpu {_attrs((k, getattr(gpu, k)) for k in GPU_ATTRS)}>")
        for tb in gpu.tbs:
            lines.append(_TB_FORMAT.format(tb))
            lines.extend(map(_STEP_FORMAT.format, tb.steps))
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def write_msccl_xml(path: str | Path, algo: MscclAlgo) -> Path:
    """Write ``algo`` atomically after :func:`check_msccl_algo`; return the path."""
    check_msccl_algo(algo)
    path = Path(path)
    atomic_write_text(path, format_msccl_xml(algo))
    return path


# ---------------------------------------------------------------- reading (MSCCL's rules)


_NODE = re.compile(
    r"[ \n\r]*(?:(?P<comment><!--.*?-->)"
    r"|<(?P<close>/)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?P<attrs>(?: [A-Za-z_][A-Za-z0-9_]*=\"[^\"<&]{0,255}\")*)(?P<single>/)?>)", re.S)
_END = re.compile(r"[ \n\r]*\Z")
_ATTR = re.compile(r' ([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"')


class _Lexer:
    """Reads elements by the rules of MSCCL's own parser (msccl_parser.cc).

    ``mscclXmlGetNode`` skips only spaces and newlines between elements, reads a
    name up to a space, ``>``, ``/`` or newline, then ``key="value"`` attributes each
    after exactly one space, and ``/>`` or ``>``; comments are ``<!-- ... -->``.
    Anything else (tabs, text, single quotes, spaces around ``=``) is refused here.
    """

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def node(self):
        """``None`` at EOF, ``("close", name)`` or ``(kind, name, attrs)``."""
        while True:
            m = _NODE.match(self.text, self.pos)
            if not m:
                if _END.match(self.text, self.pos):
                    return None
                line = self.text.count("\n", 0, self.pos) + 1
                rest = self.text[self.pos:self.pos + 80]
                raise PlanCheckError(f"MSCCL XML line {line}: not an element MSCCL's parser reads "
                                     f"(one space between key=\"value\" attributes, double "
                                     f"quotes, spaces not tabs): {rest.lstrip()[:60]!r}")
            self.pos = m.end()
            if m.group("comment"):
                if "--" in m.group("comment")[4:-3]:
                    raise PlanCheckError("MSCCL XML: '--' inside a comment")
                continue
            name = m.group("name")
            if m.group("close"):
                if m.group("attrs") or m.group("single"):
                    raise PlanCheckError(f"MSCCL XML: malformed closing tag </{name}>")
                return ("close", name)
            pairs = _ATTR.findall(m.group("attrs"))
            attrs = dict(pairs)
            if len(attrs) != len(pairs):
                raise PlanCheckError(f"MSCCL XML: an attribute is repeated in <{name}>")
            if len(attrs) > MAX_ATTRS:
                raise PlanCheckError(f"MSCCL XML: <{name}> has more than {MAX_ATTRS} attributes")
            return ("single" if m.group("single") else "open", name, attrs)


def _int_attrs(attrs: dict, keys: Sequence[str], where: str) -> dict:
    out = {}
    for key in keys:
        if key not in attrs:
            raise PlanCheckError(f"MSCCL XML: <{where}> is missing attribute {key}")
        out[key] = attrs[key]
    return out


def _to_int(value: str, key: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise PlanCheckError(f"MSCCL XML: <{where}> {key}={value!r} is not an integer") from None


def _step_of(a: dict) -> MscclStep:
    try:
        return MscclStep(int(a["s"]), a["type"], a["srcbuf"], int(a["srcoff"]), a["dstbuf"],
                         int(a["dstoff"]), int(a["cnt"]), int(a["depid"]), int(a["deps"]),
                         int(a["hasdep"]))
    except KeyError as err:
        raise PlanCheckError(f"MSCCL XML: <step> is missing attribute {err.args[0]}") from None
    except ValueError:
        raise PlanCheckError(f"MSCCL XML: <step {a}> has a non-integer number") from None


def parse_msccl_xml(text: str) -> MscclAlgo:
    """Read MSCCL XML by the executor's parsing rules into an :class:`MscclAlgo`.

    The accepted text is also well-formed XML (attribute values without ``<``/``&``,
    no ``--`` in comments, matching tags) with the element structure
    ``algo > gpu > tb > step`` and every attribute MSCCL reads present.

    Raises
    ------
    PlanCheckError
        On the first violation.
    """
    if text.lstrip(" \n\r").startswith("<?"):
        raise PlanCheckError("MSCCL XML must start with <algo ...>: MSCCL reads the first "
                             "element's attributes, so no <?xml?> declaration")
    lex = _Lexer(text)
    first = lex.node()
    if first is None or first[0] != "open" or first[1] != "algo":
        raise PlanCheckError("MSCCL XML must start with <algo ...> (no <?xml?> declaration)")
    algo_attrs = _int_attrs(first[2], ALGO_ATTRS, "algo")
    gpus = []

    def children(parent: str, child: str) -> list[tuple]:
        out: list[tuple] = []
        while True:
            node = lex.node()
            if node is None:
                raise PlanCheckError(f"MSCCL XML: unterminated <{parent}>")
            if node[0] == "close":
                if node[1] != parent:
                    raise PlanCheckError(f"MSCCL XML: </{node[1]}> closes <{parent}>")
                return out
            if node[1] != child:
                raise PlanCheckError(f"MSCCL XML: <{node[1]}> inside <{parent}>, expected <{child}>")
            out.append(node)
            if len(out) > MAX_SUBS:
                raise PlanCheckError(f"MSCCL XML: <{parent}> has more than {MAX_SUBS} <{child}>")
            if child != "step":
                if node[0] != "open":
                    raise PlanCheckError(f"MSCCL XML: <{child}/> must have children")
                out[-1] = node + (children(child, {"gpu": "tb", "tb": "step"}[child]),)
            elif node[0] != "single":
                raise PlanCheckError("MSCCL XML: <step> must be self-closing (<step .../>)")

    for gnode in children("algo", "gpu"):
        ga = {k: _to_int(v, k, "gpu") for k, v in _int_attrs(gnode[2], GPU_ATTRS, "gpu").items()}
        tbs = []
        for tnode in gnode[3]:
            ta = {k: _to_int(v, k, "tb") for k, v in _int_attrs(tnode[2], TB_ATTRS, "tb").items()}
            steps = []
            for snode in tnode[3]:
                steps.append(_step_of(snode[2]))
            tbs.append(MscclThreadBlock(ta["id"], ta["send"], ta["recv"], ta["chan"], tuple(steps)))
        gpus.append(MscclGpu(ga["id"], ga["i_chunks"], ga["o_chunks"], ga["s_chunks"], tuple(tbs)))
    if lex.node() is not None:
        raise PlanCheckError("MSCCL XML: content after </algo>")
    a = algo_attrs
    return MscclAlgo(a["name"], a["proto"], _to_int(a["nchannels"], "nchannels", "algo"),
                     _to_int(a["nchunksperloop"], "nchunksperloop", "algo"),
                     _to_int(a["ngpus"], "ngpus", "algo"), a["coll"],
                     _to_int(a["inplace"], "inplace", "algo"),
                     _to_int(a["outofplace"], "outofplace", "algo"),
                     _to_int(a["minBytes"], "minBytes", "algo"),
                     _to_int(a["maxBytes"], "maxBytes", "algo"), tuple(gpus))


# ---------------------------------------------------------------- checking


def check_msccl_algo(algo: MscclAlgo, max_steps: int = MAX_STEPS,
                     max_channels: int = MAX_CHANNELS) -> None:
    """Raise :class:`PlanCheckError` unless ``algo`` meets what MSCCL's parser requires.

    Per element: ``proto`` and ``coll`` known, ``inplace``/``outofplace``/``hasdep`` 0 or
    1, ``ngpus`` GPUs with ids ``0..ngpus-1``, threadblock ids ``0..T-1`` per GPU, peers
    in ``-1..ngpus-1`` and not the GPU itself, ``chan < nchannels <= max_channels``,
    steps numbered ``0..`` below ``max_steps``, step types and buffers known, offsets
    and counts inside the declared chunks, sends only with a send peer and receives
    only with a receive peer, ``depid``/``deps`` naming an existing step of another
    threadblock that has ``hasdep="1"``. Across GPUs: at most one threadblock per
    (channel, send peer) and per (channel, receive peer) on a GPU, and every
    threadblock sending to ``p`` on channel ``c`` is matched by one on ``p`` receiving
    from it on ``c``, with the same sequence of counts.
    """
    _check_algo_header(algo, max_channels)
    sends: dict[tuple[int, int, int], list[int]] = {}   # (src, dst, chan) -> counts
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for gpu in algo.gpus:
        where = f"gpu {gpu.id}"
        chunks = {"i": gpu.i_chunks, "o": gpu.o_chunks, "s": gpu.s_chunks}
        if min(chunks.values()) < 0:
            raise PlanCheckError(f"MSCCL {where}: chunk counts must be >= 0")
        if [tb.id for tb in gpu.tbs] != list(range(len(gpu.tbs))):
            raise PlanCheckError(f"MSCCL {where}: threadblock ids must be "
                                 f"0..{len(gpu.tbs) - 1} in order")
        tbs = {tb.id: tb for tb in gpu.tbs}
        seen_send: set[tuple[int, int]] = set()
        seen_recv: set[tuple[int, int]] = set()
        for tb in gpu.tbs:
            tw = f"{where} tb {tb.id}"
            _check_threadblock(tw, tb, gpu.id, algo, seen_send, seen_recv, max_steps)
            for i, st in enumerate(tb.steps):
                send, recv = _check_step(f"{tw} step {i}", st, i, tb, tbs, chunks)
                if send:
                    sends.setdefault((gpu.id, tb.send, tb.chan), []).append(st.cnt)
                if recv:
                    recvs.setdefault((tb.recv, gpu.id, tb.chan), []).append(st.cnt)
    _check_matched(sends, recvs)
    _check_parser_limits(algo)


def _check_algo_header(algo: MscclAlgo, max_channels: int) -> None:
    """The ``<algo>`` element's attributes, and GPU ids ``0..ngpus-1``."""
    if algo.proto not in PROTOCOLS:
        raise PlanCheckError(f"MSCCL algo proto {algo.proto!r} not in {PROTOCOLS}")
    if algo.coll not in COLLECTIVES:
        raise PlanCheckError(f"MSCCL algo coll {algo.coll!r} not in {COLLECTIVES}")
    if not algo.name:
        raise PlanCheckError("MSCCL algo needs a name")
    for key in ("inplace", "outofplace"):
        if getattr(algo, key) not in (0, 1):
            raise PlanCheckError(f"MSCCL algo {key} must be 0 or 1")
    if algo.minBytes < 0 or algo.maxBytes < 0:
        raise PlanCheckError("MSCCL algo minBytes/maxBytes must be >= 0")
    if not 1 <= algo.nchannels <= max_channels:
        raise PlanCheckError(f"MSCCL algo nchannels={algo.nchannels} not in 1..{max_channels}")
    if algo.nchunksperloop < 1:
        raise PlanCheckError("MSCCL algo nchunksperloop must be >= 1")
    if sorted(g.id for g in algo.gpus) != list(range(algo.ngpus)):
        raise PlanCheckError(f"MSCCL algo ngpus={algo.ngpus} but GPU ids are "
                             f"{sorted(g.id for g in algo.gpus)[:8]}...")


def _check_threadblock(tw: str, tb: MscclThreadBlock, gpu: int, algo: MscclAlgo,
                       seen_send: set[tuple[int, int]], seen_recv: set[tuple[int, int]],
                       max_steps: int) -> None:
    """A threadblock's peers (-1 or another GPU), its channel, at most one threadblock
    of the GPU per (channel, send peer) and per (channel, receive peer), and its step
    count; adds its pairs to ``seen_send`` and ``seen_recv``."""
    for peer in (tb.send, tb.recv):
        if not -1 <= peer < algo.ngpus or peer == gpu:
            raise PlanCheckError(f"MSCCL {tw}: peer {peer} must be -1 or another GPU")
    if not 0 <= tb.chan < algo.nchannels:
        raise PlanCheckError(f"MSCCL {tw}: chan {tb.chan} not in 0..{algo.nchannels - 1}")
    if tb.send >= 0:
        if (tb.chan, tb.send) in seen_send:
            raise PlanCheckError(f"MSCCL {tw}: two threadblocks send to {tb.send} on "
                                 f"channel {tb.chan}")
        seen_send.add((tb.chan, tb.send))
    if tb.recv >= 0:
        if (tb.chan, tb.recv) in seen_recv:
            raise PlanCheckError(f"MSCCL {tw}: two threadblocks receive from {tb.recv} on "
                                 f"channel {tb.chan}")
        seen_recv.add((tb.chan, tb.recv))
    if len(tb.steps) > max_steps:
        raise PlanCheckError(f"MSCCL {tw}: {len(tb.steps)} steps, at most {max_steps}")


def _check_step(sw: str, st: MscclStep, i: int, tb: MscclThreadBlock,
                tbs: dict[int, MscclThreadBlock], chunks: dict[str, int]) -> tuple[bool, bool]:
    """Step ``i`` of threadblock ``tb``: numbered, type and buffers known, offsets and
    count inside the declared chunks, a peer for what it sends or receives, and a
    dependency on an existing step (of another threadblock) that sets ``hasdep``.
    Returns whether it sends and whether it receives."""
    if st.s != i:
        raise PlanCheckError(f"MSCCL {sw}: s={st.s}, steps must be numbered 0, 1, ...")
    if st.type not in STEP_TYPES:
        raise PlanCheckError(f"MSCCL {sw}: unknown type {st.type!r}")
    if st.srcbuf not in BUFFERS or st.dstbuf not in BUFFERS:
        raise PlanCheckError(f"MSCCL {sw}: buffers must be i, o or s")
    if not 1 <= st.cnt < MAX_COUNT:
        raise PlanCheckError(f"MSCCL {sw}: cnt={st.cnt} not in 1..{MAX_COUNT - 1}")
    send, recv, reads_src, writes_dst, _ = STEP_TYPES[st.type]
    for used, buf, off in ((reads_src, st.srcbuf, st.srcoff),
                           (writes_dst, st.dstbuf, st.dstoff)):
        if used and not (0 <= off and off + st.cnt <= chunks[buf]):
            raise PlanCheckError(f"MSCCL {sw}: {buf}[{off}:{off + st.cnt}] outside "
                                 f"the {chunks[buf]} declared chunks")
    if send and tb.send < 0:
        raise PlanCheckError(f"MSCCL {sw}: sends but the threadblock has no send peer")
    if recv and tb.recv < 0:
        raise PlanCheckError(f"MSCCL {sw}: receives but the threadblock has no recv peer")
    if st.hasdep not in (0, 1):
        raise PlanCheckError(f"MSCCL {sw}: hasdep must be 0 or 1")
    if st.depid < -1:
        raise PlanCheckError(f"MSCCL {sw}: depid must be -1 or a threadblock id")
    if st.depid >= 0:
        dep = tbs.get(st.depid)
        if dep is None or st.depid == tb.id or not 0 <= st.deps < len(dep.steps):
            raise PlanCheckError(f"MSCCL {sw}: depends on missing step "
                                 f"{st.depid}/{st.deps}")
        if dep.steps[st.deps].hasdep != 1:
            raise PlanCheckError(f"MSCCL {sw}: depends on tb {st.depid} step "
                                 f"{st.deps}, which does not set hasdep=\"1\"")
    return send, recv


def _check_matched(sends: dict[tuple[int, int, int], list[int]],
                   recvs: dict[tuple[int, int, int], list[int]]) -> None:
    """Every threadblock sending to ``p`` on channel ``c`` matched by one on ``p``
    receiving from it on ``c``, with the same sequence of counts."""
    for key in set(sends) | set(recvs):
        if sends.get(key) != recvs.get(key):
            src, dst, chan = key
            raise PlanCheckError(f"MSCCL: gpu {src} sends {len(sends.get(key, []))} messages to "
                                 f"gpu {dst} on channel {chan}, which receives "
                                 f"{len(recvs.get(key, []))} (or counts differ)")


def _check_parser_limits(algo: MscclAlgo) -> None:
    """MSCCL's parser limits: threadblocks per channel, elements and children."""
    for gpu in algo.gpus:
        per_chan = np.bincount([tb.chan for tb in gpu.tbs], minlength=1)
        if per_chan.max() > MAX_TB_PER_CHANNEL:
            raise PlanCheckError(f"MSCCL gpu {gpu.id}: more than {MAX_TB_PER_CHANNEL} "
                                 f"threadblocks on one channel")
        nodes = 1 + algo.ngpus + len(gpu.tbs) + sum(len(tb.steps) for tb in gpu.tbs)
        if nodes > MAX_NODES or algo.ngpus > MAX_SUBS or len(gpu.tbs) > MAX_SUBS:
            raise PlanCheckError(f"MSCCL gpu {gpu.id}: MSCCL's parser reads at most "
                                 f"{MAX_NODES} elements and {MAX_SUBS} children per element")

# ---------------------------------------------------------------- executing


def simulate_msccl(algo: MscclAlgo, inputs: np.ndarray, inplace: bool = False) -> np.ndarray:
    """Execute ``algo``'s steps on ``inputs``; return every GPU's output buffer.

    Parameters
    ----------
    inputs : ndarray, shape (ngpus, i_chunks, width)
        Each GPU's input chunks (integers, so sums are exact).
    inplace : bool
        The output buffer is the input buffer (an in-place AllReduce).

    Each (channel, sender, receiver) is a FIFO connection; a threadblock runs its
    steps in order, a receive waits for a message, a step with ``depid``/``deps``
    waits until that step has run, and only steps with ``hasdep="1"`` signal (as the
    executor's flags do). Sends never block.

    Raises
    ------
    PlanCheckError
        The schedule deadlocks, or messages are left unreceived.
    """
    ngpus = algo.ngpus
    gpus = sorted(algo.gpus, key=lambda g: g.id)
    inputs = np.asarray(inputs)
    width = inputs.shape[2]
    bufs = []
    for gpu in gpus:
        i_buf = inputs[gpu.id].copy()
        o_buf = i_buf if inplace else np.zeros((gpu.o_chunks, width), dtype=inputs.dtype)
        bufs.append({"i": i_buf, "o": o_buf,
                     "s": np.zeros((gpu.s_chunks, width), dtype=inputs.dtype)})
    queues: dict[tuple[int, int, int], deque] = {}
    pcs = [[0] * len(g.tbs) for g in gpus]
    remaining = sum(len(tb.steps) for g in gpus for tb in g.tbs)
    while remaining:
        progress = False
        for gpu in gpus:
            buf, pc = bufs[gpu.id], pcs[gpu.id]
            for tb in gpu.tbs:
                while pc[tb.id] < len(tb.steps):
                    st = tb.steps[pc[tb.id]]
                    if st.depid >= 0:
                        dep_tb = gpu.tbs[st.depid]
                        if pc[st.depid] <= st.deps or dep_tb.steps[st.deps].hasdep != 1:
                            break
                    send, recv, reads_src, writes_dst, _ = STEP_TYPES[st.type]
                    inbox = queues.get((tb.recv, gpu.id, tb.chan)) if recv else None
                    if recv and not inbox:
                        break
                    n = st.cnt
                    src = buf[st.srcbuf][st.srcoff:st.srcoff + n]
                    # an ndarray once the step receives or reads (every sending type does)
                    value: Any = inbox.popleft() if inbox is not None else None
                    if st.type in ("rrs", "rrc", "rrcs"):
                        value = value + src
                    elif st.type in ("s", "cpy"):
                        value = src.copy()
                    elif st.type == "re":
                        value = buf[st.dstbuf][st.dstoff:st.dstoff + n] + src
                    if writes_dst:
                        buf[st.dstbuf][st.dstoff:st.dstoff + n] = value
                    if send:
                        queues.setdefault((gpu.id, tb.send, tb.chan), deque()).append(value.copy())
                    pc[tb.id] += 1
                    remaining -= 1
                    progress = True
        if not progress:
            stuck = next((g.id, tb.id, pcs[g.id][tb.id]) for g in gpus for tb in g.tbs
                         if pcs[g.id][tb.id] < len(tb.steps))
            raise PlanCheckError(f"MSCCL schedule deadlocks: gpu {stuck[0]} tb {stuck[1]} "
                                 f"waits forever at step {stuck[2]}")
    left = {k: len(q) for k, q in queues.items() if q}
    if left:
        raise PlanCheckError(f"MSCCL schedule leaves messages unreceived: {sorted(left)[:3]}")
    return np.stack([bufs[g]["o"] for g in range(ngpus)])


def check_msccl_allreduce(algo: MscclAlgo, width: int = 3, seed: int = 0) -> None:
    """Raise :class:`PlanCheckError` unless ``algo`` is a correct AllReduce.

    Runs :func:`simulate_msccl` on random integer chunks (values up to ``2**40``, so
    a wrong chunk, a missing or a doubled contribution cannot sum to the right
    value except by a negligible accident), out of place and in place, and requires
    every GPU's every output chunk to equal the sum over GPUs of that input chunk.
    """
    if algo.coll != "allreduce":
        raise PlanCheckError(f"not an AllReduce: coll={algo.coll!r}")
    check_msccl_algo(algo)
    rng = np.random.default_rng(seed)
    chunks = algo.nchunksperloop
    inputs = rng.integers(1, 2**40, size=(algo.ngpus, chunks, width), dtype=np.int64)
    want = inputs.sum(axis=0)
    modes = [m for m, ok in ((False, algo.outofplace), (True, algo.inplace)) if ok]
    for inplace in modes:
        out = simulate_msccl(algo, inputs, inplace=inplace)[:, :chunks]
        bad = np.argwhere((out != want[None]).any(axis=2))
        if len(bad):
            gpu, chunk = bad[0]
            raise PlanCheckError(f"MSCCL AllReduce ({'in' if inplace else 'out of'} place) "
                                 f"leaves gpu {gpu} chunk {chunk} without the sum of all inputs")
