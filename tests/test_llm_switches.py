"""``[plan] parallel``'s switches: memory settings every layout of an LLM plan gets, as
brute force over the layouts gives them, written to plan.json and checked there."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from test_llm_planner import JOB, SMALL, SMALL_TOML

from topoopt.cli import main
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.errors import ConfigError
from topoopt.llm import check_parallel, memory_per_gpu
from topoopt.llm.parallel import stage_layers
from topoopt.planners.llm import check_fixed, enumerate_parallel, rank_parallel
from topoopt.workloads import build_model
from topoopt.workloads.gpt import transformer_shape

SHAPE = transformer_shape(build_model(JOB.model, JOB.size))
BATCH = JOB.global_batch(SMALL)


def test_switches_match_brute_force_over_the_same_layouts():
    """With switches on, the ranked layouts are exactly those of the plain space with the
    switches set that fit, ZeRO-1 as fixed; the fastest first."""
    fixed = {"shard_grads": True, "recompute_norms": True, "recompute_act": True,
             "zero1": True}
    ranked, space = rank_parallel(SHAPE, SMALL, JOB, fixed)
    plain = enumerate_parallel(SHAPE, SMALL, BATCH)
    assert space == len(plain)
    want = set()
    for par in plain:
        p = replace(par, shard_grads=True, recompute_norms=True, recompute_act=True,
                    zero1=True)
        if par.dp > 1 and memory_per_gpu(SHAPE, p, BATCH, JOB.dtype_bytes,
                                         SMALL.gpu.memory).fits:
            want.add(p)
    assert {c.parallel for c in ranked} == want
    times = [c.ideal.total for c in ranked]
    assert times == sorted(times)


def test_norms_recomputed_need_less_memory_and_more_time():
    """Recomputing the norms drops their outputs from the activations and runs them again."""
    off, _ = rank_parallel(SHAPE, SMALL, JOB, {"tp": 1, "pp": 2, "micro_batches": 2,
                                               "zero1": False, "order": "tp-dp-pp"})
    on, _ = rank_parallel(SHAPE, SMALL, JOB, {"tp": 1, "pp": 2, "micro_batches": 2,
                                              "zero1": False, "order": "tp-dp-pp",
                                              "recompute_norms": True})
    a = {(c.parallel.virtual, c.parallel.recompute): c for c in off}
    b = {(c.parallel.virtual, c.parallel.recompute): c for c in on}
    assert a.keys() == b.keys() and a
    for key in a:
        assert b[key].memory.activations < a[key].memory.activations
        assert b[key].ideal.total >= a[key].ideal.total


def test_edge_layers_give_llama3_405b_its_published_stages():
    """Llama 3 §3.3.2: 126 layers on 16 stages as 7, 8 x 14, 7 with one layer fewer on the
    edge stages; and 16 stages of 8 interleaved chunks, which 126 layers alone cannot fill
    evenly, become possible (128 = 16 x 8 chunks, the edge chunks empty)."""
    shape = transformer_shape(build_model("llama3-405b"))
    cluster = Cluster(servers=2048, nics=8, link_bandwidth=400e9, gpus_per_server=8,
                      gpu=GPUS["H100"])
    plain = enumerate_parallel(shape, cluster, 2048)
    edged = enumerate_parallel(shape, cluster, 2048, edge_layers=1)
    key = lambda p: (p.tp, p.pp, p.virtual)                      # noqa: E731
    assert (8, 16, 8) not in {key(p) for p in plain}
    assert (8, 16, 8) in {key(p) for p in edged}
    p = next(p for p in edged if key(p) == (8, 16, 1))
    assert stage_layers(shape.layers, p.pp, p.virtual, p.edge_layers) == (7, *[8] * 14, 7)
    for p in edged:
        assert p.edge_layers == (1 if p.pp > 1 else 0)
        check_parallel(p, shape, cluster, 2048)
        if p.virtual > 1:
            assert (shape.layers + 2) % (p.pp * p.virtual) == 0


@pytest.mark.parametrize("table, field", [
    ({"shard_grads": 1}, "plan.parallel.shard_grads"),
    ({"zero1": "yes"}, "plan.parallel.zero1"),
    ({"edge_layers": -1}, "plan.parallel.edge_layers"),
    ({"edge_layers": True}, "plan.parallel.edge_layers"),
    ({"fsdp": True}, "plan.parallel.fsdp"),
])
def test_bad_switches_are_refused_naming_them(table, field):
    with pytest.raises(ConfigError) as err:
        check_fixed(table)
    assert err.value.field == field


def test_cli_plan_with_switches_is_checked(tmp_path):
    """The switches reach every fabric's layout (edges where it is pipelined), plan.json
    records them, ``plan --check`` passes, and refuses a layout without one."""
    cfg = tmp_path / "moe.toml"
    cfg.write_text(SMALL_TOML.replace(
        "{ ep = 2 }", "{ ep = 2, cp = 1, shard_grads = true, edge_layers = 1, "
                      "recompute_norms = true }"))
    out = tmp_path / "plan"
    r = CliRunner().invoke(main, ["plan", str(cfg), "-o", str(out), "--quiet", "--no-plots"])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "plan.json").read_text())
    for f in doc["llm"]["fabrics"].values():
        par = f["parallel"]
        assert par["shard_grads"] is True and par["recompute_norms"] is True
        assert par.get("edge_layers", 0) == (1 if par["pp"] > 1 else 0)
    r = CliRunner().invoke(main, ["plan", "--check", str(out)])
    assert r.exit_code == 0 and r.output.startswith("ok"), r.output
    del doc["llm"]["fabrics"]["ideal"]["parallel"]["shard_grads"]
    (out / "plan.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["plan", "--check", str(out)])
    assert r.exit_code != 0 and "shard_grads" in r.output, r.output


def test_sharded_gradients_let_more_layouts_fit():
    """A switch that saves memory lets layouts fit that did not: sharded gradients on a
    job just too large for the HBM (m = 1, where the shard is what is held)."""
    job = Job("llama3-8b", 2, "bf16", size={"layers": 32, "seq": 512})
    cluster = replace(SMALL, gpu=replace(GPUS["H100"], memory=24e9))
    shape = transformer_shape(build_model(job.model, job.size))
    fixed = {"micro_batches": 1, "zero1": True}
    try:
        without = {c.parallel.label() for c in rank_parallel(shape, cluster, job, fixed)[0]}
    except ConfigError:
        without = set()
    sharded = rank_parallel(shape, cluster, job, {**fixed, "shard_grads": True})[0]
    assert all(c.parallel.shard_grads for c in sharded)
    assert len(sharded) > len(without)
