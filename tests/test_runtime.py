"""The real runtime on gloo: RCollective numerics for every pattern and world size 2-8
(before and after swaps), RTuner with fast, slow and dead leaders, and the launcher's
guarantees. Ranks are local processes on 127.0.0.1 (one process group per launch is
reused for many checks)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the runtime tests need torch (pip install "
                            "torch==2.13.0, the 'runtime' extra)")

from topoopt.react.runtime.launch import LaunchError, launch  # noqa: E402

LAUNCH_TIMEOUT = 120.0


def _stride_ring(n: int) -> list[int]:
    p = next((p for p in range(2, n) if np.gcd(p, n) == 1), 1)
    return [(i * p) % n for i in range(n)]


def _patterns(n: int):
    """Every pattern kind, with element counts that do not divide evenly."""
    from topoopt.collectives import (
        double_binary_tree_allreduce,
        multi_ring_allreduce,
        recursive_doubling_allgather,
        ring_allreduce,
    )

    yield double_binary_tree_allreduce(n, 4 * 1001)
    yield ring_allreduce(_stride_ring(n), 4 * 1003)               # a plan's ring order
    yield multi_ring_allreduce([list(range(n)), _stride_ring(n)[::-1]], 4 * 997)
    yield recursive_doubling_allgather(n, 4 * 13 * n)


def _transforms(p, n):
    """A global, a chunk and a position swap of ``p`` (what REACT applies)."""
    from topoopt.react.transforms import PositionSpace, Swap, apply_swap, candidate_swaps

    out = [apply_swap(p, Swap("global", 0, n - 1))]
    if p.chunks > 1:
        out.append(apply_swap(out[0], Swap("chunk", 0, n // 2, chunk=1)))
    space = PositionSpace.of(p, True)
    for node in range(n):
        found = [q for group in candidate_swaps(p, space, node) for s, q in group
                 if s.kind == "position"]
        if found:
            out.append(found[0])
            break
    return out


def _inputs(pattern, rank, world, seed):
    """This rank's int64 and float32 inputs (AllGather: its contribution)."""
    g = torch.Generator().manual_seed(seed * 131 + rank)
    size = pattern.elements if pattern.collective == "allreduce" else pattern.elements // world
    return (torch.randint(-10 ** 6, 10 ** 6, (size,), generator=g, dtype=torch.int64),
            torch.randn(size, generator=g))


def _references(pattern, inputs, world):
    """What torch.distributed computes from the same inputs."""
    import torch.distributed as dist

    refs = []
    for x in inputs:
        if pattern.collective == "allreduce":
            ref = x.clone()
            dist.all_reduce(ref)
        else:
            parts = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(parts, x)
            ref = torch.cat(parts)
        refs.append(ref)
    return refs


def _same(got, ref) -> bool:
    """Exact for integers and for gathered (copied) floats, allclose for summed floats."""
    if got.dtype.is_floating_point:
        return bool(torch.allclose(got, ref, rtol=1e-5, atol=1e-5))
    return bool(torch.equal(got, ref))


def _run_and_compare(pattern, inputs, refs, world, *, reduce_fn=None, rc=None, bound=True,
                     use_list=False, dtypes=(0, 1)) -> bool:
    ok = True
    extra = () if bound else (pattern,)
    for i in dtypes:
        x, ref = inputs[i], refs[i]
        if pattern.collective == "allreduce":
            y = x.clone()
            reduce_fn(y)
            ok &= _same(y, ref)
        elif use_list:
            got = [torch.empty_like(x) for _ in range(world)]
            rc.all_gather(got, x, *extra)
            ok &= _same(torch.cat(got), ref)
        else:
            out = torch.empty(pattern.elements, dtype=x.dtype)
            rc.all_gather_into_tensor(out, x, *extra)
            ok &= _same(out, ref)
    return ok


def numerics_worker(rank: int, world: int, cases) -> dict:
    """Every pattern and its swaps (through ReactCollective.swap) against the torch
    collective on the same inputs; the lock-step schedule, the module-level function and
    a subgroup once each."""
    import torch.distributed as dist

    from topoopt.react.runtime.collective import RCollective, all_reduce
    from topoopt.react.runtime.react_collective import ReactCollective

    failures = []
    for k, (p, swapped) in enumerate(cases):
        inputs = _inputs(p, rank, world, k)
        refs = _references(p, inputs, world)
        rc = ReactCollective(p, tune=False)
        versions = [p, *swapped]
        for version, q in enumerate(versions):
            if version:
                rc.swap(q)
            # integers on every version, floats on the first and the last
            dtypes = (0, 1) if version in (0, len(versions) - 1) else (0,)
            if not _run_and_compare(q, inputs, refs, world, reduce_fn=rc.all_reduce, rc=rc,
                                    use_list=version % 2 == 1, dtypes=dtypes):
                failures.append((p.name, version))
        assert rc.version == len(rc.changes) == len(swapped)
        rc.close()
        if k in (0, 3):        # the lock-step (single thread) schedule: tree and AllGather
            lock = RCollective(threads=False, batched=k == 3)   # batched: NCCL's way
            if not _run_and_compare(p, inputs, refs, world,
                                    reduce_fn=lambda t: lock.all_reduce(t, p), rc=lock,
                                    bound=False, use_list=True):
                failures.append((p.name, "lockstep"))
            lock.close()
        if k == 1 and not _run_and_compare(p, inputs, refs, world,
                                           reduce_fn=lambda t: all_reduce(t, p), dtypes=(0,)):
            failures.append((p.name, "function"))
    # a subgroup: pattern ranks are group ranks, p2p goes to the matching global ranks
    if world >= 3:
        from topoopt.collectives import double_binary_tree_allreduce

        members = list(range(1, world, 2)) if world >= 4 else [0, 2]
        sub = dist.new_group(members)
        if rank in members:
            rc = RCollective(sub)
            x = torch.full((101,), float(rank))
            rc.all_reduce(x, double_binary_tree_allreduce(len(members), 4 * 101))
            if not bool((x == float(sum(members))).all()):
                failures.append(("subgroup", members))
            rc.close()
    return {"failures": failures}


@pytest.fixture(scope="module", autouse=True)
def _warm_forkserver():
    """Start the forkserver (it imports torch once) before any timed launch."""
    launch(_noop, 1, timeout=LAUNCH_TIMEOUT)


def _noop(rank, world):
    return rank


@pytest.mark.parametrize("world", range(2, 9))
def test_every_pattern_equals_torch_collectives(world):
    # patterns and their transforms are built once here, not on every rank
    cases = [(p, _transforms(p, world)) for p in _patterns(world)]
    results = launch(numerics_worker, world, (cases,), timeout=LAUNCH_TIMEOUT)
    assert [r["failures"] for r in results] == [[]] * world


def errors_worker(rank, world):
    from topoopt.collectives import double_binary_tree_allreduce, recursive_doubling_allgather
    from topoopt.errors import ConfigError
    from topoopt.react.runtime.collective import RCollective

    rc = RCollective()
    p = double_binary_tree_allreduce(world, 4 * 10)
    caught = []
    for bad in (lambda: rc.all_reduce(torch.zeros(11), p),                     # wrong size
                lambda: rc.all_reduce(torch.zeros(10, 2)[:, 0], p),            # strided
                lambda: rc.all_reduce(torch.zeros(10), double_binary_tree_allreduce(
                    world + 1, 40)),                                           # wrong n
                lambda: rc.all_reduce(torch.zeros(8 * world),
                                      recursive_doubling_allgather(world, 32 * world))):
        try:
            bad()
        except ConfigError as exc:
            caught.append(str(exc).split(":")[0])
    rc.close()
    return caught


def test_rcollective_refuses_mismatched_tensors():
    caught = launch(errors_worker, 2, timeout=LAUNCH_TIMEOUT)[0]
    assert caught == ["tensor.numel = 11", "tensor = 'non-contiguous'", "pattern.ranks = 3",
                      "pattern = 'rd-allgather'"]


def flow_times_worker(rank, world):
    from topoopt.collectives import ring_allreduce
    from topoopt.react.runtime.collective import RCollective

    p = ring_allreduce(range(world), 4 * 4000)
    rc = RCollective()
    t = rc.all_reduce(torch.ones(4000), p)
    rc.close()
    return p.src.copy(), p.dst.copy(), t.to_array()


def test_every_flow_is_timed_by_both_ends():
    from topoopt.react.runtime.tuner import assemble_batch

    out = launch(flow_times_worker, 3, timeout=LAUNCH_TIMEOUT)
    src, dst, _ = out[0]
    rec = np.stack([o[2] for o in out])[:, None, :]
    E = len(src)
    for e in range(E):
        assert np.isfinite(rec[src[e], 0, 2 + e]) and np.isfinite(rec[dst[e], 0, 2 + 2 * E + e])
        others = [r for r in range(3) if r != src[e]]
        assert np.isnan(rec[others, 0, 2 + e]).all()
    r = assemble_batch(rec)
    assert (r.fct > 0).all() and (r.finish <= r.epoch_time[:, None] + 1e-6).all()
    # a flow starts only after the flows it depends on (Algorithm 2 order) arrived at
    # one of its ends -- both readings come from that rank's own clock
    from topoopt.collectives import flow_dependencies, ring_allreduce

    ptr, idx = flow_dependencies(ring_allreduce(range(3), 4 * 4000))
    checked = 0
    for e in range(E):
        for f in idx[ptr[e]:ptr[e + 1]]:
            if dst[f] in (src[e], dst[e]):
                assert r.start[0, e] >= r.finish[0, f]
                checked += 1
    assert checked >= E - 3


def pieces_worker(rank, world):
    """Flows cut into pieces (tiny ``piece_bytes``): the healthy tree and ring and their
    swaps against torch's all_reduce, and flow times per flow of the pattern."""
    import torch.distributed as dist

    from topoopt.collectives import double_binary_tree_allreduce, ring_allreduce
    from topoopt.react.runtime.collective import RCollective
    from topoopt.react.transforms import Swap, apply_swap

    out = []
    # one thread per piece, and a single lane per chunk (pieces run one after another
    # in one thread and share its scratch)
    for rc in (RCollective(piece_bytes=4 * 300), RCollective(piece_bytes=4 * 300, max_threads=1)):
        for p in (double_binary_tree_allreduce(world, 4 * 2001),
                  ring_allreduce(range(world), 4 * 2003)):
            for q in (p, apply_swap(p, Swap("global", 0, world - 1)),
                      apply_swap(p, Swap("chunk", 0, world // 2, chunk=1))):
                g = torch.Generator().manual_seed(rank)
                x = torch.randint(-10 ** 6, 10 ** 6, (q.elements,), generator=g,
                                  dtype=torch.int64)
                ref = x.clone()
                dist.all_reduce(ref)
                for _ in range(2):                  # the second call reuses the bound views
                    y = x.clone()
                    t = rc.all_reduce(y, q)
                    pieces = rc.schedule(q).edges // q.edges_count
                    out.append((bool(torch.equal(y, ref)), pieces,
                                t.send_post.shape[0] == q.edges_count))
        rc.close()
    return out


def test_pieces_keep_all_reduce_after_a_swap():
    out = launch(pieces_worker, 4, timeout=LAUNCH_TIMEOUT)
    for rows in out:
        assert all(same for same, _, _ in rows)
        assert all(pieces > 1 for _, pieces, _ in rows)      # the flows really were cut
        assert all(per_flow for _, _, per_flow in rows)


def reuse_worker(rank, world):
    """One buffer reduced again and again (the views RCollective binds to it are reused)
    while the pattern swaps back and forth, with pieces; then other buffers of the same
    pattern, a packed-send AllGather and a complex buffer, each against torch."""
    import torch.distributed as dist

    from topoopt.collectives import (
        double_binary_tree_allreduce,
        recursive_doubling_allgather,
        ring_allreduce,
    )
    from topoopt.react.runtime.collective import RCollective
    from topoopt.react.transforms import Swap, apply_swap

    rc = RCollective(piece_bytes=8 * 100)
    p = double_binary_tree_allreduce(world, 4 * 1001)
    q = apply_swap(p, Swap("global", 0, world - 1))
    r = ring_allreduce(range(world)[::-1], 4 * 1001)
    x = torch.empty(1001, dtype=torch.int64)
    ok = []
    g = torch.Generator().manual_seed(rank)
    for pattern in (p, q, p, r, q, r, p):
        x.copy_(torch.randint(-10 ** 6, 10 ** 6, (1001,), generator=g))
        ref = x.clone()
        dist.all_reduce(ref)
        rc.all_reduce(x, pattern)
        ok.append(bool(torch.equal(x, ref)))
    for _ in range(2):                              # new buffers, same patterns
        y = torch.randint(-10 ** 6, 10 ** 6, (1001,), generator=g)
        ref = y.clone()
        dist.all_reduce(ref)
        rc.all_reduce(y, q)
        ok.append(bool(torch.equal(y, ref)))
    z = torch.randn(1001, dtype=torch.complex64, generator=g)
    ref = z.clone()
    dist.all_reduce(ref)
    rc.all_reduce(z, double_binary_tree_allreduce(world, 4 * 1001))
    ok.append(bool(torch.allclose(z, ref, atol=1e-5)))
    ag = recursive_doubling_allgather(world, 4 * 99 * world)
    mine = torch.full((rc.schedule(ag).own_size,), rank + 1, dtype=torch.int64)
    ref = torch.zeros(ag.elements, dtype=torch.int64)
    for j, (a, b) in enumerate(ag.segments.tolist()):
        ref[a:b] = int(ag.owners[j]) + 1
    for _ in range(2):
        out = torch.zeros(ag.elements, dtype=torch.int64)
        rc.all_gather_into_tensor(out, mine, ag)
        ok.append(bool(torch.equal(out, ref)))
    rc.close()
    return ok


def test_a_reused_buffer_stays_exact_across_swaps():
    for ok in launch(reuse_worker, 3, timeout=LAUNCH_TIMEOUT):
        assert ok == [True] * len(ok) and len(ok) == 12


# ---------------------------------------------------------------------- RTuner
def tuner_worker(rank, world, mode):
    """ReactCollective + RTuner; ``mode``: hook (a leader that swaps every batch), slow
    (misses the first decision), dead (never answers), real (REACT's leader)."""
    from topoopt.collectives import double_binary_tree_allreduce
    from topoopt.react.loop import ReactParams
    from topoopt.react.runtime.react_collective import ReactCollective
    from topoopt.react.transforms import Swap, apply_swap

    p = double_binary_tree_allreduce(world, 4 * 500)
    known = {0: p}
    counter = [0]

    def decide(version, batch):
        if mode == "slow" and counter[0] == 0:
            time.sleep(0.5)
        if mode == "dead":
            threading.Event().wait(1.5)      # past the workers' control timeout
        counter[0] += 1
        q = apply_swap(known[version], Swap("global", 0, world - 1))
        known[counter[0]] = q
        return counter[0], q, ("0<->last",), False

    rc = ReactCollective(p, params=ReactParams(batch=2), slack=1,
                         decision_timeout=0.2 if mode in ("slow", "dead") else 5.0,
                         control_timeout=1.0 if mode == "dead" else 10.0,
                         decide=None if mode == "real" else decide)
    wrong = 0
    for epoch in range(24):
        x = torch.full((500,), float(rank + 1))
        rc.all_reduce(x)
        wrong += not bool((x == world * (world + 1) / 2).all())
        if mode == "slow":
            time.sleep(0.05)    # batch 0's switch point comes before its decision
    rc.close()
    return {"wrong": wrong, "versions": rc.versions, "changes": rc.changes,
            "dropped": rc.dropped, "timeouts": rc.tuner.timeouts,
            "tuner_alive": rc.tuner.error is None,
            "final": rc.pattern.src.tobytes() + rc.pattern.dst.tobytes()}


def _same_on_all_ranks(out, key):
    return all(o[key] == out[0][key] for o in out)


def test_tuner_switches_every_rank_at_the_same_epoch():
    out = launch(tuner_worker, 4, ("hook",), timeout=LAUNCH_TIMEOUT)
    assert [o["wrong"] for o in out] == [0] * 4
    for key in ("versions", "changes", "final", "dropped"):
        assert _same_on_all_ranks(out, key)
    # cycles of B + slack = 3 epochs: a new version at epochs 3, 6, ..., 21
    assert [c[0] for c in out[0]["changes"]] == list(range(3, 24, 3))
    assert out[0]["dropped"] == []


def test_slow_leader_only_delays_the_switch():
    out = launch(tuner_worker, 3, ("slow",), timeout=LAUNCH_TIMEOUT)
    assert [o["wrong"] for o in out] == [0] * 3
    for key in ("versions", "changes", "final", "dropped"):
        assert _same_on_all_ranks(out, key)
    assert 0 in out[0]["dropped"]             # batch 0's decision came too late
    assert out[0]["changes"]                   # later decisions were adopted
    assert all(o["tuner_alive"] for o in out)


def test_dead_leader_never_hangs_the_job():
    out = launch(tuner_worker, 3, ("dead",), timeout=LAUNCH_TIMEOUT)
    assert [o["wrong"] for o in out] == [0] * 3
    assert all(o["changes"] == [] for o in out)        # nobody switched
    assert all(set(o["versions"]) == {0} for o in out)
    assert not any(o["tuner_alive"] for o in out[1:])  # workers' control group timed out
    # one decision timeout, not one wait per batch (benchmarks/runtime_bench.py times it)
    assert all(o["timeouts"] <= 1 for o in out)


def test_real_leader_keeps_numerics():
    out = launch(tuner_worker, 4, ("real",), timeout=LAUNCH_TIMEOUT)
    assert [o["wrong"] for o in out] == [0] * 4
    for key in ("versions", "changes", "final"):
        assert _same_on_all_ranks(out, key)


# ---------------------------------------------------------------------- launcher
def _hang(rank, folder):
    """Say this rank's pid (in ``folder``), then block until killed."""
    pid = Path(folder) / f"{rank}.pid"
    pid.with_suffix(".tmp").write_text(str(os.getpid()))
    pid.with_suffix(".tmp").rename(pid)
    threading.Event().wait()


def _gone(folder, ranks) -> bool:
    """Whether every rank in ``ranks`` said its pid and no such process is left."""
    pids = [int((Path(folder) / f"{r}.pid").read_text()) for r in ranks]
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def failing_worker(rank, world, folder):
    if rank == 1:
        # fail once the others are waiting: the launcher must not wait for them
        others = [Path(folder) / f"{r}.pid" for r in range(world) if r != 1]
        while not all(p.exists() for p in others):
            time.sleep(0.01)
        raise RuntimeError("rank one is broken")
    _hang(rank, folder)


def hanging_worker(rank, world, folder):
    if rank == 0:
        _hang(rank, folder)
    return rank


def test_launch_reports_a_failing_rank_and_kills_the_rest(tmp_path):
    # the others never finish: a launcher that waited for them would hit its deadline
    # and say "did not finish" instead (benchmarks/runtime_bench.py times the launch)
    with pytest.raises(LaunchError, match="rank one is broken"):
        launch(failing_worker, 3, (str(tmp_path),), timeout=LAUNCH_TIMEOUT)
    assert _gone(tmp_path, (0, 2))


def test_launch_deadline_kills_a_hanging_rank(tmp_path):
    # rank 0 never finishes: only the deadline ends the launch
    with pytest.raises(LaunchError, match="did not finish"):
        launch(hanging_worker, 2, (str(tmp_path),), timeout=5.0)
    assert _gone(tmp_path, (0,))


# ---------------------------------------------------------------------- CLI
def test_react_run_prints_the_simulate_table(tmp_path):
    import json

    from click.testing import CliRunner

    from topoopt.cli import main

    out = tmp_path / "run.json"
    r = CliRunner().invoke(main, ["react", "run", "--nprocs", "2", "--size", "16kB",
                                  "--epochs", "8", "--warmup", "2", "--batch", "2",
                                  "--slack", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[1].split() == ["mean", "time", "p95", "time", "algbw", "GB/s"]
    assert lines[3].startswith("without REACT") and lines[4].startswith("with REACT")
    assert "algorithm bandwidth change" in r.output
    doc = json.loads(out.read_text())
    assert doc["wrong_epochs"] == 0 and len(doc["react"]["epoch_time_s"]) == 8
    assert doc["final_pattern"]["format"] == "topoopt.pattern/1"


@pytest.mark.parametrize("args, field", [
    (["--nprocs", "2", "--slow-rank", "1", "--network", "loopback"], "--network = "),
    (["--nprocs", "2", "--slow-rank", "2"], "--slow-rank = "),
    (["--collective", "multi-ring"], "--ring = "),
    (["--ring", "0,1,x"], "--ring = "),
    (["--nprocs", "1"], "Invalid value for '--nprocs'"),
])
def test_react_run_refuses_bad_input_in_one_line(args, field):
    from click.testing import CliRunner

    from topoopt.cli import main

    r = CliRunner().invoke(main, ["react", "run", "--epochs", "2", "--warmup", "1", *args])
    assert r.exit_code == 2
    line = r.output.strip()
    assert line.startswith("error: ") and field in line and "Traceback" not in r.output
    assert len(line.splitlines()) == 1
