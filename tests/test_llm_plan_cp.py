"""The LLM planner's search over context parallelism for long sequences."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.llm import check_parallel
from topoopt.planners.llm import CP_MIN_SEQ, enumerate_parallel, rank_parallel
from topoopt.workloads import build_model
from topoopt.workloads.gpt import transformer_shape

LLAMA8B = transformer_shape(build_model("llama3-8b"))
CLUSTER = Cluster(servers=2, nics=8, link_bandwidth=400e9, gpus_per_server=8,
                  gpu=GPUS["H100"], intra_server_bandwidth=GPUS["H100"].nvlink_bandwidth)


def test_cp_is_searched_only_for_long_sequences():
    short = enumerate_parallel(replace(LLAMA8B, seq=CP_MIN_SEQ // 2), CLUSTER, 16)
    assert short and all(p.cp == 1 for p in short)
    long = replace(LLAMA8B, seq=CP_MIN_SEQ * 2)
    space = enumerate_parallel(long, CLUSTER, 16)
    assert {p.cp for p in space} == {1, 2, 4, 8, 16}
    for p in space:     # every one a valid layout of all 16 GPUs
        check_parallel(p, long, CLUSTER, 16)


def test_a_long_sequence_job_picks_cp_when_faster_and_estimate_agrees(tmp_path):
    seq = 2 * CP_MIN_SEQ
    job = Job("llama3-8b", 0, precision="bf16", global_batch_size=16, size={"seq": seq})
    ranked, _ = rank_parallel(replace(LLAMA8B, seq=seq), CLUSTER, job)
    best = ranked[0]
    without = min((c for c in ranked if c.parallel.cp == 1), key=lambda c: c.ideal.total)
    # the search is exhaustive: it keeps cp > 1 exactly when that is faster
    assert best.ideal.total <= without.ideal.total
    assert best.parallel.cp > 1 and best.ideal.total < without.ideal.total
    # `topoopt estimate` of the chosen layout gives the planner's time
    p = best.parallel
    cfg = tmp_path / "llama.toml"
    cfg.write_text('[cluster]\nservers = 2\nnics = 8\nlink_bandwidth = "400Gbps"\n'
                   'gpus_per_server = 8\ngpu = "H100"\n\n[job]\nmodel = "llama3-8b"\n'
                   f'global_batch = 16\nprecision = "bf16"\nsize = {{ seq = {seq} }}\n')
    layout = (f"tp={p.tp},cp={p.cp},pp={p.pp},dp={p.dp},mbs={16 // p.dp // p.micro_batches},"
              f"v={p.virtual},recompute={p.recompute},zero1={int(p.zero1)}")
    out = tmp_path / "e.json"
    res = CliRunner().invoke(main, ["estimate", str(cfg), "--parallel", layout,
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["parallel"]["cp"] == p.cp
    assert doc["iteration_s"] == pytest.approx(best.ideal.total, rel=1e-12)
