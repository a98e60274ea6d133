"""MSCCL files per target runtime: each runtime's selection rule and limits, as read
from its source (msccl-executor-nccl c6f6b36 src/misc/msccl/msccl_lifecycle.cc lines
330-340; microsoft/msccl b23e9cd src/graph/tuning.cc lines 367-370, topo.cc 805-817)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from topoopt.errors import PlanCheckError
from topoopt.export.msccl import format_msccl_xml, parse_msccl_xml, ring_allreduce_algo
from topoopt.export.msccl_runtime import (
    LEGACY_MAX_BYTES,
    MSCCL_RUNTIMES,
    check_msccl_runtime,
    for_runtime,
    msccl_launch_env,
    msccl_selects,
    runtime_of,
)

ALGO = ring_allreduce_algo([(0, 1, 2, 3), (0, 2, 1, 3)])   # 8 chunks per loop, 4 ranks


@pytest.mark.parametrize("runtime", MSCCL_RUNTIMES)
def test_each_runtime_picks_its_file_for_bucket_sized_calls(runtime):
    algo = parse_msccl_xml(format_msccl_xml(for_runtime(ALGO, runtime)))
    check_msccl_runtime(algo, runtime)
    assert runtime_of(algo) == runtime
    for count in (8, 8 * 1024, 25 * 2**20 // 4 // 8 * 8, 2**34):  # to 64 GiB of fp32
        assert msccl_selects(algo, runtime, count, 4, 4, in_place=True)
    assert not msccl_selects(algo, runtime, 12, 4, 4, in_place=True)   # not a multiple of 8
    assert not msccl_selects(algo, runtime, 8, 4, 8, in_place=True)    # ngpus != nranks


def test_max_bytes_zero_is_never_picked_by_microsoft_msccl():
    executor = for_runtime(ALGO, "msccl-executor-nccl")
    assert executor.maxBytes == 0
    assert not msccl_selects(executor, "msccl", 1024, 4, 4, in_place=True)  # nBytes < 0
    with pytest.raises(PlanCheckError, match="tuning.cc line 370"):
        check_msccl_runtime(executor, "msccl")


def test_microsoft_msccl_reads_inplace_only():
    legacy = for_runtime(ALGO, "msccl")
    assert legacy.maxBytes == LEGACY_MAX_BYTES and legacy.inplace == 1
    assert not msccl_selects(legacy, "msccl", 1024, 4, 4, in_place=False)
    executor = for_runtime(ALGO, "msccl-executor-nccl")
    assert msccl_selects(executor, "msccl-executor-nccl", 1024, 4, 4, in_place=False)


@pytest.mark.parametrize("edit, rule", [
    ({"nchannels": 33}, "MAXCHANNELS"),
    ({"name": "x" * 64}, "63"),
    ({"minBytes": LEGACY_MAX_BYTES}, "nBytes < maxBytes"),
])
def test_microsoft_msccl_limits(edit, rule):
    with pytest.raises(PlanCheckError, match=rule):
        check_msccl_runtime(replace(for_runtime(ALGO, "msccl"), **edit), "msccl")


def test_executor_rules_and_launch_settings():
    bad = replace(for_runtime(ALGO, "msccl-executor-nccl"), inplace=0, outofplace=0)
    with pytest.raises(PlanCheckError, match="msccl_lifecycle.cc"):
        check_msccl_runtime(bad, "msccl-executor-nccl")
    assert msccl_launch_env("msccl", "DIR/msccl_allreduce.xml") == {
        "MSCCL_XML_FILES": "DIR/msccl_allreduce.xml"}
    assert msccl_launch_env("msccl-executor-nccl", "DIR/msccl_allreduce.xml") == {
        "NCCL_MSCCL_ENABLE": "1", "MSCCL_ALGO_DIR": "DIR"}
