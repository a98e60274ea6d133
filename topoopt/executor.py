"""One interface for running independent jobs: in-process, a local process pool, or Ray.

Independent MCMC chains, the per-fabric searches and REACT scenario sweeps are lists of
pure, seeded tasks. :func:`make_executor` picks where they run; results come back in
task order and do not depend on which executor ran them.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
import threading
from typing import Any, Callable, Iterable, Protocol, Sequence

from topoopt.errors import TopoOptError
from topoopt.interrupt import stop_on_first_interrupt

__all__ = ["Executor", "Pending", "SerialExecutor", "PoolExecutor", "RayExecutor", "make_executor",
           "pool_start_method"]


Done = Callable[[int, Any], None]


class Pending(Protocol):
    """A task started by :meth:`Executor.submit`."""

    def result(self) -> Any: ...


class Executor(Protocol):
    """Runs ``fn(item)`` for every item; returns the results in item order, and calls
    ``on_done(index, result)`` as each one finishes (in completion order). ``submit``
    starts one task and returns at once (in-process: runs it first), so that later
    ``map`` calls run beside it."""

    name: str

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any],
            on_done: Done | None = None) -> list[Any]: ...

    def submit(self, fn: Callable[[Any], Any], item: Any) -> Pending: ...

    def close(self) -> None: ...


class _Finished:
    """A task that has already run (the serial executor's :class:`Pending`)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


class SerialExecutor:
    """Run tasks one after the other in this process (``--workers 1``)."""

    name = "serial"

    def map(self, fn, items, on_done=None):
        out = []
        for i, item in enumerate(items):
            out.append(fn(item))
            if on_done is not None:
                on_done(i, out[-1])
        return out

    def submit(self, fn, item):
        return _Finished(fn(item))

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def pool_start_method() -> str:
    """How :class:`PoolExecutor` starts its workers: ``"fork"`` on Linux when this
    process runs a single thread, else ``"spawn"``.

    A forked worker starts with the package imported and the compiled kernels this
    process has loaded; a spawned one imports and loads them again, seconds of CPU
    each (docs/tuning.md) while the parent waits.
    Forking a process that runs other threads can leave a lock held in the child
    forever, so such a process spawns; so does macOS, whose system libraries are not
    safe to fork (Python spawns there by default). The tasks are pure and seeded: their
    results do not depend on how the workers started.
    """
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    return "spawn"


class PoolExecutor(SerialExecutor):
    """A local process pool of ``workers`` processes, forked or spawned
    (:func:`pool_start_method`; ``start_method`` chooses).

    In a worker the first Ctrl-C asks its search to stop and return its best so far
    (:func:`topoopt.interrupt.stop_on_first_interrupt`), as in the parent.
    """

    name = "pool"

    def __init__(self, workers: int, start_method: str | None = None):
        self.workers = workers
        self.start_method = start_method or pool_start_method()
        self._pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context(self.start_method),
            initializer=stop_on_first_interrupt)

    def map(self, fn, items, on_done=None):
        futures = [self._pool.submit(fn, item) for item in items]
        if on_done is not None:
            index = {f: i for i, f in enumerate(futures)}
            for f in concurrent.futures.as_completed(futures):
                on_done(index[f], f.result())
        return [f.result() for f in futures]

    def submit(self, fn, item):
        return self._pool.submit(fn, item)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor(SerialExecutor):
    """Ray tasks: a local Ray (``address=None``) or an existing cluster (``"host:port"``).

    A local Ray is started with ``num_cpus=workers`` and shut down on :meth:`close`;
    a cluster we joined is only disconnected.
    """

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None):
        try:
            import ray
        except ImportError:
            raise TopoOptError("--ray needs Ray: pip install 'topoopt[ray]'")
        self._ray = ray
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                      ignore_reinit_error=True)
        if address:
            kwargs["address"] = address
        else:
            kwargs["num_cpus"] = workers or os.cpu_count() or 1
        ray.init(**kwargs)
        self._remotes: dict[Callable, Any] = {}

    def _remote(self, fn):
        remote = self._remotes.get(fn)
        if remote is None:
            remote = self._remotes[fn] = self._ray.remote(fn)
        return remote

    def map(self, fn, items, on_done=None):
        remote = self._remote(fn)
        refs = [remote.remote(item) for item in items]
        if on_done is not None:
            index = {r: i for i, r in enumerate(refs)}
            pending = list(refs)
            while pending:
                ready, pending = self._ray.wait(pending, num_returns=1)
                on_done(index[ready[0]], self._ray.get(ready[0]))
        return self._ray.get(refs)

    def submit(self, fn, item):
        return _RayPending(self._ray, self._remote(fn).remote(item))

    def close(self) -> None:
        self._ray.shutdown()


class _RayPending:
    """A Ray task's result when asked for."""

    def __init__(self, ray, ref) -> None:
        self._ray, self._ref = ray, ref

    def result(self) -> Any:
        return self._ray.get(self._ref)


def make_executor(workers: int = 1, ray: str | bool | None = None) -> SerialExecutor:
    """Choose an executor.

    Parameters
    ----------
    workers : int
        Local processes; 1 runs in this process.
    ray : bool or str, optional
        ``True`` (or ``""``/``"local"``) starts a local Ray; a string ``"host:port"``
        joins that Ray cluster.

    Returns
    -------
    Executor
        Use it as a context manager so pools and Ray are shut down.
    """
    if workers < 1:
        raise TopoOptError(f"--workers = {workers}: use 1 or more worker processes")
    if ray:
        address = None if ray is True or ray in ("", "local", "auto") else str(ray)
        return RayExecutor(address, workers)
    return SerialExecutor() if workers == 1 else PoolExecutor(workers)


def chunked(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """Split ``items`` into at most ``parts`` contiguous, nearly equal lists."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        out.append(list(items[start:end]))
        start = end
    return out
