"""``mscclpp_allreduce.json``: the planned rings as an MSCCL++ execution plan.

MSCCL++ (microsoft/mscclpp, checked against commit 1f5f065) runs collectives from
an execution plan, the JSON its Python DSL writes (``mscclpp.language.program``,
defaults ``num_threads_per_block`` 1024, ``buffer_alignment`` 16, message sizes 0 ..
2^64 - 1, lines 55-59) and its executor reads
(``src/core/executor/execution_plan.cc``). We write one AllReduce over all the
planned rings of the largest AllReduce group, one MSCCL++ rank per server (rank
``i`` = the ``i``-th host of ``rank_order.txt``, as ``msccl_allreduce.xml``), the
bytes split evenly over the ``R`` rings: ``R k`` chunks (``k`` ranks), ring ``c``
owning chunks ``c k .. c k + k - 1``. Rank at position ``j`` of ring ``c`` runs
threadblock ``c``: ``k - 1`` reduce-scatter steps (``pwsf`` its chunk ``j - t`` into
the next rank's scratch, ``wait`` for the previous rank's, ``re`` it into its own
input) then ``k - 1`` all-gather steps (``pwsf`` chunk ``j + 1 - u`` into the next
rank's input, ``wait``), in place. A threadblock runs at most ``MAX_OPERATION = 64``
ops (``src/core/include/execution_common.hpp`` line 17, refused above it by
``src/core/executor/executor.cc`` line 478), so a longer ring's ops are split over
consecutive threadblocks chained by a device semaphore (``sem_release`` ending one,
``sem_acquire`` starting the next; at most ``MAX_DEVICE_SEMAPHORES = 16`` per rank,
execution_common.hpp line 20). Cross-server traffic goes over ``port`` channels
(the proxy, RDMA); channels to the same peer pair up in the order listed
(``channelCountMap_``, execution_plan.cc lines 147, 337), so every rank lists its
channels in one global order of ring hops.

:func:`parse_mscclpp_plan` reads a plan by the executor's rules and
:func:`simulate_mscclpp` runs its operations on integer buffers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from topoopt.errors import PlanCheckError
from topoopt.export._inputs import Rings, largest_group

__all__ = ["MSCCLPP_FILE", "mscclpp_ring_allreduce", "plan_mscclpp_allreduce",
           "format_mscclpp_plan", "MscclppPlan", "parse_mscclpp_plan", "simulate_mscclpp"]

MSCCLPP_FILE = "mscclpp_allreduce.json"
#: Operation names the executor knows (``getOpType``, execution_plan.cc lines 25-88).
OP_NAMES = ("nop", "barrier", "put", "pws", "pwsf", "get", "copy", "signal", "wait",
            "flush", "re", "res", "rre", "rres", "ppkt", "rppkt", "respkt", "cpkt", "upkt",
            "repkt", "recpkt", "recspkt", "glres", "gstore", "gstorepkt", "rlxsignal",
            "rlxwait", "pipeline", "sem_acquire", "sem_release")
_BUFFERS = ("i", "o", "s")                          # convertToBufferType, lines 91-101
_CHANNELS = ("memory", "port", "none", "switch")    # convertToChannelType, lines 103-115
MAX_OPERATION = 64          # execution_common.hpp line 17
MAX_CHANNEL = 16            # channels and remote buffers per threadblock, line 15
MAX_DEVICE_SEMAPHORES = 16  # line 20


def _segments(ops: list[dict], first_sem: int) -> list[list[dict]]:
    """``ops`` cut into threadblocks of at most MAX_OPERATION ops, each after the
    first starting with ``sem_acquire`` of the semaphore the one before releases."""
    out: list[list[dict]] = []
    at, sem = 0, first_sem
    while at < len(ops):
        head = [{"name": "sem_acquire", "semaphore_ids": [sem - 1]}] if out else []
        room = MAX_OPERATION - len(head)
        if len(ops) - at <= room:
            out.append(head + ops[at:])
            break
        out.append(head + ops[at:at + room - 1]
                   + [{"name": "sem_release", "semaphore_ids": [sem]}])
        at += room - 1
        sem += 1
    return out


def mscclpp_ring_allreduce(rings: list[list[int]], name: str = "topoopt_ring_allreduce") -> dict:
    """The execution plan (a JSON document) of one AllReduce over ``rings``.

    Parameters
    ----------
    rings : list of list of int
        Hamiltonian cycles of ranks ``0..k-1``, ``k >= 3`` (with 2 ranks the two
        directions of a ring pair the same channels).

    Raises
    ------
    PlanCheckError
        Not rings over the same ``k >= 3`` ranks, or more semaphores than MSCCL++ has.
    """
    k = len(rings[0]) if rings else 0
    if k < 3 or any(sorted(r) != list(range(k)) for r in rings):
        raise PlanCheckError("an MSCCL++ ring AllReduce needs rings over the same 3 or more "
                             "ranks")
    nring = len(rings)
    hops = [(c, r[j], r[(j + 1) % k]) for c, r in enumerate(rings) for j in range(k)]
    gpus = []
    for q in range(k):
        peers: list[int] = []
        index: dict[tuple[int, int, int], int] = {}
        for c, a, b in hops:        # one global order: paired channels match up
            if q in (a, b):
                index[(c, a, b)] = len(peers)
                peers.append(b if q == a else a)
        remote: list[dict] = []
        tbs: list[dict] = []
        sems = 0
        for c, ring in enumerate(rings):
            j = ring.index(q)
            nxt, prv = ring[(j + 1) % k], ring[j - 1]
            remote += [{"rank": nxt, "type": "s", "access_channel_types": ["port"]},
                       {"rank": nxt, "type": "i", "access_channel_types": ["port"]}]
            send, recv = index[(c, q, nxt)], index[(c, prv, q)]

            def chunk(x: int, buf: str, c: int = c) -> list[dict]:
                return [{"type": buf, "index": c * k + x % k, "size": 1}]

            def put(x: int, buffer_id: int, c: int = c) -> dict:
                return {"name": "pwsf", "src_buff": chunk(x, "i"),
                        "dst_buff": [{"buffer_id": buffer_id, "index": c * k + x % k,
                                      "size": 1}],
                        "channel_ids": [0], "channel_type": "port"}
            wait = {"name": "wait", "channel_ids": [1], "channel_type": "port"}
            ops = []
            for t in range(k - 1):
                y = j - t - 1
                ops += [put(j - t, 0), wait,
                        {"name": "re", "src_buff": chunk(y, "i") + chunk(y, "s"),
                         "dst_buff": chunk(y, "i"), "reduce_op": "sum"}]
            for u in range(k - 1):
                ops += [put(j + 1 - u, 1), wait]
            parts = _segments(ops, sems)
            sems += len(parts) - 1
            for part in parts:
                tbs.append({"id": len(tbs), "ops": part,
                            "channels": [{"channel_type": "port",
                                          "channel_ids": [send, recv]}],
                            "remote_buffer_refs": [{"access_channel_type": "port",
                                                    "remote_buffer_ids": [2 * c, 2 * c + 1]}]})
        if sems > MAX_DEVICE_SEMAPHORES:
            raise PlanCheckError(f"{nring} rings of {k} ranks need {sems} device semaphores "
                                 f"to chain their threadblocks; MSCCL++ has "
                                 f"{MAX_DEVICE_SEMAPHORES}")
        gpus.append({"id": q, "input_chunks": nring * k, "output_chunks": nring * k,
                     "scratch_chunks": nring * k, "threadblocks": tbs,
                     "channels": [{"channel_type": "port", "connected_to": peers}],
                     "remote_buffers": remote, "semaphores": [{"init_value": 0}] * sems})
    return {"name": name, "collective": "allreduce", "protocol": "Simple", "inplace": True,
            "reuse_resources": False, "gpus": gpus, "num_threads_per_block": 1024,
            "use_double_scratch_buffer": False, "buffer_alignment": 16,
            "min_message_size": 0, "max_message_size": 2**64 - 1}


def plan_mscclpp_allreduce(rings: Rings) -> dict:
    """The plan's MSCCL++ AllReduce: the largest group's rings, ranks in the order of
    its first ring (``rank_order.txt``).

    Raises
    ------
    PlanCheckError
        No AllReduce group of 3 or more servers.
    """
    largest = largest_group(rings)
    if largest is None:
        raise PlanCheckError("the plan has no AllReduce group")
    _, orders = largest
    position = {s: i for i, s in enumerate(orders[0])}
    return mscclpp_ring_allreduce([[position[s] for s in order] for order in orders])


def format_mscclpp_plan(plan: dict) -> str:
    """The JSON text, compact (the executor parses it with nlohmann::json)."""
    return json.dumps(plan, separators=(",", ":")) + "\n"


@dataclass(frozen=True)
class MscclppPlan:
    """A parsed execution plan: the document and, per rank, its port channel peers,
    remote buffers ``(owner, type)`` and per threadblock its channel and buffer lists."""

    doc: dict
    peers: tuple[tuple[int, ...], ...]
    remote: tuple[tuple[tuple[int, str], ...], ...]
    tb_channels: tuple[tuple[tuple[int, ...], ...], ...]
    tb_buffers: tuple[tuple[tuple[int, ...], ...], ...]


def _need(obj: dict, key: str, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise PlanCheckError(f"{where} has no {key!r} (execution_plan.cc reads it)")
    return obj[key]


def parse_mscclpp_plan(text: str) -> MscclppPlan:
    """Read an execution plan by MSCCL++'s executor rules.

    Rules (``src/core/executor/execution_plan.cc``, commit 1f5f065): ``name``,
    ``collective``, ``inplace``, ``protocol``, ``gpus`` present (lines 126-128,
    242-254); ``gpus[r]["id"] == r`` (line 257); ``input_chunks``, ``output_chunks``,
    ``scratch_chunks`` (lines 260-262), not both input and output 0; channel types
    and buffer types known (lines 91-115); every op name known (lines 25-88);
    ``connected_to`` peers are ranks (line 334); remote buffers name a rank and type
    (lines 350-355); a threadblock's ``channel_ids`` index the rank's channels of
    that type (line 402) and its ``remote_buffer_ids`` the rank's remote buffers
    (line 430), at most 16 of each (``MAX_CHANNEL``, execution_common.hpp line 15) and
    64 ops (``MAX_OPERATION``, line 17; executor.cc line 478); ``semaphore_ids`` index
    the rank's ``semaphores`` (line 452, at most 16, execution_common.hpp line 20);
    an op's ``channel_ids`` and ``buffer_id`` index the threadblock's lists
    (lines 510-532, used as ``portChannels_[channelIndex]``); chunk ``index + size`` within
    the buffer's chunks; channels between two ranks are paired (each rank lists as
    many to the other, line 147); a put's channel reaches the remote buffer's owner.

    Raises
    ------
    PlanCheckError
        Naming the first rule broken.
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise PlanCheckError(f"not JSON: {exc}") from None
    for key in ("name", "collective", "inplace", "protocol"):
        _need(doc, key, "the plan")
    gpus = _need(doc, "gpus", "the plan")
    n = len(gpus)
    peers, remote, tb_ch, tb_buf = [], [], [], []
    for r, g in enumerate(gpus):
        if _need(g, "id", f"gpus[{r}]") != r:
            raise PlanCheckError(f"gpus[{r}] has id {g['id']} (execution_plan.cc line 257)")
        chunks = [_need(g, k, f"gpus[{r}]") for k in ("input_chunks", "output_chunks",
                                                      "scratch_chunks")]
        if chunks[0] == 0 and chunks[1] == 0:
            raise PlanCheckError(f"gpus[{r}]: input and output chunks are 0")
        mine: list[int] = []
        for ch in _need(g, "channels", f"gpus[{r}]"):
            if ch.get("channel_type") not in _CHANNELS:
                raise PlanCheckError(f"gpus[{r}]: channel type {ch.get('channel_type')!r}")
            if ch["channel_type"] == "port":
                mine += [int(p) for p in ch["connected_to"]]
        if any(not 0 <= p < n or p == r for p in mine):
            raise PlanCheckError(f"gpus[{r}]: a port channel to a rank that is not a peer")
        bufs = []
        for b in _need(g, "remote_buffers", f"gpus[{r}]"):
            if b.get("type") not in _BUFFERS or not 0 <= b.get("rank", -1) < n:
                raise PlanCheckError(f"gpus[{r}]: remote buffer {b}")
            bufs.append((int(b["rank"]), b["type"]))
        chans, refs = [], []
        for i, tb in enumerate(_need(g, "threadblocks", f"gpus[{r}]")):
            if tb.get("id") != i:
                raise PlanCheckError(f"gpus[{r}] threadblock {i} has id {tb.get('id')}")
            ids = [x for c in tb.get("channels", []) if c["channel_type"] == "port"
                   for x in c["channel_ids"]]
            rid = [x for c in tb.get("remote_buffer_refs", [])
                   if c["access_channel_type"] == "port" for x in c["remote_buffer_ids"]]
            if any(not 0 <= x < len(mine) for x in ids) or any(
                    not 0 <= x < len(bufs) for x in rid):
                raise PlanCheckError(f"gpus[{r}] tb {i}: a channel or buffer id out of range")
            if len(ids) > MAX_CHANNEL or len(rid) > MAX_CHANNEL:
                raise PlanCheckError(f"gpus[{r}] tb {i}: over {MAX_CHANNEL} channels or "
                                     "buffers (execution_common.hpp line 15)")
            if len(tb.get("ops", [])) > MAX_OPERATION:
                raise PlanCheckError(f"gpus[{r}] tb {i}: {len(tb['ops'])} ops, MSCCL++ runs "
                                     f"{MAX_OPERATION} (executor.cc line 478)")
            nsem = len(g.get("semaphores", []))
            if nsem > MAX_DEVICE_SEMAPHORES or any(
                    not 0 <= s < nsem for op in tb.get("ops", [])
                    for s in op.get("semaphore_ids", [])):
                raise PlanCheckError(f"gpus[{r}] tb {i}: a semaphore id beyond the rank's "
                                     f"{nsem} semaphores")
            chans.append(tuple(ids))
            refs.append(tuple(rid))
            _check_ops(tb, r, i, chunks, ids, rid, mine, bufs)
        peers.append(tuple(mine))
        remote.append(tuple(bufs))
        tb_ch.append(tuple(chans))
        tb_buf.append(tuple(refs))
    for a in range(n):
        for b in set(peers[a]):
            if peers[a].count(b) != peers[b].count(a):
                raise PlanCheckError(f"ranks {a} and {b} list unequal port channels to each "
                                     "other (execution_plan.cc line 147)")
    return MscclppPlan(doc, tuple(peers), tuple(remote), tuple(tb_ch), tuple(tb_buf))


def _check_ops(tb: dict, r: int, i: int, chunks: list[int], ids: list[int], rid: list[int],
               mine: list[int], bufs: list[tuple[int, str]]) -> None:
    """The ops of threadblock ``i`` of rank ``r`` (see :func:`parse_mscclpp_plan`)."""
    size = dict(zip(_BUFFERS, chunks))
    for o, op in enumerate(_need(tb, "ops", f"gpus[{r}] tb {i}")):
        where = f"gpus[{r}] tb {i} op {o}"
        if op.get("name") not in OP_NAMES:
            raise PlanCheckError(f"{where}: unknown operation {op.get('name')!r} "
                                 "(execution_plan.cc line 87)")
        if any(not 0 <= c < len(ids) for c in op.get("channel_ids", [])):
            raise PlanCheckError(f"{where}: channel id beyond the threadblock's channels")
        for key in ("src_buff", "dst_buff"):
            for b in op.get(key, []):
                if "buffer_id" in b:
                    if not 0 <= b["buffer_id"] < len(rid):
                        raise PlanCheckError(f"{where}: buffer_id beyond the threadblock's")
                    owner, kind = bufs[rid[b["buffer_id"]]]
                    chans = [mine[ids[c]] for c in op.get("channel_ids", [])]
                    if owner not in chans:
                        raise PlanCheckError(f"{where}: writes rank {owner}'s buffer over a "
                                             "channel that does not reach it")
                else:
                    kind = b.get("type")
                if kind not in _BUFFERS or not 0 <= b["index"] < b["index"] + b["size"] \
                        <= size[kind]:
                    raise PlanCheckError(f"{where}: chunks {b} outside buffer {kind!r}")


def simulate_mscclpp(plan: MscclppPlan, inputs: np.ndarray) -> np.ndarray:
    """Run the plan's ops (``pws``/``pwsf``/``put``, ``signal``, ``wait``, ``re``) on
    integer chunks, every threadblock as far as its waits allow; return each rank's
    input buffer at the end.

    Raises
    ------
    PlanCheckError
        A deadlock, or an op the simulator does not model.
    """
    doc = plan.doc
    n = len(doc["gpus"])
    bufs = [{"i": inputs[r].astype(np.int64).copy(),
             "s": np.zeros(doc["gpus"][r]["scratch_chunks"], np.int64)} for r in range(n)]
    pending: dict[tuple[int, int, int], int] = {}   # (from, to, k-th channel) -> signals
    sem: dict[tuple[int, int], int] = {}
    pos = {(r, t): 0 for r in range(n) for t in range(len(doc["gpus"][r]["threadblocks"]))}
    # the k-th channel of a to b pairs with the k-th of b to a
    def slot(r: int, gch: int) -> tuple[int, int, int]:
        peer = plan.peers[r][gch]
        return r, peer, plan.peers[r][:gch].count(peer)
    progress = True
    while progress:
        progress = False
        for (r, t), at in pos.items():
            ops = doc["gpus"][r]["threadblocks"][t]["ops"]
            while at < len(ops):
                op = ops[at]
                chans = [plan.tb_channels[r][t][c] for c in op.get("channel_ids", [])]
                if op["name"] == "wait":
                    a, b, kth = slot(r, chans[0])
                    if pending.get((b, a, kth), 0) == 0:
                        break
                    pending[(b, a, kth)] -= 1
                elif op["name"] in ("put", "pws", "pwsf", "signal"):
                    for q, d in enumerate(op.get("dst_buff", [])):
                        owner, kind = plan.remote[r][plan.tb_buffers[r][t][d["buffer_id"]]]
                        s = op["src_buff"][q]
                        bufs[owner][kind][d["index"]:d["index"] + d["size"]] = \
                            bufs[r][s["type"]][s["index"]:s["index"] + s["size"]]
                    if op["name"] != "put":
                        key = slot(r, chans[0])
                        pending[key] = pending.get(key, 0) + 1
                elif op["name"] == "sem_acquire":
                    held = (r, op["semaphore_ids"][0])
                    if sem.get(held, 0) == 0:
                        break
                    sem[held] -= 1
                elif op["name"] == "sem_release":
                    held = (r, op["semaphore_ids"][0])
                    sem[held] = sem.get(held, 0) + 1
                elif op["name"] == "re":
                    d = op["dst_buff"][0]
                    total = sum(bufs[r][s["type"]][s["index"]:s["index"] + s["size"]]
                                for s in op["src_buff"])
                    bufs[r][d["type"]][d["index"]:d["index"] + d["size"]] = total
                elif op["name"] != "nop":
                    raise PlanCheckError(f"the simulator does not model op {op['name']!r}")
                at += 1
                progress = True
            pos[(r, t)] = at
    stuck = [(r, t) for (r, t), at in pos.items()
             if at < len(doc["gpus"][r]["threadblocks"][t]["ops"])]
    if stuck:
        raise PlanCheckError(f"the plan deadlocks: rank {stuck[0][0]} threadblock "
                             f"{stuck[0][1]} waits forever")
    return np.stack([b["i"] for b in bufs])
