"""Run the ``topoopt`` command from a checkout: ``python cli.py plan configs/dlrm-16.toml``.

The command line itself is :mod:`topoopt.cli`, installed as the ``topoopt`` script and
run by ``python -m topoopt``; this file only calls it, with the package installed
(``pip install -e .``).
"""

from topoopt.cli import main

if __name__ == "__main__":
    main(prog_name="topoopt")
