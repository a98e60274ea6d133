"""Both plan kinds (an operator strategy's Plan, an LLM job's LLMPlan) offer one
interface, PlanLike, and every command that takes a plan folder handles both kinds or
refuses one in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from typing import Callable

import pytest
from click.testing import CliRunner

import topoopt
from topoopt.cli import main
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.errors import PlanCheckError
from topoopt.export.bundle import ExportSkipped
from topoopt.export.plan_dir import check_plan_dir, write_plan
from topoopt.plans import LLMPlan, Plan, PlanLike, check_document, plan_kind

OPERATOR = (Cluster(servers=4, nics=2, link_bandwidth=100e9),
            Job("ncf", 32, size={"tables": 4, "rows": 1000, "top_layers": 2}))
LLM = (Cluster(servers=4, nics=4, link_bandwidth=100e9, gpus_per_server=4, gpu=GPUS["H100"],
               intra_server_bandwidth=GPUS["H100"].nvlink_bandwidth, compute_efficiency=0.52),
       Job("llama3-8b", 2, "bf16", size={"layers": 4, "seq": 512}))


def _plan(kind: str, **kwargs) -> PlanLike:
    cluster, job = OPERATOR if kind == "operator" else LLM
    return topoopt.plan(cluster, job, budget=20, rounds=1, baselines=("ideal",), **kwargs)


@pytest.fixture(scope="module", params=["operator", "llm"])
def a_plan(request) -> PlanLike:
    return _plan(request.param)


@pytest.fixture(scope="module")
def llm_folder(tmp_path_factory):
    """An LLM plan whose DP group spans the servers (tp 4, pp 1: one ring of 4), written."""
    out = tmp_path_factory.mktemp("llm") / "plan"
    p = _plan("llm", parallel={"tp": 4, "pp": 1})
    assert isinstance(p, LLMPlan) and p.topology_plan.rings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExportSkipped)
        write_plan(p, out, plots=False)
    return out


def test_both_kinds_are_exported_from_the_package():
    assert {"Plan", "LLMPlan", "PlanLike"} <= set(topoopt.__all__)
    assert topoopt.PlanLike is PlanLike and topoopt.LLMPlan is LLMPlan


def test_a_plan_offers_the_interface_and_its_document_round_trips(a_plan):
    assert isinstance(a_plan, PlanLike)
    doc = a_plan.to_json()
    again = json.loads(json.dumps(doc))
    assert again == doc                                   # plain JSON, nothing lost
    assert plan_kind(again) is type(a_plan)
    assert check_document(again) is type(a_plan)          # passes its kind's check
    a_plan.check()
    type(a_plan).check_document(again)
    # the interface's numbers are the document's
    assert doc["iteration_time_s"] == a_plan.iteration_time_s
    assert doc["cost"] == a_plan.costs
    assert list(a_plan.iteration_time_s)[0] == "topoopt"
    assert a_plan.topology_plan.topology.servers == a_plan.cluster.servers
    assert (a_plan.llm_parallel is None) == isinstance(a_plan, Plan)
    heat = a_plan.traffic_heatmaps()
    n = a_plan.cluster.servers
    assert set(heat) == {"before", "after"}
    for matrix, title in heat.values():
        assert matrix.shape == (n, n) and (matrix >= 0).all() and title


@pytest.mark.parametrize("path, value", [(("iteration_time_s", "topoopt"), 1.0),
                                         (("cluster", "servers"), 3),
                                         (("topology", "links"), [[0, 0, 0, 0]])])
def test_a_corrupted_field_fails_its_check_in_one_line(a_plan, path, value):
    assert "\n" not in refusal_of_tampered(a_plan.to_json(), path, value)


def refusal_of_tampered(doc: dict, path: tuple, value,
                        check: Callable[[dict], object] = check_document) -> str:
    """``check``'s refusal of ``doc`` (left as it is) with the value at ``path``
    replaced by ``value``: a tampered plan must be refused."""
    bad = json.loads(json.dumps(doc))
    t = bad
    for k in path[:-1]:
        t = t[k]
    t[path[-1]] = value
    with pytest.raises(PlanCheckError) as err:
        check(bad)
    return str(err.value)


def test_each_kind_refuses_the_others_document():
    operator, llm = _plan("operator"), _plan("llm")
    with pytest.raises(PlanCheckError, match="strategy"):
        Plan.check_document(llm.to_json())
    with pytest.raises(PlanCheckError):
        LLMPlan.check_document(operator.to_json())


def _one_line_refusal(r) -> str:
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert "Traceback" not in r.output
    return lines[0]


def test_plan_folder_commands_on_an_llm_plan(llm_folder):
    run = CliRunner().invoke
    r = run(main, ["plan", "--check", str(llm_folder)])
    assert r.exit_code == 0 and r.output.startswith("ok"), r.output
    # report: a page for the LLM plan, checked like any other
    r = run(main, ["report", str(llm_folder)])
    assert r.exit_code == 0 and "report.html" in r.output, r.output
    assert "report.html" in check_plan_dir(llm_folder, simulate=False)
    # react simulate: the runtime reads the shard's topology, rings and routes
    r = run(main, ["react", "simulate", "--fabric", f"plan:{llm_folder}", "--epochs", "6",
                   "--warmup", "1"])
    assert r.exit_code == 0 and "with REACT" in r.output, r.output
    # validate: the ns-3 replay needs an operator strategy's task graph
    line = _one_line_refusal(run(main, ["validate", str(llm_folder)]))
    assert "LLM plan" in line and "react simulate" in line


def test_react_simulate_names_a_tampered_llm_plan(llm_folder, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    doc = json.loads((llm_folder / "plan.json").read_text())
    doc["llm"]["parallel"]["tp"] = 3
    (bad / "plan.json").write_text(json.dumps(doc))
    line = _one_line_refusal(CliRunner().invoke(
        main, ["react", "simulate", "--fabric", f"plan:{bad}", "--epochs", "4"]))
    assert "llm.parallel" in line


def test_the_plan_folder_loads_no_matplotlib():
    code = ("import sys, topoopt, topoopt.export.plan_dir, topoopt.plans.interface; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
