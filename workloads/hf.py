"""Hugging Face ``config.json`` files as transformer workloads (``model = "hf:PATH"``).

A checkpoint's ``config.json`` says the shape of its model; this module maps the fields
of each supported family (:data:`HF_FAMILIES`) onto a :class:`TransformerShape` (decoders)
or the :func:`~topoopt.workloads.bert.bert` builder (BERT, RoBERTa). It reads the JSON
alone: no ``transformers``, no download. A field the mapping does not understand (an
unknown ``model_type``, a rope scaling it cannot tell, a quantization config, a layer
pattern the shape cannot hold) is a :class:`ConfigError` naming it; nothing is guessed.

The training sequence length is not in a ``config.json``: it defaults to the context the
model was pre-trained with (a rope scaling's ``original_max_position_embeddings``, else
``max_position_embeddings``) and is set with ``[job.size] seq``.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from topoopt.errors import ConfigError
from topoopt.model import Model
from topoopt.workloads.bert import bert
from topoopt.workloads.gpt import TransformerShape, transformer
from topoopt.workloads.layers import softmax_loss

__all__ = ["HF_FAMILIES", "ROPE_TYPES", "HF_SIZE_KEYS", "SHAPE_MODEL", "read_hf_config",
           "hf_shape", "hf_model", "hf_defaults", "shape_model", "shape_defaults"]

#: Rope scalings that change positions only (no parameters, no FLOPs): accepted.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "su", "llama3")

#: What ``[job.size]`` may override for an ``hf:`` model.
HF_SIZE_KEYS = ("seq",)

_Config = Mapping[str, Any]


class _Fields:
    """Typed reads of one ``config.json``, each error naming the file and the field."""

    def __init__(self, source: str, config: _Config):
        self.source, self.config = source, config

    def error(self, key: str, value: object, allowed: str) -> ConfigError:
        return ConfigError(f"{self.source}:{key}", value, allowed)

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.config.get(key, default)
        if value is None and default is not None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, value, f"must be an integer >= {minimum}")
        return value

    def opt_int(self, key: str) -> int:
        """An integer that ``null`` or absence turns off (0)."""
        value = self.config.get(key)
        return 0 if value is None else self.integer(key, minimum=0)

    def flag(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        value = default if value is None else value
        if not isinstance(value, bool):
            raise self.error(key, value, "must be true or false")
        return value


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` at ``path`` (the file, or a folder holding one).

    Raises
    ------
    ConfigError
        ``job.model`` when there is no such file or it is not a JSON object.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("job.model", f"hf:{path}", "no config.json there; give the path of "
                          "a Hugging Face config.json or of the folder holding it") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("job.model", f"hf:{path}",
                          f"cannot read it as JSON ({exc.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise ConfigError("job.model", f"hf:{path}", "must hold a JSON object")
    return doc


def _rope_context(f: _Fields) -> int | None:
    """The pre-training context a rope scaling names; a scaling it cannot tell is an
    error."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = f.config.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise f.error(key, rope, "must be a table with rope_type")
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise f.error(f"{key}.rope_type", kind,
                          f"unknown rope scaling; topoopt knows {', '.join(ROPE_TYPES)}")
        if "original_max_position_embeddings" in rope:
            return _Fields(f.source + f":{key}", rope).integer("original_max_position_embeddings")
    if "original_max_position_embeddings" in f.config:      # Phi-3 keeps it at the top
        return f.integer("original_max_position_embeddings")
    return None


def _default_seq(f: _Fields, positions_key: str = "max_position_embeddings") -> int:
    return _rope_context(f) or f.integer(positions_key)


def _sliding_count(f: _Fields, layers: int, rule: Callable[[int], bool]) -> int:
    """How many layers slide: ``layer_types`` when the file has it, else ``rule``."""
    types = f.config.get("layer_types")
    if types is None:
        return sum(rule(i) for i in range(layers))
    if not isinstance(types, list) or len(types) != layers or not set(types) <= {
            "sliding_attention", "full_attention"}:
        raise f.error("layer_types", types, f"must list {layers} of 'sliding_attention' or "
                      "'full_attention'")
    return types.count("sliding_attention")


def _window(f: _Fields, layers: int, rule: Callable[[int], bool],
            switch: str | None = None) -> dict[str, int]:
    """``sliding_window`` and ``sliding_layers`` (off when ``switch`` is false)."""
    window = f.opt_int("sliding_window")
    if not window or (switch and not f.flag(switch, False)):
        return {}
    count = _sliding_count(f, layers, rule)
    return {"sliding_window": window, "sliding_layers": count} if count else {}


def _dense_prefix(f: _Fields, layers: int, is_moe: Callable[[int], bool], key: str) -> int:
    """The number of leading dense layers, when the dense layers are exactly those."""
    dense = [i for i in range(layers) if not is_moe(i)]
    if dense != list(range(len(dense))) or len(dense) == layers:
        raise f.error(key, f.config.get(key), "topoopt models dense layers only as the first "
                      "ones of a MoE model (dense layers here: " f"{dense[:8]})")
    return len(dense)


def _base(f: _Fields, family: str) -> dict[str, Any]:
    """The fields every decoder family names alike."""
    heads = f.integer("num_attention_heads")
    hidden = f.integer("hidden_size")
    kv = f.config.get("num_key_value_heads")
    head = f.config.get("head_dim")
    base: dict[str, Any] = dict(
        layers=f.integer("num_hidden_layers"), hidden=hidden, heads=heads,
        kv_heads=heads if kv is None else f.integer("num_key_value_heads"),
        ffn=f.integer("intermediate_size"), vocab=f.integer("vocab_size"),
        tied_embeddings=f.flag("tie_word_embeddings", family == "gemma2"))
    if head is not None and f.integer("head_dim") * heads != hidden:
        base["head_size"] = head
    elif head is None and hidden % heads:
        raise f.error("num_attention_heads", heads, f"must divide hidden_size = {hidden}")
    return base


def _llama(f: _Fields, family: str) -> dict[str, Any]:
    """Llama 1-3.x, Mistral, Qwen2/2.5, Qwen3, Phi-3, Gemma 2 (dense)."""
    s = _base(f, family)
    layers = s["layers"]
    attention_bias = f.flag("attention_bias", False)
    s.update(qkv_bias=attention_bias, out_bias=attention_bias,
             mlp_bias=f.flag("mlp_bias", False))
    if family == "qwen2":
        s["qkv_bias"] = True
        s.update(_window(f, layers, lambda i: i >= f.opt_int("max_window_layers"),
                         "use_sliding_window"))
    elif family == "qwen3":
        s["qk_norm"] = True
        s.update(_window(f, layers, lambda i: i >= f.opt_int("max_window_layers"),
                         "use_sliding_window"))
    elif family == "gemma2":
        s["post_norms"] = True
        s.update(_window(f, layers, lambda i: i % 2 == 0))
    elif family in ("mistral", "phi3"):
        s.update(_window(f, layers, lambda i: True))
    return s


def _moe(f: _Fields, family: str) -> dict[str, Any]:
    """Mixtral, Qwen2-MoE, Qwen3-MoE."""
    s = _base(f, family)
    layers = s["layers"]
    if family == "mixtral":
        s.update(experts=f.integer("num_local_experts"), top_k=f.integer("num_experts_per_tok"),
                 expert_ffn=s["ffn"])
        s.update(_window(f, layers, lambda i: True))
        return s
    s.update(experts=f.integer("num_experts"), top_k=f.integer("num_experts_per_tok"),
             expert_ffn=f.integer("moe_intermediate_size"))
    step, only = f.integer("decoder_sparse_step", 1), f.config.get("mlp_only_layers") or []
    if not isinstance(only, list):
        raise f.error("mlp_only_layers", only, "must be a list of layer numbers")
    s["dense_layers"] = _dense_prefix(
        f, layers, lambda i: i not in only and (i + 1) % step == 0,
        "mlp_only_layers" if only else "decoder_sparse_step") if only or step > 1 else 0
    if family == "qwen2_moe":
        s["qkv_bias"] = f.flag("qkv_bias", True)
        if shared := f.opt_int("shared_expert_intermediate_size"):
            s.update(shared_experts=1, shared_expert_ffn=shared, shared_gate=True)
        s.update(_window(f, layers, lambda i: i % 2 == 0 and i < f.opt_int("max_window_layers"),
                         "use_sliding_window"))
    else:
        bias = f.flag("attention_bias", False)
        s.update(qk_norm=True, qkv_bias=bias, out_bias=bias)
        s.update(_window(f, layers, lambda i: True, "use_sliding_window"))
    return s


def _deepseek(f: _Fields, family: str) -> dict[str, Any]:
    """DeepSeek-V2 and V3: MLA, shared and routed experts after the first dense layers."""
    s = _base(f, family)
    s.pop("head_size", None)
    bias = f.flag("attention_bias", False)
    s.update(kv_heads=s["heads"], kv_lora_rank=f.integer("kv_lora_rank"),
             q_lora_rank=f.opt_int("q_lora_rank"), head_size=f.integer("qk_nope_head_dim"),
             rope_head_dim=f.integer("qk_rope_head_dim"), v_head_dim=f.integer("v_head_dim"),
             qkv_bias=bias, out_bias=bias)
    if experts := f.opt_int("n_routed_experts"):
        if f.integer("moe_layer_freq", 1) != 1:
            raise f.error("moe_layer_freq", f.config["moe_layer_freq"],
                          "topoopt maps MoE layers every layer (moe_layer_freq = 1) only")
        dense = f.integer("first_k_dense_replace", 0, minimum=0)
        s.update(experts=experts, top_k=f.integer("num_experts_per_tok"),
                 expert_ffn=f.integer("moe_intermediate_size"), dense_layers=dense,
                 shared_experts=f.opt_int("n_shared_experts"),
                 shared_expert_ffn=f.integer("moe_intermediate_size"))
    return s


def _gpt2(f: _Fields, family: str) -> dict[str, Any]:
    hidden = f.integer("n_embd")
    inner = f.config.get("n_inner")
    return dict(layers=f.integer("n_layer"), hidden=hidden, heads=f.integer("n_head"),
                kv_heads=f.integer("n_head"), ffn=4 * hidden if inner is None else f.integer("n_inner"),
                vocab=f.integer("vocab_size"), tied_embeddings=f.flag("tie_word_embeddings", True),
                gated=False, bias=True, learned_positions=True, rms_norm=False,
                positions=f.integer("n_positions"))


def _neox(f: _Fields, family: str) -> dict[str, Any]:
    s = _base(f, family)
    bias = f.flag("attention_bias", True)
    s.update(gated=False, rms_norm=False, qkv_bias=bias, out_bias=bias, mlp_bias=True)
    return s


_DECODERS: dict[str, Callable[[_Fields, str], dict[str, Any]]] = {
    "llama": _llama, "mistral": _llama, "qwen2": _llama, "qwen3": _llama, "gemma2": _llama,
    "phi3": _llama, "mixtral": _moe, "qwen2_moe": _moe, "qwen3_moe": _moe,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "gpt2": _gpt2, "gpt_neox": _neox,
}
_ENCODERS = ("bert", "roberta")

#: The ``model_type`` values the mapping reads.
HF_FAMILIES = (*_DECODERS, *_ENCODERS)


def _family(f: _Fields) -> str:
    if "quantization_config" in f.config:
        raise f.error("quantization_config", "...", "a quantized checkpoint; plan the config "
                      "of the unquantized model (topoopt trains in bf16/fp16/fp32)")
    family = f.config.get("model_type")
    if family not in HF_FAMILIES:
        raise f.error("model_type", family, f"topoopt maps {', '.join(HF_FAMILIES)}")
    return family


def hf_shape(config: _Config, seq: int | None = None, source: str = "config.json"
             ) -> TransformerShape:
    """The :class:`TransformerShape` of a decoder's ``config.json``.

    Parameters
    ----------
    config : mapping
        The parsed ``config.json``.
    seq : int, optional
        Tokens per training sequence; default the pre-training context (module doc).
    source : str
        Where the config came from, for error messages.

    Returns
    -------
    TransformerShape

    Raises
    ------
    ConfigError
        Naming ``source:field`` for what the mapping does not understand or a value out
        of range; BERT and RoBERTa (encoders) have no such shape.

    References
    ----------
    .. [1] Hugging Face transformers, the ``configuration_*.py`` of each family (the
       meaning of each field) and ``modeling_*.py`` (which layers hold which weights).
    """
    f = _Fields(source, config)
    family = _family(f)
    if family in _ENCODERS:
        raise f.error("model_type", family, "an encoder: it maps onto the bert workload, "
                      "not onto a decoder's shape")
    fields = _DECODERS[family](f, family)
    positions = "n_positions" if family == "gpt2" else "max_position_embeddings"
    return TransformerShape(seq=seq or _default_seq(f, positions), **fields)


def _encoder(f: _Fields, family: str, seq: int | None, name: str) -> Model:
    """BERT (``BertForPreTraining``) or RoBERTa (``RobertaForMaskedLM``: no pooler, no
    next-sentence head; two of its position rows are the padding offset)."""
    if f.config.get("position_embedding_type", "absolute") != "absolute":
        raise f.error("position_embedding_type", f.config["position_embedding_type"],
                      "topoopt maps absolute position embeddings only")
    positions = f.integer("max_position_embeddings")
    offset = 2 if family == "roberta" else 0
    seq, vocab = seq or positions - offset, f.integer("vocab_size")
    model = bert(layers=f.integer("num_hidden_layers"), hidden=f.integer("hidden_size"),
                 heads=f.integer("num_attention_heads"), seq=seq,
                 vocab=vocab, max_position=positions,
                 type_vocab=f.integer("type_vocab_size"), ffn=f.integer("intermediate_size"))
    ops = model.operators
    if family == "roberta":
        ops = tuple(op for op in ops if op.name not in ("pooler", "nsp"))
        loss = ops[-1]
        logits = softmax_loss("loss", seq * vocab, ("mlm.decoder",))
        ops = ops[:-1] + (replace(loss, fwd_flops=logits.fwd_flops, bwd_flops=logits.bwd_flops,
                                  inputs=logits.inputs),)
    return Model(name=name, operators=ops, size=model.size)


def hf_defaults(path: str | Path) -> dict[str, Any]:
    """What ``[job.size]`` may override for ``hf:PATH`` and its defaults (``seq``)."""
    f = _Fields(str(path), read_hf_config(path))
    family = _family(f)
    if family in _ENCODERS:
        return {"seq": f.integer("max_position_embeddings") - (2 if family == "roberta" else 0)}
    return {"seq": hf_shape(f.config, source=str(path)).seq}


def hf_model(path: str | Path, size: Mapping[str, Any] | None = None) -> Model:
    """The operator graph of the model a Hugging Face ``config.json`` describes.

    Parameters
    ----------
    path : str or Path
        A ``config.json``, or a folder holding one.
    size : mapping, optional
        ``[job.size]`` overrides: only ``seq`` (tokens per sequence).

    Returns
    -------
    Model
        Named ``hf:PATH``. Decoders: :func:`~topoopt.workloads.gpt.transformer` of
        :func:`hf_shape` (the LLM planner reads the shape back). BERT: the ``bert``
        workload with the file's sizes (``BertForPreTraining``); RoBERTa: the same
        without pooler and next-sentence head (``RobertaForMaskedLM``).

    Raises
    ------
    ConfigError
        A missing or unreadable file, a field the mapping does not understand (named
        ``PATH:field``), or a ``[job.size]`` key other than ``seq``.

    Examples
    --------
    >>> m = hf_model("configs/hf/qwen2.5-7b.json")
    >>> m.params
    7615616512
    """
    size = dict(size or {})
    for key, value in size.items():
        if key not in HF_SIZE_KEYS:
            raise ConfigError(f"job.size.{key}", value,
                              f"an hf: model takes only {', '.join(HF_SIZE_KEYS)}; its other "
                              "sizes come from the config.json")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"job.size.{key}", value, "must be a positive integer")
    seq = size.get("seq")
    f = _Fields(str(path), read_hf_config(path))
    family = _family(f)
    name = f"hf:{path}"
    if family in _ENCODERS:
        return _encoder(f, family, seq, name)
    return transformer(hf_shape(f.config, seq, str(path)), name)


#: The model name of a decoder written out as its whole shape in ``[job.size]``.
SHAPE_MODEL = "transformer"

_SHAPE_FIELDS = {f.name: f for f in fields(TransformerShape)}


def shape_defaults() -> dict[str, Any]:
    """The ``[job.size]`` keys of ``model = "transformer"`` that have defaults (every
    :class:`TransformerShape` field but ``layers``, ``hidden``, ``heads``, ``kv_heads``,
    ``ffn``, ``seq`` and ``vocab``, which it requires)."""
    return {k: f.default for k, f in _SHAPE_FIELDS.items() if f.default is not MISSING}


def shape_model(size: Mapping[str, Any] | None = None) -> Model:
    """A decoder given as its :class:`TransformerShape`, field by field, in ``[job.size]``
    (``model = "transformer"``).

    This is what ``topoopt import-model`` writes for an ``hf:`` decoder (or a ``gpt`` or
    ``moe`` model): the shape, editable, which the LLM planner plans like the source.

    Parameters
    ----------
    size : mapping
        :class:`TransformerShape`'s fields; ``layers``, ``hidden``, ``heads``,
        ``kv_heads``, ``ffn``, ``seq`` and ``vocab`` required.

    Returns
    -------
    Model
        :func:`~topoopt.workloads.gpt.transformer` of the shape, named ``transformer``.

    Raises
    ------
    ConfigError
        ``job.size.KEY`` for a key that is no shape field, a required one missing, or a
        value out of range.

    Examples
    --------
    Two Llama-style layers (``4 h^2`` attention, ``3 h f`` SwiGLU, two RMSNorms each),
    untied embeddings and a final norm: ``2 (4 64^2 + 3 64 128 + 2 64) + 2 100 64 + 64``.

    >>> shape_model({"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn": 128,
    ...              "seq": 16, "vocab": 100}).params
    95040
    """
    size = dict(size or {})
    for key, value in size.items():
        if key not in _SHAPE_FIELDS:
            raise ConfigError(f"job.size.{key}", value, "a transformer model's size holds "
                              f"TransformerShape's fields: {', '.join(_SHAPE_FIELDS)}")
    for key in _SHAPE_FIELDS:
        if key not in size and key not in shape_defaults():
            raise ConfigError(f"job.size.{key}", None, "is required for a transformer model")
    return transformer(TransformerShape(**size), SHAPE_MODEL)
