"""``topoopt report DIR``: one HTML page of a plan, checked against its plan.json."""

from __future__ import annotations

import click

from topoopt.export.plan_dir import write_report
from topoopt.units import format_size

__all__ = ["report"]


@click.command()
@click.argument("directory", type=click.Path(file_okay=False))
def report(directory: str) -> None:
    """Write DIR/report.html: the plan in DIR (topoopt plan -o DIR) as one page to open,
    print or forward.

    \b
    The job and cluster; the fabrics compared (iteration time, exposed communication,
    cost, cost ratio) as a table and bar charts; the topology (servers on a circle,
    links coloured by ring stride and as wide as the bytes they carry, MP links and
    forwarded routes apart, hover for ports, label and bytes); the rings and their
    shares; traffic heatmaps before and after; each search chain's convergence; the
    per-server port map (patch panel / OCS); and, where DIR holds them, the results of
    `topoopt validate DIR --json DIR/validate.json` and `topoopt react simulate ...
    --json DIR/react.json`.

    Self-contained (inline SVG and CSS, no script, no network) and checked before it is
    written: every number on it is read from plan.json or those files (`topoopt plan
    --check DIR` checks it again). `topoopt plan` writes it too, unless --no-report.
    """
    path, found = write_report(directory)
    size = path.stat().st_size
    click.echo(f"wrote {path} ({format_size(size)}; {found['fields']} numbers from plan.json, "
               f"{found['servers']} servers, {found['links']} links, {found['fabrics']} "
               "fabrics)")
