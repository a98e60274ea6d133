"""Iteration time and model FLOPs utilization of a transformer under a parallelism.

The 1F1B schedule (Narayanan et al. SC'21 §2.2.1, Fig. 4) runs ``m`` micro-batches
through ``p`` stages; a stage's time per micro-batch ``t_mb`` is its forward, backward
(twice the forward) and recomputed forward on its ``1/tp`` share of the FLOPs at
``peak x compute_efficiency``, plus the communication on its critical path: the TP
AllReduces (NVLink), the activations sent to the next stage and their gradients
received back (PP), and the MoE all-to-alls (EP). The iteration then takes

    ``T = (m + (p - 1) / v) t_mb + t_DP``

-- the ideal ``m t_mb`` plus the bubble ``(p - 1) / (v m)`` of it (``v`` chunks per stage:
the interleaved schedule, §2.2.2) -- and the gradient AllReduce ``t_DP`` after the last
backward (not overlapped: Megatron-LM of SC'21 reduces after the pipeline flush). The
optimizer step, data loading and element-wise kernels are not modelled: they and the
kernels' shortfall from peak are what ``compute_efficiency`` absorbs (calibrated against
published runs, docs/reference-data.md).

Model FLOPs (for MFU) are ``6 N + 12 L s h`` per token
(:meth:`~topoopt.workloads.gpt.TransformerShape.training_flops_per_token`, PaLM App. B);
hardware FLOPs (HFU) add the recomputed forward, which is what Megatron-LM's reported
TFLOP/s count (their formula ``96 B s l h^2 (...)`` includes it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topoopt.cluster import Cluster
from topoopt.llm.parallel import LLMParallel, stage_layers
from topoopt.llm.traffic import LLMTraffic
from topoopt.workloads.gpt import TransformerShape

__all__ = ["LLM_COMPUTE_EFFICIENCY", "CommTimes", "LLMIteration", "llm_iteration", "ideal_comm_times", "nvlink_rate",
           "hardware_flops_per_token"]

#: The fraction of peak FLOP/s a transformer's kernels reach (``cluster.compute_efficiency``
#: of the LLM configs), calibrated with this model on Megatron-LM's GPT-3 175B run and
#: checked on Llama 3 405B (tests/test_llm_calibration.py; the numbers: docs/tuning.md).
#: The cluster's default 0.44 is Megatron's end-to-end figure, for models whose bubbles
#: and communication the compute model does not see; the LLM model sees them, so its
#: kernels are faster.
LLM_COMPUTE_EFFICIENCY = 0.52


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
    """

    pp_step: float
    pp_step_back: float
    ep_step: float
    dp: float


def _event(matrix: np.ndarray, bandwidth: float, latency: float) -> float:
    if not matrix.any():
        return 0.0
    load = max(matrix.sum(axis=1).max(), matrix.sum(axis=0).max())
    return float(load * 8.0 / bandwidth + latency)


def ideal_comm_times(traffic: LLMTraffic, cluster: Cluster) -> CommTimes:
    """The events' times on the Ideal Switch, in closed form: a non-blocking switch with
    ``d x B`` per server (TopoOpt §5) finishes an event when its busiest server has sent
    and received its bytes; plus one link latency per hop (``2 (k - 1)`` ring steps for
    an AllReduce of ``k`` servers).

    ``topoopt.planners.llm.fabric_comm_times`` computes the same on any fabric's links
    (equal on the Ideal Switch: a test).
    """
    bw, lat = cluster.server_bandwidth, cluster.link_latency
    ring = traffic.dp_matrix()
    steps = max((2 * (len(g.members) - 1) for g in traffic.dp_groups), default=0)
    dp = _event(ring, bw, 0.0) + steps * lat if traffic.dp_groups else 0.0
    return CommTimes(_event(traffic.pp_step, bw, lat), _event(traffic.pp_step.T, bw, lat),
                     _event(traffic.ep_step, bw, lat), dp)


def nvlink_rate(cluster: Cluster) -> float:
    """Bytes/s one GPU sends over NVLink: half of ``intra_server_bandwidth``, which (as
    the datasheets' 600 and 900 GB/s) counts both directions, while a ring or an
    all-to-all sends and receives at once."""
    return cluster.intra_server_bandwidth / 8.0 / 2.0


def hardware_flops_per_token(shape: TransformerShape, recompute: str) -> float:
    """FLOPs the GPUs execute per token: model FLOPs plus the recomputed forward
    (all of the layers' for ``full``; the attention scores ``4 s h`` per layer for
    ``selective``)."""
    extra = {"none": 0.0, "selective": 4.0 * shape.seq * shape.hidden,
             "full": shape.layer_matmul_flops()}[recompute]
    return shape.training_flops_per_token() + shape.layers * extra


@dataclass(frozen=True)
class LLMIteration:
    """One iteration's time and its parts (seconds), and the utilizations.

    Attributes
    ----------
    total : float
    micro_batch : float
        t_mb, the busiest stage's time per micro-batch (all of the below but DP).
    compute, tp, pp, ep : float
        Per micro-batch parts of ``micro_batch``.
    bubble : float
        ``(p - 1) / v x t_mb``.
    dp : float
        The gradient AllReduce after the pipeline flush.
    mfu, hfu : float
        Model and hardware FLOPs utilization of the GPUs' peak.
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

    def parts(self) -> dict[str, float]:
        """Seconds per iteration of each part (they sum to ``total``)."""
        m = (self.total - self.bubble - self.dp) / self.micro_batch if self.micro_batch else 0
        return {"compute": m * self.compute, "tp": m * self.tp, "pp": m * self.pp,
                "ep": m * self.ep, "bubble": self.bubble, "dp": self.dp}


def llm_iteration(shape: TransformerShape, par: LLMParallel, cluster: Cluster,
                  global_batch: int, precision: str, traffic: LLMTraffic,
                  comm: CommTimes) -> LLMIteration:
    """The iteration time of ``shape`` under ``par`` with the network times ``comm``.

    Parameters
    ----------
    shape, par : TransformerShape, LLMParallel
    cluster : Cluster
        GPUs (peak FLOP/s), ``compute_efficiency`` and NVLink bandwidth.
    global_batch : int
        Sequences per iteration.
    precision : str
        ``bf16``/``fp16`` (tensor-core peak) or ``fp32`` (TF32 peak).
    traffic : LLMTraffic
        :func:`~topoopt.llm.traffic.llm_traffic` of the same inputs.
    comm : CommTimes
        Its events' network times (:func:`ideal_comm_times` or a fabric's).

    Returns
    -------
    LLMIteration
    """
    peak = cluster.gpu.tf32_flops if precision == "fp32" else cluster.gpu.fp16_flops
    rate = peak * cluster.compute_efficiency
    nv = nvlink_rate(cluster)
    tokens = global_batch * shape.seq
    mb_tokens = tokens // par.dp // par.micro_batches
    layers = stage_layers(shape.layers, par.pp, par.virtual)
    hw_layer = hardware_flops_per_token(shape, par.recompute) - 3.0 * shape.logit_flops()
    hw_layer /= shape.layers
    stage_flops = [n * hw_layer * mb_tokens for n in layers]
    stage_flops[-1] += 3.0 * shape.logit_flops() * mb_tokens
    compute = max(stage_flops) / par.tp / rate
    tp = traffic.tp_nvlink_per_micro_batch / nv
    pp = par.virtual * (max(comm.pp_step, traffic.pp_nvlink / nv)
                        + max(comm.pp_step_back, traffic.pp_nvlink / nv)) if par.pp > 1 else 0.0
    ep = traffic.ep_steps_per_micro_batch * max(comm.ep_step, traffic.ep_nvlink / nv)
    t_mb = compute + tp + pp + ep
    bubble = (par.pp - 1) / par.virtual * t_mb
    dp = max(comm.dp, traffic.dp_nvlink / nv)
    total = par.micro_batches * t_mb + bubble + dp
    gpus = par.gpus
    mfu = tokens * shape.training_flops_per_token() / (total * gpus * peak)
    hfu = tokens * hardware_flops_per_token(shape, par.recompute) / (total * gpus * peak)
    return LLMIteration(total, t_mb, compute, tp, pp, ep, bubble, dp, mfu, hfu)
