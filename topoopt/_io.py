"""Writes that leave nothing half-written: temp file + rename, staging directories."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_write_text", "atomic_write_bytes", "atomic_path", "staging_dir"]


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it into place on success only.

    The file gets the permissions of any new file (``0o666`` less the umask), not the
    private ``0o600`` of a temporary one: exports are meant for other tools and people.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def staging_dir(final: str | Path, stale: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a fresh directory; on success its files replace those in ``final``.

    On an exception nothing in ``final`` changes and the staging directory is removed.
    ``stale`` lists glob patterns of files or folders in ``final`` that the new set
    supersedes: they are removed before the new files move in (so an export skipped
    this time cannot survive from an earlier run). Other files in ``final`` stay.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.staging.", dir=final.parent))
    try:
        yield stage
        final.mkdir(parents=True, exist_ok=True)
        for pattern in stale:
            for old in final.glob(pattern):
                shutil.rmtree(old) if old.is_dir() else old.unlink()
        for item in sorted(stage.rglob("*")):
            target = final / item.relative_to(stage)
            if item.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                os.replace(item, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
