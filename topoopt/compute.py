"""Compute time of each operator on the servers that run it (kernel model and roofline).

Dense and attention operators are timed kernel by kernel (:mod:`topoopt.kernels`: a
GEMM's efficiency grows with its shape after the strategy's splits, each kernel pays a
fixed launch cost, attention scores run at the published efficiency of the fused kernel
the job names, ``job.attention``); the other compute-bound kinds (convolutions, norms, element-wise) take one launch plus
``FLOPs / (peak x compute_efficiency)``; embeddings are memory bound.
"""

from __future__ import annotations

import math

import numpy as np

from topoopt.cluster import Cluster, Job
from topoopt.kernels import dense_layer_time, flash_attention_times, kernel_profile
from topoopt.model import Model, Operator
from topoopt.strategy import OpConfig, Strategy

__all__ = ["op_time", "compute_times", "server_compute_time", "gemm_shape"]


def gemm_shape(op: Operator) -> tuple[float, float, float] | None:
    """``(tokens, d_in, d_out)`` of a dense operator's GEMM, per sample.

    Read back from its counts: the reduction is ``d_in = fwd_flops / (2 out_elems)``
    exactly; the output width is ``params / (d_in + 1)`` or ``params / d_in`` (weights
    with or without a bias, as :func:`workloads.layers.dense` counts them), whichever is
    a whole divisor of ``out_elems`` (else the first), and ``tokens = out_elems /
    d_out``, so
    ``2 tokens d_in d_out`` is the operator's forward FLOPs whatever its origin (a
    tied decoder, a traced or custom layer). ``None`` when the counts cannot be a GEMM
    (no parameters, outputs or FLOPs).
    """
    if op.params <= 0 or op.out_elems <= 0 or op.fwd_flops <= 0:
        return None
    d_in = op.fwd_flops / (2.0 * op.out_elems)
    for width in (op.params / (d_in + 1.0), op.params / d_in):   # with bias, without
        if width >= 1 and abs(width - round(width)) < 1e-9 and op.out_elems % round(width) == 0:
            return op.out_elems / round(width), d_in, float(round(width))
    d_out = min(float(op.out_elems), max(1.0, op.params / (d_in + 1.0)))
    return op.out_elems / d_out, d_in, d_out


def _gemm_op_time(op: Operator, rows: float, mp: int, cluster: Cluster,
                  precision: str, attention: str) -> tuple[float, float] | None:
    """Per GPU forward/backward of a dense or attention op on ``rows`` samples, its
    output columns (dense) or heads (attention) split ``mp`` ways; an attention op's
    scores run as the fused kernel ``attention`` names, or, ``unfused``, at the rate of
    the other compute-bound kinds (one launch plus ``FLOPs / (peak x
    compute_efficiency)``: the op's counts give no head shape to time its GEMMs by)."""
    gpu = cluster.gpu
    if op.kind == "dense":
        shape = gemm_shape(op)
        if shape is None:
            return None
        tokens, d_in, d_out = shape
        return dense_layer_time(rows * tokens, d_in, d_out / mp, gpu, precision)
    if op.kind != "attention" or op.params <= 0 or op.out_elems <= 0:
        return None
    # Q, K, V and output projections: about 4 h^2 weights, each used once per token
    # (2 FLOPs); the rest of the forward FLOPs is the scores, softmax and context.
    hidden = math.sqrt(op.params / 4.0)
    seq = op.out_elems / hidden
    proj = min(op.fwd_flops, 2.0 * op.params * seq)
    fwd, bwd = dense_layer_time(rows * seq, hidden, 4.0 * hidden / mp, gpu, precision)
    scores = rows * (op.fwd_flops - proj) / mp
    if attention == "unfused":
        rate = cluster.peak_flops(precision) / cluster.gpus_per_server * cluster.compute_efficiency
        a = kernel_profile(gpu).launch + scores / rate if scores > 0 else 0.0
        return fwd + a, bwd + 2.0 * a
    # the scores run as fused (flash) attention: its backward kernel executes 2.5 x the
    # forward's FLOPs (it recomputes Q K^T), the LLM model's count, not the op's 2 x
    a_fwd, a_bwd = flash_attention_times(scores, gpu, precision, attention)
    return fwd + a_fwd, bwd + a_bwd


def op_time(op: Operator, config: OpConfig, cluster: Cluster, precision: str, dtype_bytes: int,
            global_batch: int, attention: str = "auto") -> tuple[float, float]:
    """Forward and backward seconds of ``op`` on each of ``config``'s servers.

    Dense and attention kinds: each GPU of a server runs ``1 / gpus_per_server`` of the
    server's samples through the op's ``1 / mp`` parameter share, as GEMMs timed by
    :mod:`topoopt.kernels` (launch cost, wave quantization, short reductions). Other
    compute-bound kinds take one kernel launch plus ``FLOPs / (peak x
    compute_efficiency)``; embeddings are memory bound and take a launch plus ``bytes
    moved / (HBM bandwidth x memory_efficiency)`` (docs/reference-data.md: no public
    per-lookup efficiency, so this is an assumption). A server's GPUs are pooled: the
    op's share is spread over all ``gpus_per_server``. ``attention`` is the job's
    attention kernel (``job.attention``, :func:`topoopt.kernels.attention_kernel`).

    Returns
    -------
    (fwd, bwd) : tuple of float

    References
    ----------
    TopoOpt's per-operator measurements (hipersys-team/TopoOpt) for the dense layers:
    ``benchmarks/dlrm_layers.py`` compares; docs/kernels.md.
    """
    samples = global_batch / config.dp
    launch = kernel_profile(cluster.gpu).launch
    if op.kind == "embedding":
        if op.mem_elems <= 0:
            return 0.0, 0.0
        rate = cluster.gpu.hbm_bandwidth / 8 * cluster.gpus_per_server * cluster.memory_efficiency
        t = launch + op.mem_elems * dtype_bytes * samples / config.mp / rate
        return t, t  # gather forward, sparse scatter-add backward
    kernel = _gemm_op_time(op, samples / cluster.gpus_per_server, config.mp, cluster, precision,
                           attention)
    if kernel is not None:
        return kernel
    rate = cluster.peak_flops(precision) * cluster.compute_efficiency
    scale = samples / config.mp / rate
    return (launch + op.fwd_flops * scale if op.fwd_flops > 0 else 0.0,
            launch + op.bwd_flops * scale if op.bwd_flops > 0 else 0.0)


def compute_times(model: Model, strategy: Strategy, cluster: Cluster, job: Job) -> np.ndarray:
    """Array of shape ``(operators, 2)``: forward/backward seconds per server of each op."""
    batch = job.global_batch(cluster)
    return np.array([op_time(op, cfg, cluster, job.precision, job.dtype_bytes, batch,
                             job.attention)
                     for op, cfg in zip(model.operators, strategy.configs)])


def server_compute_time(model: Model, strategy: Strategy, cluster: Cluster, job: Job) -> np.ndarray:
    """Total compute seconds per server per iteration (no overlap, no communication)."""
    times = compute_times(model, strategy, cluster, job).sum(axis=1)
    total = np.zeros(cluster.servers)
    for t, cfg in zip(times, strategy.configs):
        total[list(cfg.servers)] += t
    return total
