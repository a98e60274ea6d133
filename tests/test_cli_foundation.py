"""The foundation commands: workloads, traffic, and the one-line error contract."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from topoopt.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_help_lists_commands():
    result = run("--help")
    assert result.exit_code == 0
    assert "workloads" in result.output and "traffic" in result.output


def test_workloads_table():
    result = run("workloads")
    assert result.exit_code == 0
    for name in ["dlrm", "bert", "candle", "ncf", "resnet50", "vgg16"]:
        assert name in result.output
    assert "25.6M" in result.output  # ResNet50 25,557,032 params


def test_traffic_prints_volumes_and_is_deterministic():
    cfg = str(ROOT / "configs" / "dlrm-16.toml")
    first = run("traffic", cfg)
    assert first.exit_code == 0
    assert "AllReduce 1 group(s)" in first.output
    assert "MP" in first.output and "480 transfers" in first.output  # 16 tables x 15 x 2
    assert run("traffic", cfg).output == first.output
    dp = run("traffic", cfg, "--strategy", "dp")
    assert "0 transfers" in dp.output


def test_traffic_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    result = run("traffic", str(ROOT / "configs" / "dlrm-16.toml"), "--png", str(out))
    assert result.exit_code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.png"]  # no temp files left


@pytest.mark.parametrize("body, field", [
    ("[cluster]\nservers = 1\nnics = 4\nlink_bandwidth = '100Gbps'\n"
     "[job]\nmodel = 'dlrm'\nbatch_per_gpu = 1\n", "cluster.servers"),
    ("[cluster]\nservers = 8\nnics = 0\nlink_bandwidth = '100Gbps'\n"
     "[job]\nmodel = 'dlrm'\nbatch_per_gpu = 1\n", "cluster.nics"),
    ("[cluster]\nservers = 8\nnics = 4\nlink_bandwidth = '-3Gbps'\n"
     "[job]\nmodel = 'dlrm'\nbatch_per_gpu = 1\n", "cluster.link_bandwidth"),
    ("[cluster]\nservers = 8\nnics = 4\nlink_bandwidth = '100Gbps'\n"
     "[job]\nmodel = 'alexnet'\nbatch_per_gpu = 1\n", "job.model"),
    ("[cluster\n", "config"),
])
def test_bad_config_is_one_line_exit_2(tmp_path, body, field):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    png = tmp_path / "out.png"
    result = CliRunner().invoke(main, ["traffic", str(path), "--png", str(png)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}")
    assert "Traceback" not in result.output
    assert not png.exists()


def test_missing_config_file():
    result = CliRunner().invoke(main, ["traffic", "no/such.toml"])
    assert result.exit_code == 2 and "file not found" in result.output
