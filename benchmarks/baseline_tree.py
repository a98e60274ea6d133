"""A git ref of this repository installed beside the working tree, for the benchmarks
that run a baseline side by side (``--baseline REF``).

The ref is checked out as a detached worktree and installed with ``pip install
--target`` into a folder a side puts on ``PYTHONPATH`` (run from outside any checkout,
or ``python -m`` imports this tree instead).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def install_ref(ref: str, work: Path) -> tuple[Path, Path]:
    """``(worktree, site)``: ``ref`` checked out under ``work`` and installed into
    ``site``; remove the worktree with :func:`remove_tree`."""
    tree = work / "baseline-tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree),
                    ref], check=True)
    site = work / "baseline"
    install_tree(tree, site)
    return tree, site


def install_tree(checkout: Path, site: Path) -> None:
    """``checkout`` installed into the folder ``site`` (``pip install --no-deps
    --target``: its package layout or ``package-dir`` mapping does not matter)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--target", str(site), str(checkout)], check=True)


def remove_tree(tree: Path | None) -> None:
    """Remove a worktree :func:`install_ref` made (nothing if ``None``)."""
    if tree is not None:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       check=False)
