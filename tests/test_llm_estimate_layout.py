"""``topoopt estimate --parallel``: every field of a layout, checked in one place; the
same time as ``topoopt plan`` and as the library on a published row."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_llm_estimate import CONFIG  # the 16-server GPT-3 job estimate's tests use

from topoopt.cli import main
from topoopt.commands.estimate import parse_layout

ROOT = Path(__file__).resolve().parents[1]



@pytest.fixture
def config(tmp_path):
    path = tmp_path / "gpt.toml"
    path.write_text(CONFIG)
    return path


def _estimate(path, layout, *extra):
    out = path.parent / "e.json"
    res = CliRunner().invoke(main, ["estimate", str(path), "--parallel", layout,
                                    "--json", str(out), *extra])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def _one_line_error(path, layout):
    res = CliRunner().invoke(main, ["estimate", str(path), "--parallel", layout])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    return lines[0]


def test_every_memory_switch_reaches_the_library(config):
    base = _estimate(config, "tp=8,pp=8,dp=2,zero1=1")
    assert base["parallel"].get("shard_grads") is None
    doc = _estimate(config, "tp=8,pp=8,dp=2,mbs=64,zero1=1,shard_grads=1,edge=1,"
                            "rc_norms=1,rc_act=1,order=tp-pp-dp")
    par = doc["parallel"]
    assert par["micro_batches"] == 1 and par["edge_layers"] == 1 and par["shard_grads"]
    assert par["recompute_norms"] and par["recompute_act"] and par["order"] == "tp-pp-dp"
    one = _estimate(config, "tp=8,pp=8,dp=2,mbs=64,zero1=1")
    mem, mem1 = doc["memory_bytes"], one["memory_bytes"]
    # one micro-batch: the gradients are sharded over the dp ranks once reduced
    assert mem["gradients"] < mem1["gradients"]
    # the recomputed outputs are not kept
    assert mem["activations"] < mem1["activations"]


def test_gradient_bytes_change_the_memory_not_the_time(config):
    default = _estimate(config, "tp=8,pp=8,dp=2")
    fp32 = _estimate(config, "tp=8,pp=8,dp=2,grad_bytes=4")
    assert fp32["iteration_s"] == default["iteration_s"]
    assert fp32["memory_bytes"]["gradients"] == pytest.approx(
        2 * default["memory_bytes"]["gradients"])


@pytest.mark.parametrize("layout,field", [
    ("tp=8,pp=8,dp=2,shard_grads=2", "--parallel shard_grads = '2': must be 0 (off) or 1"),
    ("tp=8,pp=8,dp=2,rc_act=yes", "--parallel rc_act = 'yes'"),
    ("tp=8,pp=8,dp=2,rc_norms=-1", "--parallel rc_norms"),
    ("tp=8,pp=8,dp=2,zero1=3", "--parallel zero1"),
    ("tp=8,pp=8,dp=2,edge=-1", "--parallel edge = '-1'"),
    ("tp=8,pp=8,dp=2,edge=20", "--parallel edge = 20"),
    ("tp=8,pp=8,dp=2,grad_bytes=3", "--parallel grad_bytes = '3': use one of 2|4"),
    ("tp=8,pp=8,dp=2,order=pp-tp", "--parallel order"),
    ("tp=8,pp=8,dp=2,recompute=some", "--parallel recompute"),
    ("tp=8,pp=8,dp=2,tp=4", "--parallel tp = '4': is given twice"),
    ("tp=8,pp=8,dp=2,v=5,edge=1", "--parallel v = 5"),
    ("tp=8,pp=8,dp=2,shards=1", "--parallel = 'shards=1'"),
])
def test_a_bad_field_is_one_line_naming_it(config, layout, field):
    assert _one_line_error(config, layout).startswith(f"error: {field}")


def test_edge_layers_make_room_for_an_interleaved_split():
    """Llama 3's 126 layers on 16 stages of 4 chunks: pp x v divides 126 + 2 x edge."""
    assert parse_layout("tp=8,pp=16,dp=4,v=4,edge=1")["edge"] == 1


LONG = """[cluster]
servers = 2
nics = 8
link_bandwidth = "400Gbps"
gpus_per_server = 8
gpu = "H100"

[job]
model = "llama3-8b"
global_batch = 16
precision = "bf16"
size = { seq = 65536, layers = 8 }
"""


def test_plan_and_estimate_give_the_same_time(tmp_path):
    """Each fixed fabric's layout in a plan, given to ``estimate`` on that fabric:
    the plan's time (a long-sequence job, so the layouts use cp)."""
    cfg = tmp_path / "long.toml"
    cfg.write_text(LONG)
    res = CliRunner().invoke(main, ["plan", str(cfg), "-o", str(tmp_path / "plan"),
                                    "--quiet", "--no-plots"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    seen_cp = False
    for name in ("ideal", "fattree"):
        p = doc["llm"]["fabrics"][name]["parallel"]
        seen_cp |= p.get("cp", 1) > 1
        mbs = 16 // p["dp"] // p["micro_batches"]
        layout = (f"tp={p['tp']},cp={p.get('cp', 1)},pp={p['pp']},dp={p['dp']},mbs={mbs},"
                  f"v={p['virtual']},recompute={p['recompute']},zero1={int(p['zero1'])},"
                  f"order={p['order']}")
        got = _estimate(cfg, layout, "--fabric", name)
        assert got["iteration_s"] == pytest.approx(doc["iteration_time_s"][name], rel=1e-12)
    assert seen_cp


def _benchmark():
    spec = importlib.util.spec_from_file_location("llm_accuracy",
                                                  ROOT / "benchmarks" / "llm_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_published_llama3_row_through_the_cli_is_the_librarys(tmp_path):
    bench = _benchmark()
    row = next(r for r in bench.rows() if r[-1] == "mfu")   # 8,192 H100, tp8 pp16 dp64
    label, params, shape, par, gpu, nic, batch, overlap, published, metric = row
    toml, args = bench.estimate_command(row)
    cfg = tmp_path / "llama.toml"
    cfg.write_text(toml)
    doc = _estimate(cfg, args[1])
    it, mem = bench.estimate(shape, par, gpu, nic, batch, overlap)
    assert doc["parallel"] == par.to_dict()
    assert doc["iteration_s"] == pytest.approx(it.total, rel=1e-12)
    assert doc["mfu"] == pytest.approx(it.mfu, rel=1e-12)
    assert doc["memory_bytes"]["total"] == pytest.approx(mem.total, rel=1e-12)
    assert doc["fits"] == mem.fits
