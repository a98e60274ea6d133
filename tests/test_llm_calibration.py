"""Calibration of the LLM model against published runs (on an Ideal Switch).

Megatron-LM (Narayanan et al., SC'21; the Megatron-LM README): GPT-3 175B on 1,024 A100
(128 DGX A100, 8 HDR 200 Gb/s NICs each), tp 8, pp 8, dp 16, batch 1536, micro-batch 1,
full recomputation: 138 TFLOP/s per GPU counted with the recomputed forward = 44% of the
312 TFLOP/s peak, run as Megatron-LM of 2021 ran (nothing overlapped, unfused gradient
accumulation: ``SC21``). Nothing is fitted to it.

Llama 3 (Grattafiori et al., arXiv 2407.21783, Table 4): 405B on 8,192 H100 (8 x 400 Gb/s
per server), tp 8, pp 16, dp 64, sequences of 8192, 16M tokens per batch, BF16 MFU 43%.
The paper uses an interleaved schedule without giving v; v = 4 (two layers per chunk) is
our assumption. This run checks the calibration; it was not fitted to it. Our memory
model (Korthikanti et al.'s activations, 16 micro-batches in flight on the first stage)
says it needs more than 80 GB per GPU without recomputation under Megatron's interleaved
warm-up count (Llama 3's own schedule keeps fewer micro-batches in flight), so the
timing is compared as run. H100's sustained clock and NCCL's NVLink share come from
public measurements (``topoopt/kernels.py``), not from this run.
"""

from __future__ import annotations

from topoopt.cluster import GPUS, Cluster
from topoopt.kernels import kernel_profile
from topoopt.llm import (
    SC21,
    LLMParallel,
    Overlap,
    check_parallel,
    ideal_comm_times,
    llm_iteration,
    llm_traffic,
    memory_per_gpu,
)
from topoopt.workloads import build_model
from topoopt.workloads.gpt import transformer_shape


def _run(model, servers, gpu, nic, par, batch, fits=True, overlap=Overlap()):
    s = transformer_shape(build_model(model))
    c = Cluster(servers=servers, nics=8, link_bandwidth=nic, gpus_per_server=8,
                gpu=GPUS[gpu], intra_server_bandwidth=GPUS[gpu].nvlink_bandwidth)
    check_parallel(par, s, c, batch)
    assert memory_per_gpu(s, par, batch, 2, c.gpu.memory).fits == fits
    t = llm_traffic(s, par, servers, 8, batch, 2)
    return llm_iteration(s, par, c, batch, "bf16", t, ideal_comm_times(t, c), overlap)


def test_megatron_gpt3_175b_within_15_percent():
    it = _run("gpt3-175b", 128, "A100", 200e9,
              LLMParallel(8, 8, 16, micro_batches=96, recompute="full",
                          attention="unfused"), 1536, overlap=SC21)
    assert abs(it.hfu / 0.44 - 1) < 0.15
    # 138 TFLOP/s per GPU
    assert abs(it.hfu * 312e12 / 138e12 - 1) < 0.15


def test_llama3_405b_within_15_percent():
    it = _run("llama3-405b", 1024, "H100", 400e9,
              LLMParallel(8, 16, 64, micro_batches=32, virtual=4, zero1=True), 2048,
              fits=False)
    assert abs(it.mfu / 0.43 - 1) < 0.15
    # the bubble of 15 / (4 x 32) is what separates it from the kernels' efficiency
    assert it.mfu < kernel_profile(GPUS["H100"]).gemm_peak_fraction["bf16"] * (1 - 0.1)
