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
.. [3] NVIDIA Megatron-LM, ``docs/source/api-guide/dist_optimizer.md``: bytes per
   parameter with the distributed optimizer over ``d`` data-parallel ranks, ``4 + 16/d``
   (fp16 parameters and gradients: the fp32 main gradients are sharded with the
   optimizer states), ``6 + 12/d`` (bf16 parameters, fp32 gradients: the gradient
   buffer is the main gradient and is not sharded).
.. [4] A. Grattafiori et al., "The Llama 3 Herd of Models", arXiv 2407.21783, §3.3.2:
   FSDP shards the optimizer states and the gradients; one layer fewer on the first
   and the last pipeline stage; context parallelism splits the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from topoopt.llm.parallel import LLMParallel, stage_layers
from topoopt.workloads.gpt import TransformerShape

__all__ = ["HBM_USABLE", "MemoryBreakdown", "stage_params", "replicated_kv_params",
           "memory_per_gpu", "recompute_transient",
           "activation_bytes_per_token", "has_dropout", "in_flight"]

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
    1``, as in Megatron-LM). With fewer KV heads than ``tp`` each GPU holds the K and V
    weights of a whole KV head (:func:`replicated_kv_params`), as it computes them.
    """
    layers = stage_layers(shape.layers, par.pp, par.virtual, par.edge_layers)
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
        dense.append(d / par.tp + n * replicated_kv_params(shape, par.tp))
        expert.append(e / (par.tp * par.ep))
    return dense, expert


def replicated_kv_params(shape: TransformerShape, tp: int) -> float:
    """Parameters of one layer's K and V projections a GPU holds beyond ``1 / tp`` of
    them: 0 unless ``tp`` exceeds the KV heads, when the ``tp / kv_heads`` GPUs of a KV
    head each keep all of its weights (``2 (h + bias) kv_dim / kv_heads`` per GPU, not
    ``/ tp``), as each computes all of its K and V (:func:`activation_bytes_per_token`,
    the QKV GEMM of ``topoopt.llm.iteration.layer_times``). Latent (MLA) attention has
    no KV heads to replicate: 0.

    Examples
    --------
    Llama 3 8B (8 KV heads of 128) at ``tp = 16``: each GPU keeps a whole KV head, 2 x
    4096 x 128 weights, of which ``1 / 16`` of the layer's K and V would be half.

    >>> from topoopt.workloads import build_model
    >>> from topoopt.workloads.gpt import transformer_shape
    >>> s = transformer_shape(build_model("llama3-8b"))
    >>> replicated_kv_params(s, 16), replicated_kv_params(s, 8)
    (524288.0, 0.0)
    """
    if shape.mla or tp <= shape.kv_heads:
        return 0.0
    bias = 1 if (shape.bias or shape.qkv_bias) else 0
    per_layer = 2.0 * (shape.hidden + bias) * shape.kv_dim
    return per_layer / shape.kv_heads - per_layer / tp


def has_dropout(shape: TransformerShape) -> bool:
    """Whether ``shape`` trains with dropout (its masks are activations): LayerNorm GPTs
    (GPT-2/3, Megatron-LM's, OPT, BLOOM: 0.1) do; RMSNorm models (Llama, Mistral, Qwen,
    DeepSeek) train without it in their published recipes. An assumption on the
    shape's family, stated in docs/llm-model.md."""
    return not shape.rms_norm


def activation_bytes_per_token(shape: TransformerShape, recompute: str,
                               flash_attention: bool = True, tp: int = 1,
                               recompute_norms: bool = False,
                               recompute_act: bool = False) -> float:
    """Bytes of 16-bit activations one layer keeps per token for its backward, on one
    GPU of a ``tp``-way tensor- and sequence-parallel group (Korthikanti et al. §4.1,
    §4.2.2 and Table 2, term by term: every term ``/ tp``).

    Korthikanti's ``34 h``: attention block ``11 h`` = the QKV input ``2 h``, Q and K
    ``4 h``, V ``2 h``, the output projection's input ``2 h``, its dropout mask ``h``
    (+ ``5 a s`` for the scores, softmax and its dropout mask); two LayerNorms ``4 h``;
    MLP ``19 h`` = input ``2 h``, two ``4h``-wide 16-bit tensors ``16 h``, a dropout
    mask ``h``. Generalised term by term: K and V are ``kv_dim`` wide (grouped-query
    attention), the MLP's ``16 h`` becomes ``4 f`` (GELU) or ``6 f`` (SwiGLU: gate, up
    and their product), with ``f`` the width a token goes through (``top_k x
    capacity_factor`` experts in a MoE layer, plus the shared ones), and the two
    ``h`` dropout masks go with the dropout (:func:`has_dropout`). Fused (flash)
    attention keeps no scores: the ``5 a s`` term goes. With fewer KV heads than
    ``tp`` each GPU keeps a whole KV head (they are replicated, not split): K and V
    are ``kv_dim / min(tp, kv_heads)`` wide per GPU. Full recomputation keeps the
    layer input, ``2 h / tp`` (sequence parallel). Output-discarding recomputation
    (Megatron-core's ``--recompute-modules``; :class:`LLMParallel`): of the norms
    (``recompute_norms``) drops their outputs, the QKV and MLP inputs, ``4 h / tp``;
    of the activation (``recompute_act``) drops its output, the second GEMM's input,
    ``2 f / tp``.

    Examples
    --------
    Korthikanti's ``34 s b h / t`` (Table 2, selective recomputation with sequence
    parallelism), GPT-3 175B at ``t = 8``:

    >>> from topoopt.workloads import build_model
    >>> from topoopt.workloads.gpt import transformer_shape
    >>> gpt3 = transformer_shape(build_model("gpt3-175b"))
    >>> activation_bytes_per_token(gpt3, "selective", False, 8) == 34 * 12288 / 8
    True
    """
    h = shape.hidden
    if recompute == "full":
        return 2.0 * h / tp
    width = (shape.top_k * shape.capacity_factor * shape.expert_ffn
             + shape.shared_experts * shape.ffn) if shape.moe else shape.ffn
    masks = 2.0 * h if has_dropout(shape) else 0.0
    kv = 4.0 * shape.kv_dim / min(tp, shape.kv_heads)   # K and V of the local KV heads
    # QKV input, Q, the projection's input; two norm inputs; the MLP input; the MLP
    # activation's input (gate and up, or the GELU input) and output
    per = (6.0 * h + 4.0 * h + 2.0 * h + (6.0 if shape.gated else 4.0) * width
           + masks) / tp + kv
    if recompute_norms:   # the norms' outputs: the QKV input and the MLP input
        per -= 4.0 * h / tp
    if recompute_act:     # the activation's output, the second GEMM's input
        per -= 2.0 * width / tp
    if recompute == "none" and not flash_attention:
        per += 5.0 * shape.heads * shape.seq / tp
    return per


def in_flight(par: LLMParallel, stage: int) -> float:
    """Micro-batches of its layers stage ``stage`` keeps activations for, at most.

    1F1B: the ``p - s - 1`` warm-up forwards and the one in flight (SC'21 §2.2.1). The
    interleaved schedule runs ``2 (p - s - 1) + (v - 1) N + 1`` chunk forwards before
    its first backward, each ``1 / v`` of the stage's layers, with ``N`` micro-batches
    per round: ``N = p`` in Megatron-LM (its warm-up count), which gives ``p (1 + (p -
    1) / (p v))`` micro-batches on the first stage (Korthikanti et al. §4.2.3); Llama
    3's schedule makes ``N`` tunable (§3.3.2) so that ``m`` need not be a multiple of
    ``p``, as PyTorch's flexible interleaved 1F1B does with ``N = m / floor(m / p)``
    (``torch.distributed.pipelining``: ``microbatches_per_round``), taken here; it is
    ``p`` whenever ``p`` divides ``m``. Never more than the ``m`` micro-batches.
    """
    p, v, m = par.pp, par.virtual, par.micro_batches
    if v == 1:
        return float(min(m, p - stage))
    per_round = m // max(1, m // p)
    return min(m * v, 2 * (p - stage - 1) + (v - 1) * per_round + 1) / v


def recompute_transient(shape: TransformerShape, par: LLMParallel, mb_tokens: float,
                        dtype_bytes: int) -> float:
    """Bytes full recomputation rebuilds for one layer and one micro-batch of
    ``mb_tokens`` tokens on one GPU, live during that layer's backward (0 unless
    ``recompute = "full"``): the layer's activations without recomputation less its
    input, which is kept anyway.

    Korthikanti et al.'s count with full recomputation, ``2 s b h L / t``, keeps the
    layer inputs only; the layer being recomputed holds its whole set again until its
    backward is done. Checkpointing is per layer, so it is one layer's set at a time:
    torchtitan wraps every ``TransformerBlock`` in ``checkpoint_wrapper``
    (``torchtitan/parallelisms/parallelize_llama.py``, ``_apply_ac_to_transformer_block``),
    Megatron-LM recomputes units of ``--recompute-num-layers`` layers, 1 by default
    (``megatron/training/arguments.py``). Full recomputation so never keeps more than
    none: ``L F full + (none - full) <= L F none`` for any ``L F >= 1`` layer-micro-batches.
    """
    if par.recompute != "full":
        return 0.0
    args = (par.flash_attention, par.tp, par.recompute_norms, par.recompute_act)
    return (mb_tokens * dtype_bytes / 2
            * (activation_bytes_per_token(shape, "none", *args)
               - activation_bytes_per_token(shape, "full", *args)))


def memory_per_gpu(shape: TransformerShape, par: LLMParallel, global_batch: int,
                   dtype_bytes: int, gpu_memory: float,
                   grad_bytes: float | None = None) -> MemoryBreakdown:
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
    grad_bytes : float, optional
        Bytes of the gradient buffer per parameter: ``dtype_bytes`` (default; ZeRO's
        ``2 + 2 + 12``) or 4 (fp32 gradients, Megatron's default with bf16: ``2 + 4 +
        12``); given as 2, Megatron's fp16 copy of fp32 main gradients is added to the
        optimizer (``2 + 2 + 16``). With ``zero1`` the optimizer bytes are divided over the
        ``dp x cp`` ranks; ``shard_grads`` divides the gradient buffer too, but only
        without gradient accumulation (``m = 1``): over ``m > 1`` micro-batches the
        gradients accumulate whole and are reduce-scattered once, after the last
        micro-batch's backward (the one reduction per iteration the time model
        charges), so the stage's whole buffer is held through the iteration. That is
        how PyTorch pipelining drives FSDP (``torch/distributed/pipelining/stage.py``,
        ``backward_maybe_with_nosync``: ``set_requires_gradient_sync(False)`` until the
        last backward), accumulating in fp32 when the reduction is fp32 (pytorch/pytorch
        PR #125191, "for microbatching use cases (e.g. PP)"), and Llama 3's §3.3.4: "FP32
        gradient accumulation during backward computation over multiple micro-batches"
        and an FP32 reduce-scatter. Reduce-scattering every micro-batch instead (FSDP
        without ``no_sync``) would keep only the shard but send ``m`` times the bytes;
        it is not modelled.

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
    layers = stage_layers(shape.layers, par.pp, par.virtual, par.edge_layers)
    grad = float(dtype_bytes if grad_bytes is None else grad_bytes)
    opt_per_param = 12.0 if dtype_bytes == 2 else 8.0
    if grad_bytes is not None and grad < 4.0:   # Megatron's fp32 main-gradient copy
        opt_per_param += 4.0
    dp = par.grad_replicas
    edp = dp // par.ep
    # each GPU holds 1/cp of a micro-batch's tokens (context parallelism)
    mb_tokens = global_batch // par.dp // par.micro_batches * shape.seq / par.cp
    act_token = (activation_bytes_per_token(shape, par.recompute, par.flash_attention,
                                            par.tp, par.recompute_norms, par.recompute_act)
                 * dtype_bytes / 2)
    recomputed = recompute_transient(shape, par, mb_tokens, dtype_bytes)
    stages = []
    for s in range(par.pp):
        params = dense[s] + expert[s]
        sharded = dense[s] / dp + expert[s] / edp
        opt = opt_per_param * (sharded if par.zero1 else params)
        # accumulated whole over m > 1 micro-batches, sharded once reduced
        grads = grad * (sharded if par.shard_grads and par.micro_batches == 1 else params)
        act = layers[s] * in_flight(par, s) * mb_tokens * act_token
        if layers[s]:   # the one layer whose forward is run again, during its backward
            act += recomputed
        if s == par.pp - 1:   # fp32 logits of one micro-batch for the loss
            act += mb_tokens * shape.vocab * 4.0 / par.tp
        stages.append(MemoryBreakdown(s, params, params * dtype_bytes, grads,
                                      opt, act, HBM_USABLE * gpu_memory))
    return max(stages, key=lambda m: m.total)  # the first of the fullest stages
