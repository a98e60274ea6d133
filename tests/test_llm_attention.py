"""The attention kernel is a property of the run: each kernel at its own published rate.

Invariants, not the published rates themselves: FlashAttention-3 never slower than -2
where both exist, ``auto`` the newest kernel of the GPU, an unknown or unpublished
kernel refused naming ``job.attention``, the kernel a run names is the one that times
its attention, and ``plan`` and ``estimate`` agree on it.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.cluster import ATTENTION, GPUS, Cluster, GpuSpec, Job
from topoopt.compute import compute_times
from topoopt.config import parse_config
from topoopt.errors import ConfigError, PlanCheckError
from topoopt.kernels import (
    KERNEL_PROFILES,
    attention_kernel,
    attention_time,
    flash_attention_times,
)
from topoopt.llm import (
    LLMParallel,
    check_parallel,
    ideal_comm_times,
    layer_times,
    llm_iteration,
    llm_traffic,
)
from topoopt.planners.llm import plan_llm, rank_parallel
from topoopt.plans.llm import check_llm_plan_document, llm_plan_to_json
from topoopt.strategy import data_parallel
from topoopt.workloads import build_model
from topoopt.workloads.gpt import transformer_shape

H100, A100 = GPUS["H100"], GPUS["A100"]
LLAMA8B = transformer_shape(build_model("llama3-8b"))


def _cluster(gpu: GpuSpec, servers: int = 2) -> Cluster:
    return Cluster(servers=servers, nics=8, link_bandwidth=400e9, gpus_per_server=8,
                   gpu=gpu, intra_server_bandwidth=gpu.nvlink_bandwidth)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "fp8"])
def test_flash3_is_never_slower_than_flash2_on_h100(precision):
    for flops in (0.0, 1.0, 1e6, 1e9, 1e12, 1e15):
        f2 = attention_time(flops, H100, precision, kernel="flash2")
        f3 = attention_time(flops, H100, precision, kernel="flash3")
        assert f3 <= f2
        if flops >= 1e9:
            assert f3 < f2
    fraction = KERNEL_PROFILES["H100"].attention_peak_fraction
    assert 0 < fraction["flash2"] < fraction["flash3"] < 1


def test_auto_is_the_newest_kernel_published_for_the_gpu():
    assert attention_kernel(H100) == attention_kernel(H100, "auto") == "flash3"
    assert attention_kernel(A100, "auto") == "flash2"
    for gpu in (H100, A100):
        newest = list(KERNEL_PROFILES[gpu.name].attention_peak_fraction)[-1]
        assert attention_time(1e12, gpu, "bf16") == attention_time(1e12, gpu, "bf16",
                                                                    kernel=newest)
        assert attention_kernel(gpu, "unfused") == "unfused"
    # an unknown GPU takes A100's profile, whose only fused kernel is FlashAttention-2
    other = replace(A100, name="X100")
    assert attention_kernel(other) == "flash2"


def test_an_unknown_or_unpublished_kernel_is_refused_naming_the_field():
    for make in (lambda: Job("gpt3-175b", 1, attention="flash4"),
                 lambda: LLMParallel(8, 1, 2, attention="flash4"),
                 lambda: attention_kernel(H100, "flash4"),
                 lambda: attention_kernel(A100, "flash3"),   # Hopper only
                 lambda: attention_time(1e12, H100, "bf16", kernel="unfused"),
                 lambda: check_parallel(LLMParallel(8, 1, 2, attention="flash3"), LLAMA8B,
                                        _cluster(A100), 16)):
        with pytest.raises(ConfigError) as exc:
            make()
        assert exc.value.field == "job.attention"
    doc = {"cluster": {"servers": 2, "nics": 8, "link_bandwidth": "400Gbps",
                       "gpus_per_server": 8, "gpu": "A100"},
           "job": {"model": "bert", "batch_per_gpu": 8, "attention": "flash3"}}
    with pytest.raises(ConfigError, match="job.attention"):
        parse_config(doc)
    for name in ATTENTION:
        if name != "flash3":
            assert parse_config({**doc, "job": {**doc["job"], "attention": name}})


CONFIG = """[cluster]
servers = 2
nics = 8
link_bandwidth = "400Gbps"
gpus_per_server = 8
gpu = "{gpu}"

[job]
model = "llama3-8b"
global_batch = 16
precision = "bf16"
{attention}
"""


@pytest.mark.parametrize("gpu,attention,extra", [
    ("H100", 'attention = "flash4"', []), ("A100", 'attention = "flash3"', []),
    ("A100", "", ["--attention", "flash3"]), ("H100", "", ["--attention", "fa3"])])
def test_the_cli_refuses_a_bad_kernel_in_one_line(tmp_path, gpu, attention, extra):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(gpu=gpu, attention=attention))
    res = CliRunner().invoke(main, ["estimate", str(path), "--parallel", "tp=8,pp=1,dp=2",
                                    *extra])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: job.attention")


def test_the_kernel_a_run_names_times_its_attention():
    """Only the attention kernels change with the kernel named; the fused ones take
    exactly ``flash_attention_times`` of that kernel, FlashAttention-3 the least."""
    par = LLMParallel(8, 1, 2)
    core = 2.0 * LLAMA8B.seq * LLAMA8B.hidden * LLAMA8B.seq / 8   # causal half, / tp
    lts = {}
    for name in ATTENTION:
        lts[name] = layer_times(LLAMA8B, replace(par, attention=name), H100, "bf16",
                                LLAMA8B.seq)
    for name in ("flash2", "flash3"):
        assert lts[name].attention == pytest.approx(
            sum(flash_attention_times(core, H100, "bf16", name)))
    assert lts["auto"] == lts["flash3"]
    assert lts["flash3"].attention < lts["flash2"].attention
    assert lts["flash3"].gemm == lts["flash2"].gemm
    # the whole iteration follows
    cluster, batch = _cluster(H100), 16
    totals = {}
    for name in ("flash2", "flash3"):
        p = LLMParallel(8, 1, 2, micro_batches=8, attention=name)
        t = llm_traffic(LLAMA8B, p, 2, 8, batch, 2)
        totals[name] = llm_iteration(LLAMA8B, p, cluster, batch, "bf16", t,
                                     ideal_comm_times(t, cluster)).total
    assert totals["flash3"] < totals["flash2"]


def test_estimate_and_plan_agree_on_the_kernel_the_job_names(tmp_path):
    job = Job("llama3-8b", 0, precision="bf16", global_batch_size=16, attention="flash2")
    ranked, _ = rank_parallel(LLAMA8B, _cluster(H100), job)
    assert all(c.parallel.attention == "flash2" for c in ranked)
    best = ranked[0].parallel
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(gpu="H100", attention='attention = "flash2"'))
    layout = (f"tp={best.tp},pp={best.pp},dp={best.dp},"
              f"mbs={16 // best.dp // best.micro_batches},v={best.virtual},"
              f"recompute={best.recompute},zero1={int(best.zero1)}")
    times = {}
    for name, extra in (("config", []), ("flash3", ["--attention", "flash3"])):
        out = tmp_path / f"{name}.json"
        res = CliRunner().invoke(main, ["estimate", str(path), "--parallel", layout,
                                        "--json", str(out), *extra])
        assert res.exit_code == 0, res.output
        doc = json.loads(out.read_text())
        times[name] = doc["iteration_s"]
        assert doc["attention"] == ("flash2" if name == "config" else "flash3")
    assert times["config"] == pytest.approx(ranked[0].ideal.total, rel=1e-12)
    assert times["flash3"] < times["config"]


def test_a_plan_document_keeps_the_kernel():
    for name in ATTENTION:
        par = LLMParallel(8, 2, 2, micro_batches=4, attention=name)
        d = par.to_dict()
        assert LLMParallel.from_dict(d) == par
        assert d["flash_attention"] == (name != "unfused")
        assert ("attention" in d) == (name != "auto")   # older documents unchanged
    old = LLMParallel(8, 2, 2).to_dict()
    assert LLMParallel.from_dict({**old, "flash_attention": False}).attention == "unfused"
    with pytest.raises(ConfigError, match="flash_attention"):
        LLMParallel.from_dict({**old, "flash_attention": False, "attention": "flash2"})


def test_bert_takes_the_jobs_kernel_and_the_newest_by_default():
    model = build_model("bert")
    for gpu, newest in ((H100, "flash3"), (A100, "flash2")):
        cluster = Cluster(servers=4, nics=4, link_bandwidth=100e9, gpus_per_server=8,
                          gpu=gpu)
        strat = data_parallel(model, cluster.servers)
        times = {name: compute_times(model, strat, cluster,
                                     Job("bert", 8, precision="bf16", attention=name))
                 for name in ATTENTION if name == "auto" or _published(gpu, name)}
        np.testing.assert_array_equal(times["auto"], times[newest])
        assert not np.array_equal(times["unfused"], times[newest])   # it reaches the op
        if gpu is H100:
            assert (times["flash3"] <= times["flash2"]).all()
            assert times["flash3"].sum() < times["flash2"].sum()


def _published(gpu: GpuSpec, name: str) -> bool:
    try:
        attention_kernel(gpu, name)
    except ConfigError:
        return False
    return True


def test_an_llm_plan_records_the_kernel_and_its_check_holds_it():
    small = Cluster(servers=4, nics=4, link_bandwidth=100e9, gpus_per_server=4, gpu=H100,
                    intra_server_bandwidth=H100.nvlink_bandwidth)
    job = Job("llama3-8b", 2, "bf16", size={"layers": 4, "seq": 512}, attention="flash2")
    doc = llm_plan_to_json(plan_llm(small, job, baselines=("ideal",)))
    assert doc["job"]["attention"] == "flash2"
    assert all(f["parallel"]["attention"] == "flash2" for f in doc["llm"]["fabrics"].values())
    check_llm_plan_document(doc)
    for name in ("flash3", None):   # a job that names another kernel, or none
        bad = json.loads(json.dumps(doc))
        if name is None:
            del bad["job"]["attention"]
        else:
            bad["job"]["attention"] = name
        with pytest.raises(PlanCheckError, match="attention"):
            check_llm_plan_document(bad)
