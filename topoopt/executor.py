"""One interface for running independent jobs: in-process, a local process pool, or Ray.

Independent MCMC chains, the per-fabric searches and REACT scenario sweeps are lists of
pure, seeded tasks. :func:`make_executor` picks where they run; results come back in
task order and do not depend on which executor ran them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import socket
import sys
import threading
from typing import Any, Callable, Iterable, Protocol, Sequence

from topoopt.errors import ConfigError, TopoOptError
from topoopt.interrupt import stop_on_first_interrupt

__all__ = ["Executor", "Pending", "SerialExecutor", "PoolExecutor", "RayExecutor", "make_executor",
           "pool_start_method", "ExecutorError", "RAY_CONNECT_TIMEOUT_S"]


Done = Callable[[int, Any], None]


class Pending(Protocol):
    """A task started by :meth:`Executor.submit`."""

    def result(self) -> Any: ...


class Executor(Protocol):
    """Runs ``fn(item)`` for every item; returns the results in item order, and calls
    ``on_done(index, result)`` as each one finishes (in completion order). ``submit``
    starts one task and returns at once (in-process: runs it first), so that later
    ``map`` calls run beside it; ``next_done`` waits until one of the tasks ``submit``
    started has ended and returns its index."""

    name: str

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any],
            on_done: Done | None = None) -> list[Any]: ...

    def submit(self, fn: Callable[[Any], Any], item: Any) -> Pending: ...

    def next_done(self, pending: Sequence[Pending]) -> int: ...

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

    def next_done(self, pending: Sequence[Pending]) -> int:
        """The index of a task of ``pending`` (from :meth:`submit`) that has ended,
        waiting for one; the lowest such index. Here every task has ended."""
        if not pending:
            raise ValueError("next_done: no task to wait for")
        return 0

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

    def next_done(self, pending):
        if not pending:
            raise ValueError("next_done: no task to wait for")
        done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
        return min(i for i, f in enumerate(pending) if f in done)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class ExecutorError(TopoOptError):
    """A task could not finish: its worker raised, died, or its cluster went away.

    The CLI prints it on one line, as every :class:`~topoopt.errors.TopoOptError`,
    with exit code :attr:`exit_code` = 1 (the input was fine; the run was not).
    """

    exit_code = 1


#: Seconds to wait for a Ray head's port to accept a connection before calling the
#: address unreachable (``ray.init`` itself retries for minutes).
RAY_CONNECT_TIMEOUT_S = 5.0


def _ray_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (a ``ray://`` or ``tcp://`` prefix allowed) -> ``(host, port)``;
    ConfigError naming ``--ray`` otherwise."""
    bare = address.split("://", 1)[-1]
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("--ray", address, "give the HOST:PORT of a Ray head node (what "
                                            "`ray start --head` prints), or --ray alone "
                                            "for a local Ray")
    return host.strip("[]"), int(port)


def _require_reachable(address: str) -> None:
    """ConfigError naming ``address`` unless its port accepts a TCP connection within
    :data:`RAY_CONNECT_TIMEOUT_S`."""
    host, port = _ray_address(address)
    try:
        with socket.create_connection((host, port), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError("--ray", address, f"no Ray cluster answers there ({reason}); "
                                            "start one with `ray start --head --port=PORT` "
                                            "or leave out --ray") from None


def _task_label(fn: Callable, item: Any, index: int) -> str:
    """``fn(name)`` for a task whose item has a name (a fabric's), else ``fn #index``."""
    name = getattr(item, "name", None)
    fn_name = getattr(fn, "__name__", "task")
    return f"{fn_name}({name})" if isinstance(name, str) else f"{fn_name} #{index}"


class _Raised:
    """A :class:`~topoopt.errors.TopoOptError` a Ray worker raised, sent back as a
    value: its class (a ConfigError takes three arguments) need not unpickle."""

    def __init__(self, message: str, exit_code: int) -> None:
        self.message, self.exit_code = message, exit_code


def _ray_task(fn: Callable[[Any], Any], item: Any) -> Any:
    """``fn(item)`` in a Ray worker, a TopoOptError returned as :class:`_Raised`."""
    try:
        return fn(item)
    except TopoOptError as exc:
        return _Raised(str(exc), getattr(exc, "exit_code", 2))


class RayExecutor(SerialExecutor):
    """Ray tasks: a local Ray (``address=None``) or an existing cluster (``"host:port"``).

    A local Ray is started with ``num_cpus=workers`` and shut down on :meth:`close`;
    a cluster we joined is only disconnected. Each task takes one of the cluster's
    CPUs, so the tasks spread over its nodes.

    Failures are one line each (:class:`ExecutorError`, exit code 1): a task whose
    worker raised a :class:`~topoopt.errors.TopoOptError` raises one with the same
    message and exit code here (as a local run would); any other exception, or a worker, node or cluster
    lost mid-run, names the task and the address. A lost task is not run again
    (``max_retries=0``): the tasks are pure and seeded, so the same command gives the
    same plan once the cluster is back. An address that does not answer is a
    :class:`~topoopt.errors.ConfigError` naming ``--ray`` (exit code 2), found within
    :data:`RAY_CONNECT_TIMEOUT_S` seconds.
    """

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None):
        try:
            import ray
        except ImportError:
            raise TopoOptError("--ray needs Ray: pip install 'topoopt[ray]'")
        self._ray = ray
        self.address = address or "local"
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        # Ray's own INFO and WARNING lines would break the one-line contract
        kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                      ignore_reinit_error=True, logging_level=logging.ERROR)
        if address:
            _require_reachable(address)
            kwargs["address"] = address
        else:
            kwargs["num_cpus"] = workers or os.cpu_count() or 1
        try:
            ray.init(**kwargs)
        except Exception as exc:   # Ray raises bare Exceptions when a node fails to start
            ray.shutdown()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if address:
                raise ConfigError("--ray", address, f"could not join a Ray cluster there: "
                                                    f"{first}") from None
            raise ExecutorError(f"could not start a local Ray: {first}") from None
        self._remote = ray.remote(max_retries=0)(_ray_task)
        self._labels: dict[Any, str] = {}

    def _start(self, fn, item, index: int):
        # named after fn: Ray shows it in its process titles and errors
        ref = self._remote.options(name=getattr(fn, "__name__", "task")).remote(fn, item)
        self._labels[ref] = _task_label(fn, item, index)
        return ref

    def _get(self, ref) -> Any:
        """A task's result; its failure as one line (class notes)."""
        ray = self._ray
        label = self._labels.pop(ref, "a task")
        try:
            out = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            what = (f"{type(cause).__name__}: {cause}" if cause is not None
                    else str(exc).strip().splitlines()[0])
            raise ExecutorError(f"Ray task {label} on {self.address} raised {what}") from None
        except ray.exceptions.RayError as exc:
            raise ExecutorError(
                f"the Ray cluster at {self.address} lost task {label} "
                f"({type(exc).__name__}: a worker, node or the cluster died); nothing was "
                "written: run the command again once the cluster is back") from None
        if isinstance(out, _Raised):
            if out.exit_code == 2:
                raise TopoOptError(out.message)
            raise ExecutorError(out.message)
        return out

    def map(self, fn, items, on_done=None):
        refs = [self._start(fn, item, i) for i, item in enumerate(items)]
        results: dict[int, Any] = {}
        index = {r: i for i, r in enumerate(refs)}
        pending = list(refs)
        try:
            while pending:   # in completion order, so a failure surfaces at once
                ready, pending = self._ray.wait(pending, num_returns=1)
                i = index[ready[0]]
                results[i] = self._get(ready[0])
                if on_done is not None:
                    on_done(i, results[i])
        except BaseException:
            for r in pending:
                self._ray.cancel(r, force=True)
                self._labels.pop(r, None)
            raise
        return [results[i] for i in range(len(refs))]

    def submit(self, fn, item):
        return _RayPending(self, self._start(fn, item, 0))

    def next_done(self, pending):
        if not pending:
            raise ValueError("next_done: no task to wait for")
        refs = [p._ref for p in pending]
        ready, _ = self._ray.wait(refs, num_returns=1, fetch_local=False)
        return refs.index(ready[0])

    def close(self) -> None:
        self._ray.shutdown()


class _RayPending:
    """A Ray task's result when asked for."""

    def __init__(self, executor: RayExecutor, ref) -> None:
        self._executor, self._ref = executor, ref

    def result(self) -> Any:
        return self._executor._get(self._ref)


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
