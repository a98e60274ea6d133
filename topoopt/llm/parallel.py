"""Megatron-style parallelism of a transformer: degrees, schedule, rank order, communicators.

A :class:`LLMParallel` splits a job's ``tp x pp x dp`` GPUs into tensor-parallel groups
inside a server (NVLink), pipeline stages and data-parallel replicas across servers, and
-- for a mixture of experts -- expert-parallel groups of ``ep`` data-parallel ranks that
exchange tokens by all-to-all. :func:`communicator_groups` lists every communicator as
GPU ranks, the way Megatron-LM's ``parallel_state`` builds them; GPU rank ``r`` sits on
server ``r // gpus_per_server``, which is how the groups become server-level traffic
(:mod:`topoopt.llm.traffic`).

References
----------
.. [1] D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
   Clusters Using Megatron-LM", SC'21: §2.2 (1F1B and its bubble (p - 1) / m, the
   interleaved schedule's (p - 1) / (v m)), §2.3 (tensor parallelism), §3 (degrees).
.. [2] D. Lepikhin et al., "GShard", ICLR 2021; W. Fedus et al., "Switch
   Transformers", JMLR 2022: expert parallelism over data-parallel ranks.
.. [3] S. Rajbhandari et al., "ZeRO", SC'20, §5.1 (optimizer-state partitioning, P_os).
.. [4] A. Grattafiori et al., "The Llama 3 Herd of Models", arXiv 2407.21783, §3.3.2:
   context parallelism (the sequence split over ``cp`` GPUs, K and V exchanged), one
   layer fewer on the first and the last pipeline stage, FSDP's sharded gradients.
.. [5] NVIDIA Megatron-Core, ``parallel_state`` (rank order ``tp-cp-ep-dp-pp``: the
   context-parallel rank varies right after the tensor rank; gradients are reduced
   over the data- and context-parallel ranks together) and ``--context-parallel-size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Mapping

from topoopt._require import require_choice, require_int
from topoopt.cluster import ATTENTION, Cluster
from topoopt.errors import ConfigError
from topoopt.kernels import attention_kernel
from topoopt.workloads.gpt import TransformerShape

__all__ = ["RECOMPUTE", "ORDERS", "LLMParallel", "check_parallel", "communicator_groups",
           "cp_rank",
           "gpu_coordinates", "stage_layers"]

#: Activation recomputation: none, selective (attention scores and softmax only;
#: Korthikanti et al. 2022 §4.2), full (every layer's forward again in backward).
RECOMPUTE = ("none", "selective", "full")

#: Rank orders, fastest-varying first (Megatron's ``order``): where consecutive GPUs,
#: hence servers, go. ``tp-dp-pp`` (Megatron's default) puts a stage's replicas on
#: neighbouring servers; ``tp-pp-dp`` a replica's stages. Expert-parallel groups are
#: consecutive data-parallel ranks in both.
ORDERS = ("tp-dp-pp", "tp-pp-dp")


@dataclass(frozen=True)
class LLMParallel:
    """How a transformer is split over ``tp x pp x dp`` GPUs.

    Attributes
    ----------
    tp, pp, dp : int
        Tensor-, pipeline- and data-parallel degrees; ``tp`` divides the GPUs of a
        server (tensor parallelism stays on NVLink).
    ep : int
        Expert-parallel degree: routed experts are spread over ``ep`` data-parallel
        ranks (``ep`` divides ``dp`` and the expert count); 1 for a dense model.
        Experts are tensor-split ``tp`` ways like the dense layers.
    micro_batches : int
        m, micro-batches per iteration per pipeline (divides the sequences of one
        data-parallel replica).
    zero1 : bool
        Optimizer states sharded over the data-parallel group (ZeRO stage 1; the
        gradient AllReduce becomes reduce-scatter + all-gather: the same bytes).
    recompute : str
        One of :data:`RECOMPUTE`.
    order : str
        One of :data:`ORDERS`.
    virtual : int
        v, model chunks per stage of the interleaved 1F1B schedule (1: plain 1F1B).
    attention : str
        The attention kernel, one of :data:`topoopt.cluster.ATTENTION` (a config's
        ``[job] attention``): ``auto`` (default), the newest fused kernel published for
        the GPU; ``flash2`` or ``flash3``, FlashAttention-2 or -3 at its own published
        rate (:func:`topoopt.kernels.attention_kernel`), fused kernels that keep no
        ``s x s`` scores for the backward; ``unfused``, the kernels of Megatron-LM
        SC'21, whose scores and softmax are activations. Checked against the GPU by
        :func:`check_parallel`.
    cp : int
        Context-parallel degree: each sequence is split over ``cp`` GPUs (consecutive
        ranks after the tensor rank, Megatron's order), which exchange K and V around
        a ring; activations and attention are ``1 / cp`` per GPU. ``2 cp`` divides the
        sequence (the load-balanced causal split of ``2 cp`` chunks).
    edge_layers : int
        Layers fewer on the first and on the last pipeline stage, which also hold the
        embedding and the output projection (Llama 3 §3.3.2 uses 1; Megatron-core's
        ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-...``).
    shard_grads : bool
        Gradients sharded over the data-parallel group too (ZeRO-2 / FSDP, as Llama 3
        trained), not only the optimizer states (``zero1``): once reduced. Accumulated
        over ``m > 1`` micro-batches they are whole until the reduction after the last
        one (:func:`topoopt.llm.memory.memory_per_gpu`).
    recompute_norms : bool
        The two norms' outputs (the QKV and first MLP GEMMs' inputs) are not kept but
        recomputed in the backward from the norm inputs that are: Megatron-core's
        output-discarding ``--recompute-modules layernorm`` ("recompute the
        input_layernorm and pre_mlp_layernorm").
    recompute_act : bool
        The MLP activation's output (the second GEMM's input) is not kept but
        recomputed in the backward from the first GEMM's output: Megatron-core's
        output-discarding ``--recompute-modules moe_act`` for experts; for a dense
        SwiGLU, xformers' fused ``SwiGLU`` (``xformers/ops/swiglu_op.py``,
        ``_SwiGLUFusedFunc``: it saves the input, gate and up, and ``silu_bw_fused``
        rebuilds their product in the backward).
    """

    tp: int
    pp: int
    dp: int
    ep: int = 1
    micro_batches: int = 1
    zero1: bool = False
    recompute: str = "none"
    order: str = "tp-dp-pp"
    virtual: int = 1
    attention: str = "auto"
    cp: int = 1
    edge_layers: int = 0
    shard_grads: bool = False
    recompute_norms: bool = False
    recompute_act: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "micro_batches", "virtual", "cp"):
            require_int(f"parallel.{name}", getattr(self, name), minimum=1)
        require_int("parallel.edge_layers", self.edge_layers, minimum=0)
        require_choice("parallel.recompute", self.recompute, RECOMPUTE)
        require_choice("parallel.order", self.order, ORDERS)
        require_choice("job.attention", self.attention, ATTENTION)
        if self.dp % self.ep:
            raise ConfigError("parallel.ep", self.ep, f"must divide dp = {self.dp}")

    @property
    def flash_attention(self) -> bool:
        """Whether attention is fused (keeps no ``s x s`` scores): not ``unfused``."""
        return self.attention != "unfused"

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def grad_replicas(self) -> int:
        """GPUs holding the same dense weights: ``dp x cp`` (gradients are reduced, and
        the distributed optimizer shards, over data- and context-parallel ranks)."""
        return self.dp * self.cp

    @property
    def bubble(self) -> float:
        """The 1F1B pipeline bubble as a fraction of the ideal time: (p - 1) / (v m)."""
        return (self.pp - 1) / (self.virtual * self.micro_batches)

    def label(self) -> str:
        """``tp8 pp8 dp16 ep1 m96`` and the switches that are on."""
        extra = [x for x, on in ((f"cp{self.cp}", self.cp > 1), ("zero1", self.zero1),
                                 ("shard-grads", self.shard_grads),
                                 ("rc-norms", self.recompute_norms),
                                 ("rc-act", self.recompute_act),
                                 (f"edge-{self.edge_layers}", self.edge_layers > 0),
                                 (f"recompute={self.recompute}",
                                                          self.recompute != "none"),
                                 (f"v{self.virtual}", self.virtual > 1),
                                 (self.attention, self.attention != "auto"),
                                 (self.order, self.order != ORDERS[0])) if on]
        return " ".join([f"tp{self.tp} pp{self.pp} dp{self.dp} ep{self.ep} "
                         f"m{self.micro_batches}", *extra])

    def to_dict(self) -> dict:
        """The fields, for :class:`LLMParallel` ``(**d)``; ``cp``, ``edge_layers``,
        ``shard_grads``, the two recompute switches and ``attention`` only when set
        (documents written before them stay the same). ``flash_attention`` is written
        as before, derived from ``attention``, and read back by :func:`from_dict`."""
        d = dict(tp=self.tp, pp=self.pp, dp=self.dp, ep=self.ep,
                 micro_batches=self.micro_batches, zero1=self.zero1,
                 recompute=self.recompute, order=self.order, virtual=self.virtual,
                 flash_attention=self.flash_attention)
        for key, default in (("cp", 1), ("edge_layers", 0), ("shard_grads", False),
                             ("attention", "auto"),
                             ("recompute_norms", False), ("recompute_act", False)):
            if getattr(self, key) != default:
                d[key] = getattr(self, key)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "LLMParallel":
        """The inverse of :meth:`to_dict` (a document written before ``attention``
        says ``flash_attention = false`` for the unfused kernels)."""
        d = dict(d)
        flash = d.pop("flash_attention", True)
        if not flash and d.get("attention", "unfused") != "unfused":
            raise ConfigError("parallel.flash_attention", flash,
                              f"contradicts attention = {d['attention']}")
        if not flash:
            d["attention"] = "unfused"
        return cls(**d)


def stage_layers(layers: int, pp: int, virtual: int = 1, edge: int = 0) -> tuple[int, ...]:
    """Transformer layers of each pipeline stage: as even as possible, the first
    stages taking the remainder (Megatron requires ``layers % (pp v) == 0``; an uneven
    split is allowed here and charged at its largest stage). With ``edge``, the first
    chunk of the first stage and the last chunk of the last stage get ``edge`` layers
    fewer than the others (Llama 3 §3.3.2: 126 layers on 16 stages as 7, 8 x 14, 7)."""
    chunks = pp * virtual
    if pp == 1:
        edge = 0
    base, extra = divmod(layers + 2 * edge, chunks)
    per_chunk = [base + (1 if c < extra else 0) for c in range(chunks)]
    if edge:
        per_chunk[0] -= edge
        per_chunk[-1] -= edge
    # chunk c runs on stage c % pp (the interleaved assignment)
    return tuple(sum(per_chunk[c] for c in range(s, chunks, pp)) for s in range(pp))


def check_parallel(par: LLMParallel, shape: TransformerShape, cluster: Cluster,
                   global_batch: int) -> None:
    """Raise :class:`ConfigError` unless ``par`` can run ``shape`` on ``cluster``.

    The GPUs must all be used (``tp cp pp dp = servers x gpus_per_server``), ``tp``
    divides a server's GPUs and the heads (and KV heads), every stage gets a layer,
    ``ep`` divides the experts, ``m`` divides a replica's sequences, and the attention
    kernel has a published rate on the GPU (``job.attention``).
    """
    g = cluster.gpus_per_server
    total = cluster.servers * g
    if par.gpus != total:
        fix = (f"; dp = {total // (par.tp * par.cp * par.pp)}"
               if total % (par.tp * par.cp * par.pp) == 0 else "")
        names, degrees = ("tp x cp x pp x dp", f"{par.tp} x {par.cp} x ") if par.cp > 1 else (
            "tp x pp x dp", f"{par.tp} x ")
        raise ConfigError("parallel", par.label(),
                          f"{names} = {degrees}{par.pp} x {par.dp} = {par.gpus} must "
                          f"equal the cluster's {total} GPUs{fix}")
    if par.tp > g:
        raise ConfigError("parallel.tp", par.tp,
                          f"tp must not exceed the server's {g} GPUs (tensor parallelism "
                          f"stays on NVLink)")
    if g % par.tp:
        raise ConfigError("parallel.tp", par.tp,
                          f"must divide the {g} GPUs of a server (tensor parallelism on NVLink)")
    if shape.heads % par.tp or shape.kv_heads % par.tp and par.tp % shape.kv_heads:
        raise ConfigError("parallel.tp", par.tp,
                          f"must divide the {shape.heads} heads and {shape.kv_heads} KV heads")
    # Llama 3 §3.3.2: the edge chunks may hold only the embedding or the output layer
    edge = par.edge_layers if par.pp > 1 else 0
    if par.pp * par.virtual > shape.layers + 2 * edge:
        raise ConfigError("parallel.pp", par.pp,
                          f"pp x virtual must be at most the {shape.layers} layers"
                          + (" + 2 x edge_layers" if edge else ""))
    if min(stage_layers(shape.layers, par.pp, par.virtual, par.edge_layers)) < 1 or (
            edge and (shape.layers + 2 * edge) // (par.pp * par.virtual) < edge):
        raise ConfigError("parallel.edge_layers", par.edge_layers,
                          "must leave every stage a layer (an edge chunk may hold none)")
    if par.cp > 1 and shape.seq % (2 * par.cp):
        raise ConfigError("parallel.cp", par.cp,
                          f"2 x cp must divide the sequence of {shape.seq} tokens (the "
                          f"load-balanced causal split)")
    attention_kernel(cluster.gpu, par.attention)   # one published for this GPU
    if (shape.experts or 1) % par.ep:
        raise ConfigError("parallel.ep", par.ep,
                          f"must divide the {shape.experts or 1} experts")
    if global_batch % par.dp:
        raise ConfigError("parallel.dp", par.dp,
                          f"must divide the global batch of {global_batch} sequences")
    if (global_batch // par.dp) % par.micro_batches:
        raise ConfigError("parallel.micro_batches", par.micro_batches,
                          f"must divide the {global_batch // par.dp} sequences per replica")


def gpu_coordinates(par: LLMParallel, rank: int) -> tuple[int, int, int]:
    """``(tensor rank t, stage p, replica d)`` of GPU ``rank`` under ``par.order`` (the
    context-parallel rank, :func:`cp_rank`, varies right after the tensor rank)."""
    t, rest = rank % par.tp, rank // (par.tp * par.cp)
    if par.order == "tp-dp-pp":
        return t, rest // par.dp, rest % par.dp
    return t, rest % par.pp, rest // par.pp


def cp_rank(par: LLMParallel, rank: int) -> int:
    """The context-parallel rank of GPU ``rank`` (0 when ``cp = 1``)."""
    return rank // par.tp % par.cp


def _rank(par: LLMParallel, t: int, p: int, d: int, c: int = 0) -> int:
    inner = t + par.tp * c
    if par.order == "tp-dp-pp":
        return inner + par.tp * par.cp * (d + par.dp * p)
    return inner + par.tp * par.cp * (p + par.pp * d)


def communicator_groups(par: LLMParallel) -> Mapping[str, tuple[tuple[int, ...], ...]]:
    """Every communicator of ``par`` as sorted tuples of GPU ranks.

    Returns
    -------
    mapping
        ``"tp"``: one group per (stage, replica); ``"pp"``: one per (tensor rank,
        replica), in stage order; ``"dp"``: one per (stage, tensor rank), the dense
        gradients' AllReduce; ``"ep"``: one per (stage, tensor rank, block of ``ep``
        consecutive replicas), the all-to-all; ``"edp"``: one per (stage, tensor
        rank, expert rank), the routed experts' gradient AllReduce (``dp / ep``
        members; empty when ``ep = dp`` or the model is dense). With ``cp > 1``:
        ``"cp"``, one per (stage, tensor rank, replica), the ring that passes K and V,
        and the ``dp`` and ``edp`` groups take every context-parallel rank.

    Examples
    --------
    Megatron-LM's ``initialize_model_parallel`` example: 16 GPUs, tp 2, pp 4 (dp 2).

    >>> g = communicator_groups(LLMParallel(tp=2, pp=4, dp=2))
    >>> g["tp"][:2], g["dp"][:2], g["pp"][0]
    (((0, 1), (2, 3)), ((0, 2), (1, 3)), (0, 4, 8, 12))
    """
    return _groups(par.tp, par.pp, par.dp, par.ep, par.cp, par.order)


@lru_cache(maxsize=64)
def _groups(tp: int, pp: int, dp: int, ep: int, cp: int,
            order: str) -> Mapping[str, tuple[tuple[int, ...], ...]]:
    """:func:`communicator_groups` of the degrees and order alone, which is all they
    depend on: a planner's layouts share them over micro-batches, chunks, recomputation
    and memory switches (read-only, so one copy serves them all)."""
    par = LLMParallel(tp, pp, dp, ep, order=order, cp=cp)
    r = _rank
    groups = {
        "tp": tuple(tuple(r(par, t, p, d, c) for t in range(tp)) for p in range(pp)
                    for d in range(dp) for c in range(cp)),
        "pp": tuple(tuple(r(par, t, p, d, c) for p in range(pp)) for d in range(dp)
                    for t in range(tp) for c in range(cp)),
        # the context-parallel ranks of a replica hold the same weights: one reduction
        "dp": tuple(tuple(r(par, t, p, d, c) for d in range(dp) for c in range(cp))
                    for p in range(pp) for t in range(tp)),
        "cp": tuple(tuple(r(par, t, p, d, c) for c in range(cp)) for p in range(pp)
                    for t in range(tp) for d in range(dp)) if cp > 1 else (),
        "ep": tuple(tuple(r(par, t, p, b * ep + e, c) for e in range(ep)) for p in range(pp)
                    for t in range(tp) for b in range(dp // ep) for c in range(cp))
        if ep > 1 else (),
        "edp": tuple(tuple(r(par, t, p, b * ep + e, c) for b in range(dp // ep)
                           for c in range(cp))
                     for p in range(pp) for t in range(tp) for e in range(ep))
        if 1 < ep < dp else (),
    }
    return MappingProxyType({k: tuple(sorted(tuple(sorted(x)) for x in v)) if k != "pp"
                             else tuple(sorted(v)) for k, v in groups.items()})
