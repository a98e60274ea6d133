"""Plan the same configs and seeds with two checkouts side by side: time and identity.

Each checkout is installed into a folder of its own (``pip install --no-deps --target``,
so a checkout's package layout, links or a ``package-dir`` mapping, does not matter),
warmed up once (the compiled kernels), then ``topoopt plan`` runs alternately with one
and the other for every (config, seed). Prints each run's wall time, the ratio current /
baseline, and whether the two ``plan.json`` give the same ``iteration_time_s`` and
``reference_time_s``, bit for bit; then the median ratio. Exit 1 if any plan differs.

Usage: python benchmarks/plan_ab_bench.py --baseline REF [--configs dlrm-16,dlrm-128]
       [--seeds 0,1,2] [--repeat 1] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from baseline_tree import install_ref, install_tree, remove_tree

ROOT = Path(__file__).resolve().parents[1]


def _plan(site: Path, config: Path, seed: int, out: Path, workers: int | None) -> float:
    env = dict(os.environ, PYTHONPATH=str(site))
    cmd = [sys.executable, "-m", "topoopt", "plan", str(config), "-o", str(out),
           "--seed", str(seed), "--no-report"]
    if workers:
        cmd += ["--workers", str(workers)]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, env=env, cwd=site, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd[2:])} failed ({site.name}):\n{run.stderr[-2000:]}")
    return time.perf_counter() - t0


def _times(plan_dir: Path) -> dict:
    doc = json.loads((plan_dir / "plan.json").read_text())
    return {k: doc.get(k) for k in ("iteration_time_s", "reference_time_s")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="git ref of the baseline checkout")
    ap.add_argument("--configs", default="dlrm-16", help="names in configs/, comma-separated")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side per case")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="topoopt-ab."))
    base_tree = None
    try:
        base_tree, base_site = install_ref(args.baseline, work)
        sites = {"baseline": base_site, "current": work / "current"}
        install_tree(ROOT, sites["current"])
        configs = [ROOT / "configs" / f"{c}.toml" for c in args.configs.split(",")]
        for side, site in sites.items():  # compile the kernels outside the clock
            _plan(site, ROOT / "configs" / "dlrm-16.toml", 0, work / f"warm-{side}", 1)
        print(f"baseline {args.baseline} vs the working tree; {args.repeat} run(s) each, "
              f"alternating")
        head = f"{'config':10} {'seed':>4} {'baseline s':>11} {'current s':>10} {'ratio':>6}  same"
        print(head + "\n" + "-" * len(head))
        ratios, differ = [], 0
        for config in configs:
            for seed in map(int, args.seeds.split(",")):
                wall: dict[str, list[float]] = {"baseline": [], "current": []}
                for r in range(args.repeat):
                    for side, site in sites.items():
                        out = work / f"{side}-{config.stem}-{seed}-{r}"
                        wall[side].append(_plan(site, config, seed, out, args.workers))
                same = all(_times(work / f"baseline-{config.stem}-{seed}-{r}")
                           == _times(work / f"current-{config.stem}-{seed}-{r}")
                           for r in range(args.repeat))
                differ += not same
                b, c = statistics.median(wall["baseline"]), statistics.median(wall["current"])
                ratios.append(c / b)
                print(f"{config.stem:10} {seed:>4} {b:11.1f} {c:10.1f} {c / b:6.2f}  "
                      f"{'yes' if same else 'NO'}")
        print(f"median ratio current / baseline: {statistics.median(ratios):.2f}; "
              f"{differ} plan(s) differ")
        return 1 if differ else 0
    finally:
        remove_tree(base_tree)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
