"""Plans at the sizes people train at: time, peak memory, result and growth per size.

Plans DLRM on ``configs/dlrm-128.toml``'s shard with ``servers`` raised and the tables
scaled with them (``--tables-per-server``, the issue's ``servers / 2``), each through
``topoopt plan`` as a user runs it (a subprocess, the config's effort unless
``--budget/--rounds/--chains``), then ``topoopt plan --check`` on what it wrote. Per
size it prints the wall time, the peak resident memory of the whole process tree (the
planner and its workers, summed, sampled every 0.1 s), whether the check passed, each
stage's result and end (the progress lines: fabric, best time, seconds since start),
every fabric's iteration time over the Ideal Switch's, and the growth exponent of the
CPU time (user + system of the process tree) between consecutive sizes
(``log(t2 / t1) / log(n2 / n1)``).

``--baseline REF`` plans the sizes up to ``--baseline-max`` with that git ref too (a
worktree installed with ``pip install --target``, as ``plan_ab_bench.py``) and prints
the ratio current / baseline. ``--quality N`` plans N servers again with 4x the budget
(seed 0) and prints each fabric's time at the default effort over its time at 4x: how
much of a fabric's gap to the Ideal Switch a longer search closes (the search) and how
much stays (the fabric). ``--llm GPUS,...`` plans an LLM config
(``--llm-config``, ``--llm-model``) at those GPU counts through the same ``plan`` path.
``--no-exports`` passes ``--no-exports`` to every plan: the search alone, without the
exports (Chakra traces, ASTRA-sim and NCCL files), whose cost grows with the plan the
search found (how many servers run each operator), not with the search.

Usage: python benchmarks/scale_bench.py [--sizes 128,256,512,1024] [--baseline main]
       [--quality 256] [--llm 1024,8192,16384] [--timeout 1800] [--no-exports]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from baseline_tree import install_ref, remove_tree

ROOT = Path(__file__).resolve().parents[1]
#: a stage's end in ``topoopt plan``'s progress (stderr, not a terminal)
_DONE = re.compile(r"^(?P<stage>[\w -]+?): done, best (?P<best>.+?) \((?P<how>[^)]*)\) "
                   r"\((?P<at>\d+) s\)$")


@dataclass
class Run:
    """One ``topoopt plan`` run: wall seconds, peak tree RSS, exit code, check result,
    stage ends and the plan's times per fabric."""

    label: str
    wall: float = math.nan
    peak_rss: float = 0.0
    cpu: float = math.nan
    code: int = -1
    check: str = "-"
    stages: list[str] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def _differ(current: dict[str, float], baseline: dict[str, float]) -> str:
    """``True``, or the fabrics whose times differ (current against baseline)."""
    diff = [f"{f} {current.get(f, math.nan):.6g} vs {baseline.get(f, math.nan):.6g}"
            for f in sorted(set(current) | set(baseline)) if current.get(f) != baseline.get(f)]
    return "True" if not diff else "False (" + ", ".join(diff) + ")"


def _tree_rss(root: int) -> float:
    """Bytes resident in ``root`` and every descendant (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    return total


def _children_cpu() -> float:
    """User + system seconds of this process's waited-for descendants so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd: list[str], env: dict, timeout: float, cwd: Path
         ) -> tuple[int, float, float, float, str, str]:
    """``(exit code, wall s, peak tree RSS bytes, CPU s of the tree, stdout, stderr)``;
    124 on timeout. The CPU time (user + system of the plan and the workers it
    waited for) is the number to compare on a shared machine."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=cwd)
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            peak[0] = max(peak[0], _tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        code = 124
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    return code, wall, peak[0], _children_cpu() - cpu0, out, err


def _config(template: Path, servers: int, folder: Path, table: str, key: str,
            value: object | None, model: str | None = None) -> Path:
    """``template`` with ``[cluster] servers`` (and ``[table] key``, ``[job] model``)
    replaced; written to ``folder``."""
    text = re.sub(r"(?m)^servers = \d+", f"servers = {servers}", template.read_text())
    if value is not None:
        text = re.sub(rf"(?m)^{key} = [\d_]+", f"{key} = {value}", text)
    if model is not None:
        text = re.sub(r'(?m)^model = "[^"]+"', f'model = "{model}"', text)
    path = folder / f"{template.stem}-{servers}-{value}.toml"
    path.write_text(text)
    return path


def plan_once(site: Path | None, config: Path, out: Path, extra: list[str], timeout: float,
              label: str) -> Run:
    """``topoopt plan config -o out`` (with ``site`` on PYTHONPATH, else this
    interpreter's), then ``topoopt plan --check out``."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    base = [sys.executable, "-m", "topoopt", "plan"]
    # ``-m`` puts the working folder first on sys.path: run outside any checkout, or a
    # run from the repository would import this tree's topoopt, not ``site``'s
    cwd = out.parent
    code, wall, peak, cpu, stdout, stderr = _run(
        base + [str(config), "-o", str(out), "--no-plots", "--no-report", *extra], env,
        timeout, cwd)
    run = Run(label, wall, peak, cpu, code)
    run.stages = [m.group(0) for m in map(_DONE.match, stderr.splitlines()) if m]
    run.skipped = [line for line in stdout.splitlines() if line.startswith("skipped")]
    if code != 0:
        run.check = "timeout" if code == 124 else f"failed: {stderr.strip().splitlines()[-1:]}"
        return run
    doc = json.loads((out / "plan.json").read_text())
    run.times = dict(doc["iteration_time_s"])
    check = subprocess.run(base + ["--check", str(out)], env=env, capture_output=True,
                           text=True, cwd=cwd)
    run.check = "pass" if check.returncode == 0 else (
        "FAIL " + (check.stdout + check.stderr).strip().splitlines()[-1])
    return run


def _print_runs(runs: list[tuple[int, Run]]) -> None:
    head = (f"{'size':>6} {'wall s':>8} {'CPU s':>8} {'peak GB':>8} {'growth':>7} "
            f"{'check':>6}  "
            "fabric / Ideal Switch")
    print(head + "\n" + "-" * len(head))
    prev: tuple[int, Run] | None = None
    for n, r in runs:
        growth = "-"
        if prev is not None and r.code == 0 and prev[1].code == 0:
            # of the CPU time: the wall time of a shared machine moves with its load
            growth = f"n^{math.log(r.cpu / prev[1].cpu) / math.log(n / prev[0]):.2f}"
        ideal = r.times.get("ideal")
        ratios = " ".join(f"{k} {v / ideal:.2f}" for k, v in r.times.items()) if ideal else ""
        print(f"{n:>6} {r.wall:8.1f} {r.cpu:8.1f} {r.peak_rss / 1e9:8.2f} {growth:>7} "
              f"{r.check[:6]:>6}  {ratios}")
        if r.check not in ("pass",):
            print(f"{'':>6} {r.check}")
        for line in r.stages:
            print(f"{'':>8}stage {line}")
        for line in r.skipped:
            print(f"{'':>8}{line}")
        prev = (n, r)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128,256,512,1024", help="servers, comma-separated")
    ap.add_argument("--tables-per-server", type=float, default=0.5,
                    help="DLRM tables per server [default: 0.5, the issue's servers / 2]")
    ap.add_argument("--budget", type=int, help="--budget of every plan [default: config's]")
    ap.add_argument("--rounds", type=int, help="--rounds [default: config's]")
    ap.add_argument("--chains", type=int, help="--chains [default: config's]")
    ap.add_argument("--workers", type=int, help="--workers [default: all cores]")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per plan")
    ap.add_argument("--no-exports", action="store_true",
                    help="plan without the exports: the search's time alone")
    ap.add_argument("--baseline", help="git ref planned beside the working tree")
    ap.add_argument("--baseline-max", type=int, default=256,
                    help="largest size the baseline plans [default: 256]")
    ap.add_argument("--quality", type=int, default=0,
                    help="servers planned again at 4x the budget (0: none)")
    ap.add_argument("--llm", default="", help="GPU counts of the LLM section (e.g. 1024,16384)")
    ap.add_argument("--llm-config", default="llama3-70b", help="config in configs/")
    ap.add_argument("--llm-model", default="llama3-405b", help="[job] model of the LLM runs")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="topoopt-scale."))
    template = ROOT / "configs" / "dlrm-128.toml"
    effort = [f"--{k}={v}" for k in ("budget", "rounds", "chains", "workers")
              if (v := getattr(args, k)) is not None]
    effort += ["--no-exports"] * args.no_exports
    tree = None
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        sides: dict[str, Path | None] = {"current": None}
        if args.baseline:
            tree, sides["baseline"] = install_ref(args.baseline, work)
        print(f"DLRM, tables = {args.tables_per_server:g} x servers, effort "
              f"{' '.join(effort) or 'of the config'}; {os.cpu_count()} cores")
        # a fresh install compiles its numba kernels on its first plan (then caches
        # them on disk): a small plan per side first, so no measured run pays for it
        warm = _config(template, 8, work, "job.size", "tables", 4)
        for side, site in sides.items():
            plan_once(site, warm, work / f"warm-{side}", ["--budget=1", "--workers=1"],
                      args.timeout, "warm-up")
        current: list[tuple[int, Run]] = []
        for n in sizes:
            tables = max(1, round(n * args.tables_per_server))
            cfg = _config(template, n, work, "job.size", "tables", tables)
            for side, site in sides.items():
                if side == "baseline" and n > args.baseline_max:
                    continue
                r = plan_once(site, cfg, work / f"{side}-{n}", effort, args.timeout, side)
                if side == "current":
                    current.append((n, r))
                else:
                    cur = current[-1][1]
                    print(f"  {n} servers: current {cur.wall:.1f} s ({cur.cpu:.1f} CPU s), "
                          f"baseline {r.wall:.1f} s ({r.cpu:.1f} CPU s), ratio "
                          f"{cur.wall / r.wall:.2f} wall, {cur.cpu / r.cpu:.2f} CPU; "
                          f"peak RSS {cur.peak_rss / 1e9:.2f} vs {r.peak_rss / 1e9:.2f} GB; "
                          f"same times: {_differ(cur.times, r.times)}", flush=True)
        _print_runs(current)
        if args.quality:
            _quality(args, template, work, effort)
        if args.llm:
            _llm(args, work, sides)
        return 0
    finally:
        remove_tree(tree)
        shutil.rmtree(work, ignore_errors=True)


def _quality(args: argparse.Namespace, template: Path, work: Path, effort: list[str]) -> None:
    """The ``--quality`` section: each fabric at the default effort and at 4x."""
    n = args.quality
    tables = max(1, round(n * args.tables_per_server))
    cfg = _config(template, n, work, "job.size", "tables", tables)
    budget = args.budget or int(re.search(r"(?m)^budget = (\d+)", cfg.read_text()).group(1))
    base = [e for e in effort if not e.startswith("--budget")]
    runs = {b: plan_once(None, cfg, work / f"quality-{b}", base + [f"--budget={b}", "--seed=0"],
                         args.timeout, f"budget {b}") for b in (budget, 4 * budget)}
    print(f"\nquality at {n} servers, seed 0: budget {budget} vs {4 * budget}")
    head = f"{'fabric':10} {'x1 ms':>9} {'x4 ms':>9} {'x1/x4':>6} {'x1/ideal':>9} {'x4/ideal':>9}"
    print(head + "\n" + "-" * len(head))
    one, four = runs[budget], runs[4 * budget]
    for k in one.times:
        a, b = one.times[k], four.times.get(k, math.nan)
        print(f"{k:10} {a * 1e3:9.2f} {b * 1e3:9.2f} {a / b:6.3f} "
              f"{a / one.times['ideal']:9.2f} {b / four.times['ideal']:9.2f}")
    print(f"wall: {one.wall:.0f} s ({one.cpu:.0f} CPU s) at x1, {four.wall:.0f} s "
          f"({four.cpu:.0f} CPU s) at x4; checks {one.check}, "
          f"{four.check}")


def _llm(args: argparse.Namespace, work: Path, sides: dict[str, Path | None]) -> None:
    """The ``--llm`` section: an LLM config planned at the given GPU counts, and with
    ``--baseline`` the same plan by the baseline (sizes up to ``--baseline-max``
    servers) right after it, with the ratio of their wall times."""
    template = ROOT / "configs" / f"{args.llm_config}.toml"
    per = int(re.search(r"(?m)^gpus_per_server = (\d+)", template.read_text()).group(1))
    runs = []
    for gpus in (int(g) for g in args.llm.split(",") if g):
        n = gpus // per
        cfg = _config(template, n, work, "cluster", "servers", None, args.llm_model)
        cur = plan_once(None, cfg, work / f"llm-{gpus}", [], args.timeout, "llm")
        runs.append((n, cur))
        if sides.get("baseline") is not None and n <= args.baseline_max:
            r = plan_once(sides["baseline"], cfg, work / f"llm-base-{gpus}", [],
                          args.timeout, "baseline")
            print(f"  LLM {gpus} GPUs: current {cur.wall:.1f} s, baseline {r.wall:.1f} s, "
                  f"ratio {cur.wall / r.wall:.2f}; same times: {cur.times == r.times}",
                  flush=True)
    print(f"\n{args.llm_model} ({args.llm_config} with servers and model changed), "
          f"{per} GPUs per server; sizes in servers")
    _print_runs(runs)


if __name__ == "__main__":
    sys.exit(main())
