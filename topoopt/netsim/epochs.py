"""Epochs of the flow-level simulator: the rest of a workload stopped at a checkpoint.

:func:`topoopt.netsim.simulate` can stop at a checkpoint (``on_checkpoint`` returns
True) and report the state there (``SimResult.stopped_at``, ``remaining``).
:func:`rest_of` turns that state into a workload that, run from the stop time, goes on
exactly where the first run left off -- on the same network, or on another one with
other routes (a fabric whose circuits changed, :mod:`topoopt.reconfig`). Node ids are
kept, so the start and finish times of successive epochs merge per node
(:func:`merge_times`).
"""

from __future__ import annotations

import numpy as np

from topoopt.errors import TopoOptError
from topoopt.netsim.engine import SimResult
from topoopt.netsim.workload import NO_RESOURCE, CompiledWorkload, FlowRoutes

__all__ = ["rest_of", "merge_times"]


def rest_of(work: CompiledWorkload, result: SimResult, routes: FlowRoutes | None = None,
            latency: np.ndarray | None = None) -> CompiledWorkload:
    """What is left of ``work`` after a run stopped at ``result.stopped_at = T``.

    Run from ``t0 = T`` it continues the stopped run: finished nodes complete at once
    (a zero-time task, a zero-byte flow); a running task keeps the rest of its
    duration and goes first on its resource; a transmitting flow keeps its remaining
    bytes; a flow whose last byte was sent is delivered at the same time as before;
    everything else is unchanged (sizes, releases, priorities, ids; dependencies on
    finished nodes are dropped, the others kept).

    Parameters
    ----------
    work : CompiledWorkload
        The workload of the stopped run.
    result : SimResult
        Its result, stopped at a checkpoint.
    routes : FlowRoutes, optional
        New routes of the flows (one row per flow, link ids of the network the rest
        will run on); default: the old ones. Flows already sent get empty rows.
    latency : ndarray, optional
        New per-flow latency (seconds from the last byte to delivery) for the flows not
        sent yet; default: the old one. NaN entries mean the weighted sum of the route's
        link latencies, as in :class:`~topoopt.netsim.Workload`.

    Returns
    -------
    CompiledWorkload

    Raises
    ------
    TopoOptError
        ``result`` did not stop, or belongs to another workload.

    Examples
    --------
    >>> from topoopt.netsim import Network, Workload, simulate
    >>> net = Network(np.array([8e9]), np.array([0.0]))
    >>> w = Workload()
    >>> f = w.add_flow(2e9, [0])                            # 2 s alone on the link
    >>> first = simulate(net, w, checkpoints=[0.5], on_checkpoint=lambda t, left: True)
    >>> float(first.remaining[f])
    1500000000.0
    >>> faster = Network(np.array([16e9]), np.array([0.0]))  # the link doubles at 0.5 s
    >>> float(simulate(faster, rest_of(w.compile(), first), t0=0.5).finish[f])
    1.25
    """
    t = float(result.stopped_at)
    if not np.isfinite(t) or result.remaining is None:
        raise TopoOptError("rest_of: the result did not stop at a checkpoint")
    if result.start.size != work.nodes:
        raise TopoOptError(f"rest_of: the result has {result.start.size} nodes, the "
                           f"workload {work.nodes}")
    done = np.isfinite(result.finish)
    fnode, tnode = work.flow_node, work.task_node

    # Tasks: finished ones take no time, a running one keeps the rest and goes first.
    t_done = done[tnode]
    running = np.isfinite(result.start[tnode]) & ~t_done
    duration = work.task_duration.copy()
    resource = work.task_resource.copy()
    priority = work.task_priority.copy()
    duration[t_done] = 0.0
    resource[t_done] = NO_RESOURCE
    duration[running] = np.maximum(result.start[tnode[running]] + duration[running] - t, 0.0)
    first = (priority.min() if priority.size else 0.0) - 1.0
    priority[running] = first

    # Flows: sent ones are delivered when they were due, the others keep their bytes left.
    sent = np.isfinite(result.tx_end[fnode])
    old_lat = work.flow_latency
    lat = (old_lat if latency is None else np.asarray(latency, float)).copy()
    if lat.shape != old_lat.shape:
        raise TopoOptError("rest_of: one latency per flow")
    size = np.where(sent, 0.0, result.remaining[fnode])
    delivering = sent & ~done[fnode]
    if np.isnan(old_lat[delivering]).any():
        raise TopoOptError("rest_of: a flow in delivery has no explicit latency (NaN: the "
                           "route's link latencies); give the workload's flows latencies")
    lat[sent] = 0.0
    lat[delivering] = np.maximum(result.tx_end[fnode[delivering]] + old_lat[delivering] - t,
                                 0.0)
    new_routes = _blank(work.routes if routes is None else routes, sent, len(fnode))

    # Dependencies on finished nodes are met: dropped, so a running task is ready at once
    # and takes its resource back before the tasks queued behind it.
    live = ~done[work.dep_before]
    return CompiledWorkload(work.nodes, work.is_flow, work.local, work.release, fnode, size,
                            lat, new_routes, tnode, duration, resource, priority,
                            work.dep_before[live], work.dep_after[live])


def merge_times(total: np.ndarray, epoch: np.ndarray) -> None:
    """Keep, per node, the first finite time seen over the epochs (in place): a node's
    start and finish are those of the epoch in which it really started or finished (a
    later epoch re-starts a running task and re-finishes done nodes at its own start)."""
    fresh = np.isnan(total) & np.isfinite(epoch)
    total[fresh] = epoch[fresh]


def _blank(routes: FlowRoutes, rows: np.ndarray, flows: int) -> FlowRoutes:
    """``routes`` with the flagged rows emptied."""
    if len(routes) != flows:
        raise TopoOptError(f"rest_of: {len(routes)} routes for {flows} flows")
    counts = np.diff(routes.ptr)
    keep = np.repeat(~rows, counts)
    counts = np.where(rows, 0, counts)
    ptr = np.zeros(flows + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    return FlowRoutes(ptr, routes.link[keep], routes.weight[keep])
