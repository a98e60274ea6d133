"""DLRM dense layers: predicted against TopoOpt's measured forward + backward times.

TopoOpt's repository publishes the per-operator times its simulations used
(``benchmarks/data/topoopt_dlrm_measure_<batch>_128.json``, see ``SOURCES.md``):
forward and backward milliseconds of each DLRM layer at global batch ``<batch>``,
split over ``d`` data-parallel GPUs. For each dense layer and ``d`` this prints the
measured time, the planner's (:func:`topoopt.compute.op_time`, which times dense layers
with :mod:`topoopt.kernels`; A100, TF32) and, as the baseline in the same run, the flat
model it replaced (``FLOPs / (peak x compute_efficiency)``), then the geometric mean
and the worst ratio of each over degrees 8-128. The kernel model is fitted on the
32,768 file; the other batch sizes are held out (``--held-out`` prints their summary).

Usage::

    python benchmarks/dlrm_layers.py [--degrees 8,16,32,64,128] [--held-out]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topoopt.cluster import GPUS, Cluster  # noqa: E402
from topoopt.compute import op_time  # noqa: E402
from topoopt.strategy import OpConfig  # noqa: E402
from topoopt.workloads.layers import dense  # noqa: E402

DIR = Path(__file__).resolve().parent / "data"
DATA = DIR / "topoopt_dlrm_measure_32768_128.json"
HELD_OUT = tuple(DIR / f"topoopt_dlrm_measure_{b}_128.json"
                 for b in (65536, 131072, 262144, 524288, 1048576))


def rows(path: Path = DATA) -> list[tuple[int, int, int, float, float]]:
    """(d_in, d_out, degree, fwd s, bwd s) of every dense layer measured."""
    doc = json.loads(path.read_text())
    out = []
    for m in doc["measurements"]:
        if m["name"].startswith("Dense_"):
            _, a, b = m["name"].split("_")
            out.append((int(a), int(b), int(m["pc_str"].split("-")[-1]),
                        m["fw_time"] * 1e-3, m["bw_time"] * 1e-3))
    return sorted(out)


def compare(path: Path, degrees: set[int], show: bool) -> dict[str, list[float]]:
    """Predicted over measured fwd + bwd of each layer at ``degrees``, per model."""
    batch = json.loads(path.read_text())["batch_size"]
    cluster = Cluster(servers=128, nics=1, link_bandwidth=100e9, gpus_per_server=1,
                      gpu=GPUS["A100"])
    flat = cluster.peak_flops("fp32") * cluster.compute_efficiency
    if show:
        print(f"{'layer':>14} {'dp':>4} {'measured ms':>12} {'model ms':>9} {'ratio':>6} "
              f"{'flat ms':>8} {'ratio':>6}")
    ratios: dict[str, list[float]] = {"model": [], "flat": []}
    for d_in, d_out, deg, fw, bw in rows(path):
        op = dense("layer", d_in, d_out, ("x",))
        f, b = op_time(op, OpConfig(tuple(range(deg)), deg), cluster, "fp32", 4, batch)
        old = (op.fwd_flops + op.bwd_flops) * batch / deg / flat
        r, r_old = (f + b) / (fw + bw), old / (fw + bw)
        if deg in degrees:
            ratios["model"].append(r)
            ratios["flat"].append(r_old)
        if show:
            print(f"{d_in:>7}x{d_out:<6} {deg:>4} {1e3 * (fw + bw):>12.4f} "
                  f"{1e3 * (f + b):>9.4f} {r:>6.2f} {1e3 * old:>8.4f} {r_old:>6.3f}")
    return ratios


def summary(rs: list[float]) -> str:
    gm = math.exp(sum(math.log(x) for x in rs) / len(rs))
    worst = max(rs, key=lambda x: abs(math.log(x)))
    return f"geometric mean {gm:.3f}, worst {worst:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--degrees", default="8,16,32,64,128",
                    help="data-parallel degrees summarised (default 8,16,32,64,128)")
    ap.add_argument("--held-out", action="store_true",
                    help="also summarise the held-out batch sizes (65,536 to 1,048,576)")
    args = ap.parse_args(argv)
    degrees = {int(x) for x in args.degrees.split(",")}
    for name, rs in compare(DATA, degrees, show=True).items():
        print(f"{name}: {summary(rs)} (degrees {sorted(degrees)}, {len(rs)} points)")
    if args.held_out:
        for path in HELD_OUT:
            got = compare(path, degrees, show=False)
            print(f"held out {path.name}: model {summary(got['model'])}; "
                  f"flat {summary(got['flat'])} ({len(got['model'])} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
