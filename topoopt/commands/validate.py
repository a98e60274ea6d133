"""``topoopt validate DIR``: a plan's iteration replayed on ns-3, per fabric, next to its prediction."""

from __future__ import annotations

import json

import click

from topoopt._io import atomic_write_text
from topoopt.commands._common import output_file, print_table
from topoopt.netsim.ns3.config import Ns3Config
from topoopt.plans.replay import validate_plan
from topoopt.units import format_time

__all__ = ["validate"]


@click.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--fabric", "fabrics", multiple=True,
              help="Fabric to replay (repeatable; default: every fabric in plan.json).")
@click.option("--mtu", type=click.IntRange(576, 65535), default=9000,
              help="IP MTU in bytes (9000: jumbo frames; 1500 is ~5x slower to simulate).")
@click.option("--rings", "ring_mode", type=click.Choice(["hops", "steps"]), default="hops",
              help="An AllReduce ring as concurrent hop flows (the estimator's pipelined "
                   "ring) or as the 2(g-1)-step ring algorithm.")
@click.option("--ecmp", type=click.Choice(["split", "hash"]), default="split",
              help="A multipath route as one TCP flow per path (its share of the bytes) or "
                   "one flow on a path drawn by weight (per-flow ECMP hashing).")
@click.option("--iterations", type=click.IntRange(1, 1000), default=2,
              help="Iterations run back to back in ns-3; the last is reported (warm TCP).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="Write every row (with breakdowns) to this JSON file.")
def validate(directory, fabrics, mtu, ring_mode, ecmp, iterations, json_out) -> None:
    """Replay one training iteration of the plan in DIR on the ns-3 packet simulator
    (DCTCP over RED/ECN switches, TCP flows pinned to the plan's routes, compute as
    delays) and print, per fabric, the time plan.json predicted, the flow-level time
    of the same task graph (with header and ACK overheads) and the ns-3 time.

    Needs the packet extra (pip install 'topoopt[packet]'). A DLRM-16 plan takes a few
    minutes per fabric; --fabric picks fewer.
    """
    output_file(json_out, "--json")
    cfg = Ns3Config(mtu=mtu)

    def show(row: dict) -> None:
        click.echo(f"  {row['fabric']}: ns-3 {format_time(row['ns3_s'])} in "
                   f"{row['ns3_wall_s']:.0f} s", err=True)

    rows = validate_plan(directory, fabrics or None, cfg, iterations=iterations,
                         ring_mode=ring_mode, ecmp=ecmp, progress=show)
    print_table(["fabric", "predicted", "flow-level", "ns-3", "flow err", "predicted err",
                 "flow wall", "ns-3 wall"],
                [[r["fabric"], format_time(r["predicted_s"]), format_time(r["flow_s"]),
                  format_time(r["ns3_s"]), f"{100 * r['error']:+.1f}%",
                  f"{100 * r['predicted_error']:+.1f}%", f"{r['flow_wall_s']:.2f} s",
                  f"{r['ns3_wall_s']:.1f} s"] for r in rows])
    click.echo(f"predicted: plan.json; flow-level: per-pair flows with packet overheads "
               f"(MTU {mtu}); ns-3: iteration {iterations} of {iterations}, rings as "
               f"{ring_mode}, ECMP {ecmp}")
    if json_out:
        atomic_write_text(json_out, json.dumps({"plan": str(directory), "mtu": mtu,
                                                "rings": ring_mode, "ecmp": ecmp,
                                                "iterations": iterations, "fabrics": rows},
                                               indent=1) + "\n")
