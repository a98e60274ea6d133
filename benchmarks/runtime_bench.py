"""The real runtime on gloo: RCollective vs torch.distributed.all_reduce, and REACT with a
slowed rank.

Part 1 (127.0.0.1): per-call AllReduce time of torch's gloo ``all_reduce`` and of
RCollective running the NCCL double binary tree and the ring pattern, 1-64 MB of
float32, 4 and 8 ranks (flows cut into 1 MiB pieces, RCollective's default). Then a swap
as it happens: compiling the swapped tree's schedule, and the first call with it (the
tree's own median is the steady-state time to compare with). Each rank times every call after a barrier; a call's time is the
slowest rank's, and the table shows the median over the timed calls and the ratio to
torch (> 1: RCollective is slower).

Part 2 (network-namespace testbed, every rank link shaped with tc): the double binary
tree for ``--epochs`` epochs without and with REACT, with no congestion and with
``--flows`` greedy external TCP flows into one rank; mean/p95 epoch time after the
warm-up, the algorithm-bandwidth gain and what the critical path spends at the slowed
rank. Skipped (with the reason) where namespaces are unavailable.

Part 3 (127.0.0.1): how long failures take to end. A launch of 3 ranks whose rank 1
raises after 0.5 s while the others block (the launcher must report it at once, not
wait for them); a launch of 2 ranks, one blocking, with a 2.5 s deadline; and 24
epochs of a 500-element tree AllReduce on 3 ranks (B = 2, slack 1) without a tuner and
with a leader that never answers (decision timeout 0.2 s, control timeout 1 s: one
wait, not one per batch). ``tests/test_runtime.py`` checks the properties; this times
them.

Usage::

    python benchmarks/runtime_bench.py [--quick] [--sizes 1,4,16,64] [--ranks 4,8]
                                       [--epochs 60] [--skip-react] [--skip-failures]
                                       [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def bench_worker(rank: int, world: int, sizes_mb, iters: int, warm: int) -> dict:
    """Every method on every size in one process group; rank 0 returns the table rows."""
    import torch
    import torch.distributed as dist

    from topoopt.collectives import double_binary_tree_allreduce, ring_allreduce
    from topoopt.react.runtime.collective import RCollective

    rc = RCollective()
    rows = {}
    for mb in sizes_mb:
        n = int(mb * 1e6) // 4
        x = torch.ones(n)
        methods = {
            "torch": lambda t: dist.all_reduce(t),
            "tree": (lambda p: lambda t: rc.all_reduce(t, p))(
                double_binary_tree_allreduce(world, 4 * n)),
            "ring": (lambda p: lambda t: rc.all_reduce(t, p))(
                ring_allreduce(range(world), 4 * n)),
        }
        for name, fn in methods.items():
            times = []
            for i in range(warm + iters):
                x.fill_(1.0)
                dist.barrier()
                t0 = time.perf_counter()
                fn(x)
                dt = time.perf_counter() - t0
                if i >= warm:
                    times.append(dt)
            assert float(x[0]) == world and float(x[-1]) == world
            t = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)       # a call lasts until its last rank
            rows[(mb, name)] = float(t.median())
        # a swap when it happens: compiling the swapped tree, and its first call
        from topoopt.react.transforms import Swap, apply_swap

        q = apply_swap(double_binary_tree_allreduce(world, 4 * n), Swap("global", 0, world - 1))
        dist.barrier()
        t0 = time.perf_counter()
        rc.schedule(q)
        compile_s = time.perf_counter() - t0
        x.fill_(1.0)
        dist.barrier()
        t0 = time.perf_counter()
        rc.all_reduce(x, q)
        first = time.perf_counter() - t0
        assert float(x[0]) == world
        t = torch.tensor([compile_s, first], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        rows[(mb, "swap")] = (float(t[0]), float(t[1]))
        dist.barrier()
    rc.close()
    return rows


def part1(sizes, ranks, iters, warm) -> list[dict]:
    from topoopt.react.runtime.launch import launch

    out = []
    print("Part 1: AllReduce on gloo, 127.0.0.1 (median of the slowest rank's call time)\n")
    head = (f"{'ranks':>5} {'size':>6} {'torch':>10} {'RColl tree':>11} {'RColl ring':>11}"
            f" {'tree/torch':>11} {'ring/torch':>11} {'swap: compile':>14} {'1st call':>9}")
    print(head)
    print("-" * len(head))
    for n in ranks:
        t0 = time.perf_counter()
        rows = launch(bench_worker, n, (tuple(sizes), iters, warm), timeout=3600)[0]
        for mb in sizes:
            tt, tr, ri = rows[(mb, "torch")], rows[(mb, "tree")], rows[(mb, "ring")]
            comp, first = rows[(mb, "swap")]
            print(f"{n:>5} {mb:>4g}MB {tt * 1e3:>8.1f}ms {tr * 1e3:>9.1f}ms "
                  f"{ri * 1e3:>9.1f}ms {tr / tt:>11.2f} {ri / tt:>11.2f} "
                  f"{comp * 1e3:>12.1f}ms {first * 1e3:>7.0f}ms", flush=True)
            out.append({"ranks": n, "size_mb": mb, "torch_s": tt, "rcoll_tree_s": tr,
                        "rcoll_ring_s": ri, "swap_compile_s": comp, "swap_first_call_s": first})
        print(f"      ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def part2(ranks, size_mb, epochs, warmup, flows, link_rate) -> list[dict]:
    from topoopt.react.loop import ReactParams
    from topoopt.react.runtime.experiment import RunSpec, SlowRank, run_runtime
    from topoopt.react.runtime.netem import netns_supported
    from topoopt.units import format_time

    ok, why = netns_supported()
    print(f"\nPart 2: REACT on the namespace testbed (tree AllReduce, {size_mb:g} MB, links "
          f"{link_rate / 1e6:g} Mbps, {epochs} epochs per run, means after epoch {warmup})\n")
    if not ok:
        print(f"skipped: {why}")
        return []
    head = (f"{'ranks':>5} {'congestion':<20} {'base mean':>10} {'base p95':>10} "
            f"{'REACT mean':>11} {'REACT p95':>10} {'gain':>7} {'crit. at slow rank':>22}"
            f"  swaps")
    print(head)
    print("-" * (len(head) + 20))
    out = []
    for n in ranks:
        slow_rank = 2
        for p in (0, flows):
            spec = RunSpec("tree", n, size_mb * 1e6, epochs=epochs, warmup=warmup,
                           params=ReactParams(batch=6), slack=5)
            slow = SlowRank(slow_rank, "flows", p) if p else None
            t0 = time.perf_counter()
            r = run_runtime(spec, slow, network="netns", link_rate=link_rate, timeout=3600)
            what = f"{p} flows into rank {slow_rank}" if p else "none"
            crit = ""
            if r.share:
                (_, cb, sb), (_, cr, sr) = r.share["baseline"], r.share["react"]
                crit = f"{format_time(sb)}/{cb} -> {format_time(sr)}/{cr}"
            swaps = "; ".join(f"@{e}:{' '.join(sw) or 'revert'}" for e, _, sw, _ in r.changes)
            print(f"{n:>5} {what:<20} {format_time(r.mean('baseline')):>10} "
                  f"{format_time(r.p95('baseline')):>10} {format_time(r.mean('react')):>11} "
                  f"{format_time(r.p95('react')):>10} {100 * r.improvement:>+6.0f}% "
                  f"{crit:>22}  {swaps}  ({time.perf_counter() - t0:.0f} s)", flush=True)
            if r.wrong_epochs:
                print(f"      WARNING: {r.wrong_epochs} wrong results")
            out.append({"ranks": n, "flows": p, **{k: v for k, v in r.to_json().items()
                                                    if k in ("baseline", "react",
                                                             "improvement", "changes",
                                                             "critical_share")}})
    return out


def _noop(rank: int, world: int) -> int:
    return rank


def _failing_rank(rank: int, world: int) -> None:
    if rank == 1:
        time.sleep(0.5)
        raise RuntimeError("rank one fails")
    threading.Event().wait()


def _hanging_rank(rank: int, world: int) -> int:
    if rank == 0:
        threading.Event().wait()
    return rank


def _dead_leader(rank: int, world: int, tune: bool) -> tuple[float, int]:
    """Seconds of 24 epochs (and the tuner's timed-out waits) with a leader that never
    answers in time, or without a tuner."""
    import torch

    from topoopt.collectives import double_binary_tree_allreduce
    from topoopt.react.loop import ReactParams
    from topoopt.react.runtime.react_collective import ReactCollective

    p = double_binary_tree_allreduce(world, 4 * 500)

    def decide(version, batch):
        threading.Event().wait(1.5)         # past the workers' control timeout
        return version, p, (), False

    rc = ReactCollective(p, params=ReactParams(batch=2), slack=1, decision_timeout=0.2,
                         control_timeout=1.0, decide=decide, tune=tune)
    x = torch.ones(500)
    t0 = time.perf_counter()
    for _ in range(24):
        rc.all_reduce(x)
    elapsed = time.perf_counter() - t0
    timeouts = rc.tuner.timeouts if rc.tuner is not None else 0
    rc.close()
    return elapsed, timeouts


def part3() -> list[dict]:
    from topoopt.react.runtime.launch import LaunchError, launch

    print("\nPart 3: how long failures take to end (127.0.0.1)\n")
    launch(_noop, 1, timeout=120)            # the forkserver imports torch once
    out = []

    def row(what: str, seconds: float, note: str = "") -> None:
        print(f"  {what:<58} {seconds:6.2f} s  {note}", flush=True)
        out.append({"case": what, "seconds": seconds, "note": note})

    for what, fn, n, timeout in (
            ("3 ranks, rank 1 raises after 0.5 s, the others block", _failing_rank, 3, 120.0),
            ("2 ranks, rank 0 blocks, deadline 2.5 s", _hanging_rank, 2, 2.5)):
        t0 = time.perf_counter()
        try:
            launch(fn, n, timeout=timeout)
            note = "no error?"
        except LaunchError as exc:
            note = str(exc).splitlines()[0][:40]
        row(what, time.perf_counter() - t0, note)
    for tune in (False, True):
        res = launch(_dead_leader, 3, (tune,), timeout=120)
        what = ("24 epochs, leader never answers" if tune else "24 epochs, no tuner")
        row(what, max(r[0] for r in res),
            f"timed-out waits per rank: {[r[1] for r in res]}" if tune else "")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,16,64", help="MB, comma separated")
    ap.add_argument("--ranks", default="4,8")
    ap.add_argument("--iters", type=int, default=5, help="timed calls per point")
    ap.add_argument("--epochs", type=int, default=60, help="epochs per run in part 2")
    ap.add_argument("--react-size", type=float, default=4.0, help="MB in part 2")
    ap.add_argument("--flows", type=int, default=2, help="external flows in part 2")
    ap.add_argument("--link-rate", type=float, default=400e6, help="bits/s in part 2")
    ap.add_argument("--quick", action="store_true",
                    help="sizes 1,16 MB, 3 calls, 30 epochs")
    ap.add_argument("--skip-react", action="store_true", help="no part 2")
    ap.add_argument("--skip-failures", action="store_true", help="no part 3")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    sizes = [float(x) for x in args.sizes.split(",")]
    ranks = [int(x) for x in args.ranks.split(",")]
    iters, epochs = args.iters, args.epochs
    if args.quick:
        sizes, iters, epochs = [1.0, 16.0], 3, 30
    res = {"allreduce": part1(sizes, ranks, iters, warm=2)}
    if not args.skip_react:
        res["react"] = part2(ranks, args.react_size, epochs, min(epochs // 3, 20),
                             args.flows, args.link_rate)
    if not args.skip_failures:
        res["failures"] = part3()
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
