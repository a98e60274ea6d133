"""REACT Figure 5 on the flow-level simulator: algorithm-bandwidth gain of REACT.

8 nodes, 20 MB, 3-layer k = 8 Fat-tree (128 servers, 100 Gbps, 1 us links, 4-port
ECMP with a random port per flow per epoch), 100 epochs measured after epoch 25;
p = 1, 2, 4 external flows per congested pair, 1..8 pairs, 10 random scenarios each,
for the NCCL double binary tree and recursive-doubling AllGather; plus the same seeds
with no congestion (the overhead REACT costs when there is nothing to fix; p = 0).
Prints, per point, the mean/min/max improvement of mean algorithm bandwidth
(``base_time / react_time - 1``) and the mean epoch from which the pattern stayed
fixed, then a summary against the paper's numbers.

Usage::

    python benchmarks/react_bench.py [--workers 2] [--seeds 10] [--epochs 100]
                                     [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from topoopt.react.scenarios import Scenario  # noqa: E402
from topoopt.react.sweep import figure5_grid, run_sweep, sweep_table  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="p = 2 only, pairs 1, 4, 8, 3 seeds")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    base = Scenario(epochs=args.epochs)
    if args.quick:
        grid = figure5_grid(ps=(2,), congested=(1, 4, 8), seeds=3, base=base)
    else:
        grid = figure5_grid(seeds=args.seeds, base=base)
    t0 = time.perf_counter()
    results = run_sweep(grid, workers=args.workers)
    wall = time.perf_counter() - t0
    rows = sweep_table(results)
    print(f"REACT Fig. 5 sweep: {len(grid)} scenarios x 2 runs x {args.epochs} epochs "
          f"in {wall:.0f} s ({args.workers} workers)\n")
    head = f"{'collective':<13}{'p':>3}{'pairs':>7}{'mean %':>9}{'min %':>8}{'max %':>8}" \
           f"{'converged':>11}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['collective']:<13}{r['p']:>3}{r['congested']:>7}"
              f"{100 * r['mean_improvement']:>9.1f}{100 * r['min_improvement']:>8.1f}"
              f"{100 * r['max_improvement']:>8.1f}{r['converged_epoch']:>11.1f}")
    print()
    for coll in sorted({r.scenario.collective for r in results}):
        mine = [r for r in results if r.scenario.collective == coll]
        hot = [r.improvement for r in mine if r.scenario.p in (2, 4)]
        clean = [r.improvement for r in mine if r.scenario.kind == "none"]
        conv = [r.converged_epoch for r in mine if r.scenario.kind != "none"]
        paper = {"tree": "35%", "rd-allgather": "15%"}.get(coll, "?")
        print(f"{coll}: mean gain at p = 2, 4: {100 * np.mean(hot):.1f}% (paper {paper}); "
              f"best {100 * max(hot):.1f}% (paper up to 60-95%); "
              f"p = 0 change {100 * np.mean(clean):+.2f}% (paper > -4%, target > -1%); "
              f"epochs to converge {np.mean(conv):.1f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "wall_s": wall}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
