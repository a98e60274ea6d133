"""Ctrl-C as a request to stop: long searches poll it and return their best so far."""

from __future__ import annotations

import signal
import threading
from typing import Any, Literal

__all__ = ["stop_requested", "request_stop", "graceful_interrupt", "stop_on_first_interrupt"]

_STOP = threading.Event()


def stop_requested() -> bool:
    """Whether Ctrl-C (or :func:`request_stop`) asked running work to stop."""
    return _STOP.is_set()


def request_stop() -> None:
    """Ask running searches to stop, as the first Ctrl-C does."""
    _STOP.set()


def _handler(signum, frame) -> None:
    if _STOP.is_set():
        raise KeyboardInterrupt
    _STOP.set()


def stop_on_first_interrupt() -> None:
    """In this process from now on, the first Ctrl-C sets :func:`stop_requested` and a
    second raises KeyboardInterrupt (a worker process's initializer)."""
    signal.signal(signal.SIGINT, _handler)


class graceful_interrupt:
    """Context manager: the first Ctrl-C sets :func:`stop_requested` instead of raising.

    Searches poll it between moves and return the best strategy found so far; a
    second Ctrl-C raises KeyboardInterrupt as usual. Only the main thread can install
    signal handlers; elsewhere this does nothing.
    """

    def __enter__(self) -> "graceful_interrupt":
        _STOP.clear()
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, _handler)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        _STOP.clear()  # a later search in this process starts afresh
        return False
