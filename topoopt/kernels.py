"""Kernel efficiency of dense (GEMM) and attention layers on one GPU, per GPU generation.

A GEMM ``C (m x n) = A (m x k) B (k x n)`` takes ``launch + 2 m n k / (peak x eff)``
with

    ``eff = e_max x wave(tiles / SMs) x k / (k + k_half)``,
    ``tiles = max(1, m / T) x max(1, n / T)``:

``e_max`` is what a large GEMM reaches on this GPU and precision. ``wave`` is wave
quantization (NVIDIA's "Matrix Multiplication Background" guide): the GPU runs the
``T x T`` output tiles in waves of one tile per SM, so ``w = tiles / SMs`` waves take
``ceil(w)`` waves' time. That sawtooth ``w / ceil(w)`` makes some larger GEMMs less
efficient than smaller ones; the model takes its monotone lower envelope, the
efficiency every GEMM at least this large is guaranteed: ``min(w, 1/2)`` up to one
wave (one tile past a full wave halves it), then ``min(w / ceil(w), ceil(w) / (ceil(w)
+ 1))``. A short reduction ``k`` spends a larger
share of the kernel in its prologue and epilogue. ``launch`` is the fixed cost of a
kernel (launch, framework dispatch and the fused epilogue), paid also by a GEMV. Every
factor is nondecreasing in ``m``, ``n`` and ``k``: a larger GEMM is never less
efficient.

``k_half``, ``launch`` and A100's TF32 ``e_max`` are fitted (``T = 128`` and the SM
count fixed) on TopoOpt's published per-operator DLRM measurements
(``benchmarks/data/topoopt_dlrm_measure_32768_128.json``; docs/kernels.md gives the
fit, its residuals and the held-out batch sizes); the 16-bit ``e_max`` of each GPU comes
from published large-GEMM throughput (references), at the clock the GPU sustains at
its power limit. Fused attention is the published fraction of peak of the kernel the
run names (:func:`attention_kernel`: FlashAttention-2 or -3; a property of the run, not
only of the GPU). NCCL's share
of NVLink is here too: the collectives are kernels of the same GPU.

References
----------
.. [1] NVIDIA, "Matrix Multiplication Background User's Guide" (GEMM tiles and wave
   quantization), docs.nvidia.com/deeplearning/performance.
.. [2] hipersys-team/TopoOpt, simulation/scripts/fig12_13_14_15/
   dlrm_128_128table_batchsweep/measure_32768_128.json (Apache-2.0).
.. [3] T. Dao, "FlashAttention-2", arXiv 2307.08691 (July 2023), §4.1: fwd+bwd with the
   causal mask at head dimension 128 and 16k tokens, 189 TFLOP/s on A100 SXM4 80GB (Fig. 4d)
   and 328 on H100 SXM5 (Fig. 7d; the figures are ``assets/flash2_a100_fwd_bwd_benchmark.png``
   and ``assets/flash2_h100_fwd_bwd_benchmark.png`` in Dao-AILab/flash-attention).
   J. Shah et al., "FlashAttention-3", arXiv 2407.08608 (July 11, 2024; Hopper only), §4.1
   at head dimension 128 and 16k tokens on H100 SXM5: forward with the causal mask 616
   TFLOP/s (Fig. 5d), backward 561 (Fig. 6, published without the mask only).
.. [4] NVIDIA, "New cuBLAS 12.0 Features and Matrix Multiplication Performance on NVIDIA
   Hopper GPUs" (2023): large bf16 GEMMs at about 70 % of H100 SXM's peak; A100 at
   about 80 % of its 312 TFLOP/s.
.. [5] G. Lockwood, "Peak FLOPS" (glennklockwood.com/garden/peak-FLOPS): NVIDIA states
   A100's HPL peak at 1305 MHz, the clock an A100 sustains at its power limit under
   tensor-core load, not its 1410 MHz boost (the datasheet's 312 TFLOP/s).
.. [6] NVIDIA/nccl-tests issue #149 (2023): ``all_reduce_perf`` on 8 A100-SXM4-80GB over
   NVSwitch reaches a bus bandwidth of about 200 GB/s of NVLink's 300 GB/s per direction.
.. [7] G. Lockwood, "H100" (glennklockwood.com/garden/processors/h100): H100 SXM's
   989.4 TFLOP/s BF16 peak is stated at 1830 MHz (its FP64 66.9 TFLOP/s at 1980 MHz);
   the Top500's HPL Rpeak of H100 systems is 55.0-59.0 TFLOP/s per GPU, i.e. the
   submitters' sustained clock under tensor-core load is 1628-1746 MHz.
.. [8] NVIDIA/nccl-tests issue #212 (2024, S. Jeaugey, NCCL): on 8 H100 the NVLink line
   rate is 450 GB/s per direction; with the protocol overhead NCCL's effective NVLink
   bandwidth is 370 GB/s, the bus bandwidth of every collective but the NVLink-SHARP
   all-reduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from topoopt.cluster import ATTENTION, GpuSpec
from topoopt.errors import ConfigError

__all__ = ["KernelProfile", "KERNEL_PROFILES", "kernel_profile", "attention_kernel",
           "gemm_efficiency",
           "gemm_time", "wave_efficiency", "attention_time", "flash_attention_times",
           "dense_layer_time", "memory_time", "STREAM_FRACTION", "FLASH_BWD_OVER_FWD"]

#: FLOPs of FlashAttention's backward kernel over its forward's: ``dV``, ``dP``,
#: ``dQ``, ``dK`` and the recomputed ``Q K^T``, five matmuls to the forward's two. It is
#: the count FlashAttention's published fwd+bwd TFLOP/s use (``flops(..., mode)`` in
#: Dao-AILab/flash-attention ``benchmarks/benchmark_flash_attention.py``: ``bwd`` 2.5 x,
#: ``fwd_bwd`` 3.5 x the forward), so the kernel is timed on those FLOPs at that rate.
FLASH_BWD_OVER_FWD = 2.5

#: Fraction of the HBM datasheet bandwidth that element-wise kernels (norms, activations,
#: dropout, residual adds, softmax) stream at: NVIDIA's STREAM-like bandwidth tests reach
#: about 90 % on A100 and H100 for large copies; 0.8 leaves room for the smaller,
#: fused ones. An assumption, stated in docs/llm-model.md.
STREAM_FRACTION = 0.8


@dataclass(frozen=True)
class KernelProfile:
    """How close one GPU generation's kernels get to its peak.

    Attributes
    ----------
    sms : int
        Streaming multiprocessors (A100: 108, H100 SXM: 132).
    gemm_peak_fraction : Mapping[str, float]
        ``e_max`` per precision (``fp32`` means TF32 tensor cores, ``bf16``/``fp16``,
        ``fp8``): a large GEMM's fraction of the datasheet peak.
    attention_peak_fraction : Mapping[str, float]
        Per fused attention kernel published for this GPU (``flash2``, ``flash3``; oldest
        first, the last is the default), its forward+backward fraction of the 16-bit peak
        on the FLOPs the kernel executes (FlashAttention's own count, ``flops()`` of its
        ``benchmarks/benchmark_flash_attention.py``). A kernel missing here was not
        published for the GPU (FlashAttention-3 is Hopper-only).
    sustained_clock : float
        Clock the GPU holds at its power limit through a training run, over the clock
        of the datasheet peak: scales the 16-bit (and FP8) tensor-core fractions, which
        were measured in short benchmarks; TF32 was fitted on sustained training
        measurements and is not scaled.
    collective_fraction : float
        Bus bandwidth NCCL's collectives reach over NVLink, over NVLink's bandwidth per
        direction (A100: 200 of 300 GB/s, nccl-tests #149; H100: 370 of 450 GB/s,
        nccl-tests #212, for the reduce-scatters, all-gathers and sends that tensor,
        pipeline and context parallelism use).
    tile : int
        T, the output tile of one SM's thread block (cuBLAS: 128 x 128).
    k_half : float
        Reduction length at which the main loop is half of a kernel's time.
    launch : float
        Seconds of fixed cost per kernel.
    """

    sms: int
    gemm_peak_fraction: Mapping[str, float]
    attention_peak_fraction: Mapping[str, float]
    sustained_clock: float = 1.0
    collective_fraction: float = 1.0
    tile: int = 128
    k_half: float = 59.0
    launch: float = 11.8e-6


def _fwd_bwd(fwd: float, bwd: float) -> float:
    """FlashAttention's fwd+bwd rate from its forward and backward rates: the backward
    kernel executes :data:`FLASH_BWD_OVER_FWD` times the forward's FLOPs, the pair 3.5 x
    (the count of its ``fwd_bwd`` benchmark)."""
    return (1.0 + FLASH_BWD_OVER_FWD) / (1.0 / fwd + FLASH_BWD_OVER_FWD / bwd)


#: Fitted on TopoOpt's DLRM measurements (A100, TF32: e_max 0.466, k_half 59, launch
#: 11.8 us, T = 128 and 108 SMs fixed; docs/kernels.md); 16-bit and attention fractions
#: from the references.
_A100_TF32 = 0.466
#: H100 SXM's clock under sustained tensor-core load: the middle of the 55.0-59.0 TFLOP/s
#: per GPU of the Top500's H100 Rpeaks over the 66.9 TFLOP/s FP64 peak at 1980 MHz [7]
#: (1628-1746 MHz; the A100's 1305 MHz is found the same way).
_H100_SUSTAINED_MHZ = 57.0 / 66.9 * 1980.0
#: Fused attention, fwd+bwd at head dimension 128 and 16k tokens, causal where published
#: [3], over the datasheet 16-bit peak (312 and 989.4 TFLOP/s).
_A100_ATTENTION = MappingProxyType({"flash2": 189.0 / 312.0})
_H100_ATTENTION = MappingProxyType({"flash2": 328.0 / 989.4,
                                    "flash3": _fwd_bwd(616.0, 561.0) / 989.4})
KERNEL_PROFILES: Mapping[str, KernelProfile] = MappingProxyType({
    "A100": KernelProfile(108, MappingProxyType({"fp32": _A100_TF32, "fp16": 0.80,
                                                 "bf16": 0.80}),
                          _A100_ATTENTION,
                          sustained_clock=1305.0 / 1410.0, collective_fraction=200.0 / 300.0),
    "H100": KernelProfile(132, MappingProxyType({"fp32": _A100_TF32 * 0.70 / 0.80,
                                                 "fp16": 0.70, "bf16": 0.70, "fp8": 0.55}),
                          _H100_ATTENTION,
                          sustained_clock=_H100_SUSTAINED_MHZ / 1830.0,
                          collective_fraction=370.0 / 450.0),
})


def kernel_profile(gpu: GpuSpec) -> KernelProfile:
    """The profile of ``gpu`` (by name; an unknown GPU gets A100's shape factors)."""
    return KERNEL_PROFILES.get(gpu.name, KERNEL_PROFILES["A100"])


def attention_kernel(gpu: GpuSpec, name: str = "auto") -> str:
    """The attention kernel a run naming ``name`` uses on ``gpu``: the validation of
    ``job.attention`` against the GPU, in one place.

    Parameters
    ----------
    gpu : GpuSpec
    name : str
        One of :data:`topoopt.cluster.ATTENTION`.

    Returns
    -------
    str
        ``name``, or for ``auto`` the newest fused kernel published for ``gpu`` (the
        last of its :attr:`KernelProfile.attention_peak_fraction`).

    Raises
    ------
    ConfigError
        ``job.attention``: an unknown kernel, or one with no published rate on ``gpu``.
    """
    if name not in ATTENTION:
        raise ConfigError("job.attention", name, f"use one of {', '.join(ATTENTION)}")
    fused = kernel_profile(gpu).attention_peak_fraction
    if name == "auto":
        return list(fused)[-1]
    if name != "unfused" and name not in fused:
        raise ConfigError("job.attention", name,
                          f"has no published rate on {gpu.name} (FlashAttention-3 runs on "
                          f"Hopper only): use one of auto, {', '.join(fused)}, unfused")
    return name


def _sustained(prof: KernelProfile, precision: str) -> float:
    return 1.0 if precision == "fp32" else prof.sustained_clock


def _peak(gpu: GpuSpec, precision: str) -> float:
    if precision == "fp32":
        return gpu.tf32_flops
    if precision == "fp8":
        return 2.0 * gpu.fp16_flops
    return gpu.fp16_flops


def gemm_efficiency(m: float, n: float, k: float, gpu: GpuSpec, precision: str) -> float:
    """Fraction of the peak a ``(m x k) (k x n)`` GEMM's main loop reaches.

    Parameters
    ----------
    m, n, k : float
        Rows and columns of the output, reduction length (after the layout's splits).
    gpu : GpuSpec
    precision : str
        ``fp32`` (TF32), ``fp16``, ``bf16`` or ``fp8``.

    Returns
    -------
    float
        In (0, e_max x sustained_clock]; nondecreasing in each of ``m``, ``n``, ``k``.
    """
    prof = kernel_profile(gpu)
    e_max = (prof.gemm_peak_fraction.get(precision, prof.gemm_peak_fraction["bf16"])
             * _sustained(prof, precision))
    tiles = max(1.0, m / prof.tile) * max(1.0, n / prof.tile)
    return e_max * wave_efficiency(tiles / prof.sms) * k / (k + prof.k_half)


def wave_efficiency(waves: float) -> float:
    """Share of the SMs a GEMM of ``waves`` waves of tiles keeps busy, at worst.

    Parameters
    ----------
    waves : float
        Output tiles over SMs.

    Returns
    -------
    float
        The monotone lower envelope of ``waves / ceil(waves)``, the efficiency every
        GEMM of at least ``waves`` is sure of: ``min(waves, 1/2)`` up to one wave, then
        ``min(waves / c, c / (c + 1))`` with ``c = ceil(waves)``. Nondecreasing and
        continuous, tends to 1.

    References
    ----------
    NVIDIA, "Matrix Multiplication Background User's Guide", wave quantization.
    """
    if waves <= 1.0:
        return min(max(waves, 0.0), 0.5)
    c = math.ceil(waves)
    return min(waves / c, c / (c + 1.0))


def gemm_time(m: float, n: float, k: float, gpu: GpuSpec, precision: str) -> float:
    """Seconds of one ``(m x k) (k x n)`` GEMM: ``launch + 2 m n k / (peak x eff)``.

    References
    ----------
    NVIDIA's "Matrix Multiplication Background User's Guide" (module notes).
    """
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    eff = gemm_efficiency(m, n, k, gpu, precision)
    return kernel_profile(gpu).launch + 2.0 * m * n * k / (_peak(gpu, precision) * eff)


def dense_layer_time(tokens: float, d_in: float, d_out: float, gpu: GpuSpec,
                     precision: str) -> tuple[float, float]:
    """Forward and backward seconds of a dense layer ``d_in -> d_out`` on ``tokens`` rows.

    Forward is ``Y = X W`` (``m = tokens, n = d_out, k = d_in``); backward the input
    gradient ``dX = dY W^T`` (``n = d_in, k = d_out``) and the weight gradient ``dW =
    X^T dY`` (``m = d_in, n = d_out, k = tokens``), two kernels.
    """
    fwd = gemm_time(tokens, d_out, d_in, gpu, precision)
    bwd = (gemm_time(tokens, d_in, d_out, gpu, precision)
           + gemm_time(d_in, d_out, tokens, gpu, precision))
    return fwd, bwd


def attention_time(flops: float, gpu: GpuSpec, precision: str, kernels: int = 1,
                   kernel: str = "auto") -> float:
    """Seconds of fused attention kernels executing ``flops`` (the FLOPs the kernel
    actually runs: half of the full ``Q K^T`` and ``P V`` with a causal mask), at the
    published fraction of the 16-bit peak of ``kernel`` (:func:`attention_kernel`; FP8
    runs attention in bf16), plus ``kernels`` launches.

    Raises
    ------
    ConfigError
        ``job.attention``: ``kernel`` unknown, not published for ``gpu``, or
        ``unfused`` (timed as GEMMs by its caller, not here).
    """
    name = attention_kernel(gpu, kernel)
    if name == "unfused":
        raise ConfigError("job.attention", name, "is not a fused kernel: time its GEMMs "
                                                 "and softmax (topoopt.llm.layer_times)")
    if flops <= 0:
        return 0.0
    prof = kernel_profile(gpu)
    frac = prof.attention_peak_fraction[name] * _sustained(prof, precision)
    peak = gpu.tf32_flops if precision == "fp32" else gpu.fp16_flops
    return kernels * prof.launch + flops / (peak * frac)


def flash_attention_times(flops: float, gpu: GpuSpec, precision: str,
                          kernel: str = "auto") -> tuple[float, float]:
    """Forward and backward seconds of fused (flash) attention whose forward kernel
    executes ``flops``: the backward kernel executes :data:`FLASH_BWD_OVER_FWD` times
    as many (it recomputes ``Q K^T``), both at :func:`attention_time`'s rate for
    ``kernel``. The one attention timing of the LLM model and the DLRM/BERT operator
    estimator."""
    return (attention_time(flops, gpu, precision, kernel=kernel),
            attention_time(FLASH_BWD_OVER_FWD * flops, gpu, precision, kernel=kernel))


def memory_time(nbytes: float, gpu: GpuSpec, kernels: int = 1) -> float:
    """Seconds of memory-bound kernels moving ``nbytes`` (read plus written) at
    :data:`STREAM_FRACTION` of the HBM bandwidth, plus ``kernels`` launches."""
    if nbytes <= 0:
        return 0.0
    return kernels * kernel_profile(gpu).launch + nbytes * 8.0 / (gpu.hbm_bandwidth
                                                                  * STREAM_FRACTION)
