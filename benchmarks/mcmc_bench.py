"""Speed of the MCMC planner's cost function: fast estimator against the reference.

For DLRM and BERT at n = 16 and 128 servers (``configs/dlrm-16.toml``,
``configs/dlrm-128.toml``, ``configs/bert-128.toml``; BERT at 16 is the 128 config
with 16 servers) on the TopoOpt shard (TopologyFinder on the start strategy's
traffic), the Ideal Switch and the cost-equivalent Fat-tree:

1. an MCMC chain of ``--moves`` moves (seed 0) three times: with the reference cost
   (``IterationCost(reference=True)``), with the fast cost computing every candidate's
   time ("fast moves/min"; it records the strategies it evaluates), and with the fast
   cost stopping a candidate's simulation once the next acceptance draw is sure to
   reject it ("+early stop"; the same chain, checked): moves per minute, and the
   ratio of the last to the reference; "best diff" compares the best times the fast
   and reference chains found;
2. the recorded strategies replayed through both estimators in order (a fresh
   :class:`~topoopt.estimate.FastEstimator`, caches warming up as in a search,
   and :func:`~topoopt.estimate.estimate_iteration` with ``reference=True``): ms per
   estimate, the speed-up, and the largest relative difference of the iteration
   times (the fast path must equal the reference to 1e-9).

Times are CPU seconds of this process (``time.process_time``): the machine is shared,
so wall time would charge other people's jobs to ours. Candidates on which the
reference finds a dependency cycle (coflow grouping, see
``planners.mcmc.IterationCost``) are skipped by both in the replay.

Run: ``python benchmarks/mcmc_bench.py [--moves 60] [--quick]`` (quick: n = 16 and
DLRM-128 only, 30 moves).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoopt.config import load_config  # noqa: E402
from topoopt.estimate import (  # noqa: E402
    EstimateCache,
    FastEstimator,  # noqa: E402
    estimate_iteration,
)
from topoopt.fabrics.catalog import build_fabric  # noqa: E402
from topoopt.netsim import SimulationError  # noqa: E402
from topoopt.planners.alternating import plan_topology, start_strategy, topoopt_fabric  # noqa: E402
from topoopt.planners.cost import IterationCost  # noqa: E402
from topoopt.planners.mcmc import mcmc_search  # noqa: E402
from topoopt.planners.space import StrategySpace  # noqa: E402
from topoopt.workloads import model_of

CASES = [("dlrm", 16, "configs/dlrm-16.toml"), ("bert", 16, "configs/bert-128.toml"),
         ("dlrm", 128, "configs/dlrm-128.toml"), ("bert", 128, "configs/bert-128.toml")]
FABRICS = ("topoopt", "ideal", "fattree")


def table(headers, rows):
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.ljust(w) if i < 3 else c.rjust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths)))
    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print(line(r))
    print()


class Recorder:
    """A cost that records the strategies it is asked about (first time only) and
    passes the search's rejection bound on when ``bounded``."""

    def __init__(self, cost, bounded: bool):
        self.cost, self.seen, self.known = cost, [], set()
        self.supports_bound = bounded and getattr(cost, "supports_bound", False)

    def __call__(self, strategy, bound=math.inf):
        if strategy.configs not in self.known:
            self.known.add(strategy.configs)
            self.seen.append(strategy)
        return self.cost(strategy, bound) if self.supports_bound else self.cost(strategy)


def chain(space, cost, start, moves, bounded=True):
    """Run one chain; return (CPU seconds, recorder, result)."""
    rec = Recorder(cost, bounded)
    t0 = time.process_time()
    result = mcmc_search(space, rec, start, moves, seed=0)
    return time.process_time() - t0, rec, result


def replay(model, cluster, job, fabric, rings, strategies):
    """ms per estimate of both estimators on ``strategies`` and the largest difference."""
    fast = FastEstimator(model, cluster, job, fabric, rings)
    cache = EstimateCache(model, cluster, job)
    t_fast = t_ref = 0.0
    worst, count = 0.0, 0
    for s in strategies:
        t0 = time.process_time()
        try:
            ref = estimate_iteration(model, s, cluster, job, fabric, rings, cache=cache,
                                     reference=True).total
        except SimulationError:
            ref = None
        t1 = time.process_time()
        try:
            got = fast.total(s)
        except SimulationError:
            got = None
        t2 = time.process_time()
        if (ref is None) != (got is None):
            raise AssertionError("the fast path and the reference disagree on a cycle")
        if ref is None:
            continue
        t_ref += t1 - t0
        t_fast += t2 - t1
        worst = max(worst, abs(got - ref) / ref)
        count += 1
    return t_ref / max(count, 1) * 1e3, t_fast / max(count, 1) * 1e3, worst, count


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moves", type=int, default=60, help="MCMC moves per chain")
    ap.add_argument("--quick", action="store_true", help="n = 16 and DLRM-128 only, 30 moves")
    ap.add_argument("--only", default=None,
                    help="cases to run, e.g. 'dlrm-128,bert-16' (default: all)")
    args = ap.parse_args(argv)
    moves = 30 if args.quick else args.moves
    cases = CASES[:3] if args.quick else CASES
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in cases if f"{c[0]}-{c[1]}" in wanted]
    rows = []
    for name, n, path in cases:
        cfg = load_config(ROOT / path)
        cluster, job = replace(cfg.cluster, servers=n), cfg.job
        model = model_of(job)
        space = StrategySpace.build(model, cluster, job)
        start = start_strategy(model, cluster, job, space)
        for fname in FABRICS:
            if fname == "topoopt":
                plan = plan_topology(model, start, cluster, job)
                fabric, rings = topoopt_fabric(plan), plan.rings
            else:
                fabric = build_fabric(fname, cluster, job=job, model=model, strategy=start)
                rings = None
            fabric._core()  # routing tables: built once per fabric, not timed
            t_stop, _, r_stop = chain(space, IterationCost(model, cluster, job, fabric, rings),
                                      start, moves)
            t_fast, rec, r_fast = chain(space, IterationCost(model, cluster, job, fabric,
                                                             rings), start, moves, False)
            t_ref, _, r_ref = chain(space, IterationCost(model, cluster, job, fabric, rings,
                                                         reference=True), start, moves)
            if r_stop.trace != r_fast.trace or r_stop.accepted != r_fast.accepted:
                raise AssertionError("early stopping changed the chain")
            ms_ref, ms_fast, worst, count = replay(model, cluster, job, fabric, rings,
                                                   rec.seen)
            per_min = [moves / t * 60 for t in (t_ref, t_fast, t_stop)]
            rows.append([name, n, fname, moves, count, f"{ms_ref:.1f}", f"{ms_fast:.1f}",
                         f"{ms_ref / ms_fast:.1f}x", *(f"{x:.0f}" for x in per_min),
                         f"{per_min[2] / per_min[0]:.1f}x", f"{worst:.0e}",
                         f"{abs(r_fast.best_time - r_ref.best_time) / r_ref.best_time:.0e}"])
            print(" ".join(str(c) for c in rows[-1]), flush=True)
    print()
    table(["model", "n", "fabric", "moves", "estimates", "ref ms/est", "fast ms/est",
           "speed-up", "ref moves/min", "fast moves/min", "+early stop", "ratio",
           "max rel diff", "best diff"], rows)


if __name__ == "__main__":
    main()
