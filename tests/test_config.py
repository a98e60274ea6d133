from pathlib import Path

import pytest

from topoopt.config import load_config, parse_config
from topoopt.errors import ConfigError
from topoopt.workloads import model_of

ROOT = Path(__file__).resolve().parent.parent


def base():
    return {
        "cluster": {"servers": 16, "nics": 4, "link_bandwidth": "100Gbps",
                    "link_latency": "1us", "gpus_per_server": 4, "gpu": "A100"},
        "job": {"model": "dlrm", "batch_per_gpu": 128, "precision": "fp32",
                "size": {"tables": 4, "rows": 1000}},
    }


@pytest.mark.parametrize("name", ["dlrm-128", "bert-128", "dlrm-16", "bert-16"])
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / f"{name}.toml")
    assert cfg.cluster.nics == 4
    assert cfg.cluster.link_bandwidth == 100e9
    assert cfg.cluster.link_latency == 1e-6
    assert cfg.cluster.gpus_per_server == 4
    assert cfg.cluster.gpu.name == "A100"
    assert cfg.cluster.servers == (16 if name.endswith("-16") else 128)


def test_paper_settings_dlrm_128():
    cfg = load_config(ROOT / "configs" / "dlrm-128.toml")
    model = model_of(cfg.job)
    assert sum(op.kind == "embedding" for op in model.operators) == 64
    assert cfg.job.global_batch(cfg.cluster) == 128 * 4 * 128


def test_gpu_datasheet_figures():
    from topoopt.cluster import GPUS
    assert GPUS["A100"].fp16_flops == 312e12 and GPUS["H100"].fp16_flops == 989.4e12
    assert GPUS["A100"].memory == 81920 * 2**20 and GPUS["H100"].memory == 81559 * 2**20


@pytest.mark.parametrize("section, key, value, fragment", [
    ("cluster", "servers", 1, "cluster.servers"),
    ("cluster", "servers", 2.5, "cluster.servers"),
    ("cluster", "servers", "16", "cluster.servers"),
    ("cluster", "nics", 0, "cluster.nics"),
    ("cluster", "link_bandwidth", "0Gbps", "cluster.link_bandwidth"),
    ("cluster", "link_bandwidth", "100Gbsp", "cluster.link_bandwidth"),
    ("cluster", "link_bandwidth", -5, "cluster.link_bandwidth"),
    ("cluster", "link_latency", "-1us", "cluster.link_latency"),
    ("cluster", "gpus_per_server", 0, "cluster.gpus_per_server"),
    ("cluster", "gpu", "V100", "cluster.gpu"),
    ("cluster", "intra_server_bandwidth", "fast", "cluster.intra_server_bandwidth"),
    ("cluster", "compute_efficiency", 1.5, "cluster.compute_efficiency"),
    ("cluster", "memory_efficiency", 0, "cluster.memory_efficiency"),
    ("cluster", "nicss", 4, "cluster.nicss"),
    ("job", "model", "gpt5", "job.model"),
    ("job", "batch_per_gpu", 0, "job.batch_per_gpu"),
    ("job", "precision", "fp8", "job.precision"),
    ("job", "size", {"tabels": 4}, "job.size.tabels"),
    ("job", "size", {"tables": -4}, "job.size.tables"),
    ("job", "size", 5, "job.size"),
    ("job", "operators", [{"name": "x"}], "job.operators"),
    ("job", "batch", 4, "job.batch"),
])
def test_every_bad_field_is_named(section, key, value, fragment):
    doc = base()
    doc[section][key] = value
    with pytest.raises(ConfigError) as err:
        parse_config(doc)
    assert str(err.value).startswith(fragment)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("missing", ["servers", "nics", "link_bandwidth"])
def test_missing_cluster_field(missing):
    doc = base()
    del doc["cluster"][missing]
    with pytest.raises(ConfigError, match=f"cluster.{missing}"):
        parse_config(doc)


def test_missing_sections_and_unknown_sections():
    with pytest.raises(ConfigError, match="job"):
        parse_config({"cluster": base()["cluster"]})
    with pytest.raises(ConfigError, match="clustr"):
        parse_config({**base(), "clustr": {}})


def test_malformed_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster\nservers = ")
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.toml")


def test_bandwidth_in_bytes_and_numbers():
    doc = base()
    doc["cluster"]["link_bandwidth"] = "25GB/s"
    assert parse_config(doc).cluster.link_bandwidth == 200e9
    doc["cluster"]["link_bandwidth"] = 1e11
    assert parse_config(doc).cluster.link_bandwidth == 1e11
