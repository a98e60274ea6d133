"""The Ray executor's overhead against the local process pool, side by side in one run.

The same plan (``topoopt.plan``, same seed) runs through a local process pool of
``--workers`` processes and through Ray: a local Ray started with ``--workers`` CPUs,
or the cluster at ``--ray HOST:PORT``. Both plans must be equal (checked, and the
benchmark fails if not); printed are each wall time (best of ``--repeat``, the Ray
start and shutdown timed apart) and the ratio Ray / pool. On one 2-core machine no
speed-up is expected: the point is the overhead (task pickling, the object store,
workers importing the package once each).

Usage::

    python benchmarks/ray_bench.py [--config configs/dlrm-16.toml] [--budget 20]
                                   [--workers 2] [--repeat 2] [--ray HOST:PORT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topoopt.config import load_config  # noqa: E402
from topoopt.executor import ExecutorError, make_executor  # noqa: E402
from topoopt.planners.planner import plan  # noqa: E402
from topoopt.plans.document import plan_to_json  # noqa: E402


def _plan(cfg, executor, budget: int):
    s = cfg.plan_settings
    return plan(cfg.cluster, cfg.job, budget=budget, rounds=1, chains=s.chains, seed=s.seed,
                tolerance=s.tolerance, baselines=s.baselines, executor=executor)


def _timed(cfg, executor, budget: int, repeat: int) -> tuple[float, str]:
    best, doc = float("inf"), ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = _plan(cfg, executor, budget)
        best = min(best, time.perf_counter() - t0)
        doc = json.dumps(plan_to_json(result), sort_keys=True)
    return best, doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/dlrm-16.toml")
    ap.add_argument("--budget", type=int, default=20)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ray", default="local", help="HOST:PORT of a cluster, or local")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cfg = load_config(args.config)
    print(f"{args.config}: budget {args.budget}, 1 round, {cfg.plan_settings.chains} chains, "
          f"{args.workers} workers, best of {args.repeat}")
    with make_executor(args.workers) as pool:
        pool_s, pool_doc = _timed(cfg, pool, args.budget, args.repeat)
    for attempt in range(3):   # a busy machine can miss Ray's 15 s node-start window
        t0 = time.perf_counter()
        try:
            ray_exec = make_executor(args.workers, ray=args.ray)
            break
        except ExecutorError as exc:
            print(f"attempt {attempt + 1}: {exc}")
    else:
        sys.exit("Ray did not start")
    start_s = time.perf_counter() - t0
    with ray_exec:
        ray_s, ray_doc = _timed(cfg, ray_exec, args.budget, args.repeat)
        t0 = time.perf_counter()
    stop_s = time.perf_counter() - t0
    same = ray_doc == pool_doc
    print(f"{'executor':<10} {'plan s':>8}")
    print(f"{'pool':<10} {pool_s:8.2f}")
    print(f"{'ray':<10} {ray_s:8.2f}   (Ray {args.ray}: start {start_s:.1f} s, "
          f"shutdown {stop_s:.1f} s, not counted)")
    print(f"ratio ray / pool: {ray_s / pool_s:.2f}; plans equal: {same}")
    if not same:
        sys.exit("the Ray plan differs from the pool's")


if __name__ == "__main__":
    main()
