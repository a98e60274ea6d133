"""TopologyFinder quality and speed: DLRM all-to-all heavy (TopoOpt §5.5) and wall time vs n.

Run: ``python benchmarks/topology_bench.py [--sizes 128,432,1024] [--lp-sizes 64,128]``.
Prints three tables: path length and bandwidth tax next to the paper's figures and a
random expander of the same degree; the wall time of ``topology_finder`` (routes
included) with the previous tuple-per-path implementation (``implementation=
"reference"``) next to the array one (``"fast"``), and whether their plans are equal;
and the min-max-load LP (``routing="lp"``) built and solved both ways, with both optima.
"""

from __future__ import annotations

import argparse
import time

from topoopt.commands._common import print_table
from topoopt.finder.topology_finder import check_topology_plan, topology_finder
from topoopt.routing.metrics import topology_metrics
from topoopt.strategy import hybrid
from topoopt.topology.expander import expander_topology
from topoopt.traffic import derive_traffic
from topoopt.workloads import build_model

#: TopoOpt §5.5, Figure 14: DLRM, 128 tables on 128 servers, batch 64.
PAPER = {4: (5.7, 1.11), 8: (3.0, 1.05)}
#: Issue 4's goals for the wall time of TopologyFinder, seconds.
GOALS = {128: 1.0, 432: 5.0, 1024: 30.0}


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
        exp = expander_topology(n, d, 100e9, 1e-6, seed)
        em = topology_metrics(exp, traffic)
        apl, tax = PAPER[d]
        rows.append([f"d={d}", f"{plan.degree_allreduce}+{plan.degree_mp}",
                     f"{ours.average_path_length:.2f}", f"{apl:g}",
                     f"{em.average_path_length:.2f}",
                     f"{ours.bandwidth_tax:.3f}", f"{tax:g}",
                     f"{em.bandwidth_tax:.3f}",
                     f"{ours.diameter:g}", f"{em.diameter:g}"])
    print("DLRM, 128 tables on 128 servers, hybrid, batch 64/GPU (TopoOpt Fig. 14)")
    print_table(["degree", "AR+MP", "path len", "paper", "expander", "tax", "paper",
                 "expander", "diam", "exp diam"], rows)


def _timed(fn, repeat: int = 1):
    """(result of the last call, best wall time over ``repeat`` calls)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def speed(sizes, seed: int = 0, reference: bool = True, repeat: int = 1) -> None:
    rows = []
    for n in sizes:
        traffic = dlrm_traffic(n)
        for d in (4, 8):
            fast, t_fast = _timed(lambda: topology_finder(traffic, n, d, 100e9, seed=seed),
                                  repeat)
            if reference:
                ref, t_ref = _timed(lambda: topology_finder(
                    traffic, n, d, 100e9, seed=seed, implementation="reference"))
                same = "yes" if fast == ref else "NO"
            goal = GOALS.get(n)
            rows.append([n, d, len(fast.routes),
                         f"{t_ref:.2f}" if reference else "-", f"{t_fast:.2f}",
                         f"{t_ref / t_fast:.1f}x" if reference else "-",
                         same if reference else "-", f"{goal:g}" if goal else "-",
                         ("met" if t_fast < goal else "MISSED") if goal else "-"])
    print("\nWall time of topology_finder, seconds (DLRM all-to-all, routes for every MP "
          f"pair; fast: best of {repeat})")
    print_table(["n", "d", "routed pairs", "reference", "fast", "speed-up", "equal plans",
                 "goal", "goal"], rows)


def lp_speed(sizes, degrees, seed: int = 0, reference: bool = True) -> None:
    """The LP alone on the finder's candidates (build / first / tie-break solve), both ways,
    and the fast finder with ``routing="lp"`` end to end."""
    import numpy as np

    from topoopt.routing.kshortest import hop_distances, k_shortest_paths, neighbour_table
    from topoopt.routing.lp import min_max_load_routes

    rows = []
    for n in sizes:
        traffic = dlrm_traffic(n)
        for d in degrees:
            plan, t_plan = _timed(lambda: topology_finder(traffic, n, d, 100e9, seed=seed,
                                                          routing="lp"))
            topo = plan.topology
            dist = hop_distances(topo)
            nbr = [[int(v) for v in row if v >= 0] for row in neighbour_table(topo)]
            src, dst = np.nonzero(traffic.mp)
            demand = {(int(s), int(t)): float(traffic.mp[s, t]) for s, t in zip(src, dst)}
            cands = {p: k_shortest_paths(nbr, dist, p[0], p[1], 4, 2) for p in demand}
            runs = {}
            for method in ("reference", "fast") if reference else ("fast",):
                stats: dict = {}
                (_, best), wall = _timed(lambda: min_max_load_routes(topo, demand, cands,
                                                                     method=method,
                                                                     stats=stats))
                runs[method] = (stats, wall, best)

            def cells(method):
                if method not in runs:
                    return ["-"] * 4
                st, wall, _ = runs[method]
                return [f"{st['build_s']:.2f}", f"{st['solve1_s']:.1f}", f"{st['solve2_s']:.1f}",
                        f"{wall:.1f}"]

            fs = runs["fast"][0]
            rel = "-"
            if reference:
                ref_best, fast_best = runs["reference"][2], runs["fast"][2]
                rel = f"{abs(fast_best - ref_best) / ref_best:.1e}"
            rows.append([n, d, len(demand), fs["paths"], fs["rows"], *cells("reference"),
                         *cells("fast"),
                         f"{runs['reference'][1] / runs['fast'][1]:.1f}x" if reference else "-",
                         rel, f"{t_plan:.1f}"])
    print("\nThe min-max-load LP (GLOP) on the finder's candidates (k = 4, up to 2 extra "
          "hops), seconds: build, first solve, tie-break solve, total; and the fast "
          "topology_finder(routing='lp') end to end")
    print_table(["n", "d", "pairs", "paths", "rows", "ref build", "ref LP1", "ref LP2",
                 "ref total", "build", "LP1", "LP2", "total", "speed-up", "max load rel diff",
                 "finder"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="128,432,1024")
    parser.add_argument("--lp-sizes", default="64,128",
                        help="n for the LP table ('' to skip it)")
    parser.add_argument("--lp-degrees", default="4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3,
                        help="fast runs per size (the best is shown; the machine is shared)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the reference runs (minutes at n = 1024 and for the LP)")
    args = parser.parse_args()
    quality(args.seed)
    speed([int(s) for s in args.sizes.split(",") if s], args.seed, not args.no_reference,
          args.repeat)
    if args.lp_sizes:
        lp_speed([int(s) for s in args.lp_sizes.split(",")],
                 [int(d) for d in args.lp_degrees.split(",")], args.seed,
                 not args.no_reference)


if __name__ == "__main__":
    main()
