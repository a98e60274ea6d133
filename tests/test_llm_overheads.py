"""The optimizer step and the memory-bound attention GEMMs: structure, not fits."""

from __future__ import annotations

import pytest

from topoopt.cluster import GPUS, Cluster
from topoopt.kernels import dense_layer_time, memory_time
from topoopt.llm import LLMParallel, check_parallel, ideal_comm_times, llm_traffic
from topoopt.llm.iteration import (
    ADAM_STEP_BYTES,
    BMM_SCORE_BYTES_BWD,
    BMM_SCORE_BYTES_FWD,
    layer_times,
    llm_iteration,
    optimizer_bytes_per_param,
    optimizer_time,
)
from topoopt.llm.memory import stage_params
from topoopt.workloads import build_model
from topoopt.workloads.gpt import transformer_shape

GPT3 = transformer_shape(build_model("gpt3-175b"))
A100 = GPUS["A100"]


def _run(par, batch, precision="bf16", optimizer_step=True):
    c = Cluster(servers=par.gpus // 8, nics=8, link_bandwidth=200e9, gpus_per_server=8,
                gpu=A100, intra_server_bandwidth=A100.nvlink_bandwidth)
    check_parallel(par, GPT3, c, batch)
    t = llm_traffic(GPT3, par, c.servers, 8, batch, 2)
    return llm_iteration(GPT3, par, c, batch, precision, t, ideal_comm_times(t, c),
                         optimizer_step=optimizer_step)


def test_optimizer_step_bytes_follow_megatron_kernels():
    # fused Adam 16 read + 12 written, the norm 4, the 16-bit copy 4 + 2
    assert optimizer_bytes_per_param("bf16") == ADAM_STEP_BYTES == 38
    # fp16: + the fp16 -> fp32 gradient copy (2 + 4) and the unscale (4 + 4)
    assert optimizer_bytes_per_param("fp16") == 52
    assert optimizer_bytes_per_param("fp32") < optimizer_bytes_per_param("bf16")


def test_optimizer_step_is_a_part_with_an_off_switch():
    par = LLMParallel(8, 8, 2, micro_batches=8)
    on, off = _run(par, 16), _run(par, 16, optimizer_step=False)
    assert off.optimizer == 0 and "optimizer" not in off.parts()
    assert on.optimizer > 0 and on.parts()["optimizer"] == on.optimizer
    assert on.total == pytest.approx(off.total + on.optimizer)
    assert sum(on.parts().values()) == pytest.approx(on.total)
    # nothing else moves
    assert on.micro_batch == off.micro_batch and on.bubble == off.bubble


def test_optimizer_step_is_memory_bound_over_the_local_shard():
    par = LLMParallel(8, 8, 2, micro_batches=8)
    dense, expert = stage_params(GPT3, par)
    params = max(d + e for d, e in zip(dense, expert))
    t = optimizer_time(GPT3, par, A100, "fp16")
    assert t == pytest.approx(memory_time(52 * params, A100, 5))
    # the distributed optimizer steps 1 / dp of it; more parameters, longer
    zero = optimizer_time(GPT3, LLMParallel(8, 8, 2, micro_batches=8, zero1=True), A100, "fp16")
    assert zero < t
    fewer = optimizer_time(GPT3, LLMParallel(8, 16, 1, micro_batches=8), A100, "fp16")
    assert 0 < fewer < t


def test_unfused_attention_gemms_never_beat_their_memory_roofline():
    par = LLMParallel(8, 1, 1, micro_batches=1, attention="unfused")
    tokens = 2048 * 4
    lt = layer_times(GPT3, par, A100, "fp16", tokens)
    s, d = GPT3.seq, GPT3.head_dim
    heads = tokens / s * GPT3.heads / par.tp
    scores = heads * s * s
    flops_only = sum(dense_layer_time(m, k, n, A100, "fp16")[0]
                     for m, k, n in ((s * heads, d, s), (s * heads, s, d)))
    floor = 2 * memory_time(BMM_SCORE_BYTES_FWD * scores, A100, 0)
    # the attention GEMMs are at least their flops-only time and their HBM floor
    assert lt.attention >= max(flops_only, floor)
    assert BMM_SCORE_BYTES_BWD == 2 * BMM_SCORE_BYTES_FWD
    # flash attention keeps no scores: no floor term
    flash = layer_times(GPT3, LLMParallel(8, 1, 1, micro_batches=1), A100, "fp16", tokens)
    assert flash.attention < lt.attention
