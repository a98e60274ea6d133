"""``topoopt react run``: REACT on the real runtime (torch.distributed, gloo) with local ranks."""

from __future__ import annotations

import json
import re

import click

from topoopt._io import atomic_write_text
from topoopt.commands._common import SEED, options_named, output_file, print_react_comparison
from topoopt.errors import ConfigError
from topoopt.react.loop import ReactParams
from topoopt.react.runtime._torch import require_torch
from topoopt.react.runtime.experiment import RunSpec, SlowRank, fluid_prediction, run_runtime
from topoopt.units import format_time, parse_bandwidth, parse_size, parse_time

__all__ = ["run"]

#: Local ranks (--nprocs): each is a process with torch loaded (~300 MB).
MAX_NPROCS = 64


def _rings(values: tuple[str, ...], nprocs: int) -> tuple[tuple[int, ...], ...] | None:
    out = []
    for v in values:
        if not re.fullmatch(r"\s*\d+(\s*,\s*\d+)+\s*", v):
            raise ConfigError("--ring", v, "give ranks separated by commas, e.g. 0,2,1,3")
        ring = tuple(int(x) for x in v.split(","))
        if sorted(ring) != list(range(nprocs)):  # checked before any rank starts
            raise ConfigError("--ring", v, f"must list every rank 0..{nprocs - 1} once "
                                           f"(--nprocs {nprocs})")
        out.append(ring)
    return tuple(out) or None


@click.command()
@click.option("--nprocs", type=click.IntRange(2, MAX_NPROCS), default=8,
              help="Local ranks to launch.")
@click.option("--collective", type=click.Choice(["tree", "ring", "rd-allgather",
                                                 "multi-ring"]),
              default="tree", help="tree: NCCL double binary tree AllReduce; ring: ring "
                                   "AllReduce on --ring (default 0..n-1); multi-ring: one "
                                   "ring per --ring (a TopoOpt plan's rings); rd-allgather: "
                                   "recursive-doubling AllGather.")
@click.option("--ring", "rings", multiple=True, metavar="ORDER",
              help="Ring order, e.g. 0,3,6,1,4,7,2,5 (repeatable for multi-ring).")
@click.option("--size", default="20MB", help="Bytes per collective (float32 elements).")
@click.option("--epochs", type=click.IntRange(1, 100_000), default=100,
              help="Epochs per run (baseline and REACT).")
@click.option("--warmup", type=click.IntRange(0), default=25,
              help="Epochs left out of the means.")
@click.option("--slow-rank", type=click.IntRange(0), default=None,
              help="Slow this rank's traffic: runs every rank in its own network namespace "
                   "with shaped links (needs root and iproute2).")
@click.option("--slow-mode", type=click.Choice(["flows", "rate"]), default="flows",
              help="flows: --p greedy external TCP flows into the rank; rate: its link "
                   "shaped to --slow-rate.")
@click.option("--p", "flows", type=click.IntRange(1, 1024), default=2,
              help="External flows into the slow rank.")
@click.option("--slow-rate", default="100Mbps", help="Link rate of the slow rank (rate mode).")
@click.option("--link-rate", default="1Gbps",
              help="Rate of every rank's link on the namespace testbed.")
@click.option("--network", type=click.Choice(["auto", "loopback", "netns"]), default="auto",
              help="loopback: all ranks on 127.0.0.1; netns: the shaped testbed; auto: netns "
                   "when --slow-rank is given.")
@click.option("--batch", type=click.IntRange(1, 10_000), default=6,
              help="REACT's B: epochs per measured batch.")
@click.option("--slack", type=click.IntRange(0, 10_000), default=5,
              help="Epochs the old pattern keeps running while the leader decides.")
@click.option("--seed", type=SEED, default=0, help="Seed of REACT's random choices.")
@click.option("--timeout", default="1h", help="Give up (and kill the ranks) after this long.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="Write per-epoch times, swaps and the final pattern to this JSON file.")
def run(nprocs, collective, rings, size, epochs, warmup, slow_rank, slow_mode, flows,
        slow_rate, link_rate, network, batch, slack, seed, timeout, json_out) -> None:
    """Run a collective for --epochs epochs on N local torch.distributed (gloo) ranks,
    without and then with REACT (RCollective + RTuner), and print mean and p95 collective
    time, algorithm bandwidth and the swaps REACT made -- the table of `react simulate`,
    measured on a real network stack. With --slow-rank it also prints the fluid model's
    prediction for the same setting (the flow-level simulator of `react simulate`, on a
    one-switch star with every link at --link-rate).

    \b
    Examples:
      topoopt react run --nprocs 4 --size 4MB --epochs 40
      topoopt react run --nprocs 8 --collective tree --size 20MB --epochs 100 --slow-rank 2
    """
    import os

    output_file(json_out, "--json")
    # the ranks fork from a server that imports torch: quiet c10d's per-socket warnings
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

    require_torch()
    named = options_named(warmup="--warmup", epochs="--epochs", slow_rank="--slow-rank",
                          network="--network", size="--size", nprocs="--nprocs",
                          slack="--slack", rings="--ring", collective="--collective")
    with named:
        spec = RunSpec(collective=collective, nprocs=nprocs, size=parse_size(size, "--size"),
                       epochs=epochs, warmup=warmup, rings=_rings(rings, nprocs),
                       params=ReactParams(batch=batch, seed=seed), slack=slack)
        slow = None
        if slow_rank is not None:
            slow = SlowRank(slow_rank, slow_mode, flows,
                            parse_bandwidth(slow_rate, "--slow-rate"))
        rate = parse_bandwidth(link_rate, "--link-rate")
        res = run_runtime(spec, slow, network=network, link_rate=rate,
                          timeout=parse_time(timeout, "--timeout"))
    where = ("127.0.0.1" if res.network == "loopback"
             else f"namespaces, links {link_rate}")
    what = "" if slow is None else (
        f", rank {slow.rank} slowed ({slow.flows} external flows)" if slow.mode == "flows"
        else f", rank {slow.rank} slowed (link {slow_rate})")
    click.echo(f"{spec.collective}, {nprocs} ranks (gloo, {where}){what}, "
               f"{spec.size / 1e6:g} MB, {epochs} epochs per run")
    print_react_comparison(res, spec.size, warmup, epochs)
    for e, _, swaps, rev in res.changes:
        label = ("revert" + (", then " if swaps else "")) if rev else ""
        click.echo(f"  epoch {e:>3}: {label}{' '.join(swaps) if swaps else ''}")
    if res.dropped:
        click.echo(f"decisions not adopted in time (kept the pattern): batches "
                   f"{', '.join(map(str, res.dropped))}")
    for which, (share, count, seconds) in res.share.items():
        click.echo(f"critical path, {which}: {format_time(seconds)} ({100 * share:.0f}%) in "
                   f"{count} flow(s) of slowed rank {slow_rank}")
    predicted = None
    if slow is not None:
        # the same setting on the flow-level simulator (react simulate --backend flow)
        predicted = fluid_prediction(spec, slow, rate, seed=seed)
        click.echo(f"fluid model, same setting (one switch, links {link_rate}): "
                   f"{format_time(predicted.mean('baseline'))} without, "
                   f"{format_time(predicted.mean('react'))} with REACT, "
                   f"{100 * predicted.improvement:+.1f}% (measured "
                   f"{100 * res.improvement:+.1f}%)")
    if res.wrong_epochs:
        click.echo(f"WARNING: {res.wrong_epochs} epoch results differed from the exact sum",
                   err=True)
    if json_out:
        doc = res.to_json()
        if predicted is not None:
            doc["fluid_prediction"] = {
                "baseline_mean_s": predicted.mean("baseline"),
                "react_mean_s": predicted.mean("react"),
                "improvement": predicted.improvement,
                "changes": [{"epoch": e, "swaps": list(sw), "revert": r}
                            for e, sw, r in predicted.changes]}
        atomic_write_text(json_out, json.dumps(doc, indent=1) + "\n")
