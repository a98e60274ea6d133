"""Reliability, round 3 (issue 38): interrupts and races never lose a file, nothing
wrong is accepted silently.

Generated inputs (hypothesis, derandomized): Ctrl-C after a drawn number of the
search's polls, and at a drawn call while the plan's files are written (once: the
files finish; twice: the previous plan stays); cluster mixes; LLM and custom jobs
with a ``[plan] parallel`` table. A plan folder must always hold either the previous
plan, byte for byte, or a new one that passes ``plan --check``.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import topoopt.commands.plan as plan_command
import topoopt.interrupt as interrupt
from tests.test_bad_input import assert_one_line, snapshot, tiny_config, to_toml
from topoopt._io import LOCK_NAME, staging_dir
from topoopt.cli import main
from topoopt.export.plan_dir import _label_heatmap

PLAN = ["--quiet", "--workers", "1"]


def examples(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


class _StopAfter:
    """Stands in for the Ctrl-C flag: set once ``n`` polls have seen it clear."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def is_set(self) -> bool:
        self.calls += 1
        return self.calls > self.n

    def set(self) -> None:
        self.n = -1

    def clear(self) -> None:
        pass


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A config of two jobs (a tiny custom model on 4 x 2, a small DLRM on 8 x 2) and a
    finished plan of each, to plan over again."""
    d = tmp_path_factory.mktemp("rel")
    docs = {"custom": tiny_config(),
            "dlrm": tiny_config(8, 2, "dlrm", plan={"budget": 4, "rounds": 2})}
    for name, doc in docs.items():
        (d / f"{name}.toml").write_text(to_toml(doc))
        r = cli("plan", d / f"{name}.toml", "-o", d / f"{name}-prev", *PLAN, "--no-report")
        assert r.exit_code == 0, r.output
    return d


def _fresh_copy(world: Path, name: str, dest: Path) -> Path:
    import shutil
    shutil.copytree(world / f"{name}-prev", dest)
    return dest


# ------------------------------------------------------------- Ctrl-C in the search
@examples(8)
@given(st.sampled_from(["custom", "dlrm"]), st.integers(0, 400))
def test_ctrl_c_in_the_search_leaves_a_plan_that_passes_check(world, tmp_path_factory,
                                                             monkeypatch, name, polls):
    out = tmp_path_factory.mktemp("stop") / "p"
    monkeypatch.setattr(interrupt, "_STOP", _StopAfter(polls))
    r = cli("plan", world / f"{name}.toml", "-o", out, *PLAN, "--no-plots", "--no-report")
    monkeypatch.setattr(interrupt, "_STOP", threading.Event())
    assert r.exit_code == 0, r.output
    check = cli("plan", "--check", out)
    assert check.exit_code == 0, (polls, r.output, check.output)


# ------------------------------------------------------- Ctrl-C while files are written
@examples(8)
@given(st.integers(1, 3000), st.sampled_from([1, 2]))
def test_ctrl_c_while_writing_keeps_the_previous_plan_or_a_new_valid_one(
        world, tmp_path_factory, monkeypatch, at_call, presses):
    out = _fresh_copy(world, "dlrm", tmp_path_factory.mktemp("w") / "p")
    (out / "notes.txt").write_text("mine\n")
    before = snapshot(out)
    real = plan_command.write_plan
    calls = [0]

    def tracer(frame, event, arg):   # SIGINT at the ``at_call``-th Python call
        if event == "call":
            calls[0] += 1
            if calls[0] == at_call:
                for _ in range(presses):
                    os.kill(os.getpid(), signal.SIGINT)

    def write_plan(*a, **k):
        sys.setprofile(tracer)
        try:
            return real(*a, **k)
        finally:
            sys.setprofile(None)

    monkeypatch.setattr(plan_command, "write_plan", write_plan)
    r = cli("plan", world / "dlrm.toml", "-o", out, *PLAN, "--no-plots")
    assert "Traceback" not in r.output
    assert (out / "notes.txt").read_text() == "mine\n"
    assert not [p for p in out.iterdir() if p.name.startswith(".topoopt")]
    if r.exit_code == 0:
        check = cli("plan", "--check", out)
        assert check.exit_code == 0, check.output
    else:   # the second Ctrl-C abandoned the new files: the previous plan, as it was
        assert presses == 2 and calls[0] >= at_call, r.output
        assert snapshot(out) == before
    if presses == 1:
        assert r.exit_code == 0, r.output


def test_real_ctrl_c_leaves_the_previous_plan_or_a_valid_one(world, tmp_path):
    """A real SIGINT to a real process, after the search started and at the end."""
    out = _fresh_copy(world, "custom", tmp_path / "p")
    before = snapshot(out)
    for delay in (2.5, 6.0):
        proc = subprocess.Popen([sys.executable, "-m", "topoopt", "plan",
                                 str(world / "custom.toml"), "-o", str(out), *PLAN,
                                 "--no-plots"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            proc.wait(delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
        now = snapshot(out)
        if now != before:
            assert cli("plan", "--check", out).exit_code == 0
            before = now


# ------------------------------------------------------------------ staging and races
def test_failed_staging_removes_only_what_it_made(tmp_path):
    """The issue's loss: a run that made res/ must not remove res/a/notes, saved there
    by someone else while it ran."""
    with pytest.raises(KeyboardInterrupt):
        with staging_dir(tmp_path / "res" / "b") as stage:
            (stage / "plan.json").write_text("{}")
            (tmp_path / "res" / "a").mkdir()
            (tmp_path / "res" / "a" / "notes").write_text("mine")
            raise KeyboardInterrupt
    assert (tmp_path / "res" / "a" / "notes").read_text() == "mine"
    assert not (tmp_path / "res" / "b").exists()


def test_a_second_writer_is_refused_and_removes_nothing(world, tmp_path):
    out = _fresh_copy(world, "custom", tmp_path / "p")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from topoopt._io import folder_lock\n"
         f"with folder_lock({str(out)!r}):\n print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = snapshot(out)
        for args in (["plan", world / "custom.toml", "-o", out, *PLAN],
                     ["report", out]):
            line = assert_one_line(cli(*args), 2, "another topoopt run")
            assert str(holder.pid) in line
            assert snapshot(out) == before
    finally:
        holder.communicate("")
    assert not (out / LOCK_NAME).exists()
    assert cli("plan", world / "custom.toml", "-o", out, *PLAN, "--no-plots").exit_code == 0


@pytest.mark.parametrize("place", ["dangling", "fifo"])
def test_bad_output_places_are_refused_before_the_search(world, tmp_path, monkeypatch, place):
    target = tmp_path / "out"
    if place == "dangling":
        target.symlink_to(tmp_path / "nowhere")
    else:
        os.mkfifo(target)
    monkeypatch.setattr(plan_command, "make_plan", lambda *a, **k: pytest.fail("searched"))
    assert_one_line(cli("plan", world / "custom.toml", "-o", target, *PLAN), 2, "--output")
    assert_one_line(cli("simulate", world / "custom.toml", "--fabric", "ideal", "--json",
                        target), 2, "--json")


# ---------------------------------------------------------------- plan --check content
def test_swapped_or_foreign_heatmaps_fail_check(world, tmp_path):
    out = tmp_path / "p"
    assert cli("plan", world / "dlrm.toml", "-o", out, *PLAN, "--no-report").exit_code == 0
    assert cli("plan", "--check", out).exit_code == 0
    a, b = (out / "traffic_before.png").read_bytes(), (out / "traffic_after.png").read_bytes()
    (out / "traffic_before.png").write_bytes(b)
    (out / "traffic_after.png").write_bytes(a)
    assert_one_line(cli("plan", "--check", out), 1, "traffic_before.png")
    # a picture labelled as itself but of other traffic (another plan's)
    at = b.index(b"tEXttopoopt\0")
    size = struct.unpack(">I", b[at - 4:at])[0]
    (out / "traffic_before.png").write_bytes(b[:at - 4] + b[at + 8 + size:])
    _label_heatmap(out / "traffic_before.png", np.ones((8, 8)))
    (out / "traffic_after.png").write_bytes(b)
    line = assert_one_line(cli("plan", "--check", out), 1, "traffic_before.png")
    assert "traffic plan.json describes" in line


@pytest.mark.parametrize("text", ["{", "[1, 2]", '{"fabrics": 3}'])
def test_report_refuses_a_results_file_that_is_not_one(world, tmp_path, text):
    out = _fresh_copy(world, "custom", tmp_path / "p")
    (out / "validate.json").write_text(text)
    before = snapshot(out)
    assert_one_line(cli("report", out), 2, "validate.json")
    assert snapshot(out) == before


# ------------------------------------------------------------------ wrong input, by kind
CLUSTER = """
[cluster]
servers = 8
nics = 2
link_bandwidth = "100Gbps"
gpus_per_server = 1
[run]
fabrics = ["topoopt"]
iterations = 1
{jobs}
[plan]
strategy = "hybrid"
"""
MIX = """
[[mix]]
model = "ncf"
batch_per_gpu = 32
servers = 2
{amount}
size = {{ tables = 4, rows = 1000, top_layers = 2 }}
"""


@examples(40)
@given(st.lists(st.one_of(st.floats(0.05, 1.0).map(lambda s: ("share", round(s, 3))),
                          st.just(("count", 0))), min_size=1, max_size=3))
def test_cluster_mixes_that_do_not_add_up_are_one_line(tmp_path_factory, mix):
    shares = [v for k, v in mix if k == "share"]
    if shares and abs(sum(shares) - 1) <= 1e-6:
        return  # a valid split
    text = CLUSTER.format(jobs="jobs = 2" if shares else "") + "".join(
        MIX.format(amount=f"{k} = {v}") for k, v in mix)
    d = tmp_path_factory.mktemp("mix")
    (d / "c.toml").write_text(text)
    assert_one_line(cli("cluster", d / "c.toml", "--quiet"), 2, "mix.share", "mix.count")


@examples(30)
@given(st.sampled_from(["custom", "dlrm"]),
       st.dictionaries(st.sampled_from(["tp", "pp", "dp", "ep", "bogus", "micro"]),
                       st.integers(1, 8), min_size=1, max_size=3))
def test_plan_parallel_on_a_strategy_searched_job_is_refused(tmp_path_factory, model, par):
    d = tmp_path_factory.mktemp("par")
    doc = tiny_config(model=model)
    doc["plan"]["parallel"] = par
    (d / "c.toml").write_text(to_toml(doc))
    assert_one_line(cli("plan", d / "c.toml", "-o", d / "p", *PLAN), 2, "plan.parallel")
    assert not (d / "p").exists()


def test_config_with_a_byte_order_mark_is_read(tmp_path):
    (tmp_path / "c.toml").write_bytes(b"\xef\xbb\xbf" + to_toml(tiny_config()).encode())
    r = cli("traffic", tmp_path / "c.toml")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args, name", [
    (["--seed", str(2 ** 32)], "--seed"),
    (["--png", ""], "--png"),
    (["--json", ""], "--json"),
    (["--interval", "0s"], "--interval"),
    (["--latencies", "1h"], "--latencies"),
])
def test_sweep_reconfig_options(world, args, name):
    assert_one_line(cli("sweep-reconfig", world / "custom.toml", *args), 2, name)


def test_paths_with_a_newline_stay_on_one_line(world, tmp_path):
    out = tmp_path / "a\nb"
    r = cli("plan", world / "custom.toml", "-o", out, *PLAN, "--no-plots")
    assert r.exit_code == 0, r.output
    assert "a\\nb/" in r.output.splitlines()[-1]
    ok = cli("plan", "--check", out)
    assert ok.exit_code == 0 and len(ok.output.strip().splitlines()) == 1
    (out / "plan.json").write_text(json.dumps({"format": "nope"}))
    assert_one_line(cli("plan", "--check", out), 1)


@pytest.mark.parametrize("args, option", [
    (["react", "pattern", "--collective", "ring", "--nodes", "4", "--order", "0,1,2"], "--order"),
    (["react", "pattern", "--collective", "ring", "--nodes", "4", "--order", "0,1,1,2"],
     "--order"),
    (["react", "estimate", "--nodes", "4", "--congest", "1:99999999"], "--congest"),
    (["react", "run", "--nprocs", "4", "--collective", "ring", "--ring", "0,1,2"], "--ring"),
])
def test_react_orders_and_loads_are_refused_before_any_work(args, option):
    """An order that is not a permutation of the ranks, or an absurd p, is one line
    naming the option, exit 2; `react run` refuses before it starts a rank."""
    from topoopt.cli import main as cli_main
    result = CliRunner().invoke(cli_main, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option} = ")
