"""What a transformer's parallelism sends, per GPU on NVLink and per server pair on the network.

GPU rank ``r`` is on server ``r // gpus_per_server``; a flow between two GPUs of one
server crosses NVLink, any other the network. Per iteration (m micro-batches):

* **TP** (NVLink only): per layer and micro-batch 2 AllReduces of the layer's
  ``T h`` activations forward and 2 backward (2 more when the forward is recomputed),
  each a ring over the ``tp`` GPUs (Narayanan et al. SC'21 §2.3, Fig. 4; with sequence
  parallelism the same bytes as reduce-scatter + all-gather, Korthikanti et al. §4.2.2).
* **PP**: per micro-batch, each stage sends its output activations ``T h`` to the next
  stage and gets their gradient back; each of the ``tp`` GPUs sends ``1/tp`` of it to
  its counterpart (the scatter/gather optimisation, Narayanan §4.1). With ``v`` model
  chunks per stage, ``v`` times per micro-batch.
* **EP**: per MoE layer and micro-batch, two all-to-alls forward (dispatch the tokens to
  their experts, combine the results) and two backward (two more when recomputed) among
  the ``ep`` GPUs of an expert group. Each GPU dispatches its ``T / tp`` tokens
  (sequence-parallel shard) ``top_k x capacity_factor`` times, ``1/ep`` of them to each
  member (Lepikhin et al. GShard §2.2; Megatron-Core's all-to-all dispatcher), and
  all-gathers them over the tensor-parallel group on NVLink.
* **DP**: once per iteration, each (stage, tensor rank) group all-reduces its GPU's
  gradients (dense parameters over ``dp`` replicas, routed experts over the ``dp / ep``
  replicas of the same experts). On servers: the GPUs of a group on one server first
  reduce on NVLink, then the group's servers run a ring of the group's gradient bytes;
  groups on the same servers (the ``tp`` tensor ranks of a stage) merge into one
  server-level group carrying their sum (each GPU has its own NIC).
* **CP** (context parallelism, ``cp > 1``): each GPU holds ``1 / cp`` of a sequence;
  per layer and micro-batch the ``cp`` GPUs of a group pass their K and V blocks
  (``2 x kv / tp`` wide, at least one head) around a ring, ``cp - 1`` steps forward,
  twice that backward (K, V and their gradients), once more when recomputed
  (Megatron-Core's ring attention, ``--context-parallel-size``; Llama 3 §3.3.2
  all-gathers the same bytes). Activations, TP, PP and EP bytes are per GPU's
  ``1 / cp`` of the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from topoopt.llm.memory import stage_params
from topoopt.llm.parallel import LLMParallel, communicator_groups, gpu_coordinates, stage_layers
from topoopt.traffic import AllReduceGroup, Traffic, Transfers
from topoopt.workloads.gpt import TransformerShape

__all__ = ["LLMTraffic", "llm_traffic", "finder_traffic", "KINDS", "alltoall_bytes_per_gpu"]

#: The traffic kinds of an LLM job.
KINDS = ("tp", "pp", "ep", "dp")


@dataclass(frozen=True)
class LLMTraffic:
    """Server-level traffic of one iteration, as events that run concurrently.

    Attributes
    ----------
    servers, gpus_per_server : int
    pp_step : ndarray (servers, servers)
        Bytes of one pipeline step: every stage boundary sends one micro-batch chunk's
        activations (all boundaries at once, as in the 1F1B steady state). The
        gradients of the backward step are its transpose.
    pp_steps : int
        Forward steps per iteration (``m v``); as many backward.
    pp_nvlink : float
        Bytes one GPU sends over NVLink in one pipeline step (boundaries inside a server).
    ep_step : ndarray (servers, servers)
        Bytes of one all-to-all of one MoE layer in every expert group at once.
    ep_steps_per_micro_batch : int
        All-to-alls per micro-batch on the busiest stage (4 or 6 per MoE layer).
    ep_nvlink : float
        Bytes one GPU sends over NVLink in one all-to-all (members on its server,
        and the all-gather over the tensor-parallel group).
    dp_groups : tuple of AllReduceGroup
        Server-level AllReduce groups (dense and expert gradients), merged by members.
    dp_nvlink : float
        Bytes one GPU moves over NVLink in the DP reduction (intra-server part).
    tp_nvlink_per_micro_batch : float
        Bytes one GPU of the busiest stage sends over NVLink for TP per micro-batch.
    micro_batches : int
    cp_step : ndarray (servers, servers)
        Bytes of one ring step of every context-parallel group at once (empty: cp 1).
    cp_steps_per_micro_batch : int
        Ring steps per micro-batch on the busiest stage.
    cp_nvlink : float
        Bytes one GPU sends over NVLink in one ring step.
    """

    servers: int
    gpus_per_server: int
    pp_step: np.ndarray = field(repr=False)
    pp_steps: int
    pp_nvlink: float
    ep_step: np.ndarray = field(repr=False)
    ep_steps_per_micro_batch: int
    ep_nvlink: float
    dp_groups: tuple[AllReduceGroup, ...]
    dp_nvlink: float
    tp_nvlink_per_micro_batch: float
    micro_batches: int
    cp_step: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    cp_steps_per_micro_batch: int = 0
    cp_nvlink: float = 0.0

    def _cp_matrix(self) -> np.ndarray:
        return self.cp_step if self.cp_step.size else np.zeros((self.servers, self.servers))

    def network_bytes(self) -> dict[str, float]:
        """Bytes per iteration each kind puts on the network (all servers' sends);
        ``cp`` only with context parallelism."""
        out = {"tp": 0.0,
                "pp": 2.0 * self.pp_steps * float(self.pp_step.sum()),
                "ep": self.micro_batches * self.ep_steps_per_micro_batch
                * float(self.ep_step.sum()),
               "dp": float(sum(g.network_bytes for g in self.dp_groups))}
        if self.cp_steps_per_micro_batch:
            out["cp"] = (self.micro_batches * self.cp_steps_per_micro_batch
                         * float(self._cp_matrix().sum()))
        return out

    def nvlink_bytes(self) -> dict[str, float]:
        """Bytes per iteration each kind moves over NVLink (all GPUs' sends, the
        busiest stage's rate times all GPUs: an upper bound for uneven stages)."""
        n = self.servers * self.gpus_per_server
        out = {"tp": n * self.micro_batches * self.tp_nvlink_per_micro_batch,
                "pp": n * 2.0 * self.pp_steps * self.pp_nvlink,
                "ep": n * self.micro_batches * self.ep_steps_per_micro_batch * self.ep_nvlink,
               "dp": n * self.dp_nvlink}
        if self.cp_steps_per_micro_batch:
            out["cp"] = n * self.micro_batches * self.cp_steps_per_micro_batch * self.cp_nvlink
        return out

    def dp_matrix(self, rings: Mapping[tuple[int, ...], Sequence[tuple[int, ...]]] | None = None
                  ) -> np.ndarray:
        """Server-to-server bytes of the DP AllReduces as rings (``rings``: a group's
        members -> its ring orders, the bytes split evenly; member order by default)."""
        # every ring hop gathered first and added at once: one n x n array, not one per ring
        total = np.zeros((self.servers, self.servers))
        src, dst, nbytes = self._dp_hops(rings)
        if src.size:
            np.add.at(total, (src, dst), nbytes)
        return total

    def dp_loads(self) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each server sends and receives in the DP AllReduces as member-order
        rings: the row and column sums of :meth:`dp_matrix`, without its ``n x n``
        array (the Ideal Switch's closed form needs no more; 32 MB at 2,048 servers)."""
        n = self.servers
        src, dst, nbytes = self._dp_hops()
        return np.bincount(src, nbytes, minlength=n), np.bincount(dst, nbytes, minlength=n)

    def _dp_hops(self, rings: Mapping[tuple[int, ...], Sequence[tuple[int, ...]]] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every DP ring hop: sender, receiver and bytes, ring by ring in group order."""
        src, dst, nbytes = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
        for grp in self.dp_groups:
            orders = (rings or {}).get(grp.members, [grp.members])
            for order in orders:
                if len(order) > 1:
                    o = np.asarray(order, dtype=np.int64)
                    src.append(o)
                    dst.append(np.roll(o, -1))
                    nbytes.append(np.full(o.size, grp.ring_bytes_per_pair / len(orders)))
        return np.concatenate(src), np.concatenate(dst), np.concatenate(nbytes)

    def mp_matrix(self) -> np.ndarray:
        """PP, EP and CP bytes per iteration between servers (TopologyFinder's MP demand)."""
        pp = self.pp_steps * (self.pp_step + self.pp_step.T)
        if self.cp_steps_per_micro_batch:
            pp = pp + self.micro_batches * self.cp_steps_per_micro_batch * self.cp_step
        if self.micro_batches * self.ep_steps_per_micro_batch == 0:   # no MoE: + 0
            return pp
        return pp + self.micro_batches * self.ep_steps_per_micro_batch * self.ep_step


def alltoall_bytes_per_gpu(shape: TransformerShape, par: LLMParallel, tokens: int,
                           dtype_bytes: int) -> float:
    """Bytes one GPU sends to each other member of its expert group in one all-to-all:
    its ``tokens / tp`` tokens, ``top_k x capacity_factor`` copies, ``1 / ep`` each."""
    return (tokens / par.tp * shape.top_k * shape.capacity_factor * shape.hidden * dtype_bytes
            / par.ep)


def _pairs_to_servers(src: np.ndarray, dst: np.ndarray, nbytes: float, g: int, n: int
                      ) -> tuple[np.ndarray, float]:
    """Server matrix of GPU flows ``src -> dst`` of ``nbytes`` each, and the most bytes
    one GPU sends to GPUs of its own server."""
    m = np.zeros((n, n))
    su, sv = src // g, dst // g
    cross = su != sv
    np.add.at(m, (su[cross], sv[cross]), nbytes)
    intra = np.bincount(src[~cross], minlength=n * g).max() * nbytes if (~cross).any() else 0.0
    return m, float(intra)


def llm_traffic(shape: TransformerShape, par: LLMParallel, servers: int, gpus_per_server: int,
                global_batch: int, dtype_bytes: int) -> LLMTraffic:
    """The traffic of one iteration of ``shape`` under ``par`` (see the module notes).

    Examples
    --------
    GPT-3 175B, tp 8, pp 8, dp 16 on 128 servers of 8 GPUs: one server per (stage,
    replica); 8 DP groups of 16 servers (one per stage, the 8 tensor ranks merged).

    >>> from topoopt.workloads import build_model
    >>> from topoopt.workloads.gpt import transformer_shape
    >>> s = transformer_shape(build_model("gpt3-175b"))
    >>> t = llm_traffic(s, LLMParallel(8, 8, 16, micro_batches=96), 128, 8, 1536, 2)
    >>> len(t.dp_groups), {len(g.members) for g in t.dp_groups}
    (8, {16})
    """
    g, n = gpus_per_server, servers
    groups = communicator_groups(par)
    # one GPU's tokens of a micro-batch: 1 / cp of its sequences
    mb_tokens = global_batch // par.dp // par.micro_batches * shape.seq // par.cp
    layers = stage_layers(shape.layers, par.pp, par.virtual, par.edge_layers)
    busiest = max(layers)
    # PP: rank r of stage p sends to rank of stage p + 1 (and the last to the first with
    # interleaving); one step = every boundary once
    pp = np.array(groups["pp"], dtype=np.int64).reshape(-1, par.pp)
    src, dst = pp[:, :-1].ravel(), pp[:, 1:].ravel()
    if par.virtual > 1:
        src, dst = np.concatenate([src, pp[:, -1]]), np.concatenate([dst, pp[:, 0]])
    act = mb_tokens * shape.hidden * dtype_bytes / par.tp
    if par.pp > 1:
        pp_step, pp_nv = _pairs_to_servers(src, dst, act, g, n)
    else:
        pp_step, pp_nv = np.zeros((n, n)), 0.0
    # EP: all-to-all within each expert group
    per_alltoall = 6 if par.recompute == "full" else 4
    ep_step, ep_nv, ep_count = np.zeros((n, n)), 0.0, 0
    tp_ag = 0.0
    if shape.moe:
        ep_count = per_alltoall * busiest
        tp_ag = (mb_tokens * shape.top_k * shape.capacity_factor * shape.hidden * dtype_bytes
                 * (par.tp - 1) / par.tp)
        if par.ep > 1:
            ep = np.array(groups["ep"], dtype=np.int64)
            a = np.repeat(ep, par.ep, axis=1).ravel()
            b = np.tile(ep, (1, par.ep)).ravel()
            keep = a != b
            ep_step, ep_nv = _pairs_to_servers(a[keep], b[keep],
                                               alltoall_bytes_per_gpu(shape, par, mb_tokens,
                                                                      dtype_bytes), g, n)
        ep_nv += tp_ag / 2   # the all-gather before, the reduce-scatter after: half each
    # DP: per (stage, tensor rank) group
    dense, expert = stage_params(shape, par)
    edp_separate = bool(groups["edp"])
    merged: dict[tuple[int, ...], float] = {}
    dp_nv = 0.0

    def add(members: tuple[int, ...], nbytes: float) -> None:
        nonlocal dp_nv
        srv = np.asarray(members) // g
        key = tuple(int(x) for x in np.unique(srv))
        per_server = len(members) // len(key)
        if per_server > 1:
            dp_nv = max(dp_nv, 2.0 * (per_server - 1) / per_server * nbytes)
        if len(key) > 1 and nbytes > 0:
            merged[key] = merged.get(key, 0.0) + nbytes

    for grp in groups["dp"]:
        p = gpu_coordinates(par, grp[0])[1]
        nbytes = dense[p] + (0.0 if edp_separate or par.ep == par.dp and par.ep > 1
                             else expert[p])
        add(grp, nbytes * dtype_bytes)
    for grp in groups["edp"]:
        add(grp, expert[gpu_coordinates(par, grp[0])[1]] * dtype_bytes)
    dp_groups = tuple(AllReduceGroup(k, v, ("stage gradients",)) for k, v in sorted(merged.items()))
    # TP: 4 AllReduces per layer (6 recomputed), ring over tp GPUs
    tp_per = (per_alltoall * busiest * mb_tokens * shape.hidden * dtype_bytes
              * 2.0 * (par.tp - 1) / par.tp)
    cp_step, cp_nv, cp_count = _cp_ring(shape, par, groups, mb_tokens, dtype_bytes, g, n,
                                        busiest)
    return LLMTraffic(n, g, pp_step, par.micro_batches * par.virtual, pp_nv, ep_step,
                      ep_count, ep_nv, dp_groups, dp_nv, tp_per, par.micro_batches,
                      cp_step, cp_count, cp_nv)


def _cp_ring(shape: TransformerShape, par: LLMParallel,
             groups: Mapping[str, tuple[tuple[int, ...], ...]], tokens: int,
             dtype_bytes: int, g: int, n: int, layers: int) -> tuple[np.ndarray, float, int]:
    """One ring step of every context-parallel group (each GPU sends its K and V block
    of ``tokens`` to the next member), its NVLink bytes, and the steps per micro-batch."""
    if par.cp == 1:
        return np.zeros((0, 0)), 0.0, 0
    kv = max(shape.kv_dim / par.tp, shape.head_dim)   # heads split tp ways, one at least
    block = 2.0 * kv * tokens * dtype_bytes
    ring = np.array(groups["cp"], dtype=np.int64)
    step, nv = _pairs_to_servers(ring.ravel(), np.roll(ring, -1, axis=1).ravel(), block, g, n)
    passes = 4 if par.recompute == "full" else 3    # forward, backward twice, recompute
    return step, nv, passes * (par.cp - 1) * layers



def finder_traffic(traffic: LLMTraffic) -> Traffic:
    """The traffic TopologyFinder plans for: the DP groups as AllReduce groups, PP and
    EP bytes per iteration as the MP matrix (TopoOpt §4: rings for AllReduce, matchings
    for the rest)."""
    mp = traffic.mp_matrix()
    np.fill_diagonal(mp, 0.0)
    empty = np.zeros(0, dtype=np.int64)
    return Traffic(traffic.servers, traffic.dp_groups, mp,
                   Transfers(empty, empty, np.zeros(0), empty, empty))
