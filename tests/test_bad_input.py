"""The bad-input contract, driven through the CLI with generated inputs.

Contract (README, docs/limits.md): a bad config value or option prints exactly one line,
``error: ...`` naming the field or option, exits 2, shows no traceback and writes
nothing; ``topoopt plan --check DIR`` exits 1 naming the first violation of a corrupted
plan in one line; ``topoopt plan -o DIR`` never deletes or changes a file it did not
write. Hypothesis draws config fields, option values, plan.json corruptions and folders
of user files; every example of issue 14 is a test of its own at the end.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topoopt.cli import main

# --------------------------------------------------------------------------- helpers
TINY_OPS = [
    {"name": "x", "kind": "input", "out_elems": 512},
    {"name": "emb", "kind": "embedding", "params": 4_000_000, "fwd_flops": 2000,
     "out_elems": 256, "mem_elems": 2000, "inputs": ["x"]},
    {"name": "fc", "kind": "dense", "params": 30_000_000, "fwd_flops": 6e7,
     "out_elems": 1024, "inputs": ["emb"]},
]
SMALL_DLRM = {"tables": 6, "rows": 20_000, "dim": 32, "bag": 8, "bottom_layers": 1,
              "bottom_width": 64, "top_layers": 1, "top_width": 64}
SMALL_BERT = {"layers": 2, "hidden": 256, "heads": 4, "seq": 32, "vocab": 2000}


def tiny_config(servers=4, nics=2, model="custom", **tables) -> dict:
    """A config that plans in a fraction of a second (``--budget 2 --rounds 1``)."""
    job = {"model": model, "batch_per_gpu": 32}
    if model == "custom":
        job["operators"] = [dict(o) for o in TINY_OPS]
    elif model == "dlrm":
        job["size"] = dict(SMALL_DLRM)
    elif model == "bert":
        job["size"] = dict(SMALL_BERT)
        job["batch_per_gpu"] = 8
    doc = {"cluster": {"servers": servers, "nics": nics, "link_bandwidth": "100Gbps"},
           "job": job, "plan": {"budget": 2, "rounds": 1}}
    doc.update(tables)
    return doc


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) \
            else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def to_toml(doc: dict) -> str:
    """TOML for a config document: top-level tables, ``[[job.operators]]`` arrays."""
    lines = []
    for name, table in doc.items():
        if not isinstance(table, dict):
            lines.append(f"{json.dumps(name)} = {_toml_value(table)}")
            continue
        ops = table.get("operators") if name == "job" else None
        lines.append(f"[{name}]")
        for k, v in table.items():
            if k == "operators" and isinstance(v, list) and all(isinstance(o, dict) for o in v):
                continue
            lines.append(f"{json.dumps(k)} = {_toml_value(v)}")
        if isinstance(ops, list) and all(isinstance(o, dict) for o in ops):
            for o in ops:
                lines.append("[[job.operators]]")
                lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in o.items()]
    return "\n".join(lines) + "\n"


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and folder (None) under ``root``."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = None if p.is_dir() else p.read_bytes()
    return out


def assert_one_line(result, code: int, *names: str) -> str:
    """Exit ``code``, exactly one ``error:`` line mentioning one of ``names``, no traceback."""
    text = result.output
    assert "Traceback" not in text, text
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    assert result.exit_code == code, (result.exit_code, text)
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    assert not names or any(n in lines[0] for n in names), (names, lines[0])
    assert "Error(" not in lines[0] and "<" not in lines[0][:8], lines[0]  # no exception repr
    return lines[0]


def examples(n: int) -> settings:
    """``n`` generated inputs, no per-example deadline (the CLI runs in-process)."""
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

# ------------------------------------------------------------------- bad config fields
JUNK_TEXT = st.text(alphabet="xyz!?#-", min_size=1, max_size=6)
NOT_INT = st.one_of(JUNK_TEXT, st.booleans(), st.just(1.5), st.just(float("nan")),
                    st.lists(st.integers(0, 3), max_size=2))
NOT_NUMBER = st.one_of(JUNK_TEXT, st.booleans(), st.lists(st.integers(0, 3), max_size=2),
                       st.just({"a": 1}))
NOT_BANDWIDTH = st.one_of(JUNK_TEXT, st.sampled_from(["-3Gbps", "0Gbps", "1e30Gbps", "5",
                                                      "100 Gbps/s", "inf", "nan"]),
                          st.just(float("inf")), st.just(0), st.just(-1), st.booleans())
NOT_FRACTION = st.one_of(NOT_NUMBER, st.sampled_from([0, -0.5, 1.5, 7]),
                         st.just(float("nan")))


def _int_out_of(low, high):
    return st.one_of(NOT_INT, st.integers(max_value=low - 1, min_value=-2 ** 70),
                     st.integers(min_value=high + 1, max_value=2 ** 70))


#: (table, key) -> bad values; the error must name ``table.key``.
BAD_FIELDS = {
    ("cluster", "servers"): _int_out_of(2, 2048),
    ("cluster", "nics"): _int_out_of(1, 64),
    ("cluster", "gpus_per_server"): _int_out_of(1, 72),
    ("cluster", "link_bandwidth"): NOT_BANDWIDTH,
    ("cluster", "intra_server_bandwidth"): NOT_BANDWIDTH,
    ("cluster", "link_latency"): st.one_of(JUNK_TEXT, st.sampled_from(
        ["-1us", "1h", "20ms", "nan"]), st.just(-1e-6), st.booleans()),
    ("cluster", "gpu"): st.one_of(st.sampled_from(["B200", "a100", ""]), st.integers()),
    ("cluster", "compute_efficiency"): NOT_FRACTION,
    ("cluster", "memory_efficiency"): NOT_FRACTION,
    ("job", "batch_per_gpu"): _int_out_of(1, 2 ** 20),
    ("job", "precision"): st.one_of(st.sampled_from(["fp8", "FP32", ""]), st.integers()),
    ("job", "model"): st.one_of(st.sampled_from(["alexnet", "", "Custom"]), st.integers()),
    ("plan", "budget"): _int_out_of(0, 10 ** 8),
    ("plan", "rounds"): _int_out_of(1, 1000),
    ("plan", "chains"): _int_out_of(1, 256),
    ("plan", "seed"): _int_out_of(0, 2 ** 32 - 1),
    ("plan", "k_paths"): _int_out_of(1, 64),
    ("plan", "baselines"): st.one_of(st.sampled_from(["ideal", "fattree"]),
                                     st.just(["torus"]), st.just(["ideal", "ideal"]),
                                     st.just(["topoopt"]), st.integers(), st.just({"a": 1})),
    ("plan", "routing"): st.one_of(st.sampled_from(["ospf", "LP", ""]), st.integers()),
    ("plan", "primes_only"): st.one_of(st.sampled_from(["yes", "true"]), st.integers()),
    ("plan", "mp_decay"): st.one_of(NOT_NUMBER, st.sampled_from([0, -1, 1.5])),
    ("cost", "ocs_port"): st.one_of(JUNK_TEXT, st.just(-5), st.just(float("nan"))),
    ("cost", "transceiver"): st.one_of(st.just({"fast": 3}), st.just({"100Gbps": -1}),
                                       JUNK_TEXT),
    ("react", "batch"): st.one_of(NOT_INT, st.integers(max_value=0)),
    ("react", "seed"): st.one_of(NOT_INT, st.integers(max_value=-1)),
    ("react", "delta1"): st.one_of(NOT_NUMBER, st.sampled_from([1, 1.5, -0.1])),
}
UNKNOWN_KEY = st.text(alphabet="abcdefghij_", min_size=3, max_size=8)


@st.composite
def bad_configs(draw):
    """A config with one bad field, and the name the error must give."""
    doc = tiny_config(model=draw(st.sampled_from(["custom", "dlrm"])))
    kind = draw(st.sampled_from(["field", "field", "field", "unknown", "operators", "size"]))
    if kind == "field":
        table, key = draw(st.sampled_from(sorted(BAD_FIELDS)))
        value = draw(BAD_FIELDS[table, key])
        if (table, key) == ("job", "model") and value == "custom":
            value = "alexnet"
        doc.setdefault(table, {})[key] = value
        return doc, (f"{table}.{key}",)
    if kind == "unknown":
        table = draw(st.sampled_from(["cluster", "job", "plan", "cost", "react", ""]))
        key = draw(UNKNOWN_KEY)
        if table:
            doc.setdefault(table, {})[key] = 1
            return doc, (f"{table}.{key}",)
        doc[key] = {"a": 1}
        return doc, (key,)
    if kind == "size":
        doc = tiny_config(model="dlrm")
        key = draw(st.sampled_from(sorted(SMALL_DLRM) + ["bogus"]))
        doc["job"]["size"][key] = draw(st.one_of(NOT_INT, st.integers(max_value=-1)))
        return doc, (f"job.size.{key}", "job.size")
    doc = tiny_config(model="custom")
    ops = doc["job"]["operators"]
    what = draw(st.sampled_from(["only-input", "no-work", "kind", "dup", "input-ref",
                                 "negative", "key", "empty"]))
    if what == "only-input":
        ops[:] = [ops[0]]
    elif what == "no-work":
        for o in ops[1:]:
            o.update(fwd_flops=0, mem_elems=0, bwd_flops=0)
    elif what == "kind":
        ops[2]["kind"] = draw(st.sampled_from(["conv3d", "", "Dense"]))
    elif what == "dup":
        ops[2]["name"] = "emb"
    elif what == "input-ref":
        ops[1]["inputs"] = [draw(st.sampled_from(["fc", "nope", "emb"]))]
    elif what == "negative":
        ops[2][draw(st.sampled_from(["params", "fwd_flops", "out_elems"]))] = -1
    elif what == "key":
        ops[2][draw(UNKNOWN_KEY)] = 1
    else:
        ops[:] = []
    return doc, ("job.operators",)


#: (command, extra args): every command that reads a config; outputs go to DIR.
CONFIG_COMMANDS = [
    ("traffic", ["--png", "{d}/t.png"]),
    ("topology", ["--png", "{d}/t.png"]),
    ("simulate", ["--json", "{d}/s.json", "--fabric", "ideal"]),
    ("plan", ["-o", "{d}/plan", "--quiet", "--workers", "1", "--no-plots"]),
]


@examples(500)
@given(bad_configs(), st.sampled_from(CONFIG_COMMANDS))
def test_bad_config_field_is_one_line_exit_2_and_writes_nothing(tmp_path_factory, case,
                                                                 command):
    (doc, names), (name, extra) = case, command
    d = tmp_path_factory.mktemp("cfg")
    (d / "c.toml").write_text(to_toml(doc))
    before = snapshot(d)
    r = cli(name, d / "c.toml", *(a.format(d=d) for a in extra))
    assert_one_line(r, 2, *names)
    assert snapshot(d) == before


def test_config_that_is_not_a_file_or_not_toml(tmp_path):
    (tmp_path / "bad.toml").write_bytes(b"[cluster\nservers = \xff")
    for path, name in ((tmp_path, "CONFIG"), (tmp_path / "bad.toml", "config"),
                       (tmp_path / "missing.toml", "config")):
        for command in ("traffic", "plan"):
            extra = ["-o", tmp_path / "out"] if command == "plan" else []
            assert_one_line(cli(command, path, *extra), 2, name)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------- bad CLI values
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A valid config, a plain file, a folder and a valid plan folder to aim options at."""
    d = tmp_path_factory.mktemp("world")
    (d / "c.toml").write_text(to_toml(tiny_config()))
    (d / "afile.txt").write_text("user data\n")
    (d / "folder").mkdir()
    r = cli("plan", d / "c.toml", "-o", d / "plan", "--quiet", "--workers", "1", "--no-plots")
    assert r.exit_code == 0, r.output
    return d


def _bad_places(option):
    """Output places that cannot be written, as format strings over DIR."""
    return st.sampled_from(["{d}/afile.txt/x.out", "/proc/topoopt-x.out", "{d}/folder",
                            "{d}/afile.txt/sub/deeper.out"]).map(lambda p: (option, p))


NOT_INT_TEXT = st.sampled_from(["x", "1.5", "", "1e3", "--", "0x10"])
NEG = st.integers(-2 ** 64, -1).map(str)
HUGE = st.integers(2 ** 40, 2 ** 80).map(str)

#: command -> (base args, strategy of (option, value), names the error may give).
BAD_VALUES = {
    "plan": (["{d}/c.toml", "-o", "{d}/p1", "--quiet", "--workers", "1", "--no-plots"], st.one_of(
        st.tuples(st.just("--budget"), st.one_of(NEG, HUGE, NOT_INT_TEXT)),
        st.tuples(st.just("--rounds"), st.one_of(st.just("0"), NEG, HUGE, NOT_INT_TEXT)),
        st.tuples(st.just("--chains"), st.one_of(st.just("0"), NEG, HUGE)),
        st.tuples(st.just("--seed"), st.one_of(NEG, HUGE, NOT_INT_TEXT)),
        st.tuples(st.just("--workers"), st.one_of(st.just("0"), NEG, HUGE)),
        st.tuples(st.just("-o"), st.sampled_from(["{d}/afile.txt", "{d}/afile.txt/sub",
                                                   "/proc/topoopt-x"])),
        st.tuples(st.just("--bogus"), st.just("1")),
    )),
    "simulate": (["{d}/c.toml", "--fabric", "ideal"], st.one_of(
        st.tuples(st.just("--seed"), st.one_of(NEG, HUGE, NOT_INT_TEXT)),
        st.tuples(st.just("--fabric"), st.sampled_from(["torus", "", "IDEAL"])),
        st.tuples(st.just("--strategy"), st.sampled_from(["mp", ""])),
        st.tuples(st.just("--mp-flows"), st.sampled_from(["flows", ""])),
        _bad_places("--json"),
    )),
    "topology": (["{d}/c.toml"], st.one_of(
        st.tuples(st.just("--k"), st.one_of(st.just("0"), NEG, HUGE, NOT_INT_TEXT)),
        st.tuples(st.just("--seed"), st.one_of(NEG, HUGE)),
        st.tuples(st.just("--routing"), st.sampled_from(["ospf", ""])),
        _bad_places("--png"),
    )),
    "traffic": (["{d}/c.toml"], st.one_of(
        st.tuples(st.just("--strategy"), st.sampled_from(["mp", ""])), _bad_places("--png"))),
    "react pattern": ([], st.one_of(
        st.tuples(st.just("--nodes"), st.one_of(st.sampled_from(["0", "1", "513", "100000"]),
                                                NEG, HUGE, NOT_INT_TEXT)),
        st.tuples(st.just("--size"), st.sampled_from(["abc", "-1MB", "0", "2TB", "1e400"])),
        st.tuples(st.just("--collective"), st.sampled_from(["star", "plan"])),
        _bad_places("-o"),
    )),
    "react estimate": ([], st.one_of(
        st.tuples(st.just("--nodes"), st.one_of(st.sampled_from(["1", "100000"]), NEG, HUGE)),
        st.tuples(st.just("--size"), st.sampled_from(["abc", "-1MB", "5TB"])),
        st.tuples(st.just("--alpha"), st.sampled_from(["x", "-4us", "1e400s"])),
        st.tuples(st.just("--bandwidth"), st.sampled_from(["x", "0Gbps", "-1Gbps"])),
        st.tuples(st.just("--congest"), st.sampled_from(["x", "99:1", "3", "3:x", "-1:2"])),
        st.tuples(st.just("--congest-out"), st.sampled_from(["x", "99:1", "16:1"])),
        st.tuples(st.just("--swap"), st.sampled_from(["1:1", "x", "99:1", "1:2@99"])),
    )),
    "react simulate": (["--epochs", "4", "--warmup", "1", "--fabric", "star"], st.one_of(
        st.tuples(st.just("--nodes"), st.one_of(st.sampled_from(["1", "513"]), NEG, HUGE)),
        st.tuples(st.just("--epochs"), st.one_of(st.sampled_from(["0", "1000001"]), NEG)),
        st.tuples(st.just("--warmup"), st.one_of(st.sampled_from(["4", "99"]), NEG)),
        st.tuples(st.just("--p"), st.one_of(NEG, HUGE)),
        st.tuples(st.just("--congested"), st.one_of(NEG, HUGE, st.just("9"))),
        st.tuples(st.just("--capacity"), st.sampled_from(["x", "-1Gbps"])),
        st.tuples(st.just("--seed"), st.one_of(NEG, HUGE)),
        st.tuples(st.just("--mtu"), st.sampled_from(["10", "100000"])),
        st.tuples(st.just("--scenario"), st.sampled_from(["storm", ""])),
        st.tuples(st.just("--fabric"), st.sampled_from(
            ["torus", "plan:{d}/afile.txt", "plan:{d}/nope", "plan:{d}/folder"])),
        _bad_places("--json"), _bad_places("--png"),
    )),
    "react sweep": (["--epochs", "4"], st.one_of(
        st.tuples(st.just("--p"), st.sampled_from(["x", "4-1", "1-100000000", "1,,2"])),
        st.tuples(st.just("--pairs"), st.sampled_from(["x", "8-1", "1-1000000000"])),
        st.tuples(st.just("--seeds"), st.one_of(st.just("0"), NEG, HUGE)),
        st.tuples(st.just("--nodes"), st.sampled_from(["1", "100000"])),
        st.tuples(st.just("--fabric"), st.sampled_from(["torus", "plan:{d}/afile.txt"])),
        _bad_places("--json"),
    )),
    "validate": (["{d}/plan"], st.one_of(
        st.tuples(st.just("--mtu"), st.sampled_from(["10", "100000", "x"])),
        st.tuples(st.just("--iterations"), st.one_of(st.just("0"), NEG)),
        _bad_places("--json"),
    )),
    "react run": ([], st.one_of(
        st.tuples(st.just("--nprocs"), st.sampled_from(["0", "1", "65", "100000"])),
        st.tuples(st.just("--seed"), NEG),
        st.tuples(st.just("--epochs"), st.sampled_from(["0", "-1"])),
        _bad_places("--json"),
    )),
}


@examples(500)
@given(st.sampled_from(sorted(BAD_VALUES)), st.data())
def test_bad_option_value_is_one_line_exit_2_and_writes_nothing(world, command, data):
    base, values = BAD_VALUES[command]
    option, value = data.draw(values)
    before = snapshot(world)
    args = [*command.split(), *(a.format(d=world) for a in base), option,
            value.format(d=world)]
    r = cli(*args)
    names = [option] + (["--output"] if option == "-o" else [])
    if option == "--bogus":
        names = ["No such option"]
    if value.startswith("plan:"):
        names.append("plan")
    assert_one_line(r, 2, *names)
    assert snapshot(world) == before


# ---------------------------------------------------------------- corrupted plan folders
@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Valid plan folders of different shapes: a custom model on 4 x 2 (MP routes, OCS,
    MSCCL skipped: no AllReduce), a small DLRM on 8 x 2 (direct rings, MP routes over
    several hops, MSCCL, pictures), a small BERT on 6 x 3 (three direct rings with
    stride labels, no routes). The two models plan their starts only (budget 0): the
    search puts jobs this small on one or two servers."""
    root = tmp_path_factory.mktemp("plans")
    out = {}
    for name, doc, extra in (("custom", tiny_config(), ["--no-plots"]),
                             ("dlrm", tiny_config(8, 2, "dlrm", plan={"budget": 0, "rounds": 1}),
                              []),
                             ("bert", tiny_config(6, 3, "bert", plan={"budget": 0, "rounds": 1}),
                              ["--no-plots"])):
        (root / f"{name}.toml").write_text(to_toml(doc))
        r = cli("plan", root / f"{name}.toml", "-o", root / name, "--quiet", "--workers", "1", *extra)
        assert r.exit_code == 0, r.output
        check = cli("plan", "--check", root / name)
        assert check.exit_code == 0 and check.output.startswith("ok"), check.output
        out[name] = root / name
    doc = json.loads((out["dlrm"] / "plan.json").read_text())
    assert any(len(q["path"]) > 2 for r in doc["routes"] for q in r["paths"]), \
        "the DLRM plan should route some MP pair over several hops"
    assert any(r["direct"] for r in json.loads((out["bert"] / "plan.json").read_text())
               ["rings"])
    assert "msccl_allreduce.xml" in json.loads((out["custom"] / "plan.json").read_text())[
        "skipped"]
    return out


def _leaves(value, path="", keys=()):
    """(dotted path with [i], value) of every leaf and container under ``value``; the
    path's keys are remembered in ``_KEYS`` (a key may hold dots: ``msccl_allreduce.xml``)."""
    _KEYS[path] = keys
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}" if path else k, (*keys, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]", (*keys, i))


_KEYS: dict[str, tuple] = {}


def _get(doc, path):
    parent, key = _parent(doc, path)
    return parent[key]


def _parent(doc, path):
    """(container, key) of a path ``_leaves`` gave."""
    keys = _KEYS[path]
    node = doc
    for k in keys[:-1]:
        node = node[k]
    return node, keys[-1]


def _wrong_type(value):
    """Values of a type the field cannot have."""
    if isinstance(value, bool):
        return st.sampled_from([1, "true", None])
    if isinstance(value, int):
        return st.sampled_from([0.5, "1", None, True, [value]])
    if isinstance(value, float):
        return st.sampled_from(["fast", None, True, [value], float("nan"), float("inf"), -1.0])
    if isinstance(value, str):
        return st.sampled_from([None, 3, 2.5, ["x"]])
    if isinstance(value, list):
        return st.sampled_from(["list", 3, None, {"a": 1}])
    return st.sampled_from(["table", 3, None, [1]])


#: Leaves whose type alone is free (any string is a valid ``config`` path); skipped when
#: swapping types, and whose value cannot be derived (a fabric's time, its cost, moves).
FREE = ("config",)
#: Leaves that take any number (a custom operator's FLOPs), though a config may write an
#: int there.
NUMBERS = re.compile(r"^job\.operators\[\d+\]\.(fwd_flops|bwd_flops)$")
CONTAINERS_OPTIONAL = ("topology.labels", "topology.link_latency", "job.size")
#: Entries of a search's records whose removal leaves a shorter but consistent record
#: (a start not tried, a point of a curve, a kind of move that never improved).
UNCOUNTED = re.compile(r"(\.starts|\.screened|\.curve_s)\[[1-9]\d*\]$|\.improved_by\.")


@st.composite
def corruptions(draw, plans):
    """(plan name, mutate(folder) -> None, names the error may give)."""
    name = draw(st.sampled_from(sorted(plans)))
    doc = json.loads((plans[name] / "plan.json").read_text())
    paths = [p for p, _ in _leaves(doc) if p]
    kind = draw(st.sampled_from(["type", "type", "delete", "derived", "structure",
                                 "structure", "files"]))
    names: tuple[str, ...]
    disk = None
    if kind == "type":
        path = draw(st.sampled_from([p for p in paths if p not in FREE]))
        old = _get(doc, path)
        if NUMBERS.search(path) and type(old) is int:
            old = float(old)  # written as an int, read as a number: 0.5 is no corruption
        new = draw(_wrong_type(old))
        parent, key = _parent(doc, path)
        parent[key] = new
        top = path.split(".")[0].split("[")[0]
        # the error names the field, its table or (for a value read by a check) the
        # thing it breaks; never a Python exception
        names = (path, top, path.rsplit(".", 1)[0], path.split("[")[0])
    elif kind == "delete":
        # (dropping report.html from files leaves a valid plan written without its
        # report, the file on disk then someone else's: not a corruption)
        path = draw(st.sampled_from([p for p in paths if p not in CONTAINERS_OPTIONAL
                                     and not p.startswith("job.size")
                                     and "operators" not in p and p != "skipped"
                                     and not UNCOUNTED.search(p)
                                     and not (p.startswith("files[")
                                              and _get(doc, p) == "report.html")]))
        parent, key = _parent(doc, path)
        if isinstance(parent, list):
            if len(parent) < 2 and path.rsplit("[", 1)[0] in ("routes", "rings"):
                parent.append(parent[0])  # a duplicate entry instead of an empty list
            else:
                del parent[key]
        else:
            del parent[key]
        top = path.split(".")[0].split("[")[0]
        names = (path, top, path.split("[")[0], "route", "ring", "link", "MP pair",
                 "carries bytes", "Hamiltonian", "strongly connected", "operators",
                 "one config per operator", "labels", "history", "moves")
    elif kind == "derived":
        options = (["job.global_batch", "search.best_time_s", "topology.servers",
                    "topology.ports", "topology.link_bandwidth", "topology.degree_mp"]
                   + [f"metrics.{k}" for k in doc["metrics"]]
                   + [f"breakdown.{f}.{k}" for f in doc["breakdown"]
                      for k in ("exposed_communication", "mp_bytes")]
                   + [f"rings[{i}].{k}" for i in range(len(doc["rings"]))
                      for k in ("share", "group_bytes")]
                   + [f"search.history[{i}].round" for i in range(len(doc["search"]["history"]))]
                   + ["search.moves", "cluster.nics"])
        path = draw(st.sampled_from(options))
        parent, key = _parent(doc, path)
        old = parent[key]
        parent[key] = old + 1 if path == "cluster.nics" else old * 2 + 1
        names = (path, path.split(".")[0].split("[")[0], "topology", "degree", "ports",
                 "cluster", "route", "ring", "link")
    elif kind == "structure":
        what = draw(st.sampled_from(["dup-link", "fraction-port", "label", "degree", "ring-repeat",
                                     "share", "route-drop", "route-fraction", "route-hop",
                                     "strategy", "unknown-key", "stride"]))
        t = doc["topology"]
        names = ()
        if what == "dup-link":
            t["links"].append(list(t["links"][0]))
            t["labels"].append(t["labels"][0])
            names = ("already",)
        elif what == "fraction-port":
            i = draw(st.integers(0, len(t["links"]) - 1))
            t["links"][i][draw(st.sampled_from([1, 3]))] += 0.5
            names = (f"topology.links[{i}]",)
        elif what == "label":
            i = draw(st.integers(0, len(t["labels"]) - 1))
            t["labels"][i] = draw(st.sampled_from(["ring", "ring:p=0", "MP", "foo", "",
                                                   "ring:p=-1", "mp:p=1"]))
            names = (f"topology.labels[{i}]",)
        elif what == "degree":
            t["degree_mp"] = doc["cluster"]["nics"] - t["degree_allreduce"] + \
                draw(st.integers(1, 3))
            names = ("topology.degree",)
        elif what == "ring-repeat" and doc["rings"]:
            r = doc["rings"][draw(st.integers(0, len(doc["rings"]) - 1))]
            r["order"][1] = r["order"][0]
            names = ("Hamiltonian",)
        elif what == "share" and doc["rings"]:
            i = draw(st.integers(0, len(doc["rings"]) - 1))
            doc["rings"][i]["share"] = draw(st.sampled_from([0.25, 0.7, 1.5, 2.0, 0.1]))
            if doc["rings"][i]["share"] == 1.0 / sum(
                    r["members"] == doc["rings"][i]["members"] for r in doc["rings"]):
                doc["rings"][i]["share"] *= 1.5
            names = (f"rings[{i}].share",)
        elif what == "route-drop" and doc["routes"]:
            del doc["routes"][draw(st.integers(0, len(doc["routes"]) - 1))]
            names = ("route", "carries bytes", "metrics")
        elif what == "route-fraction" and doc["routes"]:
            r = doc["routes"][draw(st.integers(0, len(doc["routes"]) - 1))]
            r["paths"][0]["fraction"] *= draw(st.sampled_from([0.5, 1.5, 3]))
            names = ("route", "fraction")
        elif what == "route-hop" and any(len(q["path"]) > 2 for r in doc["routes"]
                                         for q in r["paths"]):
            q = next(q for r in doc["routes"] for q in r["paths"] if len(q["path"]) > 2)
            q["path"][1] = q["path"][0]
            names = ("route",)
        elif what == "strategy":
            row = doc["strategy"][draw(st.integers(0, len(doc["strategy"]) - 1))]
            row["dp"] = row["dp"] + 1
            names = ("strategy",)
        elif what == "stride" and any(r["direct"] for r in doc["rings"]):
            r = next(r for r in doc["rings"] if r["direct"])
            u, v = r["order"][0], r["order"][1]
            i = next(i for i, (a, _, b, _) in enumerate(t["links"])
                     if (a, b) == (u, v) and t["labels"][i].startswith("ring:"))
            t["labels"][i] = "ring:p=" + str(int(t["labels"][i][7:]) + len(r["members"]) + 1)
            names = ("ring", "labelled")
        else:
            table = draw(st.sampled_from(["", "topology", "search", "metrics", "cluster"]))
            key = draw(UNKNOWN_KEY)
            (doc[table] if table else doc)[key] = 1
            names = (key,)
    else:
        what = draw(st.sampled_from(["rm-file", "rm-entry", "bogus-entry", "rm-ocs",
                                     "truncate", "png", "skip", "rm-hostfile"]))
        files = [f for f in doc["files"] if f != "plan.json"]
        if what == "rm-entry":  # an unlisted picture or page is a user's file like any other
            files = [f for f in files if not f.endswith((".png", ".html"))]
        rel = draw(st.sampled_from(files))
        if what == "rm-file":
            disk = ("rm", rel)
            names = (rel,)
        elif what == "rm-entry":
            doc["files"].remove(rel)
            names = (rel, "files", "ocs/")
        elif what == "bogus-entry":
            entry = draw(st.sampled_from(["../etc/passwd", "/tmp/x", "notes.txt",
                                          "ocs/ocs7.tl1"]))
            doc["files"] = sorted(doc["files"] + [entry])
            names = ("files", entry)
        elif what == "rm-ocs" and any(f.startswith("ocs/") for f in files):
            disk = ("rmtree", "ocs")
            names = ("ocs/",)
        elif what == "truncate" and not rel.endswith(".png"):
            disk = ("truncate", rel)
            names = (rel.split("/")[-1].split(".")[0], "rank", "host", "MSCCL", "msccl",
                     "OCS", "ocs", "patch", "link", "strand", "port", "ring", "missing")
        elif what == "png" and any(f.endswith(".png") for f in files):
            disk = ("truncate", next(f for f in files if f.endswith(".png")))
            names = ("PNG",)
        elif what == "skip":
            doc["skipped"] = {"ocs/": "too big"} if not doc["skipped"] else {}
            names = ("skipped", "files")
        else:
            disk = ("rm", "hostfile")
            names = ("hostfile",)
    return name, doc, disk, names


def _apply(folder: Path, doc: dict, disk) -> None:
    (folder / "plan.json").write_text(json.dumps(doc, indent=1))
    if disk is None:
        return
    op, rel = disk
    if op == "rm":
        (folder / rel).unlink()
    elif op == "rmtree":
        shutil.rmtree(folder / rel)
    elif op == "truncate":
        data = (folder / rel).read_bytes()
        (folder / rel).write_bytes(data[: len(data) // 3])


@examples(500)
@given(st.data())
def test_corrupted_plan_check_exits_1_naming_it(plans, tmp_path_factory, data):
    name, doc, disk, names = data.draw(corruptions(plans))
    folder = tmp_path_factory.mktemp("corrupt") / name
    shutil.copytree(plans[name], folder)
    if doc == json.loads((plans[name] / "plan.json").read_text()) and disk is None:
        return  # the mutation was a no-op on this plan (e.g. no route to drop)
    _apply(folder, doc, disk)
    before = snapshot(folder)
    r = cli("plan", "--check", folder)
    assert_one_line(r, 1, *names)
    assert snapshot(folder) == before  # checking writes nothing


@pytest.mark.parametrize("name", ["custom", "dlrm", "bert"])
def test_check_reads_every_field(plans, name):
    """Every field of a generated plan.json is read by the check: changing it to a value of
    another type is reported (the exhaustive form of the property: each field once, the
    first element of every list standing for the rest, e.g. ``routes[0].paths[0].path[1]``
    for all route hops)."""
    base = json.loads((plans[name] / "plan.json").read_text())
    folder = plans[name].parent / f"{name}-every"
    shutil.copytree(plans[name], folder)
    seen = set()
    try:
        for path, value in _leaves(base):
            if not path or path in FREE or path.startswith(("files", "skipped")):
                continue
            kind = re.sub(r"\[\d+\]", "[]", path)
            if kind in seen and not path.startswith(("topology.links[0]", "strategy")):
                continue
            seen.add(kind)
            doc = json.loads(json.dumps(base))
            parent, key = _parent(doc, path)
            parent[key] = {"unexpected": [None]} if not isinstance(value, dict) else None
            (folder / "plan.json").write_text(json.dumps(doc))
            r = cli("plan", "--check", folder)
            assert r.exit_code == 1, (path, r.output)
            assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    finally:
        shutil.rmtree(folder)


# ------------------------------------------------------------------- user files are safe
USER_NAMES = st.sampled_from([
    "notes.txt", "ocs/my_notes.txt", "ocs/ocs0.backup", "data/x.csv", "topology.png/",
    "hostfile/", "ocs/port_map.csv/", "patch_panel.csv", "plan.json", "plan.json/", "ocs",
    "fabrics.png", "rank_order.txt.orig", "msccl_allreduce.xml/keep.txt",
])


@examples(30)
@given(st.lists(USER_NAMES, min_size=1, max_size=4, unique=True), st.booleans(),
       st.sampled_from([["--no-plots"], ["--no-exports", "--no-plots"],
                        ["--seed", "3", "--no-plots"]]))
def test_plan_never_touches_user_files(tmp_path_factory, user, earlier, flags):
    """A user's files and folders in -o DIR, next to an earlier plan or not: the plan
    either refuses in one line (a user object where it must write) with DIR unchanged, or
    writes and leaves every user object as it was; the folder then checks."""
    d = tmp_path_factory.mktemp("safe")
    (d / "c.toml").write_text(to_toml(tiny_config()))
    out = d / "out"
    if earlier:
        assert cli("plan", d / "c.toml", "-o", out, "--quiet", "--workers", "1", "--no-plots").exit_code == 0
    mine = {}
    for name in user:
        path = out / name.rstrip("/")
        if any(p.is_file() for p in path.parents):
            continue  # a file of an earlier name is where this one's folder would be
        if name.endswith("/"):
            if path.exists() and not path.is_dir():
                continue
            path.mkdir(parents=True, exist_ok=True)
            (path / "inside.txt").write_text("mine")
        else:
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"user {name}\n")
        mine.update({k: v for k, v in snapshot(out).items()
                     if k == name.rstrip("/") or k.startswith(name.rstrip("/") + "/")})
    before = snapshot(out)
    r = cli("plan", d / "c.toml", "-o", out, "--quiet", "--workers", "1", *flags)
    after = snapshot(out) if out.exists() else {}
    if r.exit_code == 2:
        assert_one_line(r, 2, "in the way")
        assert after == before
    else:
        assert r.exit_code == 0, r.output
        for k, v in mine.items():
            assert after.get(k, "gone") == v, k
        check = cli("plan", "--check", out)
        assert check.exit_code == 0, check.output


def test_replanning_replaces_only_the_plans_files(tmp_path):
    """Issue 14: DIR/ocs/my_notes.txt and a user folder named like an output survive; the
    earlier plan's files that the new one does not write are removed."""
    (tmp_path / "c.toml").write_text(to_toml(tiny_config()))
    out = tmp_path / "out"
    assert cli("plan", tmp_path / "c.toml", "-o", out, "--quiet", "--workers", "1", "--no-plots").exit_code == 0
    (out / "ocs" / "my_notes.txt").write_text("notes")
    (out / "fabrics.png.d").mkdir()
    assert (out / "report.html").is_file()
    r = cli("plan", tmp_path / "c.toml", "-o", out, "--quiet", "--workers", "1", "--no-plots", "--no-exports",
            "--no-report")
    assert r.exit_code == 0, r.output
    assert not (out / "report.html").exists()  # the earlier plan's page: not written again
    assert (out / "ocs" / "my_notes.txt").read_text() == "notes"
    assert (out / "fabrics.png.d").is_dir()
    assert not (out / "patch_panel.csv").exists() and not (out / "ocs" / "port_map.csv").exists()
    assert json.loads((out / "plan.json").read_text())["files"] == ["plan.json"]
    assert cli("plan", "--check", out).exit_code == 0
    # a folder where a file goes: refused before the search, nothing changes
    (out / "hostfile").mkdir()
    before = snapshot(out)
    line = assert_one_line(cli("plan", tmp_path / "c.toml", "-o", out, "--quiet", "--workers", "1"), 2,
                           "hostfile")
    assert "in the way" in line and snapshot(out) == before
    # someone else's plan.json is never replaced
    other = tmp_path / "other"
    other.mkdir()
    (other / "plan.json").write_text('{"mine": true}')
    assert_one_line(cli("plan", tmp_path / "c.toml", "-o", other, "--quiet", "--workers", "1"), 2, "plan.json")
    assert (other / "plan.json").read_text() == '{"mine": true}'


def test_a_plan_from_before_the_files_list(tmp_path):
    """A plan.json without ``files`` (written before it listed them): a new plan replaces
    the files named like a plan's and nothing else; --check asks for a new plan."""
    (tmp_path / "c.toml").write_text(to_toml(tiny_config()))
    out = tmp_path / "out"
    assert cli("plan", tmp_path / "c.toml", "-o", out, "--quiet", "--workers", "1", "--no-plots").exit_code == 0
    doc = json.loads((out / "plan.json").read_text())
    del doc["files"], doc["skipped"]
    (out / "plan.json").write_text(json.dumps(doc))
    assert_one_line(cli("plan", "--check", out), 1, "has no files")
    (out / "ocs" / "notes.txt").write_text("mine")
    assert (out / "report.html").is_file()
    r = cli("plan", tmp_path / "c.toml", "-o", out, "--quiet", "--workers", "1", "--no-plots", "--no-exports",
            "--no-report")
    assert r.exit_code == 0, r.output
    assert not (out / "report.html").exists()  # the earlier plan's page: not written again
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == \
        ["ocs/notes.txt", "plan.json"]


# ---------------------------------------------------------- every example of issue 14
@pytest.fixture()
def cfg(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(to_toml(tiny_config()))
    return path


def _never_called(*a, **k):
    raise AssertionError("the work started before the output place was checked")


@pytest.mark.parametrize("args, name", [
    (["plan", "{cfg}", "-o", "/proc/foo"], "--output"),
    (["plan", "{cfg}", "-o", "{d}/afile.txt/sub"], "--output"),
    (["simulate", "{cfg}", "--json", "/proc/x.json"], "--json"),
    (["traffic", "{cfg}", "--png", "{d}/afile.txt/x.png"], "--png"),
    (["topology", "{cfg}", "--png", "/proc/x.png"], "--png"),
    (["react", "simulate", "--json", "/proc/x.json"], "--json"),
    (["react", "simulate", "--png", "{d}/afile.txt/x.png"], "--png"),
    (["validate", "{d}", "--json", "/proc/x.json"], "--json"),
    (["react", "pattern", "-o", "{d}"], "--output"),
])
def test_output_places_are_checked_before_the_work(tmp_path, cfg, monkeypatch, args, name):
    import topoopt.commands.plan as plan_cmd
    import topoopt.commands.react as react_cmd
    import topoopt.commands.simulate as simulate_cmd
    import topoopt.commands.traffic as traffic_cmd

    monkeypatch.setattr(plan_cmd, "make_plan", _never_called)
    monkeypatch.setattr(simulate_cmd, "simulate_fabrics", _never_called)
    monkeypatch.setattr(traffic_cmd, "derive_traffic", _never_called)
    monkeypatch.setattr(react_cmd, "run_scenario", _never_called)
    (tmp_path / "afile.txt").write_text("x")
    r = cli(*(a.format(cfg=cfg, d=tmp_path) for a in args))
    assert_one_line(r, 2, name)


@pytest.mark.parametrize("command", ["plan", "topology", "simulate"])
def test_negative_seed(cfg, tmp_path, command):
    extra = ["-o", tmp_path / "o"] if command == "plan" else []
    assert_one_line(cli(command, cfg, "--seed", "-5", *extra), 2, "--seed")


@pytest.mark.parametrize("table, name", [
    ({"plan": {"seed": "abc"}}, "plan.seed"),
    ({"plan": {"baselines": "ideal"}}, "plan.baselines"),
    ({"react": {"bogus": 1}}, "react.bogus"),
    ({"cluster": {"servers": 1_000_000_000, "nics": 2, "link_bandwidth": "100Gbps"}},
     "cluster.servers"),
    ({"cluster": {"servers": 4, "nics": 1_000_000, "link_bandwidth": "100Gbps"}},
     "cluster.nics"),
    ({"cluster": {"servers": 4, "nics": 2, "link_bandwidth": "1e9Tbps"}},
     "cluster.link_bandwidth"),
    ({"cluster": {"servers": 4, "nics": 2, "link_bandwidth": "100Gbps",
                  "gpus_per_server": 100_000}}, "cluster.gpus_per_server"),
])
def test_issue_config_examples(tmp_path, table, name):
    doc = tiny_config()
    for key, value in table.items():
        doc[key] = {**doc.get(key, {}), **value}
    (tmp_path / "c.toml").write_text(to_toml(doc))
    line = assert_one_line(cli("plan", tmp_path / "c.toml", "-o", tmp_path / "out"), 2, name)
    assert not (tmp_path / "out").exists()
    if name == "plan.baselines":
        assert "'i'" not in line


@pytest.mark.parametrize("ops, fix", [
    (TINY_OPS[:1], "only input operators"),
    ([TINY_OPS[0], {"name": "fc", "kind": "dense", "inputs": ["x"]}], "no operator does"),
])
def test_degenerate_custom_models(tmp_path, ops, fix):
    doc = tiny_config()
    doc["job"]["operators"] = ops
    (tmp_path / "c.toml").write_text(to_toml(doc))
    for command in ("plan", "simulate", "traffic"):
        extra = ["-o", tmp_path / "out"] if command == "plan" else []
        line = assert_one_line(cli(command, tmp_path / "c.toml", *extra), 2, "job.operators")
        assert fix in line
    assert not (tmp_path / "out").exists()


def test_batch_too_large_names_the_batch(tmp_path):
    doc = tiny_config()
    doc["job"]["operators"][2]["out_elems"] = 1_000_000_000
    (tmp_path / "c.toml").write_text(to_toml(doc))
    line = assert_one_line(cli("plan", tmp_path / "c.toml", "-o", tmp_path / "o"), 2,
                           "job.batch_per_gpu")
    assert "at most" in line and not (tmp_path / "o").exists()


def test_react_fabric_plan_that_is_a_file_or_repeats_a_server(world, plans, tmp_path):
    assert_one_line(cli("react", "simulate", "--fabric", f"plan:{world / 'afile.txt'}"), 2,
                    "--fabric", "not a folder")
    doc = json.loads((plans["dlrm"] / "plan.json").read_text())
    doc["rings"][0]["order"][1] = doc["rings"][0]["order"][0]
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    line = assert_one_line(cli("react", "simulate", "--collective", "plan", "--nodes", "8",
                               "--fabric", f"plan:{tmp_path}", "--epochs", "4", "--warmup",
                               "1"), 2, "--fabric")
    assert "Hamiltonian" in line
    # a hand-written plan.json (topology and rings only) is not a plan: refused by name
    links = [[i, 0, (i + 1) % 4, 0] for i in range(4)]
    (tmp_path / "plan.json").write_text(json.dumps(
        {"topology": {"servers": 4, "ports": 1, "links": links, "link_bandwidth": 1e11},
         "rings": [[0, 1, 1, 2, 3]]}))
    assert_one_line(cli("react", "simulate", "--collective", "plan", "--nodes", "4",
                        "--fabric", f"plan:{tmp_path}", "--epochs", "4", "--warmup", "1"),
                    2, "format")


def test_react_sizes_are_refused_up_front():
    assert_one_line(cli("react", "estimate", "--nodes", "100000"), 2, "--nodes")
    line = assert_one_line(cli("react", "estimate", "--nodes", "16", "--congest-out", "16:1"),
                           2, "--congest-out")
    assert not line.startswith("error: --congest =")


@pytest.mark.parametrize("args", [["traffic"], ["traffic", "x.toml", "--strategy", "foo"],
                                  ["plan", "--budget"], ["nosuch"], ["react", "pattern",
                                                                     "--nodes", "x"]])
def test_click_usage_errors_are_one_line(args):
    assert_one_line(cli(*args), 2)


@pytest.mark.parametrize("corrupt, name", [
    (lambda d: d["topology"].update(degree_mp=d["cluster"]["nics"]), "degree"),
    (lambda d: d["rings"][0].update(share=0.7), "rings[0].share"),
    (lambda d: d["topology"]["labels"].__setitem__(0, "fibre"), "topology.labels[0]"),
    (lambda d: d["topology"]["links"][0].__setitem__(1, 0.5), "topology.links[0]"),
    (lambda d: d["topology"].update(links="none"), "topology.links"),
    (lambda d: d.update(strategy={"op": 1}), "strategy"),
])
def test_issue_plan_corruptions(plans, tmp_path, corrupt, name):
    folder = tmp_path / "p"
    shutil.copytree(plans["dlrm"], folder)
    doc = json.loads((folder / "plan.json").read_text())
    corrupt(doc)
    (folder / "plan.json").write_text(json.dumps(doc))
    assert_one_line(cli("plan", "--check", folder), 1, name)


@pytest.mark.parametrize("remove", ["patch_panel.csv", "ocs", "msccl_allreduce.xml"])
def test_a_missing_export_is_caught(plans, tmp_path, remove):
    folder = tmp_path / "p"
    shutil.copytree(plans["dlrm"], folder)
    target = folder / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    assert_one_line(cli("plan", "--check", folder), 1, remove)


def test_a_deleted_multi_hop_route_is_caught(plans, tmp_path):
    folder = tmp_path / "p"
    shutil.copytree(plans["dlrm"], folder)
    doc = json.loads((folder / "plan.json").read_text())
    doc["routes"] = [r for r in doc["routes"] if all(len(q["path"]) == 2 for q in r["paths"])]
    (folder / "plan.json").write_text(json.dumps(doc))
    assert_one_line(cli("plan", "--check", folder), 1, "route")


def test_skipped_exports_are_named_with_the_reason(tmp_path):
    (tmp_path / "c.toml").write_text(to_toml(tiny_config(servers=2)))
    r = CliRunner().invoke(main, ["plan", str(tmp_path / "c.toml"), "-o", str(tmp_path / "o"),
                                  "--quiet", "--workers", "1", "--no-plots"])
    assert r.exit_code == 0, r.output
    assert "note: msccl_allreduce.xml not written: " in r.stderr
    assert "note: mscclpp_allreduce.json not written: " in r.stderr   # under 3 servers
    doc = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert set(doc["skipped"]) == {"msccl_allreduce.xml", "mscclpp_allreduce.json"}
    assert not set(doc["skipped"]) & set(doc["files"])
    assert cli("plan", "--check", tmp_path / "o").exit_code == 0


def test_sizes_are_refused_fast(tmp_path):
    """servers = 1e9 once ran out of memory after a minute; now it is refused up front."""
    import time

    doc = tiny_config()
    doc["cluster"]["servers"] = 10 ** 9
    (tmp_path / "c.toml").write_text(to_toml(doc))
    t0 = time.monotonic()
    assert_one_line(cli("traffic", tmp_path / "c.toml"), 2, "cluster.servers")
    assert time.monotonic() - t0 < 5


def test_io_errors_are_one_line(cfg, tmp_path, monkeypatch):
    """The last net: an OSError during the work (a disk filling up) is one line too."""
    import topoopt.commands.simulate as simulate_cmd

    def full(*a, **k):
        raise OSError(28, "No space left on device", str(tmp_path / "s.json"))

    monkeypatch.setattr(simulate_cmd, "atomic_write_text", full)
    r = cli("simulate", cfg, "--fabric", "ideal", "--json", tmp_path / "s.json")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1] == \
        f"error: {tmp_path / 's.json'}: No space left on device"
    assert os.listdir(tmp_path) == ["c.toml"]
