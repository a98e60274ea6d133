"""Tests of the workload builders: parameter and FLOP counts, overrides, validation.

Parameter counts are checked against numbers computed here by hand formula (or
published constants), never by re-summing the builders' operators.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topoopt.errors import ConfigError
from topoopt.model import OP_KINDS, Model
from topoopt.workloads import MODEL_NAMES, build_model, check_model, model_defaults
from topoopt.workloads.bert import bert
from topoopt.workloads.candle import candle
from topoopt.workloads.custom import OPERATOR_KEYS, custom_model
from topoopt.workloads.dlrm import dlrm
from topoopt.workloads.ncf import ncf
from topoopt.workloads.resnet import resnet50
from topoopt.workloads.vgg import vgg16

# --------------------------------------------------------------------------------------
# Hand formulas
# --------------------------------------------------------------------------------------


def fc(d_in: int, d_out: int) -> int:
    """Weights plus biases of a fully connected layer."""
    return d_in * d_out + d_out


def dlrm_params(tables=64, rows=10_000_000, dim=128, dense_features=13, bottom_layers=8,
                bottom_width=2048, top_layers=16, top_width=4096) -> int:
    emb = tables * rows * dim
    bottom = fc(dense_features, bottom_width) + (bottom_layers - 1) * fc(bottom_width, bottom_width)
    concat = bottom_width + tables * dim
    top = fc(concat, top_width) + (top_layers - 1) * fc(top_width, top_width) + fc(top_width, 1)
    return emb + bottom + top


def ncf_params(tables=32, rows=1_000_000, dim=128, top_layers=8, top_width=4096) -> int:
    return (tables * rows * dim + fc(tables * dim, top_width)
            + (top_layers - 1) * fc(top_width, top_width) + fc(top_width, 1))


def candle_params(feature_layers=3, feature_width=16384, dense_layers=3, dense_width=16384,
                  rnaseq=942, descriptors=5270, fingerprints=2048, drugs=2) -> int:
    """Separate encoder per input (FlexFlow's Uno), doses concatenated raw."""
    widths = [rnaseq] + [descriptors, fingerprints] * drugs
    encoders = sum(fc(w, feature_width) + (feature_layers - 1) * fc(feature_width, feature_width)
                   for w in widths)
    concat = len(widths) * feature_width + drugs
    head = (fc(concat, dense_width) + (dense_layers - 1) * fc(dense_width, dense_width)
            + fc(dense_width, 1))
    return encoders + head


def bert_encoder_params(layers, hidden, vocab=30522, max_position=512, type_vocab=2,
                        ffn=None) -> int:
    """HuggingFace ``BertModel``: embeddings + encoder layers + pooler."""
    ffn = 4 * hidden if ffn is None else ffn
    embeddings = (vocab + max_position + type_vocab) * hidden + 2 * hidden
    layer = 4 * fc(hidden, hidden) + fc(hidden, ffn) + fc(ffn, hidden) + 2 * 2 * hidden
    return embeddings + layers * layer + fc(hidden, hidden)


def bert_params(layers, hidden, vocab=30522, max_position=512, type_vocab=2, ffn=None) -> int:
    """``BertForPreTraining``: encoder + MLM head (decoder tied, own bias) + NSP."""
    mlm = fc(hidden, hidden) + 2 * hidden + vocab
    nsp = fc(hidden, 2)
    return bert_encoder_params(layers, hidden, vocab, max_position, type_vocab, ffn) + mlm + nsp


#: Published parameter counts (torchvision model cards, HuggingFace checkpoints).
RESNET50_PARAMS = 25_557_032
VGG16_PARAMS = 138_357_544
BERT_BASE_ENCODER = 109_482_240     # bert-base-uncased BertModel
BERT_LARGE_ENCODER = 335_141_888    # bert-large-uncased BertModel ("BERT-large, 340M")
BERT_LARGE_PRETRAINING = 336_226_108  # + MLM transform/LN/decoder bias + NSP classifier

#: torchvision's reported GFLOPS (really GMAC) at 224x224: convolutions + linear layers.
RESNET50_GMAC = 4.09e9
VGG16_GMAC = 15.47e9


def matmul_macs(model: Model) -> float:
    """MACs of conv/dense/attention operators with fused element-wise work removed."""
    return sum(op.fwd_flops for op in model if op.kind in ("conv", "dense")) / 2


def all_models() -> list[Model]:
    return [build_model(name) for name in MODEL_NAMES]


# --------------------------------------------------------------------------------------
# Parameter counts at the defaults
# --------------------------------------------------------------------------------------


def test_dlrm_default_params():
    assert dlrm().params == dlrm_params()
    # 64 * 10M * 128 embeddings dominate: 81.92 G of ~82.24 G parameters.
    assert dlrm().params == 82_243_074_049


def test_ncf_default_params():
    assert ncf().params == ncf_params() == 4_230_254_593


def test_candle_default_params():
    w = 16384
    assert candle().params == candle_params() == 17 * w * w + 15599 * w + 1 == 4_818_976_769


def test_bert_default_params():
    # TopoOpt size: 12 layers, hidden 1024, 16 heads, seq 64.
    assert bert().params == bert_params(12, 1024) == 185_071_420


def test_bert_large_and_base_params():
    """BERT-large is 335,141,888 without heads (the "340M" of the paper) and
    336,226,108 with the pre-training heads, which is what the builder models."""
    assert bert_encoder_params(24, 1024) == BERT_LARGE_ENCODER
    assert bert_params(24, 1024) == BERT_LARGE_PRETRAINING
    assert bert(layers=24).params == BERT_LARGE_PRETRAINING
    assert 335e6 <= bert(layers=24).params <= 340e6
    assert bert_encoder_params(12, 768) == BERT_BASE_ENCODER
    assert bert(layers=12, hidden=768, heads=12).params == bert_params(12, 768) == 110_106_428


def test_resnet50_params_exact():
    assert resnet50().params == RESNET50_PARAMS


def test_vgg16_params_exact():
    assert vgg16().params == VGG16_PARAMS


# --------------------------------------------------------------------------------------
# FLOPs per sample
# --------------------------------------------------------------------------------------


def test_resnet50_flops():
    m = resnet50()
    assert matmul_macs(m) == pytest.approx(RESNET50_GMAC, rel=0.005)
    assert m.fwd_flops / 2 == pytest.approx(4.1e9, rel=0.03)
    assert m.bwd_flops == pytest.approx(2 * m.fwd_flops, rel=0.02)


def test_vgg16_flops():
    m = vgg16()
    assert matmul_macs(m) == pytest.approx(VGG16_GMAC, rel=0.005)
    assert m.fwd_flops / 2 == pytest.approx(15.5e9, rel=0.03)


def bert_matmul_flops(layers, hidden, seq, vocab=30522, ffn=None) -> float:
    """2 * weights * tokens for every token-wise matrix, plus the attention terms."""
    ffn = 4 * hidden if ffn is None else ffn
    h, s = hidden, seq
    per_token_weights = layers * (4 * h * h + 2 * h * ffn) + h * h + h * vocab
    attention = layers * 4 * s * s * h          # Q K^T and softmax(.) V
    pooled = 2 * (h * h + 2 * h)                # pooler and NSP on one vector
    return 2 * per_token_weights * s + attention + pooled


@pytest.mark.parametrize("size, tol", [
    (dict(layers=12, hidden=1024, heads=16, seq=64), 0.01),
    (dict(layers=24, hidden=1024, heads=16, seq=512), 0.01),
    # At hidden 128 GELU, LayerNorm and the loss weigh more: ~2%.
    (dict(layers=2, hidden=128, heads=2, seq=8, vocab=1000), 0.03),
])
def test_bert_flops(size, tol):
    m = bert(**size)
    expected = bert_matmul_flops(size["layers"], size["hidden"], size["seq"],
                                 vocab=size.get("vocab", 30522))
    # Norms, softmax, GELU and the loss add little on top of the matmuls.
    assert expected <= m.fwd_flops <= (1 + tol) * expected
    assert m.bwd_flops == pytest.approx(2 * m.fwd_flops, rel=0.01)


def bert_fwd_flops(layers=12, hidden=1024, heads=16, seq=64, vocab=30522, ffn=None) -> int:
    """Every operator of :func:`bert` by the per-element conventions of workloads.layers:
    LayerNorm 7 FLOPs per element (+1 per fused add), GELU/tanh 8, softmax 5."""
    ffn = 4 * hidden if ffn is None else ffn
    h, s = hidden, seq
    embeddings = 3 * s * h + (7 + 2) * s * h     # three lookups, two adds + LayerNorm
    attention = 8 * s * h * h + 4 * s * s * h + 5 * heads * s * s
    ffn_block = 2 * h * ffn * s + 8 * ffn * s + 2 * ffn * h * s
    layer = attention + ffn_block + 2 * (7 + 1) * s * h
    pooler_nsp = 2 * h * h + 8 * h + 2 * h * 2
    mlm = 2 * h * h * s + 8 * h * s + 7 * s * h + 2 * s * h * vocab
    return embeddings + layers * layer + pooler_nsp + mlm + 5 * (s * vocab + 2)


@pytest.mark.parametrize("size", [{}, dict(layers=2, hidden=128, heads=2, seq=8, vocab=1000,
                                           ffn=300)])
def test_bert_flops_exact(size):
    # the default BERT of TopoOpt §5: 23,718,803,594 FLOPs per sample forward
    assert bert(**size).fwd_flops == bert_fwd_flops(**size)


def test_dlrm_flops_formula():
    d = model_defaults("dlrm")
    weights = dlrm_params() - d["tables"] * d["rows"] * d["dim"]
    biases = d["bottom_layers"] * d["bottom_width"] + d["top_layers"] * d["top_width"] + 1
    lookups = d["tables"] * d["bag"] * d["dim"]
    assert dlrm().fwd_flops == 2 * (weights - biases) + lookups + 4


def test_ncf_flops_formula():
    weights = ncf_params() - 32 * 1_000_000 * 128 - (8 * 4096 + 1)
    assert ncf().fwd_flops == 2 * weights + 32 * 1 * 128 + 4


def test_candle_flops_formula():
    w = 16384
    biases = 5 * 3 * w + 3 * w + 1
    assert candle().fwd_flops == 2 * (candle_params() - biases) + 3


@pytest.mark.parametrize("builder", [bert, candle, ncf, resnet50, vgg16])
def test_backward_convention(builder):
    """Backward = 2x forward with parameters (embeddings: 1x, memory bound), else 1x."""
    for op in builder():
        if op.params > 0 and op.kind != "embedding":
            assert op.bwd_flops == 2 * op.fwd_flops, op.name
        else:
            assert op.bwd_flops == op.fwd_flops, op.name


# --------------------------------------------------------------------------------------
# Structure
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_builtin_models_are_well_formed(name):
    m = build_model(name)
    check_model(m)
    assert m.name == name
    pos = {op.name: i for i, op in enumerate(m)}
    assert len(pos) == len(m)
    for src, dst in m.edges:
        assert src < dst
    for op in m:
        assert op.kind in OP_KINDS
        assert all(pos[s] < pos[op.name] for s in op.inputs)
        assert op.kind == "input" or op.inputs, op.name
    # Every output is consumed; the last operator is the loss.
    consumed = {s for op in m for s in op.inputs}
    assert [op.name for op in m if op.name not in consumed] == [m.operators[-1].name]
    assert m.operators[-1].kind == "loss"
    # The recorded size covers every builder parameter.
    assert set(m.size) == set(model_defaults(name))


def test_resnet50_structure():
    m = resnet50()
    kinds = [op.kind for op in m]
    assert kinds.count("conv") == 53          # 49 + 4 projection shortcuts
    assert kinds.count("norm") == 53
    assert kinds.count("elementwise") == 16   # residual adds (ReLU fused)
    assert kinds.count("pool") == 2
    assert sum(op.kind == "dense" for op in m) == 1
    # v1.5: the stride-2 sits on the 3x3 conv of the first block of stages 2-4.
    conv1 = m.operators[m.index("layer2.0.conv1")]
    conv2 = m.operators[m.index("layer2.0.conv2")]
    assert conv1.out_elems == 128 * 56 * 56
    assert conv2.out_elems == 128 * 28 * 28
    assert m.operators[m.index("layer4.2.add")].out_elems == 2048 * 7 * 7
    assert set(m.operators[m.index("layer1.0.add")].inputs) == {"layer1.0.bn3",
                                                               "layer1.0.downsample.1"}
    assert set(m.operators[m.index("layer1.1.add")].inputs) == {"layer1.1.bn3", "layer1.0.add"}


def test_vgg16_structure():
    m = vgg16()
    assert sum(op.kind == "conv" for op in m) == 13
    assert sum(op.kind == "dense" for op in m) == 3
    assert m.operators[m.index("pool5")].out_elems == 512 * 7 * 7


def test_bert_structure():
    m = bert()
    s, h = 64, 1024
    attn = [op for op in m if op.kind == "attention"]
    assert len(attn) == 12
    assert all(op.params == 4 * h * h + 4 * h for op in attn)
    for op in m:
        if op.name.startswith("layer") and not op.name.endswith("ffn.up"):
            assert op.out_elems == s * h, op.name
    word = m.operators[m.index("embeddings.word")]
    assert word.kind == "embedding" and word.mem_elems == s * h and word.params == 30522 * h
    up = m.operators[m.index("layer0.ffn.up")]
    assert up.kind == "dense" and up.out_elems == s * 4 * h


def test_resnet50_builds_the_same_model_each_time():
    # its build time (a wall-clock check here before) is in benchmarks/workloads_bench.py
    first, again = resnet50(), resnet50()
    assert first is not again and first == again
    assert build_model("resnet50") == first


# --------------------------------------------------------------------------------------
# Overrides through build_model
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, size, expected", [
    ("dlrm", {"tables": 4, "rows": 1000}, dlrm_params(tables=4, rows=1000)),
    ("ncf", {"tables": 2, "top_layers": 3, "top_width": 64},
     ncf_params(tables=2, top_layers=3, top_width=64)),
    ("candle", {"feature_width": 1000, "dense_width": 1000},
     candle_params(feature_width=1000, dense_width=1000)),
    ("candle", {"drugs": 1, "feature_layers": 1}, candle_params(drugs=1, feature_layers=1)),
    ("bert", {"layers": 24}, BERT_LARGE_PRETRAINING),
    ("bert", {"ffn": 1000}, bert_params(12, 1024, ffn=1000)),
    ("resnet50", {"classes": 10}, RESNET50_PARAMS - fc(2048, 1000) + fc(2048, 10)),
    ("resnet50", {"image": 32}, RESNET50_PARAMS),
    ("vgg16", {"classes": 10}, VGG16_PARAMS - fc(4096, 1000) + fc(4096, 10)),
    ("vgg16", {"image": 512}, VGG16_PARAMS),
])
def test_overrides_change_params(name, size, expected):
    m = build_model(name, size)
    assert m.params == expected
    for key, value in size.items():
        assert m.size[key] == value


def test_image_override_scales_conv_flops():
    # 224 and 448 are multiples of 32, so every feature map exactly doubles per side.
    small, big = build_model("resnet50", {"image": 224}), build_model("resnet50", {"image": 448})
    conv = lambda m: sum(op.fwd_flops for op in m if op.kind == "conv")  # noqa: E731
    assert conv(big) == pytest.approx(4.0 * conv(small), rel=1e-12)
    assert big.params == small.params


@settings(max_examples=40, deadline=None)
@given(tables=st.integers(1, 16), rows=st.integers(1, 10**6), dim=st.integers(1, 64),
       bag=st.integers(1, 8), dense_features=st.integers(1, 32),
       bottom_layers=st.integers(1, 4), bottom_width=st.integers(1, 128),
       top_layers=st.integers(1, 4), top_width=st.integers(1, 128))
def test_dlrm_params_property(tables, rows, dim, bag, dense_features, bottom_layers,
                              bottom_width, top_layers, top_width):
    size = dict(tables=tables, rows=rows, dim=dim, bag=bag, dense_features=dense_features,
                bottom_layers=bottom_layers, bottom_width=bottom_width,
                top_layers=top_layers, top_width=top_width)
    m = build_model("dlrm", size)
    size.pop("bag")
    assert m.params == dlrm_params(**size)


@settings(max_examples=40, deadline=None)
@given(tables=st.integers(1, 32), rows=st.integers(1, 10**7), dim=st.integers(1, 256),
       bag=st.integers(1, 8), top_layers=st.integers(1, 6), top_width=st.integers(1, 512))
def test_ncf_params_property(tables, rows, dim, bag, top_layers, top_width):
    m = build_model("ncf", dict(tables=tables, rows=rows, dim=dim, bag=bag,
                                top_layers=top_layers, top_width=top_width))
    assert m.params == ncf_params(tables, rows, dim, top_layers, top_width)
    emb = [op for op in m if op.kind == "embedding"]
    assert len(emb) == tables and all(op.mem_elems == bag * dim for op in emb)


@settings(max_examples=30, deadline=None)
@given(feature_layers=st.integers(1, 4), feature_width=st.integers(1, 512),
       dense_layers=st.integers(1, 4), dense_width=st.integers(1, 512),
       rnaseq=st.integers(1, 1000), descriptors=st.integers(1, 6000),
       fingerprints=st.integers(1, 4096), drugs=st.integers(1, 3))
def test_candle_params_property(**size):
    assert build_model("candle", size).params == candle_params(**size)


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(1, 4), head_dim=st.integers(1, 32), heads=st.integers(1, 8),
       seq=st.integers(1, 128), vocab=st.integers(1, 5000), ffn=st.integers(1, 512))
def test_bert_params_property(layers, head_dim, heads, seq, vocab, ffn):
    hidden = head_dim * heads
    m = build_model("bert", dict(layers=layers, hidden=hidden, heads=heads, seq=seq,
                                 vocab=vocab, ffn=ffn))
    assert m.params == bert_params(layers, hidden, vocab=vocab, ffn=ffn)
    assert bert_matmul_flops(layers, hidden, seq, vocab, ffn) <= m.fwd_flops


# --------------------------------------------------------------------------------------
# Bad overrides
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("value", [0, -3, 1.5, "8", True, None])
def test_bad_override_value_names_field(name, value):
    key = next(iter(model_defaults(name)))
    with pytest.raises(ConfigError) as err:
        build_model(name, {key: value})
    assert err.value.field == f"job.size.{key}"
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_unknown_override_key_names_field(name):
    with pytest.raises(ConfigError) as err:
        build_model(name, {"widht": 8})
    assert err.value.field == "job.size.widht"
    for key in model_defaults(name):
        assert key in err.value.allowed


@pytest.mark.parametrize("name, size, field", [
    ("bert", {"heads": 12}, "job.size.heads"),            # 1024 % 12 != 0
    ("bert", {"seq": 1024}, "job.size.seq"),              # > max_position 512
    ("bert", {"max_position": 32}, "job.size.seq"),
    ("vgg16", {"image": 16}, "job.size.image"),
])
def test_inconsistent_sizes_name_field(name, size, field):
    with pytest.raises(ConfigError) as err:
        build_model(name, size)
    assert err.value.field == field


def test_unknown_model():
    with pytest.raises(ConfigError) as err:
        build_model("gpt5")
    assert err.value.field == "job.model"


def test_model_defaults():
    assert model_defaults("bert") == dict(layers=12, hidden=1024, heads=16, seq=64,
                                          vocab=30522, max_position=512, type_vocab=2,
                                          ffn=None)
    assert model_defaults("ncf") == dict(tables=32, rows=1_000_000, dim=128, bag=1,
                                         top_layers=8, top_width=4096)
    assert model_defaults("resnet50") == dict(image=224, classes=1000)
    assert model_defaults("vgg16") == dict(image=224, classes=1000)
    assert model_defaults("candle")["feature_width"] == 16384
    assert model_defaults("candle")["dense_width"] == 16384
    assert bert().size["ffn"] == 4096


# --------------------------------------------------------------------------------------
# custom_model
# --------------------------------------------------------------------------------------


def good_tables() -> list[dict]:
    return [
        {"name": "x", "kind": "input", "out_elems": 784},
        {"name": "fc1", "kind": "dense", "params": 784 * 256 + 256, "fwd_flops": 2 * 784 * 256,
         "out_elems": 256, "inputs": ["x"]},
        {"name": "relu", "kind": "elementwise", "fwd_flops": 256.0, "out_elems": 256,
         "inputs": ["fc1"]},
        {"name": "emb", "kind": "embedding", "params": 1000 * 16, "fwd_flops": 16,
         "bwd_flops": 16, "out_elems": 16, "inputs": ["x"], "mem_elems": 16},
        {"name": "cat", "kind": "interaction", "out_elems": 272, "inputs": ["relu", "emb"]},
        {"name": "fc2", "kind": "dense", "params": 2730, "fwd_flops": 5440, "out_elems": 10,
         "inputs": ["cat"]},
        {"name": "loss", "kind": "loss", "fwd_flops": 50, "out_elems": 1, "inputs": ["fc2"]},
    ]


def test_custom_model_good():
    m = custom_model("mnist-ish", good_tables())
    check_model(m)
    assert m.name == "mnist-ish" and len(m) == 7
    assert m.params == 784 * 256 + 256 + 16000 + 2730
    fc1, relu, emb = (m.operators[m.index(n)] for n in ("fc1", "relu", "emb"))
    assert fc1.bwd_flops == 2 * fc1.fwd_flops              # default with params
    assert relu.bwd_flops == relu.fwd_flops                # default without params
    assert emb.bwd_flops == 16 and emb.mem_elems == 16     # explicit value kept
    assert fc1.inputs == ("x",) and isinstance(fc1.fwd_flops, float)
    assert m.operators[m.index("cat")].inputs == ("relu", "emb")
    assert m.edges[0] == (0, 1)


def test_custom_model_minimal_and_tuple_inputs():
    m = custom_model("one", ({"name": "only", "kind": "dense", "params": 3, "fwd_flops": 4},))
    assert m.operators[0].bwd_flops == 8 and m.operators[0].out_elems == 0
    m = custom_model("t", [{"name": "a", "kind": "input"},
                           {"name": "b", "kind": "pool", "inputs": ("a",)}])
    assert m.operators[1].inputs == ("a",)


def _bad(index: int, **change) -> list[dict]:
    tables = good_tables()
    for key, value in change.items():
        if value is _DELETE:
            del tables[index][key]
        else:
            tables[index][key] = value
    return tables


_DELETE = object()


@pytest.mark.parametrize("index, change, field", [
    (3, {"flops": 5}, "job.operators[3].flops"),
    (1, {"Params": 5}, "job.operators[1].Params"),
    (2, {"name": _DELETE}, "job.operators[2].name"),
    (2, {"kind": _DELETE}, "job.operators[2].kind"),
    (3, {"kind": "lstm"}, "job.operators[3].kind"),
    (3, {"kind": 3}, "job.operators[3].kind"),
    (1, {"name": 7}, "job.operators[1].name"),
    (1, {"name": ""}, "job.operators[1].name"),
    (2, {"name": "fc1"}, "job.operators[2].name"),                # duplicate
    (1, {"params": -1}, "job.operators[1].params"),
    (1, {"params": 2.0e5}, "job.operators[1].params"),
    (1, {"params": "200k"}, "job.operators[1].params"),
    (1, {"params": True}, "job.operators[1].params"),
    (1, {"fwd_flops": "1 GFLOP"}, "job.operators[1].fwd_flops"),
    (1, {"fwd_flops": -1.0}, "job.operators[1].fwd_flops"),
    (1, {"fwd_flops": math.nan}, "job.operators[1].fwd_flops"),
    (1, {"fwd_flops": math.inf}, "job.operators[1].fwd_flops"),
    (1, {"fwd_flops": False}, "job.operators[1].fwd_flops"),
    (1, {"bwd_flops": [1]}, "job.operators[1].bwd_flops"),
    (1, {"bwd_flops": -2}, "job.operators[1].bwd_flops"),
    (1, {"out_elems": 1.5}, "job.operators[1].out_elems"),
    (1, {"out_elems": -1}, "job.operators[1].out_elems"),
    (3, {"mem_elems": -16}, "job.operators[3].mem_elems"),
    (3, {"mem_elems": "16"}, "job.operators[3].mem_elems"),
    (1, {"inputs": "x"}, "job.operators[1].inputs"),
    (1, {"inputs": {"x": 1}}, "job.operators[1].inputs"),
    (1, {"inputs": [3]}, "job.operators[1].inputs[0]"),
    (4, {"inputs": ["relu", "nope"]}, "job.operators[4].inputs[1]"),
    (1, {"inputs": ["relu"]}, "job.operators[1].inputs[0]"),      # defined later
    (1, {"inputs": ["fc1"]}, "job.operators[1].inputs[0]"),       # itself
    (0, {"inputs": ["x"]}, "job.operators[0].inputs[0]"),         # first op, itself
    (4, {"inputs": ["relu", "relu"]}, "job.operators[4].inputs"),
])
def test_custom_model_bad_key(index, change, field):
    with pytest.raises(ConfigError) as err:
        custom_model("bad", _bad(index, **change))
    assert err.value.field == field
    message = str(err.value)
    assert "\n" not in message and message.startswith(field)
    assert err.value.allowed


def test_custom_model_unknown_key_lists_allowed_keys():
    with pytest.raises(ConfigError) as err:
        custom_model("bad", _bad(0, size=3))
    for key in OPERATOR_KEYS:
        assert key in err.value.allowed


def test_custom_model_bad_kind_lists_kinds():
    with pytest.raises(ConfigError) as err:
        custom_model("bad", _bad(1, kind="Dense"))
    assert "dense" in err.value.allowed and "embedding" in err.value.allowed


def test_custom_model_float_count_hint():
    with pytest.raises(ConfigError) as err:
        custom_model("bad", _bad(1, params=1e6))
    assert "1000000" in err.value.allowed


@pytest.mark.parametrize("operators, field", [
    ([], "job.operators"),
    ("fc1", "job.operators"),
    ({"name": "x", "kind": "input"}, "job.operators"),
    (None, "job.operators"),
    ([{"name": "x", "kind": "input"}, ["y", "dense"]], "job.operators[1]"),
])
def test_custom_model_bad_container(operators, field):
    with pytest.raises(ConfigError) as err:
        custom_model("bad", operators)
    assert err.value.field == field


def test_custom_model_bad_name():
    with pytest.raises(ConfigError) as err:
        custom_model("", good_tables())
    assert err.value.field == "job.name"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OP_KINDS), st.integers(0, 10**9),
                          st.floats(0, 1e12, allow_nan=False), st.integers(0, 10**6)),
                min_size=1, max_size=20),
       st.randoms(use_true_random=False))
def test_custom_model_random_chains(specs, rnd):
    tables = []
    for i, (kind, params, fwd, out) in enumerate(specs):
        table = {"name": f"op{i}", "kind": kind, "params": params, "fwd_flops": fwd,
                 "out_elems": out}
        if i:
            table["inputs"] = sorted({f"op{rnd.randrange(i)}" for _ in range(2)})
        tables.append(table)
    m = custom_model("random", tables)
    assert m.params == sum(p for _, p, _, _ in specs)
    for op, (_, params, fwd, _) in zip(m, specs):
        assert op.bwd_flops == (2 * fwd if params > 0 else fwd)
