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
from topoopt.interrupt import deferred_interrupts

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: folders are not locked
    fcntl = None  # type: ignore[assignment]

__all__ = ["atomic_write_text", "atomic_write_bytes", "atomic_path", "staging_dir",
           "check_writable", "check_place", "folder_lock", "LOCK_NAME", "shown"]

#: The lock file a writer holds in its output folder while it works (removed after).
LOCK_NAME = ".topoopt.lock"


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
    if path.is_symlink() and not path.exists():
        raise ConfigError(option, str(path), f"is a symbolic link to {os.readlink(path)}, "
                                             "which does not exist; give another path")
    if path.is_dir() and not folder:
        raise ConfigError(option, str(path), "is a folder; give a file name")
    if path.exists() and not folder and not path.is_file():
        raise ConfigError(option, str(path), "is not a regular file (a device, a pipe); "
                                             "give a file name")
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
    raises :class:`TopoOptError` naming it before anything moves. The moves run with
    Ctrl-C held (:func:`~topoopt.interrupt.deferred_interrupts`): ``final`` ends with
    the old set or the new one. On any exception ``final`` is as it was: the staging
    directory is gone, and a folder made for it is removed again only while empty
    (someone else may have put files there meanwhile).
    """
    final = Path(final)
    made = _make_folders(final)
    try:
        stage = Path(tempfile.mkdtemp(prefix=".topoopt-staging.", dir=final))
    except BaseException:
        _remove_empty(made)
        raise
    replaceable = set(replaceable)
    try:
        yield stage
        new = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file())
        for rel in new:
            check_place(final, rel, rel in replaceable)
        with deferred_interrupts():
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
        _remove_empty(made)
        raise
    shutil.rmtree(stage, ignore_errors=True)


def _make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and the folders above it that are missing; return those made,
    outermost first."""
    made = []
    for f in (folder, *folder.parents):
        if f.exists() or f.is_symlink():
            break
        made.append(f)
    folder.mkdir(parents=True, exist_ok=True)
    return made[::-1]


def _remove_empty(made: list[Path]) -> None:
    """Remove the folders ``made`` (outermost first) that are empty, innermost first:
    never one that now holds anything, whoever put it there."""
    for f in reversed(made):
        try:
            f.rmdir()
        except OSError:
            return


_HELD: dict[str, int] = {}  # folders this process holds the lock of -> depth


@contextlib.contextmanager
def folder_lock(directory: str | Path) -> Iterator[Path]:
    """Hold ``directory``'s writer lock (:data:`LOCK_NAME`, an advisory ``flock`` the
    system releases when the process ends, however it ends) while the block runs.

    Another process that holds it makes this raise :class:`TopoOptError` at once, in
    one line: two runs writing one folder would each remove what the other wrote. The
    folder (and any missing folder above it) is created, and removed again afterwards
    if it is empty; the lock file is removed. The same process may nest the lock.

    Raises
    ------
    TopoOptError
        Another run holds the folder.
    """
    directory = Path(directory)
    made = _make_folders(directory)
    key = os.path.realpath(directory)
    if key in _HELD or fcntl is None:
        _HELD[key] = _HELD.get(key, 0) + 1
        try:
            yield directory
        finally:
            _HELD[key] -= 1
            if not _HELD[key]:
                del _HELD[key]
        return
    try:
        fd = _acquire(directory / LOCK_NAME, directory)
    except BaseException:
        _remove_empty(made)
        raise
    _HELD[key] = 1
    try:
        yield directory
    finally:
        del _HELD[key]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / LOCK_NAME)  # before unlocking: see _acquire
        os.close(fd)
        _remove_empty(made)


def _acquire(path: Path, directory: Path) -> int:
    """Open and lock ``path``; the descriptor. A holder removes the file before it
    unlocks, so a lock won on a file no longer at ``path`` is tried again."""
    assert fcntl is not None
    for _ in range(5):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = os.read(fd, 32).decode("ascii", "replace").strip()
            os.close(fd)
            raise TopoOptError(f"{shown(directory)} is being written by another topoopt run"
                               f"{f' (process {owner})' if owner.isdigit() else ''}; wait "
                               "for it to finish or choose another folder") from None
        here = os.fstat(fd)
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (here.st_dev, here.st_ino):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)
    raise TopoOptError(f"{shown(directory)} is being written by other topoopt runs; wait "
                       "for them to finish or choose another folder")


def shown(path: str | Path) -> str:
    r"""``path`` for a one-line message: control characters (a newline) escaped.

    Examples
    --------
    >>> shown("out/a\nb")
    'out/a\\nb'
    """
    text = str(path)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


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
