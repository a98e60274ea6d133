"""The package as it installs: no symbolic links, every package listed, a light import."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import topoopt

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
#: pyproject.toml maps these folders of the design card's layout into the package.
MAPPED = {"topoopt.planners": ROOT / "planners", "topoopt.workloads": ROOT / "workloads"}


def _tracked_links() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [line.split("\t", 1)[1] for line in out.stdout.splitlines()
            if line.startswith("120000 ")]


def test_the_repository_has_no_symbolic_links():
    assert _tracked_links() == []
    assert not [p for p in ROOT.glob("topoopt/**/*") if p.is_symlink()]


def test_pyproject_lists_every_package_and_maps_the_top_level_folders():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(("topoopt",) + p.parent.relative_to(ROOT / "topoopt").parts)
               for p in (ROOT / "topoopt").rglob("__init__.py")}
    on_disk |= set(MAPPED)
    assert set(tool["packages"]) == on_disk
    assert {k: ROOT / v for k, v in tool["package-dir"].items()} == MAPPED


def test_the_mapped_folders_import_under_the_package_name_only():
    import topoopt.planners.space as space
    assert Path(space.__file__).resolve() == MAPPED["topoopt.planners"] / "space.py"
    assert Path(topoopt.workloads.__file__).resolve() == MAPPED["topoopt.workloads"] / "__init__.py"


@pytest.mark.parametrize("package", sorted(MAPPED))
def test_the_mapped_folders_docstring_examples(package):
    """pytest's --doctest-modules collects topoopt/ by path; the mapped folders would load
    there as a second copy named ``planners.*``, so their examples run here, by the
    installed names."""
    pkg = importlib.import_module(package)
    names = [package] + [f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]
    tried = 0
    for name in names:
        result = doctest.testmod(importlib.import_module(name), verbose=False,
                                 optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, name
        tried += result.attempted
    assert tried > 0


def test_import_topoopt_loads_no_heavy_dependency():
    """numba, OR-Tools (and pandas through it), sympy and matplotlib load where they are
    used, not with the package: a fresh interpreter imports it and lists what came."""
    heavy = ("numba", "ortools", "pandas", "sympy", "matplotlib")
    code = ("import sys, topoopt, topoopt.cli; "
            f"print(' '.join(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == []
