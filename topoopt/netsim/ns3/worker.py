"""The ns-3 worker process: started in a clean directory, imports ns-3 once, serves requests.

ns-3's Python bindings are heavy to import (10-30 s, ~0.7 GB) and their loader scans
every ``*.so*`` under the current directory, ``PATH`` and ``LD_LIBRARY_PATH``
(docs/ns3-notes.md). So ns-3 never runs in the caller's process: :class:`Ns3Worker` starts
``python -m topoopt.netsim.ns3._server`` in a fresh temporary directory and talks to
it over pipes (length-prefixed pickles). One worker holds one ns-3 simulation at a
time; it is reused across runs (tests share one per session). A crash of the worker
(an ns-3 assertion aborts the process) surfaces as :class:`Ns3Error` with the tail
of its log, and the next call starts a new worker.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

from topoopt.errors import TopoOptError

__all__ = ["Ns3Worker", "Ns3Error", "Ns3Unavailable", "ns3_available", "require_ns3",
           "default_worker", "INSTALL_HINT"]

#: What to tell a user without the bindings.
INSTALL_HINT = "pip install 'topoopt[packet]'"

_HEADER = struct.Struct("<Q")


class Ns3Error(TopoOptError):
    """The ns-3 worker failed (an exception or a crash inside ns-3)."""


class Ns3Unavailable(TopoOptError):
    """ns-3's Python bindings are not installed."""


def ns3_available() -> bool:
    """Whether ns-3's Python bindings (``from ns import ns``) and cppyy can be found,
    without importing them."""
    try:
        return (importlib.util.find_spec("ns") is not None
                and importlib.util.find_spec("cppyy") is not None)
    except (ImportError, ValueError):
        return False


def require_ns3() -> None:
    """Raise :class:`Ns3Unavailable` (one line with the install command) without ns-3."""
    if not ns3_available():
        raise Ns3Unavailable(f"ns-3 is not installed: packet-level simulation needs the "
                             f"'packet' extra: {INSTALL_HINT}")


def _clean_env() -> dict:
    """The environment of the worker: PATH without relative entries or the caller's
    directory, so ns-3's loader scans only system locations."""
    env = dict(os.environ)
    cwd = os.path.realpath(os.getcwd())
    parts = [p for p in env.get("PATH", "").split(os.pathsep)
             if p and os.path.isabs(p) and os.path.realpath(p) != cwd]
    env["PATH"] = os.pathsep.join(parts) or "/usr/bin:/bin"
    # The worker imports topoopt from wherever this process did.
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "")
                                                  .split(os.pathsep) if p])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Ns3Worker:
    """A process that runs ns-3 for this one.

    Parameters
    ----------
    python : str, optional
        Interpreter to run (default: this one).

    Examples
    --------
    >>> with Ns3Worker() as w:                     # doctest: +SKIP
    ...     w.call("ping")
    'pong'
    """

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable
        self._proc: subprocess.Popen | None = None
        self._dir: str | None = None
        self._log: IO[bytes] | None = None
        self._lock = threading.Lock()
        self.generation = 0       # bumped by every "open": sessions check it
        self.starts = 0

    # ------------------------------------------------------------------ lifecycle
    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int:
        """The worker's process id (-1 when not running)."""
        return self._proc.pid if self.alive and self._proc is not None else -1

    def start(self) -> None:
        """Start the worker (no-op when running) and wait until ns-3 is imported."""
        if self.alive:
            return
        require_ns3()
        self._cleanup()
        self._dir = tempfile.mkdtemp(prefix="topoopt-ns3-")
        self._log = open(os.path.join(self._dir, "worker.log"), "w+b")
        self._proc = subprocess.Popen(
            [self.python, "-m", "topoopt.netsim.ns3._server"], cwd=self._dir,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=_clean_env())
        self.starts += 1
        status, payload = self._read()
        if status != "ready":
            self._fail(f"ns-3 worker did not start: {payload}")

    def close(self) -> None:
        """Stop the worker and remove its directory."""
        proc = self._proc
        if proc is not None and proc.poll() is None:      # alive
            try:
                self._write(("exit", ()))
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                proc.kill()
                proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._proc is not None:
            for stream in (self._proc.stdin, self._proc.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> "Ns3Worker":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ protocol
    def _write(self, msg) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        _, stdin, _ = self._running()
        stdin.write(_HEADER.pack(len(data)) + data)
        stdin.flush()

    def _running(self) -> tuple[subprocess.Popen, IO[bytes], IO[bytes]]:
        """The worker process and its stdin and stdout (:meth:`start` opened them)."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None, \
            "the ns-3 worker is not started"
        return proc, proc.stdin, proc.stdout

    def _read(self):
        proc, _, stdout = self._running()
        head = stdout.read(_HEADER.size)
        if len(head) < _HEADER.size:
            proc.wait()
            self._fail(f"ns-3 worker exited (code {proc.returncode})")
        (size,) = _HEADER.unpack(head)
        data = stdout.read(size)
        if len(data) < size:
            self._fail("ns-3 worker closed its pipe mid-reply")
        return pickle.loads(data)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines the worker (and ns-3) printed."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        text = self._log.read().decode(errors="replace")
        keep = [s for s in text.splitlines() if "runStaticInitializersOnce" not in s]
        return "\n".join(keep[-lines:])

    def _fail(self, what: str):
        tail = self.log_tail()
        self._cleanup()
        raise Ns3Error(what + (f"; worker log:\n{tail}" if tail else ""))

    def call(self, op: str, *args):
        """Send one request and return its reply (raises :class:`Ns3Error`)."""
        with self._lock:
            self.start()
            if op == "open":
                self.generation += 1
            try:
                self._write((op, args))
            except (BrokenPipeError, OSError):
                self._fail("ns-3 worker is gone")
            status, payload = self._read()
            if status == "error":
                raise Ns3Error(f"ns-3 worker: {payload}")
            return payload


_DEFAULT: Ns3Worker | None = None


def default_worker() -> Ns3Worker:
    """The process-wide shared worker (started on first use, stopped at exit)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Ns3Worker()
        atexit.register(_DEFAULT.close)
    return _DEFAULT
