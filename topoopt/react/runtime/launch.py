"""Launch N local ranks of a torch.distributed job and collect what each returns.

Ranks are processes forked from a forkserver that has imported torch once (so a launch
costs about a process fork per rank, not a torch import), joined in a gloo group through a
TCP store on a free port of 127.0.0.1 -- or, for the congestion harness, each inside its
own network namespace (:mod:`topoopt.react.runtime.netem`), talking over veth links.

Nothing can hang forever: every rank's collectives time out (``op_timeout``), the whole
launch has a deadline, a rank that fails makes the launcher kill the others at once, and
ranks die with the launching process (``PR_SET_PDEATHSIG``), so a killed test leaves no
stragglers behind.
"""

from __future__ import annotations

import ctypes
import os
import queue as queue_mod
import signal
import socket
import time
import traceback
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Callable, Sequence

from topoopt._require import require_int, require_positive
from topoopt.errors import ConfigError, TopoOptError

__all__ = ["launch", "LaunchError", "LaunchOptions", "free_port"]

_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1


class LaunchError(TopoOptError):
    """A rank failed, crashed or missed the launch deadline (message has its traceback)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LaunchOptions:
    """Where and how the ranks run (see :func:`launch`)."""

    backend: str = "gloo"
    master: str = "127.0.0.1"
    port: int = 0
    op_timeout: float = 60.0
    netns: tuple[str, ...] | None = None
    ifnames: tuple[str, ...] | None = None
    torch_threads: int = 1
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the deadline still applies
        pass


def _enter_netns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _child(fn, rank: int, world: int, args: tuple, q, opts: LaunchOptions) -> None:
    """Body of one rank: join the group, run ``fn``, report, exit without finalizers."""
    try:
        _die_with_parent()
        for k, v in opts.env:
            os.environ[k] = v
        if opts.netns:
            _enter_netns(opts.netns[rank])
        if opts.ifnames:
            os.environ["GLOO_SOCKET_IFNAME"] = opts.ifnames[rank]
        import torch
        import torch.distributed as dist

        torch.set_num_threads(opts.torch_threads)
        dist.init_process_group(opts.backend, init_method=f"tcp://{opts.master}:{opts.port}",
                                rank=rank, world_size=world,
                                timeout=timedelta(seconds=opts.op_timeout))
        result = fn(rank, world, *args)
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, True, result))
    except BaseException:  # noqa: BLE001 - everything is reported to the launcher
        q.put((rank, False, traceback.format_exc()))
    finally:
        q.close()
        q.join_thread()
        os._exit(0)


def _context():
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    # import torch once in the forkserver; every rank is then a cheap fork of it
    ctx.set_forkserver_preload(["torch", "torch.distributed",
                                "topoopt.react.runtime.collective"])
    return ctx


def launch(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), *,
           timeout: float = 120.0, options: LaunchOptions = LaunchOptions()) -> list:
    """Run ``fn(rank, world, *args)`` in ``nprocs`` ranks of a fresh process group.

    Parameters
    ----------
    fn : callable
        A module-level function (it is pickled by name). It runs after
        ``init_process_group``; its return value must pickle.
    nprocs : int
        World size, >= 1.
    args : sequence
        Extra arguments, the same for every rank.
    timeout : float
        Seconds for the whole launch; stragglers are killed when it passes.
    options : LaunchOptions
        Backend (gloo), master address and port (0: a free port), per-op timeout,
        per-rank network namespaces and gloo interfaces, torch intra-op threads.

    Returns
    -------
    list
        ``fn``'s return value per rank.

    Raises
    ------
    LaunchError
        A rank raised (its traceback is in the message), died, or the deadline passed.

    Examples
    --------
    >>> def hello(rank, world):                      # doctest: +SKIP
    ...     return rank * world
    >>> launch(hello, 4)                             # doctest: +SKIP
    [0, 4, 8, 12]
    """
    nprocs = require_int("nprocs", nprocs, minimum=1)
    require_positive("timeout", timeout)
    for name in ("netns", "ifnames"):
        v = getattr(options, name)
        if v is not None and len(v) != nprocs:
            raise ConfigError(name, v, f"give one entry per rank ({nprocs})")
    if options.port == 0:
        # inside a fresh namespace any port is free; on the host ask the kernel
        options = replace(options, port=free_port() if options.netns is None
                          else 20000 + int.from_bytes(os.urandom(2), "big") % 20000)
    ctx = _context()
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, nprocs, tuple(args), q, options),
                         name=f"topoopt-rank{r}", daemon=True) for r in range(nprocs)]
    deadline = time.monotonic() + timeout
    results: dict[int, Any] = {}
    failure: str | None = None
    try:
        for p in procs:
            p.start()
        while len(results) < nprocs and failure is None:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(nprocs)) - set(results))
                failure = f"ranks {missing} did not finish within {timeout:g} s"
                break
            try:
                rank, ok, payload = q.get(timeout=min(left, 0.5))
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs)
                        if r not in results and p.exitcode is not None]
                if dead:
                    # give a just-exited rank's report a moment to arrive
                    try:
                        rank, ok, payload = q.get(timeout=2.0)
                    except queue_mod.Empty:
                        failure = (f"rank {dead[0]} exited (code {procs[dead[0]].exitcode}) "
                                   "without a result")
                        break
                else:
                    continue
            if ok:
                results[rank] = payload
            else:
                failure = f"rank {rank} failed:\n{payload}"
    finally:
        for p in procs:
            if p.pid is not None:
                p.join(timeout=0 if failure else max(0.0, min(5.0, deadline - time.monotonic())))
        for p in procs:
            if p.pid is not None and p.is_alive():
                p.kill()
                p.join(timeout=5)
        q.close()
    if failure is not None:
        raise LaunchError(failure)
    return [results[r] for r in range(nprocs)]
