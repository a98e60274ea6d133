"""pytest's collection: the modules that need an optional extra at import time (the
``runtime`` extra's torch) are left out of the doctest run where it is not installed;
their tests in ``tests/`` skip themselves and say why."""

import importlib.util

collect_ignore = []
if importlib.util.find_spec("torch") is None:
    collect_ignore += ["topoopt/react/runtime/collective.py",
                       "topoopt/react/runtime/react_collective.py"]
