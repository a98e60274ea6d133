"""Export speed: render, write and read back every export of a ring plan, n = 16..128.

Run: ``python benchmarks/export_bench.py [--sizes 16,64,128] [--rings 4]``. Each plan is
``rings`` ring permutations over all ``n`` servers (coprime strides, one NIC port each,
d = rings, 8 GPUs per server), the shape TopoOpt gives a data-parallel job. Prints
per size: time to render all files, to write them, to check them back (parse and
cross-check everything, without and with the MSCCL simulation), the MSCCL file size
and channel count, and the MSCCL parse time of our strict reader next to
``xml.etree.ElementTree`` (a baseline that checks only well-formedness).

``--plans DIR[,DIR...] [--baseline REF] [--repeat 3]`` instead renders, from each saved
plan folder's ``plan.json`` (``topoopt plan -o DIR``), what
:func:`topoopt.export.plan_dir.write_plan` renders besides the pictures: the exports,
the Chakra traces (built, then encoded), the other ecosystem files and the report, in
a fresh process per run (``--repeat`` runs, medians); with ``--baseline`` the same
runs with that git ref's code (a worktree in a temporary folder), side by side, and
whether every rendered file has the same sha256 on both sides. Prints CPU seconds per
stage, of the process (imports included) and its peak RSS.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "--tree" in sys.argv:      # a worker of --plans: the code of that tree
    sys.path.insert(0, sys.argv[sys.argv.index("--tree") + 1])
else:
    sys.path.insert(0, str(ROOT))

from topoopt.cluster import Cluster  # noqa: E402
from topoopt.commands._common import print_table  # noqa: E402
from topoopt.export import check_exports, render_exports, write_exports  # noqa: E402
from topoopt.export.msccl import parse_msccl_xml  # noqa: E402
from topoopt.topology.topology import Topology  # noqa: E402


def ring_plan(n: int, rings: int):
    strides = [p for p in range(1, n) if math.gcd(p, n) == 1][:rings]
    links, orders = [], []
    for port, p in enumerate(strides):
        links += [(i, port, (i + p) % n, port) for i in range(n)]
        orders.append(tuple((p * i) % n for i in range(n)))
    topo = Topology(n, len(strides), tuple(links), 100e9)
    cluster = Cluster(servers=n, nics=len(strides), link_bandwidth=100e9, gpus_per_server=8)
    return topo, {tuple(range(n)): tuple(orders)}, cluster


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def plan_worker(directory: str) -> None:
    """Render one plan folder's exports stage by stage; print CPU s, RSS and hashes."""
    from topoopt.export import ecosystem
    from topoopt.export.chakra import encode_chakra_traces, operator_chakra_traces
    from topoopt.export.chakra_llm import llm_chakra_traces
    from topoopt.export.report import build_report
    from topoopt.plans.common import cluster_job_of, read_plan, rings_of, topology_of

    doc = read_plan(directory)
    cluster, _ = cluster_job_of(doc)
    files: dict[str, bytes] = {}
    cpu: dict[str, float] = {}

    def stage(name, fn):
        t = time.process_time()
        out = fn()
        cpu[name] = time.process_time() - t
        return out

    r = stage("exports", lambda: render_exports(topology_of(doc), rings_of(doc), cluster))
    files.update({k: v.encode() for k, v in r.files.items()})
    traces = stage("chakra build", lambda: llm_chakra_traces(doc) if "llm" in doc
                   else operator_chakra_traces(doc))
    files.update(stage("chakra encode", lambda: encode_chakra_traces(traces)))
    files.update(stage("ecosystem rest", lambda: ecosystem._plain_files(doc)[0]))
    files["report.html"] = stage("report", lambda: build_report(doc)).encode()
    digest = hashlib.sha256()
    for k in sorted(files):
        digest.update(k.encode() + b"\0" + hashlib.sha256(files[k]).digest())
    print(json.dumps({"cpu": cpu, "files": len(files), "sha256": digest.hexdigest(),
                      "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def _plan_runs(tree: Path, directory: str, repeat: int) -> list[dict]:
    runs = []
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--tree",
                              str(tree), "--worker", directory], check=True,
                             capture_output=True, text=True, cwd=tempfile.gettempdir(),
                             env={**os.environ, "PYTHONPATH": str(tree)}).stdout
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        run = json.loads(out.strip().splitlines()[-1])
        run["process"] = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
        runs.append(run)
    return runs


def plan_main(args: argparse.Namespace) -> None:
    """``--plans``: stage CPU medians per plan folder, beside ``--baseline``."""
    with tempfile.TemporaryDirectory() as work:
        sides = {"current": ROOT}
        if args.baseline:
            sides["baseline"] = Path(work) / "baseline"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach",
                            str(sides["baseline"]), args.baseline], check=True)
        try:
            for directory in args.plans.split(","):
                runs = {side: _plan_runs(tree, directory, args.repeat)
                        for side, tree in sides.items()}
                _print_plan(directory, runs)
        finally:
            if args.baseline:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(sides["baseline"])], check=True)


def _print_plan(directory: str, runs: dict[str, list[dict]]) -> None:
    med = {side: {k: statistics.median(r["cpu"][k] for r in rs) for k in rs[0]["cpu"]}
           | {"process (with imports)": statistics.median(r["process"] for r in rs),
              "peak RSS GB": statistics.median(r["rss"] for r in rs) / 1e9}
           for side, rs in runs.items()}
    for m in med.values():
        m["stages total"] = sum(v for k, v in m.items() if k in runs["current"][0]["cpu"])
    cur = runs["current"][0]
    print(f"{directory}: {cur['files']} files, CPU s (median of {len(runs['current'])})")
    rows = []
    for key in med["current"]:
        row = [key, f"{med['current'][key]:.2f}"]
        if "baseline" in med:
            b = med["baseline"][key]
            row += [f"{b:.2f}", f"{med['current'][key] / b:.2f}x" if b else "-"]
        rows.append(row)
    print_table(["stage", "current"] + (["baseline", "ratio"] if "baseline" in med else []),
                rows)
    if "baseline" in runs:
        same = {r["sha256"] for rs in runs.values() for r in rs}
        print("every file the same sha256 on both sides:", "yes" if len(same) == 1 else "NO")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,64,128")
    ap.add_argument("--rings", type=int, default=4)
    ap.add_argument("--plans", help="saved plan folders instead of ring plans")
    ap.add_argument("--baseline", help="git ref run beside the working tree (--plans)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return plan_worker(args.worker)
    if args.plans:
        return plan_main(args)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        topo, rings, cluster = ring_plan(n, args.rings)
        rendered, t_render = timed(lambda: render_exports(topo, rings, cluster))
        with tempfile.TemporaryDirectory() as d:
            _, t_write = timed(lambda: write_exports(d, topo, rings, cluster))
            _, t_check = timed(lambda: check_exports(d, topo, rings, cluster, simulate=False))
            _, t_sim = timed(lambda: check_exports(d, topo, rings, cluster, simulate=True))
        xml = rendered.files["msccl_allreduce.xml"]
        algo, t_parse = timed(lambda: parse_msccl_xml(xml))
        _, t_et = timed(lambda: ET.fromstring(xml))
        rows.append((n, len(rendered.files), f"{t_render:.2f}", f"{t_write:.2f}",
                     f"{t_check:.2f}", f"{t_sim:.2f}", f"{len(xml) / 1e6:.1f}",
                     algo.nchannels, f"{t_parse:.2f}", f"{t_et:.2f}",
                     f"{t_parse / t_et:.1f}x"))
    print_table(["n", "files", "render s", "write s", "check s", "check+sim s", "MSCCL MB",
                 "channels", "parse s", "etree s", "parse/etree"], rows)


if __name__ == "__main__":
    main()
