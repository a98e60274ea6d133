"""``topoopt topology``: runs on a shipped config, draws, and refuses bad options in one line."""

from pathlib import Path

from click.testing import CliRunner

from topoopt.cli import main

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "dlrm-16.toml")


def test_topology_command_prints_metrics_and_draws(tmp_path):
    png = tmp_path / "topo.png"
    result = CliRunner().invoke(main, ["topology", CONFIG, "--k", "2",
                                       "--png", str(png)])
    assert result.exit_code == 0, result.output
    assert "TopoOpt" in result.output and "bandwidth tax" in result.output
    assert "degree    AllReduce" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_topology_command_refuses_bad_k():
    result = CliRunner().invoke(main, ["topology", CONFIG, "--k", "0"])
    assert result.exit_code == 2
    assert "--k" in result.output and "Traceback" not in result.output
