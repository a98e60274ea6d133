"""Compute time of each operator on the servers that run it (kernel model and roofline).

Dense and attention operators are timed kernel by kernel (:mod:`topoopt.kernels`: a
GEMM's efficiency grows with its shape after the strategy's splits, each kernel pays a
fixed launch cost, attention runs at FlashAttention's published efficiency); the other
compute-bound kinds (convolutions, norms, element-wise) take ``FLOPs / (peak x
compute_efficiency)``; embeddings are memory bound.
"""

from __future__ import annotations

import math

import numpy as np

from topoopt.cluster import Cluster, Job
from topoopt.kernels import attention_time, dense_layer_time
from topoopt.model import Model, Operator
from topoopt.strategy import OpConfig, Strategy

__all__ = ["op_time", "compute_times", "server_compute_time", "dense_dims"]


def dense_dims(op: Operator) -> tuple[float, float, float]:
    """``(d_in, d_out, tokens)`` of a dense operator, read back from its counts.

    :func:`topoopt.workloads.layers.dense` sets ``fwd = 2 d_in d_out tokens``,
    ``out_elems = d_out tokens`` and ``params = d_in d_out (+ d_out)``.
    Returns zeros for an operator whose counts are not a dense layer's (a custom
    operator's hand-written FLOPs): the caller then uses the flat roofline.
    """
    d_in = op.fwd_flops / (2.0 * op.out_elems) if op.out_elems else 0.0
    if d_in < 1 or abs(d_in - round(d_in)) > 1e-6:
        return 0.0, 0.0, 0.0
    for d_out in (op.params / (d_in + 1.0), op.params / d_in):
        whole = round(d_out)
        if abs(d_out - whole) < 1e-6 and whole >= 1 and op.out_elems % whole == 0:
            return d_in, float(whole), op.out_elems / whole
    return 0.0, 0.0, 0.0


def _attention_dims(op: Operator) -> tuple[float, float]:
    """``(hidden, seq)`` of :func:`topoopt.workloads.bert.attention`: ``params = 4 h^2 +
    4 h``, ``out_elems = s h``."""
    h = (-4.0 + math.sqrt(16.0 + 16.0 * op.params)) / 8.0
    return h, op.out_elems / h if h else 0.0


def _kernel_time(op: Operator, rows: float, mp: int, cluster: Cluster,
                 precision: str) -> tuple[float, float] | None:
    """Per GPU forward/backward of a dense or attention op on ``rows`` samples."""
    gpu = cluster.gpu
    if op.kind == "dense":
        d_in, d_out, tokens = dense_dims(op)
        if d_in <= 0 or d_out <= 0:
            return None
        return dense_layer_time(rows * tokens, d_in, d_out / mp, gpu, precision)
    if op.kind == "attention" and op.params > 0 and op.out_elems:
        h, s = _attention_dims(op)
        if abs(h - round(h)) > 1e-6 or abs(s - round(s)) > 1e-6:
            return None   # not :func:`~topoopt.workloads.bert.attention`'s counts
        m = rows * s
        qkv = dense_layer_time(m, h, 3.0 * h / mp, gpu, precision)
        out = dense_layer_time(m, h / mp, h, gpu, precision)
        scores = 4.0 * s * s * h * rows / mp   # Q K^T and P V, full (bidirectional)
        fwd = qkv[0] + out[0] + attention_time(scores, gpu, precision)
        bwd = qkv[1] + out[1] + attention_time(2.0 * scores, gpu, precision)
        return fwd, bwd
    return None


def op_time(op: Operator, config: OpConfig, cluster: Cluster, precision: str, dtype_bytes: int,
            global_batch: int) -> tuple[float, float]:
    """Forward and backward seconds of ``op`` on each of ``config``'s servers.

    Dense and attention kinds: each GPU of a server runs ``1 / gpus_per_server`` of the
    server's samples through the op's ``1 / mp`` parameter share, as GEMMs timed by
    :mod:`topoopt.kernels`. Other compute-bound kinds take ``FLOPs / (peak x
    compute_efficiency)``; embeddings are memory bound and take ``bytes moved / (HBM
    bandwidth x memory_efficiency)`` (docs/reference-data.md: no public per-lookup
    efficiency, so this is an assumption). A server's GPUs are pooled: the op's share
    is spread over all ``gpus_per_server``.

    Returns
    -------
    (fwd, bwd) : tuple of float

    References
    ----------
    TopoOpt's per-operator measurements (hipersys-team/TopoOpt) for the dense layers:
    ``benchmarks/dlrm_layers.py`` compares.
    """
    samples = global_batch / config.dp
    if op.kind == "embedding":
        rate = cluster.gpu.hbm_bandwidth / 8 * cluster.gpus_per_server * cluster.memory_efficiency
        t = op.mem_elems * dtype_bytes * samples / config.mp / rate
        return t, t  # gather forward, sparse scatter-add backward
    kernel = _kernel_time(op, samples / cluster.gpus_per_server, config.mp, cluster, precision)
    if kernel is not None:
        return kernel
    rate = cluster.peak_flops(precision) * cluster.compute_efficiency
    scale = samples / config.mp / rate
    return op.fwd_flops * scale, op.bwd_flops * scale


def compute_times(model: Model, strategy: Strategy, cluster: Cluster, job: Job) -> np.ndarray:
    """Array of shape ``(operators, 2)``: forward/backward seconds per server of each op."""
    batch = job.global_batch(cluster)
    return np.array([op_time(op, cfg, cluster, job.precision, job.dtype_bytes, batch)
                     for op, cfg in zip(model.operators, strategy.configs)])


def server_compute_time(model: Model, strategy: Strategy, cluster: Cluster, job: Job) -> np.ndarray:
    """Total compute seconds per server per iteration (no overlap, no communication)."""
    times = compute_times(model, strategy, cluster, job).sum(axis=1)
    total = np.zeros(cluster.servers)
    for t, cfg in zip(times, strategy.configs):
        total[list(cfg.servers)] += t
    return total
