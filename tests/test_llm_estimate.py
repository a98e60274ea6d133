"""The LLM iteration on the kernel model and ``topoopt estimate``: invariants, not fits."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.config import load_config, parse_config
from topoopt.errors import ConfigError
from topoopt.llm import (
    SC21,
    CommTimes,
    LLMParallel,
    Overlap,
    layer_times,
    llm_iteration,
    llm_traffic,
)
from topoopt.planners.llm import time_on_fabric
from topoopt.workloads import build_model
from topoopt.workloads.gpt import transformer_shape

SHAPE = transformer_shape(build_model("gpt3-175b"))
CLUSTER = Cluster(servers=16, nics=8, link_bandwidth=200e9, gpus_per_server=8,
                  gpu=GPUS["A100"], intra_server_bandwidth=GPUS["A100"].nvlink_bandwidth)
SLOW = CommTimes(pp_step=0.05, pp_step_back=0.05, ep_step=0.0, dp=3.0)


def _it(par, overlap, comm=SLOW, batch=64):
    t = llm_traffic(SHAPE, par, CLUSTER.servers, 8, batch, 2)
    return llm_iteration(SHAPE, par, CLUSTER, batch, "bf16", t, comm, overlap)


@pytest.mark.parametrize("zero1", [False, True])
def test_more_overlap_is_never_slower(zero1):
    par = LLMParallel(8, 4, 4, micro_batches=8, zero1=zero1, recompute="full")
    n = len(dataclasses.fields(Overlap))   # the overlaps and the fused accumulation
    flags = list(itertools.product([False, True], repeat=n))
    times = {f: _it(par, Overlap(*f)).total for f in flags}
    for f in flags:
        for i in range(n):
            if not f[i]:
                more = f[:i] + (True,) + f[i + 1:]
                assert times[more] <= times[f] + 1e-12, (f, more)
    assert times[(True,) * n] < times[(False,) * n]   # not vacuous: SLOW's DP hides


def test_the_bubble_is_p_minus_1_over_v_micro_batches():
    for pp, v, m in [(4, 1, 8), (4, 2, 8), (8, 3, 16), (2, 4, 4)]:
        par = LLMParallel(8, pp, 16 // pp, micro_batches=m, virtual=v)
        it = _it(par, SC21, batch=16 // pp * m)
        assert it.bubble == pytest.approx((pp - 1) / v * it.micro_batch)
        assert it.total == pytest.approx(m * it.micro_batch + it.bubble + it.dp + it.optimizer)
        assert sum(it.parts().values()) == pytest.approx(it.total)


def test_recomputation_adds_a_forward_and_selective_only_unfused_attention():
    tokens = 2048
    base = layer_times(SHAPE, LLMParallel(8, 1, 1), GPUS["A100"], "bf16", tokens)
    full = layer_times(SHAPE, LLMParallel(8, 1, 1, recompute="full"), GPUS["A100"], "bf16",
                       tokens)
    assert base.recompute == 0 and full.recompute == pytest.approx(base.forward)
    flash = LLMParallel(8, 1, 1, recompute="selective")
    assert layer_times(SHAPE, flash, GPUS["A100"], "bf16", tokens).recompute == 0
    unfused = LLMParallel(8, 1, 1, recompute="selective", attention="unfused")
    sel = layer_times(SHAPE, unfused, GPUS["A100"], "bf16", tokens)
    assert 0 < sel.recompute < sel.forward


def test_more_tokens_per_kernel_never_lower_throughput():
    """Per token, a longer micro-batch is never slower (larger GEMMs, same launches)."""
    par = LLMParallel(8, 1, 1)
    per_token = [layer_times(SHAPE, par, GPUS["H100"], "bf16", n).total / n
                 for n in (128, 512, 2048, 8192)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(per_token, per_token[1:]))


CONFIG = """
[cluster]
servers = 16
nics = 8
link_bandwidth = "200Gbps"
gpus_per_server = 8
gpu = "A100"

[job]
model = "gpt3-175b"
batch_per_gpu = 1
precision = "bf16"
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "gpt.toml"
    path.write_text(CONFIG)
    return path


def test_estimate_gives_the_planners_time(config, tmp_path):
    out = tmp_path / "e.json"
    res = CliRunner().invoke(main, ["estimate", str(config), "--parallel",
                                    "tp=8,pp=8,dp=2,mbs=1,recompute=full", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    par = LLMParallel(8, 8, 2, micro_batches=64, recompute="full")
    job = Job("gpt3-175b", batch_per_gpu=1, precision="bf16")
    it, _, _ = time_on_fabric(SHAPE, par, CLUSTER, job)
    assert doc["iteration_s"] == pytest.approx(it.total, rel=1e-12)
    assert sum(doc["parts_s"].values()) == pytest.approx(doc["iteration_s"])
    mem = doc["memory_bytes"]
    assert mem["total"] == pytest.approx(sum(mem[k] for k in ("weights", "gradients",
                                                             "optimizer", "activations")))
    assert doc["megatron_tflops_per_gpu"] > doc["model_tflops_per_gpu"]   # full recompute


@pytest.mark.parametrize("layout,field", [("tp=16,pp=4,dp=2", "--parallel tp"),
                                          ("tp=8,pp=4,dp=2", "--parallel dp"),
                                          ("tp=8,pp=8,dp=2,ep=2", "--parallel ep"),
                                          ("tp=1,pp=128,dp=1", "--parallel pp"),
                                          ("tp=8,pp=8,dp=2,v=5", "--parallel v"),
                                          ("tp=8,pp=8,dp=2,mbs=3", "--parallel mbs"),
                                          ("tp=8,pp=8,dp=2,cp=2", "--parallel dp"),
                                          ("tp=8,pp=8", "--parallel")])
def test_estimate_refuses_bad_layouts_in_one_line(config, layout, field):
    res = CliRunner().invoke(main, ["estimate", str(config), "--parallel", layout])
    assert res.exit_code == 2
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), res.output


def test_a_global_batch_in_sequences_with_gradient_accumulation(tmp_path):
    """GPT-3's 1536 sequences on 1,024 GPUs (1.5 per GPU): the micro-batch count is
    derived from the layout; a pair that disagrees is refused in one line."""
    path = tmp_path / "gpt3.toml"
    text = CONFIG.replace("servers = 16", "servers = 128").replace(
        "batch_per_gpu = 1", "global_batch = 1536")
    path.write_text(text)
    cfg = load_config(path)
    assert cfg.job.global_batch(cfg.cluster) == 1536
    out = tmp_path / "e.json"
    res = CliRunner().invoke(main, ["estimate", str(path), "--parallel",
                                    "tp=8,pp=16,dp=8,mbs=1,recompute=full", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["parallel"]["micro_batches"] == 1536 // 8
    path.write_text(text.replace("global_batch = 1536", "global_batch = 1536\nbatch_per_gpu = 2"))
    res = CliRunner().invoke(main, ["estimate", str(path), "--parallel", "tp=8,pp=16,dp=8"])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1
    assert lines[0].startswith("error: job.global_batch = 1536")


def test_a_data_parallel_job_takes_a_global_batch_of_whole_samples_per_gpu():
    doc = {"cluster": {"servers": 4, "nics": 4, "link_bandwidth": "100Gbps",
                       "gpus_per_server": 8},
           "job": {"model": "dlrm", "global_batch": 4 * 8 * 16}}
    job = parse_config(doc).job
    assert job.batch_per_gpu == 16
    doc["job"]["global_batch"] = 100
    with pytest.raises(ConfigError, match="job.global_batch"):
        parse_config(doc)
    with pytest.raises(ConfigError, match="job.batch_per_gpu"):
        parse_config({**doc, "job": {"model": "dlrm"}})


def test_fp8_on_h100_is_faster_and_refused_where_there_are_no_fp8_tensor_cores(tmp_path):
    h100 = CONFIG.replace('gpu = "A100"', 'gpu = "H100"')
    times = {}
    for precision in ("bf16", "fp8"):
        path = tmp_path / f"{precision}.toml"
        path.write_text(h100.replace('precision = "bf16"', f'precision = "{precision}"'))
        out = tmp_path / f"{precision}.json"
        res = CliRunner().invoke(main, ["estimate", str(path), "--parallel",
                                        "tp=8,pp=8,dp=2", "--json", str(out)])
        assert res.exit_code == 0, res.output
        times[precision] = json.loads(out.read_text())["iteration_s"]
    # FP8 GEMMs at 0.55 of twice the 16-bit peak: faster, by less than the 2x peak
    assert times["bf16"] / 2 < times["fp8"] < times["bf16"]
    path = tmp_path / "a100.toml"
    path.write_text(CONFIG.replace('precision = "bf16"', 'precision = "fp8"'))
    res = CliRunner().invoke(main, ["estimate", str(path), "--parallel", "tp=8,pp=8,dp=2"])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1
    assert lines[0].startswith("error: job.precision = 'fp8': A100 has no FP8")
