"""Writes that leave nothing half-written (temp file + rename, staging directories) and
never touch what they did not write; output places checked before the work starts."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Collection, Iterator

from topoopt.errors import ConfigError, TopoOptError

__all__ = ["atomic_write_text", "atomic_write_bytes", "atomic_path", "staging_dir",
           "check_writable", "check_place"]


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


def check_writable(path: str | Path, option: str, folder: bool = False) -> Path:
    """Raise :class:`ConfigError` naming ``option`` unless ``path`` can be written.

    Called before any work starts, so a bad output place costs nothing: ``path`` must
    not be a folder (a file, or with ``folder=True`` not a file), no part of it may be
    a file, and the deepest part that exists must be a folder this process can create
    files in (tried with a temporary file, removed at once: permission bits do not
    tell for root, read-only mounts or ``/proc``). Nothing is created.

    Examples
    --------
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> check_writable(f"{d}/new/sub/x.json", "--json").name
    'x.json'
    >>> check_writable(d, "--json")
    Traceback (most recent call last):
    ...
    topoopt.errors.ConfigError: --json = '...': is a folder; give a file name
    """
    path = Path(path)
    if path.is_dir() and not folder:
        raise ConfigError(option, str(path), "is a folder; give a file name")
    if path.exists() and folder and not path.is_dir():
        raise ConfigError(option, str(path), "exists and is not a folder")
    base = path if path.is_dir() else path.parent
    while not base.exists() and not base.is_symlink() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise ConfigError(option, str(path), f"{base} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".topoopt-probe.", dir=base)
    except OSError as exc:
        raise ConfigError(option, str(path),
                          f"cannot create files in {base} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)
    return path


@contextlib.contextmanager
def staging_dir(final: str | Path, replaceable: Collection[str] = ()) -> Iterator[Path]:
    """Yield a fresh directory; on success its files move into ``final``.

    ``replaceable`` lists files (paths relative to ``final``) an earlier run of the same
    writer left there: a new file may replace one of them, and those the new set does
    not have are removed, with any folder they leave empty. Nothing else in ``final``
    is touched: a new file whose place holds anything else (a user's file, a folder)
    raises :class:`TopoOptError` naming it before anything moves. On any exception
    ``final`` is as it was (a folder created for it is removed again) and the staging
    directory is gone.
    """
    final = Path(final)
    created = None  # the outermost folder made here, removed again on failure
    for folder in (final, *final.parents):
        if folder.exists():
            break
        created = folder
    final.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".topoopt-staging.", dir=final))
    replaceable = set(replaceable)
    try:
        yield stage
        new = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file())
        for rel in new:
            check_place(final, rel, rel in replaceable)
        for rel in new:
            target = final / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / rel, target)
        for rel in sorted(replaceable - set(new)):
            old = final / rel
            if old.is_file() and not old.is_symlink():
                old.unlink()
                _remove_empty_parents(old.parent, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    shutil.rmtree(stage, ignore_errors=True)


def check_place(final: str | Path, rel: str, replaceable: bool) -> None:
    """Raise :class:`TopoOptError` unless ``final/rel`` is free or holds a file that may
    be replaced (``replaceable``): no folder where a file goes, no file where a folder goes."""
    final = Path(final)
    parts = Path(rel).parts
    for i in range(1, len(parts)):
        folder = final.joinpath(*parts[:i])
        if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
            raise TopoOptError(f"{folder} is in the way: topoopt writes a folder there and "
                               "did not write this file; move it or choose another folder")
    target = final / rel
    if not (target.exists() or target.is_symlink()):
        return
    if target.is_dir() and not target.is_symlink():
        raise TopoOptError(f"{target} is in the way: topoopt writes a file there and did "
                           "not make this folder; move it or choose another folder")
    if not replaceable or target.is_symlink():
        raise TopoOptError(f"{target} is in the way: topoopt did not write it; move it or "
                           "choose another folder")


def _remove_empty_parents(folder: Path, final: Path) -> None:
    while folder != final and final in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
