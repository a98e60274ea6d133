"""The task graph of one training iteration as arrays: the record both engines run.

:class:`IterationGraph` is what :class:`~topoopt.estimate.builder.IterationGraphBuilder`
builds; :attr:`IterationGraph.dag` hands it to the DAG engine
(:func:`topoopt.netsim.dag.run_dag`), :attr:`IterationGraph.workload` to the general
simulator (:func:`topoopt.netsim.simulate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from topoopt.estimate.segments import Segment
from topoopt.netsim.dag import DagArrays, successor_lists
from topoopt.netsim.maxmin import gather_rows
from topoopt.netsim.workload import NO_RESOURCE, FlowRoutes, Workload

__all__ = ["FLOW_MP", "FLOW_ALLREDUCE", "IterationGraph"]

#: Flow kinds in :attr:`IterationGraph.flow_kind`.
FLOW_MP, FLOW_ALLREDUCE = 0, 1


@dataclass(frozen=True, eq=False)
class IterationGraph:
    """One iteration's task graph as arrays.

    Nodes ``0 .. tasks-1`` are compute tasks (forward tasks by segment, backward tasks
    in reverse segment order, then weight updates), the next ``len(flow_kind)`` nodes
    are flows (MP forward, MP backward, AllReduce rings), and the last ``barriers``
    nodes are zero-time barriers. On a server, ready tasks run in node-id order.

    Attributes
    ----------
    tasks : int
    task_server, task_duration : ndarray
        Of the compute tasks.
    flow_class : ndarray of int
        Route of each flow: a row of ``routes``.
    flow_bytes : ndarray
        Bytes per flow (an AllReduce ring: bytes per hop, ``hop_count`` hops).
    flow_latency : ndarray
        Seconds from a flow's last byte sent to its delivery.
    flow_kind : ndarray of int8
        :data:`FLOW_MP` or :data:`FLOW_ALLREDUCE`.
    hop_count : ndarray of int
        1 for MP, the ring length for AllReduce.
    barriers : int
    dep_before, dep_after : ndarray of int
        Node ``dep_after[i]`` starts after node ``dep_before[i]`` has finished.
    routes : FlowRoutes
        The route classes.
    segments : tuple of Segment
    ring_orders : tuple of tuple of int
        The ring of every AllReduce flow, in flow order.
    flow_count : ndarray of int, optional
        Identical flows each flow stands for (``merge_flows`` of
        :class:`~topoopt.estimate.builder.IterationGraphBuilder`: same route class,
        bytes and predecessors, so the same times; the flow precedes all their
        successors); ``None``: one each.
    """

    tasks: int
    task_server: np.ndarray
    task_duration: np.ndarray
    flow_class: np.ndarray
    flow_bytes: np.ndarray
    flow_latency: np.ndarray
    flow_kind: np.ndarray
    hop_count: np.ndarray
    barriers: int
    dep_before: np.ndarray
    dep_after: np.ndarray
    routes: FlowRoutes = field(repr=False)
    segments: tuple[Segment, ...] = field(repr=False)
    ring_orders: tuple[tuple[int, ...], ...] = field(repr=False)
    flow_count: np.ndarray | None = field(default=None, repr=False)

    @property
    def nodes(self) -> int:
        """Tasks, flows and barriers."""
        return self.tasks + self.flow_kind.size + self.barriers

    @property
    def task_nodes(self) -> np.ndarray:
        """Node ids of the compute tasks."""
        return np.arange(self.tasks)

    @property
    def flow_nodes(self) -> np.ndarray:
        """Node ids of the flows, in flow order."""
        return self.tasks + np.arange(self.flow_kind.size)

    def counts(self) -> np.ndarray:
        """:attr:`flow_count`, ones where it is ``None``."""
        if self.flow_count is None:
            return np.ones(self.flow_kind.size, np.int64)
        return self.flow_count

    def flow_routes(self) -> FlowRoutes:
        """One route row per flow (the classes expanded)."""
        idx, counts = gather_rows(self.routes.ptr, self.flow_class)
        ptr = np.zeros(counts.size + 1, np.int64)
        np.cumsum(counts, out=ptr[1:])
        return FlowRoutes(ptr, self.routes.link[idx], self.routes.weight[idx])

    @cached_property
    def dag(self) -> DagArrays:
        """The graph as the DAG engine (:func:`topoopt.netsim.dag.run_dag`) runs it."""
        n, t, nf = self.nodes, self.tasks, self.flow_kind.size
        is_flow = np.zeros(n, bool)
        is_flow[t:t + nf] = True
        local = np.zeros(n, np.int64)
        local[t:t + nf] = np.arange(nf)
        node_res = np.full(n, -1, np.int64)
        node_res[:t] = self.task_server
        node_dur = np.zeros(n)
        node_dur[:t] = self.task_duration
        succ_ptr, succ = successor_lists(np.asarray(self.dep_before, np.int64),
                                         np.asarray(self.dep_after, np.int64), n)
        return DagArrays(n, is_flow, local, self.flow_nodes, 8.0 * self.flow_bytes,
                         self.flow_latency, self.flow_class, self.routes, node_res, node_dur,
                         succ_ptr, succ,
                         np.bincount(self.dep_after, minlength=n), None, self.flow_count)

    @cached_property
    def workload(self) -> Workload:
        """The graph as a :class:`~topoopt.netsim.Workload` for the general simulator
        (:func:`topoopt.netsim.simulate`, a second engine on the same graph); a flow
        standing for ``k`` identical flows becomes ``k`` flows, each with its
        dependencies."""
        count = self.counts()
        routes = self.flow_routes()
        nbytes, latency = self.flow_bytes, self.flow_latency
        before, after = self.dep_before, self.dep_after
        if (count != 1).any():
            t, nf = self.tasks, count.size
            copy = np.repeat(np.arange(nf), count)
            idx, counts = gather_rows(routes.ptr, copy)
            routes = FlowRoutes(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                                routes.link[idx], routes.weight[idx])
            nbytes, latency = nbytes[copy], latency[copy]
            # node -> its first new id and its copies
            first = np.arange(self.nodes, dtype=np.int64)
            copies = np.ones(self.nodes, np.int64)
            first[t:t + nf] = t + np.cumsum(count) - count
            first[t + nf:] += int(count.sum()) - nf
            copies[t:t + nf] = count
            per = copies[before] * copies[after]
            k = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
            ca = np.repeat(copies[after], per)
            before = np.repeat(first[before], per) + k // ca
            after = np.repeat(first[after], per) + k % ca
        w = Workload()
        w.add_tasks(self.task_duration, self.task_server)
        w.add_flows(nbytes, routes, latency=latency)
        if self.barriers:
            w.add_tasks(np.zeros(self.barriers), NO_RESOURCE)
        w.add_dependencies(before, after)
        return w
