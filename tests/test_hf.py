"""Hugging Face configs as workloads: every family's parameter count equals transformers'
own (the model built on the meta device from the same config.json, no download), FLOPs
per token equal 6 N + attention with N the matmul weights transformers holds, and what
the mapping does not understand is one line naming the field."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.errors import ConfigError
from topoopt.workloads import build_model, model_defaults
from topoopt.workloads.gpt import TransformerShape, transformer, transformer_shape
from topoopt.workloads.hf import HF_FAMILIES, hf_model, hf_shape

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "tests" / "data" / "hf").glob("*.json")) + sorted(
    (ROOT / "configs" / "hf").glob("*.json"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


@functools.cache
def _hf_module_of(text: str):
    return _hf_module(json.loads(text))


def _hf_module(config: dict):
    """transformers' model of ``config`` on the meta device (BERT with its pre-training
    heads, RoBERTa with its masked-LM head, the rest as causal LMs)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.AutoConfig.for_model(**config)
    cls = {"bert": transformers.BertForPreTraining,
           "roberta": transformers.RobertaForMaskedLM}.get(config["model_type"])
    with torch.device("meta"):
        return cls(cfg) if cls else transformers.AutoModelForCausalLM.from_config(cfg)


def test_the_data_cover_every_family():
    assert {_load(p)["model_type"] for p in CONFIGS} == set(HF_FAMILIES)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_params_equal_transformers_count(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    model = hf_model(_rel(path))
    module = _hf_module_of(path.read_text())
    assert model.params == module.num_parameters()
    if "layers" in model.size and "kv_heads" in model.size:
        assert transformer_shape(model).params == model.params


def _matmul_weights(module, config: dict) -> float:
    """Weights a token goes through in matmuls, read off transformers' module: every
    parameter of two or more dimensions but the embedding tables, routed experts
    (the fused 3-D tensors) scaled by top-k over experts, and a tied output projection
    once more."""
    import torch
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
    experts = config.get("num_local_experts") or config.get("num_experts") \
        or config.get("n_routed_experts") or 0
    total = 0.0
    for name, p in module.named_parameters():
        if p.dim() < 2 or id(p) in embeddings:
            continue
        total += p.numel() * (config["num_experts_per_tok"] / experts if p.dim() == 3 else 1)
    if not any(True for _ in module.get_output_embeddings().parameters()
               if id(_) not in embeddings):
        total += module.get_output_embeddings().weight.numel()
    return total


@pytest.mark.parametrize("path", [p for p in CONFIGS if _load(p)["model_type"]
                                  not in ("bert", "roberta")], ids=lambda p: p.stem)
def test_flops_per_token_are_6n_plus_attention(path):
    """PaLM App. B: 6 N + 12 L H Q T (here 6 L H (Q_k + Q_v) T, for MLA's unequal heads),
    with T the sequence; the sequence is kept within any sliding window."""
    config = _load(path)
    seq = min(512, config.get("sliding_window") or 512)
    shape = hf_shape(config, seq=seq)
    module = _hf_module_of(path.read_text())
    heads = shape.heads
    if config["model_type"].startswith("deepseek"):
        qk, v = config["qk_nope_head_dim"] + config["qk_rope_head_dim"], config["v_head_dim"]
    else:
        qk = v = config.get("head_dim") or shape.hidden // heads
    expected = 6 * _matmul_weights(module, config) + 6 * shape.layers * heads * (qk + v) * seq
    assert shape.training_flops_per_token() == pytest.approx(expected, rel=1e-12)


#: One config per family for the counted run (the smallest of each).
COUNTED = {"llama": "llama-3.2-1b", "mistral": "mistral-7b-v0.1", "qwen2": "qwen2.5-0.5b",
           "qwen3": "qwen3-0.6b", "gemma2": "gemma-2-2b", "phi3": "phi-3-mini-4k",
           "gpt2": "gpt2", "gpt_neox": "pythia-160m", "mixtral": "mixtral-8x7b",
           "qwen2_moe": "qwen1.5-moe-a2.7b", "qwen3_moe": "qwen3-30b-a3b",
           "deepseek_v2": "deepseek-v2-lite", "deepseek_v3": "deepseek-v3",
           "bert": "bert-base-uncased", "roberta": "roberta-base"}


def _counted(config: dict, seq: int, backward: bool) -> float:
    """FLOPs torch's own counter (``torch.utils.flop_counter``: matmuls and attention)
    counts for one sequence of ``seq`` tokens through transformers' module, run on the
    meta device (shapes only), forward and, with ``backward``, backward."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode
    module = _hf_module(config)
    ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        out = module(input_ids=ids)
        if backward:
            out.logits.sum().backward()
    return counter.get_total_flops()


def test_the_counted_families_are_every_family():
    assert set(COUNTED) == set(HF_FAMILIES)
    assert {_load(p)["model_type"]: p.stem for p in CONFIGS if p.stem in COUNTED.values()
            } == COUNTED


@pytest.mark.parametrize("family", [f for f in COUNTED if f not in ("bert", "roberta")])
def test_flops_per_token_equal_the_counted_module(family):
    """Training FLOPs per token (forward and backward) equal torch's count of the module
    itself, up to 4 layers of it (the count is per layer; the parameters are checked
    on the whole model above). A meta-device run routes no token to a routed expert, so
    for MoE families the count leaves them out, and so does the comparison: their
    share is the active-parameter test's."""
    config = _load(next(p for p in CONFIGS if p.stem == COUNTED[family]))
    key = "n_layer" if family == "gpt2" else "num_hidden_layers"
    layers = min(4, config[key])
    config = {**config, key: layers, **(
        {"layer_types": config["layer_types"][:layers]} if "layer_types" in config else {})}
    seq = min(64, config.get("sliding_window") or 64)
    shape = hf_shape(config, seq=seq)
    routed = 6.0 * shape.moe_layers * shape.top_k * shape.expert_params
    counted = _counted(config, seq, backward=True)
    assert counted / seq == pytest.approx(shape.training_flops_per_token() - routed, rel=1e-12)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_encoder_matmul_flops_equal_the_counted_module(family, monkeypatch):
    """BERT and RoBERTa: the dense and attention operators' forward FLOPs less what they
    fold in besides matmuls (the GELU and tanh activations and the attention softmax,
    ``workloads/layers.py``) equal torch's count of the module's forward."""
    from topoopt.workloads.layers import ACTIVATION_FLOPS_PER_ELEM, SOFTMAX_FLOPS_PER_ELEM
    path = next(p for p in CONFIGS if p.stem == COUNTED[family])
    config, seq = _load(path), 64
    monkeypatch.chdir(ROOT)
    model = build_model("hf:" + _rel(path), {"seq": seq})
    h, layers, heads = config["hidden_size"], config["num_hidden_layers"], \
        config["num_attention_heads"]
    matmuls = sum(op.fwd_flops for op in model if op.kind in ("dense", "attention"))
    folded = ACTIVATION_FLOPS_PER_ELEM * (layers * seq * config["intermediate_size"] + seq * h
                                          + (h if family == "bert" else 0)) \
        + SOFTMAX_FLOPS_PER_ELEM * layers * heads * seq * seq
    assert _counted(config, seq, backward=False) == pytest.approx(matmuls - folded, rel=1e-12)


@pytest.mark.parametrize("path", [p for p in CONFIGS if _load(p)["model_type"]
                                  in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")],
                         ids=lambda p: p.stem)
def test_active_params_leave_out_the_unrouted_experts(path):
    config = _load(path)
    module = _hf_module_of(path.read_text())
    shape = hf_shape(config)
    experts = config.get("num_local_experts") or config.get("num_experts") \
        or config["n_routed_experts"]
    routed = sum(p.numel() for p in module.parameters() if p.dim() == 3)
    idle = routed * (experts - config["num_experts_per_tok"]) // experts
    assert shape.active_params == module.num_parameters() - idle


def test_a_sliding_window_shortens_attention_only_on_its_layers():
    config = _load(ROOT / "tests/data/hf/gemma-2-2b.json")
    long, short = hf_shape(config, seq=8192), hf_shape(config, seq=4096)
    assert long.sliding_layers == 13       # Gemma 2 alternates
    full = TransformerShape(**{**long.__dict__, "sliding_window": 0, "sliding_layers": 0})
    saved = full.training_flops_per_token() - long.training_flops_per_token()
    assert saved == pytest.approx(3 * 13 * 2 * long.heads * 2 * long.head_dim * (8192 - 4096))
    assert short.training_flops_per_token() == pytest.approx(
        TransformerShape(**{**short.__dict__, "sliding_layers": 0}).training_flops_per_token())


def test_stage_params_sum_to_the_total_with_dense_layers_first():
    shape = hf_shape(_load(ROOT / "configs/hf/deepseek-v2-lite.json"))
    cuts = [0, 1, 7, 27]
    parts = [shape.layers_params(a, b) for a, b in zip(cuts, cuts[1:])]
    assert sum(d + e for d, e in parts) + shape.embedding_params + shape.output_params \
        == shape.params
    assert parts[0][1] == 0 and parts[1][1] == 6 * shape.experts * shape.expert_params
    assert sum(shape.layer_params(i)[0] for i in range(27)) == sum(d for d, _ in parts)


def test_the_graph_reads_back_as_the_shape(monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in ("configs/hf/deepseek-v2-lite.json", "tests/data/hf/gemma-2-2b.json",
                 "tests/data/hf/gpt2.json", "tests/data/hf/qwen1.5-moe-a2.7b.json"):
        model = build_model("hf:" + name)
        shape = transformer_shape(model)
        assert shape == hf_shape(_load(ROOT / name))
        assert model.params == shape.params
        assert transformer(shape, model.name) == model


def test_seq_defaults_to_the_pretraining_context_and_can_be_set(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert model_defaults("hf:tests/data/hf/llama-3.1-8b.json") == {"seq": 8192}
    assert model_defaults("hf:tests/data/hf/roberta-base.json") == {"seq": 512}
    assert transformer_shape(build_model("hf:tests/data/hf/llama-3.1-8b.json",
                                         {"seq": 2048})).seq == 2048
    with pytest.raises(ConfigError, match="no config.json there"):
        build_model("hf:configs/hf")  # a folder without config.json


@pytest.mark.parametrize("change, field", [
    ({"model_type": "mamba"}, "model_type"),
    ({"rope_scaling": {"rope_type": "wild", "factor": 2.0}}, "rope_scaling.rope_type"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "quantization_config"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
])
def test_what_the_mapping_does_not_understand_names_its_field(change, field):
    config = {**_load(ROOT / "tests/data/hf/llama-3.1-8b.json"), **change}
    with pytest.raises(ConfigError) as err:
        hf_shape(config, source="c.json")
    assert err.value.field == f"c.json:{field}"


def test_a_moe_layer_pattern_the_shape_cannot_hold_is_refused():
    config = {**_load(ROOT / "tests/data/hf/qwen3-30b-a3b.json"), "mlp_only_layers": [3]}
    with pytest.raises(ConfigError, match="mlp_only_layers"):
        hf_shape(config)
    config["mlp_only_layers"] = [0, 1]
    assert hf_shape(config).dense_layers == 2


def test_only_seq_may_be_overridden(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match="job.size.layers"):
        build_model("hf:tests/data/hf/gpt2.json", {"layers": 2})


def test_cli_shows_the_mapping_and_refuses_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = CliRunner().invoke(main, ["workloads", "--hf", "configs/hf/deepseek-v2-lite.json"])
    assert out.exit_code == 0, out.output
    for text in ("layers", "kv heads", "experts (routed, top-k)", "64, top 6",
                 "15,706,484,224", "active params", "training GFLOP/token"):
        assert text in out.output
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "mamba"}))
    out = CliRunner().invoke(main, ["workloads", "--hf", str(tmp_path)])
    assert out.exit_code == 2
    assert out.output.strip().count("\n") == 0 and "model_type" in out.output


def test_the_example_config_plans_end_to_end_and_checks(tmp_path, monkeypatch):
    """From another directory: the config's hf: path is relative to the config's folder,
    and the plan records it absolute so that --check finds it from anywhere."""
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["plan", str(ROOT / "configs/qwen2.5-7b.toml"), "-o",
                                    "plan"])
    assert out.exit_code == 0, out.output
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert doc["job"]["model"] == f"hf:{ROOT / 'configs/hf/qwen2.5-7b.json'}"
    monkeypatch.chdir(ROOT / "docs")
    out = CliRunner().invoke(main, ["plan", "--check", str(tmp_path / "plan")])
    assert out.exit_code == 0, out.output


@pytest.mark.parametrize("model", ["hf:hf/missing.json", "torch:torch/missing.py:f"])
def test_a_config_path_that_is_not_there_is_one_line(tmp_path, monkeypatch, model):
    config = tmp_path / "c.toml"
    config.write_text(f'[cluster]\nservers = 4\nnics = 2\nlink_bandwidth = "100Gbps"\n'
                      f'[job]\nmodel = "{model}"\nbatch_per_gpu = 1\n')
    monkeypatch.chdir(ROOT)
    out = CliRunner().invoke(main, ["plan", str(config), "-o", str(tmp_path / "out")])
    assert out.exit_code == 2
    assert out.output.strip().count("\n") == 0
    assert "job.model" in out.output and str(tmp_path / model.split(":")[1]) in out.output
    assert not (tmp_path / "out").exists()


def _plan(config, out):
    result = CliRunner().invoke(main, ["plan", str(config), "-o", str(out), "--seed", "3",
                                       "--no-plots", "--no-report"])
    assert result.exit_code == 0, result.output
    return json.loads((out / "plan.json").read_text())


def test_an_imported_decoder_plans_as_its_source(tmp_path, monkeypatch):
    """import-model writes an hf: decoder as its shape (model = "transformer"), which the
    LLM planner plans as it does the source: plan.json is the same but for the config's
    path and the job's model and size, and every export is byte-equal (the report and
    plots, whose titles name the model, are left out)."""
    source = tmp_path / "source.toml"
    source.write_text('[cluster]\nservers = 4\nnics = 4\nlink_bandwidth = "400Gbps"\n'
                      'gpus_per_server = 8\ngpu = "H100"\n[job]\n'
                      f'model = "hf:{ROOT / "configs/hf/deepseek-v2-lite.json"}"\n'
                      'batch_per_gpu = 1\nprecision = "bf16"\nsize = {seq = 2048}\n')
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["import-model", str(source), "-o", "imported.toml"])
    assert out.exit_code == 0, out.output
    text = (tmp_path / "imported.toml").read_text()
    assert 'model = "transformer"' in text and "kv_lora_rank = 512" in text
    a, b = _plan(source, tmp_path / "a"), _plan(tmp_path / "imported.toml", tmp_path / "b")
    assert "llm" in a
    assert b["job"]["model"] == "transformer" and b["job"]["size"]["seq"] == 2048
    for doc in (a, b):
        doc.pop("config"), doc["job"].pop("model"), doc["job"].pop("size")
    assert a == b
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*")
                   if p.is_file() and p.name != "plan.json")
    assert files
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_a_transformer_model_takes_shape_fields_only():
    base = dict(layers=2, hidden=64, heads=4, kv_heads=4, ffn=128, seq=16, vocab=100)
    assert transformer_shape(build_model("transformer", base)) == TransformerShape(**base)
    with pytest.raises(ConfigError, match="job.size.tables"):
        build_model("transformer", {**base, "tables": 2})
    with pytest.raises(ConfigError, match="job.size.vocab"):
        build_model("transformer", {k: v for k, v in base.items() if k != "vocab"})
    with pytest.raises(ConfigError, match="job.size.kv_heads"):
        build_model("transformer", {**base, "kv_heads": 3})


def test_a_cluster_mix_reads_its_hf_path_beside_the_config(tmp_path, monkeypatch):
    """``[[mix]]`` entries of a shared-cluster config resolve ``hf:`` paths as ``plan``
    does: beside the config, from any directory; a missing one names its entry."""
    from topoopt.multijob.config import load_cluster_config
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "q.json").write_text((ROOT / "configs/hf/qwen2.5-7b.json").read_text())
    config = tmp_path / "c.toml"
    body = ('[cluster]\nservers = 32\nnics = 4\nlink_bandwidth = "100Gbps"\n'
            '[plan]\nstrategy = "dp"\n[[mix]]\nmodel = "dlrm"\nbatch_per_gpu = 64\ncount = 1\n'
            '[[mix]]\nmodel = "{}"\nbatch_per_gpu = 1\ncount = 1\n')
    config.write_text(body.format("hf:hf/q.json"))
    monkeypatch.chdir(ROOT / "docs")
    cfg = load_cluster_config(config)
    assert cfg.mix[1].job.model == f"hf:{tmp_path / 'hf' / 'q.json'}"
    config.write_text(body.format("hf:hf/missing.json"))
    with pytest.raises(ConfigError) as err:
        load_cluster_config(config)
    assert err.value.field == "mix[1].model"
