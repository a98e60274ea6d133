"""A fabric running in the ns-3 worker: pinned TCP connections and DAGs of flows and tasks.

:class:`Ns3Network` is the one object the executors talk to. It builds the fabric in
the worker on first use (:func:`~topoopt.netsim.ns3.network.network_spec`), pins each
connection to a path (:class:`~topoopt.netsim.ns3.network.PathPlanes`), and runs
:class:`Dag` s -- flows on connections and compute tasks on per-server resources with
dependencies, the same model as :class:`topoopt.netsim.Workload` -- back to back in
simulated time. Connections persist between DAGs (their TCP state too: a flow on a
warm connection skips the handshake and slow start), as do external greedy flows.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np

from topoopt.errors import TopoOptError
from topoopt.netsim.engine import RoutedNetwork
from topoopt.netsim.ns3.config import Ns3Config
from topoopt.netsim.ns3.network import PathPlanes, network_spec, plane_address
from topoopt.netsim.ns3.worker import Ns3Error, Ns3Worker, default_worker
from topoopt.netsim.wire import reverse_link_ids

__all__ = ["Dag", "DagBuilder", "DagResult", "Ns3Network", "FLOW", "TASK"]

FLOW, TASK = 0, 1


@dataclass(frozen=True)
class Dag:
    """Flows and tasks with dependencies, as arrays (one entry per DAG node).

    A flow sends ``nbytes`` on connection ``conn`` (-1, or 0 bytes: done at once); a
    task waits for its ``resource`` (-1: none; one task at a time per resource, lowest
    ``priority`` first, then lowest id) and then takes ``duration`` seconds. A node
    starts when every node it depends on has finished.
    """

    kind: np.ndarray
    conn: np.ndarray
    nbytes: np.ndarray
    duration: np.ndarray
    resource: np.ndarray
    priority: np.ndarray
    before: np.ndarray
    after: np.ndarray

    @property
    def size(self) -> int:
        return int(self.kind.size)

    def wire(self) -> tuple:
        """The arrays as plain lists, in the worker's argument order."""
        return (self.kind.tolist(), self.conn.tolist(), self.nbytes.tolist(),
                self.duration.tolist(), self.resource.tolist(), self.priority.tolist(),
                self.before.tolist(), self.after.tolist())


class DagBuilder:
    """Build a :class:`Dag` in bulk; every ``add_*`` returns the new node ids.

    Examples
    --------
    >>> b = DagBuilder()
    >>> t = b.add_tasks([1e-3], resource=[0])
    >>> f = b.add_flows([3], [1e6])
    >>> b.add_dependencies(t, f)
    >>> d = b.build()
    >>> d.kind.tolist(), d.before.tolist(), d.after.tolist()
    ([1, 0], [0], [1])
    """

    def __init__(self) -> None:
        self._parts: list[tuple] = []
        self._deps: list[tuple[np.ndarray, np.ndarray]] = []
        self._n = 0

    @property
    def nodes(self) -> int:
        return self._n

    def _ids(self, k: int) -> np.ndarray:
        ids = np.arange(self._n, self._n + k, dtype=np.int64)
        self._n += k
        return ids

    def add_flows(self, conn, nbytes) -> np.ndarray:
        conn = np.atleast_1d(np.asarray(conn, np.int64))
        nbytes = np.broadcast_to(np.asarray(nbytes, float), conn.shape).copy()
        if np.any(~np.isfinite(nbytes) | (nbytes < 0)):
            raise TopoOptError("DAG flow sizes must be finite and >= 0 bytes")
        k = conn.size
        self._parts.append((np.full(k, FLOW, np.int64), conn, nbytes, np.zeros(k),
                            np.full(k, -1, np.int64), np.zeros(k)))
        return self._ids(k)

    def add_tasks(self, duration, resource=-1, priority=None) -> np.ndarray:
        duration = np.atleast_1d(np.asarray(duration, float))
        k = duration.size
        if np.any(~np.isfinite(duration) | (duration < 0)):
            raise TopoOptError("DAG task durations must be finite and >= 0 seconds")
        resource = np.broadcast_to(np.asarray(resource, np.int64), (k,)).copy()
        ids = self._ids(k)
        prio = (ids.astype(float) if priority is None
                else np.broadcast_to(np.asarray(priority, float), (k,)).copy())
        self._parts.append((np.full(k, TASK, np.int64), np.full(k, -1, np.int64), np.zeros(k),
                            duration, resource, prio))
        return ids

    def add_dependencies(self, before, after) -> None:
        b, a = np.broadcast_arrays(np.asarray(before, np.int64), np.asarray(after, np.int64))
        if b.size:
            self._deps.append((b.ravel().copy(), a.ravel().copy()))

    def build(self) -> Dag:
        cols: list[Sequence] = list(zip(*self._parts)) if self._parts else [[]] * 6
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if len(xs) else np.empty(0, dt))
        before = cat([d[0] for d in self._deps], np.int64)
        after = cat([d[1] for d in self._deps], np.int64)
        dag = Dag(cat(cols[0], np.int64), cat(cols[1], np.int64), cat(cols[2], float),
                  cat(cols[3], float), cat(cols[4], np.int64), cat(cols[5], float),
                  before, after)
        n = dag.size
        if before.size and (min(before.min(), after.min()) < 0
                            or max(before.max(), after.max()) >= n):
            raise TopoOptError(f"a DAG dependency names a node outside 0..{n - 1}")
        if np.any(before == after):
            raise TopoOptError("a DAG node depends on itself")
        return dag


@dataclass(frozen=True)
class DagResult:
    """Timings of one DAG, seconds from ``t0`` (the simulated time it started at)."""

    start: np.ndarray
    finish: np.ndarray
    t0: float
    t1: float

    @property
    def makespan(self) -> float:
        return float(self.finish.max()) if self.finish.size else 0.0


@dataclass
class _Pending:
    conns: list = field(default_factory=list)
    greedy: list = field(default_factory=list)
    rates: list = field(default_factory=list)


class Ns3Network:
    """A fabric in the ns-3 worker (built on first use) and its pinned connections.

    Parameters
    ----------
    fabric : topoopt.fabrics.Fabric
    config : Ns3Config
    worker : Ns3Worker, optional
        Default: the shared :func:`~topoopt.netsim.ns3.worker.default_worker`. Opening
        a network on a worker replaces the one it held before.

    Examples
    --------
    >>> from topoopt.fabrics import star
    >>> net = Ns3Network(star(2, 100e9))                            # doctest: +SKIP
    >>> c = net.connection(0, 1, net.fabric.paths(0, 1)[0][0])      # doctest: +SKIP
    >>> b = DagBuilder(); b.add_flows([c], [1e6])                   # doctest: +SKIP
    >>> net.run([b.build()])[0].makespan                            # doctest: +SKIP
    """

    def __init__(self, fabric: RoutedNetwork, config: Ns3Config = Ns3Config(),
                 worker: Ns3Worker | None = None) -> None:
        self.fabric = fabric
        self.config = config
        self.worker = worker
        self.spec = network_spec(fabric)
        self.planes = PathPlanes(self.spec.link_src, self.spec.link_dst)
        self._reverse = reverse_link_ids(self.spec.link_src, self.spec.link_dst)
        self._conns: dict[Hashable, int] = {}
        self.conn_endpoints: list[tuple[int, int]] = []
        self._pending = _Pending()
        self._owner: tuple[int, int] | None = None
        self.wall = 0.0

    # ------------------------------------------------------------------ lifecycle
    def _worker(self) -> Ns3Worker:
        if self.worker is None:
            self.worker = default_worker()
        return self.worker

    def _ensure_open(self) -> Ns3Worker:
        w = self._worker()
        if self._owner is None:
            w.call("open", self.spec, self.config)
            self._owner = (w.starts, w.generation)
        elif self._owner != (w.starts, w.generation):
            raise Ns3Error("this ns-3 network was replaced by another run on the same "
                           "worker; give each concurrent run its own Ns3Worker")
        return w

    # ------------------------------------------------------------------ connections
    def ack_path(self, src: int, dst: int, path: Sequence[int] | np.ndarray) -> np.ndarray:
        """The path ACKs of a ``src -> dst`` connection on ``path`` take: the reverse
        links when they all exist, else one of the fabric's ``dst -> src`` paths
        (chosen by a hash of the data path, so it is stable)."""
        links = np.asarray(path, np.int64)
        rev = self._reverse[links[::-1]]
        if rev.size and np.all(rev >= 0):
            return rev
        options = self.fabric.paths(int(dst), int(src))
        h = zlib.crc32(links.tobytes())
        return np.asarray(options[h % len(options)][0], np.int64)

    def connection(self, src: int, dst: int, path: Sequence[int] | np.ndarray,
                   key: Hashable | None = None,
                   ack_path: Sequence[int] | np.ndarray | None = None) -> int:
        """The id of a TCP connection from server ``src`` to ``dst`` pinned to ``path``
        (fabric link ids). ``key`` names the connection (default: the path): the same
        key gives the same connection, a new key a new one on the same path."""
        key = ("path", int(src), int(dst), tuple(int(x) for x in path)) if key is None else key
        hit = self._conns.get(key)
        if hit is not None:
            return hit
        if src == dst:
            raise TopoOptError(f"a connection needs two different servers (got {src})")
        ack = self.ack_path(src, dst, path) if ack_path is None else ack_path
        plane = self.planes.pin(int(src), int(dst), path, ack)
        cid = len(self.conn_endpoints)
        self._conns[key] = cid
        self.conn_endpoints.append((int(src), int(dst)))
        self._pending.conns.append((int(src), int(dst), plane_address(int(dst), plane)))
        return cid

    def set_greedy(self, conn: int, on: bool) -> None:
        """Make a connection a greedy sender (an external flow) or stop it, at the next run."""
        self._pending.greedy.append((int(conn), bool(on)))

    def set_capacity(self, link: int, bps: float) -> None:
        """Change a link's rate at the next run (a gray failure or its repair)."""
        if not bps > 0:
            raise TopoOptError("ns-3 links need a rate > 0 bits/s (take a link down by routing)")
        self._pending.rates.append((int(link), float(bps)))

    # ------------------------------------------------------------------ running
    def _flush(self, step: dict) -> dict:
        addresses, routes = self.planes.drain()
        step = dict(step)
        step["addresses"] = addresses
        step["routes"] = routes
        step["conns"] = self._pending.conns
        step["greedy"] = self._pending.greedy
        step["rates"] = self._pending.rates
        self._pending = _Pending()
        return step

    def run(self, dags: Sequence[Dag | None], advance: Sequence[float] | float = 0.0,
            limit: float = 10.0, greedy: Sequence[Sequence[tuple[int, bool]]] | None = None
            ) -> list[DagResult | None]:
        """Run DAGs one after the other (each starts when the previous one is done).

        Parameters
        ----------
        dags : sequence of Dag or None
            None: only apply the step's changes and ``advance``.
        advance : float or sequence of float
            Seconds of simulated time to let pass before each DAG (background flows
            keep running).
        limit : float
            Simulated seconds a DAG may take; more raises :class:`Ns3Error`.
        greedy : sequence of list of (conn, on), optional
            Greedy on/off switches applied before each DAG (after pending changes).

        Returns
        -------
        list of DagResult or None
        """
        import time

        adv = np.broadcast_to(np.asarray(advance, float), (len(dags),))
        steps = []
        for i, dag in enumerate(dags):
            st = {"advance": float(adv[i]), "limit": float(limit),
                  "dag": None if dag is None else dag.wire()}
            if greedy is not None:
                self._pending.greedy.extend(greedy[i])
            steps.append(self._flush(st))
        w = self._ensure_open()
        t = time.perf_counter()
        replies = w.call("run", steps)
        self.wall += time.perf_counter() - t
        out: list[DagResult | None] = []
        for dag, rep in zip(dags, replies):
            if dag is None:
                out.append(None)
                continue
            if rep["timed_out"]:
                raise Ns3Error(f"a DAG of {dag.size} nodes did not finish within {limit} "
                               "simulated seconds (a stalled flow, or raise the limit)")
            out.append(DagResult(rep["start"], rep["finish"], rep["t0"], rep["t1"]))
        return out

    def stats(self) -> dict:
        """Per fabric link: ``link_bytes`` (bytes sent, headers included), ``link_drops``,
        ``link_marks`` (ECN); per connection: ``conn_sent``, ``conn_received`` (payload
        bytes); ``now`` (simulated seconds)."""
        return self._ensure_open().call("stats")
