"""Plan the six TopoOpt workloads at n = 128, d = 4, B = 100 Gbps and compare fabrics.

Prints, per model, the predicted iteration time on every fabric (each fabric with its
own best strategy from the same search budget), the ratios the TopoOpt paper reports
(§5.3, Figure 11: Fat-tree / TopoOpt ~2.8x DLRM, CANDLE, VGG; 3x BERT; 2.1x NCF;
TopoOpt / Ideal Switch ~1.3x DLRM, 1.7x NCF, ~1.0 the others) next to ours, and the
planner's wall time.

Usage: python benchmarks/plan_bench.py [--servers 128] [--budget 200] [--rounds 2]
       [--models dlrm,bert,...] [--workers 2]
"""

from __future__ import annotations

import argparse
import time

from topoopt.cluster import Cluster, Job
from topoopt.executor import make_executor
from topoopt.planners.planner import plan

#: Per-GPU batch of the TopoOpt evaluation scripts (NOTES.md, §5).
BATCH = {"dlrm": 128, "candle": 256, "bert": 16, "ncf": 128, "resnet50": 128, "vgg16": 64}
#: (Fat-tree / TopoOpt, TopoOpt / Ideal Switch) read from TopoOpt §5.3.
PAPER = {"dlrm": (2.8, 1.3), "candle": (2.8, 1.0), "bert": (3.0, 1.0), "ncf": (2.1, 1.7),
         "resnet50": (None, 1.0), "vgg16": (2.8, 1.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=128)
    ap.add_argument("--nics", type=int, default=4)
    ap.add_argument("--bandwidth", type=float, default=100e9)
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--models", default=",".join(BATCH))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cluster = Cluster(servers=args.servers, nics=args.nics, link_bandwidth=args.bandwidth)
    print(f"{args.servers} servers x {args.nics} x {args.bandwidth / 1e9:g} Gbps, 4 A100 each; "
          f"MCMC budget {args.budget} x {args.rounds} rounds per fabric, seed {args.seed}")
    head = (f"{'model':9} {'topoopt':>9} {'ideal':>9} {'fattree':>9} {'oversub':>9} "
            f"{'expander':>9}  {'FT/TO':>5} {'paper':>5}  {'TO/ideal':>8} {'paper':>5} "
            f"{'start':>9} {'wall s':>7}")
    print(head)
    print("-" * len(head))
    with make_executor(args.workers) as executor:
        for name in args.models.split(","):
            job = Job(name, batch_per_gpu=BATCH[name])
            t0 = time.perf_counter()
            p = plan(cluster, job, budget=args.budget, rounds=args.rounds, seed=args.seed,
                     executor=executor)
            wall = time.perf_counter() - t0
            t = {f.name: f.estimate.total for f in p.fabrics}
            ft, ti = PAPER[name]
            print(f"{name:9} " + " ".join(f"{t[k] * 1e3:8.2f}m" for k in
                                           ("topoopt", "ideal", "fattree", "oversub", "expander"))
                  + f"  {t['fattree'] / t['topoopt']:5.2f} {ft or '-':>5}"
                  f"  {t['topoopt'] / t['ideal']:8.2f} {ti:>5}"
                  f" {p.search.start_time * 1e3:8.2f}m {wall:7.1f}", flush=True)
    print("times in ms (m); FT/TO = Fat-tree / TopoOpt; TO/ideal = TopoOpt / Ideal Switch; "
          "start = the start strategy on the first TopoOpt topology")


if __name__ == "__main__":
    main()
