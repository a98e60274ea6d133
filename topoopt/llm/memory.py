"""Memory of one GPU under a parallelism: weights, gradients, optimizer states, activations.

References
----------
.. [1] S. Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
   Parameter Models", SC'20, §3.1: mixed-precision Adam holds 2 + 2 + K bytes per
   parameter (fp16 weights and gradients, K = 12 for the fp32 master weights, momentum
   and variance); ZeRO stage 1 (P_os) divides the K bytes by the data-parallel degree.
.. [2] V. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
   Models", MLSys 2023, §4 and Table 2: per layer and micro-batch, ``s b h (34 + 5 a s
   / h)`` bytes of 16-bit activations; divided by t with tensor and sequence
   parallelism; ``34 s b h / t`` with selective recomputation; ``2 s b h / t`` (the layer
   input) with full recomputation. Under 1F1B the first stage keeps ``p`` micro-batches
   in flight, so a stage holds ``min(m, p)`` micro-batches of its layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from topoopt.llm.parallel import LLMParallel, stage_layers
from topoopt.workloads.gpt import TransformerShape

__all__ = ["HBM_USABLE", "MemoryBreakdown", "stage_params", "memory_per_gpu",
           "activation_bytes_per_token"]

#: Fraction of HBM a training process can fill: the rest is the CUDA context, NCCL
#: buffers and allocator fragmentation. An assumption (PyTorch reserves ~1-3 GB of an
#: 80 GB GPU outside the caching allocator; fragmentation varies), stated in
#: docs/reference-data.md.
HBM_USABLE = 0.9


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the fullest GPU (the pipeline stage that needs most).

    Attributes
    ----------
    stage : int
        That stage.
    params : float
        Parameters it holds (elements).
    weights, gradients, optimizer, activations : float
        Bytes.
    capacity : float
        Usable HBM bytes (``HBM_USABLE x`` the GPU's memory).
    """

    stage: int
    params: float
    weights: float
    gradients: float
    optimizer: float
    activations: float
    capacity: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


def stage_params(shape: TransformerShape, par: LLMParallel) -> tuple[list[float], list[float]]:
    """Per stage: (dense, routed-expert) parameters held by one GPU of the stage.

    Dense parameters are split ``tp`` ways; routed experts ``tp x ep`` ways. The
    input embedding sits on the first stage, the final norm and output projection on
    the last (a tied output projection is a copy of the embedding there when ``pp >
    1``, as in Megatron-LM).
    """
    layers = stage_layers(shape.layers, par.pp, par.virtual)
    dense, expert = [], []
    start = 0
    d: float
    e: float
    for s, n in enumerate(layers):
        if par.virtual == 1:  # contiguous layers: exact, dense-then-MoE models included
            d, e = shape.layers_params(start, start + n)
            start += n
        else:  # interleaved chunks: the per-layer mean
            d, e = n * shape.layer_dense_params, n * shape.layer_expert_params
        if s == 0:
            d += shape.embedding_params
        if s == par.pp - 1:
            d += shape.output_params
            if shape.tied_embeddings and par.pp > 1:
                d += shape.vocab * shape.hidden
        dense.append(d / par.tp)
        expert.append(e / (par.tp * par.ep))
    return dense, expert


def activation_bytes_per_token(shape: TransformerShape, recompute: str,
                               flash_attention: bool = True) -> float:
    """Bytes of 16-bit activations one layer keeps per token for its backward, before
    tensor/sequence parallelism (Korthikanti et al. Table 2, generalised).

    Korthikanti's ``34 h``: attention block ``11 h`` (+ ``5 a s`` for the scores,
    softmax and its dropout mask), two LayerNorms ``4 h``, MLP ``19 h`` = input
    ``2 h``, two ``4h``-wide 16-bit tensors ``16 h`` and a dropout mask ``h``. For
    another MLP width the ``16 h`` becomes ``4 f`` (GELU) or ``6 f`` (SwiGLU: gate, up
    and their product), with ``f`` the width a token goes through (``top_k x
    capacity_factor`` experts in a MoE layer, plus the shared ones). Fused
    (flash) attention keeps no scores: the ``5 a s`` term goes.
    """
    h = shape.hidden
    if recompute == "full":
        return 2.0 * h
    width = (shape.top_k * shape.capacity_factor * shape.expert_ffn
             + shape.shared_experts * shape.ffn) if shape.moe else shape.ffn
    per = 15.0 * h + 3.0 * h + (6.0 if shape.gated else 4.0) * width
    if recompute == "none" and not flash_attention:
        per += 5.0 * shape.heads * shape.seq
    return per


def memory_per_gpu(shape: TransformerShape, par: LLMParallel, global_batch: int,
                   dtype_bytes: int, gpu_memory: float) -> MemoryBreakdown:
    """The fullest GPU's memory under ``par``.

    Parameters
    ----------
    shape : TransformerShape
    par : LLMParallel
    global_batch : int
        Sequences per iteration.
    dtype_bytes : int
        2 (bf16/fp16 mixed precision: 2 + 2 + 12 bytes per parameter) or 4 (fp32:
        4 + 4 + 8, Adam's two moments).
    gpu_memory : float
        HBM bytes per GPU.

    Returns
    -------
    MemoryBreakdown

    Examples
    --------
    GPT-3 175B as Megatron-LM ran it (tp 8, pp 8, dp 16, full recomputation, micro-batch
    1): about 2.8 B parameters (the first stage: 12 layers and the embedding) and 45 GB of model state per GPU, which fit an 80 GB A100.

    >>> from topoopt.workloads import build_model
    >>> from topoopt.workloads.gpt import transformer_shape
    >>> s = transformer_shape(build_model("gpt3-175b"))
    >>> m = memory_per_gpu(s, LLMParallel(8, 8, 16, micro_batches=96, recompute="full"),
    ...                    1536, 2, 80e9)
    >>> round(m.params / 1e9, 2), round((m.weights + m.gradients + m.optimizer) / 1e9), m.fits
    (2.8, 45, True)
    """
    dense, expert = stage_params(shape, par)
    layers = stage_layers(shape.layers, par.pp, par.virtual)
    opt_per_param = 12.0 if dtype_bytes == 2 else 8.0
    edp = par.dp // par.ep
    mb_tokens = global_batch // par.dp // par.micro_batches * shape.seq
    act_token = activation_bytes_per_token(shape, par.recompute, par.flash_attention) * dtype_bytes / 2 / par.tp
    stages = []
    for s in range(par.pp):
        params = dense[s] + expert[s]
        opt = opt_per_param * (dense[s] / par.dp + expert[s] / edp if par.zero1 else params)
        # 1F1B: stage s keeps min(m, p - s) micro-batches in flight (the interleaved
        # schedule a little more on the first stage; not modelled)
        flight = min(par.micro_batches, par.pp - s)
        act = layers[s] * flight * mb_tokens * act_token
        if s == par.pp - 1:   # fp32 logits of one micro-batch for the loss
            act += mb_tokens * shape.vocab * 4.0 / par.tp
        stages.append(MemoryBreakdown(s, params, params * dtype_bytes, params * dtype_bytes,
                                      opt, act, HBM_USABLE * gpu_memory))
    return max(stages, key=lambda m: m.total)  # the first of the fullest stages
