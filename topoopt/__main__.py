"""``python -m topoopt``: the ``topoopt`` command line."""

from topoopt.cli import main

main(prog_name="topoopt")
