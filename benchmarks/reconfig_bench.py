"""Reconfigurable fabrics against TopoOpt: the Figure 11 bars and the Figure 17 sweep.

Figure 11 (TopoOpt §5.3): n = 128 servers, d = 4, B = 100 Gb/s; for each of the six
workloads the iteration time of TopoOpt, the Ideal Switch, OCS-reconfig (forwarding,
10 ms per change, demand measured every 50 ms; its idle ports keep their circuits, and,
as in the paper's simulator, wired anew at every measurement), OCS-reconfig-noFW and
SiP-ML (25 us, every 125 us), with ratios to TopoOpt. Figure 17 (§5.7): DLRM and BERT,
OCS-reconfig-FW and -noFW at latencies 1 us .. 10 ms (demand measured every 5 x
latency), TopoOpt as a constant; then the paper's three observations checked:
noFW ~ TopoOpt near 1 us; BERT: FW ~1.4x slower than noFW; DLRM: FW faster than noFW.

Strategies: ``--strategies structured`` (default) uses, per model, the better on TopoOpt
of data parallel and DLRM-style hybrid (hybrid for DLRM and NCF, data parallel for the
others), the same strategy on every fabric; ``--strategies plan`` takes TopoOpt's
strategy from ``topoopt.plan`` at ``--plan-budget`` moves (one round, no baselines).

Usage: python benchmarks/reconfig_bench.py [--models dlrm,bert,...] [--sweep-models
       dlrm,bert] [--latencies 1e-6,...] [--skip-fig11] [--skip-fig17] [--png FILE]
       [--strategies structured|plan] [--plan-budget 40] [--iterations 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from topoopt.cluster import Cluster, Job
from topoopt.estimate import estimate_iteration
from topoopt.fabrics.catalog import build_fabric
from topoopt.fabrics.reconfigurable import ocs_reconfig, reconfiguration_of, sip_ml
from topoopt.planners.planner import plan
from topoopt.reconfig import PAPER_LATENCIES, ReconfigEstimator, latency_sweep
from topoopt.strategy import data_parallel, hybrid
from topoopt.workloads import model_of

#: Per-GPU batch of the TopoOpt evaluation scripts (NOTES.md, §5).
BATCH = {"dlrm": 128, "candle": 256, "bert": 16, "ncf": 128, "resnet50": 128, "vgg16": 64}
#: The better of dp / hybrid on the TopoOpt shard at n = 128, d = 4, B = 100 Gb/s.
STRUCTURED = {"dlrm": "hybrid", "ncf": "hybrid", "candle": "dp", "bert": "dp",
              "resnet50": "dp", "vgg16": "dp"}
#: What §5.3 says of the two fabrics per model (no numbers are given for them).
PAPER_FIG11 = {"dlrm": "SiP-ML poor (MP needs many reconfigurations)",
               "ncf": "SiP-ML poor (MP needs many reconfigurations)",
               "candle": "SiP-ML ~ TopoOpt; OCS-reconfig poor",
               "bert": "SiP-ML ~ TopoOpt (like CANDLE)",
               "vgg16": "SiP-ML ~ TopoOpt (like CANDLE)",
               "resnet50": "most fabrics alike (compute bound)"}


def _strategy(name, model, cluster, job, how, budget, seed):
    if how == "plan":
        p = plan(cluster, job, budget=budget, rounds=1, seed=seed, baselines=())
        return "plan", p.strategy
    kind = STRUCTURED[name]
    return kind, (hybrid if kind == "hybrid" else data_parallel)(model, cluster.servers)


def _reconfig(model, strategy, cluster, job, fabric, iterations):
    spec = dataclasses.replace(reconfiguration_of(fabric), iterations=iterations)
    t0 = time.perf_counter()
    run = ReconfigEstimator(model, cluster, job, fabric, spec=spec).run(strategy)
    return run, time.perf_counter() - t0


def fig11(args, cluster) -> None:
    n, d, b = cluster.servers, cluster.nics, cluster.link_bandwidth
    print(f"\nFigure 11: {n} servers x {d} x {b / 1e9:g} Gb/s; iteration time (ms), "
          f"ratio to TopoOpt; {args.iterations} iterations per reconfigurable run, "
          "the first a warm-up")
    cols = ("topoopt", "ideal", "ocs-fw", "ocs-fw-rw", "ocs-nofw", "sipml")
    head = f"{'model':9} {'strategy':8} " + " ".join(f"{c:>10}" for c in cols) + \
        "   " + " ".join(f"{c + '/TO':>12}" for c in cols[2:]) + "  wall s"
    print(head)
    print("-" * len(head))
    notes = []
    for name in args.models.split(","):
        job = Job(name, batch_per_gpu=BATCH[name])
        model = model_of(job)
        kind, strategy = _strategy(name, model, cluster, job, args.strategies,
                                   args.plan_budget, args.seed)
        t = {}
        t0 = time.perf_counter()
        for fab in ("topoopt", "ideal"):
            f = build_fabric(fab, cluster, job=job, model=model, strategy=strategy)
            t[fab] = estimate_iteration(model, strategy, cluster, job, f).total
        extra = {}
        for col, fabric in (("ocs-fw", ocs_reconfig(n, d, b)),
                            ("ocs-fw-rw", ocs_reconfig(n, d, b, idle="rewire")),
                            ("ocs-nofw", ocs_reconfig(n, d, b, forwarding=False)),
                            ("sipml", sip_ml(n, d, b))):
            run, wall = _reconfig(model, strategy, cluster, job, fabric, args.iterations)
            t[col] = run.estimate.total
            extra[col] = (run.reconfigurations[-1], run.bandwidth_tax, wall)
        wall = time.perf_counter() - t0
        print(f"{name:9} {kind:8} " + " ".join(f"{t[c] * 1e3:10.2f}" for c in cols) + "   "
              + " ".join(f"{t[c] / t['topoopt']:12.2f}" for c in cols[2:]) + f"  {wall:6.0f}")
        notes.append(f"  {name}: changes/tax/wall " + ", ".join(
            f"{c} {e[0]}/{e[1]:.2f}/{e[2]:.0f}s" for c, e in extra.items())
            + f"; paper: {PAPER_FIG11[name]}")
    print("\n".join(notes))


def fig17(args, cluster):
    latencies = [float(x) for x in args.latencies.split(",")]
    sweeps = []
    for name in args.sweep_models.split(","):
        job = Job(name, batch_per_gpu=BATCH[name])
        model = model_of(job)
        kind, strategy = _strategy(name, model, cluster, job, args.strategies,
                                   args.plan_budget, args.seed)
        t0 = time.perf_counter()
        sw = latency_sweep(model, strategy, cluster, job, latencies, idle=args.idle,
                           iterations=args.iterations, seed=args.seed, strategy_name=kind,
                           progress=lambda text: print(f"    {text} ...", flush=True))
        wall = time.perf_counter() - t0
        sweeps.append(sw)
        fw = {p.latency: p for p in sw.series(True)}
        nofw = {p.latency: p for p in sw.series(False)}
        print(f"\nFigure 17 {name} ({kind}), idle ports: {args.idle}; TopoOpt "
              f"{sw.topoopt * 1e3:.2f} ms; {wall:.0f} s")
        head = (f"{'latency':>9} {'FW ms':>10} {'noFW ms':>10} {'FW/noFW':>8} {'FW/TO':>7} "
                f"{'noFW/TO':>8} {'changes FW':>10} {'noFW':>6} {'tax FW':>7}")
        print(head)
        print("-" * len(head))
        for lat in sorted(fw):
            a, c = fw[lat], nofw[lat]
            print(f"{lat * 1e6:7g}us {a.total * 1e3:10.2f} {c.total * 1e3:10.2f} "
                  f"{a.total / c.total:8.2f} {a.total / sw.topoopt:7.2f} "
                  f"{c.total / sw.topoopt:8.2f} {a.changes:10g} {c.changes:6g} "
                  f"{a.bandwidth_tax:7.2f}")
        low = min(fw)
        print(f"  check noFW ~ TopoOpt at {low * 1e6:g} us: noFW/TopoOpt = "
              f"{nofw[low].total / sw.topoopt:.2f} (paper: ~1)")
        ratio = [fw[x].total / nofw[x].total for x in sorted(fw)]
        if name == "bert":
            print(f"  check BERT FW/noFW ~1.4 (paper): ours {min(ratio):.2f} .. "
                  f"{max(ratio):.2f} over the sweep")
        if name == "dlrm":
            print(f"  check DLRM FW faster than noFW (paper): FW/noFW {min(ratio):.2f} .. "
                  f"{max(ratio):.2f}; faster at "
                  f"{sum(r < 1 for r in ratio)}/{len(ratio)} latencies")
    if args.png:
        from topoopt.export.reconfig_plot import plot_latency_sweep
        plot_latency_sweep(sweeps, args.png)
        print(f"wrote {args.png}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=128)
    ap.add_argument("--nics", type=int, default=4)
    ap.add_argument("--bandwidth", type=float, default=100e9)
    ap.add_argument("--models", default=",".join(BATCH))
    ap.add_argument("--sweep-models", default="dlrm,bert")
    ap.add_argument("--latencies", default=",".join(f"{x:g}" for x in PAPER_LATENCIES))
    ap.add_argument("--idle", choices=("keep", "rewire"), default="keep")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--strategies", choices=("structured", "plan"), default="structured")
    ap.add_argument("--plan-budget", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-fig11", action="store_true")
    ap.add_argument("--skip-fig17", action="store_true")
    ap.add_argument("--png", default=None, help="Figure 17 picture")
    args = ap.parse_args()
    cluster = Cluster(servers=args.servers, nics=args.nics, link_bandwidth=args.bandwidth)
    if not args.skip_fig11:
        fig11(args, cluster)
    if not args.skip_fig17:
        fig17(args, cluster)


if __name__ == "__main__":
    main()
