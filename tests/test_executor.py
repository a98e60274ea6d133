"""Executors give the same results in task order, wherever the tasks run."""

import multiprocessing
import sys
import threading
import time

import pytest

from topoopt.errors import TopoOptError
from topoopt.executor import PoolExecutor, chunked, make_executor, pool_start_method
from topoopt.units import parse_size  # importable by pool and Ray workers

ITEMS = [f"{seed}.{seed % 5}MB" for seed in range(12)]


def test_serial_and_pool_agree():
    with make_executor(1) as serial:
        expected = serial.map(parse_size, ITEMS)
    with make_executor(2) as pool:
        assert pool.name == "pool"
        assert pool.map(parse_size, ITEMS) == expected


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                    reason="no fork on this platform")
def test_forked_and_spawned_workers_agree():
    with make_executor(1) as serial:
        expected = serial.map(parse_size, ITEMS)
    for method in ("fork", "spawn"):
        with PoolExecutor(2, start_method=method) as pool:
            assert pool.start_method == method
            assert pool.map(parse_size, ITEMS) == expected


def test_a_process_running_threads_spawns_its_workers():
    # forking a threaded process can leave the child a lock held forever
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert pool_start_method() == "spawn"
    finally:
        release.set()
        other.join()
    if threading.active_count() == 1 and sys.platform.startswith("linux"):
        assert pool_start_method() == "fork"


def test_a_submitted_task_gives_its_result_after_a_later_map():
    # the planner submits the Expander's search, then maps the Ideal Switch's
    for workers in (1, 2):
        with make_executor(workers) as ex:
            pending = ex.submit(parse_size, ITEMS[-1])
            assert ex.map(parse_size, ITEMS[:-1]) == [parse_size(x) for x in ITEMS[:-1]]
            assert pending.result() == parse_size(ITEMS[-1])


def test_next_done_names_a_task_that_ended():
    # the planner starts cross-seeding as each search ends, whichever ends first
    with make_executor(2) as pool:
        pending = [pool.submit(time.sleep, 8), pool.submit(time.sleep, 0)]
        assert pool.next_done(pending) == 1 and not pending[0].done()
    with make_executor(1) as serial:
        assert serial.next_done([serial.submit(parse_size, "1MB")]) == 0
        with pytest.raises(ValueError):
            serial.next_done([])


@pytest.mark.slow
def test_ray_local_agrees(monkeypatch, tmp_path):
    pytest.importorskip("ray", reason="Ray not installed: pip install 'topoopt[ray]'")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with make_executor(1) as serial:
        expected = serial.map(parse_size, ITEMS)
    with make_executor(2, ray=True) as ray_exec:
        assert ray_exec.name == "ray"
        assert ray_exec.map(parse_size, ITEMS) == expected
        assert ray_exec.submit(parse_size, ITEMS[3]).result() == expected[3]
        pending = [ray_exec.submit(time.sleep, 60), ray_exec.submit(parse_size, ITEMS[4])]
        assert ray_exec.next_done(pending) == 1 and pending[1].result() == expected[4]


def test_bad_workers():
    with pytest.raises(TopoOptError, match="--workers"):
        make_executor(0)


def test_chunked():
    assert chunked(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert chunked([1], 4) == [[1]]
