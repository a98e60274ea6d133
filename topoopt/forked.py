"""Run one function in a forked child beside the caller: a second core for a step whose
inputs are too large to send to a worker (a plan's document, forked with the process
instead of pickled) and whose result is small.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
from typing import Any, Callable, Generic, TypeVar

__all__ = ["Forked", "fork_available"]

T = TypeVar("T")


def fork_available() -> bool:
    """Whether :class:`Forked` runs its function in a child: on Linux with more than one
    core (macOS's system libraries are not fork-safe once threads have started)."""
    return sys.platform.startswith("linux") and (os.cpu_count() or 1) > 1


class Forked(Generic[T]):
    """``fn(*args)`` started in a forked child; :meth:`result` waits for it.

    The child inherits ``args`` with the process's memory, so nothing is pickled on the
    way in; its return value is pickled back through a pipe. Whatever goes wrong in
    the child (an exception, a result that cannot be pickled, the child killed),
    :meth:`result` runs ``fn(*args)`` again in the caller, so the caller gets the
    result or the exception a plain call gives. With ``fork`` false, or where
    :func:`fork_available` is, :meth:`result` is that plain call.

    Examples
    --------
    >>> Forked(sum, [1, 2, 3]).result()
    6
    """

    def __init__(self, fn: Callable[..., T], *args: Any, fork: bool = True) -> None:
        self._fn, self._args = fn, args
        self._process: Any = None
        if not (fork and fork_available()):
            return
        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_child, args=(send, fn, args), daemon=True)
        self._process.start()
        send.close()

    def result(self) -> T:
        """The child's result, or ``fn(*args)`` run here if the child has none."""
        if self._process is not None:
            try:
                data = self._recv.recv_bytes()
            except (EOFError, OSError):
                data = b""
            finally:
                self._recv.close()
                self._process.join()
            if data:
                ok, value = pickle.loads(data)
                if ok:
                    return value
        return self._fn(*self._args)

    def cancel(self) -> None:
        """Stop the child if it still runs and wait for it (a caller that fails before
        it asks for the result: the child must not go on writing where the caller is
        cleaning up)."""
        if self._process is not None and self._process.is_alive():
            self._process.terminate()
        if self._process is not None:
            self._process.join()
            self._recv.close()
            self._process = None


def _child(send: Any, fn: Callable, args: tuple) -> None:
    try:
        data = pickle.dumps((True, fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:    # the caller runs it again and sees the error itself
        data = pickle.dumps((False, None))
    send.send_bytes(data)
    send.close()
