"""The real runtime on gloo: RCollective vs torch.distributed.all_reduce, and REACT with a
slowed rank.

Part 1 (127.0.0.1): per-call AllReduce time of torch's gloo ``all_reduce`` and of
RCollective running the NCCL double binary tree and the ring pattern, 1-256 MB of
float32 on 8 ranks (RCollective's default 2 MiB pieces, or ``--piece-mib``). Built for a
noisy shared machine: one launch per size, rounds that call all three methods in an
order shuffled every round (a burst of outside load hits them alike, and each method
follows each other one as often: a call right after a different collective is slower,
so a fixed rotation would favour some), many rounds (40 at
1 MB ... 6 at 256 MB), and per method the median and interquartile range of the call
time (each call after a barrier, its time the slowest rank's), the ratio of medians and
the median of per-round ratios, plus the CPU seconds of a call summed over the ranks
relative to torch's. Then a swap as it happens: compiling the swapped tree's schedule,
the first call on it, calls that change pattern every time, and the old pattern alone.
The load average is printed at the start and after each launch.

Part 2 (network-namespace testbed, every rank link shaped with tc): the double binary
tree for ``--epochs`` epochs without and with REACT, with no congestion and with
``--flows`` greedy external TCP flows into one rank; mean/p95 epoch time after the
warm-up, the algorithm-bandwidth gain beside the fluid model's for the same setting
(``fluid_prediction``) and what the critical path spends at the slowed rank. Skipped (with the reason) where namespaces are unavailable.

Part 3 (127.0.0.1): how long failures take to end. A launch of 3 ranks whose rank 1
raises after 0.5 s while the others block (the launcher must report it at once, not
wait for them); a launch of 2 ranks, one blocking, with a 2.5 s deadline; and 24
epochs of a 500-element tree AllReduce on 3 ranks (B = 2, slack 1) without a tuner and
with a leader that never answers (decision timeout 0.2 s, control timeout 1 s: one
wait, not one per batch). ``tests/test_runtime.py`` checks the properties; this times
them.

Usage::

    nice -n 5 python benchmarks/runtime_bench.py [--quick] [--sizes 1,4,16,64,256]
        [--ranks 8] [--rounds 1.0] [--piece-mib 2] [--baseline main] [--epochs 60]
        [--skip-allreduce]
        [--skip-react] [--skip-failures] [--json OUT]
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


def _baseline_module(rev: str) -> str:
    """RCollective as of git revision ``rev`` (its ``collective.py`` and ``schedule.py``)
    written to a fresh package under ``/tmp``; returns the package's directory, to be
    put on ``sys.path`` as ``rcoll_baseline``."""
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    pkg = Path(tempfile.mkdtemp(prefix="rcoll-baseline-")) / "rcoll_baseline"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("collective", "schedule"):
        text = subprocess.run(["git", "-C", str(root), "show",
                               f"{rev}:topoopt/react/runtime/{name}.py"],
                              check=True, capture_output=True, text=True).stdout
        text = text.replace("from topoopt.react.runtime.schedule import",
                            "from rcoll_baseline.schedule import")
        (pkg / f"{name}.py").write_text(text)
    return str(pkg.parent)


def bench_worker(rank: int, world: int, sizes_mb, reps, warm: int, piece_bytes: float,
                 baseline: str | None = None) -> dict:
    """Interleaved calls of every method on every size in one process group.

    Per size: ``warm`` untimed calls of each method, then ``reps`` rounds; a round calls
    every method once, in an order shuffled each round (the same seed on every rank), so
    a burst of load on the shared machine hits all methods alike and no method always
    follows the same other one. Each call starts after a barrier;
    its time is the slowest rank's. Then a swap as it happens (see :func:`_swap_cost`).
    Rank 0 returns ``{(mb, method): seconds per round}`` and the swap rows.
    """
    import numpy as np
    import torch
    import torch.distributed as dist

    from topoopt.collectives import double_binary_tree_allreduce, ring_allreduce
    from topoopt.react.runtime.collective import RCollective

    rc = RCollective(piece_bytes=piece_bytes)
    old = None
    if baseline is not None:
        sys.path.insert(0, baseline)
        from rcoll_baseline.collective import RCollective as OldRCollective
        old = OldRCollective(piece_bytes=piece_bytes)
    out: dict = {}
    for mb, r in zip(sizes_mb, reps):
        n = int(mb * 1e6) // 4
        x = torch.ones(n)
        methods = {
            "torch": lambda t: dist.all_reduce(t),
            "tree": (lambda p: lambda t: rc.all_reduce(t, p))(
                double_binary_tree_allreduce(world, 4 * n)),
            "ring": (lambda p: lambda t: rc.all_reduce(t, p))(
                ring_allreduce(range(world), 4 * n)),
        }
        if old is not None:
            methods["tree@base"] = (lambda p: lambda t: old.all_reduce(t, p))(
                double_binary_tree_allreduce(world, 4 * n))
            methods["ring@base"] = (lambda p: lambda t: old.all_reduce(t, p))(
                ring_allreduce(range(world), 4 * n))
        names = list(methods)
        times = np.zeros((len(names), r))
        cpu = np.zeros((len(names), r))
        order = np.random.default_rng(int(mb * 1000) + world)
        for i in range(warm + r):
            for k in order.permutation(len(names)).tolist():
                x.fill_(1.0)
                dist.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                methods[names[k]](x)
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                if float(x[0]) != world or float(x[-1]) != world:
                    raise AssertionError(f"{names[k]} {mb} MB: wrong sum {float(x[0])}")
                if i >= warm:
                    times[k, i - warm], cpu[k, i - warm] = dt, dc
        t, c = torch.from_numpy(times), torch.from_numpy(cpu)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)       # a call lasts until its last rank
        dist.all_reduce(c)                             # CPU seconds of all ranks
        for k, name in enumerate(names):
            out[(mb, name)] = t[k].numpy().copy()
            out[(mb, name, "cpu")] = c[k].numpy().copy()
        out[(mb, "swap")] = _swap_cost(rc, x, world, warm)
        dist.barrier()
    rc.close()
    if old is not None:
        old.close()
    out["methods"] = names
    return out


def _swap_cost(rc, x, world: int, calls: int):
    """What one swap costs on the tree when it happens: compiling the swapped pattern's
    schedule, then ``calls`` calls on it, alternating with the old pattern (every call a
    pattern change), against ``calls`` calls on the old pattern alone (slowest rank's
    seconds, median of each)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from topoopt.collectives import double_binary_tree_allreduce
    from topoopt.react.transforms import Swap, apply_swap

    n = x.numel()
    old = double_binary_tree_allreduce(world, 4 * n)
    new = apply_swap(old, Swap("global", 0, world - 1))
    rc.schedule(old)
    dist.barrier()
    t0 = time.perf_counter()
    rc.schedule(new)
    compile_s = time.perf_counter() - t0
    seq = [new, old] * calls + [old] * calls
    times = []
    for p in seq:
        x.fill_(1.0)
        dist.barrier()
        t0 = time.perf_counter()
        rc.all_reduce(x, p)
        times.append(time.perf_counter() - t0)
        if float(x[0]) != world:
            raise AssertionError("wrong sum after a swap")
    t = torch.tensor([compile_s] + times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    t = t.numpy()
    k = 2 * calls
    return float(t[0]), float(t[1]), float(np.median(t[1:1 + k])), float(np.median(t[1 + k:]))


def _stats(t) -> tuple[float, float, float]:
    """Median and interquartile range (25th, 75th percentile) of ``t``."""
    import numpy as np

    q25, q50, q75 = np.percentile(t, [25, 50, 75])
    return float(q50), float(q25), float(q75)


def part1(sizes, reps, ranks, warm, piece_bytes, baseline_rev=None) -> list[dict]:
    import numpy as np

    from topoopt.react.runtime.launch import launch

    out = []
    print("Part 1: AllReduce on gloo, 127.0.0.1: interleaved rounds (torch, tree, ring in "
          "an order shuffled every round), each call's time the slowest rank's; median [25th-75th "
          "percentile] in ms; ratio = RCollective median / torch median, and the median of "
          "the per-round ratios (the two calls a few ms apart)")
    print("CPU: median CPU seconds of a call summed over the ranks, over torch's (less "
          "sensitive to other load than the wall clock)")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at the start; "
          f"pieces of {piece_bytes / 2**20:g} MiB\n")
    head = (f"{'ranks':>5} {'size':>6} {'rounds':>6} {'torch':>21} {'RColl tree':>21} "
            f"{'RColl ring':>21} {'tree/torch':>12} {'ring/torch':>12} {'CPU tree, ring':>15}")
    print(head)
    print("-" * len(head))

    def cell(t) -> str:
        m, a, b = _stats(t)
        return f"{m * 1e3:7.1f} [{a * 1e3:5.1f}-{b * 1e3:5.1f}]"

    baseline = _baseline_module(baseline_rev) if baseline_rev else None
    if baseline:
        print(f"(rows 'at {baseline_rev}': RCollective of git revision {baseline_rev}, "
              "called in the same rounds)")
    swaps = []
    for n in ranks:
        t0 = time.perf_counter()
        for mb, r in zip(sizes, reps):       # a launch per size: each row prints at once
            rows = launch(bench_worker, n, ((mb,), (r,), warm, piece_bytes, baseline),
                          timeout=7200)[0]
            tt, tr, ri = rows[(mb, "torch")], rows[(mb, "tree")], rows[(mb, "ring")]
            rt, rr = np.median(tr) / np.median(tt), np.median(ri) / np.median(tt)
            pt, pr = np.median(tr / tt), np.median(ri / tt)
            ct, ctr, cri = (np.median(rows[(mb, k, "cpu")]) for k in ("torch", "tree", "ring"))
            print(f"{n:>5} {mb:>4g}MB {r:>6} {cell(tt)} {cell(tr)} {cell(ri)} "
                  f"{rt:>5.2f} ({pt:4.2f}) {rr:>5.2f} ({pr:4.2f}) {ctr / ct:>7.2f} "
                  f"{cri / ct:>5.2f}", flush=True)
            if baseline:
                bt, bri = rows[(mb, "tree@base")], rows[(mb, "ring@base")]
                bct, bcr = (np.median(rows[(mb, k, "cpu")]) for k in ("tree@base", "ring@base"))
                print(f"{'at ' + baseline_rev[:9]:>12} {'':>6} {'':>21} {cell(bt)} {cell(bri)} "
                      f"{np.median(bt) / np.median(tt):>5.2f} ({np.median(bt / tt):4.2f}) "
                      f"{np.median(bri) / np.median(tt):>5.2f} ({np.median(bri / tt):4.2f}) "
                      f"{bct / ct:>7.2f} {bcr / ct:>5.2f}", flush=True)
                out_base = {"baseline_tree_s": _stats(bt), "baseline_ring_s": _stats(bri),
                            "baseline_tree_ratio": np.median(bt) / np.median(tt),
                            "baseline_ring_ratio": np.median(bri) / np.median(tt)}
            else:
                out_base = {}
            comp, first, alt, steady = rows[(mb, "swap")]
            swaps.append((n, mb, comp, first, alt, steady))
            out.append({"ranks": n, "size_mb": mb, "rounds": r,
                        **{f"{k}_s": _stats(v) for k, v in
                           (("torch", tt), ("rcoll_tree", tr), ("rcoll_ring", ri))},
                        "tree_ratio": rt, "ring_ratio": rr, "tree_paired_ratio": pt,
                        "ring_paired_ratio": pr, "cpu_s": {"torch": ct, "tree": ctr,
                                                           "ring": cri},
                        "swap_compile_s": comp,
                        "swap_first_call_s": first, "swap_alternating_s": alt,
                        "tree_steady_s": steady, **out_base})
        print(f"      ({time.perf_counter() - t0:.0f} s; load average "
              f"{os.getloadavg()[0]:.2f})", flush=True)
    print("\nA swap when it happens (tree, global swap of ranks 0 and n-1): compiling the "
          "new schedule, the first call on it, the median call when every call changes "
          "pattern, and the median call on the old pattern alone\n")
    head = (f"{'ranks':>5} {'size':>6} {'compile':>9} {'1st call':>10} {'alternating':>12} "
            f"{'steady':>10}")
    print(head)
    print("-" * len(head))
    for n, mb, comp, first, alt, steady in swaps:
        print(f"{n:>5} {mb:>4g}MB {comp * 1e3:>7.1f}ms {first * 1e3:>8.1f}ms "
              f"{alt * 1e3:>10.1f}ms {steady * 1e3:>8.1f}ms")
    return out


def part2(ranks, size_mb, epochs, warmup, flows, link_rate) -> list[dict]:
    from topoopt.react.loop import ReactParams
    from topoopt.react.runtime.experiment import RunSpec, SlowRank, fluid_prediction, run_runtime
    from topoopt.react.runtime.netem import netns_supported
    from topoopt.units import format_time

    ok, why = netns_supported()
    print(f"\nPart 2: REACT on the namespace testbed (tree AllReduce, {size_mb:g} MB, links "
          f"{link_rate / 1e6:g} Mbps, {epochs} epochs per run, means after epoch {warmup})\n")
    if not ok:
        print(f"skipped: {why}")
        return []
    head = (f"{'ranks':>5} {'congestion':<20} {'base mean':>10} {'base p95':>10} "
            f"{'REACT mean':>11} {'REACT p95':>10} {'gain':>7} {'fluid':>7} {'crit. at slow rank':>22}"
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
            fluid = fluid_prediction(spec, slow, link_rate).improvement
            crit = ""
            if r.share:
                (_, cb, sb), (_, cr, sr) = r.share["baseline"], r.share["react"]
                crit = f"{format_time(sb)}/{cb} -> {format_time(sr)}/{cr}"
            swaps = "; ".join(f"@{e}:{' '.join(sw) or 'revert'}" for e, _, sw, _ in r.changes)
            print(f"{n:>5} {what:<20} {format_time(r.mean('baseline')):>10} "
                  f"{format_time(r.p95('baseline')):>10} {format_time(r.mean('react')):>11} "
                  f"{format_time(r.p95('react')):>10} {100 * r.improvement:>+6.0f}% "
                  f"{100 * fluid:>+6.0f}% "
                  f"{crit:>22}  {swaps}  ({time.perf_counter() - t0:.0f} s)", flush=True)
            if r.wrong_epochs:
                print(f"      WARNING: {r.wrong_epochs} wrong results")
            out.append({"ranks": n, "flows": p, "fluid_improvement": fluid, **{k: v for k, v in r.to_json().items()
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


def _rounds(mb: float, scale: float) -> int:
    """Rounds per size: ~40 at 1 MB down to ~6 at 256 MB (a few seconds of each method)."""
    return max(3, int(round(scale * min(40.0, 40.0 / max(mb, 1.0) ** 0.34))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,16,64,256", help="MB, comma separated")
    ap.add_argument("--ranks", default="8")
    ap.add_argument("--rounds", type=float, default=1.0,
                    help="scale of the rounds per size (1: 40 at 1 MB ... 6 at 256 MB)")
    ap.add_argument("--piece-mib", type=float, default=2.0,
                    help="RCollective's piece_bytes in MiB (0: whole flows)")
    ap.add_argument("--baseline", metavar="REV",
                    help="also time RCollective as of this git revision (e.g. main) in "
                         "the same rounds")
    ap.add_argument("--epochs", type=int, default=60, help="epochs per run in part 2")
    ap.add_argument("--react-size", type=float, default=4.0, help="MB in part 2")
    ap.add_argument("--flows", type=int, default=2, help="external flows in part 2")
    ap.add_argument("--link-rate", type=float, default=400e6, help="bits/s in part 2")
    ap.add_argument("--quick", action="store_true",
                    help="sizes 1,16 MB, a quarter of the rounds, 30 epochs")
    ap.add_argument("--skip-allreduce", action="store_true", help="no part 1")
    ap.add_argument("--skip-react", action="store_true", help="no part 2")
    ap.add_argument("--skip-failures", action="store_true", help="no part 3")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    sizes = [float(x) for x in args.sizes.split(",")]
    ranks = [int(x) for x in args.ranks.split(",")]
    scale, epochs = args.rounds, args.epochs
    if args.quick:
        sizes, scale, epochs = [1.0, 16.0], scale / 4, 30
    res = {}
    if not args.skip_allreduce:
        res["allreduce"] = part1(sizes, [_rounds(mb, scale) for mb in sizes], ranks, 2,
                                 args.piece_mib * 2**20, args.baseline)
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
