"""cProfile of MCMC moves on DLRM-128 (configs/dlrm-128.toml) on the TopoOpt shard.

Prints ms per move, the best and start times, and the 25 functions with the most own
time. ``--reference`` profiles the reference estimator instead of the fast one;
``--config`` and ``--moves`` pick another job and budget.

Run: ``python benchmarks/mcmc_profile.py [--reference] [--moves 40]``
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoopt import load_config  # noqa: E402
from topoopt.planners.alternating import plan_topology, start_strategy, topoopt_fabric  # noqa: E402
from topoopt.planners.cost import IterationCost  # noqa: E402
from topoopt.planners.mcmc import mcmc_search  # noqa: E402
from topoopt.planners.space import StrategySpace  # noqa: E402
from topoopt.workloads import model_of


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs/dlrm-128.toml"))
    ap.add_argument("--moves", type=int, default=40)
    ap.add_argument("--reference", action="store_true", help="profile the reference estimator")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    c, j = cfg.cluster, cfg.job
    m = model_of(j)
    sp = StrategySpace.build(m, c, j)
    s = start_strategy(m, c, j, sp)
    tp = plan_topology(m, s, c, j)
    cost = IterationCost(m, c, j, topoopt_fabric(tp), tp.rings, reference=args.reference)
    cost(s)
    pr = cProfile.Profile()
    pr.enable()
    t = time.time()
    r = mcmc_search(sp, cost, s, args.moves, seed=0)
    dt = time.time() - t
    pr.disable()
    print("ms/move", dt / args.moves * 1e3, r.best_time, r.start_time)
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
