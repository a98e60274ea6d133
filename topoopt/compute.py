"""Compute time of each operator on the servers that run it (roofline-style model)."""

from __future__ import annotations

import numpy as np

from topoopt.cluster import Cluster, Job
from topoopt.model import Model, Operator
from topoopt.strategy import OpConfig, Strategy

__all__ = ["op_time", "compute_times", "server_compute_time"]


def op_time(op: Operator, config: OpConfig, cluster: Cluster, precision: str, dtype_bytes: int,
            global_batch: int) -> tuple[float, float]:
    """Forward and backward seconds of ``op`` on each of ``config``'s servers.

    Compute-bound kinds take ``FLOPs / (peak x compute_efficiency)``; embeddings are
    memory bound and take ``bytes moved / (HBM bandwidth x memory_efficiency)``
    (docs/reference-data.md: no public per-lookup efficiency, so this is an assumption). A
    server's GPUs are pooled: the op's share is spread over all ``gpus_per_server``.

    Returns
    -------
    (fwd, bwd) : tuple of float
    """
    samples = global_batch / config.dp
    if op.kind == "embedding":
        rate = cluster.gpu.hbm_bandwidth / 8 * cluster.gpus_per_server * cluster.memory_efficiency
        t = op.mem_elems * dtype_bytes * samples / config.mp / rate
        return t, t  # gather forward, sparse scatter-add backward
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
