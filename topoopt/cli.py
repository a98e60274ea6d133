"""The ``topoopt`` command line: plan optical shards, simulate fabrics, tune collectives.

Every command lives in its own module under ``topoopt/commands/``; this file only
assembles them. Bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import errno
import sys

import click

from topoopt import __version__
from topoopt.commands import (
    cluster,
    estimate,
    import_model,
    plan,
    react,
    react_jobs,
    react_run,
    report,
    simulate,
    sweep_reconfig,
    topology,
    traffic,
    validate,
    workloads,
)
from topoopt.errors import TopoOptError

__all__ = ["main"]


class _Group(click.Group):
    """A click group that keeps every error to one line on stderr.

    ``TopoOptError`` (bad input) is ``error: <field> = <value>: <fix>`` with exit code 2
    (or the error's ``exit_code``: 1 for a run that failed on good input, e.g. a Ray
    cluster lost mid-plan, :class:`topoopt.executor.ExecutorError`);
    click's usage errors (unknown option, missing argument, a value outside an option's
    range) are one ``error:`` line with the command's ``--help`` hint, exit code 2, not
    click's four lines; an ``OSError`` (a folder that vanished, a full disk) and a
    ``MemoryError`` are one line too, never a traceback.
    """

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TopoOptError as exc:
            _fail(str(exc), getattr(exc, "exit_code", 2))
        except MemoryError:
            _fail("out of memory: this input needs more memory than the machine has; "
                  "use fewer servers, NICs, nodes or a smaller model")
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # `topoopt ... | head`: click quiets it
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(f"{where}{exc.strerror or exc}")

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            sys.exit(_usage_line(exc))
        sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"error: {' '.join(message.split())}", err=True)
    sys.exit(code)


def _usage_line(exc: click.ClickException) -> int:
    """Print a click error as one line; return its exit code."""
    message = " ".join(exc.format_message().split()).rstrip(".")
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        message = f"{ctx.command_path}: {message} (see {ctx.command_path} --help)"
    click.echo(f"error: {message}", err=True)
    return exc.exit_code


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
    main.add_command(import_model.import_model)
    main.add_command(traffic.traffic)
    main.add_command(react.react)
    react.react.add_command(react_run.run)
    react.react.add_command(react_jobs.jobs)
    main.add_command(topology.topology)
    main.add_command(simulate.simulate)
    main.add_command(sweep_reconfig.sweep_reconfig)
    main.add_command(plan.plan)
    main.add_command(validate.validate)
    main.add_command(report.report)
    main.add_command(cluster.cluster)
    main.add_command(estimate.estimate)


_register()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
