"""Ctrl-C as a request to stop: long searches poll it and return their best so far."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator, Literal

__all__ = ["stop_requested", "request_stop", "reset_stop", "graceful_interrupt",
           "stop_on_first_interrupt", "deferred_interrupts"]

_STOP = threading.Event()


def stop_requested() -> bool:
    """Whether Ctrl-C (or :func:`request_stop`) asked running work to stop."""
    return _STOP.is_set()


def request_stop() -> None:
    """Ask running searches to stop, as the first Ctrl-C does."""
    _STOP.set()


def reset_stop() -> None:
    """Forget an earlier Ctrl-C: the work it stopped is over (the search), and the next
    one is the first again (while the plan's files are written, it lets them finish)."""
    _STOP.clear()


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


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold Ctrl-C while the block runs (moving a finished set of files into place:
    stopped halfway it would be neither the old set nor the new), then deliver it to
    the handler that was in place. Only the main thread can do this; elsewhere the
    block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[tuple[int, Any]] = []
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            if callable(previous):
                previous(*held[0])
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt
