"""Decoder-only transformers (GPT, Llama) and mixtures of experts (Mixtral) as operator graphs.

The shape of such a model is a :class:`TransformerShape`; :func:`gpt` and :func:`moe`
build its operator graph (one attention, norm, MLP or expert operator per layer, the
embeddings, the output projection and the loss), and :func:`transformer_shape` reads the
shape back from a built model's ``size``, which is what the LLM parallelism model
(:mod:`topoopt.llm`) plans with. The presets :data:`PRESETS` are published models; their
parameter counts are within 1% of the published ones (tests).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
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

__all__ = ["TransformerShape", "gpt", "moe", "transformer_shape", "is_transformer", "PRESETS",
           "PUBLISHED_PARAMS"]


@dataclass(frozen=True)
class TransformerShape:
    """The sizes of a decoder-only transformer, dense or mixture-of-experts.

    Attributes
    ----------
    layers, hidden, heads, kv_heads : int
        L, h, attention heads a, key/value heads (``kv_heads < heads``: grouped-query
        attention, GQA; Ainslie et al. 2023).
    ffn : int
        Inner width f of a dense MLP (and of each shared expert).
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
        Biases in the projections and MLP (GPT-3) or none (Llama).
    learned_positions : bool
        A learned ``seq x h`` position table (GPT-3) or rotary embeddings (no parameters).
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
        Experts every token goes through (DeepSeekMoE), each of width ``ffn``.
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

    @property
    def moe(self) -> bool:
        """Whether the MLPs are mixtures of experts."""
        return self.experts > 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): ``kv_heads x head_dim``."""
        return self.kv_heads * self.head_dim

    def _weights(self, width: int) -> int:
        return (3 if self.gated else 2) * self.hidden * width

    def _mlp(self, width: int) -> int:
        return self._weights(width) + ((width + self.hidden) if self.bias else 0)

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer."""
        h, kv = self.hidden, self.kv_dim
        return 2 * h * h + 2 * h * kv + ((2 * h + 2 * kv) if self.bias else 0)

    @property
    def dense_mlp_params(self) -> int:
        """The MLP of one layer of a dense model (0 in a MoE model)."""
        return 0 if self.moe else self._mlp(self.ffn)

    @property
    def expert_params(self) -> int:
        """One routed expert."""
        return self._mlp(self.expert_ffn) if self.moe else 0

    @property
    def shared_params(self) -> int:
        """The shared experts and the router of one MoE layer (held by every EP rank)."""
        return (self.shared_experts * self._mlp(self.ffn) + self.hidden * self.experts
                if self.moe else 0)

    @property
    def norm_params(self) -> int:
        return self.hidden * (1 if self.rms_norm else 2)

    @property
    def layer_dense_params(self) -> int:
        """Parameters of one layer that every expert-parallel rank holds in full
        (split by tensor parallelism only): attention, norms, dense MLP, router and
        shared experts."""
        return (self.attention_params + 2 * self.norm_params + self.dense_mlp_params
                + self.shared_params)

    @property
    def layer_expert_params(self) -> int:
        """Routed-expert parameters of one layer (split over expert parallelism too)."""
        return self.experts * self.expert_params

    @property
    def embedding_params(self) -> int:
        """Input embedding (and learned positions)."""
        return self.hidden * (self.vocab + (self.seq if self.learned_positions else 0))

    @property
    def output_params(self) -> int:
        """Final norm and, unless tied, the output projection."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def params(self) -> int:
        """Total trainable parameters."""
        return (self.layers * (self.layer_dense_params + self.layer_expert_params)
                + self.embedding_params + self.output_params)

    @property
    def active_params(self) -> int:
        """Parameters one token goes through (``top_k`` of the routed experts)."""
        return self.params - self.layers * (self.experts - self.top_k) * self.expert_params

    def layer_matmul_flops(self) -> float:
        """Forward matmul FLOPs of one layer per token, attention scores included:
        ``2 x`` the active weights (projections, MLP or ``top_k`` experts, shared
        experts, router) plus ``4 s h`` for ``Q K^T`` and ``softmax(.) V`` (full,
        unmasked: the convention of Narayanan et al. SC'21 App. and PaLM App. B)."""
        h, s = self.hidden, self.seq
        proj = 2 * h * h + 2 * h * self.kv_dim
        mlp = self._weights(self.ffn)
        if self.moe:   # top_k routed and the shared experts, and the router
            mlp = (self.top_k * self._weights(self.expert_ffn)
                   + self.shared_experts * self._weights(self.ffn) + h * self.experts)
        return 2.0 * (proj + mlp) + 4.0 * s * h

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
    fwd = float((NORM_FLOPS_PER_ELEM + 1) * elems)   # residual add fused
    return Operator(name=name, kind="norm", params=shape.norm_params, fwd_flops=fwd,
                    bwd_flops=2.0 * fwd, out_elems=elems, inputs=inputs)


def _dense(name: str, params: int, flops_per_token: float, out_per_token: int,
           shape: TransformerShape, inputs: tuple[str, ...]) -> Operator:
    fwd = flops_per_token * shape.seq
    return Operator(name=name, kind="dense", params=params, fwd_flops=fwd, bwd_flops=2.0 * fwd,
                    out_elems=out_per_token * shape.seq, inputs=inputs)


def _operators(shape: TransformerShape) -> tuple[Operator, ...]:
    h, s, kv = shape.hidden, shape.seq, shape.kv_dim
    ops: list[Operator] = [input_op("tokens", s)]
    ops.append(token_embedding("embeddings.word", shape.vocab, h, s, ("tokens",)))
    prev = "embeddings.word"
    if shape.learned_positions:
        ops.append(token_embedding("embeddings.position", s, h, s, ("tokens",)))
        prev = "embeddings.position"
        ops.append(Operator("embeddings.add", "elementwise", fwd_flops=float(s * h),
                            bwd_flops=float(s * h), out_elems=s * h,
                            inputs=("embeddings.word", "embeddings.position")))
        prev = "embeddings.add"
    for i in range(shape.layers):
        p = f"layer{i}."
        n1 = _norm(p + "attention.norm", shape, (prev,))
        attn_fwd = (s * (2.0 * (2 * h * h + 2 * h * kv) + 4.0 * s * h)
                    + SOFTMAX_FLOPS_PER_ELEM * shape.heads * s * s)
        attn = Operator(p + "attention", "attention", params=shape.attention_params,
                        fwd_flops=attn_fwd, bwd_flops=2.0 * attn_fwd, out_elems=s * h,
                        inputs=(n1.name,))
        n2 = _norm(p + "mlp.norm", shape, (attn.name, prev))
        ops += [n1, attn, n2]
        act = ACTIVATION_FLOPS_PER_ELEM
        if shape.moe:
            router = _dense(p + "router", h * shape.experts, 2.0 * h * shape.experts,
                            shape.experts, shape, (n2.name,))
            width = shape.top_k * shape.expert_ffn
            experts = _dense(p + "experts", shape.layer_expert_params,
                             2.0 * shape.top_k * shape.expert_params + act * width,
                             h, shape, (n2.name, router.name))
            ops += [router, experts]
            last = experts.name
            if shared := shape.shared_experts * shape._mlp(shape.ffn):
                ops.append(_dense(p + "shared_experts", shared,
                                  2.0 * shared + act * shape.shared_experts * shape.ffn, h,
                                  shape, (n2.name,)))
                ops.append(Operator(p + "experts.add", "elementwise", fwd_flops=float(s * h),
                                    bwd_flops=float(s * h), out_elems=s * h,
                                    inputs=(experts.name, p + "shared_experts")))
                last = p + "experts.add"
        else:
            up_width = (2 if shape.gated else 1) * shape.ffn
            up_params = h * up_width + (shape.ffn if shape.bias else 0)
            up = _dense(p + "mlp.up", up_params, 2.0 * h * up_width + act * shape.ffn,
                        shape.ffn, shape, (n2.name,))
            down = _dense(p + "mlp.down", h * shape.ffn + (h if shape.bias else 0),
                          2.0 * h * shape.ffn, h, shape, (up.name,))
            ops += [up, down]
            last = down.name
        ops.append(Operator(p + "residual", "elementwise", fwd_flops=float(s * h),
                            bwd_flops=float(s * h), out_elems=s * h, inputs=(last, n2.name)))
        prev = p + "residual"
    final = _norm("final.norm", shape, (prev,))
    head_params = 0 if shape.tied_embeddings else shape.vocab * h
    head = _dense("lm_head", head_params, shape.logit_flops(), shape.vocab, shape, (final.name,))
    ops += [final, head, softmax_loss("loss", s * shape.vocab, (head.name,))]
    return tuple(ops)


def _check(name: str, shape: TransformerShape) -> None:
    for f in fields(shape):
        value = getattr(shape, f.name)
        if f.type in ("bool", bool):
            if not isinstance(value, bool):
                raise ConfigError(f"job.size.{f.name}", value, "must be true or false")
        elif f.type in ("float", float):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"job.size.{f.name}", value, "must be a number > 0")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0 or (
                value == 0 and f.name not in ("experts", "top_k", "expert_ffn",
                                              "shared_experts")):
            raise ConfigError(f"job.size.{f.name}", value, "must be a positive integer")
    if shape.hidden % shape.heads:
        raise ConfigError("job.size.heads", shape.heads,
                          f"must divide hidden = {shape.hidden} (e.g. {shape.hidden // 128} "
                          "heads of 128)")
    if shape.heads % shape.kv_heads:
        raise ConfigError("job.size.kv_heads", shape.kv_heads,
                          f"must divide heads = {shape.heads} (1 = multi-query, "
                          f"{shape.heads} = multi-head)")
    if name == "moe":
        if shape.experts < 1:
            raise ConfigError("job.size.experts", shape.experts, "a MoE model needs >= 1 expert")
        if not 1 <= shape.top_k <= shape.experts:
            raise ConfigError("job.size.top_k", shape.top_k,
                              f"must be 1 to experts = {shape.experts}")
        if shape.expert_ffn < 1:
            raise ConfigError("job.size.expert_ffn", shape.expert_ffn, "must be >= 1")


def _build(name: str, shape: TransformerShape) -> Model:
    _check("moe" if shape.moe else "gpt", shape)
    moe_only = () if shape.moe else ("experts", "top_k", "expert_ffn", "capacity_factor",
                                      "shared_experts")
    size = {f.name: getattr(shape, f.name) for f in fields(shape) if f.name not in moe_only}
    return Model(name=name, operators=_operators(shape), size=size)


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
