"""Does the plan depend on the seed? Best iteration time per fabric over seeds, against more
effort and against a baseline version's search.

For each config (default: configs/dlrm-16.toml, configs/dlrm-128.toml,
configs/bert-128.toml) it runs ``topoopt plan`` at the config's effort for seeds 0-4,
once at ``--effort`` times the budget (seed 0), and -- with ``--baseline REV`` -- the
baseline revision's own ``plan`` command for the same seeds (checked out with ``git
worktree``, run in a subprocess). It prints, per fabric: every seed's time, the spread
(max / min, target <= 1.03), the gap of the worst seed to the long run (target <= 2%),
and the baseline's best seed with the ratio to it (target: never slower), plus each
run's wall time.

Run: ``python benchmarks/search_bench.py [--configs dlrm-16] [--seeds 0,1,2,3,4]
[--effort 10] [--baseline 9b813ff] [--workers 2]``.
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


def run_plan(tree: Path, argv: list[str], out: Path) -> tuple[dict, float]:
    """``plan CONFIG -o OUT ...`` of the version in ``tree``; (iteration times, seconds)."""
    entry = ["-m", "topoopt"] if (tree / "topoopt" / "__main__.py").exists() else ["cli.py"]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *entry, "plan", *argv, "-o", str(out), "--no-plots",
                    "--no-exports", "--quiet"], cwd=tree, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(tree)})
    return json.loads((out / "plan.json").read_text())["iteration_time_s"], \
        time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="dlrm-16,dlrm-128,bert-128")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--effort", type=int, default=10, help="budget multiple of the long run")
    ap.add_argument("--baseline", default=None, help="git revision to compare with")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    base_tree = None
    if args.baseline:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from mcmc_bench import baseline_tree

        base_tree = baseline_tree(args.baseline)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            config = ROOT / "configs" / f"{name}.toml"
            plan_table = _plan_table(config)
            runs, walls = {}, {}
            for s in seeds:
                runs[s], walls[s] = run_plan(ROOT, [str(config), "--seed", str(s),
                                                    "--workers", str(args.workers)],
                                             Path(tmp) / f"{name}-{s}")
                print(f"{name} seed {s}: {walls[s]:.1f} s", flush=True)
            budget = plan_table.get("budget", 200) * args.effort
            long, long_wall = run_plan(ROOT, [str(config), "--seed", "0", "--budget",
                                              str(budget), "--workers", str(args.workers)],
                                       Path(tmp) / f"{name}-long")
            print(f"{name} {args.effort}x effort: {long_wall:.1f} s", flush=True)
            base = {}
            if base_tree is not None:
                for s in seeds:
                    base[s], w = run_plan(base_tree, [str(config), "--seed", str(s),
                                                      "--workers", str(args.workers)],
                                          Path(tmp) / f"{name}-base-{s}")
                    print(f"{name} baseline seed {s}: {w:.1f} s", flush=True)
            print(f"\n{name}: ms per iteration (seeds {args.seeds}; long = {args.effort}x "
                  f"budget, seed 0)")
            head = ["fabric", *(f"s{s}" for s in seeds), "spread", f"{args.effort}x",
                    "worst/long"]
            if base:
                head += ["base best", "best/base"]
            rows = []
            for fabric in runs[seeds[0]]:
                values = [runs[s][fabric] for s in seeds]
                row = [fabric, *(f"{v * 1e3:.2f}" for v in values),
                       f"{max(values) / min(values):.3f}", f"{long[fabric] * 1e3:.2f}",
                       f"{max(values) / long[fabric]:.3f}"]
                if base:
                    b = min(base[s][fabric] for s in seeds)
                    row += [f"{b * 1e3:.2f}", f"{max(values) / b:.3f}"]
                rows.append(row)
            _table(head, rows)
            print(f"wall: seeds {min(walls.values()):.1f}-{max(walls.values()):.1f} s, "
                  f"long {long_wall:.1f} s\n", flush=True)


def _plan_table(config: Path) -> dict:
    import tomllib

    return tomllib.loads(config.read_text()).get("plan", {})


def _table(headers, rows):
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
