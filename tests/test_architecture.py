"""The import graph follows the layers of docs/architecture.md.

Every import of a project module is checked, function-local ones included: it must
point to the same layer or one below, never up, and the packages must not import each
other in a circle. A function-local import is allowed only for a heavy
dependency that ``import topoopt`` must not load (ns-3, torch, Ray, matplotlib, cppyy,
numba, OR-Tools, sympy) or for a project module that needs one at import time (found
here, not listed by hand).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "topoopt"

#: Lowest layer first; a module belongs to the longest prefix that names it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("topoopt._frozen", "topoopt.errors", "topoopt.units", "topoopt._require", "topoopt._io",
     "topoopt.interrupt", "topoopt.executor", "topoopt.forked", "topoopt.cluster", "topoopt.model",
     "topoopt.kernels", "topoopt.jsontext"),
    ("topoopt.workloads",),
    ("topoopt.config",),
    ("topoopt.strategy", "topoopt.compute", "topoopt.traffic", "topoopt.llm"),
    ("topoopt.topology",),
    ("topoopt.routing",),
    ("topoopt.finder",),
    ("topoopt.collectives",),
    ("topoopt.netsim",),
    ("topoopt.fabrics",),
    ("topoopt.estimate", "topoopt.llm.fabric"),
    ("topoopt.reconfig",),
    ("topoopt.plans",),
    ("topoopt.react",),
    ("topoopt.planners",),
    ("topoopt.multijob",),
    ("topoopt.export",),
    ("topoopt.commands", "topoopt.cli", "topoopt.__main__"),
)
#: Imported lazily, where they are needed: optional extras and their heavy cores.
OPTIONAL = {"ns", "cppyy", "torch", "ray", "matplotlib", "numba", "ortools", "sympy", "chakra",
            "transformers", "torchvision"}


#: Where each package's files are: pyproject.toml maps the design card's top-level
#: planners/ and workloads/ into the package.
SOURCES = {"topoopt": PACKAGE, "topoopt.planners": ROOT / "planners",
           "topoopt.workloads": ROOT / "workloads"}


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = (*package.split("."), *path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _layer(module: str) -> int | None:
    best, layer = -1, None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, layer = len(name), i
    return layer


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


class _Imports(ast.NodeVisitor):
    """(target module, line, local?) of every import in one module."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.module, self.is_package = module, is_package
        self.depth = 0
        self.found: list[tuple[str, int, bool]] = []

    def _scope(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scope

    def _add(self, target: str, line: int) -> None:
        self.found.append((target, line, self.depth > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.split(".")
            if not self.is_package:
                base = base[:-1]
            base = base[:len(base) - (node.level - 1)]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        self._add(name, node.lineno)
        for alias in node.names:   # ``from pkg import module``
            if f"{name}.{alias.name}" in MODULES:
                self._add(f"{name}.{alias.name}", node.lineno)


def _imports() -> dict[str, list[tuple[str, int, bool]]]:
    out = {}
    for module, path in MODULES.items():
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), str(path)))
        out[module] = visitor.found
    return out


IMPORTS = _imports()


def _heavy() -> set[str]:
    """Project modules that import an optional dependency at module level, directly
    or through another project module."""
    graph = nx.DiGraph()
    heavy = set()
    for module, found in IMPORTS.items():
        for target, _, local in found:
            if local:
                continue
            if target.split(".")[0] in OPTIONAL:
                heavy.add(module)
            elif target in MODULES:
                graph.add_edge(module, target)
    out = set(heavy)
    for module in heavy:
        if module in graph:
            out |= nx.ancestors(graph, module)
    return out


def test_every_module_has_a_layer():
    assert {"topoopt.planners.mcmc", "topoopt.workloads.dlrm", "topoopt.cli"} <= set(MODULES)
    missing = [m for m in MODULES if m != "topoopt" and _layer(m) is None]
    assert not missing, f"give these modules a layer in LAYERS: {missing}"


def test_imports_point_down():
    upward = []
    for module, found in IMPORTS.items():
        if module == "topoopt":     # the package's face re-exports the entry points
            continue
        here = _layer(module)
        for target, line, _ in found:
            there = _layer(target) if target in MODULES else None
            if there is not None and there > here:
                upward.append(f"{MODULES[module].relative_to(ROOT)}:{line} {module} -> {target}")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_local_imports_only_for_optional_dependencies():
    heavy = _heavy()
    bad = []
    for module, found in IMPORTS.items():
        for target, line, local in found:
            if not local or target.split(".")[0] in OPTIONAL:
                continue
            if target in MODULES and target in heavy:
                continue
            if target.split(".")[0] != "topoopt" and target.split(".")[0] in sys.stdlib_module_names:
                continue
            if target.split(".")[0] != "topoopt":
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line} {target} (third party)")
            elif target in MODULES:
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line} {target}")
    assert not bad, ("function-local imports of modules that are cheap to import at the top:\n"
                     + "\n".join(bad))


@pytest.mark.parametrize("granularity", ["module", "package"])
def test_no_import_cycles(granularity):
    graph = nx.DiGraph()
    for module, found in IMPORTS.items():
        if module == "topoopt":
            continue
        for target, _, _ in found:
            if target in MODULES and target != "topoopt":
                a, b = ((module, target) if granularity == "module"
                        else (_package(module), _package(target)))
                if a != b:
                    graph.add_edge(a, b)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"{granularity} import cycles: {cycles[:5]}"


def test_the_checker_sees_a_violation():
    """The rules above fail on what they are meant to catch."""
    assert _layer("topoopt.netsim.dag") < _layer("topoopt.estimate")
    assert _layer("topoopt.planners.mcmc") > _layer("topoopt.plans")
    visitor = _Imports("topoopt.netsim.engine", False)
    visitor.visit(ast.parse("def f():\n    from topoopt.estimate import x\n"))
    assert visitor.found == [("topoopt.estimate", 2, True)]
