"""The report's cost: size of report.html and the time to build it, against `topoopt plan`.

Run: ``python benchmarks/report_bench.py [--configs configs/dlrm-16.toml,configs/dlrm-128.toml]
[--workers 2] [--repeat 5] [--dirs DIR,...]``. Per config it runs ``topoopt plan CONFIG
-o TMP --no-report`` once (wall time, the baseline), then times, in-process and
``--repeat`` times (median), what the report adds to that run (build the page from
``plan.json`` and write it, as :func:`topoopt.export.plan_dir.write_plan` does) and what
``plan --check`` adds (:func:`topoopt.export.report.check_report`); then runs the same
plan with the report (``--report``, the default) for the wall time side by side (on a
shared machine its difference is mostly noise; the in-process share is the measure). ``--dirs`` instead
times existing plan folders (no plan run, no ratio). Prints the page's size, its
numbers, servers and links, both times, and the report's share of the plan's time
(the target: at most 5%).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from topoopt._io import atomic_write_text  # noqa: E402
from topoopt.commands._common import print_table  # noqa: E402
from topoopt.export.report import build_report, check_report  # noqa: E402
from topoopt.plans import read_plan  # noqa: E402


def _median_time(fn, repeat: int) -> tuple[object, float]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, statistics.median(times)


def _row(name: str, directory: Path, plan_s: float | None, repeat: int) -> list:
    doc = read_plan(directory)
    doc["files"] = sorted({*doc.get("files", ["plan.json"]), "report.html"})
    page = directory / "report.html"

    def build():
        text = build_report(doc)
        atomic_write_text(page, text)
        return text

    text, build_s = _median_time(build, repeat)
    found, check_s = _median_time(lambda: check_report(text, doc), repeat)
    share = f"{100 * build_s / plan_s:.2f}%" if plan_s else "-"
    return [name, doc["cluster"]["servers"], len(doc["topology"]["links"]),
            f"{len(text.encode()) / 1e3:,.0f}", found["fields"],
            f"{plan_s:.1f}" if plan_s else "-", f"{build_s:.3f}", f"{check_s:.3f}", share]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="configs/dlrm-16.toml,configs/dlrm-128.toml")
    ap.add_argument("--dirs", default="", help="existing plan folders instead of --configs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rows = []
    if args.dirs:
        for d in args.dirs.split(","):
            rows.append(_row(d, Path(d), None, args.repeat))
    else:
        for config in args.configs.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                walls = {}
                for flag in ("--no-report", "--report"):  # the same plan, side by side
                    out = Path(tmp) / flag.strip("-")
                    t = time.perf_counter()
                    subprocess.run([sys.executable, "-m", "topoopt", "plan", config, "-o",
                                    str(out), flag, "--quiet", "--workers", str(args.workers)],
                                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
                    walls[flag] = time.perf_counter() - t
                row = _row(Path(config).stem, out.parent / "no-report", walls["--no-report"],
                           args.repeat)
                rows.append(row + [f"{walls['--report']:.1f}"])
    print_table(["plan", "servers", "links", "report kB", "numbers", "plan s (no report)",
                 "build+write s", "check s", "report / plan", "plan s (report)"][:len(rows[0])],
                rows)


if __name__ == "__main__":
    main()
