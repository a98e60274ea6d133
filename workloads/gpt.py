"""Decoder-only transformers (GPT, Llama) and mixtures of experts (Mixtral) as operator graphs.

The shape of such a model is a :class:`TransformerShape`; :func:`gpt` and :func:`moe`
build its operator graph (one attention, norm, MLP or expert operator per layer, the
embeddings, the output projection and the loss), and :func:`transformer_shape` reads the
shape back from a built model's ``size``, which is what the LLM parallelism model
(:mod:`topoopt.llm`) plans with. The presets :data:`PRESETS` are published models; their
parameter counts are within 1% of the published ones (tests).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from topoopt.errors import ConfigError
from topoopt.model import Model, Operator
from topoopt.workloads.layers import (
    ACTIVATION_FLOPS_PER_ELEM,
    NORM_FLOPS_PER_ELEM,
    SOFTMAX_FLOPS_PER_ELEM,
    input_op,
    softmax_loss,
    token_embedding,
)

__all__ = ["TransformerShape", "gpt", "moe", "transformer", "transformer_shape", "is_transformer", "PRESETS",
           "PUBLISHED_PARAMS"]


@dataclass(frozen=True)
class TransformerShape:
    """The sizes of a decoder-only transformer, dense or mixture-of-experts.

    Every field after ``shared_experts`` describes a structure some published families
    have (Gemma 2, Qwen2/3, DeepSeek-V2/V3, GPT-2); its default leaves the shape as a
    plain GPT/Llama/Mixtral layer, so the presets are unchanged by them.

    Attributes
    ----------
    layers, hidden, heads, kv_heads : int
        L, h, attention heads a, key/value heads (``kv_heads < heads``: grouped-query
        attention, GQA; Ainslie et al. 2023).
    ffn : int
        Inner width f of a dense MLP (and of each shared expert unless
        ``shared_expert_ffn`` is set).
    seq : int
        s, tokens per sequence (one sample is one sequence).
    vocab : int
        V.
    tied_embeddings : bool
        The output projection reuses the input embedding (GPT-3), or has its own
        ``V x h`` matrix (Llama 3, Mixtral).
    gated : bool
        SwiGLU MLP (three ``h x f`` matrices; Shazeer 2020) instead of GELU (two).
    bias : bool
        Biases in every projection and MLP matrix (GPT-3) or none (Llama).
    learned_positions : bool
        A learned position table (GPT-3) or rotary embeddings (no parameters).
    rms_norm : bool
        RMSNorm (h parameters) instead of LayerNorm (2h).
    experts, top_k : int
        Routed experts per MoE layer and experts per token; 0 for a dense model.
    expert_ffn : int
        Inner width of each routed expert.
    capacity_factor : float
        Expert slots per token as a multiple of ``top_k`` (tokens are padded or
        dropped to ``capacity_factor x tokens x top_k / experts`` per expert; 1.0 is
        dropless on average). Scales the all-to-all volume.
    shared_experts : int
        Experts every token goes through (DeepSeekMoE), each of width
        ``shared_expert_ffn`` (or ``ffn``).
    head_size : int
        Width of one query/key/value head; 0: ``hidden // heads``. Gemma 2, Qwen3 and
        Mistral-Nemo set it apart from the hidden size. With MLA it is the width of
        a head's non-rotary part (DeepSeek's ``qk_nope_head_dim``).
    qkv_bias, out_bias, mlp_bias : bool
        Biases on the Q, K and V projections only (Qwen2), on the attention output,
        on the MLP matrices; ``bias`` turns all three on.
    positions : int
        Rows of the learned position table; 0: ``seq`` (GPT-2 has 1024 whatever the
        training sequence).
    post_norms : bool
        A second norm after the attention and after the MLP of each layer (Gemma 2's
        four norms a layer).
    qk_norm : bool
        RMSNorm over each head of Q and of K (Qwen3; ``2 x head_dim`` parameters).
    q_lora_rank, kv_lora_rank : int
        Multi-head latent attention (MLA, DeepSeek-V2): K and V come up from a
        ``kv_lora_rank``-wide latent (``h -> kv_lora_rank + rope_head_dim``, norm,
        ``kv_lora_rank -> heads x (head_dim + v_head_dim)``), Q from a
        ``q_lora_rank``-wide one (0: one ``h -> heads x qk`` matrix).
        ``kv_lora_rank = 0``: ordinary attention.
    rope_head_dim, v_head_dim : int
        MLA's decoupled rotary key width per head (shared by the heads) and the width
        of a value head (0: ``head_dim``).
    sliding_window : int
        Keys a token attends to in a sliding-window layer (Mistral, Gemma 2, Phi-3);
        ``sliding_layers`` of the layers use it, the others attend over the sequence.
    sliding_layers : int
        How many layers slide (spread evenly; Gemma 2 alternates).
    shared_expert_ffn : int
        Inner width of each shared expert; 0: ``ffn``.
    shared_gate : bool
        A learned ``h -> 1`` sigmoid gate on the shared expert's output (Qwen2-MoE).
    dense_layers : int
        In a MoE model, how many of the first layers have a dense MLP of width ``ffn``
        instead of experts (DeepSeek's ``first_k_dense_replace``).

    References
    ----------
    .. [1] DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient
       Mixture-of-Experts Language Model", arXiv 2405.04434, §2.1 (MLA), §2.2.
    .. [2] Gemma Team, "Gemma 2: Improving Open Language Models at a Practical Size",
       arXiv 2408.00118, §2.
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    vocab: int
    tied_embeddings: bool = False
    gated: bool = True
    bias: bool = False
    learned_positions: bool = False
    rms_norm: bool = True
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    capacity_factor: float = 1.0
    shared_experts: int = 0
    head_size: int = 0
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    positions: int = 0
    post_norms: bool = False
    qk_norm: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    sliding_layers: int = 0
    shared_expert_ffn: int = 0
    shared_gate: bool = False
    dense_layers: int = 0

    @property
    def moe(self) -> bool:
        """Whether the MLPs are mixtures of experts."""
        return self.experts > 0

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank > 0

    @property
    def head_dim(self) -> int:
        """Width of a query/key head (without MLA's rotary part)."""
        return self.head_size or self.hidden // self.heads

    @property
    def qk_head_dim(self) -> int:
        """Width over which a query meets a key: ``head_dim`` (+ MLA's rotary part)."""
        return self.head_dim + (self.rope_head_dim if self.mla else 0)

    @property
    def value_head_dim(self) -> int:
        """Width of one value head."""
        return self.v_head_dim or self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): ``kv_heads x head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.layers - self.dense_layers if self.moe else 0

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (from 0) has experts (the first ``dense_layers`` do not)."""
        return self.moe and i >= self.dense_layers

    def is_sliding_layer(self, i: int) -> bool:
        """Whether layer ``i`` attends over a sliding window (``sliding_layers`` of
        the ``layers``, spread evenly)."""
        n, k = self.layers, self.sliding_layers
        return -(-(i + 1) * k // n) > -(-i * k // n)

    def _weights(self, width: int) -> int:
        return (3 if self.gated else 2) * self.hidden * width

    def _mlp(self, width: int) -> int:
        biased = self.bias or self.mlp_bias
        return self._weights(width) + (((2 if self.gated else 1) * width + self.hidden)
                                       if biased else 0)

    @property
    def _shared_width(self) -> int:
        return self.shared_expert_ffn or self.ffn

    @property
    def attention_weights(self) -> int:
        """Elements of one layer's attention matrices (the matmuls' weights)."""
        h, a, v = self.hidden, self.heads, self.value_head_dim
        if not self.mla:
            return h * a * self.head_dim + 2 * h * self.kv_dim + a * v * h
        q = (h * self.q_lora_rank + self.q_lora_rank * a * self.qk_head_dim
             if self.q_lora_rank else h * a * self.qk_head_dim)
        kv = (h * (self.kv_lora_rank + self.rope_head_dim)
              + self.kv_lora_rank * a * (self.head_dim + v))
        return q + kv + a * v * h

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer, their biases and norms."""
        qkv_b, out_b = self.bias or self.qkv_bias, self.bias or self.out_bias
        if self.mla:   # the biased matrices are the down projections and the output
            biases = (self.q_lora_rank + self.kv_lora_rank + self.rope_head_dim) * qkv_b
            norms = self.q_lora_rank + self.kv_lora_rank
        else:
            biases = (self.heads * self.head_dim + 2 * self.kv_dim) * qkv_b
            norms = 0
        norms += 2 * self.head_dim * self.qk_norm
        return self.attention_weights + biases + self.hidden * out_b + norms

    @property
    def dense_mlp_params(self) -> int:
        """The MLP of one dense layer (0 in a MoE model without dense layers)."""
        return self._mlp(self.ffn) if not self.moe or self.dense_layers else 0

    @property
    def expert_params(self) -> int:
        """One routed expert."""
        return self._mlp(self.expert_ffn) if self.moe else 0

    @property
    def shared_params(self) -> int:
        """The shared experts (and their gate) and the router of one MoE layer (held by
        every EP rank)."""
        if not self.moe:
            return 0
        return (self.shared_experts * self._mlp(self._shared_width)
                + self.hidden * (self.experts + self.shared_gate))

    @property
    def norm_params(self) -> int:
        return self.hidden * (1 if self.rms_norm else 2)

    @property
    def layer_norm_params(self) -> int:
        """The norms of one layer around its attention and MLP (2, or 4 with
        ``post_norms``)."""
        return (4 if self.post_norms else 2) * self.norm_params

    def layer_params(self, i: int) -> tuple[int, int]:
        """(dense, routed-expert) parameters of layer ``i``: what every expert-parallel
        rank holds in full (attention, norms, the dense MLP or router and shared
        experts), and the routed experts (split over expert parallelism too)."""
        common = self.attention_params + self.layer_norm_params
        if self.is_moe_layer(i):
            return common + self.shared_params, self.experts * self.expert_params
        return common + self._mlp(self.ffn), 0

    def layers_params(self, start: int, stop: int) -> tuple[int, int]:
        """(dense, routed-expert) parameters of layers ``start`` to ``stop - 1``,
        exactly (a pipeline stage's)."""
        moe = max(0, stop - max(start, self.dense_layers)) if self.moe else 0
        dense = stop - start - moe
        common = (stop - start) * (self.attention_params + self.layer_norm_params)
        return (common + dense * self._mlp(self.ffn) + moe * self.shared_params,
                moe * self.experts * self.expert_params)

    @property
    def layer_dense_params(self) -> float:
        """Parameters of one layer that every expert-parallel rank holds in full
        (split by tensor parallelism only): attention, norms, dense MLP, router and
        shared experts. The mean over the layers where they differ (dense-then-MoE);
        :meth:`layers_params` gives a stage's exactly."""
        total = self.layers_params(0, self.layers)[0]
        return total // self.layers if total % self.layers == 0 else total / self.layers

    @property
    def layer_expert_params(self) -> float:
        """Routed-expert parameters of one layer (split over expert parallelism too);
        the mean over the layers where some are dense."""
        total = self.moe_layers * self.experts * self.expert_params
        return total // self.layers if total % self.layers == 0 else total / self.layers

    @property
    def embedding_params(self) -> int:
        """Input embedding (and learned positions)."""
        rows = (self.positions or self.seq) if self.learned_positions else 0
        return self.hidden * (self.vocab + rows)

    @property
    def output_params(self) -> int:
        """Final norm and, unless tied, the output projection."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def params(self) -> int:
        """Total trainable parameters."""
        dense, experts = self.layers_params(0, self.layers)
        return dense + experts + self.embedding_params + self.output_params

    @property
    def active_params(self) -> int:
        """Parameters one token goes through (``top_k`` of the routed experts)."""
        return self.params - self.moe_layers * (self.experts - self.top_k) * self.expert_params

    def attention_span(self, i: int) -> int:
        """Keys each query of layer ``i`` meets: the sequence, or the window."""
        if self.sliding_window and self.is_sliding_layer(i):
            return min(self.seq, self.sliding_window)
        return self.seq

    def attention_score_flops(self, i: int) -> float:
        """Forward FLOPs per token of layer ``i``'s ``Q K^T`` and ``softmax(.) V``:
        ``2 a (d_qk + d_v) x span`` (``4 s h`` for plain multi-head attention; full,
        unmasked: the convention of Narayanan et al. SC'21 App. and PaLM App. B)."""
        return 2.0 * self.heads * (self.qk_head_dim + self.value_head_dim) \
            * self.attention_span(i)

    def mlp_matmul_flops(self, i: int) -> float:
        """Forward matmul FLOPs per token of layer ``i``'s MLP: ``2 x`` the weights a
        token goes through (``top_k`` routed and the shared experts, the router and
        the shared gate in a MoE layer)."""
        if not self.is_moe_layer(i):
            return 2.0 * self._weights(self.ffn)
        return 2.0 * (self.top_k * self._weights(self.expert_ffn)
                      + self.shared_experts * self._weights(self._shared_width)
                      + self.hidden * (self.experts + self.shared_gate))

    def layer_flops(self, i: int) -> float:
        """Forward matmul FLOPs per token of layer ``i``, attention scores included."""
        return (2.0 * self.attention_weights + self.attention_score_flops(i)
                + self.mlp_matmul_flops(i))

    def layer_matmul_flops(self) -> float:
        """Forward matmul FLOPs of one layer per token, attention scores included:
        ``2 x`` the active weights (projections, MLP or ``top_k`` experts, shared
        experts, router) plus ``4 s h`` for ``Q K^T`` and ``softmax(.) V`` (full,
        unmasked: the convention of Narayanan et al. SC'21 App. and PaLM App. B).
        The mean over the layers where they differ (:meth:`layer_flops` gives each)."""
        if not (self.dense_layers and self.moe) and not self.sliding_layers:
            return self.layer_flops(0)
        return sum(self.layer_flops(i) for i in range(self.layers)) / self.layers

    def logit_flops(self) -> float:
        """Forward FLOPs of the output projection per token."""
        return 2.0 * self.hidden * self.vocab

    def training_flops_per_token(self) -> float:
        """Model FLOPs of one token's forward and backward pass (backward = 2 x forward):
        ``6 N_matmul + 12 L s h``, without recomputation (model FLOPs, as in MFU)."""
        return 3.0 * (self.layers * self.layer_matmul_flops() + self.logit_flops())

    @classmethod
    def from_size(cls, size: Mapping[str, Any]) -> "TransformerShape":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in size.items() if k in names})


def _norm(name: str, shape: TransformerShape, inputs: tuple[str, ...]) -> Operator:
    elems = shape.seq * shape.hidden
    count = 2 if shape.post_norms else 1       # Gemma 2's post-norm rides along
    fwd = float((count * NORM_FLOPS_PER_ELEM + 1) * elems)   # residual add fused
    return Operator(name=name, kind="norm", params=count * shape.norm_params, fwd_flops=fwd,
                    bwd_flops=2.0 * fwd, out_elems=elems, inputs=inputs)


def _dense(name: str, params: int, flops_per_token: float, out_per_token: int,
           shape: TransformerShape, inputs: tuple[str, ...]) -> Operator:
    fwd = flops_per_token * shape.seq
    return Operator(name=name, kind="dense", params=params, fwd_flops=fwd, bwd_flops=2.0 * fwd,
                    out_elems=out_per_token * shape.seq, inputs=inputs)


def _attention(name: str, shape: TransformerShape, i: int, inputs: tuple[str, ...]) -> Operator:
    """Layer ``i``'s projections and scores as one operator (its norms on Q, K and the
    MLA latents included)."""
    s = shape.seq
    fwd = (s * (2.0 * shape.attention_weights + shape.attention_score_flops(i))
           + SOFTMAX_FLOPS_PER_ELEM * shape.heads * s * shape.attention_span(i))
    return Operator(name, "attention", params=shape.attention_params, fwd_flops=fwd,
                    bwd_flops=2.0 * fwd, out_elems=s * shape.hidden, inputs=inputs)


def _mlp_ops(p: str, shape: TransformerShape, i: int, src: str) -> list[Operator]:
    """Layer ``i``'s MLP (``mlp.up``, ``mlp.down``) or its experts (``router``,
    ``experts``, ``shared_experts``, ``experts.add``), reading ``src``."""
    h, s, act = shape.hidden, shape.seq, ACTIVATION_FLOPS_PER_ELEM
    if not shape.is_moe_layer(i):
        biased = shape.bias or shape.mlp_bias
        up_width = (2 if shape.gated else 1) * shape.ffn
        up = _dense(p + "mlp.up", h * up_width + (up_width if biased else 0),
                    2.0 * h * up_width + act * shape.ffn, shape.ffn, shape, (src,))
        down = _dense(p + "mlp.down", h * shape.ffn + (h if biased else 0),
                      2.0 * h * shape.ffn, h, shape, (up.name,))
        return [up, down]
    router = _dense(p + "router", h * shape.experts, 2.0 * h * shape.experts,
                    shape.experts, shape, (src,))
    width = shape.top_k * shape.expert_ffn
    experts = _dense(p + "experts", shape.experts * shape.expert_params,
                     2.0 * shape.top_k * shape.expert_params + act * width,
                     h, shape, (src, router.name))
    ops = [router, experts]
    shared = shape.shared_params - h * shape.experts     # shared experts and their gate
    if shared:
        shared_act = act * shape.shared_experts * shape._shared_width
        ops.append(_dense(p + "shared_experts", shared, 2.0 * shared + shared_act, h,
                          shape, (src,)))
        ops.append(Operator(p + "experts.add", "elementwise", fwd_flops=float(s * h),
                            bwd_flops=float(s * h), out_elems=s * h,
                            inputs=(experts.name, p + "shared_experts")))
    return ops


def _operators(shape: TransformerShape) -> tuple[Operator, ...]:
    h, s = shape.hidden, shape.seq
    ops: list[Operator] = [input_op("tokens", s)]
    ops.append(token_embedding("embeddings.word", shape.vocab, h, s, ("tokens",)))
    prev = "embeddings.word"
    if shape.learned_positions:
        ops.append(token_embedding("embeddings.position", shape.positions or s, h, s,
                                   ("tokens",)))
        ops.append(Operator("embeddings.add", "elementwise", fwd_flops=float(s * h),
                            bwd_flops=float(s * h), out_elems=s * h,
                            inputs=("embeddings.word", "embeddings.position")))
        prev = "embeddings.add"
    for i in range(shape.layers):
        p = f"layer{i}."
        n1 = _norm(p + "attention.norm", shape, (prev,))
        attn = _attention(p + "attention", shape, i, (n1.name,))
        n2 = _norm(p + "mlp.norm", shape, (attn.name, prev))
        ops += [n1, attn, n2]
        mlp = _mlp_ops(p, shape, i, n2.name)
        ops += mlp
        ops.append(Operator(p + "residual", "elementwise", fwd_flops=float(s * h),
                            bwd_flops=float(s * h), out_elems=s * h,
                            inputs=(mlp[-1].name, n2.name)))
        prev = p + "residual"
    final = _norm("final.norm", shape, (prev,))
    if shape.post_norms:   # one final norm, not two
        final = replace(final, params=shape.norm_params)
    head_params = 0 if shape.tied_embeddings else shape.vocab * h
    head = _dense("lm_head", head_params, shape.logit_flops(), shape.vocab, shape, (final.name,))
    ops += [final, head, softmax_loss("loss", s * shape.vocab, (head.name,))]
    return tuple(ops)


_OPTIONAL = ("experts", "top_k", "expert_ffn", "shared_experts", "head_size", "positions",
             "q_lora_rank", "kv_lora_rank", "rope_head_dim", "v_head_dim", "sliding_window",
             "sliding_layers", "shared_expert_ffn", "dense_layers")


def _check_fields(shape: TransformerShape) -> None:
    for f in fields(shape):
        value = getattr(shape, f.name)
        if f.type in ("bool", bool):
            if not isinstance(value, bool):
                raise ConfigError(f"job.size.{f.name}", value, "must be true or false")
        elif f.type in ("float", float):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"job.size.{f.name}", value, "must be a number > 0")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0 or (
                value == 0 and f.name not in _OPTIONAL):
            raise ConfigError(f"job.size.{f.name}", value, "must be a positive integer")


def _check(name: str, shape: TransformerShape) -> None:
    _check_fields(shape)
    if not shape.head_size and shape.hidden % shape.heads:
        raise ConfigError("job.size.heads", shape.heads,
                          f"must divide hidden = {shape.hidden} (e.g. {shape.hidden // 128} "
                          "heads of 128)")
    if shape.heads % shape.kv_heads:
        raise ConfigError("job.size.kv_heads", shape.kv_heads,
                          f"must divide heads = {shape.heads} (1 = multi-query, "
                          f"{shape.heads} = multi-head)")
    if shape.sliding_layers > shape.layers:
        raise ConfigError("job.size.sliding_layers", shape.sliding_layers,
                          f"must be at most layers = {shape.layers}")
    if shape.sliding_layers and not shape.sliding_window:
        raise ConfigError("job.size.sliding_window", 0,
                          "sliding layers need a window of >= 1 tokens")
    if not shape.mla and (shape.q_lora_rank or shape.rope_head_dim):
        raise ConfigError("job.size.kv_lora_rank", 0,
                          "q_lora_rank and rope_head_dim are MLA's: give kv_lora_rank too")
    if name == "moe":
        if shape.experts < 1:
            raise ConfigError("job.size.experts", shape.experts, "a MoE model needs >= 1 expert")
        if not 1 <= shape.top_k <= shape.experts:
            raise ConfigError("job.size.top_k", shape.top_k,
                              f"must be 1 to experts = {shape.experts}")
        if shape.expert_ffn < 1:
            raise ConfigError("job.size.expert_ffn", shape.expert_ffn, "must be >= 1")
        cf = shape.capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not 0 < cf < float("inf"):
            raise ConfigError("job.size.capacity_factor", cf,
                              "must be a finite number > 0 (1.0 drops no tokens when balanced)")
        if shape.dense_layers >= shape.layers:
            raise ConfigError("job.size.dense_layers", shape.dense_layers,
                              f"must be below layers = {shape.layers} (a MoE model)")


_DEFAULTS = {f.name: f.default for f in fields(TransformerShape)}
_MOE_ONLY = ("experts", "top_k", "expert_ffn", "capacity_factor", "shared_experts",
             "shared_expert_ffn", "shared_gate", "dense_layers")
#: Fields a model's ``size`` shows only when set (the presets' sizes stay as they were).
_SHOWN_WHEN_SET = tuple(f.name for f in fields(TransformerShape))[
    [f.name for f in fields(TransformerShape)].index("head_size"):]


def transformer(shape: TransformerShape, name: str = "gpt") -> Model:
    """Build the operator graph of any :class:`TransformerShape` (what :func:`gpt` and
    :func:`moe` do for theirs, and the Hugging Face mapping for a ``config.json``).

    Parameters
    ----------
    shape : TransformerShape
    name : str
        The model's name.

    Returns
    -------
    Model
        As :func:`gpt` (dense layers) and :func:`moe` (MoE layers); its ``size`` holds
        the shape's fields (those after ``shared_experts`` only when set), so that
        :func:`transformer_shape` reads the same shape back.

    Raises
    ------
    ConfigError
        Naming the size field that is out of range or inconsistent.
    """
    _check("moe" if shape.moe else "gpt", shape)
    size = {f.name: getattr(shape, f.name) for f in fields(shape)
            if not (f.name in _MOE_ONLY and not shape.moe)
            and not (f.name in _SHOWN_WHEN_SET and getattr(shape, f.name) == _DEFAULTS[f.name])}
    return Model(name=name, operators=_operators(shape), size=size)


def _build(name: str, shape: TransformerShape) -> Model:
    return transformer(shape, name)


def gpt(layers: int = 32, hidden: int = 4096, heads: int = 32, kv_heads: int = 8,
        ffn: int = 14336, seq: int = 8192, vocab: int = 128256, tied_embeddings: bool = False,
        gated: bool = True, bias: bool = False, learned_positions: bool = False,
        rms_norm: bool = True, *, name: str = "gpt") -> Model:
    """Build a dense decoder-only transformer (defaults: Llama 3 8B's shape).

    Parameters
    ----------
    layers, hidden, heads, kv_heads, ffn, seq, vocab : int
        See :class:`TransformerShape`; ``hidden`` must be a multiple of ``heads`` and
        ``heads`` of ``kv_heads``.
    tied_embeddings, gated, bias, learned_positions, rms_norm : bool
        Architecture switches (GPT-3: tied, GELU, biases, learned positions, LayerNorm;
        Llama: untied, SwiGLU, no biases, rotary positions, RMSNorm).
    name : str
        The model's name (a preset's).

    Returns
    -------
    Model
        Per layer ``layer{i}.``: ``attention.norm``, ``attention`` (Q, K, V, output
        projections and the scores, one operator), ``mlp.norm``, ``mlp.up`` (with the
        gate when ``gated``), ``mlp.down``, ``residual``; then ``final.norm``,
        ``lm_head`` (owning no parameters when tied) and ``loss``. Backward is twice
        forward for every operator with parameters.

    Raises
    ------
    ConfigError
        Naming the size field that is out of range or inconsistent.

    Examples
    --------
    >>> round(gpt().params / 1e9, 2)      # Llama 3 8B
    8.03

    References
    ----------
    .. [1] T. Brown et al., "Language Models are Few-Shot Learners", NeurIPS 2020, Table 2.1.
    .. [2] A. Grattafiori et al., "The Llama 3 Herd of Models", arXiv 2407.21783, Table 3.
    """
    return _build(name, TransformerShape(layers, hidden, heads, kv_heads, ffn, seq, vocab,
                                         tied_embeddings, gated, bias, learned_positions,
                                         rms_norm))


def moe(layers: int = 32, hidden: int = 4096, heads: int = 32, kv_heads: int = 8,
        experts: int = 8, top_k: int = 2, expert_ffn: int = 14336, capacity_factor: float = 1.0,
        shared_experts: int = 0, ffn: int = 14336, seq: int = 4096, vocab: int = 32000,
        tied_embeddings: bool = False, gated: bool = True, bias: bool = False,
        learned_positions: bool = False, rms_norm: bool = True, *, name: str = "moe") -> Model:
    """Build a mixture-of-experts decoder-only transformer (defaults: Mixtral 8x7B).

    Every layer's MLP is ``experts`` routed experts of width ``expert_ffn``, of which a
    learned router (``h x experts``) sends each token to ``top_k``, plus
    ``shared_experts`` experts of width ``ffn`` every token goes through.

    Parameters
    ----------
    experts, top_k, expert_ffn, capacity_factor, shared_experts :
        See :class:`TransformerShape`.
    layers, hidden, heads, kv_heads, ffn, seq, vocab, tied_embeddings, gated, bias, \
learned_positions, rms_norm, name :
        As for :func:`gpt`.

    Returns
    -------
    Model
        As :func:`gpt`, with ``router`` and ``experts`` (all routed experts in one
        operator, charged ``top_k`` experts' FLOPs per token) instead of the MLP, and
        ``shared_experts`` when there are any.

    Examples
    --------
    >>> m = moe()                          # Mixtral 8x7B
    >>> round(m.params / 1e9, 1), round(transformer_shape(m).active_params / 1e9, 1)
    (46.7, 12.9)

    References
    ----------
    .. [1] A. Jiang et al., "Mixtral of Experts", arXiv 2401.04088, §2.
    .. [2] N. Shazeer et al., "Outrageously Large Neural Networks: the Sparsely-Gated
       Mixture-of-Experts Layer", ICLR 2017.
    """
    return _build(name, TransformerShape(layers, hidden, heads, kv_heads, ffn, seq, vocab,
                                         tied_embeddings, gated, bias, learned_positions,
                                         rms_norm, experts, top_k, expert_ffn,
                                         capacity_factor, shared_experts))


#: Published models: (builder, sizes). GPT-3 175B: Brown et al. 2020, Table 2.1
#: (96 layers, d_model 12288, 96 heads, context 2048; GPT-2's 50257-token BPE, tied
#: embeddings, learned positions). Llama 3 8B and 70B: Grattafiori et al. 2024, Table 3
#: (32/80/126 layers, 4096/8192/16384 wide, FFN 14336/28672/53248, 32/64/128 heads, 8 KV
#: heads, vocabulary 128K = 128256, 8K context in pre-training). Mixtral 8x7B: Jiang et al. 2024, Table 1
#: (32 layers, dim 4096, 32 heads, 8 KV heads, hidden 14336, 8 experts, top 2, vocabulary
#: 32000, context 32768; the preset trains on 4096-token sequences).
PRESETS: Mapping[str, tuple[Any, Mapping[str, Any]]] = {
    "gpt3-175b": (gpt, dict(layers=96, hidden=12288, heads=96, kv_heads=96, ffn=4 * 12288,
                            seq=2048, vocab=50257, tied_embeddings=True, gated=False, bias=True,
                            learned_positions=True, rms_norm=False)),
    "llama3-8b": (gpt, dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=8192,
                            vocab=128256)),
    "llama3-70b": (gpt, dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, seq=8192,
                             vocab=128256)),
    "llama3-405b": (gpt, dict(layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248,
                              seq=8192, vocab=128256)),
    "mixtral-8x7b": (moe, dict(layers=32, hidden=4096, heads=32, kv_heads=8, experts=8,
                               top_k=2, expert_ffn=14336, seq=4096, vocab=32000)),
}

#: Published parameter counts (total, active per token): GPT-3 "175.0B" (Brown et al.
#: Table 2.1); Llama 3 8B, 70B and 405B: 8.03B, 70.6B and 405.9B (the released
#: checkpoints' counts, 8,030,261,248, 70,553,706,496 and 405,853,388,800); Mixtral 8x7B: 46.7B total, 12.9B active (Jiang et
#: al. §2, "47B" / "13B" in the abstract; 46.7B / 12.9B on the model card).
PUBLISHED_PARAMS: Mapping[str, tuple[float, float]] = {
    "gpt3-175b": (175.0e9, 175.0e9), "llama3-8b": (8.03e9, 8.03e9),
    "llama3-70b": (70.6e9, 70.6e9), "llama3-405b": (405.9e9, 405.9e9), "mixtral-8x7b": (46.7e9, 12.9e9),
}


def is_transformer(model: Model) -> bool:
    """Whether ``model`` was built by :func:`gpt` or :func:`moe` (a shape in its size)."""
    return {"layers", "hidden", "kv_heads", "seq", "vocab"} <= set(model.size)


def transformer_shape(model: Model) -> TransformerShape:
    """The :class:`TransformerShape` a :func:`gpt` or :func:`moe` model was built from.

    Raises
    ------
    ConfigError
        ``job.model`` when the model is not a decoder-only transformer.
    """
    if not is_transformer(model):
        raise ConfigError("job.model", model.name,
                          "the LLM planner needs a gpt or moe model (or one of their presets)")
    return TransformerShape.from_size(model.size)
