"""Iteration time and model FLOPs utilization of a transformer under a parallelism.

The 1F1B schedule (Narayanan et al. SC'21 §2.2.1, Fig. 4) runs ``m`` micro-batches
through ``p`` stages; a stage's time per micro-batch ``t_mb`` is its forward, backward
and recomputed forward, each layer timed kernel by kernel on one GPU's share
(:mod:`topoopt.kernels`: every GEMM with the shape the tensor split gives it, attention
at the published efficiency of the fused kernel the run names, ``par.attention``, or,
unfused, as batched GEMMs and a softmax that streams the scores, the element-wise
kernels at HBM speed), plus the communication on its
critical path that is not overlapped: the TP collectives (NVLink), the activations
sent to the next stage and their gradients received back (PP), and the MoE all-to-alls
(EP). The iteration then takes

    ``T = (m + (p - 1) / v) t_mb + t_DP + t_opt``

-- the ideal ``m t_mb`` plus the bubble ``(p - 1) / (v m)`` of it (``v`` chunks per stage:
the interleaved schedule, §2.2.2) -- the exposed part of the data-parallel gradient
reduction ``t_DP`` and the optimizer step ``t_opt`` (memory-bound over the parameters
the GPU updates). What overlaps is :class:`Overlap`: by default what Megatron-LM (core)
does with the distributed optimizer, ``--overlap-grad-reduce`` and
``--overlap-param-gather`` (the reduce-scatter under the last micro-batch's backward,
the all-gather under the next iteration's first forward), overlapped pipeline
sends; TP overlap (``--tp-comm-overlap``) is off by default, as in Megatron. The
context-parallel K/V exchange is Llama 3's all-gather, exposed (``cp_comm``: a ring
under the attention).
:data:`SC21` turns every overlap off (Megatron-LM of SC'21 reduced after the flush).

Model FLOPs (for MFU) are ``6 N + 12 L s h`` per token
(:meth:`~topoopt.workloads.gpt.TransformerShape.training_flops_per_token`, PaLM App. B);
hardware FLOPs (HFU) add the recomputed forward, which is what Megatron-LM's reported
TFLOP/s count (their formula ``96 B s l h^2 (...)`` includes it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topoopt.cluster import Cluster, GpuSpec

# FLASH_BWD_OVER_FWD is re-exported: one constant for the LLM model and the DLRM/BERT
# estimator (topoopt.compute), both timing attention with flash_attention_times
from topoopt.kernels import (
    FLASH_BWD_OVER_FWD,
    dense_layer_time,
    flash_attention_times,
    kernel_profile,
    memory_time,
)
from topoopt.llm.memory import stage_params
from topoopt.llm.parallel import LLMParallel, stage_layers
from topoopt.llm.traffic import LLMTraffic
from topoopt.workloads.gpt import TransformerShape

__all__ = ["Overlap", "SC21", "CommTimes", "LayerTimes", "LLMIteration", "llm_iteration",
           "layer_times", "ideal_comm_times", "nvlink_rate", "hardware_flops_per_token",
           "megatron_flops_per_token", "optimizer_bytes_per_param", "optimizer_time",
           "FLASH_BWD_OVER_FWD"]

#: Bytes per element streamed by the unfused softmax path of one attention score
#: (Megatron-LM SC'21's fused scale-mask-softmax then dropout): forward reads the 2-byte
#: scores and writes the probabilities (4), dropout reads them and writes the dropped
#: probabilities and a 1-byte mask (5); backward about as much again plus the gradient.
SCORE_BYTES_FWD, SCORE_BYTES_BWD = 9.0, 11.0

#: Bytes per score the unfused attention's batched GEMMs move through HBM: forward,
#: ``Q K^T`` writes the 2-byte scores and ``P V`` reads the probabilities; backward,
#: ``dP = dO V^T`` writes, ``dV = P^T dO`` reads ``P``, ``dQ = dS K`` and ``dK = dS^T Q``
#: read ``dS`` (per GEMM: forward 2, backward 4 over its two kernels).
BMM_SCORE_BYTES_FWD, BMM_SCORE_BYTES_BWD = 2.0, 4.0


#: Bytes per parameter of Adam's step on 16-bit weights with fp32 main weights, as
#: Megatron-LM's mixed-precision optimizer runs it kernel by kernel
#: (``megatron/optimizer/optimizer.py``: ``_copy_model_grads_to_main_grads``,
#: ``_unscale_main_grads_and_check_for_nan``, ``clip_grad_norm_fp32``, apex's
#: ``FusedAdam``, ``_copy_main_params_to_model_params``): the fused Adam reads the
#: fp32 parameter, gradient and both moments and writes back three (28), the gradient
#: norm reads the gradients (4), the 16-bit copy of the new weights reads 4 and writes 2.
ADAM_STEP_BYTES = 28.0 + 4.0 + 6.0
#: fp16 with loss scaling adds the copy of the fp16 gradients into fp32 main gradients
#: (2 read + 4 written) and the unscale with its inf/nan check (4 + 4); bf16 keeps its
#: gradients in fp32 (Megatron's ``--accumulate-allreduce-grads-in-fp32``) and has no
#: loss scale.
FP16_LOSS_SCALE_BYTES = 6.0 + 8.0


@dataclass(frozen=True)
class Overlap:
    """Which communication runs under compute (all True but ``tp_comm`` and
    ``cp_comm``: Megatron-LM's defaults with the distributed optimizer and its overlap
    flags; context parallelism as Llama 3 ran it).

    Attributes
    ----------
    dp_grad_reduce : bool
        The gradient reduce-scatter (all-reduce without ZeRO-1) in buckets during the
        last micro-batch's backward (``--overlap-grad-reduce``).
    dp_param_gather : bool
        The distributed optimizer's parameter all-gather during the next iteration's
        first forward (``--overlap-param-gather``).
    tp_comm : bool
        The TP all-gathers and reduce-scatters split in ``tp`` chunks under their GEMMs
        (``--tp-comm-overlap``): only the first chunk stays exposed.
    pp_comm : bool
        Pipeline sends and receives under the next micro-batch's compute (Megatron's
        overlapped P2P communication).
    cp_comm : bool
        False (default): context parallelism as Llama 3 ran it (Grattafiori et al.,
        arXiv 2407.21783, §3.3.2): K and V all-gathered before the attention, their
        gradients reduce-scattered after it ("the all-gather communication latency is
        exposed in the critical path"): the same bytes as a ring, all exposed. True:
        Megatron-Core's ring attention (``--cp-comm-type p2p``), which sends step
        ``i + 1``'s block during step ``i``'s attention: only what exceeds the stage's
        attention time is exposed.
    fused_grad_accumulation : bool
        Not an overlap but a fusion of the same vintage: the weight-gradient GEMMs
        accumulate into the gradient buffer (Megatron-core's
        ``--gradient-accumulation-fusion``). False: every micro-batch's backward ends
        with an add of each gradient into the buffer (Megatron-LM 2021's DDP hook
        ``main_grad.add_(grad)``), ``3 x dtype`` bytes per parameter at HBM speed.
    """

    dp_grad_reduce: bool = True
    dp_param_gather: bool = True
    tp_comm: bool = False
    pp_comm: bool = True
    fused_grad_accumulation: bool = True
    cp_comm: bool = False


#: Nothing overlapped nor fused: Megatron-LM as Narayanan et al. SC'21 ran it.
SC21 = Overlap(False, False, False, False, False, False)


@dataclass(frozen=True)
class CommTimes:
    """Network seconds of the traffic events of :class:`~topoopt.llm.traffic.LLMTraffic`.

    Attributes
    ----------
    pp_step : float
        One forward pipeline step (every boundary's activations at once).
    pp_step_back : float
        One backward step (the gradients, the transposed matrix).
    ep_step : float
        One all-to-all of every expert group at once.
    dp : float
        The DP AllReduces of all groups at once.
    cp_step : float
        One context-parallel ring step of every group at once (0 without cp).
    """

    pp_step: float
    pp_step_back: float
    ep_step: float
    dp: float
    cp_step: float = 0.0


def _event(matrix: np.ndarray, bandwidth: float, latency: float) -> float:
    """An event's time on the Ideal Switch: its busiest server's sends or receives,
    plus a hop; nothing when no byte moves (bytes are never negative)."""
    return _busiest(matrix.sum(axis=1), matrix.sum(axis=0), bandwidth, latency)


def _busiest(sent: np.ndarray, received: np.ndarray, bandwidth: float,
             latency: float) -> float:
    load = max(sent.max(initial=0.0), received.max(initial=0.0))
    return float(load * 8.0 / bandwidth + latency) if load > 0 else 0.0


def ideal_comm_times(traffic: LLMTraffic, cluster: Cluster) -> CommTimes:
    """The events' times on the Ideal Switch, in closed form: a non-blocking switch with
    ``d x B`` per server (TopoOpt §5) finishes an event when its busiest server has sent
    and received its bytes; plus one link latency per hop (``2 (k - 1)`` ring steps for
    an AllReduce of ``k`` servers).

    ``topoopt.planners.llm.fabric_comm_times`` computes the same on any fabric's links
    (equal on the Ideal Switch: a test).
    """
    bw, lat = cluster.server_bandwidth, cluster.link_latency
    steps = max((2 * (len(g.members) - 1) for g in traffic.dp_groups), default=0)
    dp = _busiest(*traffic.dp_loads(), bw, 0.0) + steps * lat if traffic.dp_groups else 0.0
    cp = _event(traffic.cp_step, bw, lat) if traffic.cp_steps_per_micro_batch else 0.0
    ep = _event(traffic.ep_step, bw, lat) if traffic.ep_steps_per_micro_batch else 0.0
    return CommTimes(_event(traffic.pp_step, bw, lat), _event(traffic.pp_step.T, bw, lat),
                     ep, dp, cp)


def nvlink_rate(cluster: Cluster) -> float:
    """Bytes/s one GPU's collectives send over NVLink: half of
    ``intra_server_bandwidth``, which (as the datasheets' 600 and 900 GB/s) counts both
    directions, while a ring or an all-to-all sends and receives at once; times the
    share of it NCCL reaches (:attr:`~topoopt.kernels.KernelProfile.collective_fraction`)."""
    return (cluster.intra_server_bandwidth / 8.0 / 2.0
            * kernel_profile(cluster.gpu).collective_fraction)


def hardware_flops_per_token(shape: TransformerShape, recompute: str) -> float:
    """FLOPs the GPUs execute per token: model FLOPs plus the recomputed forward
    (all of the layers' for ``full``; the attention scores ``4 s h`` per layer for
    ``selective``)."""
    extra = {"none": 0.0, "selective": 4.0 * shape.seq * shape.hidden,
             "full": shape.layer_matmul_flops()}[recompute]
    return shape.training_flops_per_token() + shape.layers * extra


def megatron_flops_per_token(shape: TransformerShape, recompute: str) -> float:
    """FLOPs per token as Megatron-LM reports throughput: model FLOPs plus the whole
    recomputed forward with ``full`` recomputation, nothing for ``selective`` (its
    ``num_floating_point_operations``; for GPT-3's shapes Narayanan et al.'s ``96 B s l
    h^2 (1 + s / 6h + V / 16 l h)``)."""
    return hardware_flops_per_token(shape, "full" if recompute == "full" else "none")


def optimizer_bytes_per_param(precision: str) -> float:
    """HBM bytes the optimizer step moves per parameter it updates
    (:data:`ADAM_STEP_BYTES`, plus :data:`FP16_LOSS_SCALE_BYTES` for ``fp16``; ``fp32``
    training updates its weights in place and keeps no 16-bit copy)."""
    if precision == "fp32":
        return 28.0 + 4.0
    return ADAM_STEP_BYTES + (FP16_LOSS_SCALE_BYTES if precision == "fp16" else 0.0)


def optimizer_time(shape: TransformerShape, par: LLMParallel, gpu: GpuSpec,
                   precision: str) -> float:
    """Seconds of the optimizer step on the fullest GPU: memory-bound multi-tensor
    kernels over the parameters it updates (its stage's share; ``1 / (dp x cp)`` of it
    with the distributed optimizer, ``zero1``), after the gradient reduction.

    References
    ----------
    Megatron-LM's ``MixedPrecisionOptimizer.step`` and ``DistributedOptimizer`` (each
    rank steps its shard); the bytes: :func:`optimizer_bytes_per_param`.
    """
    dense, expert = stage_params(shape, par)
    shard = par.dp * par.cp if par.zero1 else 1
    params = max(d + e for d, e in zip(dense, expert)) / shard
    # one multi-tensor launch for each of the five kernels (norm, Adam, copies)
    return memory_time(optimizer_bytes_per_param(precision) * params, gpu, 5)


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of one layer on one GPU for one micro-batch.

    Attributes
    ----------
    forward, backward, recompute : float
        The passes (``recompute``: what the backward runs again first).
    gemm : float
        Of the three, the GEMMs' seconds (what TP overlap can hide communication under).
    attention : float
        Of the three, the attention kernels' seconds (what the CP ring hides under).
    """

    forward: float
    backward: float
    recompute: float
    gemm: float
    attention: float = 0.0

    def __add__(self, other: "LayerTimes") -> "LayerTimes":
        return LayerTimes(self.forward + other.forward, self.backward + other.backward,
                          self.recompute + other.recompute, self.gemm + other.gemm,
                          self.attention + other.attention)

    def scaled(self, k: float) -> "LayerTimes":
        return LayerTimes(k * self.forward, k * self.backward, k * self.recompute,
                          k * self.gemm, k * self.attention)

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


def _gemms(shapes: list[tuple[float, float, float, int]], gpu: GpuSpec,
           precision: str) -> tuple[float, float]:
    """Forward and backward seconds of ``count`` GEMMs ``(tokens, d_in, d_out)``."""
    fwd = bwd = 0.0
    for tokens, d_in, d_out, count in shapes:
        f, b = dense_layer_time(tokens, d_in, d_out, gpu, precision)
        fwd, bwd = fwd + count * f, bwd + count * b
    return fwd, bwd


def layer_times(shape: TransformerShape, par: LLMParallel, gpu: GpuSpec, precision: str,
                tokens: int) -> LayerTimes:
    """One layer's kernels for a micro-batch of ``tokens`` on one GPU of ``par``.

    ``tokens`` are the GPU's own: ``1 / cp`` of the micro-batch's with context
    parallelism, whose queries attend to the whole sequence (``shape.seq`` keys, half
    of them under the causal mask, balanced over the ranks). The GEMMs see every token of the micro-batch (sequence parallelism gathers them)
    and ``1 / tp`` of the weights: QKV ``h -> h / t + 2 kv / min(t, kv_heads)``, output ``h / t -> h``,
    MLP ``h -> g f / t`` (``g`` = 2 gated) and ``f / t -> h``; an MoE layer runs its
    router, its ``experts / ep`` local experts on ``ep x tokens x top_k x capacity /
    experts`` tokens each, and its shared experts. Causal attention executes half of
    the ``4 s h`` per token forward, 2.5 x that backward (flash, which recomputes
    ``Q K^T``: :data:`FLASH_BWD_OVER_FWD`; at the rate of ``par.attention``'s kernel on
    ``gpu``) or all of it as batched ``s x s`` GEMMs whose
    scores the softmax streams (unfused; each of those GEMMs takes at least the time
    its ``s x s`` operand takes through HBM, :data:`BMM_SCORE_BYTES_FWD`, as a roofline
    bounds a GEMM whose ``k`` or ``n`` is the head dimension, and the context is copied
    back to ``[s, b, h]``, ``4 h`` bytes per token). Norms, activations, dropout and residual adds
    stream ``22 h`` bytes per token forward (two norms ``8 h``, two bias-dropout-adds
    ``14 h``) plus the activation (``4 f`` GELU, ``6 f`` SwiGLU), ``1 / tp`` of each
    under sequence parallelism; backward twice that. Output-discarding recomputation
    (``par.recompute_norms``, ``par.recompute_act``) streams the norms (``8 h``) or
    the activation once more, in the backward.
    """
    h, t, s = shape.hidden, par.tp, shape.seq
    b = tokens / s
    width = (2 if shape.gated else 1)
    mats: list[tuple[float, float, float, int]] = [
        # fewer KV heads than t: each GPU computes a whole (replicated) KV head
        (tokens, h, h / t + 2 * shape.kv_dim / min(t, shape.kv_heads), 1),
        (tokens, h / t, h, 1)]
    act_width: float = shape.ffn
    if shape.moe:
        per_expert = par.ep * tokens * shape.top_k * shape.capacity_factor / shape.experts
        local = shape.experts // par.ep
        mats += [(tokens, h, shape.experts, 1), (per_expert, h, width * shape.expert_ffn / t, local),
                 (per_expert, shape.expert_ffn / t, h, local)]
        act_width = shape.top_k * shape.capacity_factor * shape.expert_ffn
        if shape.shared_experts:
            f = shape.shared_experts * shape.ffn
            mats += [(tokens, h, width * f / t, 1), (tokens, f / t, h, 1)]
            act_width += f
    else:
        mats += [(tokens, h, width * shape.ffn / t, 1), (tokens, shape.ffn / t, h, 1)]
    g_fwd, g_bwd = _gemms(mats, gpu, precision)
    heads = b * shape.heads / t
    if par.flash_attention:
        core = 2.0 * s * h * tokens / t    # causal: half of 4 s h per token
        # the backward kernel recomputes Q K^T: 5 matmuls, 2.5 x the forward's
        a_fwd, a_bwd = flash_attention_times(core, gpu, precision, par.attention)
        ag_fwd = ag_bwd = 0.0
    else:
        d, scores = shape.head_dim, heads * s * s
        ag_fwd = ag_bwd = 0.0
        for m_, k_, n_ in ((s * heads, d, s), (s * heads, s, d)):   # Q K^T, then P V
            fw, bw = dense_layer_time(m_, k_, n_, gpu, precision)
            # roofline: a GEMM streaming the s x s matrix is memory-bound at k = d
            ag_fwd += max(fw, memory_time(BMM_SCORE_BYTES_FWD * scores, gpu, 0))
            ag_bwd += max(bw, memory_time(BMM_SCORE_BYTES_BWD * scores, gpu, 0))
        a_fwd = ag_fwd + memory_time(SCORE_BYTES_FWD * scores, gpu, 2)
        a_bwd = ag_bwd + memory_time(SCORE_BYTES_BWD * scores, gpu, 2)
    # unfused attention also copies its context to [s, b, h] (a permute made contiguous)
    copy = 0.0 if par.flash_attention else 4.0 * h
    stream = tokens * (22.0 * h + copy + (6.0 if shape.gated else 4.0) * act_width) / t
    e_fwd = memory_time(stream, gpu, 6)
    fwd, bwd = g_fwd + a_fwd + e_fwd, g_bwd + a_bwd + 2 * e_fwd
    rec = {"none": 0.0, "full": fwd,
           "selective": 0.0 if par.flash_attention else a_fwd}[par.recompute]
    if par.recompute != "full":   # output-discarding recomputation: norms, activation
        again = (8.0 * h if par.recompute_norms else 0.0) + (
            (6.0 if shape.gated else 4.0) * act_width if par.recompute_act else 0.0)
        rec += memory_time(tokens * again / t, gpu, 2 * par.recompute_norms
                           + par.recompute_act)
    gemm = g_fwd + g_bwd + ag_fwd + ag_bwd + (g_fwd + ag_fwd if par.recompute == "full" else 0.0)
    attention = a_fwd + a_bwd + (a_fwd if par.recompute != "none" else 0.0)
    return LayerTimes(fwd, bwd, rec, gemm, attention)


def _logit_times(shape: TransformerShape, par: LLMParallel, gpu: GpuSpec, precision: str,
                 tokens: int) -> LayerTimes:
    """The output projection ``h -> V / t`` and the fp32 cross-entropy over it."""
    f, b = dense_layer_time(tokens, shape.hidden, shape.vocab / par.tp, gpu, precision)
    ce = memory_time(tokens * shape.vocab / par.tp * 4.0 * 2, gpu, 2)
    return LayerTimes(f + ce, b + ce, 0.0, f + b)


@dataclass(frozen=True)
class LLMIteration:
    """One iteration's time and its parts (seconds), and the utilizations.

    Attributes
    ----------
    total : float
    micro_batch : float
        t_mb, the busiest stage's time per micro-batch (all of the below but DP).
    compute, tp, pp, ep : float
        Per micro-batch parts of ``micro_batch`` (communication: its exposed part).
    cp : float
        Per micro-batch, the exposed context-parallel ring (0 without cp).
    optimizer : float
        The optimizer step after the gradient reduction (:func:`optimizer_time`).
    bubble : float
        ``(p - 1) / v x t_mb``.
    dp : float
        The exposed gradient reduction (and parameter all-gather).
    mfu, hfu : float
        Model and hardware FLOPs utilization of the GPUs' 16-bit (or TF32) peak.
    """

    total: float
    micro_batch: float
    compute: float
    tp: float
    pp: float
    ep: float
    bubble: float
    dp: float
    mfu: float
    hfu: float
    cp: float = 0.0
    optimizer: float = 0.0

    def parts(self) -> dict[str, float]:
        """Seconds per iteration of each part (they sum to ``total``)."""
        m = ((self.total - self.bubble - self.dp - self.optimizer) / self.micro_batch
             if self.micro_batch else 0)
        parts = {"compute": m * self.compute, "tp": m * self.tp, "pp": m * self.pp,
                 "ep": m * self.ep, "bubble": self.bubble, "dp": self.dp}
        if self.cp:
            parts["cp"] = m * self.cp
        if self.optimizer:
            parts["optimizer"] = self.optimizer
        return parts


def _stage_times(shape: TransformerShape, par: LLMParallel, gpu: GpuSpec, precision: str,
                 tokens: int, fused_grad_accumulation: bool = True) -> LayerTimes:
    """The busiest stage's kernels per micro-batch (the last also runs the logits;
    unfused gradient accumulation adds ``3 x dtype`` bytes per parameter of the stage)."""
    layer = layer_times(shape, par, gpu, precision, tokens)
    logits = _logit_times(shape, par, gpu, precision, tokens)
    layers = stage_layers(shape.layers, par.pp, par.virtual, par.edge_layers)
    dense, expert = stage_params(shape, par)
    dtype = 4.0 if precision == "fp32" else 2.0
    stages = []
    for s, n in enumerate(layers):
        t = layer.scaled(n) + (logits if s == par.pp - 1 else LayerTimes(0, 0, 0, 0))
        if not fused_grad_accumulation:
            t += LayerTimes(0.0, memory_time(3 * dtype * (dense[s] + expert[s]), gpu), 0, 0)
        stages.append(t)
    return max(stages, key=lambda x: x.total)


def llm_iteration(shape: TransformerShape, par: LLMParallel, cluster: Cluster,
                  global_batch: int, precision: str, traffic: LLMTraffic,
                  comm: CommTimes, overlap: Overlap = Overlap(),
                  optimizer_step: bool = True) -> LLMIteration:
    """The iteration time of ``shape`` under ``par`` with the network times ``comm``.

    Parameters
    ----------
    shape, par : TransformerShape, LLMParallel
    cluster : Cluster
        Its GPU (the kernel model, peak FLOP/s) and NVLink bandwidth.
    global_batch : int
        Sequences per iteration.
    precision : str
        ``bf16``/``fp16`` (tensor-core peak), ``fp8`` or ``fp32`` (TF32).
    traffic : LLMTraffic
        :func:`~topoopt.llm.traffic.llm_traffic` of the same inputs.
    comm : CommTimes
        Its events' network times (:func:`ideal_comm_times` or a fabric's).
    overlap : Overlap
        What runs under compute (default: Megatron-LM's).
    optimizer_step : bool
        Count the optimizer step (:func:`optimizer_time`); False leaves it out.

    Returns
    -------
    LLMIteration

    References
    ----------
    Narayanan et al. SC'21 §2.2 (the schedule and its bubble); Megatron-LM's
    distributed optimizer and overlap flags (docs/llm-model.md).
    """
    gpu = cluster.gpu
    peak = gpu.tf32_flops if precision == "fp32" else gpu.fp16_flops
    nv = nvlink_rate(cluster)
    tokens = global_batch * shape.seq
    mb_tokens = tokens // par.dp // par.micro_batches // par.cp   # one GPU's share
    stage = _stage_times(shape, par, gpu, precision, mb_tokens, overlap.fused_grad_accumulation)
    compute = stage.total
    tp = traffic.tp_nvlink_per_micro_batch / nv
    if overlap.tp_comm and par.tp > 1:   # the first of tp chunks cannot overlap
        tp = tp / par.tp + max(0.0, tp * (1 - 1 / par.tp) - stage.gemm)
    pp = par.virtual * (max(comm.pp_step, traffic.pp_nvlink / nv)
                        + max(comm.pp_step_back, traffic.pp_nvlink / nv)) if par.pp > 1 else 0.0
    if overlap.pp_comm:
        pp = max(0.0, pp - compute)
    ep = traffic.ep_steps_per_micro_batch * max(comm.ep_step, traffic.ep_nvlink / nv)
    cp = traffic.cp_steps_per_micro_batch * max(comm.cp_step, traffic.cp_nvlink / nv)
    if overlap.cp_comm:
        cp = max(0.0, cp - stage.attention)
    t_mb = compute + tp + pp + ep + cp
    bubble = (par.pp - 1) / par.virtual * t_mb
    reduce = max(comm.dp, traffic.dp_nvlink / nv)
    # ZeRO-1 / the distributed optimizer: reduce-scatter + all-gather, half the bytes each
    grad, gather = (reduce / 2, reduce / 2) if par.zero1 else (reduce, 0.0)
    if overlap.dp_grad_reduce:
        grad = max(0.0, grad - stage.backward - stage.recompute)
    if overlap.dp_param_gather:
        gather = max(0.0, gather - stage.forward)
    dp = grad + gather
    opt = optimizer_time(shape, par, gpu, precision) if optimizer_step else 0.0
    total = par.micro_batches * t_mb + bubble + dp + opt
    gpus = par.gpus
    mfu = tokens * shape.training_flops_per_token() / (total * gpus * peak)
    hfu = tokens * hardware_flops_per_token(shape, par.recompute) / (total * gpus * peak)
    return LLMIteration(total, t_mb, compute, tp, pp, ep, bubble, dp, mfu, hfu, cp, opt)
