"""Speed of the flow-level simulator and of the iteration estimator.

Prints three tables:

1. simulator throughput (flows/s, events/s) for n = 16, 128, 1024 servers running a
   ring AllReduce (one coupled flow over all servers, 100 MB) concurrently with an
   all-to-all (every ordered pair 1 MB, in n - 1 shift rounds i -> i + r, round r + 1
   of a sender after its round r), on the Ideal Switch, a Fat-tree (ECMP, and one
   seeded random path per flow) and an expander (ECMP). On the Ideal Switch every
   round ends at one time (a few events per round); on fabrics with uneven paths
   nearly every flow ends at its own time, so events grow like n^2 and each
   re-solves max-min for the active flows: those run at n <= 128 only (a
   1024-server all-to-all on them is ~2 million events);
2. the max-min kernel against a plain-Python progressive filling (the baseline),
   side by side, on one snapshot of concurrent flows;
3. wall time of one DLRM iteration estimate (configs/dlrm-128.toml, hybrid) per
   fabric and MP flow mode, first call (routes computed) and warm (routes and
   per-op parts cached), and at 1024 servers, against the targets (50 ms, 2 s).
   "build s" is the fabric's construction (TopologyFinder for topoopt), once.

Run: ``python benchmarks/netsim_bench.py [--quick]`` (quick: skip n = 1024).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoopt.config import load_config  # noqa: E402
from topoopt.estimate import EstimateCache, estimate_iteration, ring_flow_routes  # noqa: E402
from topoopt.fabrics import expander, fat_tree, ideal_switch  # noqa: E402
from topoopt.fabrics.catalog import build_fabric  # noqa: E402
from topoopt.netsim import Workload, max_min_rates, simulate  # noqa: E402
from topoopt.strategy import hybrid  # noqa: E402
from topoopt.workloads import model_of

G = 1e9


def table(headers, rows):
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths)))
    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print(line(r))
    print()


def ring_plus_all_to_all(fabric, random_paths=False):
    n = fabric.servers
    w = Workload()
    routes, hop_lat = ring_flow_routes(fabric, [tuple(range(n))])
    w.add_flows(2 * (n - 1) / n * 100e6, routes, latency=2 * (n - 1) * hop_lat)
    prev = None
    src = np.arange(n)
    for r in range(1, n):
        dst = (src + r) % n
        ids = w.add_flows(1e6, fabric.route(src, dst, random=random_paths, seed=r))
        if prev is not None:
            w.add_dependencies(prev, ids)
        prev = ids
    return w


def bench_simulator(sizes):
    rows = []
    for n in sizes:
        cases = [("ideal", ideal_switch(n, 400 * G), False)]
        if n <= 128:  # uneven paths: ~n^2 distinct completion times, see the docstring
            cases.append(("fattree ECMP", fat_tree(n, 400 * G), False))
            cases.append(("fattree 1-path", fat_tree(n, 400 * G), True))
            cases.append(("expander ECMP", expander(n, 4, 100 * G, seed=1), False))
        for name, fabric, rnd in cases:
            t0 = time.perf_counter()
            w = ring_plus_all_to_all(fabric, rnd)
            t1 = time.perf_counter()
            res = simulate(fabric, w)
            t2 = time.perf_counter()
            flows = w.flows
            rows.append([name, n, f"{flows:,}", f"{res.events:,}", f"{t1 - t0:.2f}",
                         f"{t2 - t1:.2f}", f"{flows / (t2 - t1):,.0f}",
                         f"{res.events / (t2 - t1):,.0f}",
                         f"{res.makespan * 1e3:.2f}"])
    table(["fabric", "n", "flows", "events", "build s", "sim s", "flows/s", "events/s",
           "makespan ms"], rows)


def naive_max_min(capacity, flows_links):
    """Plain-Python progressive filling (the baseline)."""
    rate = [None] * len(flows_links)
    residual = list(capacity)
    active = set(range(len(flows_links)))
    level = 0.0
    while active:
        load = {}
        for f in active:
            for link in flows_links[f]:
                load[link] = load.get(link, 0) + 1
        step = min(residual[link] / c for link, c in load.items())
        level += step
        for link, c in load.items():
            residual[link] -= step * c
        full = {link for link in load if residual[link] <= 1e-9 * capacity[link]}
        done = {f for f in active if any(link in full for link in flows_links[f])}
        for f in done:
            rate[f] = level
        active -= done
    return rate


def bench_kernel():
    rows = []
    for n in (16, 64, 128):
        fabric = expander(n, 4, 100 * G, seed=1)
        s, t = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        keep = s != t
        r = fabric.route(s[keep], t[keep], random=True, seed=0)
        counts = np.diff(r.ptr)
        ef = np.repeat(np.arange(len(r)), counts)
        t0 = time.perf_counter()
        fast = max_min_rates(fabric.capacity, ef, r.link, r.weight, len(r))
        t1 = time.perf_counter()
        lists = [r.row(i)[0].tolist() for i in range(len(r))]
        slow = naive_max_min(fabric.capacity.tolist(), lists)
        t2 = time.perf_counter()
        assert np.allclose(fast, slow, rtol=1e-6)
        rows.append([f"expander n={n}", f"{len(r):,}", f"{r.link.size:,}",
                     f"{(t1 - t0) * 1e3:.1f}", f"{(t2 - t1) * 1e3:.1f}",
                     f"{(t2 - t1) / (t1 - t0):.0f}x"])
    table(["all-to-all snapshot", "flows", "entries", "numpy ms", "python ms", "speed-up"],
          rows)


def bench_estimate(big):
    cfg = load_config(ROOT / "configs" / "dlrm-128.toml")
    model = model_of(cfg.job)
    rows = []
    clusters = [cfg.cluster] + ([cfg.cluster.with_(servers=1024)] if big else [])
    for cluster in clusters:
        n = cluster.servers
        strat = hybrid(model, n)
        cases = [("ideal", "auto"), ("ideal", "coflow"), ("fattree", "auto"),
                 ("fattree", "pair"), ("oversub", "auto"), ("expander", "auto"),
                 ("topoopt", "auto")] if n <= 128 else [("ideal", "auto"), ("ideal", "coflow")]
        built = {}
        for name, mode in cases:
            t0 = time.perf_counter()
            if name not in built:
                built[name] = build_fabric(name, cluster, job=cfg.job, model=model,
                                           strategy=strat)
            fabric = built[name]
            t1 = time.perf_counter()
            cache = EstimateCache(model, cluster, cfg.job)
            est = estimate_iteration(model, strat, cluster, cfg.job, fabric, cache=cache,
                                     mp_flows=mode)
            t2 = time.perf_counter()
            warm = []
            for _ in range(5):
                a = time.perf_counter()
                estimate_iteration(model, strat, cluster, cfg.job, fabric, cache=cache,
                                   mp_flows=mode)
                warm.append(time.perf_counter() - a)
            w = float(np.median(warm))
            target = 0.050 if n <= 128 else 2.0
            if mode == "auto":
                mode += "=pair" if fabric.nodes == fabric.servers + 1 else "=coflow"
            rows.append([name, mode, n, f"{t1 - t0:.2f}", f"{(t2 - t1) * 1e3:.0f}",
                         f"{w * 1e3:.0f}", f"{target * 1e3:.0f}",
                         "ok" if w <= target else "SLOW", f"{est.flows:,}", est.events,
                         f"{est.total * 1e3:.2f}"])
    table(["fabric", "MP flows", "n", "build s", "first ms", "warm ms", "target ms", "",
           "flows", "events", "iteration ms"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip n = 1024")
    parser.add_argument("--estimate-only", action="store_true",
                        help="only the DLRM estimate table")
    args = parser.parse_args()
    sizes = [16, 128] if args.quick else [16, 128, 1024]
    if not args.estimate_only:
        print("# simulator: ring AllReduce + all-to-all\n")
        bench_simulator(sizes)
        print("# max-min kernel vs plain-Python progressive filling\n")
        bench_kernel()
    print("# one DLRM iteration estimate (configs/dlrm-128.toml, hybrid strategy)\n")
    bench_estimate(not args.quick)


if __name__ == "__main__":
    main()
