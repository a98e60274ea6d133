"""One strategy's iteration-time simulation per fabric at 256 servers, beside a baseline.

Builds DLRM on ``configs/dlrm-128.toml`` with ``servers`` and ``tables`` raised (256 and
128 by default) and the fabrics as ``topoopt plan`` does (``build_fabric`` for the Ideal
Switch, the Fat-trees and the Expander; TopologyFinder on the start strategy's traffic
for TopoOpt), takes a few structured strategies
(:func:`topoopt.planners.structure.structured_strategies`, by layout name) and times one
costing of each (``FastEstimator.total``: the task graph from cached pieces and the DAG
engine) after a warm-up on another strategy (JIT and route caches loaded). Each side
runs in its own process, this tree's and a baseline git ref's (installed with
``pip install --target``, run outside any checkout), one fabric at a time, alternating;
CPU seconds (``time.process_time``), the median of ``--repeat`` runs, since the machine
is shared. Prints per fabric and strategy: flows, events, baseline and current CPU
seconds, the ratio, and the relative difference of the two iteration times.

Usage: python benchmarks/sim_scale_bench.py [--servers 256] [--tables 128]
       [--baseline d51722a | none] [--repeat 3] [--fabrics ideal,fattree,...]
       [--layouts tables-spread+body-mp2,...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from baseline_tree import install_ref, remove_tree

ROOT = Path(__file__).resolve().parents[1]
FABRIC_NAMES = ("ideal", "fattree", "oversub", "expander", "topoopt")
#: body-mp2 is the slowest family on the Expander (13.5k flows, ~40k events);
#: stages2-mp2 half of it; spread+dp the plan's usual start
LAYOUTS = ("tables-spread+body-mp2", "tables-mp4+body-stages2-mp2", "tables-spread+body-dp")
WARMUP = "tables-spread+body-block4"


def worker(args: argparse.Namespace) -> None:
    """Time the layouts on one fabric in this process; one JSON line per layout."""
    from topoopt.config import load_config
    from topoopt.estimate import EstimateCache
    from topoopt.fabrics.catalog import build_fabric
    from topoopt.planners.alternating import plan_topology, start_strategy, topoopt_fabric
    from topoopt.planners.cost import IterationCost
    from topoopt.planners.space import StrategySpace
    from topoopt.planners.structure import structured_strategies
    from topoopt.workloads import model_of

    cfg = load_config(args.config)
    cluster, job = cfg.cluster, cfg.job
    model = model_of(job)
    space = StrategySpace.build(model, cluster, job)
    layouts = {lay.name: lay.strategy for lay in structured_strategies(model, space)}
    start = start_strategy(model, cluster, job, space)
    rings = None
    if args.fabric == "topoopt":
        plan = plan_topology(model, start, cluster, job)
        fabric, rings = topoopt_fabric(plan), plan.rings
    else:
        fabric = build_fabric(args.fabric, cluster, job=job, model=model, strategy=start)
    cost = IterationCost(model, cluster, job, fabric, rings, cache=EstimateCache(model, cluster,
                                                                                  job))
    cost.fast.total(layouts[WARMUP])
    for name in args.layouts.split(","):
        strategy = layouts[name]
        times, total = [], 0.0
        for _ in range(args.repeat):
            t0 = time.process_time()
            total = cost.fast.total(strategy)
            times.append(time.process_time() - t0)
        est = cost.fast.estimate(strategy)
        print(json.dumps({"layout": name, "cpu": statistics.median(times), "total": total,
                          "flows": est.flows, "events": est.events}), flush=True)


def _side(site: Path | None, config: Path, fabric: str, args: argparse.Namespace,
          cwd: Path) -> dict[str, dict]:
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--config", str(config),
           "--fabric", fabric, "--layouts", args.layouts, "--repeat", str(args.repeat)]
    out = subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["layout"]: r for r in rows}


def _table(rows: list[list[str]], headers: list[str]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    print(fmt.format(*headers))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(fmt.format(*r))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=256)
    ap.add_argument("--tables", type=int, default=128)
    ap.add_argument("--baseline", default="d51722a", help="git ref, or 'none'")
    ap.add_argument("--repeat", type=int, default=3, help="runs per strategy (median)")
    ap.add_argument("--fabrics", default=",".join(FABRIC_NAMES))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--fabric", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="sim-scale-"))
    tree = None
    try:
        text = (ROOT / "configs" / "dlrm-128.toml").read_text()
        text = re.sub(r"(?m)^servers = \d+", f"servers = {args.servers}", text)
        text = re.sub(r"(?m)^tables = [\d_]+", f"tables = {args.tables}", text)
        config = work / "dlrm.toml"
        config.write_text(text)
        site = None
        if args.baseline != "none":
            tree, site = install_ref(args.baseline, work)
        rows = []
        for fabric in args.fabrics.split(","):
            base = _side(site, config, fabric, args, work) if site is not None else {}
            cur = _side(None, config, fabric, args, work)
            for name, c in cur.items():
                b = base.get(name)
                row = [fabric, name, str(c["flows"]), str(c["events"]),
                       f"{b['cpu']:.3f}" if b else "-", f"{c['cpu']:.3f}",
                       f"{b['cpu'] / c['cpu']:.2f}" if b and c["cpu"] > 0 else "-",
                       f"{abs(c['total'] - b['total']) / b['total']:.1e}" if b else "-"]
                rows.append(row)
                print("  ".join(row), flush=True)
        print(f"\nDLRM, {args.servers} servers, {args.tables} tables; CPU s of one costing "
              f"(median of {args.repeat}); baseline {args.baseline}\n")
        _table(rows, ["fabric", "strategy", "flows", "events", "base s", "new s",
                      "base/new", "rel diff"])
        return 0
    finally:
        remove_tree(tree)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
