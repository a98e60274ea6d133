"""TopologyFinder quality and speed: DLRM all-to-all heavy (TopoOpt §5.5) and wall time vs n.

Run: ``python benchmarks/topology_bench.py [--sizes 128,432,1024]``. Prints two tables:
path length and bandwidth tax next to the paper's figures and a random expander of the
same degree; and the wall time of ``topology_finder`` (routes included).
"""

from __future__ import annotations

import argparse
import time

from topoopt.commands._common import print_table
from topoopt.commands.topology import expander_baseline
from topoopt.strategy import hybrid
from topoopt.topology.finder import check_topology_plan, topology_finder
from topoopt.topology.metrics import topology_metrics
from topoopt.traffic import derive_traffic
from workloads import build_model

#: TopoOpt §5.5, Figure 14: DLRM, 128 tables on 128 servers, batch 64.
PAPER = {4: (5.7, 1.11), 8: (3.0, 1.05)}


def dlrm_traffic(n: int, batch_per_gpu: int = 64, gpus: int = 4):
    model = build_model("dlrm", {"tables": n})
    return derive_traffic(model, hybrid(model, n), n, n * gpus * batch_per_gpu, 4)


def quality(seed: int = 0) -> None:
    n = 128
    traffic = dlrm_traffic(n)
    rows = []
    for d in (4, 8):
        plan = topology_finder(traffic, n, d, 100e9, seed=seed)
        check_topology_plan(plan, traffic)
        ours = topology_metrics(plan.topology, traffic, plan.rings, plan.routes)
        exp = expander_baseline(n, d, 100e9, 1e-6, seed)
        em = topology_metrics(exp, traffic) if exp is not None else None
        apl, tax = PAPER[d]
        rows.append([f"d={d}", f"{plan.degree_allreduce}+{plan.degree_mp}",
                     f"{ours.average_path_length:.2f}", f"{apl:g}",
                     f"{em.average_path_length:.2f}" if em else "n/a",
                     f"{ours.bandwidth_tax:.3f}", f"{tax:g}",
                     f"{em.bandwidth_tax:.3f}" if em else "n/a",
                     f"{ours.diameter:g}", f"{em.diameter:g}" if em else "n/a"])
    print("DLRM, 128 tables on 128 servers, hybrid, batch 64/GPU (TopoOpt Fig. 14)")
    print_table(["degree", "AR+MP", "path len", "paper", "expander", "tax", "paper",
                 "expander", "diam", "exp diam"], rows)


def speed(sizes, seed: int = 0) -> None:
    rows = []
    goals = {128: 1.0, 432: 5.0, 1024: 30.0}
    for n in sizes:
        traffic = dlrm_traffic(n)
        for d in (4, 8):
            t0 = time.perf_counter()
            plan = topology_finder(traffic, n, d, 100e9, seed=seed)
            wall = time.perf_counter() - t0
            rows.append([n, d, len(plan.routes), f"{wall:.2f}",
                         f"{goals[n]:g}" if n in goals else "-",
                         f"{wall / goals[n]:.2f}" if n in goals else "-"])
    print("\nWall time of topology_finder (DLRM all-to-all, routes for every MP pair)")
    print_table(["n", "d", "routed pairs", "seconds", "goal", "ratio"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="128,432,1024")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    quality(args.seed)
    speed([int(s) for s in args.sizes.split(",")], args.seed)


if __name__ == "__main__":
    main()
