"""A step run in a forked child (topoopt.forked) and the plan folder written with it:
the child's result is the plain call's, a failure in the child is the plain call's
failure, and a plan folder is the same bytes whether its ecosystem files were written
in a child or not."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest

import topoopt.export.plan_dir as plan_dir
from topoopt.config import load_config
from topoopt.forked import Forked, fork_available
from topoopt.planners.planner import plan

needs_fork = pytest.mark.skipif(not fork_available(), reason="no fork on this platform")


def _pid_and(x):
    return os.getpid(), x * 2


def _raise(message):
    raise ValueError(message)


def _unpicklable():
    return lambda: None      # a lambda cannot be pickled back from the child


@needs_fork
def test_the_result_comes_from_a_child():
    big = list(range(200_000))           # inherited, not pickled on the way in
    pid, value = Forked(_pid_and, big).result()
    assert pid != os.getpid() and value == big * 2


def test_an_error_in_the_child_is_the_plain_calls():
    with pytest.raises(ValueError, match="the table's name"):
        Forked(_raise, "the table's name").result()


def test_a_result_that_cannot_come_back_is_computed_here():
    assert callable(Forked(_unpicklable).result())


def _files(d: Path) -> dict[str, bytes]:
    return {str(q.relative_to(d)): q.read_bytes() for q in sorted(d.rglob("*")) if q.is_file()}


@needs_fork
def test_a_plan_folder_is_the_same_written_with_a_child(tmp_path, monkeypatch):
    """The ecosystem files, the plots and the report in children: the same bytes."""
    pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
    pytest.importorskip("matplotlib")
    cfg = load_config(Path(__file__).parents[1] / "configs/dlrm-16.toml")
    p = plan(cfg.cluster, cfg.job, budget=2, rounds=1, chains=1, seed=0, baselines=("ideal",))
    out = {}
    for name, at in (("here", 10 ** 9), ("child", 1)):
        monkeypatch.setattr(plan_dir, "FORK_SERVERS", at)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan_dir.write_plan(p, tmp_path / name)
        out[name] = _files(tmp_path / name)
    assert any(k.startswith("chakra/") for k in out["child"])
    assert {"topology.png", "traffic_after.png", "report.html"} <= set(out["child"])
    assert out["child"] == out["here"]
    assert "plan.json" in plan_dir.check_plan_dir(tmp_path / "child", simulate=False)  # raises if not


def _slow(path):
    time.sleep(30)
    path.write_text("late")


@needs_fork
def test_a_cancelled_child_writes_nothing_after(tmp_path):
    """A caller that fails first stops its children (the staging folder is removed)."""
    child = Forked(_slow, tmp_path / "late.txt")
    child.cancel()
    assert child._process is None and not (tmp_path / "late.txt").exists()


@needs_fork
def test_a_failed_write_leaves_no_staging_folder(tmp_path, monkeypatch):
    cfg = load_config(Path(__file__).parents[1] / "configs/dlrm-16.toml")
    p = plan(cfg.cluster, cfg.job, budget=2, rounds=1, chains=1, seed=0, baselines=("ideal",))
    monkeypatch.setattr(plan_dir, "FORK_SERVERS", 1)

    def broken(*args, **kwargs):
        raise RuntimeError("exports broke")

    monkeypatch.setattr(plan_dir, "render_exports", broken)
    with pytest.raises(RuntimeError, match="exports broke"):
        plan_dir.write_plan(p, tmp_path / "out")
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir())    # no staging folder, no file
