"""The kernel model: structure and invariants, not its fitted values."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from topoopt.cluster import GPUS, Cluster
from topoopt.compute import gemm_shape, op_time
from topoopt.kernels import (
    FLASH_BWD_OVER_FWD,
    KERNEL_PROFILES,
    attention_time,
    dense_layer_time,
    flash_attention_times,
    gemm_efficiency,
    gemm_time,
    kernel_profile,
    wave_efficiency,
)
from topoopt.model import Operator
from topoopt.strategy import OpConfig
from topoopt.workloads.bert import attention
from topoopt.workloads.layers import dense, norm

SIZES = (1, 7, 64, 256, 1000, 4096, 18432, 65536)


@pytest.mark.parametrize("gpu", sorted(KERNEL_PROFILES))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_larger_gemm_is_never_less_efficient(gpu, precision):
    spec = GPUS[gpu]
    for m, n, k in itertools.product(SIZES, repeat=3):
        e = gemm_efficiency(m, n, k, spec, precision)
        assert 0 < e <= kernel_profile(spec).gemm_peak_fraction[precision]
        for grown in ((2 * m, n, k), (m, 2 * n, k), (m, n, 2 * k)):
            assert gemm_efficiency(*grown, spec, precision) >= e


def test_a_gemm_costs_at_least_a_launch_and_more_work_more_time():
    spec = GPUS["A100"]
    launch = kernel_profile(spec).launch
    for m, n, k in itertools.product(SIZES, repeat=3):
        t = gemm_time(m, n, k, spec, "bf16")
        assert t > launch
        assert gemm_time(2 * m, n, k, spec, "bf16") >= t
    assert gemm_time(0, 10, 10, spec, "bf16") == 0.0


def test_backward_is_two_gemms_of_the_transposed_shapes():
    spec = GPUS["H100"]
    fwd, bwd = dense_layer_time(512, 1024, 4096, spec, "bf16")
    assert fwd == gemm_time(512, 4096, 1024, spec, "bf16")
    assert bwd == pytest.approx(gemm_time(512, 1024, 4096, spec, "bf16")
                                + gemm_time(1024, 4096, 512, spec, "bf16"))


def test_attention_time_is_linear_in_flops_plus_launches():
    spec = GPUS["A100"]
    launch = kernel_profile(spec).launch
    a, b = attention_time(1e12, spec, "bf16"), attention_time(2e12, spec, "bf16")
    assert b - launch == pytest.approx(2 * (a - launch))
    assert attention_time(0.0, spec, "bf16") == 0.0


def test_the_measurement_file_is_topoopts():
    """The data the model was fitted on is there, unchanged in structure."""
    path = Path(__file__).resolve().parent.parent / "benchmarks/data/topoopt_dlrm_measure_32768_128.json"
    doc = json.loads(path.read_text())
    assert doc["batch_size"] == 32768 and doc["ngpus"] == 128
    names = {m["name"] for m in doc["measurements"]}
    assert {"Dense_2048_2048", "Dense_4096_4096", "Dense_18432_4096", "Dense_4096_1"} <= names


@pytest.mark.parametrize("gpu", sorted(KERNEL_PROFILES))
def test_sustained_clock_and_nccl_share_never_exceed_the_datasheet(gpu):
    """Both scale a datasheet rate down (power-limited clock, NCCL's bus bandwidth)."""
    prof = KERNEL_PROFILES[gpu]
    assert 0 < prof.sustained_clock <= 1 and 0 < prof.collective_fraction <= 1
    spec = GPUS[gpu]
    big = gemm_efficiency(65536, 65536, 65536, spec, "bf16")
    assert big == pytest.approx(prof.gemm_peak_fraction["bf16"] * prof.sustained_clock,
                                rel=1e-2)
    # TF32 was fitted on sustained measurements: not scaled again
    assert gemm_efficiency(65536, 65536, 65536, spec, "fp32") == pytest.approx(
        prof.gemm_peak_fraction["fp32"], rel=1e-2)


def test_wave_efficiency_is_a_monotone_lower_bound_of_wave_quantization():
    """Below the sawtooth ``w / ceil(w)`` of NVIDIA's wave quantization, nondecreasing,
    and tending to one."""
    ws = [i / 64 for i in range(1, 64 * 40)]
    effs = [wave_efficiency(w) for w in ws]
    assert all(b >= a for a, b in zip(effs, effs[1:]))
    assert all(0 < e <= w / math.ceil(w) + 1e-12 for w, e in zip(ws, effs))
    assert wave_efficiency(0.25) == 0.25
    # just past one wave, two waves' time for barely more than one wave's tiles
    assert wave_efficiency(1.0 + 1e-9) == pytest.approx(0.5)
    assert wave_efficiency(1000.5) > 0.998


def test_the_tile_count_sets_the_wave_a_gemm_runs_in():
    """A quarter wave of tiles runs at a quarter of a many-wave GEMM's efficiency; one
    tile past a full wave at half of it (two waves' time)."""
    spec = GPUS["A100"]
    prof = kernel_profile(spec)
    k = 4096
    one_wave = prof.tile * prof.sms           # (sms T) x T: sms tiles
    top = prof.gemm_peak_fraction["fp32"] * k / (k + prof.k_half)
    assert gemm_efficiency(one_wave / 4, prof.tile, k, spec, "fp32") == pytest.approx(top / 4)
    assert gemm_efficiency(one_wave + prof.tile, prof.tile, k, spec, "fp32") == pytest.approx(
        top * (prof.sms + 1) / prof.sms / 2)
    assert gemm_efficiency(one_wave * 1000, prof.tile, k, spec, "fp32") > 0.99 * top


@pytest.mark.parametrize("d_in,d_out,tokens,bias", [(2048, 2048, 1, True), (4096, 1, 1, True),
                                                    (1024, 4096, 64, False)])
def test_gemm_shape_reads_back_the_dense_constructor(d_in, d_out, tokens, bias):
    op = dense("x", d_in, d_out, ("y",), bias=bias, tokens=tokens)
    got = gemm_shape(op)
    assert got is not None
    t, k, n = got
    assert (t, k, n) == (tokens, d_in, d_out)
    # counts no dense() makes (a tied decoder: bias only) keep the operator's FLOPs
    odd = Operator("dec", "dense", params=30522, fwd_flops=2.0 * 64 * 1024 * 30522,
                   out_elems=64 * 30522)
    t, k, n = gemm_shape(odd)
    assert 2 * t * k * n == pytest.approx(odd.fwd_flops) and k == 1024
    assert gemm_shape(Operator("z", "dense")) is None


def test_op_time_times_a_dense_layer_as_its_gemms_on_each_gpu():
    """A server of 4 GPUs runs a quarter of its samples per GPU; an mp split narrows
    the GEMM: never faster per FLOP, never slower than the unsplit layer."""
    c1 = Cluster(servers=4, nics=1, link_bandwidth=1e11, gpus_per_server=1)
    c4 = Cluster(servers=4, nics=1, link_bandwidth=1e11, gpus_per_server=4)
    op = dense("x", 4096, 4096, ("y",))
    a = op_time(op, OpConfig((0,), 1), c4, "fp32", 4, 4096)
    b = op_time(op, OpConfig((0,), 1), c1, "fp32", 4, 1024)
    assert a == pytest.approx(b)
    assert b == pytest.approx(dense_layer_time(1024, 4096, 4096, c1.gpu, "fp32"))
    whole = sum(op_time(op, OpConfig((0,), 1), c1, "fp32", 4, 4096))
    half = sum(op_time(op, OpConfig((0, 1), 1, 2), c1, "fp32", 4, 4096))
    assert whole / 2 <= half < whole


def test_every_compute_op_costs_at_least_a_launch_and_no_more_than_peak_allows():
    cluster = Cluster(servers=2, nics=1, link_bandwidth=1e11, gpus_per_server=1)
    launch = kernel_profile(cluster.gpu).launch
    peak = cluster.peak_flops("fp32")
    for op in (dense("d", 4096, 1, ("x",)), dense("e", 64, 64, ("x",), tokens=8),
               attention("a", 1024, 16, 64, ("x",)), norm("n", 1024, 64 * 1024, ("x",))):
        for batch in (1, 64, 4096):
            fwd, bwd = op_time(op, OpConfig((0,), 1), cluster, "fp32", 4, batch)
            assert fwd >= launch and bwd >= launch
            assert fwd >= op.fwd_flops * batch / peak and bwd >= op.bwd_flops * batch / peak
            more = op_time(op, OpConfig((0,), 1), cluster, "fp32", 4, 2 * batch)
            assert more[0] >= fwd and more[1] >= bwd


def test_bert_and_the_llm_model_time_flash_attention_alike():
    """One backward-over-forward count for every fused attention: the DLRM/BERT
    estimator's attention op is its projection GEMMs plus ``flash_attention_times`` of
    its score FLOPs (backward 2.5 x the forward's, not the op's 2 x), the constant the
    LLM model imports."""
    from topoopt.llm import iteration
    assert iteration.FLASH_BWD_OVER_FWD is FLASH_BWD_OVER_FWD == 2.5
    cluster = Cluster(servers=2, nics=1, link_bandwidth=1e11, gpus_per_server=1,
                      gpu=GPUS["A100"])
    h, s, batch = 1024, 2048, 8
    op = attention("a", h, 16, s, ("x",))
    fwd, bwd = op_time(op, OpConfig((0,), 1), cluster, "bf16", 2, batch)
    width = math.sqrt(op.params / 4.0)   # the estimator reads the shape back from counts
    tokens = op.out_elems / width
    p_fwd, p_bwd = dense_layer_time(batch * tokens, width, 4 * width, cluster.gpu, "bf16")
    scores = batch * (op.fwd_flops - 2.0 * op.params * tokens)
    a_fwd, a_bwd = flash_attention_times(scores, cluster.gpu, "bf16")
    assert (fwd, bwd) == pytest.approx((p_fwd + a_fwd, p_bwd + a_bwd))
    launch = kernel_profile(cluster.gpu).launch
    assert a_bwd - launch == pytest.approx(FLASH_BWD_OVER_FWD * (a_fwd - launch))
