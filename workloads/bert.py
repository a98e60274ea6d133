"""BERT (Devlin et al. 2019) pre-training as an operator graph, sized as in TopoOpt."""

from __future__ import annotations

from topoopt.errors import ConfigError
from topoopt.model import Model, Operator
from topoopt.workloads.layers import (
    ACTIVATION_FLOPS_PER_ELEM,
    SOFTMAX_FLOPS_PER_ELEM,
    dense,
    input_op,
    norm,
    softmax_loss,
    token_embedding,
    with_activation,
)

__all__ = ["DEFAULTS", "bert", "attention"]

#: TopoOpt §5: 12 transformer layers, sequence length 64, hidden size 1024, 16 heads.
#: Vocabulary, positions and token types are BERT's (uncased WordPiece vocabulary).
DEFAULTS = dict(layers=12, hidden=1024, heads=16, seq=64, vocab=30522, max_position=512,
                type_vocab=2, ffn=None)


def attention(name: str, hidden: int, heads: int, seq: int,
              inputs: tuple[str, ...]) -> Operator:
    """Multi-head self-attention block as one operator.

    Q, K, V and output projections (``4 * hidden^2 + 4 * hidden`` parameters). Per
    sample the forward pass costs

    * ``6 * seq * hidden^2`` for the QKV projections,
    * ``2 * seq^2 * hidden`` for the scores ``Q K^T`` (summed over heads),
    * ``SOFTMAX_FLOPS_PER_ELEM * heads * seq^2`` for scale, mask and softmax,
    * ``2 * seq^2 * hidden`` for the context ``softmax(.) V``,
    * ``2 * seq * hidden^2`` for the output projection.

    Bias adds and dropout are not counted. Backward is twice forward.
    """
    h, s = hidden, seq
    fwd = (8.0 * s * h * h + 4.0 * s * s * h + SOFTMAX_FLOPS_PER_ELEM * heads * s * s)
    return Operator(name=name, kind="attention", params=4 * h * h + 4 * h, fwd_flops=fwd,
                    bwd_flops=2.0 * fwd, out_elems=s * h, inputs=tuple(inputs))


def _check_positive(**values: object) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"job.size.{key}", value, "must be a positive integer")


def bert(layers: int = 12, hidden: int = 1024, heads: int = 16, seq: int = 64,
         vocab: int = 30522, max_position: int = 512, type_vocab: int = 2,
         ffn: int | None = None) -> Model:
    """Build BERT with its pre-training heads (masked LM + next-sentence prediction).

    Parameters
    ----------
    layers : int
        Transformer encoder layers.
    hidden : int
        Hidden size ``h``.
    heads : int
        Attention heads; must divide ``hidden``.
    seq : int
        Tokens per sample; at most ``max_position``.
    vocab, max_position, type_vocab : int
        Rows of the word, position and token-type embedding tables.
    ffn : int, optional
        Feed-forward inner width; ``4 * hidden`` when omitted.

    Returns
    -------
    Model

    Raises
    ------
    ConfigError
        ``job.size.heads`` when heads do not divide hidden, ``job.size.seq`` when the
        sequence is longer than the position table, or a size that is not a positive
        integer.

    Notes
    -----
    Operators per sample, in order:

    * ``tokens``: token and segment ids (``2 * seq`` elements).
    * ``embeddings.word`` (``vocab x h``, ``seq`` lookups), ``embeddings.position``
      and ``embeddings.token_type``, kind ``embedding``, one row per token each.
    * ``embeddings.norm``: the sum of the three embeddings and LayerNorm.
    * per layer ``layer{i}.``: ``attention`` (see :func:`attention`),
      ``attention.norm`` (residual add + LayerNorm), ``ffn.up`` (``h -> ffn`` with
      GELU fused), ``ffn.down`` (``ffn -> h``), ``ffn.norm`` (residual add +
      LayerNorm). Token-wise operators output ``seq * h`` elements.
    * ``pooler``: dense ``h -> h`` with tanh on the first ([CLS]) token.
    * ``nsp``: next-sentence classifier ``h -> 2`` on the pooled vector.
    * ``mlm.transform`` (dense ``h -> h`` + GELU on every token), ``mlm.norm``
      (LayerNorm), ``mlm.decoder`` (``h -> vocab`` on every token).
    * ``loss``: softmax cross-entropy over the ``seq * vocab`` MLM logits and the
      2 NSP logits.

    The head is BERT's pre-training head (``BertForPreTraining``), because the
    workload is training from scratch. The MLM decoder's weight matrix is tied to
    the word embedding, so it is counted once, in ``embeddings.word``; the
    ``mlm.decoder`` operator owns only its ``vocab`` biases but is charged the full
    ``2 * seq * h * vocab`` matmul. The MLM logits are computed for every token (as
    in the reference implementation), not only the masked 15%. Dropout is not
    modelled. The parameter count at ``layers=24, hidden=1024, heads=16`` is
    336,226,108 (BERT-large: 335,141,888 for the encoder with pooler, plus
    1,084,220 for the MLM and NSP heads).

    References
    ----------
    .. [1] J. Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers
       for Language Understanding", NAACL 2019.
    .. [2] A. Vaswani et al., "Attention Is All You Need", NeurIPS 2017.
    .. [3] W. Wang et al., "TopoOpt", NSDI 2023, §5.
    """
    ffn = 4 * hidden if ffn is None else ffn
    _check_sizes(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                 max_position=max_position, type_vocab=type_vocab, ffn=ffn)
    h, s = hidden, seq
    ops = _embeddings(h, s, vocab, max_position, type_vocab)
    prev = ops[-1].name
    for i in range(layers):
        ops += _encoder_layer(f"layer{i}.", h, heads, s, ffn, prev)
        prev = ops[-1].name
    ops += _pretraining_heads(h, s, vocab, prev)
    size = dict(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                max_position=max_position, type_vocab=type_vocab, ffn=ffn)
    return Model(name="bert", operators=tuple(ops), size=size)


def _check_sizes(**size: int) -> None:
    """ConfigError for a size BERT cannot have (see :func:`bert`)."""
    _check_positive(**size)
    hidden, heads = size["hidden"], size["heads"]
    if hidden % heads:
        divisors = [d for d in range(1, min(hidden, 64) + 1) if hidden % d == 0]
        raise ConfigError("job.size.heads", heads,
                          f"must divide hidden = {hidden}, e.g. one of {divisors[-4:]}")
    if size["seq"] > size["max_position"]:
        raise ConfigError("job.size.seq", size["seq"],
                          f"must be at most max_position = {size['max_position']} "
                          f"(or raise job.size.max_position)")


def _embeddings(h: int, s: int, vocab: int, max_position: int,
                type_vocab: int) -> list[Operator]:
    """``tokens``, the word, position and token-type tables, and ``embeddings.norm``."""
    ops: list[Operator] = [input_op("tokens", 2 * s)]
    emb = [token_embedding("embeddings.word", vocab, h, s, ("tokens",)),
           token_embedding("embeddings.position", max_position, h, s, ("tokens",)),
           token_embedding("embeddings.token_type", type_vocab, h, s, ("tokens",))]
    ops += emb
    # Two adds join the three embeddings before the LayerNorm.
    ops.append(norm("embeddings.norm", h, s * h, tuple(e.name for e in emb),
                    extra_flops_per_elem=2))
    return ops


def _encoder_layer(p: str, h: int, heads: int, s: int, ffn: int,
                   prev: str) -> list[Operator]:
    """One transformer encoder layer (operators named ``p + ...``) reading ``prev``."""
    tok = s * h
    attn = attention(p + "attention", h, heads, s, (prev,))
    # Residual add (1 FLOP per element) fused into the following LayerNorm.
    attn_norm = norm(p + "attention.norm", h, tok, (attn.name, prev),
                     extra_flops_per_elem=1)
    up = with_activation(dense(p + "ffn.up", h, ffn, (attn_norm.name,), tokens=s),
                         ACTIVATION_FLOPS_PER_ELEM)
    down = dense(p + "ffn.down", ffn, h, (up.name,), tokens=s)
    ffn_norm = norm(p + "ffn.norm", h, tok, (down.name, attn_norm.name),
                    extra_flops_per_elem=1)
    return [attn, attn_norm, up, down, ffn_norm]


def _pretraining_heads(h: int, s: int, vocab: int, prev: str) -> list[Operator]:
    """The pooler and NSP classifier, the MLM head and the loss, reading ``prev``."""
    pooler = with_activation(dense("pooler", h, h, (prev,)), ACTIVATION_FLOPS_PER_ELEM)
    nsp = dense("nsp", h, 2, (pooler.name,))
    transform = with_activation(dense("mlm.transform", h, h, (prev,), tokens=s),
                                ACTIVATION_FLOPS_PER_ELEM)
    mlm_norm = norm("mlm.norm", h, s * h, (transform.name,))
    dec_fwd = 2.0 * s * h * vocab
    decoder = Operator(name="mlm.decoder", kind="dense", params=vocab, fwd_flops=dec_fwd,
                       bwd_flops=2.0 * dec_fwd, out_elems=s * vocab, inputs=(mlm_norm.name,))
    return [pooler, nsp, transform, mlm_norm, decoder,
            softmax_loss("loss", s * vocab + 2, (decoder.name, nsp.name))]
