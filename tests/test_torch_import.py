"""PyTorch modules traced on the meta device into operator graphs: the built-in models
rebuilt from torchvision, a plain-torch DLRM and Hugging Face's BERT (parameters exactly,
FLOPs within 1%), and a module that does not trace refused in one line.

The DLRM and BERT traces take a few seconds each (torch.export); torchvision's skip
where torchvision is not installed (the `import` extra installs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from topoopt.errors import ConfigError  # noqa: E402
from topoopt.workloads import build_model  # noqa: E402
from topoopt.workloads.torch_trace import torch_model, trace_module  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = "tests/data/torch/models.py"
DLRM = "configs/torch/dlrm_small.py"


def _same(traced, builtin):
    assert traced.params == builtin.params
    assert traced.fwd_flops == pytest.approx(builtin.fwd_flops, rel=0.01)
    assert traced.bwd_flops == pytest.approx(builtin.bwd_flops, rel=0.01)
    assert traced.size["unclassified"] == ""


@pytest.mark.parametrize("name", ["resnet50", "vgg16"])
def test_torchvision_equals_the_builtin(name):
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    with torch.device("meta"):
        module = getattr(torchvision.models, name)()
    traced = trace_module(module, (torch.zeros(2, 3, 224, 224),), name)
    builtin = build_model(name)
    _same(traced, builtin)
    assert {op.kind for op in traced} == {op.kind for op in builtin}


def test_plain_torch_dlrm_equals_the_builtin(monkeypatch):
    """The example config's module (configs/torch/dlrm_small.py) at its sizes."""
    monkeypatch.chdir(ROOT)
    traced = torch_model(f"{DLRM}:dlrm")
    builtin = build_model("dlrm", dict(tables=8, rows=1_000_000, dim=64, bag=32,
                                       bottom_layers=3, bottom_width=512, top_layers=4,
                                       top_width=1024))
    _same(traced, builtin)
    embeddings = [op for op in traced if op.kind == "embedding"]
    assert [op.mem_elems for op in embeddings] == [32 * 64] * 8
    assert sum(op.kind == "interaction" for op in traced) == 1


def test_huggingface_bert_equals_the_builtin(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)
    traced = torch_model(f"{MODELS}:bert_base")
    _same(traced, build_model("bert"))
    assert sum(op.kind == "attention" for op in traced) == 12


def test_a_module_that_does_not_trace_is_one_line(monkeypatch, capfd):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match="does not trace: GuardOnDataDependentSymNode") as err:
        torch_model(f"{MODELS}:data_dependent")
    assert "\n" not in str(err.value)
    assert "data_dependent" in str(err.value)


@pytest.mark.parametrize("source, message", [
    ("no_colon", "write torch:package.module:factory"),
    ("tests/data/torch/missing.py:f", "cannot import"),
    (f"{MODELS}:nothing", "has no callable 'nothing'"),
    (f"{DLRM}:DLRM", "the factory failed"),
])
def test_bad_sources_name_the_model(source, message, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match=message) as err:
        torch_model(source)
    assert err.value.field == "job.model"


def test_size_overrides_are_refused(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match="job.size"):
        build_model(f"torch:{DLRM}:dlrm", {"tables": 2})


def test_import_model_writes_the_same_operators(tmp_path, monkeypatch):
    """The written config reads back as the same operator graph, cluster and job (the
    plan is a function of these: `plan` on both gave identical plan.json files but for
    the config's path and job.model, measured on configs/torch-dlrm.toml). Run from
    another directory: the config's torch: path is relative to the config."""
    from click.testing import CliRunner

    from topoopt.cli import main
    from topoopt.config import load_config
    monkeypatch.chdir(tmp_path)
    config = ROOT / "configs/torch-dlrm.toml"
    out_path = tmp_path / "model.toml"
    out = CliRunner().invoke(main, ["import-model", str(config), "-o", str(out_path)])
    assert out.exit_code == 0, out.output
    source, written = load_config(config), load_config(out_path)
    assert written.cluster == source.cluster
    assert written.job.model == "custom"
    assert written.model.operators == source.model.operators
    gpt2 = f"hf:{ROOT / 'tests/data/hf/gpt2.json'}"
    out = CliRunner().invoke(main, ["import-model", gpt2, "-o", "gpt2.toml", "--operators"])
    assert out.exit_code == 0, out.output
    assert "[[job.operators]]" in (tmp_path / "gpt2.toml").read_text()
