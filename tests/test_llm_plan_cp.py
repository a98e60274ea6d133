"""The LLM planner's search over context parallelism for long sequences, and the check
of a plan that uses it."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest
from click.testing import CliRunner
from test_plan_interface import refusal_of_tampered

from topoopt.cli import main
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.errors import PlanCheckError
from topoopt.export.bundle import ExportSkipped
from topoopt.export.plan_dir import check_plan_dir, write_plan
from topoopt.llm import LLMParallel, check_parallel, llm_traffic
from topoopt.planners.llm import CP_MIN_SEQ, enumerate_parallel, plan_llm, rank_parallel
from topoopt.plans.llm import check_llm_plan_document, launch_preserves_traffic, llm_plan_to_json
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


CROSS = Job("llama3-8b", 0, precision="bf16", global_batch_size=16,
            size={"seq": 65536, "layers": 8})


@pytest.fixture(scope="module")
def cp_plan():
    """tp 8 x cp 2 on two servers: each context-parallel ring crosses them."""
    return plan_llm(CLUSTER, CROSS, fixed={"tp": 8, "cp": 2})


def test_a_cp_plan_passes_its_check_and_states_its_cp_groups(cp_plan):
    doc = llm_plan_to_json(cp_plan)
    check_llm_plan_document(doc)
    llm = doc["llm"]
    assert llm["parallel"]["cp"] == 2 and llm["placement"]["cp_groups"] == [[0, 1]]
    top = llm["fabrics"]["topoopt"]
    assert top["network_bytes"]["cp"] > 0 and top["iteration"]["cp"] > 0


@pytest.mark.parametrize("path,value,says", [
    (("llm", "parallel", "cp"), 1, "tp x pp x dp = 8 x 1 x 1 = 8 must equal"),
    (("llm", "parallel", "cp"), 4, "tp x cp x pp x dp = 8 x 4 x 1 x 1 = 32"),
    (("llm", "fabrics", "ideal", "parallel", "cp"), 1, "llm.fabrics.ideal.parallel"),
    (("llm", "fabrics", "ideal", "parallel", "cp"), 0, "llm.fabrics.ideal.parallel.cp"),
    (("llm", "fabrics", "topoopt", "iteration", "cp"), 0.0,
     "llm.fabrics.topoopt.iteration.cp"),
    (("llm", "fabrics", "fattree", "network_bytes", "cp"), 1.0,
     "llm.fabrics.fattree.network_bytes.cp"),
    (("llm", "placement", "cp_groups"), [[0], [1]], "llm.placement.cp_groups"),
])
def test_a_tampered_cp_fails_the_check_in_one_line(cp_plan, path, value, says):
    refusal = refusal_of_tampered(llm_plan_to_json(cp_plan), path, value,
                                  check_llm_plan_document)
    assert says in refusal and "\n" not in refusal


def test_a_plan_without_its_cp_groups_or_parts_fails_the_check(cp_plan):
    for path in (("llm", "placement", "cp_groups"),
                 ("llm", "fabrics", "ideal", "iteration", "cp"),
                 ("llm", "fabrics", "ideal", "network_bytes", "cp")):
        bad = llm_plan_to_json(cp_plan)
        t = bad
        for k in path[:-1]:
            t = t[k]
        del t[path[-1]]
        with pytest.raises(PlanCheckError, match=path[-1] if path[-1] == "cp" else "cp_groups"):
            check_llm_plan_document(bad)


def test_the_plan_folder_lists_the_cp_communicators(cp_plan, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExportSkipped)
        write_plan(cp_plan, tmp_path, plots=False)
    check_plan_dir(tmp_path, simulate=False)
    path = tmp_path / "communicators.json"
    doc = json.loads(path.read_text())
    assert [g["ranks"] for g in doc["groups"]["cp"]] == [[r, r + 8] for r in range(8)]
    del doc["groups"]["cp"]
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanCheckError, match="groups must have tp, cp, pp"):
        check_plan_dir(tmp_path, simulate=False)


def test_a_launch_order_that_breaks_the_cp_rings_is_refused():
    """cp 4 over four servers (one ring 0 -> 1 -> 2 -> 3 -> 0, dp 1): swapping two
    servers keeps the one DP group but not the ring's steps."""
    shape = replace(LLAMA8B, layers=4, seq=65536)
    par = LLMParallel(8, 1, 1, cp=4)
    t = llm_traffic(shape, par, 4, 8, 4, 2)
    assert launch_preserves_traffic(t, (1, 2, 3, 0))    # the ring rotated
    assert not launch_preserves_traffic(t, (1, 0, 2, 3))
