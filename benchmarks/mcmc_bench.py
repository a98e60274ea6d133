"""Speed of the strategy search: moves per second of this version's MCMC against a baseline
version's, both run side by side in one invocation.

For DLRM at n = 16 and 128 and BERT at n = 128 (``configs/dlrm-16.toml``,
``configs/dlrm-128.toml``, ``configs/bert-128.toml``) on the Ideal Switch, the
cost-equivalent Fat-tree and the TopoOpt shard (TopologyFinder on the start strategy's
traffic), one MCMC chain of ``--moves`` moves (seed 0) from the same start strategy
(data parallel, or DLRM's hybrid where that does not fit):

- the baseline: the search of ``--baseline`` (a git revision, checked out with
  ``git worktree`` into a temporary folder and run there in a subprocess), its moves
  and cost function as they were;
- this version: :func:`topoopt.planners.mcmc.mcmc_search` with its moves and the
  compiled DAG engine.

It prints CPU seconds (``time.process_time``: the machine is shared, so wall time would
charge other people's jobs to ours), moves per second, the ratio, and the best time
each chain reached. Run: ``python benchmarks/mcmc_bench.py [--moves 60]
[--baseline 9b813ff] [--only dlrm-16]``.

The two versions' chains walk different strategies (other moves, another cost), and a
chain that reaches heavy strategies pays for them. ``--fixed`` times the two cost
functions on the *same* strategies instead: the candidates this version's chain of
``--moves`` moves proposes, each simulated in full (no bound, no memo) by both
versions; it prints evaluations per second, the ratio and the largest relative
difference between the two versions' times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASES = [("dlrm", 16, "configs/dlrm-16.toml"), ("dlrm", 128, "configs/dlrm-128.toml"),
         ("bert", 128, "configs/bert-128.toml")]
FABRICS = ("ideal", "fattree", "topoopt")

#: What every runner starts with: the job, its space and start, the fabric; works on
#: both APIs (the baseline's and this one's). Reads CONFIG, n and the fabric from argv.
SETUP = r'''
import json, sys, time
from dataclasses import replace
from topoopt.config import load_config
from topoopt.fabrics.catalog import build_fabric
from topoopt.strategy import OpConfig, Strategy
try:                                     # this version
    from topoopt.planners.alternating import plan_topology, start_strategy, topoopt_fabric
    from topoopt.planners.cost import IterationCost
    from topoopt.planners.mcmc import mcmc_search
    from topoopt.planners.space import StrategySpace
    from topoopt.workloads import model_of
except ImportError:                      # the baseline (before the package layout)
    from planners.alternating import plan_topology, start_strategy, topoopt_fabric
    from planners.mcmc import IterationCost, mcmc_search
    from planners.space import StrategySpace
    model_of = lambda job: job.build_model()
path, n, fabric_name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cfg = load_config(path)
cluster, job = replace(cfg.cluster, servers=n), cfg.job
model = model_of(job)
space = StrategySpace.build(model, cluster, job)
start = start_strategy(model, cluster, job, space)
if fabric_name == "topoopt":
    plan = plan_topology(model, start, cluster, job)
    fabric, rings = topoopt_fabric(plan), plan.rings
else:
    fabric, rings = build_fabric(fabric_name, cluster, job=job, model=model,
                                 strategy=start), None
fabric._core()                           # routing tables: built once, not timed
'''

#: Compiled kernels a chain may call beyond the start's evaluation, loaded (or, in a
#: fresh checkout, compiled) before the clock starts; the baseline has none.
WARM = r'''
try:
    import numpy as np
    from topoopt.estimate._mp_kernel import merge_transfers
    merge_transfers(np.zeros(1, np.int64), np.ones(1), np.zeros(1, np.int64), 1, 1)
except ImportError:
    pass
try:
    from topoopt.estimate._cp_kernel import critical_path   # noqa: F401 (the bound's pass)
    IterationCost(model, cluster, job, fabric, rings).fast.builder.critical_path_bound(start)
except ImportError:
    pass
'''

#: The chain a version runs (argv[4]: moves).
RUNNER = SETUP + WARM + r'''
moves = int(sys.argv[4])
cost = IterationCost(model, cluster, job, fabric, rings)
cost(start)                              # first call: compiles, warms caches (not timed)
t0 = time.process_time()
result = mcmc_search(space, cost, start, moves, seed=0)
cpu = time.process_time() - t0
print(json.dumps({"cpu": cpu, "moves": result.moves, "best": result.best_time,
                  "start": result.start_time}))
'''

#: The candidates of this version's chain of argv[4] moves, as JSON (``--fixed``).
PROPOSALS = SETUP + r'''
moves = int(sys.argv[4])
cost = IterationCost(model, cluster, job, fabric, rings)
seen = {}
def spy(s, bound=float("inf")):
    seen.setdefault(s.configs, s)
    return cost(s, bound)
spy.supports_bound = True
mcmc_search(space, spy, start, moves, seed=0)
print(json.dumps([[[list(c.servers), c.dp, c.mp] for c in k] for k in seen]))
'''

#: A version's cost of each strategy of the file argv[4], in full (``--fixed``).
TIMER = SETUP + WARM + r'''
strategies = [Strategy(tuple(OpConfig(tuple(sv), dp, mp) for sv, dp, mp in s))
              for s in json.loads(open(sys.argv[4]).read())]
cost = IterationCost(model, cluster, job, fabric, rings)
cost(start)                              # first call: compiles, warms caches (not timed)
times = []
t0 = time.process_time()
for s in strategies:
    cost.memo.clear()
    times.append(cost(s))
cpu = time.process_time() - t0
print(json.dumps({"cpu": cpu, "times": times}))
'''


def baseline_tree(rev: str) -> Path:
    """A checkout of ``rev`` (reused across runs), made with ``git worktree``."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    where = Path(tempfile.gettempdir()) / f"topoopt-bench-{sha}"
    if not where.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), sha],
                       check=True, capture_output=True)
    return where


def _python(tree: Path, script: str, case: tuple, fabric: str, arg) -> str:
    """The last line ``script`` (one of the runners) prints, run in a fresh process
    whose imports come from ``tree``, for ``case`` on ``fabric`` with ``arg``."""
    _, n, path = case
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", script, str(ROOT / path), str(n), fabric,
                          str(arg)], cwd=tree, env=env, check=True, capture_output=True,
                         text=True)
    return out.stdout.strip().splitlines()[-1]


def run(tree: Path, case: tuple, fabric: str, moves: int) -> dict:
    """One chain in a fresh process whose imports come from ``tree``."""
    return json.loads(_python(tree, RUNNER, case, fabric, moves))


def fixed(base: Path, case: tuple, fabric: str, moves: int, tmp: Path) -> dict:
    """Both versions' cost functions on this version's chain's candidates."""
    file = tmp / f"{case[0]}-{case[1]}-{fabric}.json"
    file.write_text(_python(ROOT, PROPOSALS, case, fabric, moves))
    return {name: json.loads(_python(tree, TIMER, case, fabric, file))
            for name, tree in (("base", base), ("new", ROOT))}


def table(headers, rows):
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.rjust(w) if i > 2 else c.ljust(w) for i, (c, w) in
                        enumerate(zip(r, widths))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moves", type=int, default=60, help="MCMC moves per chain")
    ap.add_argument("--baseline", default="9b813ff",
                    help="git revision to compare with (default: main before issue 13)")
    ap.add_argument("--only", default=None, help="cases, e.g. 'dlrm-16,bert-128'")
    ap.add_argument("--fabrics", default=",".join(FABRICS))
    ap.add_argument("--fixed", action="store_true",
                    help="time both cost functions on the same strategies")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.only or f"{c[0]}-{c[1]}" in args.only.split(",")]
    base = baseline_tree(args.baseline)
    rows = []
    if args.fixed:
        with tempfile.TemporaryDirectory() as tmp:
            for case in cases:
                for fabric in args.fabrics.split(","):
                    r = fixed(base, case, fabric, args.moves, Path(tmp))
                    k = len(r["new"]["times"])
                    old, new = k / r["base"]["cpu"], k / r["new"]["cpu"]
                    diff = max(abs(a - b) / b for a, b in zip(r["new"]["times"],
                                                               r["base"]["times"]))
                    rows.append([case[0], case[1], fabric, k, f"{old:.1f}", f"{new:.1f}",
                                 f"{new / old:.1f}x", f"{diff:.1e}"])
                    print(" ".join(map(str, rows[-1])), flush=True)
        print()
        print(f"baseline {args.baseline} ({base}) vs this tree ({ROOT}): the candidates of "
              f"this version's {args.moves}-move chain, each simulated in full by both")
        table(["model", "n", "fabric", "strategies", "base evals/s", "evals/s", "ratio",
               "max rel diff"], rows)
        return
    rows = []
    for case in cases:
        for fabric in args.fabrics.split(","):
            old = run(base, case, fabric, args.moves)
            new = run(ROOT, case, fabric, args.moves)
            r_old, r_new = old["moves"] / old["cpu"], new["moves"] / new["cpu"]
            rows.append([case[0], case[1], fabric, args.moves, f"{r_old:.1f}", f"{r_new:.1f}",
                         f"{r_new / r_old:.1f}x", f"{old['best'] * 1e3:.2f}",
                         f"{new['best'] * 1e3:.2f}"])
            print(" ".join(map(str, rows[-1])), flush=True)
    print()
    print(f"baseline {args.baseline} ({base}) vs this tree ({ROOT}); CPU seconds per chain")
    table(["model", "n", "fabric", "moves", "base moves/s", "moves/s", "ratio",
           "base best ms", "best ms"], rows)


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s)")
