"""Export speed: render, write and read back every export of a ring plan, n = 16..128.

Run: ``python benchmarks/export_bench.py [--sizes 16,64,128] [--rings 4]``. Each plan is
``rings`` ring permutations over all ``n`` servers (coprime strides, one NIC port each,
d = rings, 8 GPUs per server), the shape TopoOpt gives a data-parallel job. Prints
per size: time to render all files, to write them, to check them back (parse and
cross-check everything, without and with the MSCCL simulation), the MSCCL file size
and channel count, and the MSCCL parse time of our strict reader next to
``xml.etree.ElementTree`` (a baseline that checks only well-formedness).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,64,128")
    ap.add_argument("--rings", type=int, default=4)
    args = ap.parse_args()
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
