"""One task-graph build of DLRM's worst MP layout at 384-512 servers, beside a baseline.

Above 256 servers the memory peak of a DLRM plan was one strategy's task-graph build:
it listed the MP transfers of every edge before merging them (issue 33; an edge from a
config on k servers to one on m has k x m transfers). This bench takes DLRM on
``configs/dlrm-128.toml`` with ``servers`` raised and ``tables = servers / 2``, on the
Ideal Switch (``build_fabric("ideal", ...)``, cheap routes), and layouts with every
table split over all servers (``mp = n``) and a body layout of
:data:`~topoopt.planners.structure.BODY_LAYOUTS` (``mpall+<body>``, or
``mpall+half``: the body data parallel on servers ``0 .. n/2 - 1``), in the strategy
space and fitting in memory. ``--count`` lists each layout's MP transfers (the sum of
its edges' template sizes) and stops; by default the layout with the most is measured
(``--layouts``: those, counted and measured).

Each measurement is a fresh process, this tree's or a baseline's (``--baseline REF``:
a detached worktree installed with ``pip install --target``; or ``--baseline-site
DIR``, such an install already made), run outside any checkout: the planner's
estimator (``FastEstimator``: merged flows, one builder) costs a warm-up strategy
(tables spread, body data parallel: compiled kernels and route caches loaded), then
builds the layout's graph once (CPU seconds, ``time.process_time``) and runs it on the
DAG engine. Peak RSS is ``ru_maxrss`` after the warm-up, after the build and after the
simulation. The baseline runs only up to ``--baseline-max`` servers (its build holds
every edge's transfers: keep it under the machine's memory). Prints a table per size:
CPU seconds and peak RSS of both sides, their ratios, and whether the two graphs give
the same iteration time to the bit.

Usage: python benchmarks/build_scale_bench.py [--sizes 384,512] [--baseline 9112ead |
       --baseline-site DIR | --baseline none] [--baseline-max 384] [--repeat 1]
       [--layouts mpall+mp8,mpall+half] [--rss-cap 5.5] [--count]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from baseline_tree import install_ref, remove_tree

ROOT = Path(__file__).resolve().parents[1]
WARMUP = "tables-spread+body-dp"


def _setup(config: str):
    from topoopt.config import load_config
    from topoopt.planners.space import StrategySpace
    from topoopt.workloads import model_of

    cfg = load_config(config)
    model = model_of(cfg.job)
    return cfg.cluster, cfg.job, model, StrategySpace.build(model, cfg.cluster, cfg.job)


def layouts(model, space) -> dict:
    """``mpall+<body>`` strategies of ``space`` that fit (see the module docstring)."""
    from topoopt.planners.structure import structured_strategies
    from topoopt.strategy import OpConfig, Strategy

    n = space.servers
    ops = model.operators
    tables = OpConfig(tuple(range(n)), dp=1, mp=n)
    half = OpConfig(tuple(range(n // 2)), dp=n // 2, mp=1)
    everyone = OpConfig(tuple(range(n)), dp=n, mp=1)      # the input operators'
    bodies: dict[str, Strategy] = {}
    for lay in structured_strategies(model, space):
        bodies.setdefault(lay.body, lay.strategy)
    bodies["half"] = Strategy(tuple(everyone if op.kind == "input" else half for op in ops))
    out = {}
    for body, s in bodies.items():
        cand = Strategy(tuple(tables if op.kind == "embedding" else c
                              for op, c in zip(ops, s.configs)), f"mpall+{body}")
        cand = space.canonical_strategy(cand)
        if space.contains(cand):
            out[cand.name] = cand
    return out


def transfers(builder, strategy) -> tuple[int, int]:
    """``(MP edges, transfers)`` of ``strategy``: every edge's template size, summed."""
    edges = builder._transfers(builder.fused(strategy))
    return len(edges.plans), sum(p.size for p in edges.plans)


def count(args: argparse.Namespace) -> None:
    """One JSON line per layout: its MP edges and transfers."""
    from topoopt.estimate.builder import IterationGraphBuilder
    from topoopt.fabrics.catalog import build_fabric

    cluster, job, model, space = _setup(args.config)
    builder = IterationGraphBuilder(model, cluster, job, build_fabric("ideal", cluster))
    wanted = args.layouts.split(",") if args.layouts else None
    for name, s in layouts(model, space).items():
        if wanted is not None and name not in wanted:
            continue
        e, t = transfers(builder, s)
        print(json.dumps({"layout": name, "edges": e, "transfers": t}), flush=True)


def worker(args: argparse.Namespace) -> None:
    """Measure one build of ``args.layout`` in this process; one JSON line."""
    from topoopt.estimate import FastEstimator
    from topoopt.estimate.iteration import summarize
    from topoopt.fabrics.catalog import build_fabric
    from topoopt.netsim.dag import run_dag
    from topoopt.planners.structure import structured_strategies

    cluster, job, model, space = _setup(args.config)
    fabric = build_fabric("ideal", cluster)
    fast = FastEstimator(model, cluster, job, fabric)
    warm = {lay.name: lay.strategy for lay in structured_strategies(model, space)}[WARMUP]
    fast.total(warm)
    strategy = layouts(model, space)[args.layout]

    def rss() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    rss_warm = rss()
    t0 = time.process_time()
    graph = fast.graph(strategy)
    build = time.process_time() - t0
    rss_build = rss()
    t0 = time.process_time()
    start, finish, _, events = run_dag(fabric.capacity, graph.dag)
    total = summarize(graph, start, finish, events, fabric.name).total
    sim = time.process_time() - t0
    print(json.dumps({"build": build, "sim": sim, "rss_warm": rss_warm, "rss_build": rss_build,
                      "rss_sim": rss(), "total": repr(total), "flows": int(graph.flow_kind.size),
                      "deps": int(graph.dep_before.size),
                      "transfers": transfers(fast.builder, strategy)[1]}), flush=True)


def _rss(pid: int) -> int:
    """Resident bytes of process ``pid`` now (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _run(site: Path | None, args: list[str], cwd: Path, cap: float = math.inf
         ) -> list[dict] | None:
    """The JSON lines of this script run with ``args`` (``site`` on PYTHONPATH), or
    None if its RSS passed ``cap`` bytes (then it is killed)."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    killed = threading.Event()

    def watch() -> None:
        while proc.poll() is None:
            if _rss(proc.pid) > cap:
                killed.set()
                proc.kill()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    watcher.join()
    if killed.is_set():
        return None
    if proc.returncode != 0:
        raise RuntimeError(f"{args}: exit {proc.returncode}\n{err[-2000:]}")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _config(n: int, work: Path) -> Path:
    text = (ROOT / "configs" / "dlrm-128.toml").read_text()
    text = re.sub(r"(?m)^servers = \d+", f"servers = {n}", text)
    text = re.sub(r"(?m)^tables = [\d_]+", f"tables = {n // 2}", text)
    path = work / f"dlrm-{n}.toml"
    path.write_text(text)
    return path


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)


def _measure(n: int, sides: dict, args: argparse.Namespace, work: Path) -> None:
    config = _config(n, work)
    counts = _run(None, ["--count-worker", "--config", str(config)]
                  + (["--layouts", args.layouts] if args.layouts else []), work) or []
    for c in sorted(counts, key=lambda c: -c["transfers"]):
        print(f"  {n} servers: {c['layout']:<28} {c['edges']:>4} MP edges "
              f"{c['transfers']:>12,} transfers", flush=True)
    if args.count:
        return
    names = (args.layouts.split(",") if args.layouts
             else [max(counts, key=lambda c: c["transfers"])["layout"]])
    for layout in names:
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        over: set[str] = set()
        for _ in range(args.repeat):       # alternating sides, a fresh process each
            for side, site in sides.items():
                if side in over or (side == "baseline" and n > args.baseline_max):
                    continue
                cmd = ["--worker", "--config", str(config), "--layout", layout]
                got = _run(site, cmd, work, args.rss_cap * 1e9)
                if got is None:
                    over.add(side)
                runs[side] += got or []
        _report(n, layout, runs, over, args)


def _report(n: int, layout: str, runs: dict[str, list[dict]], over: set[str],
            args: argparse.Namespace) -> None:
    cur = runs["current"]
    base = runs.get("baseline") or []
    if not cur:
        print(f"\n{n} servers, {layout}: current passed {args.rss_cap} GB RSS, killed")
        return
    print(f"\nDLRM, {n} servers, {n // 2} tables, Ideal Switch, {layout}: "
          f"{cur[0]['transfers']:,} MP transfers, {cur[0]['flows']:,} flows, "
          f"{cur[0]['deps']:,} dependencies; median of {len(cur)} fresh processes")
    head = f"{'':<22}{'baseline':>12}{'current':>12}{'base/cur':>10}"
    print(head + "\n" + "-" * len(head))
    for label, key, scale in (("build CPU s", "build", 1.0), ("simulation CPU s", "sim", 1.0),
                              ("RSS after warm-up GB", "rss_warm", 1e9),
                              ("RSS after build GB", "rss_build", 1e9),
                              ("RSS after sim GB", "rss_sim", 1e9)):
        c = _median(cur, key) / scale
        b = _median(base, key) / scale if base else None
        print(f"{label:<22}{f'{b:.3f}' if b is not None else '-':>12}{c:>12.3f}"
              f"{f'{b / c:.2f}' if b is not None and c > 0 else '-':>10}")
    totals = {r["total"] for r in cur}
    same = "-" if not base else str(totals == {r["total"] for r in base} and len(totals) == 1)
    print(f"iteration time (current): {cur[0]['total']} s; the same as the baseline's to "
          f"the bit: {same}")
    if "baseline" in over:
        print(f"(baseline killed: its RSS passed {args.rss_cap} GB)")
    elif not base and "baseline" in runs:
        print(f"(baseline not run above {args.baseline_max} servers)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="384,512", help="servers, comma-separated")
    ap.add_argument("--baseline", default="9112ead", help="git ref, or 'none'")
    ap.add_argument("--baseline-site", help="a baseline already installed (pip --target)")
    ap.add_argument("--baseline-max", type=int, default=384,
                    help="largest size the baseline runs [default: 384]")
    ap.add_argument("--repeat", type=int, default=1, help="processes per side (median)")
    ap.add_argument("--layouts", help="layouts measured, comma-separated "
                    "[default: the one with the most transfers]")
    ap.add_argument("--rss-cap", type=float, default=5.5,
                    help="GB of RSS a measuring process is killed at [default: 5.5]")
    ap.add_argument("--count", action="store_true", help="only list the layouts")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--count-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--layout", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.count_worker:
        count(args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="build-scale-"))
    tree = None
    try:
        sides: dict[str, Path | None] = {}
        if args.baseline_site:
            sides["baseline"] = Path(args.baseline_site).resolve()
        elif args.baseline != "none" and not args.count:
            tree, sides["baseline"] = install_ref(args.baseline, work)
        sides["current"] = None
        for n in (int(x) for x in args.sizes.split(",")):
            _measure(n, sides, args, work)
        return 0
    finally:
        remove_tree(tree)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
