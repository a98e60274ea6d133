"""The ``topoopt`` command line: plan optical shards, simulate fabrics, tune collectives.

Every command lives in its own module under ``topoopt/commands/``; this file only
assembles them. Bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

import click

from topoopt import __version__
from topoopt.commands import (
    cluster,
    plan,
    react,
    react_jobs,
    react_run,
    simulate,
    topology,
    traffic,
    validate,
    workloads,
)
from topoopt.errors import TopoOptError

__all__ = ["main"]


class _Group(click.Group):
    """A click group that turns TopoOptError into one line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TopoOptError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"],
                                           "show_default": True})
@click.version_option(__version__, prog_name="topoopt")
def main() -> None:
    """Plan the network of a distributed training job (TopoOpt) and keep its
    collectives fast at runtime (REACT).

    \b
    Typical use:
      topoopt workloads                       # the built-in models
      topoopt traffic configs/dlrm-16.toml    # what a strategy sends
    Configs are TOML files with [cluster] and [job] tables; see configs/.
    """


def _register() -> None:
    main.add_command(workloads.workloads)
    main.add_command(traffic.traffic)
    main.add_command(react.react)
    react.react.add_command(react_run.run)
    react.react.add_command(react_jobs.jobs)
    main.add_command(topology.topology)
    main.add_command(simulate.simulate)
    main.add_command(plan.plan)
    main.add_command(validate.validate)
    main.add_command(cluster.cluster)


_register()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
