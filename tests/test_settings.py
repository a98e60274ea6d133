"""One set of planner settings: PlanSettings, and the library refusing bad input up front.

Every refusal here happens before any search (the calls return at once), names the
parameter or the config field, and is one line.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import topoopt
from topoopt import Cluster, ConfigError, Job
from topoopt._require import MAX_SEED, require_between, require_names
from topoopt.config import PLAN_BOUNDS, PLAN_DEFAULTS, PlanSettings, load_config, parse_config
from topoopt.multijob import parse_cluster_config
from topoopt.planners.alternating import alternating_optimization, start_strategy
from topoopt.planners.llm import plan_llm
from topoopt.planners.planner import plan
from topoopt.planners.search import DEFAULT_TOLERANCE
from topoopt.plans import BASELINES
from topoopt.workloads import model_of

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = Cluster(servers=4, nics=2, link_bandwidth=100e9)
JOB = Job("ncf", 32, size={"tables": 4, "rows": 1000, "top_layers": 2})


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# --- one set of defaults -------------------------------------------------------------

def test_the_defaults_are_the_documented_ones():
    # README and `topoopt plan --help`: budget 200, rounds 2, chains 2, 1%, seed 0
    assert (PLAN_DEFAULTS.budget, PLAN_DEFAULTS.rounds, PLAN_DEFAULTS.chains,
            PLAN_DEFAULTS.tolerance, PLAN_DEFAULTS.seed) == (200, 2, 2, 0.01, 0)
    assert PLAN_DEFAULTS.baselines == BASELINES
    assert PLAN_DEFAULTS.tolerance == DEFAULT_TOLERANCE


@pytest.mark.parametrize("function", [plan, alternating_optimization])
def test_library_defaults_come_from_the_settings(function):
    params = inspect.signature(function).parameters
    for name in ("budget", "rounds", "chains", "seed", "tolerance"):
        assert params[name].default == getattr(PLAN_DEFAULTS, name), name


def test_cli_help_states_the_settings_defaults():
    from click.testing import CliRunner

    from topoopt.cli import main
    text = " ".join(CliRunner().invoke(main, ["plan", "--help"]).output.split())
    for option, value in (("budget", 200), ("rounds", 2), ("chains", 2), ("seed", 0)):
        assert f"[default: {value}" in text.split(f"--{option}")[1].split("--")[0]


def test_a_config_without_plan_gets_the_defaults():
    cfg = parse_config({"cluster": {"servers": 4, "nics": 2, "link_bandwidth": "100Gbps"},
                        "job": {"model": "ncf", "batch_per_gpu": 8}})
    assert cfg.plan_settings == PLAN_DEFAULTS


def test_a_config_plan_table_becomes_its_settings():
    cfg = load_config(ROOT / "configs" / "dlrm-16.toml")
    table = cfg.plan
    assert cfg.plan_settings.budget == table["budget"]
    assert cfg.plan_settings.chains == table["chains"]
    assert cfg.plan_settings.tolerance == PLAN_DEFAULTS.tolerance


def test_options_override_the_table_and_none_keeps_it():
    s = PlanSettings.from_table({"budget": 50, "rounds": 3})
    t = s.with_(budget=7, rounds=None, seed=None)
    assert (t.budget, t.rounds, t.seed) == (7, 3, 0)
    with pytest.raises(ConfigError, match="plan.budget"):
        s.with_(budget=-1)


def test_shared_cluster_plan_defaults_are_topoopt_plans():
    doc = {"cluster": {"servers": 8, "nics": 2, "link_bandwidth": "100Gbps"},
           "mix": [{"model": "vgg16", "batch_per_gpu": 8, "servers": 4, "count": 1}]}
    plan_table = parse_cluster_config(doc).plan
    assert {k: plan_table[k] for k in ("budget", "rounds", "chains", "seed")} == {
        "budget": PLAN_DEFAULTS.budget, "rounds": PLAN_DEFAULTS.rounds,
        "chains": PLAN_DEFAULTS.chains, "seed": PLAN_DEFAULTS.seed}
    # configs/cluster-fig16.toml keeps the effort it ran with
    from topoopt.multijob import load_cluster_config
    fig16 = load_cluster_config(ROOT / "configs" / "cluster-fig16.toml").plan
    assert (fig16["budget"], fig16["rounds"], fig16["chains"]) == (100, 2, 1)


# --- the settings refuse bad values -----------------------------------------------------

BAD_SETTINGS = [
    ({"budget": -1}, "plan.budget", ">= 0"),
    ({"budget": PLAN_BOUNDS["budget"][1] + 1}, "plan.budget", "<="),
    ({"budget": 1.5}, "plan.budget", "integer"),
    ({"budget": True}, "plan.budget", "integer"),
    ({"rounds": 0}, "plan.rounds", ">= 1"),
    ({"chains": 257}, "plan.chains", "<= 256"),
    ({"seed": 1500.0}, "plan.seed", "integer"),
    ({"seed": -1}, "plan.seed", ">= 0"),
    ({"seed": MAX_SEED + 1}, "plan.seed", "<="),
    ({"tolerance": 1}, "plan.tolerance", "[0, 1)"),
    ({"tolerance": -0.1}, "plan.tolerance", "[0, 1)"),
    ({"tolerance": float("nan")}, "plan.tolerance", "[0, 1)"),
    ({"tolerance": "1%"}, "plan.tolerance", "[0, 1)"),
    ({"baselines": "ideal"}, "plan.baselines", "list"),
    ({"baselines": ["ideal", "ideal"]}, "plan.baselines", "once"),
    ({"baselines": [3]}, "plan.baselines", "name"),
    ({"parallel": 8}, "plan.parallel", "table"),
    ({"finder_kwargs": {"routing": "ospf"}}, "plan.routing", "kshortest"),
    ({"finder_kwargs": {"k_paths": 0}}, "plan.k_paths", ">= 1"),
    ({"finder_kwargs": {"primes_only": "yes"}}, "plan.primes_only", "true or false"),
    ({"finder_kwargs": {"mp_decay": 0}}, "plan.mp_decay", "(0, 1]"),
    ({"finder_kwargs": {"bogus": 1}}, "plan.bogus", "unknown key"),
]


@pytest.mark.parametrize("fields, name, fix", BAD_SETTINGS)
def test_settings_refuse_a_bad_value_naming_the_field(fields, name, fix):
    with pytest.raises(ConfigError) as exc:
        PlanSettings(**fields)
    text = one_line(exc)
    assert text.startswith(f"{name} = ") and fix in text


@pytest.mark.parametrize("table, name", [
    ({"budget": -1}, "plan.budget"), ({"bugdet": 5}, "plan.bugdet"),
    ({"routing": "ospf"}, "plan.routing"), ({"baselines": ["ideal", "ideal"]},
                                            "plan.baselines")])
def test_load_config_refuses_a_bad_plan_table(tmp_path, table, name):
    doc = {"cluster": {"servers": 4, "nics": 2, "link_bandwidth": "100Gbps"},
           "job": {"model": "ncf", "batch_per_gpu": 8}, "plan": table}
    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    assert one_line(exc).startswith(name)


def test_shared_cluster_plan_table_is_checked_by_the_same_settings():
    doc = {"cluster": {"servers": 8, "nics": 2, "link_bandwidth": "100Gbps"},
           "mix": [{"model": "vgg16", "batch_per_gpu": 8, "servers": 4, "count": 1}]}
    for table, name in (({"chains": 0}, "plan.chains"), ({"seed": 1.0}, "plan.seed"),
                        ({"budget": 10 ** 9}, "plan.budget"),
                        ({"tolerance": 0.1}, "plan.tolerance")):
        with pytest.raises(ConfigError) as exc:
            parse_cluster_config({**doc, "plan": table})
        assert one_line(exc).startswith(name)
    with pytest.raises(ConfigError, match="run.fabrics"):
        parse_cluster_config({**doc, "run": {"fabrics": ["fattree", "fattree"]}})


def test_shared_cluster_refuses_an_llm_job_to_plan():
    doc = {"cluster": {"servers": 8, "nics": 2, "link_bandwidth": "100Gbps"},
           "mix": [{"model": "llama3-8b", "batch_per_gpu": 1, "precision": "bf16",
                    "servers": 4, "count": 1}]}
    with pytest.raises(ConfigError, match=r"mix\[0\]\.model"):
        parse_cluster_config(doc)


# --- the library refuses wrong arguments -------------------------------------------------

@pytest.mark.parametrize("args, kwargs, kind, words", [
    (("configs/dlrm-16.toml", JOB), {}, TypeError, "load_config"),
    ((JOB, CLUSTER), {}, TypeError, "swapped"),
    ((CLUSTER, {"model": "ncf", "batch_per_gpu": 32}), {}, TypeError, "job must be a Job"),
    (({"servers": 4}, JOB), {}, TypeError, "cluster must be a Cluster"),
    ((CLUSTER, JOB), {"seed": 1500.0}, ConfigError, "plan.seed"),
    ((CLUSTER, JOB), {"budget": -1}, ConfigError, "plan.budget"),
    ((CLUSTER, JOB), {"baselines": ("ideal", "ideal")}, ConfigError, "plan.baselines"),
    ((CLUSTER, JOB), {"baselines": ("torus",)}, ConfigError, "plan.baselines"),
    ((CLUSTER, JOB), {"baselines": ("topoopt",)}, ConfigError, "plan.baselines"),
    ((CLUSTER, JOB), {"baselines": "ideal"}, ConfigError, "plan.baselines"),
    ((CLUSTER, JOB), {"executor": 2}, TypeError, "executor"),
    ((CLUSTER, JOB), {"prices": {"ocs_port": 5}}, TypeError, "prices"),
    ((CLUSTER, JOB), {"progress": "yes"}, TypeError, "progress"),
    ((CLUSTER, JOB), {"on_fabric": 1}, TypeError, "on_fabric"),
    ((CLUSTER, JOB), {"source": 3}, TypeError, "source"),
    ((CLUSTER, JOB), {"fabric_seed": -1}, ConfigError, "fabric_seed"),
    ((CLUSTER, JOB), {"finder_kwargs": {"k": 3}}, ConfigError, "plan.k"),
    ((CLUSTER, JOB), {"parallel": [1]}, ConfigError, "plan.parallel"),
])
def test_plan_refuses_wrong_arguments_up_front(args, kwargs, kind, words):
    with pytest.raises(kind) as exc:
        topoopt.plan(*args, **kwargs)
    assert words in one_line(exc)


def test_alternating_optimization_refuses_wrong_arguments():
    model = model_of(JOB)
    start = start_strategy(model, CLUSTER, JOB)
    for kwargs, kind, words in (({"rounds": 0}, ConfigError, "plan.rounds"),
                                ({"chains": 1.0}, ConfigError, "plan.chains"),
                                ({"seeds": ["hybrid"]}, ConfigError, "seeds"),
                                ({"seeds": {"x": "dp"}}, TypeError, "seeds['x']"),
                                ({"screen": -1}, ConfigError, "screen"),
                                ({"topology_seed": -3}, ConfigError, "topology_seed"),
                                ({"progress": 5}, TypeError, "progress")):
        with pytest.raises(kind) as exc:
            alternating_optimization(model, CLUSTER, JOB, start, **kwargs)
        assert words in one_line(exc), kwargs
    with pytest.raises(TypeError, match="model must be a Model"):
        alternating_optimization(JOB, CLUSTER, JOB, start)
    with pytest.raises(TypeError, match="start must be a Strategy"):
        alternating_optimization(model, CLUSTER, JOB, "dp")


def test_plan_llm_refuses_wrong_arguments():
    c = Cluster(servers=4, nics=4, link_bandwidth=100e9, gpus_per_server=4)
    j = Job("llama3-8b", 2, "bf16", size={"layers": 4, "seq": 512})
    for kwargs, kind, words in (({"baselines": ["sipml"]}, ConfigError, "fixed fabrics"),
                                ({"baselines": ["ideal", "ideal"]}, ConfigError, "once"),
                                ({"top": 0}, ConfigError, "top"),
                                ({"finder_kwargs": {"routing": 1}}, ConfigError,
                                 "plan.routing")):
        with pytest.raises(kind) as exc:
            plan_llm(c, j, **kwargs)
        assert words in one_line(exc), kwargs
    with pytest.raises(TypeError, match="cluster must be a Cluster"):
        plan_llm(j, c)


def test_config_readers_refuse_wrong_types():
    with pytest.raises(TypeError, match="doc must be a mapping"):
        parse_config("configs/dlrm-16.toml")
    with pytest.raises(TypeError, match="path must be"):
        load_config(16)
    from topoopt.config import cluster_from_table, job_from_table
    with pytest.raises(ConfigError, match="^cluster = "):
        cluster_from_table("16 servers")
    with pytest.raises(ConfigError, match="^job = "):
        job_from_table(["dlrm"])


def test_require_helpers():
    assert require_between("x", 0, 0, 1, high_open=True) == 0.0
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        require_between("x", 0, 0, 1, low_open=True)
    with pytest.raises(ConfigError, match="must be a number"):
        require_between("x", True, 0, 1)
    assert require_names("f", ["a", "b"], ("a", "b", "c")) == ("a", "b")
    with pytest.raises(ConfigError) as exc:
        require_names("f", "ab", ("a", "b"))
    assert "'a'" not in str(exc.value).split(":")[1]    # not read letter by letter


# --- good inputs still plan -------------------------------------------------------------

def test_settings_from_a_table_plan_and_are_recorded():
    settings = PlanSettings.from_table({"budget": 10, "rounds": 1, "chains": 1, "seed": 3,
                                        "baselines": ["ideal"], "routing": "kshortest"})
    p = plan(CLUSTER, JOB, budget=settings.budget, rounds=settings.rounds,
             chains=settings.chains, seed=settings.seed, tolerance=settings.tolerance,
             baselines=settings.baselines, finder_kwargs=settings.finder_kwargs)
    assert sorted(p.iteration_time_s) == ["ideal", "topoopt"]
    assert (p.budget, p.rounds, p.chains, p.seed, p.tolerance) == (10, 1, 1, 3, 0.01)
    # the Ideal Switch bounds the shard (a relaxation of it)
    assert p.iteration_time_s["ideal"] <= p.iteration_time_s["topoopt"]


def test_plan_takes_a_list_of_baselines_and_a_zero_tolerance():
    p = plan(CLUSTER, JOB, budget=0, rounds=1, chains=1, tolerance=0, baselines=["ideal"])
    assert p.tolerance == 0.0 and sorted(p.iteration_time_s) == ["ideal", "topoopt"]
