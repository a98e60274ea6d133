"""``topoopt react jobs``: two jobs sharing servers or the network, REACT on none, one or
both, or the cooperative rules (REACT §7.3.3, Figs. 6-7)."""

from __future__ import annotations

import json
from dataclasses import replace

import click

from topoopt._io import atomic_write_text
from topoopt.commands._common import MAX_WORKERS, output_file, print_table
from topoopt.commands.react import EPOCHS, MAX_NODES, _int_list, _size
from topoopt.errors import ConfigError
from topoopt.react.jobs import (
    MODES,
    TwoJobScenario,
    figure6_grid,
    figure7_grid,
    run_two_job_sweep,
    two_job_table,
)

__all__ = ["jobs"]


def _modes(text: str) -> list[tuple[str, str]]:
    out = []
    for part in text.split(","):
        pair = tuple(part.strip().split("+"))
        if len(pair) != 2 or any(m not in MODES for m in pair):
            raise ConfigError("--modes", text, "give pairs like react+off,react+react,"
                              "coop+coop (each of off, react, coop)")
        out.append(pair)
    return out


@click.command()
@click.option("--setting", type=click.Choice(["overlap", "network"]), default="network",
              help="overlap: tree + ring on a star sharing --overlap servers (Fig. 6); "
                   "network: no shared server, the Alibaba-like Clos of 48 ToRs x 3 "
                   "aggregation switches (720 servers), both jobs on the same racks (Fig. 7).")
@click.option("--collectives", default=None,
              help="Job 1's and job 2's collectives, e.g. rd-allgather,ring [default: "
                   "tree,ring (overlap); both ring,ring and rd-allgather,ring (network)].")
@click.option("--overlap", "overlaps", default="0-4",
              help="Shared servers (overlap setting), e.g. 0-4.")
@click.option("--modes", default="react+off,react+react,coop+coop",
              help="Leaders of job 1 + job 2 to compare with off+off: off, react (REACT's "
                   "loop) or coop (REACT with the cooperative rules).")
@click.option("--seeds", type=click.IntRange(1, 10_000), default=5,
              help="Random placements per point.")
@click.option("--size", default="20MB", help="Bytes per collective.")
@click.option("--epochs", type=EPOCHS, default=100,
              help="Epochs; the first 25 are not measured.")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=1,
              help="Local worker processes.")
@click.option("--ray", default=None, metavar="ADDRESS",
              help="Run on Ray instead: 'local' or a cluster address host:port.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="Write the table to this JSON file.")
def jobs(setting, collectives, overlaps, modes, seeds, size, epochs, workers, ray,
         json_out) -> None:
    """Two jobs on one network, each leader off, running REACT or cooperative REACT:
    the mean gain of each job's algorithm bandwidth over the run without REACT
    (epochs after 25, the mean over --seeds random placements)."""
    output_file(json_out, "--json")
    pairs = _modes(modes)
    base = TwoJobScenario(setting=setting, size=_size(size), epochs=epochs,
                          warmup=min(25, epochs // 4))
    colls = tuple(collectives.split(",")) if collectives else None
    if setting == "overlap":
        grid = figure6_grid(_int_list(overlaps, "--overlap", MAX_NODES), seeds, base)
    else:
        grid = figure7_grid(seeds, base)
    if colls:
        grid = [replace(sc, collectives=colls) for sc in grid
                if sc.collectives == grid[0].collectives]
    rows = two_job_table(run_two_job_sweep(grid, pairs, workers=workers, ray=ray), pairs)
    print_table(["collectives", "shared", "leaders", "job 1 gain %", "job 2 gain %",
                 "job 1 min %", "job 2 min %"],
                [["+".join(r["collectives"]), r["overlap"] if setting == "overlap" else "-",
                  "+".join(r["modes"]), *(f"{100 * v:.1f}" for v in r["mean_improvement"]),
                  *(f"{100 * v:.1f}" for v in r["min_improvement"])] for r in rows])
    if json_out:
        atomic_write_text(json_out, json.dumps(rows, indent=1) + "\n")
        click.echo(f"wrote {json_out}")
