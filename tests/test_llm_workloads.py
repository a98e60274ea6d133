"""The gpt and moe workloads: published parameter counts and FLOPs per token by hand."""

from __future__ import annotations

import pytest

from topoopt.errors import ConfigError
from topoopt.workloads import build_model, model_defaults
from topoopt.workloads.gpt import PUBLISHED_PARAMS, TransformerShape, transformer_shape


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_counts_within_one_percent_of_published(name):
    total, active = PUBLISHED_PARAMS[name]
    model = build_model(name)
    shape = transformer_shape(model)
    assert model.name == name
    assert model.params == shape.params          # the operator graph and the shape agree
    assert abs(shape.params / total - 1) < 0.01
    assert abs(shape.active_params / active - 1) < 0.01


def test_llama3_counts_are_the_checkpoints_exactly():
    # the released checkpoints' parameter counts (config.json shapes)
    assert build_model("llama3-8b").params == 8_030_261_248
    assert build_model("llama3-70b").params == 70_553_706_496


def test_gpt3_parameters_by_hand():
    # 12 L h^2 + 13 L h (biases, LayerNorms) + (V + s) h + 2h (final LayerNorm)
    L, h, V, s = 96, 12288, 50257, 2048
    assert build_model("gpt3-175b").params == 12 * L * h * h + 13 * L * h + (V + s) * h + 2 * h


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_training_flops_per_token_by_hand(name):
    """6 N + 12 L s h (Kaplan et al. 2020 §2.1; PaLM App. B), N the matmul weights a
    token goes through: active parameters without the input embedding, norms and
    biases, plus the output projection."""
    shape = transformer_shape(build_model(name))
    L, h, s, V = shape.layers, shape.hidden, shape.seq, shape.vocab
    n_matmul = shape.active_params - shape.embedding_params - (2 * L + 1) * shape.norm_params
    if not shape.tied_embeddings:
        n_matmul -= V * h                   # counted below, once
    if shape.bias:
        n_matmul -= L * (4 * h + shape.ffn + h)
    n_matmul += V * h                       # output projection (tied or not)
    hand = 6 * n_matmul + 12 * L * s * h
    assert shape.training_flops_per_token() == pytest.approx(hand, rel=1e-12)
    # the operator graph adds norms, softmax, activations: less than 1% on top
    model = build_model(name)
    per_token = (model.fwd_flops + model.bwd_flops) / s
    assert 1.0 <= per_token / hand < 1.01


def test_gpt3_flops_match_megatron_formula():
    """Narayanan et al. SC'21 §5.1: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) model FLOPs per
    batch without recomputation (their 96 ... V/(16 l h) counts recompute)."""
    shape = transformer_shape(build_model("gpt3-175b"))
    L, h, s, V = shape.layers, shape.hidden, shape.seq, shape.vocab
    megatron = 72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)) / s
    assert shape.training_flops_per_token() == pytest.approx(megatron, rel=1e-3)


def test_mixtral_active_parameters_use_top_k_experts():
    shape = transformer_shape(build_model("mixtral-8x7b"))
    assert shape.params - shape.active_params == 32 * 6 * shape.expert_params
    one = transformer_shape(build_model("mixtral-8x7b", {"top_k": 1}))
    assert shape.active_params - one.active_params == 32 * shape.expert_params


@pytest.mark.parametrize("name, size, field", [
    ("gpt", {"heads": 30}, "job.size.heads"),
    ("gpt", {"kv_heads": 3}, "job.size.kv_heads"),
    ("moe", {"top_k": 9}, "job.size.top_k"),
    ("gpt", {"tied_embeddings": 1}, "job.size.tied_embeddings"),
    ("moe", {"capacity_factor": 0}, "job.size.capacity_factor"),
    ("llama3-70b", {"layers": 1.5}, "job.size.layers"),
])
def test_bad_sizes_name_the_field(name, size, field):
    with pytest.raises(ConfigError) as err:
        build_model(name, size)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_presets_are_defaults_overridable():
    assert model_defaults("llama3-70b")["layers"] == 80
    assert "name" not in model_defaults("gpt")
    small = build_model("llama3-70b", {"layers": 2, "seq": 128})
    assert transformer_shape(small) == TransformerShape.from_size(
        {**model_defaults("llama3-70b"), "layers": 2, "seq": 128})
